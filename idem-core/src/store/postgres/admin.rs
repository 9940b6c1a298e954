//! The PostgreSQL store's operator side (`docs/design.md` §5.1): listing with keyset pagination
//! on the key over the indexes of schema revision 3, inspecting, fenced resolution, counting.
//! Leases, ages and retention are read on the server's clock, as the claim reads them.
//! Statements are sent unnamed with their parameter types (one round trip each, no prepared
//! statement), so they also run through PgBouncer in transaction mode.

use std::time::Duration;

use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use super::PostgresStore;
use super::error::pg;
use super::text::{run_text, text};
use crate::key::{Fingerprint, Key};
use crate::store::admin::{Forgot, prefix_end};
use crate::store::codec::{self, KeyCursor, READABLE_PG, Selected, encode, fence_param, ms};
use crate::store::{
    Fence, ListPage, ListQuery, RecordInfo, RecordState, Resolution, Stats, StoreError,
    StoredOrigin, UnreadableRecord,
};

/// Lease and age as signed milliseconds, clamped at 0 when read: SQL's `greatest` passes over a
/// NULL, so `greatest(.., 0)` made the age of a record written before `since` existed 0 instead
/// of unknown.
const COLUMNS: &str = "key, fingerprint, fence, state, \
    (extract(epoch FROM lease_until - now()) * 1000)::bigint, kind, payload, tool, \
    tenant, run_id, (extract(epoch FROM now() - since) * 1000)::bigint";

/// Not past retention. A completed record without an end of retention (edited by hand, or
/// damaged) is kept, as the claims and the sweeps keep it: listed, counted, shown and removable,
/// not hidden from the operator while the application still meets it.
const LIVE: &str = "NOT (state = 1 AND expires_at IS NOT NULL AND expires_at <= now())";

/// Resolvable under the fence `$2`: outcome unknown, or a lease that ended. `state + 0`: found
/// by the primary key, not the listing index (see `conn.rs`).
const RESOLVABLE: &str = "key = $1 AND fence = $2 AND (
    (state + 0 = 0 AND lease_until <= now())
    OR (state + 0 = 1 AND kind = 3 AND (expires_at IS NULL OR expires_at > now())))";

/// The record of row `r`, or, when it cannot be read (edited by hand, or written by another
/// version), its key as stored and why: a listing reports it and goes on. An error only when the
/// row has no text key at all, which is not a row of this store's table.
fn read(r: &Row) -> Result<Result<RecordInfo, UnreadableRecord>, StoreError> {
    let key = stored_key(r)?;
    Ok(info(r).map_err(|e| UnreadableRecord {
        reason: match e {
            StoreError::Incompatible(why) => why,
            other => other.to_string(),
        },
        key,
    }))
}

/// The key of row `r` as stored, whether or not it is an idempotency key.
fn stored_key(r: &Row) -> Result<String, StoreError> {
    r.try_get(0).map_err(|e| {
        StoreError::Incompatible(format!("a PostgreSQL record has a key that is not text: {e}"))
    })
}

fn info(r: &Row) -> Result<RecordInfo, StoreError> {
    let bad = |what: String| StoreError::Incompatible(format!("a PostgreSQL record {what}"));
    let get = |e: tokio_postgres::Error| bad(format!("has a value of an unexpected type: {e}"));
    let key: String = r.try_get(0).map_err(get)?;
    let key = Key::parse(&key).ok_or_else(|| bad(format!("has a malformed key {key:?}")))?;
    let fingerprint: String = r.try_get(1).map_err(get)?;
    let fingerprint = Fingerprint::parse(&fingerprint)
        .ok_or_else(|| bad(format!("of key {key} has a malformed fingerprint")))?;
    let fence: i64 = r.try_get(2).map_err(get)?;
    let fence = Fence(u64::try_from(fence).map_err(|_| bad(format!("has a fence {fence}")))?);
    let state: i16 = r.try_get(3).map_err(get)?;
    let state = match state {
        0 => {
            let left: Option<i64> = r.try_get(4).map_err(get)?;
            RecordState::InFlight {
                lease_remaining: Duration::from_millis(left.unwrap_or(0).max(0) as u64),
            }
        }
        1 => {
            let kind: Option<i16> = r.try_get(5).map_err(get)?;
            let payload: Option<String> = r.try_get(6).map_err(get)?;
            let outcome = codec::decode(kind.map(i64::from), payload).ok_or_else(|| {
                bad(format!("of key {key} has an outcome this idem cannot read (kind {kind:?})"))
            })?;
            RecordState::Done(outcome)
        }
        s => return Err(bad(format!("of key {key} has an unknown state {s}"))),
    };
    let tool: Option<String> = r.try_get(7).map_err(get)?;
    let origin = match tool {
        None => None,
        Some(tool) => Some(StoredOrigin {
            tool,
            tenant: r.try_get::<_, Option<String>>(8).map_err(get)?.unwrap_or_default(),
            run: r.try_get::<_, Option<String>>(9).map_err(get)?.unwrap_or_default(),
        }),
    };
    let age: Option<i64> = r.try_get(10).map_err(get)?;
    Ok(RecordInfo {
        key,
        fingerprint,
        fence,
        origin,
        state,
        age: age.map(|a| Duration::from_millis(a.max(0) as u64)),
    })
}

impl PostgresStore {
    pub(super) async fn inspect_record(&self, key: &Key) -> Result<Option<RecordInfo>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM idem_records WHERE key = $1 AND {LIVE}");
        let conn = self.conn().await?;
        let row = conn.client.query_typed_opt(&sql, &[(&key.as_str(), Type::TEXT)]).await;
        let row = row.map_err(pg)?;
        row.as_ref().map(info).transpose()
    }

    pub(super) async fn list_records(&self, q: &ListQuery) -> Result<ListPage, StoreError> {
        let mut sql = format!("SELECT {COLUMNS} FROM idem_records WHERE {LIVE}");
        let mut args: Vec<(Box<dyn ToSql + Sync + Send>, Type)> = Vec::new();
        let mut arg = |sql: &mut String, clause: &str, v: Box<dyn ToSql + Sync + Send>, t| {
            args.push((v, t));
            sql.push_str(&clause.replace('?', &format!("${}", args.len())));
        };
        if let Some(cursor) = &q.cursor {
            let bad = || StoreError::InvalidCursor(cursor.clone());
            // PostgreSQL text is UTF-8 and the key column is text: no other cursor is written.
            let key = match KeyCursor::parse(cursor).ok_or_else(bad)? {
                KeyCursor::Text(bytes) => String::from_utf8(bytes).map_err(|_| bad())?,
                KeyCursor::Blob(_) => return Err(bad()),
            };
            arg(&mut sql, " AND key > ?", Box::new(key), Type::TEXT);
        }
        match q.state.map(codec::selected) {
            None => {}
            Some(Selected::InFlight { ended: false }) => sql.push_str(" AND state = 0"),
            Some(Selected::InFlight { ended: true }) => {
                sql.push_str(" AND state = 0 AND lease_until <= now()");
            }
            Some(Selected::Kind(kind)) => {
                arg(&mut sql, " AND state = 1 AND kind = ?", Box::new(kind), Type::INT2);
            }
        }
        if let Some(tool) = &q.tool {
            arg(&mut sql, " AND tool = ?", Box::new(text(tool).into_owned()), Type::TEXT);
        }
        if let Some(run) = &q.run {
            arg(&mut sql, " AND run_id = ?", Box::new(run_text(run).into_owned()), Type::TEXT);
        }
        if let Some(prefix) = &q.run_prefix {
            let prefix = &run_text(prefix).into_owned();
            // The range lets the byte-ordered index serve the prefix; starts_with is the test.
            arg(&mut sql, " AND run_id COLLATE \"C\" >= ?", Box::new(prefix.clone()), Type::TEXT);
            if let Some(end) = prefix_end(prefix) {
                arg(&mut sql, " AND run_id COLLATE \"C\" < ?", Box::new(end), Type::TEXT);
            }
            arg(&mut sql, " AND starts_with(run_id, ?)", Box::new(prefix.clone()), Type::TEXT);
        }
        if let Some(older) = q.older_than {
            arg(
                &mut sql,
                " AND since <= now() - ? * interval '1 millisecond'",
                Box::new(ms(older)),
                Type::INT8,
            );
        }
        let size = q.page_size();
        // One row past the page: whether another page follows.
        arg(
            &mut sql,
            " ORDER BY key LIMIT ?",
            Box::new(crate::store::admin::page_limit(size)),
            Type::INT8,
        );
        let params: Vec<(&(dyn ToSql + Sync), Type)> =
            args.iter().map(|(a, t)| (&**a as &(dyn ToSql + Sync), t.clone())).collect();
        let conn = self.conn().await?;
        let mut rows = conn.client.query_typed(&sql, &params).await.map_err(pg)?;
        // A row past the page: the next page starts after the page's last row, readable or not.
        // A page that ends the listing has no cursor.
        let more = rows.len() > size;
        rows.truncate(size);
        let mut page = ListPage { scanned: rows.len() as u64, ..ListPage::default() };
        for r in &rows {
            match read(r)? {
                Ok(info) => page.records.push(info),
                Err(unreadable) => page.unreadable.push(unreadable),
            }
        }
        if more && let Some(last) = rows.last() {
            page.next = Some(KeyCursor::Text(stored_key(last)?.into_bytes()).encode());
        }
        Ok(page)
    }

    /// Rows changed: 1 when resolved, 0 when refused.
    pub(super) async fn resolve_record(
        &self,
        key: &Key,
        fence: Fence,
        resolution: &Resolution,
    ) -> Result<usize, StoreError> {
        let (k, f) = (key.as_str(), fence_param(fence));
        let conn = self.conn().await?;
        let rows = match resolution {
            Resolution::Happened { outcome, ttl } => {
                let (kind, payload) = encode(outcome);
                let payload = payload.map(text);
                let sql = format!(
                    "WITH u AS (UPDATE idem_records SET state = 1, lease_until = NULL, \
                     kind = $3, payload = $4, since = now(), \
                     expires_at = now() + $5::bigint * interval '1 millisecond' \
                     WHERE {RESOLVABLE} RETURNING key, waited) \
                     SELECT CASE WHEN waited THEN pg_notify('idem_wake', key) END FROM u"
                );
                let params: [(&(dyn ToSql + Sync), Type); 5] = [
                    (&k, Type::TEXT),
                    (&f, Type::INT8),
                    (&kind, Type::INT2),
                    (&payload, Type::TEXT),
                    (&ms(*ttl), Type::INT8),
                ];
                conn.watch(conn.client.query_typed(&sql, &params)).await
            }
            Resolution::NotHappened => {
                let sql = format!(
                    "WITH d AS (DELETE FROM idem_records WHERE {RESOLVABLE} RETURNING key, waited) \
                     SELECT CASE WHEN waited THEN pg_notify('idem_wake', key) END FROM d"
                );
                conn.watch(conn.client.query_typed(&sql, &[(&k, Type::TEXT), (&f, Type::INT8)]))
                    .await
            }
        };
        match rows {
            Ok(rows) => Ok(rows.len()),
            Err(e) => Err(super::pool::write_refused(&conn, e).await),
        }
    }

    /// Removes the record of `key` if its fence and state are as seen. One statement, and a
    /// second only when the first saw a row it did not remove.
    pub(super) async fn forget_seen_record(
        &self,
        key: &Key,
        fence: Fence,
        done: bool,
    ) -> Result<Forgot, StoreError> {
        let (k, f, st) = (key.as_str(), fence_param(fence), i16::from(done));
        let sql = "WITH d AS (DELETE FROM idem_records WHERE key = $1 AND fence = $2 AND state = $3 \
                   RETURNING key, waited), \
                   n AS (SELECT CASE WHEN waited THEN pg_notify('idem_wake', key) END FROM d) \
                   SELECT EXISTS (SELECT 1 FROM d), EXISTS (SELECT 1 FROM idem_records WHERE key = $1), \
                   (SELECT count(*) FROM n)";
        let params: [(&(dyn ToSql + Sync), Type); 3] =
            [(&k, Type::TEXT), (&f, Type::INT8), (&st, Type::INT2)];
        let conn = self.conn().await?;
        let row = match conn.watch(conn.client.query_typed_one(sql, &params)).await {
            Ok(row) => row,
            Err(e) => return Err(super::pool::write_refused(&conn, e).await),
        };
        let (removed, present): (bool, bool) =
            (row.try_get(0).map_err(pg)?, row.try_get(1).map_err(pg)?);
        match (removed, present) {
            (true, _) => return Ok(Forgot::Removed),
            (false, false) => return Ok(Forgot::Absent),
            (false, true) => {}
        }
        // The statement's snapshot still shows a row that another session removed meanwhile
        // (a release, a forget): a new statement sees whether it is there now.
        let now = "SELECT EXISTS (SELECT 1 FROM idem_records WHERE key = $1)";
        let row = conn.client.query_typed_one(now, &[(&k, Type::TEXT)]).await.map_err(pg)?;
        let present: bool = row.try_get(0).map_err(pg)?;
        Ok(if present { Forgot::Changed } else { Forgot::Absent })
    }

    pub(super) async fn count_records(&self) -> Result<Stats, StoreError> {
        // An in-flight record without a lease end lists with no time left: counted as ended.
        let sql = format!(
            "SELECT state, kind, state = 0 AND (lease_until IS NULL OR lease_until <= now()), \
             {READABLE_PG}, count(*) FROM idem_records WHERE {LIVE} GROUP BY 1, 2, 3, 4"
        );
        let conn = self.conn().await?;
        let rows = conn.client.query_typed(&sql, &[]).await.map_err(pg)?;
        let mut stats = Stats::default();
        for r in rows {
            let get = |e| StoreError::Incompatible(format!("PostgreSQL record counts: {e}"));
            let state: i16 = r.try_get(0).map_err(get)?;
            let kind: Option<i16> = r.try_get(1).map_err(get)?;
            let ended: Option<bool> = r.try_get(2).map_err(get)?;
            let readable: bool = r.try_get(3).map_err(get)?;
            let n: i64 = r.try_get(4).map_err(get)?;
            let n = u64::try_from(n).unwrap_or(0);
            let (kind, ended) = (kind.map(i64::from), ended == Some(true));
            codec::count_row(&mut stats, state.into(), kind, ended, readable, n);
        }
        Ok(stats)
    }
}
