//! How the SQL stores (SQLite, PostgreSQL) write a record's outcome, fence and durations: one
//! encoding, so a record means the same in both.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{Fence, Outcome, StateFilter, Stats};
use crate::key::Key;

/// The outcome kind column: 1 success, 2 permanent failure, 3 unknown, 4 output not storable.
/// The payload column holds the JSON for 1 and 2, is NULL for 3, and the reason text for 4.
pub(crate) const SUCCESS: i16 = 1;
pub(crate) const FAILURE: i16 = 2;
pub(crate) const UNKNOWN: i16 = 3;
pub(crate) const NOT_STORABLE: i16 = 4;

/// The kind and payload columns of `outcome`.
pub(crate) fn encode(outcome: &Outcome) -> (i16, Option<&str>) {
    match outcome {
        Outcome::Success(json) => (SUCCESS, Some(json)),
        Outcome::Failure(json) => (FAILURE, Some(json)),
        Outcome::Unknown => (UNKNOWN, None),
        Outcome::NotStorable(reason) => (NOT_STORABLE, Some(reason)),
    }
}

/// The outcome of the kind and payload columns; `None` when they are not a pair this version
/// writes (the caller reports the record as incompatible). Public for the fuzz targets
/// (`fuzz/`, through `store::decode_sql_outcome`), not an API.
pub(crate) fn decode(kind: Option<i64>, payload: Option<String>) -> Option<Outcome> {
    match (kind, payload) {
        (Some(k), Some(json)) if k == i64::from(SUCCESS) => Some(Outcome::Success(json)),
        (Some(k), Some(json)) if k == i64::from(FAILURE) => Some(Outcome::Failure(json)),
        (Some(k), None) if k == i64::from(UNKNOWN) => Some(Outcome::Unknown),
        (Some(k), Some(why)) if k == i64::from(NOT_STORABLE) => Some(Outcome::NotStorable(why)),
        _ => None,
    }
}

/// Milliseconds as a column value (see [`crate::clock::ms`]: capped at 100 years).
pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(crate::clock::ms(d)).unwrap_or(i64::MAX)
}

/// A fence as a column value. Fences beyond i64 never come from these stores; such a fence
/// matches no row.
pub(crate) fn fence_param(f: Fence) -> i64 {
    i64::try_from(f.0).unwrap_or(-1)
}

/// The local wall clock in ms since the Unix epoch (SQLite's leases; the SQL stores' sweeps).
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// What the SQL stores' count queries select besides state and kind: whether the record's key
/// and fingerprint are 64 lowercase hex digits and a completed record's payload is present
/// exactly when its kind has one (a listing cannot read it otherwise). SQLite's form; PostgreSQL
/// uses `READABLE_PG`.
#[cfg(feature = "sqlite")]
pub(crate) const READABLE_SQLITE: &str = "(typeof(key) = 'text' AND length(key) = 64 \
     AND key NOT GLOB '*[^0-9a-f]*' AND typeof(fingerprint) = 'text' AND length(fingerprint) = 64 \
     AND fingerprint NOT GLOB '*[^0-9a-f]*' AND (state <> 1 OR (kind = 3) = (payload IS NULL)))";

/// `READABLE_SQLITE` for PostgreSQL (a NULL answer counts as not readable).
#[cfg(feature = "postgres")]
pub(crate) const READABLE_PG: &str = "coalesce(key ~ '^[0-9a-f]{64}$' \
     AND fingerprint ~ '^[0-9a-f]{64}$' AND (state <> 1 OR (kind = 3) = (payload IS NULL)), false)";

/// Adds one row of the SQL stores' count query (`state`, outcome `kind`, whether an in-flight
/// lease has ended, whether the rows are readable (`READABLE_SQLITE`), count) to `stats`. A
/// record the listing cannot read, a pair this version does not write included, is counted as
/// unreadable, not refused: one odd record must not hide the others' counts.
pub(crate) fn count_row(
    stats: &mut Stats,
    state: i64,
    kind: Option<i64>,
    ended: bool,
    readable: bool,
    n: u64,
) {
    // A state other than 0 and 1 is one the listing cannot read either, whatever its kind.
    let state = if readable { state } else { -1 };
    let slot = match (state, kind.and_then(|k| i16::try_from(k).ok())) {
        (0, _) if ended => &mut stats.lease_expired,
        (0, _) => &mut stats.in_flight,
        (1, Some(SUCCESS)) => &mut stats.completed,
        (1, Some(FAILURE)) => &mut stats.failed,
        (1, Some(UNKNOWN)) => &mut stats.unknown,
        (1, Some(NOT_STORABLE)) => &mut stats.not_storable,
        _ => &mut stats.unreadable,
    };
    *slot += n;
}

/// Where a SQL listing goes on: after the row whose key is this, as stored (the key of the last
/// row of the page before, readable or not). Written as the key itself when it is an idempotency
/// key; a key edited by hand as `t:` (text) or `b:` (a SQLite blob) and its bytes in hex, so a
/// listing also goes on past a row whose key is not one, and a cursor stays one line of ASCII.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KeyCursor {
    /// A text key, as its bytes (SQLite text need not be UTF-8).
    Text(Vec<u8>),
    /// A blob key (SQLite only: it sorts after every text).
    Blob(Vec<u8>),
}

impl KeyCursor {
    /// The cursor of `s`; `None` when this store's listings never write it.
    pub(crate) fn parse(s: &str) -> Option<KeyCursor> {
        if Key::parse(s).is_some() {
            return Some(KeyCursor::Text(s.as_bytes().to_vec()));
        }
        if let Some(bytes) = s.strip_prefix("t:") {
            return hex::decode(bytes).ok().map(KeyCursor::Text);
        }
        hex::decode(s.strip_prefix("b:")?).ok().map(KeyCursor::Blob)
    }

    pub(crate) fn encode(&self) -> String {
        match self {
            KeyCursor::Text(bytes) => match std::str::from_utf8(bytes) {
                Ok(key) if Key::parse(key).is_some() => key.to_owned(),
                _ => format!("t:{}", hex::encode(bytes)),
            },
            KeyCursor::Blob(bytes) => format!("b:{}", hex::encode(bytes)),
        }
    }
}

/// What a listing filter selects in the SQL stores' columns.
pub(crate) enum Selected {
    /// `state = 0`; with `ended`, also `lease_until <= now`.
    InFlight { ended: bool },
    /// `state = 1` with this outcome kind.
    Kind(i16),
}

pub(crate) fn selected(state: StateFilter) -> Selected {
    match state {
        StateFilter::InFlight => Selected::InFlight { ended: false },
        StateFilter::LeaseEnded => Selected::InFlight { ended: true },
        StateFilter::Completed => Selected::Kind(SUCCESS),
        StateFilter::Failed => Selected::Kind(FAILURE),
        StateFilter::Unknown => Selected::Kind(UNKNOWN),
        StateFilter::NotStorable => Selected::Kind(NOT_STORABLE),
    }
}

#[cfg(test)]
mod tests {
    use super::KeyCursor;

    #[test]
    fn key_cursors_round_trip_and_refuse_what_no_listing_writes() {
        let key = "0f".repeat(32);
        for cur in [
            KeyCursor::Text(key.clone().into_bytes()),
            KeyCursor::Text(b"edited key".to_vec()),
            KeyCursor::Text(vec![0xff, 0]),
            KeyCursor::Text(Vec::new()),
            KeyCursor::Blob(vec![0, 0xff]),
        ] {
            assert_eq!(KeyCursor::parse(&cur.encode()), Some(cur));
        }
        assert_eq!(KeyCursor::Text(key.clone().into_bytes()).encode(), key, "a key is itself");
        for bad in ["zz", "", ";x;", "not a cursor", "t:0", "t:zz", "B:00", &key.to_uppercase()] {
            assert_eq!(KeyCursor::parse(bad), None, "{bad:?}");
        }
    }
}
