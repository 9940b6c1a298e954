//! A TCP proxy inside the bench process that delays every chunk of bytes by a fixed time in each
//! direction: a server on loopback made to look like one across a network (0.5 ms each way is a
//! round trip of 1 ms, as between two hosts in one data centre).
//!
//! Every chunk read from either side is queued with the time it is due (read time + delay) on one
//! delay line, which writes the chunks in arrival order, each when it is due. Arrival order is due
//! order, so a pipelined request is not delayed more than once, and nothing is reordered within a
//! connection. The delay line is an OS thread sleeping with `std::thread::sleep` (precise to tens
//! of microseconds on Linux), not a tokio task: tokio's timer counts in whole milliseconds, so a
//! 0.5 ms `tokio::time::sleep` lasts 1 to 2 ms.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

/// One chunk on the delay line: what to write where, and when.
enum Item {
    Data {
        due: Instant,
        to: Arc<TcpStream>,
        bytes: Vec<u8>,
    },
    /// The other side closed: close this side's writing half once the data before it is out.
    Close {
        due: Instant,
        to: Arc<TcpStream>,
    },
}

/// A running proxy; it stops accepting when dropped (open connections end with their peers).
pub struct DelayProxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl DelayProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`, delaying each
    /// direction by `delay`.
    pub fn start(upstream: SocketAddr, delay: Duration) -> std::io::Result<DelayProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (line, queue) = channel::<Item>();
        std::thread::Builder::new().name("delay-line".into()).spawn(move || delay_line(queue))?;
        let stopped = Arc::clone(&stop);
        std::thread::Builder::new().name("delay-accept".into()).spawn(move || {
            for client in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(client) = client else { continue };
                if let Err(e) = connect(client, upstream, delay, &line) {
                    eprintln!("delay proxy: could not reach {upstream}: {e}");
                }
            }
        })?;
        Ok(DelayProxy { addr, stop })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accepting thread so it sees `stop`.
        let _ = TcpStream::connect(self.addr);
    }
}

fn connect(
    client: TcpStream,
    upstream: SocketAddr,
    delay: Duration,
    line: &Sender<Item>,
) -> std::io::Result<()> {
    let server = TcpStream::connect(upstream)?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (client, server) = (Arc::new(client), Arc::new(server));
    for (from, to) in [(&client, &server), (&server, &client)] {
        let (from, to, line) = (Arc::clone(from), Arc::clone(to), line.clone());
        std::thread::Builder::new()
            .name("delay-read".into())
            .spawn(move || read_side(&from, to, delay, &line))?;
    }
    Ok(())
}

/// Reads `from` until it closes, queueing each chunk for `to`.
fn read_side(from: &TcpStream, to: Arc<TcpStream>, delay: Duration, line: &Sender<Item>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match (&*from).read(&mut buf) {
            Ok(0) | Err(_) => {
                let _ = line.send(Item::Close { due: Instant::now() + delay, to });
                return;
            }
            Ok(n) => {
                let item = Item::Data {
                    due: Instant::now() + delay,
                    to: Arc::clone(&to),
                    bytes: buf[..n].to_vec(),
                };
                if line.send(item).is_err() {
                    return;
                }
            }
        }
    }
}

fn delay_line(queue: Receiver<Item>) {
    for item in queue {
        let due = match &item {
            Item::Data { due, .. } | Item::Close { due, .. } => *due,
        };
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        match item {
            Item::Data { to, bytes, .. } => {
                // A peer that went away closes its other side through its reader.
                let _ = (&*to).write_all(&bytes);
            }
            Item::Close { to, .. } => {
                let _ = to.shutdown(Shutdown::Write);
            }
        }
    }
}
