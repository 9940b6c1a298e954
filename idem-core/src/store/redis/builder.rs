//! [`RedisStoreBuilder`]: the URL, key prefix, timeouts and replica wait of a [`RedisStore`], and
//! opening it.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use redis::aio::ConnectionManagerConfig;
use redis::cluster::ClusterConfig;

use super::pubsub::{cluster_pubsub, pubsub_connection};
use super::reply::unavailable;
use super::route::{Cluster, Conn, One, Replicas};
use super::scripts::Scripts;
use super::{Inner, RedisStore, conn};
use crate::store::StoreError;
use crate::store::redact::SecretUrl;
use crate::store::wait::WaiterMap;

/// Builds a [`RedisStore`]: the URL, a key prefix, timeouts and the replica wait.
#[must_use = "a builder does nothing until `open` or `open_lazy` is called"]
#[derive(Clone, Debug)]
pub struct RedisStoreBuilder {
    /// Printed without its password (`redact.rs`): a builder is printed in logs.
    pub(super) url: SecretUrl,
    /// Set by [`prefix`](Self::prefix); else the URL's, else `idem`.
    pub(super) prefix: Option<String>,
    pub(super) response_timeout: Duration,
    pub(super) connection_timeout: Duration,
    pub(super) wait: Option<Replicas>,
    pub(super) native_claims: bool,
    pub(super) replay_reads: bool,
    /// Set by [`allow_eviction`](Self::allow_eviction); else the URL's, else refused.
    pub(super) allow_eviction: Option<bool>,
    /// Whether a replica is accepted: the command line looks at a store, and a replica answers
    /// its reads; an application's store must write.
    pub(super) replica_ok: bool,
}

impl RedisStoreBuilder {
    /// The prefix of every Redis key and channel the store uses. Default: the URL's `prefix`
    /// option, else `idem`; this overrides the URL's. It must not be empty or contain `{` or `}`
    /// (they would change the keys' hash tag); `open` refuses it.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// How long a command may wait for its answer before the call fails with
    /// [`StoreError::Unavailable`]. Default 1 s; `Duration::MAX` for no limit. Zero is refused
    /// by `open` (every command would race its own timeout).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long one connection attempt may take. Default 1 s; `Duration::MAX` for no limit.
    /// Zero is refused by `open`.
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// After each claim that acquires and each completion, wait until `count` replicas have
    /// acknowledged the write, for at most `timeout` (Redis `WAIT`, on the connection that wrote).
    /// Overrides the URL's `wait_replicas` and `wait_timeout_ms`; a `count` of 0 turns it off.
    /// A `timeout` of zero is refused by `open` (Redis would wait for ever); one under a
    /// millisecond waits 1 ms (`WAIT` counts whole milliseconds).
    ///
    /// A claim acknowledged by fewer replicas is not trusted: it fails with
    /// [`StoreError::Unavailable`] and its record is released in the background, so the tool does
    /// not run. A completion acknowledged by fewer fails with [`StoreError::Unavailable`] (the
    /// executor still answers with the output; the record may come back in flight after a
    /// failover, see the module docs). Commands may take up to `timeout` longer.
    pub fn wait_for_replicas(mut self, count: u32, timeout: Duration) -> Self {
        self.wait = Some(Replicas { count, timeout });
        self
    }

    /// Whether a fresh claim or a replay may be one native `SET .. NX GET` with the fence and
    /// lease end from the store's estimate of the server's clock (see the module docs). Off, every
    /// claim is the claim script, which reads the server's clock itself. Default on; it applies to
    /// one server without a replica wait, and a server before Redis 7.0 turns it off by itself.
    pub fn native_claims(mut self, on: bool) -> Self {
        self.native_claims = on;
        self
    }

    /// Whether a claim of a key this store saw completed lately (kept for up to 16,384 keys) is
    /// first one `GET` of the record: a repeat in the same process then costs one read, as a
    /// replay by hand would. When the record is no longer completed (expired, forgotten, claimed
    /// again elsewhere), the claim goes on as usual, one round trip later; the answer is the same
    /// either way. Default on. Off, every claim takes the claim's own path (a process that
    /// rarely sees a repeat, or a measurement of that path).
    pub fn replay_reads(mut self, on: bool) -> Self {
        self.replay_reads = on;
        self
    }

    /// Whether [`open`](Self::open) accepts a server that may evict keys when it is full
    /// (`maxmemory` set and a `maxmemory-policy` other than `noeviction`): an evicted record runs
    /// its call again, an evicted fence counter can give two owners equal fences. Default: the
    /// URL's `allow_eviction` option, else refused with [`StoreError::InvalidConfig`]; accepted,
    /// `open` logs a warning. See `eviction.rs` for what is checked and when.
    pub fn allow_eviction(mut self, allow: bool) -> Self {
        self.allow_eviction = Some(allow);
        self
    }

    /// For a tool that only looks at a store (the command line): a replica is not refused.
    pub(crate) fn looking_only(mut self) -> Self {
        self.replica_ok = true;
        self
    }

    /// Connects now: fails with [`StoreError::Unavailable`] if the server (on a cluster, a node
    /// of it) cannot be reached; when a TLS check refused it, the message says which (the
    /// certificate chain, the host name). Fails with [`StoreError::InvalidConfig`] when the
    /// server may evict the store's keys, unless [`allow_eviction`](Self::allow_eviction), and
    /// when a `redis://` URL names a node of a Redis Cluster (use `redis+cluster://`); with
    /// [`StoreError::Unavailable`] when it names a replica (name the master).
    pub async fn open(self) -> Result<RedisStore, StoreError> {
        let connect = self.connection_timeout;
        let response = self.response_timeout;
        let replica_ok = self.replica_ok;
        let target = conn::target(&self.url)?;
        let allow_eviction = self.allow_eviction.or(target.allow_eviction).unwrap_or(false);
        let cluster = target.servers;
        let store = self.open_lazy()?;
        if let Err(e) = store.inner.conn.ping().await {
            // Say which TLS check refused the connection, when one did.
            #[cfg(feature = "redis-tls")]
            if let Some(why) = conn::tls_refused(&e) {
                return Err(StoreError::unavailable(format!("{why}: {e}")));
            }
            if let conn::Servers::Cluster(nodes) = &cluster
                && let Some(refused) = nodes.tls_refusal(connect).await
            {
                return Err(refused);
            }
            if super::reply::refused_access(&e) {
                return Err(super::reply::refused(format!("{e} (at {})", cluster.addresses())));
            }
            if e.is_timeout() {
                // Connected or not, nothing answered the first command in time: name the bound
                // that ran out, so a hung server is not mistaken for a refused one.
                return Err(StoreError::timed_out(format!(
                    "Redis did not answer within {} ms (connection timeout) or {} ms (response \
                     timeout): the server is not answering, or is out of reach: {e}",
                    connect.as_millis(),
                    response.as_millis()
                )));
            }
            // Say where: an operator's first question, which the redis crate's text leaves out.
            let at = cluster.addresses();
            let unreached = e.is_io_error()
                || e.is_connection_refusal()
                || e.kind() == redis::ErrorKind::ClusterConnectionNotFound;
            return Err(StoreError::unavailable(if unreached {
                format!("cannot reach Redis at {at}: {e}")
            } else {
                format!("Redis at {at}: {e}")
            }));
        }
        if let super::route::Conn::Cluster(conn) = &store.inner.conn {
            // Before anything is routed by slot: a single server names itself plainly.
            super::admin::cluster_slots(&conn.connection().1).await?;
        }
        let at = cluster.addresses();
        // The wrong server first: a cluster node or a replica is named, whatever its eviction
        // policy says.
        if let conn::Servers::One(_) = &cluster {
            refuse_unusable_server(&store.inner.conn, &at, replica_ok).await?;
        }
        super::eviction::check(&store.inner.conn, allow_eviction, &at).await?;
        super::persistence::warn_if_not_durable(&store.inner.conn, &at).await;
        Ok(store)
    }

    /// Connects on first use, so a process can start while Redis is down (its calls fail closed
    /// until Redis is back). Fails only on a malformed URL, or outside a Tokio runtime with timers
    /// and I/O enabled (a configuration error saying which is missing, not Tokio's panic). It does
    /// not check the server's eviction policy, as [`open`](Self::open) does.
    pub fn open_lazy(self) -> Result<RedisStore, StoreError> {
        let target = conn::target(&self.url)?;
        match crate::tokio_ready::for_store(true) {
            Ok(()) => {}
            // The redis crate's connections start tasks at once, and would panic.
            Err(crate::tokio_ready::Lacks::Runtime) => {
                return Err(StoreError::InvalidConfig(
                    "a Redis store is opened inside a Tokio runtime (in an async fn run by it, or \
                     after Runtime::enter)"
                        .into(),
                ));
            }
            Err(lacks) => return Err(StoreError::InvalidConfig(lacks.advice())),
        }
        let prefix = self.prefix.or(target.prefix).unwrap_or_else(|| "idem".to_owned());
        if prefix.is_empty() || prefix.contains(['{', '}']) {
            // A brace would change the hash tag, splitting a record from its fence counter.
            return Err(StoreError::InvalidConfig(format!(
                "invalid key prefix {prefix:?}: it must not be empty or contain '{{' or '}}'"
            )));
        }
        // A zero timeout would fail commands or connections at random, whichever answers
        // first: refused, with what to write instead.
        for (zero, what) in [
            (self.response_timeout.is_zero(), "response_timeout"),
            (self.connection_timeout.is_zero(), "connection_timeout"),
        ] {
            if zero {
                return Err(StoreError::InvalidConfig(format!(
                    "the Redis {what} must be longer than zero: give it as in \
                     RedisStoreBuilder::{what}(Duration::from_secs(1)) (the default), or \
                     Duration::MAX for no limit"
                )));
            }
        }
        let wait = match self.wait.or(target.wait) {
            Some(Replicas { count: 0, .. }) | None => None,
            Some(Replicas { timeout: Duration::ZERO, .. }) => {
                return Err(StoreError::InvalidConfig(conn::ZERO_WAIT.to_owned()));
            }
            some => some,
        };
        // `WAIT` holds the reply for up to its timeout. Saturating: either may be `Duration::MAX`.
        let response_timeout =
            self.response_timeout.saturating_add(wait.map_or(Duration::ZERO, |w| w.timeout));
        let waiters = Arc::new(WaiterMap::default());
        let (conn, pubsub) = match target.servers {
            conn::Servers::One(client) => {
                let config = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(response_timeout))
                    .set_connection_timeout(Some(self.connection_timeout))
                    // One attempt per call: a call on a stopped server fails within the timeouts
                    // instead of waiting out a backoff; the next call tries again.
                    .set_number_of_retries(0);
                let conn = One::new(client.clone(), config.clone()).map_err(unavailable)?;
                let config = config.set_response_timeout(Some(self.response_timeout));
                (Conn::One(Arc::new(conn)), pubsub_connection(&client, config, &waiters))
            }
            conn::Servers::Cluster(nodes) => {
                // No retries in the client: the store follows redirections and resends itself
                // (see `route.rs`).
                let client = nodes
                    .builder()
                    .retries(0)
                    .connection_timeout(self.connection_timeout)
                    .response_timeout(response_timeout)
                    .build()
                    .map_err(|e| StoreError::InvalidConfig(format!("Redis URL: {e}")))?;
                let config = ClusterConfig::new()
                    .set_connection_timeout(self.connection_timeout)
                    .set_response_timeout(response_timeout);
                let conn = Conn::Cluster(Arc::new(Cluster::new(client, config)));
                let (connect, respond) = (self.connection_timeout, self.response_timeout);
                (conn, cluster_pubsub(&nodes, connect, respond, &waiters))
            }
        };
        // Native claims: one server (on a cluster each master has its own clock) and no replica
        // wait (the claim's `WAIT` goes with its script).
        let native = self.native_claims && wait.is_none() && matches!(conn, Conn::One(_));
        Ok(RedisStore {
            inner: Arc::new(Inner {
                conn,
                wait,
                prefix,
                scripts: Scripts::new(),
                waiters,
                pubsub,
                subscribed: tokio::sync::Mutex::new(HashSet::new()),
                pubsub_broken: AtomicBool::new(false),
                clock: super::native::ServerClock::default(),
                native: super::native::Support::new(native),
                recent: super::recent::Recent::new(self.replay_reads),
            }),
        })
    }
}

/// One `INFO` section of the one server, as text; `None` when the server will not say (an ACL
/// without `+info`, a proxy that does not know the command). Not answered (a timeout, a dropped
/// connection): an outage, as for `INFO memory`.
async fn info_section(conn: &Conn, section: &str) -> Result<Option<String>, StoreError> {
    let reply = match conn.command(redis::cmd("INFO").arg(section)).await {
        Ok(reply) => reply,
        Err(e) if super::eviction::info_send_refused(&e) => return Ok(None),
        Err(e) => return Err(super::reply::unavailable(e)),
    };
    let mut servers = Vec::new();
    super::eviction::answers(&reply, "", &mut servers);
    Ok(servers.into_iter().find_map(|(_, answer)| match answer {
        super::eviction::Answer::Info(text) => Some(text),
        _ => None,
    }))
}

/// Refuses a server that a `redis://` URL names but that cannot hold the store's records by
/// itself (a server that will not say is let through, as proxies in front of a cluster or of a
/// master answer for it themselves):
///
/// - a node of a Redis Cluster: it answers `MOVED` for every key in another master's slots, so
///   most calls would fail closed as if the store were down while the rest worked (and all of
///   them once the cluster is resharded);
/// - a replica, unless `replica_ok` (the command line, which only looks), named where the master
///   was meant (a managed Redis's reader endpoint, or a replica's address): a read-only one
///   refuses every claim (`READONLY`, which the store takes for a master demoted behind its
///   address and sends again for seconds before failing closed), and a writable one
///   (`replica-read-only no`) keeps a claim to itself: the master never sees it, a process
///   using the master acquires the same key, and the replica's next full resync erases it.
async fn refuse_unusable_server(conn: &Conn, at: &str, replica_ok: bool) -> Result<(), StoreError> {
    if let Some(info) = info_section(conn, "cluster").await?
        && super::eviction::info_field(&info, "cluster_enabled") == Some("1")
    {
        return Err(StoreError::InvalidConfig(format!(
            "Redis at {at} is a node of a Redis Cluster (cluster_enabled:1), which answers MOVED \
             for the keys of other nodes' slots: name the cluster with redis+cluster://{at}/ \
             (rediss+cluster:// with TLS), listing one or more of its nodes"
        )));
    }
    if replica_ok {
        return Ok(());
    }
    if let Some(info) = info_section(conn, "replication").await?
        && matches!(super::eviction::info_field(&info, "role"), Some("slave" | "replica"))
    {
        let master = match (
            super::eviction::info_field(&info, "master_host"),
            super::eviction::info_field(&info, "master_port"),
        ) {
            (Some(host), Some(port)) => format!("{host}:{port}"),
            _ => "its master".to_owned(),
        };
        return Err(StoreError::unavailable(format!(
            "Redis at {at} is a replica of {master} (role:slave): claims written there are \
             refused, or on a writable replica never reach the master, where another process \
             would claim the same key. Name the master (a managed Redis's primary endpoint, not \
             a reader endpoint), or open the store again once this server is promoted"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::RedisStore;

    /// `Duration::MAX` means "no limit" for both timeouts; their sum (the response timeout with
    /// a replica wait) used to overflow and panic in `open_lazy`.
    #[tokio::test]
    async fn endless_timeouts_with_a_replica_wait_open() {
        let url = "redis://127.0.0.1:6379/";
        for (response, wait) in
            [(Duration::MAX, Duration::from_secs(1)), (Duration::MAX, Duration::MAX)]
        {
            let opened = RedisStore::builder(url)
                .response_timeout(response)
                .wait_for_replicas(1, wait)
                .open_lazy();
            assert!(opened.is_ok(), "response {response:?}, wait {wait:?}: {:?}", opened.err());
        }
    }

    /// A zero response or connection timeout is refused, naming the setting, instead of failing
    /// commands at random (whichever of the answer and the timer comes first).
    #[tokio::test]
    async fn zero_timeouts_are_refused() {
        let url = "redis://127.0.0.1:6379/";
        let response = RedisStore::builder(url).response_timeout(Duration::ZERO).open_lazy();
        let connection = RedisStore::builder(url).connection_timeout(Duration::ZERO).open_lazy();
        for (what, got) in [("response_timeout", response), ("connection_timeout", connection)] {
            match got {
                Err(crate::StoreError::InvalidConfig(m)) => {
                    assert!(m.contains(what) && m.contains("longer than zero"), "{m}");
                }
                other => panic!("{what}: expected InvalidConfig, got {:?}", other.map(|_| ())),
            }
        }
    }

    /// Redis reads `WAIT n 0` as "wait for ever": a zero replica wait is refused with what to
    /// write instead.
    #[tokio::test]
    async fn a_zero_replica_wait_is_refused() {
        let url = "redis://127.0.0.1:6379/";
        match RedisStore::builder(url).wait_for_replicas(1, Duration::ZERO).open_lazy() {
            Err(crate::StoreError::InvalidConfig(m)) => {
                assert!(m.contains("at least 1 ms") && m.contains("wait_for_replicas(1"), "{m}");
            }
            other => panic!("expected InvalidConfig, got {:?}", other.map(|_| ())),
        }
        // Turned off (count 0), the timeout does not matter.
        assert!(RedisStore::builder(url).wait_for_replicas(0, Duration::ZERO).open_lazy().is_ok());
    }
}
