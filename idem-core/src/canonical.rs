//! JCS (RFC 8785, the JSON Canonicalization Scheme) with exact integers, written straight from
//! typed values by a `serde::Serializer`, with the stricter rules of `docs/key-spec.md`, where
//! they are specified with test vectors.
//!
//! Objects are written member by member into the output while each member's byte span is
//! remembered; when the members did not arrive in key order (UTF-16 code units, RFC 8785 §3.2.3),
//! the object's bytes are reordered once through a scratch buffer. The span stack, key buffer and
//! scratch buffer are kept per thread, so a warm call allocates nothing beyond the output.

use std::cell::Cell;

use serde::Serialize;

/// Why arguments cannot be canonicalised. The tool is not run.
///
/// `path` names the offending value as in the canonical JSON: object members by name, array
/// elements by index, enum variants by their tag (`items[2].price`, `op.Charge.amount`; a name
/// that is not a plain identifier is quoted: `meta["a.b"]`). It is empty for the arguments as a
/// whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// A float is NaN or infinite: JSON has no such number and the intent would be ambiguous.
    #[error("{} is {value}, which has no JSON form; pass a finite number", describe(path))]
    NonFinite {
        /// Where (`amount`, `items[2].price`).
        path: String,
        /// `NaN`, `inf` or `-inf`.
        value: &'static str,
    },
    /// A map key is neither a string, an integer nor a boolean (JSON object keys are strings;
    /// integers are written as their decimal text and booleans as `true` and `false`, as
    /// serde_json does). A float key is refused: `1.0` and `1` would be one name.
    #[error(
        "{} is a map whose keys are neither strings, integers nor booleans; use string (or integer) keys",
        describe(path)
    )]
    NonStringKey {
        /// Where the map is.
        path: String,
    },
    /// Two members of one object have the same name once map keys are written as strings (for
    /// example the integer `1` and the string `"1"`), so the intent would be ambiguous.
    #[error(
        "{} appears twice in one object once map keys are written as strings; make the keys distinct",
        describe(path)
    )]
    DuplicateKey {
        /// Where, ending with the repeated name.
        path: String,
    },
    /// Arrays and objects are nested deeper than [`MAX_DEPTH`](crate::limits::MAX_DEPTH) levels
    /// (or a chain of `Option`s, boxes and newtypes is longer than
    /// [`MAX_WRAPPERS`](crate::limits::MAX_WRAPPERS)). Checked while writing, long before the
    /// stack could run out.
    #[error(
        "{} nests arrays and objects more than {limit} levels deep; idem refuses deeper data (docs/key-spec.md, Limits)",
        describe(path)
    )]
    TooDeep {
        /// Where the first level past the limit begins (shortened when long).
        path: String,
        /// The limit: [`MAX_DEPTH`](crate::limits::MAX_DEPTH).
        limit: usize,
    },
    /// A value is a hash set (`HashSet`), which lists its members in another order in every
    /// copy (its hasher is seeded per set): the same arguments would get another key on every
    /// call, and run again. Checked for the parameters of a `#[tool]` by their declared type, and
    /// wherever the arguments write one (a field of the application's own type): the standard
    /// library's and hashbrown's sets and maps written as a sequence.
    #[error(
        "{} is a HashSet, which lists its members in another order in every copy, so the same arguments would get another key on every call and run again; declare it a BTreeSet (or a Vec in an order of your own)",
        describe(path)
    )]
    UnorderedSet {
        /// The parameter's name.
        path: String,
    },
    /// A parameter is `Some` of a value written as `null` (`Some(None)`, `Some(Value::Null)`):
    /// JSON writes it as it writes `None`, so a call with `None` would share its key and be
    /// answered with the other's outcome (a "leave it" and a "clear it" of one field). Checked for
    /// the parameters of a `#[tool]` (one marked `#[idem(skip_if_none)]` tells them apart: its
    /// `None` is left out of the key), and, on a tool set, for an explicit `null` in the model's
    /// arguments that a field reads as `Some(None)` while its absence has the same key; on a
    /// typed call, for a field below the parameters whose `Some(None)` has the key of `None`.
    #[error(
        "{} is `Some` of a value written as `null` (`Some(None)`), which the idempotency key cannot tell from `None`, so the two calls would share one key; leave `None` out of the key (`#[idem(skip_if_none)]` on a parameter, `#[serde(skip_serializing_if = \"Option::is_none\")]` on a field), or give it a type that names both cases",
        describe(path)
    )]
    AmbiguousNull {
        /// The parameter's name.
        path: String,
    },
    /// A whole number written as a float (`5.0`) that the arguments' type reads as another value
    /// than the integer the key writes (`5`, RFC 8785): an untagged enum with an integer and a
    /// float variant (`Cents(u64)`, `Dollars(f64)`) reads `5` and `5.0` as two values, and the
    /// two calls would share one key. Checked on a tool set, for a model's arguments, and on a
    /// typed call whose arguments write a whole float.
    #[error(
        "{} is `{number}`, a whole number written as a float; the idempotency key writes it as the integer it equals (RFC 8785), which the arguments' type reads as another value (an integer variant beside a float one), so two calls the tool tells apart would share one key; tag the enum (`#[serde(tag = \"..\")]`) or give its variants types that JSON tells apart",
        describe(path)
    )]
    AmbiguousNumber {
        /// Where the number is (`payment.amount`).
        path: String,
        /// The number as the tool read it (`5.0`).
        number: String,
    },
    /// A `RawValue`'s text holds a number that the canonical form writes as another one: an
    /// integer beyond 64 bits or a fraction with more digits than a 64-bit float holds (read,
    /// as serde_json reads them, as the nearest float). The tool reads the text's own digits,
    /// so two different numbers with the same nearest float would share one key, and the
    /// second call would be answered with the first's outcome.
    #[error(
        "{} holds the number `{number}`, which has more digits than a 64-bit float keeps, so another number would get the same idempotency key; send it as a string, or give it a typed field (`u128`, `i128`) that holds it exactly",
        describe(path)
    )]
    InexactNumber {
        /// Where the raw JSON is.
        path: String,
        /// The number as the text writes it.
        number: String,
    },
    /// The canonical arguments are larger than the policy allows
    /// ([`Policy::max_argument_bytes`](crate::Policy::max_argument_bytes)).
    #[error(
        "the arguments are {size} bytes as canonical JSON, more than the limit of {limit} bytes (Policy::max_argument_bytes); send less data, or pass a reference to it"
    )]
    TooLarge {
        /// Bytes of canonical JSON.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// The caller's idempotency key ([`Run::with_idempotency_key`](crate::Run::with_idempotency_key))
    /// is empty or only white space: every call of the tool in the run would share one record
    /// (an absent `Idempotency-Key` header passed on as `""`, say), and any other arguments would
    /// be refused as a reuse. The IETF Idempotency-Key draft's key is a non-empty string.
    #[error(
        "the caller's idempotency key is empty (or only white space); pass a key unique to the operation, or none to derive the key from the arguments"
    )]
    EmptyIdempotencyKey,
    /// The value's `Serialize` implementation failed, or produced something that is not one JSON
    /// value. The message says where.
    #[error(
        "arguments could not be serialized: {0}; fix the argument type's Serialize implementation"
    )]
    Custom(String),
}

pub(crate) fn describe(path: &str) -> String {
    if path.is_empty() { "the arguments".to_owned() } else { format!("argument `{path}`") }
}

/// Writes the canonical JSON text of `value` (RFC 8785, with the stricter rules of
/// `docs/key-spec.md`) to the end of `out`.
///
/// - Object members are sorted by the UTF-16 code units of their names (RFC 8785 §3.2.3); array
///   order is kept; `None`, `()` and unit structs are `null`; newtype structs are transparent;
///   enums are externally tagged as serde_json writes them; bytes are an array of numbers.
/// - Strings use the minimal escapes of RFC 8785 §3.2.2.2 (`\b \t \n \f \r \" \\`, `\u00xx` with
///   lowercase hex for other controls); everything else is raw UTF-8.
/// - Floats are written as ECMAScript `Number.prototype.toString` (RFC 8785 §3.2.2.3, via
///   `ryu-js`): `1.0` is `1`, `-0.0` is `0`, `1e21` is `1e+21`; `f32` is widened exactly to `f64`
///   first. Integers of every width (`i8`..`i128`, `u8`..`u128`) keep their exact decimal value,
///   even beyond ±2^53 where RFC 8785 would round them (two different ids never share a key).
/// - `serde_json::Value` and `serde_json::value::RawValue` are canonicalised like the typed data
///   they hold.
///
/// Errors: [`KeyError::NonFinite`] for NaN and infinities, [`KeyError::NonStringKey`] for map keys
/// that are not strings, integers or booleans, [`KeyError::DuplicateKey`] when two map keys become the same
/// string or a `RawValue`'s text names a member twice, [`KeyError::InexactNumber`] for a
/// `RawValue` number the canonical form would round, [`KeyError::UnorderedSet`] when a hash
/// set is written (its order differs in every copy), [`KeyError::Custom`] when the value's
/// `Serialize` fails. On error `out` is left as it was.
pub fn canonicalize<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) -> Result<(), KeyError> {
    let seen = canonicalize_with(value, out, true)?;
    if seen.some_nulls > 0 || seen.whole_floats {
        let _ = SEEN.try_with(|s| s.set(s.get().or(seen)));
    }
    Ok(())
}

/// What the values written by [`canonicalize`] held that JSON writes as it writes another value
/// a tool may read differently: `Some`s written as `null` (as `None` is) and whole floats
/// (written as the integer). Used to ask, only then, whether two calls share a key
/// (`toolset/same_key.rs`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Seen {
    pub(crate) some_nulls: usize,
    pub(crate) whole_floats: bool,
}

impl Seen {
    fn or(self, other: Seen) -> Seen {
        Seen {
            some_nulls: self.some_nulls.saturating_add(other.some_nulls),
            whole_floats: self.whole_floats || other.whole_floats,
        }
    }
}

thread_local! {
    /// What the [`canonicalize`] calls on this thread since the last [`take_seen`] held. A
    /// thread-local because the key is written through [`crate::Tool::write_intent`], whose
    /// result is the text only; collecting this beside the walk that writes the key costs a
    /// branch per float, where a second walk would cost a call's worth.
    static SEEN: Cell<Seen> = const { Cell::new(Seen { some_nulls: 0, whole_floats: false }) };
}

/// What the [`canonicalize`] calls on this thread held since the last call of this, and starts
/// over: a gate for a check that reads the arguments again, so that what an unrelated walk
/// left only asks once more.
pub(crate) fn take_seen() -> Seen {
    SEEN.try_with(Cell::take).unwrap_or_default()
}

/// [`canonicalize`] of a value that is not an intent (an output, a value checked for depth
/// only): a hash set is written in the order it lists its members, and the `Some`s of a value
/// written as `null` (`Some(None)`, `Some(Value::Null)`) are counted: the text cannot tell them
/// from `None`, so an output is compared with what its text reads back as by this count too.
pub(crate) fn canonicalize_counting<T: Serialize + ?Sized>(
    value: &T,
    out: &mut Vec<u8>,
) -> Result<usize, KeyError> {
    canonicalize_with(value, out, false).map(|seen| seen.some_nulls)
}

/// The canonical text of `value` with each `Some` written as `null` written as
/// [`SOME_NULL_MARK`] instead: read as JSON, the places of the `Some(None)`s, which the text
/// proper cannot tell from `None`.
pub(crate) fn with_some_nulls_marked<T: Serialize + ?Sized>(value: &T) -> Result<String, KeyError> {
    let mut out = Vec::new();
    canonicalize_marking(value, &mut out, false, true)?;
    String::from_utf8(out).map_err(|e| KeyError::Custom(e.to_string()))
}

fn canonicalize_with<T: Serialize + ?Sized>(
    value: &T,
    out: &mut Vec<u8>,
    refuse_sets: bool,
) -> Result<Seen, KeyError> {
    canonicalize_marking(value, out, refuse_sets, false)
}

fn canonicalize_marking<T: Serialize + ?Sized>(
    value: &T,
    out: &mut Vec<u8>,
    refuse_sets: bool,
    mark_some_nulls: bool,
) -> Result<Seen, KeyError> {
    let mark = out.len();
    let mut canon = Canon {
        out,
        bufs: Buffers::take(),
        depth: 0,
        nest: 0,
        wrappers: 0,
        some_nulls: 0,
        whole_floats: false,
        refuse_sets,
        mark_some_nulls,
    };
    let mut result = value.serialize(&mut canon);
    if result.is_ok() && canon.depth != 0 {
        result = Err(unfinished());
    }
    let Canon { out, bufs, some_nulls, whole_floats, .. } = canon;
    bufs.give_back();
    result.map(|()| Seen { some_nulls, whole_floats }).map_err(|e| {
        out.truncate(mark);
        e.into_key_error()
    })
}

/// The canonical JSON text of `value`; see [`canonicalize`] for the rules and errors.
pub fn to_canonical_string<T: Serialize + ?Sized>(value: &T) -> Result<String, KeyError> {
    let mut out = Vec::new();
    canonicalize(value, &mut out)?;
    String::from_utf8(out).map_err(|e| KeyError::Custom(e.to_string()))
}

mod buffers;
mod fail;
mod leaves;
mod map_keys;
mod plain;
pub(crate) mod refuse;
mod serializer;
#[cfg(test)]
mod tests;

use buffers::*;
pub(crate) use fail::PathText;
use fail::*;
use leaves::*;
use map_keys::*;
pub(crate) use plain::write_plain;
pub(crate) use serializer::SOME_NULL_MARK;
use serializer::*;
