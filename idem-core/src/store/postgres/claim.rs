//! Reading the rows of the claim's two statements into a [`Claim`]: the common path (`Sql::Claim`
//! in `conn.rs`: the key's row, or a fresh acquisition) and the rare path (the function
//! `idem_claim`, see `schema.rs`: takeovers, ended retention, resends, lost races).

use std::time::Duration;

use tokio_postgres::Row;
use tokio_postgres::types::{FromSql, Type, accepts};

use crate::key::{Fingerprint, Key};
use crate::store::codec;
use crate::store::{Claim, Fence, OnExpired, Outcome, Record, StoreError};

fn decode(key: &Key, kind: Option<i16>, payload: Option<String>) -> Result<Outcome, StoreError> {
    let present = if payload.is_some() { "present" } else { "absent" };
    codec::decode(kind.map(i64::from), payload).ok_or_else(|| {
        StoreError::Incompatible(format!(
            "the PostgreSQL record of key {key} has an outcome this idem cannot read (kind \
             {kind:?}, payload {present})"
        ))
    })
}

/// What one run of a claim statement means: the answer, or `Retry` (run `idem_claim`: the common
/// statement found a row it cannot answer from, or lost a race; the function gave up racing
/// concurrent writers).
pub(super) enum Step {
    Done(Claim),
    Retry,
}

fn get_error(key: &Key) -> impl Fn(tokio_postgres::Error) -> StoreError + '_ {
    move |e| StoreError::Incompatible(format!("the PostgreSQL record of key {key}: {e}"))
}

/// A `timestamptz` as the server sends it in binary: microseconds since 2000-01-01 UTC
/// (`infinity` and `-infinity` are the extreme values, so they compare as they should).
struct ServerTime(i64);

impl<'a> FromSql<'a> for ServerTime {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let bytes: [u8; 8] = raw.try_into()?;
        Ok(ServerTime(i64::from_be_bytes(bytes)))
    }

    accepts!(TIMESTAMPTZ);
}

/// The common statement's row: the fence (column 0: drawn now when the key had no row, NULL when
/// another claim inserted it first; else the row's), then the key's row, all NULL when it had
/// none: state, fingerprint, lease end, expiry, the server's `now()` (5), owner token, outcome
/// kind, payload. `own` is this claim's owner token.
pub(super) fn decide_common(
    key: &Key,
    fp: &Fingerprint,
    own: &str,
    on_expired: OnExpired,
    row: Option<Row>,
) -> Result<Step, StoreError> {
    let Some(row) = row else { return Ok(Step::Retry) };
    let get = get_error(key);
    let fence = row.try_get::<_, Option<i64>>(0).map_err(&get)?;
    let Some(state) = row.try_get::<_, Option<i16>>(1).map_err(&get)? else {
        // No row: acquired now, or another claim inserted it meanwhile (the function decides).
        return match fence {
            Some(fence) => {
                Ok(Step::Done(Claim::Acquired { fence: fence_of(key, fence)?, takeover: false }))
            }
            None => Ok(Step::Retry),
        };
    };
    // A row of this claim's own (a resend after a lost reply) is re-acquired by the function.
    if state == 0 && row.try_get::<_, Option<&str>>(6).map_err(&get)? == Some(own) {
        return Ok(Step::Retry);
    }
    // The lease's end (in flight) or the expiry (done), and `now()`: both the server's, so the
    // lease and the retention end on its clock.
    let until =
        row.try_get::<_, Option<ServerTime>>(if state == 0 { 3 } else { 4 }).map_err(&get)?;
    let now: ServerTime = row.try_get(5).map_err(&get)?;
    let found = Found {
        fence: fence.ok_or_else(|| bad(key, "has no fence".into()))?,
        fingerprint: row.try_get(2).map_err(&get)?,
        state,
        alive: until.as_ref().map(|until| until.0 > now.0),
        remaining: until.map_or(Duration::ZERO, |until| {
            Duration::from_micros(until.0.saturating_sub(now.0).max(0) as u64)
        }),
    };
    answer(key, fp, on_expired, found, true, || outcome(key, &row, 7))
}

fn fence_of(key: &Key, fence: i64) -> Result<Fence, StoreError> {
    u64::try_from(fence).map(Fence).map_err(|_| bad(key, format!("has a negative fence {fence}")))
}

fn bad(key: &Key, what: String) -> StoreError {
    StoreError::Incompatible(format!("the PostgreSQL record of key {key} {what}"))
}

/// The outcome in columns `kind` and `kind + 1` (payload).
fn outcome(key: &Key, row: &Row, kind: usize) -> Result<Outcome, StoreError> {
    let get = get_error(key);
    decode(key, row.try_get(kind).map_err(&get)?, row.try_get(kind + 1).map_err(&get)?)
}

/// `idem_claim`'s row: acquired (NULL: gave up racing), fence, takeover, fingerprint, state,
/// alive, lease remaining (ms), outcome kind, payload.
pub(super) fn decide(
    key: &Key,
    fp: &Fingerprint,
    on_expired: OnExpired,
    row: Option<Row>,
) -> Result<Step, StoreError> {
    let Some(row) = row else { return Ok(Step::Retry) };
    let get = get_error(key);
    // NULL: the function gave up racing concurrent writers.
    let Some(acquired) = row.try_get::<_, Option<bool>>(0).map_err(&get)? else {
        return Ok(Step::Retry);
    };
    if acquired {
        let fence = fence_of(key, row.try_get(1).map_err(&get)?)?;
        return Ok(Step::Done(Claim::Acquired { fence, takeover: row.try_get(2).map_err(&get)? }));
    }
    let remaining: Option<i64> = row.try_get(6).map_err(&get)?;
    let found = Found {
        fence: row.try_get(1).map_err(&get)?,
        fingerprint: row.try_get(3).map_err(&get)?,
        state: row.try_get(4).map_err(&get)?,
        alive: row.try_get(5).map_err(&get)?,
        remaining: Duration::from_millis(remaining.unwrap_or(0).max(0) as u64),
    };
    answer(key, fp, on_expired, found, false, || outcome(key, &row, 7))
}

/// An existing row, as either statement reads it.
struct Found<'r> {
    fence: i64,
    fingerprint: &'r str,
    state: i16,
    /// Whether its lease (in flight) or retention (done) has not ended; `None` when the row
    /// lacks that time.
    alive: Option<bool>,
    /// In flight: the time its lease has left.
    remaining: Duration,
}

/// The answer from an existing row; `outcome` reads its outcome (only for a replay). A row the
/// claim could take is `Retry` from the common statement (`takeable`), and from the function,
/// which only answers with rows it cannot take, a row this version does not write.
fn answer(
    key: &Key,
    fp: &Fingerprint,
    on_expired: OnExpired,
    found: Found<'_>,
    takeable: bool,
    outcome: impl FnOnce() -> Result<Outcome, StoreError>,
) -> Result<Step, StoreError> {
    let Found { fence, fingerprint, state, alive, remaining } = found;
    let fence = fence_of(key, fence)?;
    if state != 0 && state != 1 {
        return Err(bad(key, format!("has an unknown state {state}")));
    }
    if Fingerprint::parse(fingerprint).is_none() {
        return Err(bad(key, format!("has a malformed fingerprint {fingerprint:?}")));
    }
    let Some(alive) = alive else {
        return Err(bad(key, "has no lease end or expiry".into()));
    };
    let free = match state {
        1 => !alive,
        _ => !alive && fingerprint == fp.as_str() && on_expired == OnExpired::TakeOver,
    };
    if free {
        if takeable {
            return Ok(Step::Retry);
        }
        return Err(bad(key, "is in a state the claim should have taken".into()));
    }
    if fingerprint != fp.as_str() {
        return Ok(Step::Done(Claim::Mismatch));
    }
    Ok(Step::Done(match (state, alive) {
        (1, _) => Claim::Completed(Record { fingerprint: *fp, outcome: outcome()? }),
        (_, true) => Claim::InFlight { fence, lease_remaining: remaining },
        (_, false) => Claim::Unknown,
    }))
}
