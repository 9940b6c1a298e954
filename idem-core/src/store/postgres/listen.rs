//! Wake-ups across processes: the listener connection (`LISTEN` on [`CHANNEL`]) and the
//! in-process waiters it wakes by key.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_postgres::AsyncMessage;

use super::tls::Target;
use crate::key::Key;

/// The `LISTEN/NOTIFY` channel; the payload is the key.
const CHANNEL: &str = "idem_wake";

/// In-process waiters by key, woken by notifications and by this store's own writes.
#[derive(Default)]
pub(super) struct Waiters {
    map: Mutex<HashMap<Key, Arc<Notify>>>,
}

impl Waiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Arc<Notify>>> {
        crate::sync::lock(&self.map)
    }
    pub(super) fn register(&self, key: Key) -> Arc<Notify> {
        Arc::clone(self.lock().entry(key).or_default())
    }
    pub(super) fn unregister(&self, key: &Key, notify: Arc<Notify>) {
        let mut map = self.lock();
        // Ours and the map's: nobody else waits on this key.
        if Arc::strong_count(&notify) == 2 {
            map.remove(key);
        }
    }
    pub(super) fn wake(&self, key: &Key) {
        if let Some(n) = self.lock().get(key) {
            n.notify_waiters();
        }
    }
    pub(super) fn wake_all(&self) {
        for n in self.lock().values() {
            n.notify_waiters();
        }
    }
}

/// The listener: one connection that `LISTEN`s on [`CHANNEL`] and wakes waiters by key;
/// reconnects after a failure (waking everyone, since notifications may have been lost).
pub(super) async fn listen(target: Target, waiters: Arc<Waiters>, listening: Arc<AtomicBool>) {
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
