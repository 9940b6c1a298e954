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

/// How long the listener waits for its probe notification before it concludes that
/// notifications do not reach it (a `LISTEN` through PgBouncer in transaction mode ends with its
/// transaction's server connection, and says nothing).
const PROBE_WAIT: Duration = Duration::from_secs(2);

/// How long a listener whose probe never arrived waits before trying again; waiters poll
/// meanwhile.
const PROBE_RETRY: Duration = Duration::from_secs(60);

/// How often the listening connection is asked a trivial query, answered within
/// [`PROBE_WAIT`] or the connection is given up: it only ever receives, so when it goes silent
/// (a NAT or load balancer that forgot the flow, a server address gone in a failover) nothing
/// is sent that could fail, and TCP keepalives (after 2 hours by default) are the only other
/// way to notice. Meanwhile it would count as listening while no notification arrives, and
/// waiters would wait for the slower polling meant only for a lost notification.
const PING_EVERY: Duration = Duration::from_secs(10);

/// The listener: one connection that `LISTEN`s on [`CHANNEL`] and wakes waiters by key;
/// reconnects after a failure (waking everyone, since notifications may have been lost).
///
/// A `LISTEN` can succeed and still hear nothing (PgBouncer in transaction mode), so the listener
/// counts as listening only once a probe notification, sent from another connection, arrived.
/// The waiters are this process's, by key, woken by notifications and by this store's own
/// writes.
pub(super) async fn listen(
    target: Target,
    waiters: Arc<WaiterMap<Key>>,
    listening: Arc<AtomicBool>,
) {
    // Dropped with the task (its runtime ended): no longer listening, and waiters poll.
    let _deaf = Deaf(Arc::clone(&listening), Arc::clone(&waiters));
    let mut backoff = Duration::from_millis(100);
    loop {
        let mut deaf = false;
        if let Ok((client, mut connection)) = target.connect().await {
            let probe = {
                use rand::{RngCore, SeedableRng};
                format!("idem-probe-{:016x}", rand::rngs::SmallRng::from_os_rng().next_u64())
            };
            let (heard, heard_rx) = tokio::sync::oneshot::channel::<()>();
            let driver = {
                let (waiters, probe) = (Arc::clone(&waiters), probe.clone());
                let mut heard = Some(heard);
                async move {
                    while let Some(Ok(msg)) =
                        std::future::poll_fn(|cx| connection.poll_message(cx)).await
                    {
                        let AsyncMessage::Notification(n) = msg else { continue };
                        if n.payload() == probe {
                            if let Some(heard) = heard.take() {
                                let _ = heard.send(());
                            }
                        } else if let Some(key) = Key::parse(n.payload()) {
                            waiters.wake(&key);
                        }
                    }
                }
            };
            let subscribe = async {
                if client.batch_execute(&format!("LISTEN {CHANNEL}")).await.is_err()
                    || !send_probe(&target, &probe).await
                {
                    return false;
                }
                if let Ok(Ok(())) = tokio::time::timeout(PROBE_WAIT, heard_rx).await {
                    listening.store(true, Ordering::Relaxed);
                    waiters.wake_all();
                    // Keeps the client (and so the connection) alive while the driver runs, and
                    // gives the connection up once it stops answering.
                    loop {
                        tokio::time::sleep(PING_EVERY).await;
                        let ping = tokio::time::timeout(PROBE_WAIT, client.simple_query("")).await;
                        if !matches!(ping, Ok(Ok(_))) {
                            tracing::warn!(
                                "the PostgreSQL listener's connection stopped answering; \
                                 connecting again (waiters poll meanwhile)"
                            );
                            return false;
                        }
                    }
                }
                tracing::warn!(
                    "PostgreSQL notifications do not reach the store's listener (PgBouncer in \
                     transaction mode?); waiters poll instead"
                );
                true
            };
            deaf = tokio::select! {
                () = driver => false,
                deaf = subscribe => deaf,
            };
            listening.store(false, Ordering::Relaxed);
            waiters.wake_all();
            backoff = Duration::from_millis(100);
        }
        tokio::time::sleep(if deaf { PROBE_RETRY } else { backoff }).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Marks the store as not listening when the listener ends, and wakes its waiters.
struct Deaf(Arc<AtomicBool>, Arc<WaiterMap<Key>>);

impl Drop for Deaf {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
        self.1.wake_all();
    }
}

/// Sends the probe notification from a connection of its own (a session hears its own
/// notifications, so the listener's connection would prove nothing); whether it was sent.
async fn send_probe(target: &Target, probe: &str) -> bool {
    let Ok((client, connection)) = target.connect().await else { return false };
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    // The probe is hex digits: nothing to quote.
    let sent = client.batch_execute(&format!("NOTIFY {CHANNEL}, '{probe}'")).await.is_ok();
    drop(client);
    let _ = driver.await;
    sent
}
