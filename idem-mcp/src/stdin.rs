//! This process's stdin for the stdio transport, read on a thread of its own.
//!
//! `tokio::io::stdin` reads on tokio's blocking pool, and a runtime that shuts down waits for its
//! blocking tasks: a read that waits for a line no host will send (a server stopped by SIGTERM
//! while its stdin is still open) keeps the process alive after `main` returns. A plain thread
//! that nobody joins does not: the process ends when `main` does.

use std::io::{self, Read};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc;

/// How much one read of stdin takes at most, in bytes.
const CHUNK: usize = 64 * 1024;

/// This process's stdin as an [`AsyncRead`], read by a detached thread started here.
#[derive(Debug)]
pub struct Stdin {
    chunks: mpsc::Receiver<io::Result<Vec<u8>>>,
    chunk: Vec<u8>,
    at: usize,
    /// The thread could not be started: the first read says why.
    failed: Option<io::Error>,
    ended: bool,
}

impl Stdin {
    pub(crate) fn new() -> Stdin {
        // A few chunks ahead at most: the transport's own line limit bounds what it keeps.
        let (tx, chunks) = mpsc::channel(4);
        let reader = std::thread::Builder::new().name("idem-mcp-stdin".into()).spawn(move || {
            let mut stdin = io::stdin().lock();
            loop {
                let mut chunk = vec![0; CHUNK];
                let read = match stdin.read(&mut chunk) {
                    Ok(n) => {
                        chunk.truncate(n);
                        Ok(chunk)
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => Err(e),
                };
                // An empty chunk is the end of input; an error ends the stream too.
                let last = !matches!(&read, Ok(c) if !c.is_empty());
                if tx.blocking_send(read).is_err() || last {
                    return;
                }
            }
        });
        Stdin { chunks, chunk: Vec::new(), at: 0, failed: reader.err(), ended: false }
    }
}

impl AsyncRead for Stdin {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(e) = this.failed.take() {
            this.ended = true;
            return Poll::Ready(Err(e));
        }
        while this.at == this.chunk.len() {
            if this.ended {
                return Poll::Ready(Ok(()));
            }
            match ready!(this.chunks.poll_recv(cx)) {
                Some(Ok(chunk)) if !chunk.is_empty() => (this.chunk, this.at) = (chunk, 0),
                Some(Err(e)) => {
                    this.ended = true;
                    return Poll::Ready(Err(e));
                }
                // The end of input, or the thread is gone.
                Some(Ok(_)) | None => this.ended = true,
            }
        }
        let n = buf.remaining().min(this.chunk.len() - this.at);
        buf.put_slice(&this.chunk[this.at..this.at + n]);
        this.at += n;
        Poll::Ready(Ok(()))
    }
}
