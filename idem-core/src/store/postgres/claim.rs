//! Reading the row the claim function (`idem_claim`, see `schema.rs`) answers into a [`Claim`].

use std::time::Duration;

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

/// What one run of the claim statement means; `Retry` when the function gave up racing
/// concurrent writers.
pub(super) enum Step {
    Done(Claim),
    Retry,
}

pub(super) fn decide(
    key: &Key,
    fp: &Fingerprint,
    on_expired: OnExpired,
    row: Option<tokio_postgres::Row>,
) -> Result<Step, StoreError> {
    let Some(row) = row else { return Ok(Step::Retry) };
    let get = |e: tokio_postgres::Error| {
        StoreError::Incompatible(format!("the PostgreSQL record of key {key}: {e}"))
    };
    // NULL: the function gave up racing concurrent writers.
    let Some(acquired) = row.try_get::<_, Option<bool>>(0).map_err(get)? else {
        return Ok(Step::Retry);
    };
    let bad = |what: String| {
        StoreError::Incompatible(format!("the PostgreSQL record of key {key} {what}"))
    };
    let fence = row.try_get::<_, i64>(1).map_err(get)?;
    let fence =
        Fence(u64::try_from(fence).map_err(|_| bad(format!("has a negative fence {fence}")))?);
    if acquired {
        return Ok(Step::Done(Claim::Acquired { fence, takeover: row.try_get(2).map_err(get)? }));
    }
    let fingerprint: String = row.try_get(3).map_err(get)?;
    let state: i16 = row.try_get(4).map_err(get)?;
    if state != 0 && state != 1 {
        return Err(bad(format!("has an unknown state {state}")));
    }
    if Fingerprint::parse(&fingerprint).is_none() {
        return Err(bad(format!("has a malformed fingerprint {fingerprint:?}")));
    }
    // NULL: the row lacks its lease end (in flight) or its expiry (done).
    let Some(alive) = row.try_get::<_, Option<bool>>(5).map_err(get)? else {
        return Err(bad("has no lease end or expiry".into()));
    };
    // The function answers only with rows it cannot take; one it could have taken is not a
    // record this version writes.
    let free = match state {
        1 => !alive,
        _ => !alive && fingerprint == fp.as_str() && on_expired == OnExpired::TakeOver,
    };
    if free {
        return Err(bad("is in a state the claim should have taken".into()));
    }
    if fingerprint != fp.as_str() {
        return Ok(Step::Done(Claim::Mismatch));
    }
    Ok(Step::Done(match (state, alive) {
        (1, _) => Claim::Completed(Record {
            fingerprint: *fp,
            outcome: decode(key, row.try_get(7).map_err(get)?, row.try_get(8).map_err(get)?)?,
        }),
        (_, true) => {
            let remaining: Option<i64> = row.try_get(6).map_err(get)?;
            Claim::InFlight {
                fence,
                lease_remaining: Duration::from_millis(remaining.unwrap_or(0).max(0) as u64),
            }
        }
        (_, false) => Claim::Unknown,
    }))
}
