//! Waiting across processes: the dedicated RESP3 pub/sub connection, the subscriptions it holds,
//! and the in-process waiters it wakes by channel.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, ProtocolVersion, PushInfo, PushKind, Value};
use tokio::sync::Notify;

use super::{Inner, RedisStore};
use crate::store::wait::WaiterMap;

/// The dedicated pub/sub connection: RESP3 with a push handler that wakes the waiters of a
/// channel, and re-subscription after a reconnect. `None` if it cannot be configured.
pub(super) fn pubsub_connection(
    client: &Client,
    config: ConnectionManagerConfig,
    waiters: &Arc<WaiterMap<Vec<u8>>>,
) -> Option<ConnectionManager> {
    let info = client.get_connection_info().clone();
    let settings = info.redis_settings().clone().set_protocol(ProtocolVersion::RESP3);
    let client = Client::open(info.set_redis_settings(settings)).ok()?;
    let waiters = Arc::clone(waiters);
    let on_push = move |push: PushInfo| -> Result<(), ()> {
        match push.kind {
            PushKind::Message => {
                if let Some(Value::BulkString(channel)) = push.data.first() {
                    waiters.wake(&channel[..]);
                }
            }
            // Messages may have been lost while disconnected: let every waiter re-check.
            PushKind::Disconnection => waiters.wake_all(),
            _ => {}
        }
        Ok(())
    };
    let config = config.set_push_sender(on_push).set_automatic_resubscription();
    ConnectionManager::new_lazy_with_config(client, config).ok()
}

/// One waiter's interest in a channel; dropping it unsubscribes when it was the last.
pub(super) struct Interest {
    inner: Arc<Inner>,
    pub(super) channel: Vec<u8>,
    pub(super) notify: Arc<Notify>,
}

impl Drop for Interest {
    fn drop(&mut self) {
        let last = self.inner.waiters.unregister(&self.channel[..]);
        if last && let Ok(rt) = tokio::runtime::Handle::try_current() {
            let inner = Arc::clone(&self.inner);
            let channel = std::mem::take(&mut self.channel);
            rt.spawn(async move { inner.sync_subscription(&channel).await });
        }
    }
}

impl Inner {
    /// Brings the server's subscription of `channel` in line with whether anyone waits on it.
    /// Returns whether it is subscribed.
    pub(super) async fn sync_subscription(&self, channel: &[u8]) -> bool {
        let Some(pubsub) = &self.pubsub else { return false };
        if self.pubsub_broken.load(Ordering::Relaxed) {
            return false;
        }
        let mut subscribed = self.subscribed.lock().await;
        let wanted = self.waiters.wanted(channel);
        let mut conn = pubsub.clone();
        match (wanted, subscribed.contains(channel)) {
            (true, false) => match conn.subscribe(channel).await {
                Ok(()) => {
                    subscribed.insert(channel.to_vec());
                }
                Err(e) => {
                    if !e.is_io_error() && !e.is_timeout() {
                        tracing::warn!(error = %e, "redis pub/sub unavailable; waiting by polling");
                        self.pubsub_broken.store(true, Ordering::Relaxed);
                    }
                }
            },
            (false, true) => {
                // Even if this fails the subscription is harmless: messages nobody waits for are
                // dropped.
                let _ = conn.unsubscribe(channel).await;
                subscribed.remove(channel);
            }
            _ => {}
        }
        subscribed.contains(channel)
    }
}

impl RedisStore {
    pub(super) fn interest(&self, channel: Vec<u8>) -> Interest {
        let notify = self.inner.waiters.register(channel.clone());
        Interest { inner: Arc::clone(&self.inner), channel, notify }
    }
}
