//! The durable stores over TLS, against private servers this binary starts (a PostgreSQL cluster
//! from `initdb` with `ssl=on` and only `hostssl` access, a `redis-server` with only a TLS port),
//! with a CA and certificates made by `openssl`: the conformance suite passes over verified TLS,
//! and each failed check (wrong CA, wrong host name, plaintext to a TLS-only server) is refused
//! with an error that says which.

use std::sync::{Arc, OnceLock};

use idem_core::{PostgresStore, RedisStore, StoreError};
use idem_tests::or_skip;
use idem_tests::servers::{Certs, PgTls, RedisTls};

/// One server of each kind for the whole binary (started by the first test that needs it).
fn pg() -> Option<&'static PgTls> {
    static SERVER: OnceLock<Result<PgTls, String>> = OnceLock::new();
    or_skip(
        "a private PostgreSQL with TLS (initdb, openssl)",
        SERVER.get_or_init(PgTls::start).as_ref(),
    )
}

fn redis() -> Option<&'static RedisTls> {
    static SERVER: OnceLock<Result<RedisTls, String>> = OnceLock::new();
    or_skip(
        "a private redis-server with TLS (openssl)",
        SERVER.get_or_init(RedisTls::start).as_ref(),
    )
}

fn verify_full(server: &PgTls) -> String {
    server.conninfo(&format!("sslmode=verify-full sslrootcert={}", server.certs.ca.display()))
}

/// The error of a connection that must be refused.
fn refused<T>(what: &str, r: Result<T, StoreError>) -> String {
    match r {
        Ok(_) => panic!("{what}: connected, but must be refused"),
        Err(e @ StoreError::Unavailable(_)) => {
            // The backend's words are the cause (`source()`), not part of the message.
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

mod postgres_verify_full {
    use super::*;

    async fn store() -> Option<Arc<PostgresStore>> {
        let server = pg()?;
        Some(Arc::new(PostgresStore::connect(&verify_full(server)).await.expect("verify-full")))
    }

    idem_core::store_conformance_tests!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        store().await
    );
}

/// `open(url)` takes the URL form with `sslmode` and `sslrootcert` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_url_with_verify_full_opens() {
    let Some(server) = pg() else { return };
    let url = format!(
        "postgresql://postgres@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={}",
        server.port,
        server.certs.ca.display()
    );
    let store = idem_core::store::open(&url).await.expect("opens over verified TLS");
    idem_core::conformance::claim_fresh_key_acquires(&*store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_wrong_ca_is_refused() {
    let Some(server) = pg() else { return };
    let url = server
        .conninfo(&format!("sslmode=verify-full sslrootcert={}", server.certs.other_ca.display()));
    let msg = refused(
        "a CA that did not sign the server's certificate",
        PostgresStore::connect(&url).await,
    );
    assert!(msg.contains("certificate chain check failed"), "{msg}");
    // verify-ca checks the chain too.
    let url = url.replace("verify-full", "verify-ca");
    let msg = refused("verify-ca with the wrong CA", PostgresStore::connect(&url).await);
    assert!(msg.contains("certificate chain check failed"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_wrong_host_name_is_refused_by_verify_full_only() {
    let Some(server) = pg() else { return };
    // The same server, reached under a name its certificate does not carry.
    let url = format!(
        "host=other.idem.test hostaddr=127.0.0.1 port={} user=postgres dbname=postgres \
         sslmode=verify-full sslrootcert={}",
        server.port,
        server.certs.ca.display()
    );
    let msg =
        refused("a host name the certificate does not carry", PostgresStore::connect(&url).await);
    assert!(msg.contains("host name check failed"), "{msg}");
    // verify-ca checks the chain and not the name; the certificate's own name passes both.
    let ca_only = url.replace("verify-full", "verify-ca");
    PostgresStore::connect(&ca_only).await.expect("verify-ca ignores the host name");
    let named = url.replace("other.idem.test", Certs::HOST);
    PostgresStore::connect(&named).await.expect("verify-full with the certificate's name");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_plaintext_to_tls_only_server_is_refused() {
    let Some(server) = pg() else { return };
    // A configuration error (SQLSTATE 28000): connecting again the same way cannot succeed.
    let msg = match PostgresStore::connect(&server.conninfo("sslmode=disable")).await {
        Err(StoreError::InvalidConfig(msg)) => msg,
        other => panic!("plaintext to a hostssl-only server: {:?}", other.map(drop)),
    };
    assert!(msg.contains("no pg_hba.conf entry") && msg.contains("may require TLS"), "{msg}");
    // require: encrypted, the certificate unchecked (libpq's meaning), so any CA passes.
    PostgresStore::connect(&server.conninfo("sslmode=require")).await.expect("require");
}

mod redis_tls {
    use super::*;

    async fn store() -> Option<Arc<RedisStore>> {
        let server = redis()?;
        let url = server.url(&server.certs.ca);
        Some(Arc::new(RedisStore::builder(url).prefix("idem-tls").open().await.expect("rediss://")))
    }

    idem_core::store_conformance_tests!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        store().await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_wrong_ca_is_refused() {
    let Some(server) = redis() else { return };
    let url = server.url(&server.certs.other_ca);
    let msg = refused(
        "rediss:// with a CA that did not sign the server's certificate",
        RedisStore::open(&url).await,
    );
    assert!(msg.contains("certificate chain check failed"), "{msg}");
    // And through open(url).
    let msg = refused("open(rediss://) with the wrong CA", idem_core::store::open(&url).await);
    assert!(msg.contains("certificate chain check failed"), "{msg}");
}
