//! Reading the rows of the claim's two statements into a [`Claim`]: the common path (`Sql::Claim`
//! in `conn.rs`: the key's row, or a fresh acquisition) and the rare path (the function
//! `idem_claim`, see `schema.rs`: takeovers, ended retention, resends, lost races).

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

/// The common statement's row: the fence just drawn (column 0), else the key's row in the
/// layout of `idem_claim`'s answer (columns 1-8) and whether it is this claim's own (9).
pub(super) fn decide_common(
    key: &Key,
    fp: &Fingerprint,
    on_expired: OnExpired,
    row: Option<tokio_postgres::Row>,
) -> Result<Step, StoreError> {
    let Some(row) = row else { return Ok(Step::Retry) };
    let get = get_error(key);
    if let Some(fence) = row.try_get::<_, Option<i64>>(0).map_err(&get)? {
        return Ok(Step::Done(Claim::Acquired { fence: fence_of(key, fence)?, takeover: false }));
    }
    // No row, and no acquisition: another claim inserted it meanwhile. A row of this claim's own
    // (a resend after a lost reply) is re-acquired by the function.
    if row.try_get::<_, Option<i64>>(1).map_err(&get)?.is_none()
        || row.try_get::<_, bool>(9).map_err(&get)?
    {
        return Ok(Step::Retry);
    }
    answer(key, fp, on_expired, &row, true)
}

fn fence_of(key: &Key, fence: i64) -> Result<Fence, StoreError> {
    u64::try_from(fence).map(Fence).map_err(|_| {
        StoreError::Incompatible(format!(
            "the PostgreSQL record of key {key} has a negative fence {fence}"
        ))
    })
}

/// `idem_claim`'s row: acquired (NULL: gave up racing), fence, takeover, fingerprint, state,
/// alive, lease remaining (ms), outcome kind, payload.
pub(super) fn decide(
    key: &Key,
    fp: &Fingerprint,
    on_expired: OnExpired,
    row: Option<tokio_postgres::Row>,
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
    answer(key, fp, on_expired, &row, false)
}

/// The answer from an existing row (columns 1-8 as in [`decide`]). A row the claim could take
/// is `Retry` from the common statement (`takeable`), and from the function, which only answers
/// with rows it cannot take, a row this version does not write.
fn answer(
    key: &Key,
    fp: &Fingerprint,
    on_expired: OnExpired,
    row: &tokio_postgres::Row,
    takeable: bool,
) -> Result<Step, StoreError> {
    let get = get_error(key);
    let bad = |what: String| {
        StoreError::Incompatible(format!("the PostgreSQL record of key {key} {what}"))
    };
    let fence = fence_of(key, row.try_get(1).map_err(&get)?)?;
    let fingerprint: &str = row.try_get(3).map_err(&get)?;
    let state: i16 = row.try_get(4).map_err(&get)?;
    if state != 0 && state != 1 {
        return Err(bad(format!("has an unknown state {state}")));
    }
    if Fingerprint::parse(fingerprint).is_none() {
        return Err(bad(format!("has a malformed fingerprint {fingerprint:?}")));
    }
    // NULL: the row lacks its lease end (in flight) or its expiry (done).
    let Some(alive) = row.try_get::<_, Option<bool>>(5).map_err(&get)? else {
        return Err(bad("has no lease end or expiry".into()));
    };
    let free = match state {
        1 => !alive,
        _ => !alive && fingerprint == fp.as_str() && on_expired == OnExpired::TakeOver,
    };
    if free {
        if takeable {
            return Ok(Step::Retry);
        }
        return Err(bad("is in a state the claim should have taken".into()));
    }
    if fingerprint != fp.as_str() {
        return Ok(Step::Done(Claim::Mismatch));
    }
    Ok(Step::Done(match (state, alive) {
        (1, _) => Claim::Completed(Record {
            fingerprint: *fp,
            outcome: decode(key, row.try_get(7).map_err(&get)?, row.try_get(8).map_err(&get)?)?,
        }),
        (_, true) => {
            let remaining: Option<i64> = row.try_get(6).map_err(&get)?;
            Claim::InFlight {
                fence,
                lease_remaining: Duration::from_millis(remaining.unwrap_or(0).max(0) as u64),
            }
        }
        (_, false) => Claim::Unknown,
    }))
}
