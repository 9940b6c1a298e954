//! Wake-ups across processes: the listener connection (`LISTEN` on [`CHANNEL`]) and the
//! in-process waiters it wakes by key.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_postgres::AsyncMessage;

use super::tls::Target;
use crate::key::Key;
use crate::store::wait::WaiterMap;

/// The `LISTEN/NOTIFY` channel; the payload is the key.
const CHANNEL: &str = "idem_wake";

/// The listener: one connection that `LISTEN`s on [`CHANNEL`] and wakes waiters by key;
/// reconnects after a failure (waking everyone, since notifications may have been lost).
/// The waiters are this process's, by key, woken by notifications and by this store's own
/// writes.
pub(super) async fn listen(
    target: Target,
    waiters: Arc<WaiterMap<Key>>,
    listening: Arc<AtomicBool>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        if let Ok((client, mut connection)) = target.connect().await {
            let driver = {
                let waiters = Arc::clone(&waiters);
                async move {
                    while let Some(Ok(msg)) =
                        std::future::poll_fn(|cx| connection.poll_message(cx)).await
                    {
                        if let AsyncMessage::Notification(n) = msg
                            && let Some(key) = Key::parse(n.payload())
                        {
                            waiters.wake(&key);
                        }
                    }
                }
            };
            let subscribe = async {
                if client.batch_execute(&format!("LISTEN {CHANNEL}")).await.is_ok() {
                    listening.store(true, Ordering::Relaxed);
                    waiters.wake_all();
                }
                // Keeps the client (and so the connection) alive while the driver runs.
                std::future::pending::<()>().await
            };
            tokio::select! {
                () = driver => {}
                () = subscribe => {}
            }
            listening.store(false, Ordering::Relaxed);
            waiters.wake_all();
            backoff = Duration::from_millis(100);
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
