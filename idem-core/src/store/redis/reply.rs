//! What the scripts answer, read and checked: their replies ([`Answer`]) and the completed
//! records a claim returns as they are stored.

use redis::{RedisError, Value};

use super::SCHEMA_VERSION;
use crate::key::Fingerprint;
use crate::store::{Claim, Fence, Outcome, Record, StoreError};

/// Decodes a completed record as the claim script returns it (`RedisStore::replay`);
/// `record` names it in errors. Public for the fuzz targets (`fuzz/`), not an API.
#[doc(hidden)]
pub fn decode_record(
    record: &str,
    raw: &[u8],
    fingerprint: &Fingerprint,
) -> Result<Claim, StoreError> {
    let fields: Vec<&[u8]> = raw.splitn(8, |&b| b == b'|').collect();
    let version = fields.first().copied().unwrap_or_default();
    if version != SCHEMA_VERSION.as_bytes() {
        let shown = String::from_utf8_lossy(&version[..version.len().min(16)]);
        return Err(StoreError::Incompatible(format!(
            "record {record} has schema version {shown:?}"
        )));
    }
    let malformed = |what: &str| {
        StoreError::Incompatible(format!(
            "record {record} (schema version {SCHEMA_VERSION}) is malformed: {what}"
        ))
    };
    let &[_, state, fence, waited, lease_end, fp, kind, payload] = fields.as_slice() else {
        return Err(malformed("fewer than 8 fields"));
    };
    let digits = |f: &[u8]| f.iter().all(u8::is_ascii_digit);
    if state != b"d" {
        return Err(malformed("not a completed record"));
    }
    if fence.is_empty() || !digits(fence) {
        return Err(malformed("fence"));
    }
    if waited != b"0" && waited != b"1" {
        return Err(malformed("waited-on flag"));
    }
    if !digits(lease_end) {
        return Err(malformed("lease end"));
    }
    let stored = std::str::from_utf8(fp).ok().and_then(Fingerprint::parse);
    let Some(stored) = stored else { return Err(malformed("fingerprint")) };
    if stored != *fingerprint {
        return Ok(Claim::Mismatch);
    }
    let outcome = outcome_of(kind, payload).map_err(|why| malformed(&why))?;
    Ok(Claim::Completed(Record { fingerprint: stored, outcome }))
}

pub(super) fn unavailable(e: RedisError) -> StoreError {
    StoreError::unavailable(e)
}

/// A script's answer. The common one comes bare (see the scripts): an integer, or a completed
/// record from a claim. Any other is a table whose first item says what happened; `incompatible`
/// and `lost` become errors here.
#[derive(Debug)]
pub(super) enum Answer {
    Int(i64),
    Record(Vec<u8>),
    Table(Vec<Value>),
}

impl Answer {
    pub(super) fn int(self) -> Result<i64, StoreError> {
        match self {
            Answer::Int(i) => Ok(i),
            other => Err(StoreError::Incompatible(format!("unexpected script answer {other:?}"))),
        }
    }
}

/// Reads a script's reply (see [`Answer`]). Public for the fuzz targets (`fuzz/`), not an API.
#[doc(hidden)]
pub fn decode_answer(reply: Value) -> Result<impl std::fmt::Debug, StoreError> {
    answer(reply)
}

pub(super) fn answer(reply: Value) -> Result<Answer, StoreError> {
    let items = match reply {
        Value::Int(i) => return Ok(Answer::Int(i)),
        Value::BulkString(record) => return Ok(Answer::Record(record)),
        Value::Array(items) => items,
        other => {
            return Err(StoreError::Incompatible(format!("unexpected script reply {other:?}")));
        }
    };
    match items.first().map(text).as_deref() {
        Some("incompatible") => {
            Err(StoreError::Incompatible(items.get(1).map(text).unwrap_or_default().into_owned()))
        }
        Some("lost") => Err(StoreError::LeaseLost),
        Some(_) => Ok(Answer::Table(items)),
        None => Err(StoreError::Incompatible("empty script reply".into())),
    }
}

pub(super) fn text(v: &Value) -> std::borrow::Cow<'_, str> {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b),
        Value::SimpleString(s) => s.as_str().into(),
        Value::Int(i) => i.to_string().into(),
        other => format!("{other:?}").into(),
    }
}

pub(super) fn int(v: Option<&Value>) -> Result<i64, StoreError> {
    match v {
        Some(Value::Int(i)) => Ok(*i),
        other => Err(StoreError::Incompatible(format!("expected an integer, got {other:?}"))),
    }
}

pub(super) fn fence(n: i64) -> Result<Fence, StoreError> {
    u64::try_from(n).map(Fence).map_err(|_| StoreError::Incompatible(format!("negative fence {n}")))
}

/// The outcome of a completed record, or what is wrong with it.
fn outcome_of(kind: &[u8], payload: &[u8]) -> Result<Outcome, String> {
    // Success and failure carry their payload; unknown carries nothing.
    let json =
        || String::from_utf8(payload.to_vec()).map_err(|_| "payload is not UTF-8".to_owned());
    match kind {
        b"s" => Ok(Outcome::Success(json()?)),
        b"f" => Ok(Outcome::Failure(json()?)),
        b"u" if payload.is_empty() => Ok(Outcome::Unknown),
        b"n" => Ok(Outcome::NotStorable(json()?)),
        b"u" => Err("unknown outcome has a payload".to_owned()),
        other => Err(format!("unknown outcome kind {:?}", String::from_utf8_lossy(other))),
    }
}
