//! A TCP proxy between a store and its server that a test can cut and restore (an outage), or
//! arm to lose one reply: the request reaches the server and is carried out, then the server's
//! reply is dropped and the connection closed, as when a network resets after the command.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// The proxy; dropping it closes every connection.
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

struct Shared {
    /// Where new connections go (see [`Proxy::retarget`]).
    target: Mutex<String>,
    up: AtomicBool,
    /// Armed: the next request whose bytes contain this needle loses its reply (and with
    /// `true`, the proxy is cut right after).
    armed: Mutex<Option<(Vec<u8>, bool)>>,
    lost: AtomicUsize,
    pumps: Mutex<Vec<JoinHandle<()>>>,
    /// Connections opened before this many stalls are black holes (see [`Proxy::stall`]).
    stalls: AtomicUsize,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `target` (`host:port`).
    pub async fn start(target: impl Into<String>) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("proxy bind");
        let port = listener.local_addr().expect("proxy addr").port();
        let shared = Arc::new(Shared {
            target: Mutex::new(target.into()),
            up: AtomicBool::new(true),
            armed: Mutex::new(None),
            lost: AtomicUsize::new(0),
            pumps: Mutex::new(Vec::new()),
            stalls: AtomicUsize::new(0),
        });
        let accept = tokio::spawn({
            let shared = Arc::clone(&shared);
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    if !shared.up.load(Ordering::SeqCst) {
                        continue; // cut: the connection closes at once
                    }
                    let pump = tokio::spawn(pump(Arc::clone(&shared), client));
                    shared.pumps.lock().unwrap().push(pump);
                }
            }
        });
        Proxy { port, shared, accept }
    }

    /// The port the proxy listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Drops every open connection and closes new ones at once, until [`Proxy::restore`].
    pub fn cut(&self) {
        self.shared.cut();
    }

    /// Every open connection becomes a black hole: it stays open, and nothing sent either way
    /// arrives (no reset, no close), as when a NAT or load balancer forgets an idle flow, or a
    /// server's address vanishes in a failover. New connections are forwarded as before.
    pub fn stall(&self) {
        self.shared.stalls.fetch_add(1, Ordering::SeqCst);
    }

    /// New connections go to `target` from now on; open ones stay where they are, as when a
    /// failover moves a DNS name or a virtual IP to another server.
    pub fn retarget(&self, target: impl Into<String>) {
        *self.shared.target.lock().unwrap() = target.into();
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.shared.up.store(true, Ordering::SeqCst);
    }

    /// The next request (one read from a client) whose bytes contain `needle` reaches the server;
    /// its reply is dropped and the connection closed. Once.
    pub fn lose_reply_to(&self, needle: impl Into<Vec<u8>>) {
        *self.shared.armed.lock().unwrap() = Some((needle.into(), false));
    }

    /// As [`Proxy::lose_reply_to`], then cuts the proxy (as [`Proxy::cut`]) at once: every resend
    /// fails until [`Proxy::restore`].
    pub fn lose_reply_and_cut(&self, needle: impl Into<Vec<u8>>) {
        *self.shared.armed.lock().unwrap() = Some((needle.into(), true));
    }

    /// How many replies were lost so far.
    pub fn lost(&self) -> usize {
        self.shared.lost.load(Ordering::SeqCst)
    }

    /// Whether a request armed with [`Proxy::lose_reply_to`] is still to come.
    pub fn armed(&self) -> bool {
        self.shared.armed.lock().unwrap().is_some()
    }
}

impl Shared {
    fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        for pump in self.pumps.lock().unwrap().drain(..) {
            pump.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}

/// Forwards one connection both ways; see [`Proxy::lose_reply_to`].
async fn pump(shared: Arc<Shared>, client: TcpStream) {
    let target = shared.target.lock().unwrap().clone();
    let Ok(server) = TcpStream::connect(&target).await else { return };
    let epoch = shared.stalls.load(Ordering::SeqCst);
    let stalled = {
        let shared = Arc::clone(&shared);
        move || shared.stalls.load(Ordering::SeqCst) > epoch
    };
    let stalled_down = stalled.clone();
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    // Set when a request whose reply must be lost went to the server: 1 lose, 2 lose and cut.
    let losing = Arc::new(AtomicUsize::new(0));
    let up = {
        let (shared, losing) = (Arc::clone(&shared), Arc::clone(&losing));
        async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match client_rx.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let chunk = &buf[..n];
                if stalled() {
                    continue;
                }
                {
                    let mut armed = shared.armed.lock().unwrap();
                    let hit = armed.as_ref().and_then(|(needle, cut)| {
                        chunk.windows(needle.len()).any(|w| w == needle.as_slice()).then_some(*cut)
                    });
                    if let Some(cut) = hit {
                        *armed = None;
                        losing.store(if cut { 2 } else { 1 }, Ordering::SeqCst);
                    }
                }
                if server_tx.write_all(chunk).await.is_err() {
                    return;
                }
            }
        }
    };
    let down = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if stalled_down() {
                continue;
            }
            let lose = losing.load(Ordering::SeqCst);
            if lose > 0 {
                // The server answered, so it carried the request out: drop the answer and the
                // connection.
                shared.lost.fetch_add(1, Ordering::SeqCst);
                if lose == 2 {
                    shared.cut();
                }
                return;
            }
            if client_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // Either direction ending closes both (the halves drop here).
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}
