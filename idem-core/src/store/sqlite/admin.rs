//! The SQLite store's operator side (`docs/design.md` §5.1): listing with keyset pagination on
//! the key over the indexes of schema revision 1, inspecting, fenced resolution, counting.

use std::time::Duration;

use rusqlite::types::{Value, ValueRef};
use rusqlite::{Connection, params, params_from_iter};

use super::{SqlError, decode, fence_of};
use crate::key::{Fingerprint, Key};
use crate::store::admin::{page_limit, prefix_end};
use crate::store::codec::{self, KeyCursor, READABLE_SQLITE, Selected, encode, fence_param, ms};
use crate::store::{
    ListPage, ListQuery, RecordInfo, RecordState, Resolution, Stats, StoredOrigin, UnreadableRecord,
};

/// How many records one sweep removes at most.
pub(super) const SWEEP_BATCH: usize = 1000;

const COLUMNS: &str = "key, fingerprint, fence, state, lease_until, kind, payload, tool, tenant, \
                       run_id, since";

/// Not past retention (`?1` is now). A completed record without an end of retention (edited by
/// hand, or damaged) is kept, as the claims and the sweeps keep it: listed, counted, shown and
/// removable, not hidden from the operator while the application still meets it.
const LIVE: &str = "NOT (state = 1 AND expires_at IS NOT NULL AND expires_at <= ?1)";

/// Resolvable under the fence `?3` at `?4` (now): outcome unknown, or a lease that ended.
const RESOLVABLE: &str = "key = ?1 AND fence = ?3 AND (
    (state = 0 AND lease_until <= ?4) OR (state = 1 AND kind = 3 AND (expires_at IS NULL OR expires_at > ?4)))";

/// The record of row `r`, or, when it cannot be read (edited by hand, or written by another
/// version), its key as stored and why: a listing reports it and goes on.
fn read(r: &rusqlite::Row<'_>, now: i64) -> Result<Result<RecordInfo, UnreadableRecord>, SqlError> {
    let reason = match read_info(r, now) {
        Ok(info) => return Ok(Ok(info)),
        Err(SqlError::Sqlite(
            e @ (rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::IntegralValueOutOfRange(..)
            | rusqlite::Error::Utf8Error(..)),
        )) => e.to_string(),
        Err(SqlError::Incompatible(why)) => why,
        Err(other) => return Err(other),
    };
    let key = match r.get_ref(0) {
        Ok(v) => String::from_utf8_lossy(v.as_bytes_or_null().ok().flatten().unwrap_or_default())
            .into_owned(),
        Err(_) => String::new(),
    };
    Ok(Err(UnreadableRecord { key, reason }))
}

/// The record of row `r`. One that cannot be read is an error that names its key, so the
/// operator can find that record and forget it.
fn info(r: &rusqlite::Row<'_>, now: i64) -> Result<RecordInfo, SqlError> {
    read(r, now)?.map_err(|u| {
        SqlError::Incompatible(format!(
            "the SQLite record of key {:?} cannot be read ({}); `idem forget` with that key \
             removes it",
            u.key, u.reason
        ))
    })
}

/// The cursor that goes on after row `r`: its key as stored, whether or not the row can be read.
fn cursor_after(r: &rusqlite::Row<'_>) -> Result<String, SqlError> {
    Ok(match r.get_ref(0)? {
        ValueRef::Text(t) => KeyCursor::Text(t.to_vec()).encode(),
        ValueRef::Blob(b) => KeyCursor::Blob(b.to_vec()).encode(),
        // The key column's TEXT affinity stores numbers as text, and a primary key of a table
        // WITHOUT ROWID is never NULL.
        other => {
            return Err(SqlError::Incompatible(format!(
                "a SQLite record has a key of type {}",
                other.data_type()
            )));
        }
    })
}

fn read_info(r: &rusqlite::Row<'_>, now: i64) -> Result<RecordInfo, SqlError> {
    let key: String = r.get(0)?;
    let fingerprint: String = r.get(1)?;
    let bad =
        |what: &str| SqlError::Incompatible(format!("a SQLite record has a malformed {what}"));
    let key = Key::parse(&key).ok_or_else(|| bad("key"))?;
    let fingerprint = Fingerprint::parse(&fingerprint).ok_or_else(|| bad("fingerprint"))?;
    let state: i64 = r.get(3)?;
    let lease_until: Option<i64> = r.get(4)?;
    let state = match (state, lease_until) {
        (0, Some(until)) => RecordState::InFlight {
            lease_remaining: Duration::from_millis(until.saturating_sub(now).max(0) as u64),
        },
        (1, _) => RecordState::Done(decode(&key, r.get(5)?, r.get(6)?)?),
        (state, _) => {
            return Err(SqlError::Incompatible(format!(
                "the SQLite record of key {key} has an unknown state {state}"
            )));
        }
    };
    let tool: Option<String> = r.get(7)?;
    let origin = tool.map(|tool| -> Result<StoredOrigin, SqlError> {
        Ok(StoredOrigin {
            tool,
            tenant: r.get::<_, Option<String>>(8)?.unwrap_or_default(),
            run: r.get::<_, Option<String>>(9)?.unwrap_or_default(),
        })
    });
    let since: Option<i64> = r.get(10)?;
    Ok(RecordInfo {
        key,
        fingerprint,
        fence: fence_of(r.get(2)?),
        origin: origin.transpose()?,
        state,
        age: since.map(|s| Duration::from_millis(now.saturating_sub(s).max(0) as u64)),
    })
}

pub(super) fn inspect(
    conn: &Connection,
    key: &Key,
    now: i64,
) -> Result<Option<RecordInfo>, SqlError> {
    let sql = format!("SELECT {COLUMNS} FROM idem_records WHERE key = ?2 AND {LIVE}");
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params![now, key.as_str()])?;
    match rows.next()? {
        Some(r) => Ok(Some(info(r, now)?)),
        None => Ok(None),
    }
}

/// The listing's statement and its arguments.
fn statement(q: &ListQuery, now: i64) -> Result<(String, Vec<Value>), SqlError> {
    let mut sql = format!("SELECT {COLUMNS} FROM idem_records WHERE {LIVE}");
    let mut args: Vec<Value> = vec![Value::Integer(now)];
    let mut arg = |sql: &mut String, clause: &str, v: Value| {
        args.push(v);
        sql.push_str(&clause.replace('?', &format!("?{}", args.len())));
    };
    if let Some(cursor) = &q.cursor {
        let bad = || SqlError::Cursor(cursor.clone());
        match KeyCursor::parse(cursor).ok_or_else(bad)? {
            // Bound as a blob and cast: the bytes of a text key edited by hand need not be UTF-8.
            KeyCursor::Text(bytes) => {
                arg(&mut sql, " AND key > CAST(? AS TEXT)", Value::Blob(bytes))
            }
            KeyCursor::Blob(bytes) => arg(&mut sql, " AND key > ?", Value::Blob(bytes)),
        }
    }
    match q.state.map(codec::selected) {
        None => {}
        Some(Selected::InFlight { ended: false }) => sql.push_str(" AND state = 0"),
        // ?1 is now.
        Some(Selected::InFlight { ended: true }) => {
            sql.push_str(" AND state = 0 AND lease_until <= ?1")
        }
        Some(Selected::Kind(kind)) => {
            arg(&mut sql, " AND state = 1 AND kind = ?", Value::Integer(kind.into()));
        }
    }
    if let Some(tool) = &q.tool {
        arg(&mut sql, " AND tool = ?", Value::Text(tool.clone()));
    }
    if let Some(run) = &q.run {
        // The text comparison lets the index on run_id serve it; the bytes are the exact test
        // (as for the prefix below, a NUL in a run id must not end the comparison).
        arg(&mut sql, " AND run_id = ?", Value::Text(run.clone()));
        arg(&mut sql, " AND CAST(run_id AS BLOB) = ?", Value::Blob(run.as_bytes().to_vec()));
    }
    if let Some(prefix) = &q.run_prefix {
        // The range lets the index on run_id serve the prefix; `substr` is the exact test, on
        // bytes: SQLite's `length` of a text stops at its first NUL, so a prefix holding one
        // would compare a shorter part of the run id than the whole prefix.
        arg(&mut sql, " AND run_id >= ?", Value::Text(prefix.clone()));
        if let Some(end) = prefix_end(prefix) {
            arg(&mut sql, " AND run_id < ?", Value::Text(end));
        }
        arg(
            &mut sql,
            " AND substr(CAST(run_id AS BLOB), 1, ?)",
            Value::Integer(prefix.len() as i64),
        );
        arg(&mut sql, " = ?", Value::Blob(prefix.as_bytes().to_vec()));
    }
    if let Some(older) = q.older_than {
        arg(&mut sql, " AND since <= ?", Value::Integer(now.saturating_sub(ms(older))));
    }
    // One row past the page: whether another page follows.
    arg(&mut sql, " ORDER BY key LIMIT ?", Value::Integer(page_limit(q.page_size())));
    Ok((sql, args))
}

pub(super) fn list(conn: &Connection, q: &ListQuery, now: i64) -> Result<ListPage, SqlError> {
    let size = q.page_size();
    let (sql, args) = statement(q, now)?;
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params_from_iter(args))?;
    let mut page = ListPage::default();
    let mut last = None;
    while let Some(r) = rows.next()? {
        if page.scanned as usize == size {
            // A row past the page: the next page starts after the page's last row, readable or
            // not. A page that ends the listing has no cursor.
            page.next = last.take();
            break;
        }
        page.scanned += 1;
        match read(r, now)? {
            Ok(info) => page.records.push(info),
            Err(unreadable) => page.unreadable.push(unreadable),
        }
        if page.scanned as usize == size {
            last = Some(cursor_after(r)?);
        }
    }
    Ok(page)
}

/// Rows changed: 1 when resolved, 0 when refused.
pub(super) fn resolve(
    conn: &Connection,
    key: &Key,
    fence: crate::store::Fence,
    resolution: &Resolution,
    now: i64,
) -> Result<usize, SqlError> {
    let fence = fence_param(fence);
    Ok(match resolution {
        Resolution::Happened { outcome, ttl } => {
            let (kind, payload) = encode(outcome);
            let sql = format!(
                "UPDATE idem_records SET state = 1, lease_until = NULL, expires_at = ?4 + ?5, \
                 kind = ?6, payload = ?2, since = ?4 WHERE {RESOLVABLE}"
            );
            conn.prepare_cached(&sql)?.execute(params![
                key.as_str(),
                payload,
                fence,
                now,
                ms(*ttl),
                kind
            ])?
        }
        Resolution::NotHappened => {
            let sql = format!("DELETE FROM idem_records WHERE {RESOLVABLE}");
            let none: Option<&str> = None;
            // ?2 is unused here; bound so both statements share the clause's numbering.
            conn.prepare_cached(&sql)?.execute(params![key.as_str(), none, fence, now])?
        }
    })
}

pub(super) fn stats(conn: &Connection, now: i64) -> Result<Stats, SqlError> {
    let sql = format!(
        "SELECT state, kind, lease_until IS NULL, lease_until <= ?1, {READABLE_SQLITE}, count(*) \
         FROM idem_records WHERE {LIVE} GROUP BY 1, 2, 3, 4, 5"
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params![now])?;
    let mut stats = Stats::default();
    while let Some(r) = rows.next()? {
        // Columns are read as they are, never converted: a value of another type (edited by
        // hand; SQLite keeps any type in any column) counts the record as unreadable, as the
        // listing reports it, rather than failing the counts of every other record.
        let int = |i| -> Result<Option<i64>, SqlError> {
            Ok(match r.get_ref(i)? {
                ValueRef::Integer(n) => Some(n),
                _ => None,
            })
        };
        let (state, kind, no_lease, ended) = (int(0)?, int(1)?, int(2)?, int(3)?);
        let (readable, n) = (int(4)? == Some(1), int(5)?);
        // A record in flight without a lease is one the listing cannot read either.
        let state = match state {
            Some(0) if no_lease != Some(0) => -1,
            state => state.unwrap_or(-1),
        };
        let ended = ended.is_some_and(|e| e != 0);
        let n = n.and_then(|n| u64::try_from(n).ok()).unwrap_or(0);
        codec::count_row(&mut stats, state, kind, ended, readable, n);
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SqliteStore;
    use crate::store::StateFilter;

    /// The plan SQLite chooses for the listing `q`: its detail lines.
    fn plan(conn: &Connection, q: &ListQuery) -> String {
        let Ok((sql, args)) = statement(q, 0) else { panic!("no statement for {q:?}") };
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).expect("prepare");
        let rows = stmt.query_map(params_from_iter(args), |r| r.get::<_, String>(3));
        rows.expect("plan").map(|r| r.expect("row")).collect::<Vec<_>>().join("; ")
    }

    /// Each filter is served by its index, not by a scan of every record.
    #[test]
    fn listings_use_the_indexes() {
        let store = SqliteStore::in_memory().expect("store");
        let conn = store.inner.lock();
        let cases = [
            (
                ListQuery { state: Some(StateFilter::Unknown), ..Default::default() },
                "idem_records_state",
            ),
            (
                ListQuery { state: Some(StateFilter::InFlight), ..Default::default() },
                "idem_records_state",
            ),
            (ListQuery { tool: Some("refund".into()), ..Default::default() }, "idem_records_tool"),
            (
                ListQuery { run_prefix: Some("conv-".into()), ..Default::default() },
                "idem_records_run",
            ),
        ];
        for (q, index) in cases {
            let plan = plan(&conn.conn, &q);
            assert!(plan.contains(&format!("USING INDEX {index}")), "{q:?}: {plan}");
        }
    }
}
