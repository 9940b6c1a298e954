//! Whether the Redis server may evict the store's keys, checked when the store opens.
//!
//! A Redis with a memory limit (`maxmemory` above 0) and any `maxmemory-policy` but
//! `noeviction` deletes keys when it is full: `allkeys-*` any key, `volatile-*` any key with a
//! time to live, which every record and fence counter of this store has. An evicted record lets
//! the next caller claim its key again (a completed call runs twice; a `never` tool's record in
//! flight vanishes with its owner alive), and an evicted fence counter starts the key's fences
//! again, so two owners can hold equal fences. Under `noeviction` a full Redis refuses writes
//! instead: claims fail closed with [`StoreError::Unavailable`] and nothing runs.
//!
//! So [`RedisStoreBuilder::open`](super::RedisStoreBuilder::open) refuses such a server with
//! [`StoreError::InvalidConfig`], unless the application accepts it
//! ([`RedisStoreBuilder::allow_eviction`](super::RedisStoreBuilder::allow_eviction), or
//! `allow_eviction=true` in the URL), which logs a warning instead. A server that does not
//! answer `INFO memory` (an ACL user without `+info`, which is in `@dangerous`; a managed service
//! that renamed it) is refused the same way, since it may be one that evicts: grant the user
//! `+info`, or accept with `allow_eviction`. Policies can change later (`CONFIG SET`); the check
//! is at open only. Managed services often default to `volatile-lru` (Amazon ElastiCache, Azure
//! Cache for Redis): set the parameter group's or cache's policy to `noeviction`.

use redis::Value;

use super::route::Conn;
use crate::store::StoreError;

/// What one server's `INFO memory` says about eviction.
#[derive(Debug, PartialEq, Eq)]
struct Memory {
    /// `maxmemory`, bytes; 0 is no limit.
    max: u64,
    /// `maxmemory_policy`.
    policy: String,
}

impl Memory {
    fn may_evict(&self) -> bool {
        self.max > 0 && self.policy != "noeviction"
    }
}

/// The value of `name` in an `INFO` text (`name:value` lines).
pub(super) fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(':')).map(str::trim)
}

/// Whether sending `INFO` failed as a refusal rather than unanswered (see [`info_refused`]):
/// the server will not say, which is no outage.
pub(super) fn info_send_refused(e: &redis::RedisError) -> bool {
    super::reply::refused_access(e) || e.to_string().contains("unknown command")
}

/// Reads `maxmemory` and `maxmemory_policy` from an `INFO` text (`name:value` lines).
fn parse(info: &str) -> Option<Memory> {
    let field = |name: &str| info_field(info, name);
    Some(Memory {
        max: field("maxmemory")?.parse().ok()?,
        policy: field("maxmemory_policy")?.into(),
    })
}

/// What one server answered to `INFO memory`.
#[derive(Debug)]
pub(super) enum Answer {
    /// Its text (`name:value` lines).
    Info(String),
    /// Refused (an ACL without `+info`, a renamed or disabled command): it will not say.
    Refused(String),
    /// An error other than a refusal (`LOADING`, `BUSY`): an outage.
    Failed(String),
}

/// Whether an error answering `INFO` is the server refusing it rather than an outage: the
/// store's notion of a refusal, or `INFO` renamed away (`unknown command`).
fn info_refused(e: &redis::ServerError) -> bool {
    super::reply::server_refused(e) || e.details().is_some_and(|d| d.contains("unknown command"))
}

/// Each server's answer in a reply: one on one server; on a cluster a map from each node's
/// address to its answer (the cluster client sends `INFO` to every master it holds a connection
/// to; replicas are not asked, so a replica that evicts is seen once it is promoted and a store
/// opens again).
pub(super) fn answers(reply: &Value, node: &str, out: &mut Vec<(String, Answer)>) {
    let answer = match reply {
        Value::BulkString(bytes) => Answer::Info(String::from_utf8_lossy(bytes).into()),
        Value::VerbatimString { text, .. } | Value::SimpleString(text) => {
            Answer::Info(text.clone())
        }
        Value::ServerError(e) if info_refused(e) => Answer::Refused(super::reply::error_text(e)),
        Value::ServerError(e) => Answer::Failed(super::reply::error_text(e)),
        Value::Map(pairs) => {
            for (name, answer) in pairs {
                let name = match name {
                    Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    Value::SimpleString(s) => s.clone(),
                    _ => node.to_owned(),
                };
                answers(answer, &name, out);
            }
            return;
        }
        other => Answer::Info(format!("{other:?}")),
    };
    out.push((node.into(), answer));
}

/// Checks the servers of `conn` (`at`: their address, for messages).
pub(super) async fn check(conn: &Conn, allow: bool, at: &str) -> Result<(), StoreError> {
    let mut servers = Vec::new();
    match conn.command(redis::cmd("INFO").arg("memory")).await {
        Ok(reply) => answers(&reply, at, &mut servers),
        Err(e) if info_send_refused(&e) => {
            servers.push((at.to_owned(), Answer::Refused(e.to_string())));
        }
        // Not answered (a timeout, a dropped connection, a server loading its data): an outage,
        // which opening again may get past.
        Err(e) => return Err(super::reply::unavailable(e)),
    }
    if servers.is_empty() {
        servers.push((at.to_owned(), Answer::Refused("no answer to read".into())));
    }
    let mut risks: Vec<String> = Vec::new();
    for (node, answer) in &servers {
        let memory = match answer {
            Answer::Failed(why) => {
                return Err(StoreError::unavailable(format!(
                    "Redis at {node} did not answer INFO memory: {why}"
                )));
            }
            Answer::Refused(why) => Err(why.clone()),
            Answer::Info(text) => parse(text).ok_or_else(|| "no maxmemory_policy in it".into()),
        };
        match memory {
            // Unknown is as risky as evicting: fail closed.
            Err(why) => risks.push(format!(
                "Redis at {node} did not say whether it may evict idem's records (INFO memory: \
                 {why}); grant the store's user +info"
            )),
            Ok(memory) if memory.may_evict() => risks.push(format!(
                "Redis at {node} may evict idem's records: maxmemory is {} bytes and \
                 maxmemory-policy is {}",
                memory.max, memory.policy
            )),
            Ok(_) => {}
        }
    }
    for risk in risks {
        let why = format!(
            "{risk}. An evicted record runs its call again, and an evicted fence counter can \
             give two owners equal fences"
        );
        if allow {
            tracing::warn!("{why}; accepted (allow_eviction)");
            continue;
        }
        return Err(StoreError::InvalidConfig(format!(
            "{why}. Set maxmemory-policy noeviction (a full Redis then refuses new claims, \
             which fail closed), or give idem a Redis of its own; to accept the risk, \
             RedisStoreBuilder::allow_eviction(true) or allow_eviction=true in the URL"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_limit_and_the_policy() {
        let info = "# Memory\r\nused_memory:1024\r\nmaxmemory:0\r\nmaxmemory_human:0B\r\n\
                    maxmemory_policy:noeviction\r\n";
        let memory = parse(info).unwrap();
        assert_eq!(memory, Memory { max: 0, policy: "noeviction".into() });
        assert!(!memory.may_evict());
        let full = parse("maxmemory:104857600\nmaxmemory_policy:volatile-lru\n").unwrap();
        assert!(full.may_evict(), "{full:?}");
        // No limit: nothing is ever evicted, whatever the policy.
        assert!(!parse("maxmemory:0\nmaxmemory_policy:allkeys-lru\n").unwrap().may_evict());
        assert!(!parse("maxmemory:1\nmaxmemory_policy:noeviction\n").unwrap().may_evict());
        assert_eq!(parse("used_memory:1\n"), None);
    }

    #[test]
    fn a_node_that_refuses_is_unknown_and_one_loading_is_an_outage() {
        // As a node answers them (RESP error replies).
        let mut out = Vec::new();
        for (node, reply) in [
            ("a:1", &b"-NOPERM no permissions to run INFO\r\n"[..]),
            ("b:2", b"-ERR unknown command 'INFO'\r\n"),
            ("c:3", b"-LOADING Redis is loading the dataset\r\n"),
        ] {
            answers(&redis::parse_redis_value(reply).unwrap(), node, &mut out);
        }
        let kinds: Vec<_> = out
            .iter()
            .map(|(node, a)| match a {
                Answer::Refused(_) => (node.as_str(), "refused"),
                Answer::Failed(_) => (node.as_str(), "failed"),
                Answer::Info(_) => (node.as_str(), "info"),
            })
            .collect();
        assert_eq!(kinds, [("a:1", "refused"), ("b:2", "refused"), ("c:3", "failed")], "{out:?}");
    }

    #[test]
    fn reads_each_node_of_a_cluster() {
        let reply = Value::Map(vec![
            (
                Value::BulkString(b"10.0.0.1:7000".to_vec()),
                Value::BulkString(b"maxmemory:0\r\nmaxmemory_policy:noeviction\r\n".to_vec()),
            ),
            (
                Value::BulkString(b"10.0.0.2:7000".to_vec()),
                Value::VerbatimString {
                    format: redis::VerbatimFormat::Text,
                    text: "maxmemory:5\r\nmaxmemory_policy:allkeys-lru\r\n".into(),
                },
            ),
        ]);
        let mut out = Vec::new();
        answers(&reply, "cluster", &mut out);
        let nodes: Vec<_> = out
            .iter()
            .map(|(n, a)| match a {
                Answer::Info(text) => (n.as_str(), parse(text).unwrap().may_evict()),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(nodes, [("10.0.0.1:7000", false), ("10.0.0.2:7000", true)]);
    }
}
