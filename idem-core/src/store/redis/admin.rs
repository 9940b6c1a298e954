//! The Redis store's operator side (`docs/design.md` §5.1): listing by incremental `SCAN` (never
//! `KEYS`), inspecting, fenced resolution (one script) and counting.
//!
//! A listing scans the keys `P:{*}:rec` of the store's prefix in batches (`SCAN … MATCH … COUNT`),
//! reads each batch's records with the server's time in one pipeline, and applies the query's
//! filters to them; so a page may hold fewer records than asked (even none) while more follow.
//! Its cursor is `<node>;<scan cursor>;<keys>`: the node scanned (empty on one server), that
//! node's `SCAN` cursor (`end` once through), and the keys of the last batch that did not fit in
//! the page, read again from that node first. On a Redis
//! Cluster every master is scanned in turn. `SCAN` may return a key twice (the table was resized
//! meanwhile), and a record made during the listing may or may not be listed.
//!
//! A batch is read on the node scanned, unless one of its keys is no longer served there (its
//! slot is being migrated or has been, or the key was scanned on the importing node of a slot
//! being migrated): then each key is read on its slot's master, following `MOVED` and `ASK` as
//! the steps do (`route.rs`). So a record of a slot that does not move during the listing is
//! listed once, even when the slot is half-migrated (each key is on one of the two nodes); one
//! whose slot moves to another master during the listing may be listed twice or not at all (see
//! `Store::list` of [`RedisStore`]). Records this
//! version cannot read are reported in the page's `unreadable`, whatever the query's filters
//! (what cannot be read cannot be filtered), and counted as unreadable by `stats`; a record of
//! schema version 1 (a hash) is read through the inspect script, which migrates it as any step
//! of its key would, and listed as what it is. A scanned name
//! whose part between the braces is not an idempotency key is not taken for a record: it may be
//! another store's whose prefix starts like this one's.

use std::time::Duration;

use futures_util::future::try_join_all;
use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

use super::reply::{Parsed, error_text, parse, text, unavailable};
use super::route::Conn;
use super::{FENCE_COUNTER_GRACE, RedisStore};
use crate::clock::ms;
use crate::key::Key;
use crate::store::{
    ListPage, ListQuery, Outcome, RecordInfo, RecordState, Resolution, Stats, StoreError,
    UnreadableRecord,
};

/// At most this many keys examined for one page, times the page size (at least 1000): a
/// selective filter on a large store answers a page with fewer records, and a cursor, rather
/// than scan for long.
const SCAN_PER_RECORD: u64 = 10;
/// How many keys [`RedisStore::prefix_in_use`] looks at, at most, for other stores' prefixes.
const OTHER_PREFIXES_SCANNED: u64 = 100_000;

/// Records read at once, each on its own node, when a batch's keys are no longer all on the
/// node that was scanned.
const FETCH_EACH_AT_ONCE: usize = 32;

/// Where a listing goes on.
#[derive(Debug, Default, PartialEq, Eq)]
struct Cursor {
    /// The node being scanned (`host:port`); empty on one server.
    node: String,
    /// That node's `SCAN` cursor (0 to start); `None` once the node is scanned through.
    scan: Option<u64>,
    /// Keys already scanned and not yet returned.
    pending: Vec<Key>,
}

impl Cursor {
    fn parse(s: &str) -> Result<Cursor, StoreError> {
        let bad = || StoreError::InvalidCursor(s.to_owned());
        let mut parts = s.splitn(3, ';');
        let (Some(node), Some(scan), Some(pending)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let scan = match scan {
            "end" => None,
            n => Some(n.parse().map_err(|_| bad())?),
        };
        let pending = pending
            .split(',')
            .filter(|k| !k.is_empty())
            .map(|k| Key::parse(k).ok_or_else(bad))
            .collect::<Result<_, _>>()?;
        Ok(Cursor { node: node.to_owned(), scan, pending })
    }

    fn encode(&self) -> String {
        let pending: Vec<String> = self.pending.iter().map(Key::to_string).collect();
        let scan = self.scan.map_or_else(|| "end".to_owned(), |n| n.to_string());
        format!("{};{scan};{}", self.node, pending.join(","))
    }
}

/// `s` with Redis glob's special characters escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// One record's info from its stored form at `now` (ms, the server's clock).
fn info_of(key: Key, r: &Parsed<'_>, now: u64) -> Result<RecordInfo, String> {
    let state = if r.done {
        RecordState::Done(r.outcome()?)
    } else {
        let end = r.lease_end.unwrap_or(0);
        RecordState::InFlight { lease_remaining: Duration::from_millis(end.saturating_sub(now)) }
    };
    Ok(RecordInfo {
        key,
        fingerprint: r.fingerprint,
        fence: crate::store::Fence(r.fence),
        origin: r.origin(),
        state,
        age: r.since.map(|s| Duration::from_millis(now.saturating_sub(s))),
    })
}

/// `send`'s answer, sent again when the connection failed under it, as any step whose reply may
/// have been lost: the operator's commands are reads (or a forget, which deletes what is there).
/// A listing or a count that runs every few minutes (the record gauges) finds its connection
/// closed by the server's idle `timeout` each time, and the connection manager and the cluster
/// client reconnect only once a command has failed on it.
async fn resent<T, Fut>(send: impl FnMut() -> Fut) -> Result<T, RedisError>
where
    Fut: std::future::Future<Output = Result<T, RedisError>>,
{
    crate::store::resend::resend_if(super::reply::lost, send).await
}

/// `CLUSTER SLOTS` from any node of a cluster connection. A server that is not part of a
/// cluster (`redis+cluster://` for one server) refuses it: a configuration error saying so.
pub(super) async fn cluster_slots(conn: &ClusterConnection) -> Result<Value, StoreError> {
    let slots = resent(|| async {
        conn.clone()
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").to_owned(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await
    })
    .await
    .map_err(unavailable)?;
    if let Value::ServerError(e) = &slots {
        if super::reply::server_refused(e) {
            return Err(super::reply::refused(error_text(e)));
        }
        return Err(StoreError::InvalidConfig(format!(
            "the server does not act as a Redis Cluster ({}); for one server write \
             redis://host:port",
            e.details().unwrap_or(e.code())
        )));
    }
    Ok(slots)
}

/// The server's time in ms from a `TIME` reply.
fn time_ms(v: &Value) -> Result<u64, StoreError> {
    if let Value::ServerError(e) = v {
        // Refused (an ACL without TIME), not an answer this version cannot read.
        return Err(super::reply::unavailable(e.clone().into()));
    }
    let bad = || StoreError::Incompatible(format!("unexpected TIME reply {v:?}"));
    let Value::Array(parts) = v else { return Err(bad()) };
    let num = |i: usize| parts.get(i).map(text).and_then(|t| t.parse::<u64>().ok());
    let (Some(s), Some(us)) = (num(0), num(1)) else { return Err(bad()) };
    Ok(s * 1000 + us / 1000)
}

/// What one listing step found.
enum Found {
    Record(Box<RecordInfo>),
    /// Gone since it was scanned (expired, removed).
    Gone,
    /// Cannot be read, and why.
    Unreadable(String),
    /// Not a string (`WRONGTYPE`): a version 1 hash, which the inspect script migrates and reads,
    /// or another type, which it refuses; the reason if it refuses.
    NotAString(String),
    /// Refused for the store's user (an ACL): a configuration error, not the record's.
    Refused(String),
}

impl RedisStore {
    /// The idempotency key of a Redis key of this store's records.
    fn key_of(&self, name: &[u8]) -> Option<Key> {
        let name = std::str::from_utf8(name).ok()?;
        let rest = name.strip_prefix(self.inner.prefix.as_str())?.strip_prefix(":{")?;
        Key::parse(rest.strip_suffix("}:rec")?)
    }

    /// Refuses, for [`open_existing`](crate::store::open_existing), a prefix with no key on the
    /// server (no record, no fence counter): a Redis server holds no schema, and a URL without
    /// the application's `prefix` would list nothing while its records are under another. Names
    /// the prefixes of idem records found among the first keys scanned (at most five).
    pub(crate) async fn check_in_use(&self) -> Result<(), StoreError> {
        let mine = format!("{}:{{*", glob_escape(&self.inner.prefix));
        if !self.scan_for(&mine, u64::MAX, |_| Some(String::new())).await?.is_empty() {
            return Ok(());
        }
        let mut others = self
            .scan_for("*:{*}:rec", OTHER_PREFIXES_SCANNED, |name| {
                name.split_once(":{").map(|(prefix, _)| format!("{prefix:?}"))
            })
            .await?;
        others.sort();
        others.dedup();
        others.truncate(5);
        let found = if others.is_empty() {
            String::new()
        } else {
            format!(" (idem records are under {})", others.join(", "))
        };
        Err(StoreError::InvalidConfig(format!(
            "no idem store under the key prefix {:?} on this Redis: no key of it there{found}. \
             Name the prefix the application uses (`?prefix=...` in the URL), and its database \
             number",
            self.inner.prefix
        )))
    }

    /// What `keep` makes of the names matching `pattern` on every node, scanning until one is
    /// kept or `budget` names were looked at.
    async fn scan_for(
        &self,
        pattern: &str,
        budget: u64,
        keep: impl Fn(&str) -> Option<String>,
    ) -> Result<Vec<String>, StoreError> {
        let mut kept = Vec::new();
        let mut scanned = 0u64;
        for node in self.scan_nodes().await? {
            let mut pos = 0u64;
            loop {
                let (next, names) = self.scan_step(&node, pos, pattern, 1000).await?;
                scanned = scanned.saturating_add(1000);
                kept.extend(names.iter().filter_map(|n| keep(&String::from_utf8_lossy(n))));
                if next == 0 || scanned >= budget || (budget == u64::MAX && !kept.is_empty()) {
                    break;
                }
                pos = next;
            }
            if scanned >= budget || (budget == u64::MAX && !kept.is_empty()) {
                break;
            }
        }
        Ok(kept)
    }

    /// One `SCAN` step on `node` from cursor `pos`: the next cursor (0 at the end) and the names.
    async fn scan_step(
        &self,
        node: &str,
        pos: u64,
        pattern: &str,
        count: u64,
    ) -> Result<(u64, Vec<Vec<u8>>), StoreError> {
        let mut scan = redis::pipe();
        scan.cmd("SCAN").arg(pos).arg("MATCH").arg(pattern).arg("COUNT").arg(count);
        let reply = self.on_node(node, &scan, 1).await?.map_err(unavailable)?;
        let reply = reply.into_iter().next().unwrap_or(Value::Nil);
        if let Value::ServerError(e) = &reply
            && super::reply::server_refused(e)
        {
            return Err(super::reply::refused(error_text(e)));
        }
        redis::from_redis_value(reply)
            .map_err(|e| StoreError::Incompatible(format!("SCAN reply: {e}")))
    }

    /// The nodes a listing scans, in order: `host:port` of each master of a cluster (sorted, as
    /// `CLUSTER SLOTS` names them), or one empty name for one server.
    async fn scan_nodes(&self) -> Result<Vec<String>, StoreError> {
        let Conn::Cluster(conn) = &self.inner.conn else { return Ok(vec![String::new()]) };
        let slots = cluster_slots(&conn.connection().1).await?;
        let bad = || StoreError::Incompatible(format!("unexpected CLUSTER SLOTS reply {slots:?}"));
        let Value::Array(ranges) = &slots else { return Err(bad()) };
        let mut masters = Vec::new();
        for range in ranges {
            let Value::Array(parts) = range else { return Err(bad()) };
            let Some(Value::Array(master)) = parts.get(2) else { return Err(bad()) };
            let (Some(host), Some(Value::Int(port))) = (master.first(), master.get(1)) else {
                return Err(bad());
            };
            masters.push(format!("{}:{port}", text(host)));
        }
        masters.sort();
        masters.dedup();
        Ok(masters)
    }

    /// Sends `pipe` (`count` commands) to `node` (see [`RedisStore::scan_nodes`]); server errors
    /// come back as values, except a redirection (`MOVED`, `ASK`), which fails the whole pipeline.
    async fn on_node(
        &self,
        node: &str,
        pipe: &redis::Pipeline,
        count: usize,
    ) -> Result<Result<Vec<Value>, RedisError>, StoreError> {
        Ok(match &self.inner.conn {
            // Through `saw`: a connection that went silent is replaced, as for every step.
            Conn::One(conn) => {
                resent(|| async {
                    let (generation, mut manager) = conn.manager();
                    conn.saw(generation, manager.req_packed_commands(pipe, 0, count).await)
                })
                .await
            }
            Conn::Cluster(conn) => {
                let bad = || StoreError::Incompatible(format!("not a node address: {node:?}"));
                let (host, port) = node.rsplit_once(':').ok_or_else(bad)?;
                let port = port.parse().map_err(|_| bad())?;
                resent(|| async {
                    let to = SingleNodeRoutingInfo::ByAddress { host: host.to_owned(), port };
                    let (generation, mut cluster) = conn.connection();
                    conn.saw(generation, cluster.route_pipeline(pipe.clone(), 0, count, to).await)
                })
                .await
            }
        })
    }

    /// The records of `keys` as found on `node`, read with its clock in one pipeline; or, when
    /// one of them has left `node` since it was scanned there, each where it is now.
    async fn fetch(&self, node: &str, keys: &[Key]) -> Result<Vec<Found>, StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("TIME");
        for key in keys {
            pipe.cmd("GET").arg(self.record_key(key));
        }
        let replies = match self.on_node(node, &pipe, keys.len() + 1).await? {
            Ok(replies) => replies,
            // A key's slot is being migrated (`ASK`), or has been (`MOVED`); or the key was scanned
            // on the importing node, which serves it only after `ASKING`.
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
                ) =>
            {
                return self.fetch_each(keys).await;
            }
            Err(e) => return Err(unavailable(e)),
        };
        let now = time_ms(replies.first().unwrap_or(&Value::Nil))?;
        Ok(keys
            .iter()
            .zip(replies.iter().skip(1))
            .map(|(key, reply)| self.found(key, reply, now))
            .collect())
    }

    /// The records of `keys`, each read with its node's clock on its slot's master, following
    /// redirections as the steps do (`route.rs`), [`FETCH_EACH_AT_ONCE`] at a time.
    async fn fetch_each(&self, keys: &[Key]) -> Result<Vec<Found>, StoreError> {
        let mut found = Vec::with_capacity(keys.len());
        for batch in keys.chunks(FETCH_EACH_AT_ONCE) {
            found.extend(try_join_all(batch.iter().map(|key| self.fetch_one(key))).await?);
        }
        Ok(found)
    }

    /// The record of `key` read on its slot's master, following redirections.
    async fn fetch_one(&self, key: &Key) -> Result<Found, StoreError> {
        let name = self.record_key(key);
        let mut pipe = redis::pipe();
        // The GET first: after `ASK` the importing node serves only the next command.
        pipe.cmd("GET").arg(&name).cmd("TIME");
        let replies =
            self.inner.conn.pipeline(&pipe, 2, name.as_bytes()).await.map_err(unavailable)?;
        let now = time_ms(replies.get(1).unwrap_or(&Value::Nil))?;
        Ok(self.found(key, replies.first().unwrap_or(&Value::Nil), now))
    }

    /// What a `GET` of `key`'s record answered, at `now` (ms, the server's clock).
    fn found(&self, key: &Key, reply: &Value, now: u64) -> Found {
        let name = self.record_key(key);
        match reply {
            Value::Nil => Found::Gone,
            Value::BulkString(raw) => match parse(&name, raw) {
                Ok(r) => match info_of(*key, &r, now) {
                    Ok(info) => Found::Record(Box::new(info)),
                    Err(why) => Found::Unreadable(format!("record {name} is malformed: {why}")),
                },
                Err(StoreError::Incompatible(why)) => Found::Unreadable(why),
                Err(e) => Found::Unreadable(e.to_string()),
            },
            // A version 1 hash until a step of its key migrates it, or another type.
            Value::ServerError(e) if e.code() == "WRONGTYPE" => {
                Found::NotAString(format!("{name} is not a record string ({})", error_text(e)))
            }
            // Refused for the user, not a record's fault: the whole listing fails (see `page`).
            Value::ServerError(e) if super::reply::server_refused(e) => {
                Found::Refused(error_text(e))
            }
            Value::ServerError(e) => {
                Found::Unreadable(format!("{name} is not a record string ({})", error_text(e)))
            }
            other => Found::Unreadable(format!("{name} answered GET with {other:?}")),
        }
    }

    /// One page of `q`.
    async fn page(&self, q: &ListQuery) -> Result<ListPage, StoreError> {
        let size = q.page_size();
        let nodes = self.scan_nodes().await?;
        let mut cur = match &q.cursor {
            Some(c) => Cursor::parse(c)?,
            None => Cursor {
                node: nodes.first().cloned().unwrap_or_default(),
                scan: Some(0),
                pending: Vec::new(),
            },
        };
        let Some(mut at) = nodes.iter().position(|n| *n == cur.node) else {
            // A cursor of an earlier topology (its node is no longer a master): the caller's to
            // drop, not a record to migrate.
            return Err(StoreError::InvalidCursor(q.cursor.clone().unwrap_or_default()));
        };
        let pattern = format!("{}:{{*}}:rec", glob_escape(&self.inner.prefix));
        let budget = (size as u64).saturating_mul(SCAN_PER_RECORD).max(1000);
        let mut page = ListPage::default();
        // Unreadable records take room in the page as readable ones do, so a page stays bounded.
        let full = |page: &ListPage| page.records.len() + page.unreadable.len() >= size;
        loop {
            let keys = if !cur.pending.is_empty() {
                std::mem::take(&mut cur.pending)
            } else if let Some(pos) = cur.scan {
                let room = size.saturating_sub(page.records.len() + page.unreadable.len());
                let room = room.clamp(10, 1000);
                let (next, names) = self.scan_step(&cur.node, pos, &pattern, room as u64).await?;
                page.scanned += names.len() as u64;
                cur.scan = (next != 0).then_some(next);
                names.iter().filter_map(|n| self.key_of(n)).collect()
            } else {
                // This node is scanned through; a cursor never stops here unless it was edited.
                if at + 1 >= nodes.len() {
                    return Ok(page);
                }
                at += 1;
                cur.node = nodes[at].clone();
                cur.scan = Some(0);
                continue;
            };
            if !keys.is_empty() {
                let found = self.fetch(&cur.node, &keys).await?;
                for (i, (key, found)) in keys.iter().zip(found).enumerate() {
                    if full(&page) {
                        cur.pending = keys[i..].to_vec();
                        break;
                    }
                    let found = match found {
                        // A record of schema version 1 is listed as what it is, as `inspect` reads
                        // it (its script migrates it, as any step of its key would), not
                        // reported unreadable with the advice to forget it.
                        Found::NotAString(reason) => match self.inspect_record(key).await {
                            Ok(Some(info)) => Found::Record(Box::new(info)),
                            Ok(None) => Found::Gone,
                            Err(StoreError::Incompatible(why)) => {
                                Found::Unreadable(format!("{reason}: {why}"))
                            }
                            Err(e) => return Err(e),
                        },
                        Found::Refused(why) => return Err(super::reply::refused(why)),
                        other => other,
                    };
                    match found {
                        Found::Record(info) if q.selects(&info) => page.records.push(*info),
                        Found::Unreadable(reason) => {
                            page.unreadable.push(UnreadableRecord { key: key.to_string(), reason })
                        }
                        Found::Record(_)
                        | Found::Gone
                        | Found::NotAString(_)
                        | Found::Refused(_) => {}
                    }
                }
            }
            let left = !cur.pending.is_empty() || cur.scan.is_some() || at + 1 < nodes.len();
            if !left {
                return Ok(page);
            }
            if full(&page) || page.scanned >= budget {
                page.next = Some(cur.encode());
                return Ok(page);
            }
        }
    }

    pub(super) async fn list_records(&self, q: &ListQuery) -> Result<ListPage, StoreError> {
        self.page(q).await
    }

    pub(super) async fn count_records(&self) -> Result<Stats, StoreError> {
        let mut stats = Stats::default();
        let mut q = ListQuery { limit: 1000, ..ListQuery::default() };
        loop {
            let page = self.page(&q).await?;
            stats.unreadable += page.unreadable.len() as u64;
            for info in &page.records {
                stats.count(&info.state);
            }
            match page.next {
                Some(next) => q.cursor = Some(next),
                None => return Ok(stats),
            }
        }
    }

    pub(super) async fn inspect_record(&self, key: &Key) -> Result<Option<RecordInfo>, StoreError> {
        let mut inv = self.inner.scripts.inspect.prepare_invoke();
        inv.key(self.record_key(key));
        let items = match self.run_resent(inv).await? {
            super::Answer::Table(items) => items,
            other => {
                return Err(StoreError::Incompatible(format!(
                    "unexpected inspect answer {other:?}"
                )));
            }
        };
        let now = super::int(items.get(1))?;
        let now = u64::try_from(now).unwrap_or(0);
        let Some(Value::BulkString(raw)) = items.get(2) else { return Ok(None) };
        let name = self.record_key(key);
        let r = parse(&name, raw)?;
        info_of(*key, &r, now)
            .map(Some)
            .map_err(|why| StoreError::Incompatible(format!("record {name} is malformed: {why}")))
    }

    pub(super) async fn resolve_record(
        &self,
        key: &Key,
        fence: crate::store::Fence,
        resolution: &Resolution,
    ) -> Result<(), StoreError> {
        let (mode, kind, payload, ttl) = match resolution {
            Resolution::Happened { outcome, ttl } => {
                let (kind, payload) = match outcome {
                    Outcome::Success(json) => ("s", json.as_str()),
                    Outcome::Failure(json) => ("f", json.as_str()),
                    Outcome::Unknown => ("u", ""),
                    Outcome::NotStorable(reason) => ("n", reason.as_str()),
                };
                ("h", kind, payload, ms(*ttl))
            }
            Resolution::NotHappened => ("n", "", "", 0),
        };
        let mut inv = self.inner.scripts.resolve.prepare_invoke();
        inv.key(self.record_key(key))
            .key(self.fence_key(key))
            .arg(fence.0)
            .arg(mode)
            .arg(kind)
            .arg(payload)
            .arg(ttl)
            .arg(ms(FENCE_COUNTER_GRACE));
        self.run(inv).await?.int().map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trip() {
        let key = Key::parse(&"ab".repeat(32)).expect("key");
        for cur in [
            Cursor { node: String::new(), scan: Some(0), pending: Vec::new() },
            Cursor { node: "10.0.0.1:7000".into(), scan: None, pending: vec![key, key] },
            Cursor { node: "[::1]:7001".into(), scan: Some(1234), pending: vec![key] },
        ] {
            assert_eq!(Cursor::parse(&cur.encode()).expect("parses"), cur);
        }
        for bad in ["", "x", ";1", ";x;", ";1;nokey", ";-1;"] {
            assert!(
                matches!(Cursor::parse(bad), Err(StoreError::InvalidCursor(c)) if c == bad),
                "{bad:?} is refused"
            );
        }
    }

    #[test]
    fn glob_escapes_specials() {
        assert_eq!(glob_escape(r"a*b?[c]\d^"), r"a\*b\?\[c\]\\d\^");
        assert_eq!(glob_escape("idem"), "idem");
    }
}
