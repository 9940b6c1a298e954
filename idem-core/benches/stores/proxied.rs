//! At a realistic round trip: the same servers behind the delay proxy.

use idem_core::Scope;

use super::measure::{Latencies, latencies_of};
use super::setup::{Settings, pg_config, pg_subject, redis_subject};
use super::{Op, delay_proxy, us, verdict};

/// One store's per-call medians through the delay proxy.
pub(super) struct Proxied {
    pub(super) label: &'static str,
    pub(super) raw2: f64,
    pub(super) first: f64,
    pub(super) first_ratio: f64,
    pub(super) raw1: f64,
    pub(super) replay: f64,
    pub(super) replay_ratio: f64,
}

impl Proxied {
    /// The first call against two raw writes and the replay against one raw read, from rounds
    /// that ran those four ops.
    pub(super) fn of(label: &'static str, lat: &Latencies) -> Proxied {
        Proxied {
            label,
            raw2: lat.median(Op::Raw2),
            first: lat.median(Op::First),
            first_ratio: lat.ratio(Op::First, Op::Raw2),
            raw1: lat.median(Op::Raw1),
            replay: lat.median(Op::Replay),
            replay_ratio: lat.ratio(Op::Replay, Op::Raw1),
        }
    }
}

fn first_addr(host: &str, port: u16) -> std::net::SocketAddr {
    use std::net::ToSocketAddrs;
    (host, port).to_socket_addrs().ok().and_then(|mut a| a.next()).unwrap_or_else(|| {
        panic!("cannot resolve {host}:{port}");
    })
}

/// `url` with its host and port replaced by `addr` (user, password and database kept).
fn redis_url_via(url: &str, addr: std::net::SocketAddr) -> String {
    let info = redis::Client::open(url).expect("IDEM_REDIS_URL").get_connection_info().clone();
    let settings = info.redis_settings();
    let auth = match (settings.username(), settings.password()) {
        (Some(u), Some(p)) => format!("{u}:{p}@"),
        (None, Some(p)) => format!(":{p}@"),
        _ => String::new(),
    };
    format!("redis://{auth}{addr}/{}", settings.db())
}

fn redis_upstream(url: &str) -> std::net::SocketAddr {
    let client = redis::Client::open(url).expect("IDEM_REDIS_URL");
    match client.get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(host, port) => first_addr(host, *port),
        other => panic!("the delay proxy needs a plain TCP Redis, not {other:?}"),
    }
}

fn pg_upstream(config: &tokio_postgres::Config) -> std::net::SocketAddr {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    first_addr(&host, config.get_ports().first().copied().unwrap_or(5432))
}

/// `base` reaching the server at `addr` instead (user, password, database kept).
fn pg_config_via(
    base: &tokio_postgres::Config,
    addr: std::net::SocketAddr,
) -> tokio_postgres::Config {
    let mut c = tokio_postgres::Config::new();
    if let Some(u) = base.get_user() {
        c.user(u);
    }
    if let Some(p) = base.get_password() {
        c.password(p);
    }
    if let Some(d) = base.get_dbname() {
        c.dbname(d);
    }
    c.host(addr.ip().to_string()).port(addr.port());
    c
}

/// PostgreSQL and Redis again, each behind its own delay proxy (`s.proxy_delay` each way):
/// idem's first call and replay against the raw baselines through the same proxy.
pub(super) async fn proxied_runs(s: &Settings, scope: &Scope) -> Vec<Proxied> {
    let mut out = Vec::new();
    for name in s.stores.iter().filter(|n| *n == "postgres" || *n == "redis") {
        let upstream = if name == "postgres" {
            pg_upstream(&pg_config(s))
        } else {
            redis_upstream(&s.redis_url)
        };
        let proxy = delay_proxy::DelayProxy::start(upstream, s.proxy_delay).expect("delay proxy");
        let subject = if name == "postgres" {
            let config = pg_config_via(&pg_config(s), proxy.addr());
            pg_subject(s, config, scope, 1).await
        } else {
            redis_subject(s, &redis_url_via(&s.redis_url, proxy.addr()), scope).await
        };
        subject.seed().await;
        let ops = vec![Op::Raw2, Op::First, Op::Raw1, Op::Replay];
        let lat = latencies_of(&subject, ops, s.rounds, s.proxy_calls).await;
        println!(
            "\n## {} through the delay proxy ({} µs each way): per call (median of {} calls per op)",
            subject.name,
            s.proxy_delay.as_micros(),
            s.rounds * s.proxy_calls
        );
        for (op, v) in &lat.all {
            println!("  {:<30} {:>10}  (n={})", op.label(), us(lat.median(*op)), v.len());
        }
        let p = Proxied::of(subject.name, &lat);
        println!(
            "  first call / 2 raw writes = {:.2}  (target <= 1.10: {})",
            p.first_ratio,
            verdict(p.first_ratio, 1.1)
        );
        println!("  replay / 1 raw read       = {:.2}", p.replay_ratio);
        out.push(p);
    }
    out
}
