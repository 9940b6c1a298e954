//! The Redis store on a TLS-only Redis Cluster of its own (3 masters, no replicas, `--tls-port`
//! and `--tls-cluster yes`; tests/support/cluster.rs) with a CA and certificates made by
//! `openssl`: the conformance suite over `rediss+cluster://…?ca=`, and a CA that did not sign the
//! nodes' certificates refused with an error that says which check failed.
//!
//! Needs `redis-server` (built with TLS), `redis-cli` and `openssl`; without them the tests print
//! SKIP, and fail under `CI=true`.

use std::sync::OnceLock;

use idem_core::store::{Claim, RedisStore};
use idem_core::{StoreError, conformance::fresh_key};
use idem_tests::cluster::{self, Cluster};
use idem_tests::{assert_answer, claim_req, or_skip};

fn shared() -> Option<&'static Cluster> {
    static SHARED: OnceLock<Result<Cluster, String>> = OnceLock::new();
    let started = SHARED.get_or_init(|| {
        cluster::available()?;
        Cluster::start_tls("redis-cluster-tls")
    });
    or_skip("a TLS Redis Cluster (redis-server, redis-cli, openssl)", started.as_ref())
        .map(|c| c as _)
}

/// The store URL, checked against `ca`.
fn url(cluster: &Cluster, ca: &std::path::Path) -> String {
    cluster.url(&format!("?ca={}", ca.display()))
}

async fn store() -> Option<RedisStore> {
    let cluster = tokio::task::spawn_blocking(shared).await.expect("cluster start")?;
    let certs = cluster.tls.as_ref().expect("a TLS cluster");
    let url = url(cluster, &certs.ca);
    Some(RedisStore::builder(url).open().await.expect("rediss+cluster:// opens"))
}

idem_core::store_conformance_tests!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    store().await.map(Box::new)
);

/// `open(url)` names the TLS cluster form, and every master is reached over TLS: a key on each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_reaches_every_master_over_tls() {
    let Some(cluster) = tokio::task::spawn_blocking(shared).await.unwrap() else { return };
    let certs = cluster.tls.as_ref().expect("a TLS cluster");
    let store = idem_core::store::open(&url(cluster, &certs.ca)).await.expect("opens");
    let probe = RedisStore::builder(url(cluster, &certs.ca)).open_lazy().expect("URL");
    let masters: Vec<_> =
        cluster.nodes().unwrap().into_iter().filter(|n| n.master && !n.slots.is_empty()).collect();
    assert_eq!(masters.len(), 3);
    for master in &masters {
        let key = (0..)
            .map(|i| fresh_key("tls-cluster-master", &format!("{}-{i}", master.port)).0)
            .find(|k| master.serves(cluster::slot(&probe.record_key(k))))
            .unwrap();
        let fp = idem_core::key::fingerprint(b"{}");
        assert_answer!(store.claim(claim_req(&key, &fp)).await, Ok(Claim::Acquired { .. }));
    }
}

/// The error of a connection that must be refused, with its causes.
fn refused<T>(what: &str, r: Result<T, StoreError>) -> String {
    match r {
        Ok(_) => panic!("{what}: connected, but must be refused"),
        Err(e @ StoreError::Unavailable(_)) => {
            let mut msg = e.to_string();
            let mut next = std::error::Error::source(&e);
            while let Some(cause) = next {
                msg = format!("{msg}: {cause}");
                next = cause.source();
            }
            msg
        }
        Err(other) => panic!("{what}: expected Unavailable, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_ca_is_refused_saying_the_chain_check_failed() {
    let Some(cluster) = tokio::task::spawn_blocking(shared).await.unwrap() else { return };
    let certs = cluster.tls.as_ref().expect("a TLS cluster");
    let wrong = url(cluster, &certs.other_ca);
    let msg = refused(
        "rediss+cluster:// with a CA that did not sign the nodes' certificates",
        RedisStore::open(&wrong).await,
    );
    assert!(msg.contains("certificate chain check failed"), "{msg}");
    let msg =
        refused("open(rediss+cluster://) with the wrong CA", idem_core::store::open(&wrong).await);
    assert!(msg.contains("certificate chain check failed"), "{msg}");
    // Plaintext to a TLS-only cluster is refused too (the nodes serve no plaintext port).
    let plain = cluster.url("").replacen("rediss+cluster", "redis+cluster", 1);
    refused("redis+cluster:// to a TLS-only cluster", RedisStore::open(&plain).await);
}
