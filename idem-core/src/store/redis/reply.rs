//! What the scripts answer, read and checked: their replies ([`Answer`]) and the completed
//! records a claim returns as they are stored.

use redis::{RedisError, Value};

use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};

use super::SCHEMA_VERSION;
use crate::key::Fingerprint;
use crate::store::{Claim, Fence, Origin, Outcome, Record, StoreError, StoredOrigin};

/// Decodes a completed record as the claim script returns it (`RedisStore::replay`);
/// `record` names it in errors. Public for the fuzz targets (`fuzz/`), not an API.
#[doc(hidden)]
pub fn decode_record(
    record: &str,
    raw: &[u8],
    fingerprint: &Fingerprint,
) -> Result<Claim, StoreError> {
    let r = parse(record, raw)?;
    if !r.done {
        return Err(malformed(record, r.version, "not a completed record"));
    }
    if r.fingerprint != *fingerprint {
        return Ok(Claim::Mismatch);
    }
    let outcome = r.outcome().map_err(|why| malformed(record, r.version, &why))?;
    Ok(Claim::Completed(Record { fingerprint: r.fingerprint, outcome }))
}

/// A record as stored (see the module docs of `redis`), its fields checked.
pub(super) struct Parsed<'a> {
    pub(super) version: &'static str,
    pub(super) done: bool,
    pub(super) fence: u64,
    /// The lease end (ms since the epoch) in flight; empty once done.
    pub(super) lease_end: Option<u64>,
    pub(super) fingerprint: Fingerprint,
    /// The outcome kind once done; the owner token in flight.
    pub(super) seventh: &'a str,
    /// When the record entered its state (ms since the epoch); `None` in version 2 records.
    pub(super) since: Option<u64>,
    /// The origin field as stored, checked (empty in version 2 records): decoded only by the
    /// operator's side ([`Parsed::origin`]), a replay does not need it.
    origin: &'a str,
    pub(super) payload: &'a str,
}

impl Parsed<'_> {
    /// The stored origin; `None` when the record has none (version 2).
    pub(super) fn origin(&self) -> Option<StoredOrigin> {
        decode_origin(self.origin).ok().flatten()
    }

    /// The outcome of a completed record, or what is wrong with it.
    pub(super) fn outcome(&self) -> Result<Outcome, String> {
        outcome_of(self.seventh, self.payload)
    }
}

fn malformed(record: &str, version: &str, what: &str) -> StoreError {
    StoreError::Incompatible(format!(
        "record {record} (schema version {version}) is malformed: {what}"
    ))
}

/// Reads a record of this version, or of version 2 (no since, no origin: they read as unknown).
/// `record` names it in errors. The record is checked as UTF-8 once, whole (the payload is JSON
/// text, every other field ASCII), then split at its separators; a replay pays this for each
/// record it reads.
pub(super) fn parse<'a>(record: &str, raw: &'a [u8]) -> Result<Parsed<'a>, StoreError> {
    let version = raw.split(|&b| b == b'|').next().unwrap_or_default();
    let (version, count): (&'static str, usize) = if version == SCHEMA_VERSION.as_bytes() {
        (SCHEMA_VERSION, 10)
    } else if version == b"2" {
        ("2", 8)
    } else {
        let shown = String::from_utf8_lossy(&version[..version.len().min(16)]);
        return Err(StoreError::Incompatible(format!(
            "record {record} has schema version {shown:?}"
        )));
    };
    let bad = |what: &str| malformed(record, version, what);
    let raw = std::str::from_utf8(raw)
        .map_err(|e| bad(&format!("not UTF-8 (at byte {})", e.valid_up_to())))?;
    // On the stack: a replay parses one record per call. The separators are found by a plain
    // byte loop over the header (about a hundred bytes), which costs a replay a third of what
    // `str::splitn`'s searcher does; the payload, last, may hold `|`.
    let mut fields: [&str; 10] = [""; 10];
    let mut start = 0;
    for slot in &mut fields[..count - 1] {
        let Some(len) = raw.as_bytes()[start..].iter().position(|&b| b == b'|') else {
            return Err(bad(&format!("fewer than {count} fields")));
        };
        *slot = &raw[start..start + len];
        start += len + 1;
    }
    fields[count - 1] = &raw[start..];
    let (state, fence, waited, lease_end, fp, seventh) =
        (fields[1], fields[2], fields[3], fields[4], fields[5], fields[6]);
    let digits = |f: &str| f.bytes().all(|b| b.is_ascii_digit());
    let number = |f: &str| f.parse::<u64>().ok();
    let done = match state {
        "d" => true,
        "f" => false,
        _ => return Err(bad("state")),
    };
    let Some(fence) = number(fence).filter(|_| digits(fence)) else { return Err(bad("fence")) };
    if waited != "0" && waited != "1" {
        return Err(bad("waited-on flag"));
    }
    if !digits(lease_end) || (!done && lease_end.is_empty()) {
        return Err(bad("lease end"));
    }
    let Some(fingerprint) = Fingerprint::parse(fp) else { return Err(bad("fingerprint")) };
    let (since, origin, payload) = if count == 10 {
        let since = fields[7];
        if !digits(since) {
            return Err(bad("since"));
        }
        if !origin_valid(fields[8]) {
            return Err(bad("origin"));
        }
        (number(since), fields[8], fields[9])
    } else {
        (None, "", fields[7])
    };
    Ok(Parsed {
        version,
        done,
        fence,
        lease_end: if done { None } else { number(lease_end) },
        fingerprint,
        seventh,
        since,
        origin,
        payload,
    })
}

/// The characters escaped in a stored origin: the record's separator, the origin's own, and `%`.
const ORIGIN_ESCAPED: &AsciiSet = &CONTROLS.add(b'%').add(b'|').add(b',');

/// An origin as the record stores it: `o` then tool, tenant and run, percent-escaped and joined
/// with `,`. An empty field means no origin is known (records of version 2).
pub(super) fn encode_origin(origin: &Origin<'_>) -> String {
    let mut out = String::new();
    write_origin(&mut out, origin);
    out
}

/// [`encode_origin`] appended to `out`.
pub(super) fn write_origin(out: &mut String, origin: &Origin<'_>) {
    out.push('o');
    for (i, part) in [origin.tool, origin.tenant, origin.run].into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        // Each escaped piece is pushed as it comes: most origins need no escape at all.
        out.extend(utf8_percent_encode(part, ORIGIN_ESCAPED));
    }
}

/// Whether `field` is an origin [`decode_origin`] reads; without copying it (an origin without
/// escapes decodes in place). An origin without `%` (most: tool names and run ids need no
/// escape) only needs its three parts.
fn origin_valid(field: &str) -> bool {
    if field.is_empty() {
        return true;
    }
    let Some(body) = field.strip_prefix('o') else { return false };
    if !body.contains('%') {
        return body.bytes().filter(|&b| b == b',').count() == 2;
    }
    let mut parts = 0;
    for part in body.split(',') {
        parts += 1;
        if percent_decode_str(part).decode_utf8().is_err() {
            return false;
        }
    }
    parts == 3
}

fn decode_origin(field: &str) -> Result<Option<StoredOrigin>, ()> {
    if field.is_empty() {
        return Ok(None);
    }
    let body = field.strip_prefix('o').ok_or(())?;
    let mut parts = body.split(',').map(|p| percent_decode_str(p).decode_utf8().map_err(drop));
    let (Some(tool), Some(tenant), Some(run), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(());
    };
    Ok(Some(StoredOrigin {
        tool: tool?.into_owned(),
        tenant: tenant?.into_owned(),
        run: run?.into_owned(),
    }))
}

/// Whether `record` is a completed record of this version (`V|d|..`), which a claim replays as
/// it is; anything else (in flight, an earlier version) is the claim script's to read.
pub(super) fn is_completed(record: &[u8]) -> bool {
    record
        .strip_prefix(super::SCHEMA_VERSION.as_bytes())
        .is_some_and(|rest| rest.starts_with(b"|d|"))
}

/// A server's error reply as its code and text (`NOPERM this user has no permissions ...`).
pub(super) fn error_text(e: &redis::ServerError) -> String {
    format!("{} {}", e.code(), e.details().unwrap_or_default())
}

/// The error for what Redis refused the store's user or database (see [`refused_access`]).
pub(super) fn refused(why: impl std::fmt::Display) -> StoreError {
    StoreError::InvalidConfig(format!(
        "Redis refused the store's user or database (check the URL's user, password and \
         database, and the user's ACL: the store runs GET, SET, DEL, EVALSHA, EVAL (or SCRIPT LOAD), \
         TIME, PUBLISH, SUBSCRIBE, SCAN, INFO and CLUSTER SLOTS, on its prefix's keys): {why}"
    ))
}

/// Whether the reply to a command that failed with `e` may have been lost after the server ran
/// it (an I/O error, a dropped connection, a response timeout): such a command is sent again.
pub(super) fn lost(e: &RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped()
}

/// `e` as the failure of one send: [`Failed::Lost`] when its reply may have been [`lost`].
pub(super) fn failed(e: RedisError) -> crate::store::resend::Failed {
    use crate::store::resend::Failed;
    if lost(&e) { Failed::Lost(unavailable(e)) } else { Failed::Answered(unavailable(e)) }
}

pub(super) fn unavailable(e: RedisError) -> StoreError {
    if refused_access(&e) {
        return refused(e);
    }
    // The redis crate words a timeout as "timed out", which does not say what waited.
    if e.is_timeout() {
        return StoreError::timed_out(format!(
            "Redis did not answer within the store's timeouts (the server is busy, not \
             answering, or out of reach): {e}"
        ));
    }
    StoreError::unavailable(e)
}

/// Whether Redis refused the user or the database rather than the command's moment: a wrong or
/// missing password, an ACL without a command the store needs (also from inside a script), a
/// database number the server does not have. Sending again cannot help: a configuration error,
/// not an outage. `code` and `text` as an error reply gives them.
fn refusal(code: Option<&str>, text: &str) -> bool {
    matches!(code, Some("NOAUTH" | "WRONGPASS" | "NOPERM"))
        // Redis 7.0's words for a command a script ran that the ACL denies (code `ERR`).
        || text.contains("can't run this command")
        || text.contains("DB index is out of range")
}

/// [`refusal`] for an error the client returned.
pub(super) fn refused_access(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::AuthenticationFailed || refusal(e.code(), &e.to_string())
}

/// [`refusal`] for an error reply among a pipeline's or a cluster's answers.
pub(super) fn server_refused(e: &redis::ServerError) -> bool {
    refusal(Some(e.code()), e.details().unwrap_or_default())
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
        Some("refused") => Err(refused(items.get(1).map(text).unwrap_or_default())),
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

/// The outcome of a completed record, or what is wrong with it. The payload was checked as
/// UTF-8 with the whole record ([`parse`]).
fn outcome_of(kind: &str, payload: &str) -> Result<Outcome, String> {
    // Success and failure carry their payload; unknown carries nothing.
    match kind {
        "s" => Ok(Outcome::Success(payload.to_owned())),
        "f" => Ok(Outcome::Failure(payload.to_owned())),
        "u" if payload.is_empty() => Ok(Outcome::Unknown),
        "n" => Ok(Outcome::NotStorable(payload.to_owned())),
        "u" => Err("unknown outcome has a payload".to_owned()),
        other => Err(format!("unknown outcome kind {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::{decode_origin, origin_valid};

    /// The check a replay makes (with its shortcut for origins without escapes) agrees with the
    /// decoding the operator's listing does.
    #[test]
    fn an_origin_is_valid_exactly_when_it_decodes() {
        for (field, valid) in [
            ("", true),
            ("ocharge,,run-1", true),
            ("ocharge,acme,run-1", true),
            ("ocharge%2Cv2,acme,run%7C1", true),
            ("ocharge,acme", false),
            ("ocharge,acme,run,extra", false),
            ("o%2C,%2C", false),
            ("ocharge,acme,%ff", false),
            ("charge,acme,run", false),
        ] {
            assert_eq!(origin_valid(field), valid, "{field:?}");
            assert_eq!(decode_origin(field).is_ok(), valid, "{field:?}");
        }
        let origin = decode_origin("ocharge%2Cv2,acme,run%7C1").unwrap().unwrap();
        assert_eq!((origin.tool.as_str(), origin.run.as_str()), ("charge,v2", "run|1"));
    }
}
