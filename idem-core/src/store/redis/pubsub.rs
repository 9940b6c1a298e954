//! Waiting across processes: the dedicated RESP3 pub/sub connection, the subscriptions it holds,
//! and the in-process waiters it wakes by channel.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterConfig;
use redis::cluster_async::ClusterConnection;
use redis::{Client, ProtocolVersion, PushInfo, PushKind, RedisError, Value};
use tokio::sync::Notify;

use super::conn::ClusterNodes;
use super::route::{MadeOn, Replaceable};
use super::{Inner, RedisStore};
use crate::store::wait::WaiterMap;

/// The connection that subscribes: to one server, or to a cluster.
#[derive(Clone)]
enum Subscriber {
    One(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Subscriber {
    async fn subscribe(&mut self, channel: &[u8]) -> Result<(), RedisError> {
        match self {
            Subscriber::One(c) => c.subscribe(channel).await,
            Subscriber::Cluster(c) => c.subscribe(channel).await,
        }
    }

    async fn unsubscribe(&mut self, channel: &[u8]) -> Result<(), RedisError> {
        match self {
            Subscriber::One(c) => c.unsubscribe(channel).await,
            Subscriber::Cluster(c) => c.unsubscribe(channel).await,
        }
    }
}

/// What a new [`Subscriber`] is made from.
enum Make {
    One(Client, ConnectionManagerConfig),
    Cluster(redis::cluster::ClusterClient, ClusterConfig),
}

impl Make {
    fn subscriber(&self) -> Option<Subscriber> {
        Some(match self {
            Make::One(client, config) => Subscriber::One(
                ConnectionManager::new_lazy_with_config(client.clone(), config.clone()).ok()?,
            ),
            Make::Cluster(client, config) => {
                Subscriber::Cluster(client.get_pending_async_connection_with_config(config.clone()))
            }
        })
    }
}

/// The pub/sub connection, replaced by a new one when a subscription gets no answer within the
/// response timeout: a connection that went silent (a NAT or load balancer that forgot the
/// flow, a server address gone in a failover) is closed only by the kernel's retransmission
/// limit, about 15 minutes, and the clients reconnect only when a connection drops, so every
/// wait would spend the timeout subscribing (one after the other: subscriptions are made under
/// one lock) and then poll.
pub(super) struct PubSub {
    make: Make,
    current: Replaceable<Subscriber>,
}

impl PubSub {
    fn new(make: Make) -> Option<PubSub> {
        let first = make.subscriber()?;
        Some(PubSub { make, current: Replaceable::new(first, MadeOn::here()) })
    }

    /// A new connection, whose messages come to a task of the current runtime.
    fn make(&self) -> Option<(Subscriber, MadeOn)> {
        Some((self.make.subscriber()?, MadeOn::here()))
    }

    /// The current connection and its generation; a new one first if the runtime it was made on
    /// has ended (its messages went to a task of that runtime), and then `true`.
    fn current(&self) -> (u64, Subscriber, bool) {
        self.current.current(|| self.make())
    }

    /// The connection of `generation` did not answer: the next subscription goes on a new one
    /// (once per generation). Whether it was replaced now.
    fn replace(&self, generation: u64) -> bool {
        let replaced = self.current.replace(generation, || self.make());
        if replaced {
            tracing::warn!(
                "the Redis pub/sub connection did not answer within the response timeout; \
                 connecting again"
            );
        }
        replaced
    }
}

/// The push handler of a pub/sub connection: wakes the waiters of a channel on a message, and
/// every waiter after a disconnection (messages may have been lost meanwhile).
fn on_push(
    waiters: &Arc<WaiterMap<Vec<u8>>>,
) -> impl Fn(PushInfo) -> Result<(), ()> + Send + Sync + 'static {
    let waiters = Arc::clone(waiters);
    move |push: PushInfo| -> Result<(), ()> {
        match push.kind {
            PushKind::Message => {
                if let Some(Value::BulkString(channel)) = push.data.first() {
                    waiters.wake(&channel[..]);
                }
            }
            PushKind::Disconnection => waiters.wake_all(),
            _ => {}
        }
        Ok(())
    }
}

/// The pub/sub connection of a cluster: RESP3 with the same push handler; the cluster client
/// subscribes on the node that serves the channel's slot (its hash tag is the record's) and
/// subscribes again after a reconnect or a change of topology. Scripts `PUBLISH`, which a cluster
/// forwards to every node. `None` if it cannot be configured.
pub(super) fn cluster_pubsub(
    nodes: &ClusterNodes,
    connection_timeout: Duration,
    response_timeout: Duration,
    waiters: &Arc<WaiterMap<Vec<u8>>>,
) -> Option<PubSub> {
    let client = nodes
        .builder()
        .use_protocol(ProtocolVersion::RESP3)
        .connection_timeout(connection_timeout)
        .response_timeout(response_timeout)
        .build()
        .ok()?;
    let config = ClusterConfig::new()
        .set_connection_timeout(connection_timeout)
        .set_response_timeout(response_timeout)
        .set_push_sender(on_push(waiters));
    PubSub::new(Make::Cluster(client, config))
}

/// The dedicated pub/sub connection: RESP3 with a push handler that wakes the waiters of a
/// channel, and re-subscription after a reconnect. `None` if it cannot be configured.
pub(super) fn pubsub_connection(
    client: &Client,
    config: ConnectionManagerConfig,
    waiters: &Arc<WaiterMap<Vec<u8>>>,
) -> Option<PubSub> {
    let info = client.get_connection_info().clone();
    let settings = info.redis_settings().clone().set_protocol(ProtocolVersion::RESP3);
    let client = Client::open(info.set_redis_settings(settings)).ok()?;
    let config = config.set_push_sender(on_push(waiters)).set_automatic_resubscription();
    PubSub::new(Make::One(client, config))
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
        let (generation, mut conn, replaced) = pubsub.current();
        if replaced {
            // The subscriptions were the old connection's.
            subscribed.clear();
        }
        match (wanted, subscribed.contains(channel)) {
            (true, false) => match conn.subscribe(channel).await {
                Ok(()) => {
                    subscribed.insert(channel.to_vec());
                }
                Err(e) => {
                    if lasting(&e) {
                        tracing::warn!(error = %e, "redis pub/sub unavailable; waiting by polling");
                        self.pubsub_broken.store(true, Ordering::Relaxed);
                    } else if (e.is_timeout() || !e.is_io_error()) && pubsub.replace(generation) {
                        // Silent, or a setup the server refused for the moment (a `SELECT` or
                        // `HELLO` answered `BUSY` during another client's script), which the
                        // connection manager would keep for good. The subscriptions were the old
                        // connection's: each waiter re-checks its record now, and new waits
                        // subscribe on the new connection.
                        subscribed.clear();
                        self.waiters.wake_all();
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

/// Whether a subscription's failure will not pass by waiting: a server without RESP3, or one
/// that refuses the store's user the command or does not know it (an ACL without `+subscribe`,
/// a proxy without pub/sub). Waits then poll for the life of the store.
fn lasting(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::RESP3NotSupported
        || super::reply::refused_access(e)
        || e.to_string().contains("unknown command")
}

impl RedisStore {
    pub(super) fn interest(&self, channel: Vec<u8>) -> Interest {
        let notify = self.inner.waiters.register(channel.clone());
        Interest { inner: Arc::clone(&self.inner), channel, notify }
    }
}
