//! Over TLS: a private PostgreSQL (`initdb`, `ssl=on`, only `hostssl`) and a private
//! `redis-server` serving only TLS, with a CA and certificates made by `openssl`, started here by
//! the same code as the managed-database tests (tests/support/servers.rs). idem's first call and
//! replay against the raw baselines over the same kind of TLS connection: tokio-postgres over
//! rustls with the chain and host name checked (the store's `sslmode=verify-full`), and a redis-rs
//! `ConnectionManager` on `rediss://` with the test CA (the store's `?ca=`).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use idem_core::store::{PostgresStore, RedisStore};
use idem_core::{Idem, Scope};
use redis::aio::ConnectionManager;

use super::measure::latencies_of;
use super::proxied::Proxied;
use super::raw::{PgRaw, Raw};
use super::setup::{Settings, redis_prefix};
use super::{Op, Subject, read_keys, us, verdict};

#[allow(dead_code)] // the benches start the TLS servers only, not PgBouncer
#[path = "../../../tests/support/servers.rs"]
mod servers;

use servers::{PgTls, RedisTls};

/// A rustls client configuration that trusts the test CA alone and checks the host name.
fn rustls_config(ca: &std::path::Path) -> rustls::ClientConfig {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).expect("the test CA") {
        roots.add(cert.expect("a PEM certificate")).expect("a CA certificate");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

async fn pg_tls_subject(server: &PgTls, s: &Settings, scope: &Scope) -> Subject {
    let url =
        server.conninfo(&format!("sslmode=verify-full sslrootcert={}", server.certs.ca.display()));
    let store = PostgresStore::connect(&url).await.expect("the PostgreSQL store over verify-full");
    let mut config = tokio_postgres::Config::new();
    config.host("127.0.0.1").port(server.port).user("postgres").dbname("postgres");
    config.ssl_mode(tokio_postgres::config::SslMode::Require);
    let tls = tokio_postgres_rustls::MakeRustlsConnect::new(rustls_config(&server.certs.ca));
    let (client, conn) = config.connect(tls).await.expect("raw connection over verified TLS");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS bench_raw (key text PRIMARY KEY, val text NOT NULL)",
        )
        .await
        .expect("raw table");
    let insert = client
        .prepare("INSERT INTO bench_raw (key, val) VALUES ($1, $2) ON CONFLICT DO NOTHING")
        .await
        .expect("prepare");
    let select = client.prepare("SELECT val FROM bench_raw WHERE key = $1").await.expect("prepare");
    let prefix: Arc<str> = format!("raw-{}", s.run_id).into();
    Subject {
        name: "PostgreSQL, TLS verify-full",
        run: Idem::new(store).scope(scope.clone()),
        raw: Raw::Postgres {
            pool: None,
            conns: vec![PgRaw { client, insert, select }],
            next: AtomicU64::new(0),
        },
        read_keys: read_keys(&prefix),
        prefix,
        scripts: None,
        cold: None,
    }
}

async fn redis_tls_subject(server: &RedisTls, s: &Settings, scope: &Scope) -> Subject {
    let store = RedisStore::builder(server.url(&server.certs.ca))
        .prefix(redis_prefix(s))
        .open()
        .await
        .expect("the Redis store over rediss://");
    let certs = redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(std::fs::read(&server.certs.ca).expect("the test CA")),
    };
    let client =
        redis::Client::build_with_tls(format!("rediss://127.0.0.1:{}/", server.port), certs)
            .expect("rediss:// client");
    let conn = ConnectionManager::new(client).await.expect("raw connection over TLS");
    let prefix: Arc<str> = format!("{}:raw", redis_prefix(s)).into();
    Subject {
        name: "Redis, TLS rediss://",
        run: Idem::new(store).scope(scope.clone()),
        raw: Raw::Redis(conn),
        read_keys: read_keys(&prefix),
        prefix,
        scripts: None,
        cold: None,
    }
}

/// PostgreSQL and Redis over TLS (those of `s.stores`), on private servers started here: idem's
/// first call and replay against the raw baselines, in interleaved rounds. A server that cannot
/// be started (no `initdb`, `openssl`, or a `redis-server` without TLS) is reported and skipped.
pub(super) async fn tls_runs(s: &Settings, scope: &Scope) -> Vec<Proxied> {
    let mut out = Vec::new();
    for name in s.stores.iter().filter(|n| *n == "postgres" || *n == "redis") {
        let subject = if name == "postgres" {
            match tokio::task::spawn_blocking(PgTls::start).await.expect("join") {
                // The server lives until the bench process exits (its watchdog stops it).
                Ok(server) => pg_tls_subject(&server, s, scope).await,
                Err(e) => {
                    println!("\n(PostgreSQL over TLS skipped: {e})");
                    continue;
                }
            }
        } else {
            match tokio::task::spawn_blocking(RedisTls::start).await.expect("join") {
                Ok(server) => redis_tls_subject(&server, s, scope).await,
                Err(e) => {
                    println!("\n(Redis over TLS skipped: {e})");
                    continue;
                }
            }
        };
        subject.seed().await;
        let ops = vec![Op::Raw2, Op::First, Op::Raw1, Op::Replay, Op::StoreFirst, Op::StoreReplay];
        let lat = latencies_of(&subject, ops, s.rounds, s.calls).await;
        println!(
            "\n## {} (private server): per call (median of {} calls per op)",
            subject.name,
            s.rounds * s.calls
        );
        for (op, v) in &lat.all {
            println!("  {:<30} {:>10}  (n={})", op.label(), us(lat.median(*op)), v.len());
        }
        let p = Proxied::of(subject.name, &lat);
        println!(
            "  first call / 2 raw writes = {:.2}  (target <= 1.30: {})",
            p.first_ratio,
            verdict(p.first_ratio, 1.3)
        );
        println!(
            "  replay / 1 raw read       = {:.2}  (target <= 1.20: {})",
            p.replay_ratio,
            verdict(p.replay_ratio, 1.2)
        );
        println!(
            "  diagnostics: store alone: claim+complete / 2 raw writes = {:.2}, claim of a \
             completed key / 1 raw read = {:.2}",
            lat.ratio(Op::StoreFirst, Op::Raw2),
            lat.ratio(Op::StoreReplay, Op::Raw1),
        );
        out.push(p);
    }
    out
}
