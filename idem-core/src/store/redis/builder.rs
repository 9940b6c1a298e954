//! [`RedisStoreBuilder`]: the URL, key prefix and timeouts of a [`RedisStore`], and opening it.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::pubsub::pubsub_connection;
use super::reply::unavailable;
use super::scripts::Scripts;
use super::{Inner, RedisStore, conn};
use crate::store::StoreError;
use crate::store::wait::WaiterMap;

/// Builds a [`RedisStore`]: the URL, a key prefix and timeouts.
#[must_use = "a builder does nothing until `open` or `open_lazy` is called"]
#[derive(Clone, Debug)]
pub struct RedisStoreBuilder {
    pub(super) url: String,
    pub(super) prefix: String,
    pub(super) response_timeout: Duration,
    pub(super) connection_timeout: Duration,
}

impl RedisStoreBuilder {
    /// The prefix of every Redis key and channel the store uses. Default `idem`. It must not
    /// contain `{` or `}` (they would change the keys' hash tag); `open` refuses it.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long a command may wait for its answer before the call fails with
    /// [`StoreError::Unavailable`]. Default 1 s.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long one connection attempt may take. Default 1 s.
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// Connects now: fails with [`StoreError::Unavailable`] if the server cannot be reached.
    pub async fn open(self) -> Result<RedisStore, StoreError> {
        let store = self.open_lazy()?;
        let mut conn = store.inner.conn.clone();
        redis::cmd("PING").query_async::<()>(&mut conn).await.map_err(unavailable)?;
        Ok(store)
    }

    /// Connects on first use, so a process can start while Redis is down (its calls fail closed
    /// until Redis is back). Fails only on a malformed URL.
    pub fn open_lazy(self) -> Result<RedisStore, StoreError> {
        if self.prefix.contains(['{', '}']) {
            // A brace would change the hash tag, splitting a record from its fence counter.
            return Err(StoreError::InvalidConfig(format!(
                "invalid key prefix {:?}: it must not contain '{{' or '}}'",
                self.prefix
            )));
        }
        let client = conn::client(&self.url)?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.response_timeout))
            .set_connection_timeout(Some(self.connection_timeout))
            // One attempt per call: a call on a stopped server fails within the timeouts instead
            // of waiting out a backoff; the next call tries again.
            .set_number_of_retries(0);
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
            .map_err(unavailable)?;
        let waiters = Arc::new(WaiterMap::default());
        let pubsub = pubsub_connection(&client, config, &waiters);
        Ok(RedisStore {
            inner: Arc::new(Inner {
                conn,
                prefix: self.prefix,
                scripts: Scripts::new(),
                waiters,
                pubsub,
                subscribed: tokio::sync::Mutex::new(HashSet::new()),
                pubsub_broken: AtomicBool::new(false),
            }),
        })
    }
}
