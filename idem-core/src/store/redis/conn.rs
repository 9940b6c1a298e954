//! How the Redis store reaches its servers: the URL forms, the TLS roots of a private deployment
//! (`?ca=/path/ca.pem`, feature `redis-tls`), and the clients they give.
//!
//! | URL | servers |
//! |-----|---------|
//! | `redis://[user:password@]host[:port][/db]` | one server (standalone or a primary) |
//! | `rediss://…` | the same over TLS |
//! | `redis+unix:///path/redis.sock[?db=N]`, `unix://…` | one server on a Unix socket |
//! | `redis+cluster://[user:password@]host1[:port1],host2[:port2],…[/]` | a Redis Cluster, found from any of the nodes listed |
//! | `rediss+cluster://…` | the same over TLS |
//!
//! Query options: `ca` (a PEM file of trusted roots, TLS only), `wait_replicas` and
//! `wait_timeout_ms` (wait for that many replicas after a claim and a completion, see
//! `RedisStoreBuilder::wait_for_replicas`), `protocol` (`resp2`, `resp3`, as the redis crate reads
//! it), `prefix` (the key prefix), `allow_eviction` (`true`: open a server that may evict keys,
//! see `eviction.rs`), and on a Unix socket `db`, `user`, `pass`. Anything else is refused.

use std::time::Duration;

use redis::Client;
use redis::cluster::ClusterClientBuilder;

use super::route::Replicas;
use crate::store::StoreError;
use crate::store::url_query::percent_decode;

/// How long `WAIT` waits for replicas when the URL names no `wait_timeout_ms`.
pub(super) const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_millis(500);

/// Why a replica wait of zero is refused.
pub(super) const ZERO_WAIT: &str = "the replica wait timeout must be at least 1 ms \
    (wait_timeout_ms=500, or RedisStoreBuilder::wait_for_replicas(1, Duration::from_millis(500))): \
    Redis WAIT with a timeout of 0 waits for ever, blocking the store's connection while no \
    replica answers";

/// The servers a URL names.
pub(super) enum Servers {
    One(Client),
    Cluster(ClusterNodes),
}

impl Servers {
    /// Where the store connects, for error messages: `host:port` (or a socket's path), each node
    /// of a cluster's list; never the URL's password.
    pub(super) fn addresses(&self) -> String {
        let addr = |client: &Client| client.get_connection_info().addr().to_string();
        match self {
            Servers::One(client) => addr(client),
            Servers::Cluster(nodes) => nodes
                .nodes
                .iter()
                .map(|node| {
                    Client::open(node.as_str()).map_or_else(|_| "?".to_owned(), |c| addr(&c))
                })
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

/// The initial nodes of a cluster (one URL each) and its TLS roots.
pub(super) struct ClusterNodes {
    nodes: Vec<String>,
    #[cfg_attr(not(feature = "redis-tls"), allow(dead_code))]
    ca: Option<Vec<u8>>,
}

impl ClusterNodes {
    /// A cluster client builder for these nodes.
    pub(super) fn builder(&self) -> ClusterClientBuilder {
        #[allow(unused_mut)]
        let mut builder = ClusterClientBuilder::new(self.nodes.iter().map(String::as_str));
        #[cfg(feature = "redis-tls")]
        if let Some(pem) = &self.ca {
            let root_cert = Some(pem.clone());
            builder = builder.certs(redis::TlsCertificates { client_tls: None, root_cert });
        }
        builder
    }
}

impl ClusterNodes {
    /// Why the cluster could not be reached, when a TLS check refused its first node: the
    /// cluster client reports only that it has no connection, so one node is tried alone.
    #[cfg(feature = "redis-tls")]
    pub(super) async fn tls_refusal(&self, connect: Duration) -> Option<StoreError> {
        let node = self.nodes.first().filter(|n| n.starts_with("rediss://"))?;
        let client = one_client(node, self.ca.clone()).ok()?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect))
            .set_response_timeout(Some(connect));
        let err = client.get_multiplexed_async_connection_with_config(&config).await.err()?;
        tls_refused(&err).map(|why| {
            let node = crate::store::redact::redacted(node);
            StoreError::unavailable(format!("{why} (cluster node {node}): {err}"))
        })
    }

    #[cfg(not(feature = "redis-tls"))]
    pub(super) async fn tls_refusal(&self, _connect: Duration) -> Option<StoreError> {
        None
    }
}

/// Which TLS check refused a connection, when one did (the redis crate words it as an I/O
/// error): the certificate chain, the host name, or another certificate check.
#[cfg(feature = "redis-tls")]
pub(super) fn tls_refused(e: &redis::RedisError) -> Option<String> {
    let tls = crate::store::tls_refusal::rustls_cause(e)?;
    let roots = "the URL's `ca` file, else the system's roots";
    Some(format!("Redis TLS {}", crate::store::tls_refusal::why(tls, roots)))
}

/// What a Redis store URL says.
pub(super) struct Target {
    pub(super) servers: Servers,
    pub(super) wait: Option<Replicas>,
    /// The `prefix` option: the key prefix.
    pub(super) prefix: Option<String>,
    /// The `allow_eviction` option.
    pub(super) allow_eviction: Option<bool>,
}

fn invalid(what: impl std::fmt::Display) -> StoreError {
    StoreError::InvalidConfig(format!("Redis URL: {what}"))
}

/// Reads a store URL (see the module docs).
///
/// Errors: [`StoreError::InvalidConfig`] for a malformed URL, an unknown scheme or option, an
/// unreadable CA file, or TLS without the `redis-tls` feature.
pub(super) fn target(url: &str) -> Result<Target, StoreError> {
    parsed(url).map_err(|e| match e {
        // A `?`, `/` or `#` in the user info ends it early (RFC 3986 §3.2), and the part of the
        // password after it is then read as a query, a path or a fragment, which errors quote
        // ("unknown option \"x@host\""): they are not shown, the URL is, its password masked.
        StoreError::InvalidConfig(said) if user_info_may_be_cut(url) => {
            StoreError::InvalidConfig(format!(
                "Redis URL {:?} does not parse ({}); a `?`, `/` or `#` in a user name or \
                 password ends that part of the URL: write them as %3F, %2F and %23 (the parts \
                 of the URL the error named are not shown, as they may hold the password)",
                crate::store::redact::redacted(url),
                unquoted(said.strip_prefix("Redis URL: ").unwrap_or(&said)),
            ))
        }
        other => other,
    })
}

/// Whether the text between `://` and the last `@` holds a `?`, `/` or `#`: a user info cut
/// short, or an `@` after the authority (in a query). Either way errors may quote a part of a
/// password.
fn user_info_may_be_cut(url: &str) -> bool {
    let Some((_, rest)) = url.split_once("://") else { return false };
    rest.rfind('@').is_some_and(|at| rest[..at].contains(['?', '/', '#']))
}

/// `said` with every double-quoted part (as `{:?}` writes a string) written `"…"`.
fn unquoted(said: &str) -> String {
    let mut out = String::with_capacity(said.len());
    let mut chars = said.chars();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '"' {
            out.push_str("…\"");
            while let Some(c) = chars.next() {
                match c {
                    '\\' => drop(chars.next()),
                    '"' => break,
                    _ => {}
                }
            }
        }
    }
    out
}

fn parsed(url: &str) -> Result<Target, StoreError> {
    let Some((scheme, rest)) = url.split_once("://") else {
        let shown = crate::store::redact::redacted(url);
        return Err(invalid(format_args!("{shown:?} has no scheme")));
    };
    let scheme = scheme.to_ascii_lowercase();
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, query),
        None => (rest, ""),
    };
    let unix = matches!(scheme.as_str(), "redis+unix" | "unix");
    let opts = Options::parse(query, unix)?;
    let (cluster, tls) = match scheme.as_str() {
        "redis" | "redis+unix" | "unix" => (false, false),
        "rediss" => (false, true),
        "redis+cluster" => (true, false),
        "rediss+cluster" => (true, true),
        other => {
            return Err(invalid(format_args!(
                "unknown scheme {other:?}; expected redis, rediss, redis+unix, unix, \
                 redis+cluster or rediss+cluster"
            )));
        }
    };
    if opts.ca.is_some() && !tls {
        return Err(invalid("the `ca` parameter needs TLS (rediss:// or rediss+cluster://)"));
    }
    if tls && !cfg!(feature = "redis-tls") {
        return Err(invalid(format!(
            "TLS (rediss://) is not compiled in: {}",
            crate::store::open::enable_feature("redis-tls")
        )));
    }
    let ca = match &opts.ca {
        Some(path) => Some(
            std::fs::read(path)
                .map_err(|e| StoreError::InvalidConfig(format!("Redis CA file {path:?}: {e}")))?,
        ),
        None => None,
    };
    #[cfg(feature = "redis-tls")]
    if tls {
        // redis-rs builds its rustls configuration on the process's default provider; name ring
        // (the provider this crate enables) when the application installed none, so that a
        // build with two providers does not fail at the first connection.
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    }
    let servers = if cluster {
        Servers::Cluster(cluster_nodes(rest, tls, &opts.passed, ca)?)
    } else {
        let base = format!("{scheme}://{rest}{}", query_of(&opts.passed));
        Servers::One(one_client(&base, ca)?)
    };
    Ok(Target {
        servers,
        wait: opts.wait,
        prefix: opts.prefix,
        allow_eviction: opts.allow_eviction,
    })
}

fn query_of(passed: &[String]) -> String {
    if passed.is_empty() { String::new() } else { format!("?{}", passed.join("&")) }
}

#[cfg_attr(not(feature = "redis-tls"), allow(unused_variables))]
fn one_client(url: &str, ca: Option<Vec<u8>>) -> Result<Client, StoreError> {
    #[cfg(feature = "redis-tls")]
    if let Some(pem) = ca {
        let certs = redis::TlsCertificates { client_tls: None, root_cert: Some(pem) };
        return Client::build_with_tls(url, certs).map_err(invalid);
    }
    Client::open(url).map_err(invalid)
}

/// The nodes of `rest` (`[user:password@]h1[:p1],h2[:p2],…[/[0]]`).
fn cluster_nodes(
    rest: &str,
    tls: bool,
    passed: &[String],
    ca: Option<Vec<u8>>,
) -> Result<ClusterNodes, StoreError> {
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if !matches!(path, "" | "/" | "/0") {
        return Err(invalid(format_args!(
            "a Redis Cluster has one database (0); the path {path:?} names another"
        )));
    }
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((user, hosts)) => (format!("{user}@"), hosts),
        None => (String::new(), authority),
    };
    let scheme = if tls { "rediss" } else { "redis" };
    let query = query_of(passed);
    let mut nodes = Vec::new();
    for host in hosts.split(',') {
        if host.is_empty() {
            return Err(invalid(format_args!("an empty host in the cluster node list {hosts:?}")));
        }
        let node = format!("{scheme}://{user}{host}/{query}");
        // Checked one by one, so the error names the node.
        Client::open(node.as_str())
            .map_err(|e| invalid(format_args!("cluster node {host:?}: {e}")))?;
        nodes.push(node);
    }
    let cluster = ClusterNodes { nodes, ca };
    // The cluster client checks what one node's URL cannot show (mixed TLS, credentials).
    cluster.builder().build().map_err(invalid)?;
    Ok(cluster)
}

/// The query options of a URL.
#[derive(Debug, Default, PartialEq)]
struct Options {
    /// The CA file (percent-decoded path).
    ca: Option<String>,
    wait: Option<Replicas>,
    /// The key prefix (percent-decoded).
    prefix: Option<String>,
    allow_eviction: Option<bool>,
    /// Options passed on to the redis crate, as written (`protocol=resp3`).
    passed: Vec<String>,
}

impl Options {
    fn parse(query: &str, unix: bool) -> Result<Options, StoreError> {
        let mut opts = Options::default();
        let (mut replicas, mut timeout) = (None, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let number = |what: &str| {
                value.parse::<u32>().map_err(|_| {
                    invalid(format_args!("{what} must be a whole number, got {value:?}"))
                })
            };
            match name {
                "ca" => opts.ca = Some(percent_decode(value)),
                "prefix" => opts.prefix = Some(percent_decode(value)),
                "allow_eviction" => {
                    opts.allow_eviction = Some(match value {
                        "true" | "1" => true,
                        "false" | "0" => false,
                        _ => {
                            return Err(invalid(format_args!(
                                "allow_eviction must be true or false, got {value:?}"
                            )));
                        }
                    })
                }
                "wait_replicas" => replicas = Some(number("wait_replicas")?),
                "wait_timeout_ms" => match number("wait_timeout_ms")? {
                    // Redis reads a `WAIT` timeout of 0 as "wait for ever".
                    0 => return Err(invalid(ZERO_WAIT)),
                    ms => timeout = Some(Duration::from_millis(ms.into())),
                },
                "protocol" => opts.passed.push(pair.to_owned()),
                "db" | "user" | "pass" if unix => opts.passed.push(pair.to_owned()),
                other => {
                    return Err(invalid(format_args!(
                        "unknown option {other:?}; known: ca, wait_replicas, wait_timeout_ms, \
                         protocol, prefix, allow_eviction{}",
                        if unix { ", db, user, pass" } else { "" }
                    )));
                }
            }
        }
        opts.wait = match (replicas, timeout) {
            (None, None) | (Some(0), None) => None,
            (None, Some(_)) => return Err(invalid("wait_timeout_ms needs wait_replicas")),
            (Some(0), Some(_)) => return Err(invalid("wait_timeout_ms needs wait_replicas >= 1")),
            (Some(count), timeout) => {
                Some(Replicas { count, timeout: timeout.unwrap_or(DEFAULT_WAIT_TIMEOUT) })
            }
        };
        Ok(opts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Outside a runtime the redis crate would panic when it starts its connection's task.
    #[test]
    fn opening_outside_a_runtime_is_an_error_not_a_panic() {
        match crate::store::RedisStore::builder("redis://h:1/").open_lazy() {
            Err(StoreError::InvalidConfig(m)) => assert!(m.contains("Tokio runtime"), "{m}"),
            other => panic!("expected InvalidConfig, got {:?}", other.map(drop)),
        }
    }

    #[tokio::test]
    async fn the_prefix_option_names_the_key_prefix() {
        let prefix = |url: &str| target(url).map(|t| t.prefix);
        assert_eq!(prefix("redis://h:1/").unwrap(), None);
        assert_eq!(prefix("redis://h:1/2?prefix=app%3Aone").unwrap().as_deref(), Some("app:one"));
        assert_eq!(prefix("redis+cluster://a:1,b:2/?prefix=p").unwrap().as_deref(), Some("p"));
        let store = |url: &str| crate::store::RedisStore::builder(url).open_lazy();
        let key = crate::key::derive_key(&crate::Scope::run("r"), "t", b"{}");
        assert!(store("redis://h:1/?prefix=app").unwrap().record_key(&key).starts_with("app:{"));
        // The builder's own prefix wins over the URL's.
        let chosen = crate::store::RedisStore::builder("redis://h:1/?prefix=app").prefix("mine");
        assert!(chosen.open_lazy().unwrap().record_key(&key).starts_with("mine:{"));
        for bad in ["redis://h:1/?prefix=", "redis://h:1/?prefix=a%7Bb"] {
            assert!(matches!(store(bad), Err(StoreError::InvalidConfig(_))), "{bad}");
        }
    }

    fn refused(url: &str) -> String {
        match target(url) {
            Err(StoreError::InvalidConfig(m)) => m,
            Err(other) => panic!("{url}: expected InvalidConfig, got {other}"),
            Ok(_) => panic!("{url}: accepted"),
        }
    }

    #[test]
    fn options_are_read_and_passed_on() {
        let o = Options::parse("ca=%2Ftmp%2Fca.pem&protocol=resp3&wait_replicas=2", false).unwrap();
        assert_eq!(o.ca.as_deref(), Some("/tmp/ca.pem"));
        assert_eq!(o.passed, vec!["protocol=resp3".to_owned()]);
        assert_eq!(o.wait, Some(Replicas { count: 2, timeout: DEFAULT_WAIT_TIMEOUT }));
        let o = Options::parse("wait_replicas=1&wait_timeout_ms=50", false).unwrap();
        assert_eq!(o.wait, Some(Replicas { count: 1, timeout: Duration::from_millis(50) }));
        assert_eq!(Options::parse("", false).unwrap(), Options::default());
    }

    #[test]
    fn unknown_and_malformed_options_are_invalid_config() {
        let m = refused("redis://h:1/?colour=blue");
        assert!(m.contains("\"colour\"") && m.contains("wait_replicas"), "{m}");
        assert!(refused("redis://h:1/?db=2").contains("\"db\""));
        assert!(refused("redis://h:1/?wait_replicas=two").contains("whole number"));
        assert!(refused("redis://h:1/?wait_timeout_ms=5").contains("needs wait_replicas"));
        // Redis would wait for ever.
        let m = refused("redis://h:1/?wait_replicas=1&wait_timeout_ms=0");
        assert!(m.contains("at least 1 ms") && m.contains("wait_timeout_ms=500"), "{m}");
        assert!(refused("redis://h:1/?ca=/tmp/ca.pem").contains("needs TLS"));
        assert!(refused("redis+sentinel://h:1/").contains("unknown scheme"));
        assert!(refused("h:1").contains("no scheme"));
    }

    #[test]
    fn cluster_form_lists_nodes() {
        assert!(matches!(
            target("redis+cluster://a:7000,b:7001,c/?wait_replicas=1"),
            Ok(Target { servers: Servers::Cluster(_), wait: Some(Replicas { count: 1, .. }), .. })
        ));
        assert!(matches!(target("redis+cluster://u:p@a:7000"), Ok(Target { wait: None, .. })));
        assert!(refused("redis+cluster://a:7000,,b:7001/").contains("empty host"));
        assert!(refused("redis+cluster://a:7000/3").contains("one database"));
        assert!(refused("redis+cluster://a:notaport/").contains("cluster node \"a:notaport\""));
    }
}
