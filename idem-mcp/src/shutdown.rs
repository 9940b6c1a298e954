//! The signals that end a stdio session: SIGTERM, SIGINT and SIGHUP on Unix, Ctrl-C elsewhere.
//!
//! MCP hosts stop a stdio server by closing its stdin, then SIGTERM a couple of seconds later,
//! then SIGKILL (the TypeScript SDK and VS Code wait about 2 s at each step; older SDKs send
//! SIGTERM alone). Without a handler SIGTERM ends the process at once, and a call whose tool was
//! running is left in flight: a `keyed` repeat waits out the lease and runs again, a `never` one
//! answers "outcome unknown". Handled, the first signal ends the session as EOF does (no new
//! requests; the calls still running finish and are stored); a second one ends the wait.

/// Waits for the next terminating signal and names it. A signal whose handler cannot be
/// installed is left to its default action (logged once, at creation).
pub(crate) struct Signals {
    #[cfg(unix)]
    streams: Vec<(&'static str, tokio::signal::unix::Signal)>,
}

impl Signals {
    pub(crate) fn new() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let kinds = [
                ("SIGTERM", SignalKind::terminate()),
                ("SIGINT", SignalKind::interrupt()),
                ("SIGHUP", SignalKind::hangup()),
            ];
            let mut streams = Vec::new();
            for (name, kind) in kinds {
                // tokio panics, rather than erring, on a runtime built without its IO driver
                // (`enable_time` alone, which the stdio transport otherwise needs no more than).
                match std::panic::catch_unwind(|| signal(kind)) {
                    Ok(Ok(stream)) => streams.push((name, stream)),
                    Ok(Err(e)) => {
                        tracing::warn!(signal = name, error = %e, "cannot handle the signal");
                    }
                    Err(_) => {
                        tracing::warn!(
                            "cannot handle SIGTERM, SIGINT or SIGHUP: the tokio runtime has no IO \
                             driver (Builder::enable_io); they keep their default action"
                        );
                        break;
                    }
                }
            }
            Signals { streams }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// The next signal's name; pending forever when none can be handled.
    pub(crate) async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            if self.streams.is_empty() {
                return std::future::pending().await;
            }
            let received = self.streams.iter_mut().map(|(name, stream)| {
                Box::pin(async move {
                    // `None`: the driver is gone; never a signal then.
                    match stream.recv().await {
                        Some(()) => *name,
                        None => std::future::pending().await,
                    }
                })
            });
            futures_util::future::select_all(received).await.0
        }
        #[cfg(not(unix))]
        {
            match tokio::signal::ctrl_c().await {
                Ok(()) => "Ctrl-C",
                Err(_) => std::future::pending().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Signals;

    /// A runtime built without its IO driver (`enable_time` alone: the stdio transport needs no
    /// more) cannot handle signals: the session goes on without handlers instead of panicking.
    #[test]
    fn a_runtime_without_io_gets_no_handlers_and_no_panic() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let handled = runtime.block_on(async {
            let signals = std::panic::AssertUnwindSafe(Signals::new);
            std::panic::catch_unwind(signals).map(|_| ())
        });
        assert!(handled.is_ok(), "Signals::new panicked on a runtime without IO");
    }
}
