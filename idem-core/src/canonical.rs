//! JCS (RFC 8785, the JSON Canonicalization Scheme) with exact integers, written straight from
//! typed values by a `serde::Serializer`, with the stricter rules of `docs/key-spec.md`, where
//! they are specified with test vectors.
//!
//! Objects are written member by member into the output while each member's byte span is
//! remembered; when the members did not arrive in key order (UTF-16 code units, RFC 8785 §3.2.3),
//! the object's bytes are reordered once through a scratch buffer. The span stack, key buffer and
//! scratch buffer are kept per thread, so a warm call allocates nothing beyond the output.

use std::cell::Cell;
use std::cmp::Ordering;
use std::fmt::{self, Write as _};

use serde::Serialize;
use serde::ser::{self, Impossible};

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
    /// A map key is neither a string nor an integer (JSON object keys are strings; integers are
    /// written as their decimal text, as serde_json does).
    #[error(
        "{} is a map whose keys are neither strings nor integers; use string (or integer) keys",
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
    /// The value's `Serialize` implementation failed, or produced something that is not one JSON
    /// value. The message says where.
    #[error(
        "arguments could not be serialized: {0}; fix the argument type's Serialize implementation"
    )]
    Custom(String),
}

fn describe(path: &str) -> String {
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
/// that are not strings or integers, [`KeyError::DuplicateKey`] when two map keys become the same
/// string, [`KeyError::Custom`] when the value's `Serialize` fails. On error `out` is left as it
/// was.
pub fn canonicalize<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) -> Result<(), KeyError> {
    let mark = out.len();
    let mut canon = Canon { out, bufs: Buffers::take(), depth: 0, nest: 0, wrappers: 0 };
    let mut result = value.serialize(&mut canon);
    if result.is_ok() && canon.depth != 0 {
        result = Err(unfinished());
    }
    let Canon { out, bufs, .. } = canon;
    bufs.give_back();
    result.map_err(|e| {
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

// ---------------------------------------------------------------------------------------------
// Errors inside the serializer: boxed so that `Result<(), Fail>` stays one word on the hot path;
// the path is collected innermost first while the error travels up, so the success path pays
// nothing for it.

struct Fail(Box<FailInner>);

struct FailInner {
    kind: Kind,
    path: Vec<Seg>,
}

enum Kind {
    NonFinite(&'static str),
    NonStringKey,
    DuplicateKey,
    TooDeep,
    Custom(String),
}

enum Seg {
    Key(String),
    Index(usize),
}

impl Fail {
    fn new(kind: Kind) -> Self {
        Fail(Box::new(FailInner { kind, path: Vec::new() }))
    }
    fn at(mut self, seg: Seg) -> Self {
        self.0.path.push(seg);
        self
    }
    fn in_variant(self, variant: Option<&'static str>) -> Self {
        match variant {
            Some(v) => self.at(Seg::Key(v.to_owned())),
            None => self,
        }
    }
    fn path(&self) -> String {
        let mut path = PathText::default();
        for seg in self.0.path.iter().rev() {
            match seg {
                Seg::Index(i) => path.index(*i),
                Seg::Key(k) => path.key(k),
            }
        }
        path.finish()
    }
    fn into_key_error(self) -> KeyError {
        let path = self.path();
        match self.0.kind {
            Kind::NonFinite(value) => KeyError::NonFinite { path, value },
            Kind::NonStringKey => KeyError::NonStringKey { path },
            Kind::DuplicateKey => KeyError::DuplicateKey { path },
            Kind::TooDeep => KeyError::TooDeep { path, limit: crate::limits::MAX_DEPTH },
            Kind::Custom(msg) if path.is_empty() => KeyError::Custom(msg),
            Kind::Custom(msg) => KeyError::Custom(format!("at `{path}`: {msg}")),
        }
    }
}

/// A path as errors show it (`items[2].price`, `meta["a.b"]`), built outermost first. Paths of
/// data nested past the depth limit are long: after [`PathText::MAX_CHARS`] bytes the rest is
/// counted, not written (`[0][0]…[0] … (+90 levels)`).
#[derive(Default)]
pub(crate) struct PathText {
    out: String,
    omitted: usize,
}

impl PathText {
    const MAX_CHARS: usize = 120;

    fn full(&mut self) -> bool {
        if self.out.len() >= Self::MAX_CHARS {
            self.omitted += 1;
            return true;
        }
        false
    }
    pub(crate) fn index(&mut self, i: usize) {
        if !self.full() {
            let _ = write!(self.out, "[{i}]");
        }
    }
    pub(crate) fn key(&mut self, k: &str) {
        if self.full() {
            return;
        }
        if is_plain(k) {
            if !self.out.is_empty() {
                self.out.push('.');
            }
            self.out.push_str(k);
        } else {
            let mut quoted = Vec::with_capacity(k.len() + 2);
            write_str(&mut quoted, k.as_bytes());
            let _ = write!(self.out, "[{}]", String::from_utf8_lossy(&quoted));
        }
    }
    pub(crate) fn finish(mut self) -> String {
        if self.omitted > 0 {
            let _ = write!(self.out, "… (+{} levels)", self.omitted);
        }
        self.out
    }
}

fn is_plain(k: &str) -> bool {
    !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn unfinished() -> Fail {
    Fail::new(Kind::Custom(
        "a Serialize implementation left a sequence or map unfinished".to_owned(),
    ))
}

impl fmt::Debug for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("canonical JSON error")
    }
}

impl fmt::Display for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0.kind {
            Kind::NonFinite(v) => write!(f, "{v} has no JSON form"),
            Kind::NonStringKey => f.write_str("map key is neither a string nor an integer"),
            Kind::DuplicateKey => f.write_str("duplicate object member"),
            Kind::TooDeep => f.write_str("nested too deep"),
            Kind::Custom(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for Fail {}

impl ser::Error for Fail {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Fail::new(Kind::Custom(msg.to_string()))
    }
}

// ---------------------------------------------------------------------------------------------
// Buffers reused across calls on one thread. A nested `canonicalize` (from inside a Serialize
// impl) finds the cell empty and allocates its own.

#[derive(Default)]
struct Buffers {
    /// Raw (unescaped) UTF-8 names of map members in the open objects.
    keys: Vec<u8>,
    /// Members of the open objects, innermost last.
    members: Vec<Member>,
    /// Holds an object's bytes while they are written back in order.
    scratch: Vec<u8>,
}

/// Buffers larger than this are dropped after use instead of kept for the next call.
const KEEP_BYTES: usize = 64 * 1024;
const KEEP_MEMBERS: usize = 1024;

thread_local! {
    static POOL: Cell<Option<Buffers>> = const { Cell::new(None) };
}

impl Buffers {
    fn take() -> Buffers {
        POOL.try_with(Cell::take).ok().flatten().unwrap_or_default()
    }
    fn give_back(mut self) {
        if self.keys.capacity() + self.scratch.capacity() > KEEP_BYTES
            || self.members.capacity() > KEEP_MEMBERS
        {
            return;
        }
        self.keys.clear();
        self.members.clear();
        self.scratch.clear();
        let _ = POOL.try_with(|p| p.set(Some(self)));
    }
    fn key(&self, key: KeyRef) -> &[u8] {
        key_bytes(&self.keys, key)
    }
}

#[derive(Clone, Copy)]
enum KeyRef {
    /// A struct field name.
    Static(&'static str),
    /// A map key, as a range of `Buffers::keys`.
    Buf(usize, usize),
}

fn key_bytes(keys: &[u8], key: KeyRef) -> &[u8] {
    match key {
        KeyRef::Static(s) => s.as_bytes(),
        KeyRef::Buf(a, b) => keys.get(a..b).unwrap_or_default(),
    }
}

/// One object member: its name and the span of `"name":value` in the output.
#[derive(Clone, Copy)]
struct Member {
    key: KeyRef,
    start: usize,
    end: usize,
}

/// Compares two UTF-8 strings by their UTF-16 code units (RFC 8785 §3.2.3) without decoding.
///
/// UTF-8 byte order is code point order, and so is UTF-16 order except where a character in
/// U+E000..=U+FFFF (lead byte 0xEE or 0xEF) meets a supplementary character (lead byte 0xF0..=0xF4),
/// which UTF-16 writes as surrogates 0xD800..=0xDFFF, below 0xE000. Equal prefixes keep
/// character boundaries aligned, so the first differing bytes are both lead bytes or both
/// continuation bytes (0x80..=0xBF, never in the exceptional range).
fn cmp_utf16(a: &[u8], b: &[u8]) -> Ordering {
    for (&x, &y) in a.iter().zip(b) {
        if x != y {
            let exceptional = x >= 0xEE && y >= 0xEE && (x >= 0xF0) != (y >= 0xF0);
            return if exceptional { y.cmp(&x) } else { x.cmp(&y) };
        }
    }
    a.len().cmp(&b.len())
}

// ---------------------------------------------------------------------------------------------
// Leaves.

/// What RFC 8785 §3.2.2.2 escapes: 0 = nothing, `u` = `\u00xx`, else the letter after `\`.
static ESCAPE: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = b'u';
        i += 1;
    }
    t[0x08] = b'b';
    t[0x09] = b't';
    t[0x0a] = b'n';
    t[0x0c] = b'f';
    t[0x0d] = b'r';
    t[b'"' as usize] = b'"';
    t[b'\\' as usize] = b'\\';
    t
};

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Appends the escaped contents of a string (without quotes). Only ASCII bytes are escaped, so
/// valid UTF-8 stays valid.
fn escape_into(out: &mut Vec<u8>, bytes: &[u8]) {
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let e = ESCAPE[usize::from(b)];
        if e == 0 {
            continue;
        }
        out.extend_from_slice(&bytes[run..i]);
        if e == b'u' {
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ]);
        } else {
            out.extend_from_slice(&[b'\\', e]);
        }
        run = i + 1;
    }
    out.extend_from_slice(&bytes[run..]);
}

fn write_str(out: &mut Vec<u8>, bytes: &[u8]) {
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    escape_into(out, bytes);
    out.push(b'"');
}

fn write_int<I: itoa::Integer>(out: &mut Vec<u8>, v: I) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// 2^53: every integer of smaller magnitude is exactly one double.
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_992.0;

fn write_f64(out: &mut Vec<u8>, v: f64) -> Result<(), Fail> {
    if !v.is_finite() {
        let name = if v.is_nan() {
            "NaN"
        } else if v > 0.0 {
            "inf"
        } else {
            "-inf"
        };
        return Err(Fail::new(Kind::NonFinite(name)));
    }
    if v == 0.0 {
        // ECMAScript prints -0 as "0".
        out.push(b'0');
    } else if v.fract() == 0.0 && v.abs() < MAX_SAFE_INTEGER {
        // Fast path for whole amounts: below 2^53 every integer is a double one unit or less
        // from its neighbours, so its shortest round-trip digits are its exact decimal digits,
        // which is what Number::toString prints for values below 1e21.
        write_int(out, v as i64);
    } else {
        out.extend_from_slice(ryu_js::Buffer::new().format_finite(v).as_bytes());
    }
    Ok(())
}

/// `fmt::Write` into the output, escaping as a JSON string body.
struct Escaping<'a>(&'a mut Vec<u8>);

impl fmt::Write for Escaping<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        escape_into(self.0, s.as_bytes());
        Ok(())
    }
}

/// `fmt::Write` into a byte buffer, unescaped.
struct Bytes<'a>(&'a mut Vec<u8>);

impl fmt::Write for Bytes<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The serializer.

/// serde_json's private struct names for `RawValue` and (with `arbitrary_precision`) `Number`:
/// a one-field struct whose field is the JSON text.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";
const NUMBER_TOKEN: &str = "$serde_json::private::Number";

struct Canon<'o> {
    out: &'o mut Vec<u8>,
    bufs: Buffers,
    /// Open arrays and objects: a Serialize impl that abandons one is caught at the end.
    depth: usize,
    /// Open `[` and `{` in the output (enum variants' wrapping objects included): the JSON
    /// nesting that [`crate::limits::MAX_DEPTH`] bounds, as serde_json's parser counts it.
    nest: usize,
    /// Values being written that write nothing of their own (`Some`, newtype structs): bounded
    /// too, so a recursive type cannot recurse without limit while writing only `null`.
    wrappers: usize,
}

impl<'o> Canon<'o> {
    /// One more level of JSON nesting, refused past the limit (the caller writes the bracket).
    fn enter(&mut self) -> Result<(), Fail> {
        if self.nest >= crate::limits::MAX_DEPTH {
            return Err(Fail::new(Kind::TooDeep));
        }
        self.nest += 1;
        Ok(())
    }
    fn leave(&mut self, levels: usize) {
        self.nest = self.nest.saturating_sub(levels);
    }
    /// Writes a wrapper's inner value, refused past the wrapper limit.
    fn wrapped<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Fail> {
        if self.wrappers >= crate::limits::MAX_WRAPPERS {
            return Err(Fail::new(Kind::TooDeep));
        }
        self.wrappers += 1;
        let result = value.serialize(&mut *self);
        self.wrappers -= 1;
        result
    }
    fn open_variant(&mut self, variant: &'static str) -> Result<(), Fail> {
        self.enter()?;
        self.out.push(b'{');
        write_str(self.out, variant.as_bytes());
        self.out.push(b':');
        Ok(())
    }
    fn seq(&mut self, variant: Option<&'static str>) -> Result<Seq<'_, 'o>, Fail> {
        if let Some(v) = variant {
            self.open_variant(v)?;
        }
        if let Err(e) = self.enter() {
            self.leave(usize::from(variant.is_some()));
            return Err(e.in_variant(variant));
        }
        self.out.push(b'[');
        self.depth += 1;
        let depth = self.depth;
        Ok(Seq { ser: self, index: 0, variant, depth })
    }
    fn object(&mut self, variant: Option<&'static str>) -> Result<Obj<'_, 'o>, Fail> {
        if let Some(v) = variant {
            self.open_variant(v)?;
        }
        if let Err(e) = self.enter() {
            self.leave(usize::from(variant.is_some()));
            return Err(e.in_variant(variant));
        }
        self.out.push(b'{');
        self.depth += 1;
        Ok(Obj {
            start: self.out.len(),
            base: self.bufs.members.len(),
            keys_base: self.bufs.keys.len(),
            sorted: true,
            pending: None,
            variant,
            depth: self.depth,
            ser: self,
        })
    }
    /// Writes a JSON number given as text (serde_json's `arbitrary_precision` Number, and the
    /// numbers of a `RawValue` when that feature is on) exactly as serde_json without the feature
    /// reads it: an integer within `u64` / `i64` exactly, anything else (a fraction, an exponent,
    /// a larger integer) as the nearest `f64`. So a feature another crate turns on changes no key.
    fn number_text(&mut self, text: &str) -> Result<(), Fail> {
        let (negative, digits) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            // serde_json reads `-0` as the float -0.0, written `0` like the integer.
            if negative {
                if let Ok(v) = text.parse::<i64>() {
                    write_int(self.out, v);
                    return Ok(());
                }
            } else if let Ok(v) = digits.parse::<u64>() {
                write_int(self.out, v);
                return Ok(());
            }
        }
        match text.parse::<f64>() {
            Ok(v) => write_f64(self.out, v),
            Err(_) => Err(ser::Error::custom(format_args!("`{text}` is not a JSON number"))),
        }
    }
}

impl<'a, 'o> ser::Serializer for &'a mut Canon<'o> {
    type Ok = ();
    type Error = Fail;
    type SerializeSeq = Seq<'a, 'o>;
    type SerializeTuple = Seq<'a, 'o>;
    type SerializeTupleStruct = Seq<'a, 'o>;
    type SerializeTupleVariant = Seq<'a, 'o>;
    type SerializeMap = Obj<'a, 'o>;
    type SerializeStruct = Struct<'a, 'o>;
    type SerializeStructVariant = Obj<'a, 'o>;

    fn serialize_bool(self, v: bool) -> Result<(), Fail> {
        self.out.extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<(), Fail> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_i16(self, v: i16) -> Result<(), Fail> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_i32(self, v: i32) -> Result<(), Fail> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_i64(self, v: i64) -> Result<(), Fail> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_i128(self, v: i128) -> Result<(), Fail> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> Result<(), Fail> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_u16(self, v: u16) -> Result<(), Fail> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_u32(self, v: u32) -> Result<(), Fail> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_u64(self, v: u64) -> Result<(), Fail> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_u128(self, v: u128) -> Result<(), Fail> {
        write_int(self.out, v);
        Ok(())
    }
    fn serialize_f32(self, v: f32) -> Result<(), Fail> {
        // Exact widening, as JavaScript (and serde_json::Value) would hold the number.
        write_f64(self.out, f64::from(v))
    }
    fn serialize_f64(self, v: f64) -> Result<(), Fail> {
        write_f64(self.out, v)
    }
    fn serialize_char(self, v: char) -> Result<(), Fail> {
        write_str(self.out, v.encode_utf8(&mut [0; 4]).as_bytes());
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), Fail> {
        write_str(self.out, v.as_bytes());
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Fail> {
        // As serde_json: an array of numbers.
        self.out.push(b'[');
        for (i, b) in v.iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            write_int(self.out, *b);
        }
        self.out.push(b']');
        Ok(())
    }
    fn serialize_none(self) -> Result<(), Fail> {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Fail> {
        self.wrapped(value)
    }
    fn serialize_unit(self) -> Result<(), Fail> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Fail> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Fail> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Fail> {
        self.wrapped(value)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Fail> {
        self.open_variant(variant)?;
        value.serialize(&mut *self).map_err(|e| e.in_variant(Some(variant)))?;
        self.leave(1);
        self.out.push(b'}');
        Ok(())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Seq<'a, 'o>, Fail> {
        self.seq(None)
    }
    fn serialize_tuple(self, _len: usize) -> Result<Seq<'a, 'o>, Fail> {
        self.seq(None)
    }
    fn serialize_tuple_struct(self, _name: &'static str, _len: usize) -> Result<Seq<'a, 'o>, Fail> {
        self.seq(None)
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Seq<'a, 'o>, Fail> {
        self.seq(Some(variant))
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Obj<'a, 'o>, Fail> {
        self.object(None)
    }
    fn serialize_struct(self, name: &'static str, _len: usize) -> Result<Struct<'a, 'o>, Fail> {
        Ok(match name {
            RAW_VALUE_TOKEN => Struct::Raw(self),
            NUMBER_TOKEN => Struct::Number(self),
            _ => Struct::Obj(self.object(None)?),
        })
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Obj<'a, 'o>, Fail> {
        self.object(Some(variant))
    }
    fn collect_str<T: fmt::Display + ?Sized>(self, value: &T) -> Result<(), Fail> {
        self.out.push(b'"');
        write!(Escaping(self.out), "{value}").map_err(ser::Error::custom)?;
        self.out.push(b'"');
        Ok(())
    }
}

/// An array: sequences, tuples, tuple structs and tuple variants.
struct Seq<'a, 'o> {
    ser: &'a mut Canon<'o>,
    index: usize,
    variant: Option<&'static str>,
    depth: usize,
}

impl Seq<'_, '_> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Fail> {
        if self.index > 0 {
            self.ser.out.push(b',');
        }
        value
            .serialize(&mut *self.ser)
            .map_err(|e| e.at(Seg::Index(self.index)).in_variant(self.variant))?;
        self.index += 1;
        Ok(())
    }
    fn finish(self) -> Result<(), Fail> {
        if self.ser.depth != self.depth {
            return Err(unfinished());
        }
        self.ser.depth -= 1;
        self.ser.leave(1 + usize::from(self.variant.is_some()));
        self.ser.out.push(b']');
        if self.variant.is_some() {
            self.ser.out.push(b'}');
        }
        Ok(())
    }
}

impl ser::SerializeSeq for Seq<'_, '_> {
    type Ok = ();
    type Error = Fail;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Fail> {
        self.element(value)
    }
    fn end(self) -> Result<(), Fail> {
        self.finish()
    }
}

impl ser::SerializeTuple for Seq<'_, '_> {
    type Ok = ();
    type Error = Fail;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Fail> {
        self.element(value)
    }
    fn end(self) -> Result<(), Fail> {
        self.finish()
    }
}

impl ser::SerializeTupleStruct for Seq<'_, '_> {
    type Ok = ();
    type Error = Fail;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Fail> {
        self.element(value)
    }
    fn end(self) -> Result<(), Fail> {
        self.finish()
    }
}

impl ser::SerializeTupleVariant for Seq<'_, '_> {
    type Ok = ();
    type Error = Fail;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Fail> {
        self.element(value)
    }
    fn end(self) -> Result<(), Fail> {
        self.finish()
    }
}

/// An object: maps, structs and struct variants. Members are written in arrival order and
/// reordered in `finish` when needed.
struct Obj<'a, 'o> {
    ser: &'a mut Canon<'o>,
    /// Output offset just after `{`.
    start: usize,
    /// This object's first entry in `Buffers::members`.
    base: usize,
    /// This object's first byte in `Buffers::keys`.
    keys_base: usize,
    /// Whether the members so far arrived in strictly increasing key order.
    sorted: bool,
    /// A map key written, waiting for its value: the key and the member's start.
    pending: Option<(KeyRef, usize)>,
    variant: Option<&'static str>,
    depth: usize,
}

impl Obj<'_, '_> {
    /// Starts a member: the separating comma, then returns where the member begins.
    fn open_member(&mut self) -> usize {
        if self.ser.bufs.members.len() > self.base {
            self.ser.out.push(b',');
        }
        self.ser.out.len()
    }
    fn push(&mut self, key: KeyRef, start: usize) {
        let bufs = &mut self.ser.bufs;
        if self.sorted
            && let Some(prev) = bufs.members.last().filter(|_| bufs.members.len() > self.base)
        {
            self.sorted = cmp_utf16(bufs.key(prev.key), bufs.key(key)) == Ordering::Less;
        }
        bufs.members.push(Member { key, start, end: self.ser.out.len() });
    }
    fn field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), Fail> {
        let start = self.open_member();
        write_str(self.ser.out, key.as_bytes());
        self.ser.out.push(b':');
        value
            .serialize(&mut *self.ser)
            .map_err(|e| e.at(Seg::Key(key.to_owned())).in_variant(self.variant))?;
        self.push(KeyRef::Static(key), start);
        Ok(())
    }
    fn fail(&self, kind: Kind) -> Fail {
        Fail::new(kind).in_variant(self.variant)
    }
    fn finish(self) -> Result<(), Fail> {
        if self.ser.depth != self.depth || self.pending.is_some() {
            return Err(unfinished());
        }
        self.ser.depth -= 1;
        self.ser.leave(1 + usize::from(self.variant.is_some()));
        let Canon { out, bufs, .. } = &mut *self.ser;
        let Buffers { keys, members, scratch } = bufs;
        let mine = members.get_mut(self.base..).unwrap_or_default();
        if !self.sorted {
            mine.sort_unstable_by(|a, b| cmp_utf16(key_bytes(keys, a.key), key_bytes(keys, b.key)));
            if let Some(pair) =
                mine.windows(2).find(|w| key_bytes(keys, w[0].key) == key_bytes(keys, w[1].key))
            {
                let name = String::from_utf8_lossy(key_bytes(keys, pair[0].key)).into_owned();
                return Err(Fail::new(Kind::DuplicateKey)
                    .at(Seg::Key(name))
                    .in_variant(self.variant));
            }
            scratch.clear();
            scratch.extend_from_slice(out.get(self.start..).unwrap_or_default());
            out.truncate(self.start);
            for (i, m) in mine.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                let span = scratch
                    .get(m.start.saturating_sub(self.start)..m.end.saturating_sub(self.start));
                out.extend_from_slice(span.unwrap_or_default());
            }
        }
        members.truncate(self.base);
        keys.truncate(self.keys_base);
        out.push(b'}');
        if self.variant.is_some() {
            out.push(b'}');
        }
        Ok(())
    }
}

impl ser::SerializeMap for Obj<'_, '_> {
    type Ok = ();
    type Error = Fail;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Fail> {
        if self.pending.is_some() {
            return Err(self.fail(Kind::Custom("a map key was given twice in a row".to_owned())));
        }
        let start = self.open_member();
        let from = self.ser.bufs.keys.len();
        key.serialize(KeySer(&mut self.ser.bufs.keys)).map_err(|e| e.in_variant(self.variant))?;
        let to = self.ser.bufs.keys.len();
        write_str(self.ser.out, self.ser.bufs.keys.get(from..to).unwrap_or_default());
        self.ser.out.push(b':');
        self.pending = Some((KeyRef::Buf(from, to), start));
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Fail> {
        let Some((key, start)) = self.pending.take() else {
            return Err(self.fail(Kind::Custom("a map value came without its key".to_owned())));
        };
        if let Err(e) = value.serialize(&mut *self.ser) {
            let name = String::from_utf8_lossy(self.ser.bufs.key(key)).into_owned();
            return Err(e.at(Seg::Key(name)).in_variant(self.variant));
        }
        self.push(key, start);
        Ok(())
    }
    fn end(self) -> Result<(), Fail> {
        self.finish()
    }
}

impl ser::SerializeStructVariant for Obj<'_, '_> {
    type Ok = ();
    type Error = Fail;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Fail> {
        self.field(key, value)
    }
    fn end(self) -> Result<(), Fail> {
        self.finish()
    }
}

/// A struct, or one of serde_json's private one-field structs that carry JSON text.
enum Struct<'a, 'o> {
    Obj(Obj<'a, 'o>),
    Raw(&'a mut Canon<'o>),
    Number(&'a mut Canon<'o>),
}

/// The JSON text inside a serde_json private struct's field (a string).
fn json_text<T: Serialize + ?Sized>(value: &T) -> Result<String, Fail> {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => Ok(s),
        Ok(_) => Err(ser::Error::custom("serde_json's private JSON text is not a string")),
        Err(e) => Err(ser::Error::custom(e)),
    }
}

impl ser::SerializeStruct for Struct<'_, '_> {
    type Ok = ();
    type Error = Fail;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Fail> {
        match self {
            Struct::Obj(obj) => obj.field(key, value),
            Struct::Raw(ser) => {
                // Parsed like any JSON arguments, then canonicalised like a serde_json::Value.
                let text = json_text(value)?;
                let parsed: serde_json::Value = serde_json::from_str(&text)
                    .map_err(|e| ser::Error::custom(format_args!("invalid raw JSON: {e}")))?;
                parsed.serialize(&mut **ser)
            }
            Struct::Number(ser) => ser.number_text(&json_text(value)?),
        }
    }
    fn skip_field(&mut self, _key: &'static str) -> Result<(), Fail> {
        Ok(())
    }
    fn end(self) -> Result<(), Fail> {
        match self {
            Struct::Obj(obj) => obj.finish(),
            Struct::Raw(_) | Struct::Number(_) => Ok(()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Map keys: strings as they are, integers as their decimal text (as serde_json does); anything
// else has no unambiguous string form.

struct KeySer<'k>(&'k mut Vec<u8>);

fn non_string_key<T>() -> Result<T, Fail> {
    Err(Fail::new(Kind::NonStringKey))
}

macro_rules! int_keys {
    ($($f:ident: $t:ty),*) => {$(
        fn $f(self, v: $t) -> Result<(), Fail> {
            write_int(self.0, v);
            Ok(())
        }
    )*};
}

impl ser::Serializer for KeySer<'_> {
    type Ok = ();
    type Error = Fail;
    type SerializeSeq = Impossible<(), Fail>;
    type SerializeTuple = Impossible<(), Fail>;
    type SerializeTupleStruct = Impossible<(), Fail>;
    type SerializeTupleVariant = Impossible<(), Fail>;
    type SerializeMap = Impossible<(), Fail>;
    type SerializeStruct = Impossible<(), Fail>;
    type SerializeStructVariant = Impossible<(), Fail>;

    int_keys!(
        serialize_i8: i8, serialize_i16: i16, serialize_i32: i32, serialize_i64: i64,
        serialize_i128: i128, serialize_u8: u8, serialize_u16: u16, serialize_u32: u32,
        serialize_u64: u64, serialize_u128: u128
    );

    fn serialize_str(self, v: &str) -> Result<(), Fail> {
        self.0.extend_from_slice(v.as_bytes());
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), Fail> {
        self.0.extend_from_slice(v.encode_utf8(&mut [0; 4]).as_bytes());
        Ok(())
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Fail> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Fail> {
        value.serialize(self)
    }
    fn collect_str<T: fmt::Display + ?Sized>(self, value: &T) -> Result<(), Fail> {
        write!(Bytes(self.0), "{value}").map_err(ser::Error::custom)
    }

    fn serialize_bool(self, _v: bool) -> Result<(), Fail> {
        non_string_key()
    }
    fn serialize_f32(self, _v: f32) -> Result<(), Fail> {
        non_string_key()
    }
    fn serialize_f64(self, _v: f64) -> Result<(), Fail> {
        non_string_key()
    }
    fn serialize_bytes(self, _v: &[u8]) -> Result<(), Fail> {
        non_string_key()
    }
    fn serialize_none(self) -> Result<(), Fail> {
        non_string_key()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _value: &T) -> Result<(), Fail> {
        non_string_key()
    }
    fn serialize_unit(self) -> Result<(), Fail> {
        non_string_key()
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Fail> {
        non_string_key()
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<(), Fail> {
        non_string_key()
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, Fail> {
        non_string_key()
    }
    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, Fail> {
        non_string_key()
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct, Fail> {
        non_string_key()
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, Fail> {
        non_string_key()
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, Fail> {
        non_string_key()
    }
    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStruct, Fail> {
        non_string_key()
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, Fail> {
        non_string_key()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use proptest::prelude::*;
    use serde::Serialize;
    use serde_json::json;

    use super::*;
    use crate::limits::{MAX_DEPTH, drop_flat, nested_arrays};

    fn canon<T: Serialize + ?Sized>(v: &T) -> String {
        match to_canonical_string(v) {
            Ok(s) => s,
            Err(e) => panic!("canonicalize failed: {e}"),
        }
    }

    #[test]
    fn strings_use_the_minimal_escapes_of_rfc_8785() {
        assert_eq!(canon("\u{8}\t\n\u{c}\r\"\\"), r#""\b\t\n\f\r\"\\""#);
        assert_eq!(canon("\u{0}\u{1}\u{b}\u{1f}"), r#""\u0000\u0001\u000b\u001f""#);
        // DEL, '/', non-ASCII and astral characters are written raw.
        assert_eq!(canon("\u{7f}/é€😀"), "\"\u{7f}/é€😀\"");
        assert_eq!(canon(&'\n'), r#""\n""#);
        // collect_str goes through the same escaping.
        struct Shown;
        impl Serialize for Shown {
            fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(&format_args!("a\"{}", '\u{1}'))
            }
        }
        assert_eq!(canon(&Shown), r#""a\"\u0001""#);
    }

    #[test]
    fn object_members_are_sorted_by_utf16_code_units() {
        // UTF-8 byte order would put U+FF61 before U+1F600; UTF-16 puts the surrogate pair
        // (0xD83D ..) first.
        let mut m = HashMap::new();
        for k in ["z", "\u{e9}", "\u{1F600}", "\u{FF61}", "a", "", "\u{80}", "aa"] {
            m.insert(k, 1);
        }
        assert_eq!(
            canon(&m),
            "{\"\":1,\"a\":1,\"aa\":1,\"z\":1,\"\u{80}\":1,\"\u{e9}\":1,\"\u{1F600}\":1,\"\u{FF61}\":1}"
        );
        // The example of RFC 8785 §3.2.3.
        let rfc = json!({
            "\u{20ac}": "Euro Sign", "\r": "Carriage Return", "\u{fb33}": "Hebrew Letter Dalet With Dagesh",
            "1": "One", "\u{1f600}": "Emoji: Grinning Face", "\u{80}": "Control",
            "\u{f6}": "Latin Small Letter O With Diaeresis"
        });
        assert_eq!(
            canon(&rfc),
            "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\
             \"\u{f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",\
             \"\u{1f600}\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}"
        );
    }

    #[test]
    fn struct_fields_and_nested_objects_are_sorted() {
        #[derive(Serialize)]
        struct Inner {
            z: u8,
            b: u8,
        }
        #[derive(Serialize)]
        struct Outer {
            zeta: Inner,
            alpha: Vec<Inner>,
            mid: Option<Inner>,
        }
        let v = Outer { zeta: Inner { z: 1, b: 2 }, alpha: vec![Inner { z: 3, b: 4 }], mid: None };
        assert_eq!(canon(&v), r#"{"alpha":[{"b":4,"z":3}],"mid":null,"zeta":{"b":2,"z":1}}"#);
    }

    #[test]
    fn numbers_follow_ecmascript_and_integers_stay_exact() {
        assert_eq!(canon(&1e21), "1e+21");
        assert_eq!(canon(&1e20), "100000000000000000000");
        assert_eq!(canon(&1e-7), "1e-7");
        assert_eq!(canon(&0.000001), "0.000001");
        assert_eq!(canon(&0.1), "0.1");
        assert_eq!(canon(&1.0), "1");
        assert_eq!(canon(&-0.0), "0");
        assert_eq!(canon(&5e-324), "5e-324");
        assert_eq!(canon(&f64::MAX), "1.7976931348623157e+308");
        assert_eq!(canon(&-1.5), "-1.5");
        // f32 is widened exactly, as a JavaScript Number would hold it.
        assert_eq!(canon(&0.1f32), "0.10000000149011612");
        assert_eq!(canon(&4900f32), "4900");
        assert_eq!(canon(&u64::MAX), "18446744073709551615");
        assert_eq!(canon(&i64::MIN), "-9223372036854775808");
        assert_eq!(canon(&i128::MIN), "-170141183460469231731687303715884105728");
        assert_eq!(canon(&u128::MAX), "340282366920938463463374607431768211455");
        assert_eq!(canon(&9007199254740993u64), "9007199254740993");
        assert_eq!(canon(&(-5i8, 200u8, -300i16, 70000u32)), "[-5,200,-300,70000]");
    }

    #[test]
    fn the_number_samples_of_rfc_8785_appendix_b() {
        for (bits, text) in [
            (0x0000000000000000u64, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ] {
            assert_eq!(canon(&f64::from_bits(bits)), text, "bits {bits:#018x}");
        }
        for bits in [0x7fff_ffff_ffff_ffffu64, 0x7ff0_0000_0000_0000, 0xfff0_0000_0000_0000] {
            assert!(matches!(
                to_canonical_string(&f64::from_bits(bits)),
                Err(KeyError::NonFinite { .. })
            ));
        }
    }

    #[test]
    fn non_finite_floats_are_refused_with_their_path() {
        #[derive(Serialize)]
        struct Item {
            price: f64,
        }
        #[derive(Serialize)]
        struct Order {
            items: Vec<Item>,
        }
        let order = Order {
            items: vec![Item { price: 1.0 }, Item { price: 2.0 }, Item { price: f64::NAN }],
        };
        let err = to_canonical_string(&order);
        assert_eq!(err, Err(KeyError::NonFinite { path: "items[2].price".into(), value: "NaN" }));
        assert_eq!(
            err.err().map(|e| e.to_string()).unwrap_or_default(),
            "argument `items[2].price` is NaN, which has no JSON form; pass a finite number"
        );
        assert_eq!(
            to_canonical_string(&f32::INFINITY),
            Err(KeyError::NonFinite { path: String::new(), value: "inf" })
        );
        let mut m = BTreeMap::new();
        m.insert("a.b", vec![0.0, f64::NEG_INFINITY]);
        assert_eq!(
            to_canonical_string(&m),
            Err(KeyError::NonFinite { path: r#"["a.b"][1]"#.into(), value: "-inf" })
        );
    }

    #[test]
    fn a_failed_call_leaves_the_output_as_it_was() {
        let mut out = b"prefix".to_vec();
        let r = canonicalize(&json!({"a": [1, 2]}), &mut out);
        assert_eq!(r, Ok(()));
        assert_eq!(out, br#"prefix{"a":[1,2]}"#);
        let r = canonicalize(&(1, "x", f64::NAN), &mut out);
        assert!(matches!(r, Err(KeyError::NonFinite { .. })));
        assert_eq!(out, br#"prefix{"a":[1,2]}"#);
    }

    #[derive(Serialize)]
    enum Op {
        Stop,
        Refund(u32),
        Move(i8, i8),
        Charge { cents: u64, currency: &'static str },
        Scale { factor: f64 },
    }

    #[test]
    fn enums_are_externally_tagged_like_serde_json() {
        for op in
            [Op::Stop, Op::Refund(5), Op::Move(-1, 2), Op::Charge { cents: 4900, currency: "eur" }]
        {
            let ours = canon(&op);
            let theirs = serde_json::to_value(&op).map(|v| canon(&v)).unwrap_or_default();
            assert_eq!(ours, theirs);
        }
        assert_eq!(
            canon(&Op::Charge { cents: 1, currency: "eur" }),
            r#"{"Charge":{"cents":1,"currency":"eur"}}"#
        );
        assert_eq!(canon(&Op::Move(-1, 2)), r#"{"Move":[-1,2]}"#);
        assert_eq!(
            to_canonical_string(&vec![Op::Stop, Op::Scale { factor: f64::NAN }]),
            Err(KeyError::NonFinite { path: "[1].Scale.factor".into(), value: "NaN" })
        );
    }

    #[test]
    fn unit_newtype_bytes_and_options() {
        #[derive(Serialize)]
        struct Id(u64);
        #[derive(Serialize)]
        struct Nothing;
        assert_eq!(canon(&Id(7)), "7");
        assert_eq!(canon(&Nothing), "null");
        assert_eq!(canon(&()), "null");
        assert_eq!(canon(&Option::<u8>::None), "null");
        assert_eq!(canon(&Some("x")), r#""x""#);
        struct Raw<'a>(&'a [u8]);
        impl Serialize for Raw<'_> {
            fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(self.0)
            }
        }
        assert_eq!(canon(&Raw(&[0, 7, 255])), "[0,7,255]");
        assert_eq!(canon(&Raw(&[])), "[]");
        assert_eq!(canon(&Vec::<u8>::new()), "[]");
        assert_eq!(canon(&BTreeMap::<String, u8>::new()), "{}");
    }

    #[test]
    fn map_keys_integers_become_decimal_text_others_are_refused() {
        let mut m = BTreeMap::new();
        m.insert(10u64, "ten");
        m.insert(9, "nine");
        m.insert(u64::MAX, "max");
        // Sorted as strings, not as numbers.
        assert_eq!(canon(&m), r#"{"10":"ten","18446744073709551615":"max","9":"nine"}"#);
        let mut neg = BTreeMap::new();
        neg.insert(-1i128, true);
        assert_eq!(canon(&neg), r#"{"-1":true}"#);
        let mut chars = BTreeMap::new();
        chars.insert('\n', 1);
        assert_eq!(canon(&chars), r#"{"\n":1}"#);

        let mut bad = BTreeMap::new();
        bad.insert((1, 2), 3);
        #[derive(Serialize)]
        struct Args {
            table: BTreeMap<(i32, i32), i32>,
        }
        assert_eq!(
            to_canonical_string(&Args { table: bad }),
            Err(KeyError::NonStringKey { path: "table".into() })
        );
        let mut bools = BTreeMap::new();
        bools.insert(true, 1);
        assert_eq!(
            to_canonical_string(&bools),
            Err(KeyError::NonStringKey { path: String::new() })
        );
    }

    #[test]
    fn keys_equal_after_stringification_are_refused() {
        // serde_json::Value keys may be numbers or strings; 1 and "1" would collide.
        struct Collide;
        impl Serialize for Collide {
            fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use ser::SerializeMap;
                let mut m = s.serialize_map(Some(2))?;
                m.serialize_entry("1", "string")?;
                m.serialize_entry(&1u8, "integer")?;
                m.end()
            }
        }
        #[derive(Serialize)]
        struct Args {
            meta: Collide,
        }
        assert_eq!(
            to_canonical_string(&Args { meta: Collide }),
            Err(KeyError::DuplicateKey { path: r#"meta.1"#.into() })
        );
    }

    #[test]
    fn serde_json_private_structs_carry_json_text() {
        // serde_json's RawValue and (with `arbitrary_precision`) Number serialize as a one-field
        // struct named by a private token whose field is the JSON text.
        struct Private(&'static str, &'static str);
        impl Serialize for Private {
            fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use ser::SerializeStruct;
                let mut st = s.serialize_struct(self.0, 1)?;
                st.serialize_field(self.0, self.1)?;
                st.end()
            }
        }
        let raw = |t| canon(&Private(RAW_VALUE_TOKEN, t));
        assert_eq!(raw(r#"{ "b": 1.0, "a": "\u00e9" }"#), r#"{"a":"é","b":1}"#);
        assert_eq!(raw("9007199254740993"), "9007199254740993");
        // As serde_json reads the text without `arbitrary_precision`: integers within u64 / i64
        // exactly, anything else as the nearest f64.
        let num = |t| canon(&Private(NUMBER_TOKEN, t));
        assert_eq!(num("123456789012345678901234567890"), "1.2345678901234568e+29");
        assert_eq!(num("18446744073709551615"), "18446744073709551615");
        assert_eq!(num("18446744073709551616"), "18446744073709552000");
        assert_eq!(num("-9223372036854775808"), "-9223372036854775808");
        assert_eq!(num("-9223372036854775809"), "-9223372036854776000");
        assert_eq!(num("-0"), "0");
        assert_eq!(num("4900.0"), "4900");
        assert_eq!(num("1E21"), "1e+21");
        assert!(matches!(
            to_canonical_string(&Private(NUMBER_TOKEN, "1e400")),
            Err(KeyError::NonFinite { value: "inf", .. })
        ));
        assert!(matches!(
            to_canonical_string(&Private(RAW_VALUE_TOKEN, "{")),
            Err(KeyError::Custom(_))
        ));
    }

    #[test]
    fn a_serialize_impl_that_abandons_a_map_is_an_error() {
        // Opens a map, writes a member, then fails without closing it.
        struct Half;
        impl Serialize for Half {
            fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use ser::SerializeMap;
                let mut m = s.serialize_map(None)?;
                m.serialize_entry("a", &1)?;
                Err(ser::Error::custom("half done"))
            }
        }
        // Swallows its element's error and goes on.
        struct Swallow<T>(T);
        impl<T: Serialize> Serialize for Swallow<T> {
            fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use ser::SerializeSeq;
                let mut seq = s.serialize_seq(None)?;
                let _ = seq.serialize_element(&self.0);
                seq.serialize_element(&1)?;
                seq.end()
            }
        }
        match to_canonical_string(&Swallow(Half)) {
            Err(KeyError::Custom(msg)) => assert!(msg.contains("unfinished"), "{msg}"),
            other => panic!("expected an error, got {other:?}"),
        }
        // A failed leaf leaves nothing behind: the impl chose to drop it.
        assert_eq!(canon(&Swallow(f64::NAN)), "[1]");
    }

    #[test]
    fn nested_canonicalize_inside_a_serialize_impl_gets_its_own_buffers() {
        struct Nested;
        impl Serialize for Nested {
            fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let inner =
                    to_canonical_string(&json!({"y": 1, "x": 2})).map_err(ser::Error::custom)?;
                s.serialize_str(&inner)
            }
        }
        let mut m = BTreeMap::new();
        m.insert("b", json!(1));
        m.insert("a", json!(2));
        #[derive(Serialize)]
        struct Args {
            z: u8,
            n: Nested,
            a: u8,
        }
        assert_eq!(
            canon(&Args { z: 1, n: Nested, a: 2 }),
            r#"{"a":2,"n":"{\"x\":2,\"y\":1}","z":1}"#
        );
    }

    /// Runs `f` on a thread with a 2 MiB stack (what `std::thread::spawn` gives by default).
    fn on_small_stack<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
        let handle = std::thread::Builder::new().stack_size(2 << 20).spawn(f);
        match handle.map(std::thread::JoinHandle::join) {
            Ok(Ok(r)) => r,
            _ => panic!("the thread failed"),
        }
    }

    fn too_deep(r: Result<String, KeyError>) -> String {
        match r {
            Err(KeyError::TooDeep { path, limit }) => {
                assert_eq!(limit, MAX_DEPTH);
                path
            }
            other => panic!("expected TooDeep, got {other:?}"),
        }
    }

    #[test]
    fn values_nested_to_the_limit_are_written_and_deeper_ones_refused() {
        on_small_stack(|| {
            let at = nested_arrays(MAX_DEPTH, json!(1));
            let text = canon(&at);
            assert_eq!(text.len(), 2 * MAX_DEPTH + 1);
            // What was written reads back: serde_json's parser has the same limit.
            assert!(serde_json::from_str::<serde_json::Value>(&text).is_ok());
            drop_flat(at);
            for depth in [MAX_DEPTH + 1, 100_000] {
                let past = nested_arrays(depth, json!(1));
                let path = too_deep(to_canonical_string(&past));
                assert!(path.starts_with("[0][0]") && path.ends_with("levels)"), "{path}");
                drop_flat(past);
            }
        });
    }

    #[test]
    fn objects_and_enum_variants_count_as_json_levels() {
        #[derive(Serialize)]
        enum E {
            Wrap(Box<E>),
            Pair(Box<E>, u8),
            Leaf,
        }
        fn chain(n: usize, pair: bool) -> E {
            let mut e = E::Leaf;
            for _ in 0..n {
                e = if pair { E::Pair(Box::new(e), 0) } else { E::Wrap(Box::new(e)) };
            }
            e
        }
        // `{"Wrap":` is one level per variant; `{"Pair":[` two.
        assert!(to_canonical_string(&chain(MAX_DEPTH, false)).is_ok());
        too_deep(to_canonical_string(&chain(MAX_DEPTH + 1, false)));
        let half = MAX_DEPTH / 2;
        assert!(to_canonical_string(&chain(half, true)).is_ok());
        let path = too_deep(to_canonical_string(&chain(half + 1, true)));
        assert!(path.starts_with("Pair[0].Pair[0]"), "{path}");
        // Objects: {"a":{"a":...}}
        let mut v = json!(1);
        for _ in 0..=MAX_DEPTH {
            v = json!({ "a": v });
        }
        assert!(too_deep(to_canonical_string(&v)).starts_with("a.a.a"));
        drop_flat(v);
    }

    #[test]
    fn a_long_chain_of_wrappers_is_refused_without_overflow() {
        // A recursive type that writes only `null` at the end of 100,000 `Some`s.
        #[derive(Serialize)]
        struct Node(Option<Box<Node>>);
        on_small_stack(|| {
            let build = |n: usize| {
                let mut node = Node(None);
                for _ in 0..n {
                    node = Node(Some(Box::new(node)));
                }
                node
            };
            assert_eq!(canon(&build(10)), "null");
            let deep = build(100_000);
            too_deep(to_canonical_string(&deep));
            // Dropping it would recurse as deep as it is.
            std::mem::forget(deep);
        });
    }

    #[test]
    fn raw_json_inside_counts_from_where_it_sits() {
        // serde_json's RawValue: a private one-field struct holding JSON text.
        struct Raw(&'static str);
        impl Serialize for Raw {
            fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use ser::SerializeStruct;
                let mut st = s.serialize_struct(RAW_VALUE_TOKEN, 1)?;
                st.serialize_field(RAW_VALUE_TOKEN, self.0)?;
                st.end()
            }
        }
        // The raw text inside `n` arrays.
        struct Inside(usize, &'static str);
        impl Serialize for Inside {
            fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use ser::SerializeSeq;
                if self.0 == 0 {
                    return Raw(self.1).serialize(s);
                }
                let mut seq = s.serialize_seq(Some(1))?;
                seq.serialize_element(&Inside(self.0 - 1, self.1))?;
                seq.end()
            }
        }
        assert!(to_canonical_string(&Inside(MAX_DEPTH - 2, "[[1]]")).is_ok());
        assert!(to_canonical_string(&Inside(MAX_DEPTH - 2, "[{}]")).is_ok());
        too_deep(to_canonical_string(&Inside(MAX_DEPTH - 2, "[[[1]]]")));
        too_deep(to_canonical_string(&Inside(MAX_DEPTH - 2, "{\"a\":[{}]}")));
    }

    proptest! {
        #[test]
        fn cmp_utf16_matches_encode_utf16(a in "\\PC{0,6}", b in "\\PC{0,6}") {
            let expected = a.encode_utf16().cmp(b.encode_utf16());
            prop_assert_eq!(cmp_utf16(a.as_bytes(), b.as_bytes()), expected);
        }

        #[test]
        fn cmp_utf16_on_mixed_planes(a in "[a\u{e9}\u{ff61}\u{1f600}\u{10ffff}\u{e000}]{0,4}",
                                     b in "[a\u{e9}\u{ff61}\u{1f600}\u{10ffff}\u{e000}]{0,4}") {
            prop_assert_eq!(cmp_utf16(a.as_bytes(), b.as_bytes()), a.encode_utf16().cmp(b.encode_utf16()));
        }

        #[test]
        fn strings_round_trip_through_serde_json(s in "\\PC*|[\\x00-\\x20\"\\\\]*") {
            let text = canon(&s);
            prop_assert_eq!(serde_json::from_str::<String>(&text).ok(), Some(s.clone()));
            // Identical to serde_json's own escaping except for the control characters it
            // writes in uppercase hex.
            let theirs = serde_json::to_string(&s).unwrap_or_default();
            prop_assert_eq!(text.to_lowercase(), theirs.to_lowercase());
        }

        #[test]
        fn whole_floats_below_2_pow_53_print_as_ryu_js_does(n in -(1i64 << 53)..=(1i64 << 53)) {
            let v = n as f64;
            let want = if n == 0 { "0".to_owned() } else { ryu_js::Buffer::new().format_finite(v).to_owned() };
            prop_assert_eq!(canon(&v), want);
        }

        #[test]
        fn floats_parse_back_to_the_same_number(bits in any::<u64>()) {
            let v = f64::from_bits(bits);
            prop_assume!(v.is_finite());
            let text = canon(&v);
            prop_assert_eq!(text.parse::<f64>().ok(), Some(if v == 0.0 { 0.0 } else { v }));
        }
    }
}
