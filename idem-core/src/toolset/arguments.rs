//! The arguments a model sends, parsed into a tool's typed arguments with errors that name the
//! field and say that nothing was executed.

use std::collections::HashMap;
use std::fmt::{Display, Write as _};

use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use serde_path_to_error::{Path, Segment};

use crate::json_text::{self, JSON_WHITESPACE};

/// The arguments of one call as the model sent them. In every shape, a JSON string holding an
/// object's text is that object (arguments encoded twice, as some models and OpenAI-compatible
/// servers send them), with the key of the object sent plainly, and one holding no text (or
/// `null`) is `{}`, as that text is in `Text` (bridges that pass OpenAI's `arguments` on send
/// `""` for a tool without parameters); any other string is refused.
#[derive(Clone, Copy, Debug)]
pub enum Arguments<'a> {
    /// Parsed JSON (Anthropic `input`, MCP `arguments`).
    Json(&'a Value),
    /// JSON text (OpenAI `function.arguments`). Empty text, JSON whitespace alone (space, tab,
    /// line feed, carriage return: RFC 8259 §2) and `null` mean `{}`, as an absent or `null`
    /// value does in the other shapes.
    Text(&'a str),
    /// None sent (MCP `arguments` is optional): `{}`.
    Absent,
}

impl<'a> Arguments<'a> {
    /// A call's arguments member: absent or `null` is [`Arguments::Absent`]; a string is JSON
    /// text where the format sends text (`text`: OpenAI's `arguments`), and any other value is
    /// parsed JSON.
    pub(super) fn of(value: Option<&'a Value>, text: bool) -> Self {
        match value {
            None | Some(Value::Null) => Arguments::Absent,
            Some(Value::String(s)) if text => Arguments::Text(s),
            Some(other) => Arguments::Json(other),
        }
    }
}

/// Parses the model's arguments into the tool's type, or says what is wrong, naming the field.
pub(super) fn parse<A: DeserializeOwned>(tool: &str, args: Arguments<'_>) -> Result<A, String> {
    // Arguments encoded twice: the object inside the string (json_text::twice_encoded).
    match args {
        Arguments::Json(Value::String(s)) if json_text::is_object_text(s) => {
            return parse(tool, Arguments::Text(s));
        }
        Arguments::Json(Value::String(s)) if json_text::is_no_arguments_text(s) => {
            return parse(tool, Arguments::Absent);
        }
        Arguments::Text(text) => {
            if let Some(inner) = json_text::twice_encoded(text) {
                return parse(tool, Arguments::Text(&inner));
            }
            if json_text::is_no_arguments_string(text) {
                return parse(tool, Arguments::Absent);
            }
        }
        _ => {}
    }
    let empty = Value::Object(Map::new());
    let value = match args {
        Arguments::Json(v) => {
            // Deserializing recurses as deep as the value nests: measure it first, without
            // recursion (JSON text is bounded the same way by serde_json's parser).
            crate::limits::check_value_depth(v).map_err(|e| {
                format!("invalid arguments for `{tool}`: {e}; nothing was executed")
            })?;
            v
        }
        Arguments::Absent => &empty,
        // Only JSON's own whitespace: other blank characters (U+00A0, U+3000) are not JSON, and
        // text that is not JSON must not run a tool as if it had no arguments.
        Arguments::Text(text) if matches!(text.trim_matches(JSON_WHITESPACE), "" | "null") => {
            &empty
        }
        Arguments::Text(text) => {
            // One rule for argument text on every front door (json_text::check_arguments): one
            // object, unique member names at any depth, every value representable. Then straight
            // from the text into the typed arguments: a `Value` would turn integers beyond 64
            // bits into floats.
            json_text::check_arguments(tool, text)?;
            let mut de = serde_json::Deserializer::from_str(text);
            return match serde_path_to_error::deserialize(&mut de) {
                Ok(args) => {
                    de.end().map(|()| args).map_err(|e| json_text::not_json(tool, text, &e))
                }
                Err(e) => match repaired_text(text, &e) {
                    Repaired::Read(args) => Ok(args),
                    Repaired::Refused(why) => Err(arguments_refused(
                        tool,
                        &why.unwrap_or_else(|| text_refusal::<A>(text, &e)),
                    )),
                    Repaired::TooMany(most) => Err(too_many_repairs(tool, most)),
                },
            };
        }
    };
    if !value.is_object() {
        return Err(json_text::not_an_object(tool, value));
    }
    serde_path_to_error::deserialize(value).or_else(|e| match repaired_value(value, &e) {
        Repaired::Read(args) => Ok(args),
        Repaired::Refused(why) => Err(arguments_refused(tool, &why.unwrap_or_else(|| refusal(&e)))),
        Repaired::TooMany(most) => Err(too_many_repairs(tool, most)),
    })
}

/// What reading whole numbers as integers gave.
enum Repaired<A> {
    Read(A),
    /// A refusal that is not such a number, or a number that is not whole: what it says
    /// ([`refusal`]), or `None` when it is the first refusal (which the caller reports).
    Refused(Option<String>),
    /// More such numbers than [`repairs_allowed`] (the number it allowed): the first refusal
    /// names a value that would have been read, so the caller is told about the limit instead.
    TooMany(usize),
}

fn too_many_repairs(tool: &str, most: usize) -> String {
    format!(
        "invalid arguments for `{tool}`: {}; nothing was executed. Send integers (`5`)",
        too_many(most)
    )
}

fn too_many(most: usize) -> String {
    format!(
        "more than {most} numbers are written with a fraction or an exponent (`5.0`, `1e3`) \
         where integers are expected, and at most {most} are read as the integers they equal \
         ({MAX_REPAIRS} in arguments of up to {} KiB, fewer in larger ones)",
        REPAIR_BYTES / MAX_REPAIRS / 1024
    )
}

/// JSON Schema's `integer` is any number with a zero fractional part (JSON Schema Validation
/// 2020-12, §6.1.1), so `5.0`, `1e3` and `-0` are integers under the schema a tool publishes;
/// clients that pass numbers through a float (Python's, many model SDKs') send them so, and
/// serde refuses a float for an integer type. Tried only after the typed read was refused, and
/// only where it was refused: the number at the refused field is written as the integer it
/// equals and the arguments are read again, up to [`repairs_allowed`] times. Nothing else changes,
/// so a float a parameter accepts (an `f64`, a `Value`, an untagged enum's float variant) is
/// read as sent, and the key (derived from the typed arguments) is the integer's.
/// [`Repaired::Refused`] when the refused value is not such a number, with the refusal the
/// repairs stopped at (none for the first, which the caller has); [`Repaired::TooMany`] past
/// the limit.
///
/// serde reads some parts whole before it types what they hold (an internally tagged enum, the
/// object of a `#[serde(flatten)]` field), and its refusal there names the part, not the number.
/// Inside such a part, the first number (in the text's order; in a parsed value, its maps'
/// order) written with a fraction or an exponent that equals the refused one, zero's sign
/// included, is read as the integer, and the next read refuses the number again if it was not
/// the one. serde's refusal does not say which it was, so another float of that part holding
/// the same number (an `f64`, a `Value`, an untagged enum's float variant) may take the integer
/// first; once the arguments read, each such guess that they read without is undone
/// ([`unneeded_undone_in_text`]), so that float is read as sent (and a whole one an untagged
/// enum reads as its float variant is refused by `same_key.rs`). An untagged enum that
/// no variant matched names no number: its whole numbers are read as integers one at a time
/// until a variant matches, or none is left (or [`MAX_REPAIRS`] were), and the enum's refusal
/// stands. A float refused where no integer is expected (a string, a boolean) is not touched,
/// so the refusal quotes what was sent.
///
/// From text, the number's own digits decide (`1.0000000000000001` and `1e-400` are not whole,
/// though their doubles are), and the integer is exact at any width a parameter holds.
fn repaired_text<A: DeserializeOwned>(
    text: &str,
    first: &serde_path_to_error::Error<serde_json::Error>,
) -> Repaired<A> {
    let mut text = text.to_owned();
    let (mut path, mut inner) = (first.path().clone(), first.inner().classify());
    let mut at = (first.inner().line(), first.inner().column());
    // The refusal the repairs stopped at, once one was made: reported instead of the first,
    // whose value was read.
    let mut latest = None;
    let refused = |latest: &Option<serde_path_to_error::Error<serde_json::Error>>, text: &str| {
        Repaired::Refused(latest.as_ref().map(|e| text_refusal::<A>(text, e)))
    };
    let mut said = first.inner().to_string();
    let most = repairs_allowed(text.len());
    // Each repair: where its integer starts, the number as it was written, and whether it was
    // a guess (a number found inside a part serde named, not at the refused path).
    let mut done: Vec<Done> = Vec::new();
    for repairs in 0..=most {
        if !may_want_an_integer(&said) {
            return refused(&latest, &text);
        }
        // serde_json reads a 128-bit integer by scanning digits itself, and refuses `1e3` there
        // with a syntax error whose path names the field or the array holding it (`v` for
        // `v[0]`): its position names the number instead.
        let syntax = inner == serde_json::error::Category::Syntax;
        let mut guessed = false;
        let range = syntax.then(|| number_at(&text, at)).flatten().or_else(|| {
            match token_at(&text, &path)? {
                (start, end) if text[start..end].starts_with(['{', '[']) => {
                    guessed = true;
                    Refused::of(&said).and_then(|r| float_token_in(&text, (start, end), r))
                }
                range => Some(range),
            }
        });
        let Some((start, end)) = range else { return refused(&latest, &text) };
        let Some(integer) = integer_text(&text[start..end]) else {
            return refused(&latest, &text);
        };
        if repairs == most {
            return if Refused::names_no_number(&said) {
                refused(&latest, &text)
            } else {
                Repaired::TooMany(most)
            };
        }
        let sent = text[start..end].to_owned();
        rewrite(&mut text, &mut done, start, sent.len(), &integer);
        done.push(Done { start, sent, guessed });
        let mut de = serde_json::Deserializer::from_str(&text);
        match serde_path_to_error::deserialize::<_, A>(&mut de) {
            Ok(args) => {
                if de.end().is_err() {
                    return Repaired::Refused(None);
                }
                return Repaired::Read(unneeded_undone_in_text(text, done, args));
            }
            Err(e) => {
                (path, inner) = (e.path().clone(), e.inner().classify());
                at = (e.inner().line(), e.inner().column());
                said = e.inner().to_string();
                latest = Some(e);
            }
        }
    }
    Repaired::Refused(None)
}

/// `text` read as `A` with its whole numbers written as floats (`5.0`, `1e3`) read as the
/// integers they equal where `A` refused them, as for a model's arguments (see
/// [`repaired_text`]), or what `A` refuses, said as for arguments ([`text_refusal`]: "field
/// `amount`: invalid type: floating point `4900.5`, expected u64"). For JSON that did not come
/// from serde: a result an operator gave (`idem resolve --happened`), read back when a call
/// replays it.
pub(crate) fn with_whole_numbers_as_integers<A: DeserializeOwned>(text: &str) -> Result<A, String> {
    let mut de = serde_json::Deserializer::from_str(text);
    let first = match serde_path_to_error::deserialize::<_, A>(&mut de) {
        Err(first) => first,
        // A 128-bit integer is read by scanning its digits, which stop at `.` or `e`: a result
        // that is one such number (`5.0`, `5e2`) reads as its first digits, and the rest is
        // left over.
        Ok(read) => {
            let Err(left_over) = de.end() else { return Ok(read) };
            let at = number_at(text, (left_over.line(), left_over.column()));
            let whole = at.and_then(|(start, end)| {
                let mut text = text.to_owned();
                text.replace_range(start..end, &integer_text(&text[start..end])?);
                serde_json::from_str(&text).ok()
            });
            return whole.ok_or_else(|| match serde_json::from_str::<Value>(text) {
                Ok(value) => match serde_path_to_error::deserialize::<_, A>(&value) {
                    Err(again) => quoted_as_sent(refusal(&again), text, at),
                    Ok(_) => without_position(&left_over.to_string()).to_owned(),
                },
                Err(_) => without_position(&left_over.to_string()).to_owned(),
            });
        }
    };
    match repaired_text(text, &first) {
        Repaired::Read(read) => Ok(read),
        Repaired::Refused(why) => Err(why.unwrap_or_else(|| text_refusal::<A>(text, &first))),
        Repaired::TooMany(most) => Err(too_many(most)),
    }
}

/// The byte range of the number token around serde_json's error position (one-based line and
/// column, the column in bytes).
fn number_at(text: &str, (line, column): (usize, usize)) -> Option<(usize, usize)> {
    let line_start: usize =
        text.split_inclusive('\n').take(line.checked_sub(1)?).map(str::len).sum();
    let at = (line_start + column.checked_sub(1)?).min(text.len());
    let in_number = |b: &u8| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E');
    let bytes = text.as_bytes();
    let start = at - bytes[..at].iter().rev().take_while(|b| in_number(b)).count();
    let end = at + bytes[at..].iter().take_while(|b| in_number(b)).count();
    (start < end).then_some((start, end))
}

/// The same from a parsed value, where only the double is left: whole and below 2^53 in
/// magnitude (from 2^53 on a double may be a neighbour of the integer written:
/// `9007199254740993.0` reads as 2^53, and running a tool with a number the client did not
/// send is worse than refusing it).
fn repaired_value<A: DeserializeOwned>(
    value: &Value,
    first: &serde_path_to_error::Error<serde_json::Error>,
) -> Repaired<A> {
    const EXACT: f64 = 9_007_199_254_740_992.0;
    let sent = value;
    let mut value = value.clone();
    // Whether a repair was made inside a part serde named, not at the path it refused.
    let mut guessed = false;
    let mut path = first.path().clone();
    let mut latest: Option<serde_path_to_error::Error<serde_json::Error>> = None;
    let refused = |latest: &Option<serde_path_to_error::Error<serde_json::Error>>| {
        Repaired::Refused(latest.as_ref().map(refusal))
    };
    let mut said = first.inner().to_string();
    let most = repairs_allowed(text_size(&value));
    for repairs in 0..=most {
        if !may_want_an_integer(&said) {
            return refused(&latest);
        }
        let Some(mut target) = value_at(&mut value, &path) else { return refused(&latest) };
        if target.is_object() || target.is_array() {
            guessed = true;
            let inside = Refused::of(&said).and_then(|r| float_in(target, r));
            let Some(number) = inside else { return refused(&latest) };
            target = number;
        }
        let f = match target {
            Value::Number(n) if n.is_f64() => n.as_f64(),
            _ => None,
        };
        let Some(f) = f.filter(|f| f.fract() == 0.0 && f.abs() < EXACT) else {
            // In the integer's range, but where a double may be a neighbour of the integer
            // written: what reached the tool set was a double, not the client's digits.
            let ty = expected_integer(&said).map(|(_, ty, ..)| ty);
            if let (Some(whole), Some(ty)) = (f.filter(|f| f.fract() == 0.0), ty)
                && out_of_range(&said).is_none()
            {
                let at = path.to_string();
                let field = if at == "." { String::new() } else { format!("field `{at}`: ") };
                return Repaired::Refused(Some(format!(
                    "{field}the number `{}` for {ty} is a whole number beyond 2^53 held as a \
                     64-bit float, which may differ from the integer the client wrote in its \
                     last digits; send it as an integer (digits only, no fraction or exponent); \
                     a parsed JSON value holds every integer beyond 64 bits as such a float: \
                     pass the arguments as text (`ToolSet::call_text`) to keep its digits",
                    Value::from(whole)
                )));
            }
            return refused(&latest);
        };
        if repairs == most {
            return if Refused::names_no_number(&said) {
                refused(&latest)
            } else {
                Repaired::TooMany(most)
            };
        }
        // Exact: a whole double below 2^53 converts without rounding.
        #[allow(clippy::cast_possible_truncation)]
        let integer = f as i64;
        *target = Value::from(integer);
        match serde_path_to_error::deserialize::<_, A>(&value) {
            Ok(args) if guessed => {
                return Repaired::Read(unneeded_undone_in_value(sent, value, args));
            }
            Ok(args) => return Repaired::Read(args),
            Err(e) => {
                path = e.path().clone();
                said = e.inner().to_string();
                latest = Some(e);
            }
        }
    }
    Repaired::Refused(None)
}

/// A repair made in argument text.
#[derive(Clone)]
struct Done {
    /// Where the integer it wrote starts.
    start: usize,
    /// The number as the client wrote it.
    sent: String,
    /// Found inside a part serde named, not at the path it refused: maybe not the refused one.
    guessed: bool,
}

/// Replaces `len` bytes of `text` at `start` with `with`, moving the repairs in `done` that lie
/// beyond it.
fn rewrite(text: &mut String, done: &mut [Done], start: usize, len: usize, with: &str) {
    text.replace_range(start..start + len, with);
    for d in done.iter_mut().filter(|d| d.start > start) {
        d.start = (d.start + with.len()) - len;
    }
}

/// After the repairs read the arguments: each guessed repair but the last is undone when the
/// arguments still read without it. Inside a part serde reads whole, or an untagged enum no
/// variant took, the number a repair wrote may not be the one refused (serde did not say
/// which): a float another parameter takes (an `f64`, a `Value`, an untagged enum's float
/// variant) is then read as sent, as it would be alone, and `same_key.rs` sees it as sent. The
/// last repair made the arguments read, so it is kept. At most one more read per guess.
fn unneeded_undone_in_text<A: DeserializeOwned>(
    mut text: String,
    mut done: Vec<Done>,
    mut read: A,
) -> A {
    let Some(last) = done.len().checked_sub(1) else { return read };
    for i in 0..last {
        let Done { start, ref sent, guessed } = done[i];
        if !guessed {
            continue;
        }
        // The integer written: its sign and digits, up to what follows the number.
        let tail = &text[start..];
        let len = tail.find(|c: char| !(c.is_ascii_digit() || c == '-')).unwrap_or(tail.len());
        let (mut undone, mut moved, sent) = (text.clone(), done.clone(), sent.clone());
        rewrite(&mut undone, &mut moved, start, len, &sent);
        let mut de = serde_json::Deserializer::from_str(&undone);
        if let Ok(again) = A::deserialize(&mut de)
            && de.end().is_ok()
        {
            (text, done, read) = (undone, moved, again);
        }
    }
    read
}

/// [`unneeded_undone_in_text`] for a parsed value: the repairs are where `sent` holds a whole
/// float and `repaired` an integer, and each that the arguments read without is undone.
fn unneeded_undone_in_value<A: DeserializeOwned>(sent: &Value, mut repaired: Value, read: A) -> A {
    fn repairs(
        sent: &Value,
        repaired: &Value,
        at: &mut Vec<PathStep>,
        out: &mut Vec<Vec<PathStep>>,
    ) {
        match (sent, repaired) {
            (Value::Number(a), Value::Number(b)) if a.is_f64() && !b.is_f64() => {
                out.push(at.clone())
            }
            (Value::Array(a), Value::Array(b)) => {
                for (i, (a, b)) in a.iter().zip(b).enumerate() {
                    at.push(PathStep::Index(i));
                    repairs(a, b, at, out);
                    at.pop();
                }
            }
            (Value::Object(a), Value::Object(b)) => {
                for (name, a) in a {
                    if let Some(b) = b.get(name) {
                        at.push(PathStep::Member(name.clone()));
                        repairs(a, b, at, out);
                        at.pop();
                    }
                }
            }
            _ => {}
        }
    }
    let mut found = Vec::new();
    repairs(sent, &repaired, &mut Vec::new(), &mut found);
    if found.len() < 2 {
        return read;
    }
    let mut read = read;
    for path in &found {
        let (Some(was), Some(now)) = (node(sent, path), node(&repaired, path)) else { continue };
        let (was, now) = (was.clone(), now.clone());
        set_node(&mut repaired, path, was);
        match A::deserialize(&repaired) {
            Ok(again) => read = again,
            Err(_) => set_node(&mut repaired, path, now),
        }
    }
    read
}

/// One step of a path into a `Value` (`toolset/same_key.rs` names its paths so too).
#[derive(Clone, PartialEq)]
pub(super) enum PathStep {
    Member(String),
    Index(usize),
}

/// The node at `path` in `value`.
pub(super) fn node<'v>(value: &'v Value, path: &[PathStep]) -> Option<&'v Value> {
    path.iter().try_fold(value, |at, step| match step {
        PathStep::Member(name) => at.get(name.as_str()),
        PathStep::Index(i) => at.get(*i),
    })
}

/// The node at `path` in `value`, to change.
pub(super) fn node_mut<'v>(value: &'v mut Value, path: &[PathStep]) -> Option<&'v mut Value> {
    path.iter().try_fold(value, |at, step| match step {
        PathStep::Member(name) => at.get_mut(name.as_str()),
        PathStep::Index(i) => at.get_mut(*i),
    })
}

fn set_node(value: &mut Value, path: &[PathStep], to: Value) {
    if let Some(at) = node_mut(value, path) {
        *at = to;
    }
}

/// How many numbers of one call's arguments may be written as integers (each costs one more
/// typed read of the arguments).
const MAX_REPAIRS: usize = 64;

/// How many bytes of arguments the repairs of one call may read again in all: each repair reads
/// the whole arguments once more, so a large text (a 15 MiB stdio line) with 64 whole floats
/// would cost 64 full reads, one client's request taking seconds of CPU.
pub(super) const REPAIR_BYTES: usize = 4 << 20;

/// About how many bytes `value` takes as JSON text (its strings, and a few bytes per value):
/// what a typed read of it walks. Recursive: the arguments were checked against the depth limit
/// when they were read.
pub(super) fn text_size(value: &Value) -> usize {
    match value {
        Value::String(s) => s.len() + 2,
        Value::Array(items) => items.iter().map(|item| text_size(item) + 1).sum::<usize>() + 2,
        Value::Object(members) => {
            members.iter().map(|(name, member)| name.len() + 4 + text_size(member)).sum::<usize>()
                + 2
        }
        _ => 8,
    }
}

/// The repairs allowed for arguments of `size` bytes: [`MAX_REPAIRS`] up to 64 KiB, then fewer,
/// at least one.
fn repairs_allowed(size: usize) -> usize {
    (REPAIR_BYTES / size.max(1)).clamp(1, MAX_REPAIRS)
}

/// The digits an integer parameter may need: 39 for a `u128` or an `i128`, one more so that a
/// number just beyond is refused as out of range rather than as a float.
const MAX_INTEGER_DIGITS: usize = 40;

/// The byte range in `text` of the value at `path` (serde's path of a refusal).
fn token_at(text: &str, path: &Path) -> Option<(usize, usize)> {
    let mut raw: &RawValue = serde_json::from_str(text).ok()?;
    for segment in path.iter() {
        raw = match segment {
            Segment::Map { key } | Segment::Enum { variant: key } => {
                let members: HashMap<String, &RawValue> = serde_json::from_str(raw.get()).ok()?;
                *members.get(key)?
            }
            Segment::Seq { index } => {
                let items: Vec<&RawValue> = serde_json::from_str(raw.get()).ok()?;
                *items.get(*index)?
            }
            Segment::Unknown => return None,
        };
    }
    let start = (raw.get().as_ptr() as usize).checked_sub(text.as_ptr() as usize)?;
    Some((start, start + raw.get().len()))
}

/// The value at `path` in `value`.
fn value_at<'v>(value: &'v mut Value, path: &Path) -> Option<&'v mut Value> {
    let mut at = value;
    for segment in path.iter() {
        at = match segment {
            Segment::Map { key } | Segment::Enum { variant: key } => at.get_mut(key.as_str())?,
            Segment::Seq { index } => at.get_mut(*index)?,
            Segment::Unknown => return None,
        };
    }
    Some(at)
}

/// Which number a refusal inside a part serde read whole was about.
#[derive(Clone, Copy)]
pub(super) enum Refused {
    /// "invalid type: floating point `5.0`, expected u64": the whole number 5.
    Equal(f64),
    /// "data did not match any variant of untagged enum ..": no number named, any whole one.
    AnyWhole,
}

/// serde's words for a float refused ("invalid type: floating point `5.0`, expected u64").
const FLOAT_REFUSED: &str = "invalid type: floating point `";
/// serde's words for an untagged enum no variant took.
const NO_VARIANT: &str = "data did not match any variant of untagged enum";

impl Refused {
    /// From serde's words; `None` for any other refusal, and for a fraction.
    fn of(said: &str) -> Option<Refused> {
        if Refused::names_no_number(said) {
            return Some(Refused::AnyWhole);
        }
        let rest = said.strip_prefix(FLOAT_REFUSED)?;
        let x: f64 = rest.split_once('`')?.0.parse().ok()?;
        (x.is_finite() && x.fract() == 0.0).then_some(Refused::Equal(x))
    }

    /// An untagged enum's refusal, which names no number: more whole numbers than the repairs'
    /// limit say nothing about what it refused, which its own words still say.
    fn names_no_number(said: &str) -> bool {
        said.starts_with(NO_VARIANT)
    }

    /// Whether `f`, a whole number, may be the refused one. A zero's sign counts: serde names
    /// `-0.0` as such, and an `f64` beside it holding the other zero keeps its own.
    fn is(self, f: f64) -> bool {
        match self {
            Refused::Equal(x) => f == x && f.is_sign_negative() == x.is_sign_negative(),
            Refused::AnyWhole => true,
        }
    }
}

/// Whether a refusal may be of a whole number where an integer was expected: not when serde
/// says it refused a float and expected something else ("invalid type: floating point `5.0`,
/// expected a string"), which a repair would only make it say of a number the client did not
/// send ("integer `5`").
fn may_want_an_integer(said: &str) -> bool {
    let Some(rest) = said.strip_prefix(FLOAT_REFUSED) else { return true };
    let Some((_, expected)) = rest.split_once("`, expected ") else { return true };
    let words = expected.split(|c: char| !c.is_ascii_alphanumeric());
    words.into_iter().any(|w| w == "integer" || INTEGER_TYPES.iter().any(|(name, ..)| *name == w))
}

/// The first whole number in `value` (depth first, in the map's order) read as a float that may
/// be the refused one.
fn float_in(value: &mut Value, refused: Refused) -> Option<&mut Value> {
    let whole = |n: &serde_json::Number| {
        n.as_f64().filter(|f| n.is_f64() && f.fract() == 0.0).is_some_and(|f| refused.is(f))
    };
    if matches!(value, Value::Number(n) if whole(n)) {
        return Some(value);
    }
    match value {
        Value::Array(items) => items.iter_mut().find_map(|item| float_in(item, refused)),
        Value::Object(members) => members.values_mut().find_map(|member| float_in(member, refused)),
        _ => None,
    }
}

/// The byte range of the first number token within `range` of `text` (valid JSON) that is a
/// whole number not written as an integer and may be the refused one.
pub(super) fn float_token_in(
    text: &str,
    range: (usize, usize),
    refused: Refused,
) -> Option<(usize, usize)> {
    number_token_in(text, range, |token| {
        integer_text(token).is_some() && token.parse().is_ok_and(|f| refused.is(f))
    })
}

/// The byte range of the first number token within `range` of `text` (valid JSON) for which
/// `wanted` holds; strings are passed over.
pub(super) fn number_token_in(
    text: &str,
    (start, end): (usize, usize),
    wanted: impl Fn(&str) -> bool,
) -> Option<(usize, usize)> {
    let bytes = &text.as_bytes()[..end];
    let mut i = start;
    while i < end {
        match bytes[i] {
            b'"' => {
                // Past the string: its escapes hide no quote that ends it.
                i += 1;
                while i < end && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let from = i;
                while i < end && matches!(bytes[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
                {
                    i += 1;
                }
                if wanted(&text[from..i]) {
                    return Some((from, i));
                }
            }
            _ => i += 1,
        }
    }
    None
}

/// The integer a JSON number token equals, written as an integer, when it is one and was not
/// written so (`5.0` → `5`, `1e3` → `1000`, `-0` → `0`, `12.50e1` → `125`); `None` for a
/// fraction (`1.5`, `1e-400`, `1.0000000000000001`), for a token already written as an integer
/// (other than `-0`, which serde_json reads as a float to keep its sign), for one of more than
/// [`MAX_INTEGER_DIGITS`] digits, and for anything that is not a number.
fn integer_text(token: &str) -> Option<String> {
    let (negative, unsigned) = match token.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, token),
    };
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.strip_prefix('+').unwrap_or(e).parse::<i64>().ok()?),
        None if unsigned.contains('.') => (unsigned, 0),
        None => return (token == "-0").then(|| "0".to_owned()),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if int.is_empty() || !all_digits(int) || !all_digits(frac) {
        return None;
    }
    // The value is `digits` × 10^`scale`.
    let digits = format!("{int}{frac}");
    let scale = exponent.checked_sub(i64::try_from(frac.len()).ok()?)?;
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Some("0".to_owned());
    }
    let integer = if scale >= 0 {
        let zeros = usize::try_from(scale).ok()?;
        if digits.len().saturating_add(zeros) > MAX_INTEGER_DIGITS {
            return None;
        }
        format!("{digits}{}", "0".repeat(zeros))
    } else {
        let cut = digits.len().checked_sub(usize::try_from(scale.unsigned_abs()).ok()?)?;
        let (whole, fraction) = digits.split_at(cut);
        if whole.is_empty() || !fraction.bytes().all(|b| b == b'0') {
            return None;
        }
        if whole.len() > MAX_INTEGER_DIGITS {
            return None;
        }
        whole.to_owned()
    };
    Some(if negative { format!("-{integer}") } else { integer })
}

/// The refusal of arguments read straight from text. The text is valid JSON (checked before),
/// so a syntax error here comes from the typed read itself: serde_json reads a 128-bit integer
/// by scanning digits, and a fraction, an exponent, a sign or a string there ends as "expected
/// `,` or `}`", "number out of range" or "invalid number", with no field named. Read again from
/// the parsed value, the same mistake is said as a type error at its field; when that read
/// succeeds (a float beyond an `f32`, which the value rounds to infinity), the text's own error
/// stands. A float is quoted as the client wrote it: serde quotes the double it read
/// (`1.0000000000000001` as `1.0`, `1E2` as `100.0`), which would tell the model it sent a number
/// it did not.
fn text_refusal<A: DeserializeOwned>(
    text: &str,
    e: &serde_path_to_error::Error<serde_json::Error>,
) -> String {
    use serde_json::error::Category;
    if matches!(e.inner().classify(), Category::Syntax | Category::Eof)
        && let Ok(value) = serde_json::from_str::<Value>(text)
        && let Err(again) = serde_path_to_error::deserialize::<_, A>(&value)
    {
        return quoted_as_sent(refusal(&again), text, token_at(text, again.path()));
    }
    quoted_as_sent(refusal(e), text, token_at(text, e.path()))
}

/// `said` with the float it quotes (serde's "floating point `1.0`") written as `sent`, the
/// number's range in `text`, when that holds a number written otherwise.
fn quoted_as_sent(said: String, text: &str, sent: Option<(usize, usize)>) -> String {
    let Some(token) = sent.map(|(start, end)| &text[start..end]) else { return said };
    let Some(at) = said.find(FLOAT_REFUSED).map(|i| i + FLOAT_REFUSED.len()) else { return said };
    let Some(len) = said[at..].find('`') else { return said };
    let is_number = serde_json::from_str::<serde_json::Number>(token).is_ok();
    if !is_number || token == &said[at..at + len] {
        return said;
    }
    format!("{}{token}{}", &said[..at], &said[at + len..])
}

/// "invalid arguments for `tool`: <said>; nothing was executed, ..." for a [`refusal`].
fn arguments_refused(tool: &str, said: &str) -> String {
    if said.contains(NO_WIDE_INTEGERS) {
        return format!(
            "invalid arguments for `{tool}`: {said}; nothing was executed, and no arguments \
             can be (the tool's argument type must change)"
        );
    }
    format!(
        "invalid arguments for `{tool}`: {said}; nothing was executed, fix the arguments and \
         call again"
    )
}

/// The words of [`refusal`] for a `u128` or `i128` that serde cannot read where it is.
const NO_WIDE_INTEGERS: &str = "holds no 128-bit integers";

/// "field `a.b`: <what serde said>", a number out of range said as such ([`out_of_range`]).
fn refusal<E: Display>(e: &serde_path_to_error::Error<E>) -> String {
    let path = e.path().to_string();
    let mut msg = String::new();
    if path != "." {
        let _ = write!(msg, "field `{path}`: ");
    }
    let inner = e.inner().to_string();
    let inner = without_position(&inner);
    match out_of_range(inner) {
        Some(said) => msg.push_str(&said),
        // serde_json's words for a float its parameter's type cannot hold (1e300 for an `f32`),
        // before the position it appends.
        None => match inner.strip_prefix("number out of range") {
            Some(rest) => {
                let _ = write!(
                    msg,
                    "the number is out of range for the parameter's type (an f32 holds \
                     magnitudes up to about 3.4e38, an f64 up to about 1.8e308){rest}"
                );
            }
            // serde's default for a deserializer without 128-bit integers: the buffer serde
            // reads an internally tagged or untagged enum, or a flattened field, through.
            None if matches!(inner, "u128 is not supported" | "i128 is not supported") => {
                let ty = &inner[..4];
                let _ = write!(
                    msg,
                    "a {ty} cannot be read here, whatever the number: serde reads an internally \
                     tagged or untagged enum, or a flattened field, through a buffer that \
                     {NO_WIDE_INTEGERS}; make the enum externally or adjacently tagged, or the \
                     field a 64-bit integer or a string"
                );
            }
            None => msg.push_str(inner),
        },
    }
    msg
}

/// serde_json's message without the position it appends when it read from text (" at line 1
/// column 33"): the field is named already, and the position counts in the arguments' text,
/// which the client did not write as such (it sent an object inside a request).
fn without_position(said: &str) -> &str {
    let Some((before, at)) = said.rsplit_once(" at line ") else { return said };
    let position = at.split_once(" column ").filter(|(line, column)| {
        [line, column].iter().all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    });
    if position.is_some() { before } else { said }
}

/// The integer types serde names in its errors: name, signed, bits.
const INTEGER_TYPES: [(&str, bool, u32); 12] = [
    ("u8", false, 8),
    ("u16", false, 16),
    ("u32", false, 32),
    ("u64", false, 64),
    ("u128", false, 128),
    ("usize", false, usize::BITS),
    ("i8", true, 8),
    ("i16", true, 16),
    ("i32", true, 32),
    ("i64", true, 64),
    ("i128", true, 128),
    ("isize", true, isize::BITS),
];

/// serde's refusal of a value for an integer type, split: what it found (`invalid type:
/// floating point `5.5`), the type as serde named it (`u64`, `a nonzero u64`), and whether
/// that type is signed and its width in bits. `None` for a refusal that expects anything else.
fn expected_integer(said: &str) -> Option<(&str, &str, bool, u32)> {
    let (found, expected) = said.split_once("`, expected ")?;
    let ty = expected.strip_prefix("a nonzero ").unwrap_or(expected);
    let &(_, signed, bits) = INTEGER_TYPES.iter().find(|(name, _, _)| *name == ty)?;
    Some((found, expected, signed, bits))
}

/// serde's refusal of a number too large or too small for an integer parameter, said as that:
/// "the number 300 is out of range for u8 (an integer from 0 to 255)". `None` for every other
/// error, which is then shown as serde wrote it.
///
/// serde_json reads an integer literal beyond 64 bits as a double, so serde's own message for
/// `18446744073709551616` sent for a `u64` is "invalid type: floating point
/// `1.8446744073709552e+19`, expected u64", which tells the model it sent a fraction. A double
/// that is a whole number outside the type's range is refused as out of range instead (its
/// digits are not repeated: the double is not what the client wrote); a fraction keeps serde's
/// message. The forms matched are serde's and serde_json's (`invalid type: floating point `x`,
/// expected T`, `invalid value: integer `n`, expected T`); the unit tests pin them.
fn out_of_range(said: &str) -> Option<String> {
    let (found, expected, signed, bits) = expected_integer(said)?;
    let nonzero = expected.strip_prefix("a nonzero ");
    let ty = nonzero.unwrap_or(expected);
    // The range as text, and its bounds as doubles (powers of two, exact).
    let (min, max) = match (signed, bits) {
        (false, 128) => ("0".to_owned(), u128::MAX.to_string()),
        (false, b) => ("0".to_owned(), ((1u128 << b) - 1).to_string()),
        (true, 128) => (i128::MIN.to_string(), i128::MAX.to_string()),
        (true, b) => ((-(1i128 << (b - 1))).to_string(), ((1i128 << (b - 1)) - 1).to_string()),
    };
    // A power of two, exact in a double.
    #[allow(clippy::cast_precision_loss)]
    let half = (1u128 << (bits - 1)) as f64;
    let (below, above) = if signed { (-half, half) } else { (0.0, 2.0 * half) };
    let min = if nonzero.is_some() && !signed { "1".to_owned() } else { min };
    let what = if nonzero.is_some() { format!("a nonzero {ty}") } else { ty.to_owned() };
    let range = format!("an integer from {min} to {max}");
    if let Some(float) = found.strip_prefix("invalid type: floating point `") {
        let value: f64 = float.parse().ok()?;
        // A whole number that did not fit the integer type; a fraction is a type error.
        let whole = value.is_finite() && value.fract() == 0.0;
        // serde_json reads an integer literal of at most 64 bits as an integer, so a double at
        // -2^63 for a type of 64 bits or more is a literal below it, rounded up onto the bound.
        let edge = signed && bits >= 64 && value == below;
        return (whole && (value < below || value >= above || edge))
            .then(|| format!("the number is out of range for {what} ({range})"));
    }
    let integer = found.strip_prefix("invalid value: integer `")?;
    let value: i128 = integer.parse().ok()?;
    // Compared as integers: serde reports integers of at most 128 bits.
    let outside = match (signed, bits) {
        (false, _) if value < 0 => true,
        (false, 128) | (true, 128) => false,
        (false, b) => value > (1i128 << b) - 1,
        (true, b) => value < -(1i128 << (b - 1)) || value > (1i128 << (b - 1)) - 1,
    };
    // In range but refused (0 for a nonzero type): serde's message says why.
    outside.then(|| format!("the number {integer} is out of range for {what} ({range})"))
}

#[cfg(test)]
mod tests {
    use super::{Arguments, MAX_REPAIRS, integer_text, parse, without_position};

    #[derive(Debug, serde::Deserialize)]
    struct Batch {
        ids: Vec<u32>,
    }

    /// Whole numbers sent as floats are read as integers up to the limit; past it the refusal
    /// says so, instead of blaming `ids[0]`, a value that is read.
    #[test]
    fn whole_numbers_past_the_repair_limit_are_refused_as_such() {
        for n in [MAX_REPAIRS, MAX_REPAIRS + 1, 1000] {
            let ids: Vec<String> = (0..n).map(|i| format!("{i}.0")).collect();
            let text = format!("{{\"ids\": [{}]}}", ids.join(","));
            let value: serde_json::Value = serde_json::from_str(&text).expect("JSON");
            for args in [Arguments::Text(&text), Arguments::Json(&value)] {
                match parse::<Batch>("batch", args) {
                    Ok(batch) if n <= MAX_REPAIRS => assert_eq!(batch.ids.len(), n),
                    Err(why) if n > MAX_REPAIRS => {
                        assert!(why.contains("more than 64 numbers"), "{why}");
                        assert!(!why.contains("ids[0]"), "{why}");
                    }
                    other => panic!("{n} whole floats: {other:?}"),
                }
            }
        }
        // Where the repairs stop at a number that is not whole, that one is named, not the
        // whole one before it, which was read.
        let text = r#"{"ids": [1.0, 2.5]}"#;
        let value: serde_json::Value = serde_json::from_str(text).expect("JSON");
        for args in [Arguments::Text(text), Arguments::Json(&value)] {
            let why = parse::<Batch>("batch", args).unwrap_err();
            assert!(why.contains("`ids[1]`") && why.contains("2.5"), "{why}");
        }
        // The first refusal, when it is not a whole number, is named as before.
        let why = parse::<Batch>("batch", Arguments::Text(r#"{"ids": [2.5]}"#)).unwrap_err();
        assert!(why.contains("`ids[0]`") && why.contains("2.5"), "{why}");
    }

    #[derive(Debug, serde::Deserialize)]
    struct PaddedBatch {
        ids: Vec<u32>,
        #[allow(dead_code)]
        note: String,
    }

    /// Each repair reads the whole arguments again: in large arguments fewer are made, so that
    /// one request cannot cost 64 reads of megabytes. The refusal names the limit that applied.
    #[test]
    fn large_arguments_get_fewer_repairs() {
        let note = "x".repeat(1 << 20);
        let most = super::repairs_allowed(note.len() + 40);
        assert_eq!(most, 3, "about 1 MiB: 4 MiB of reading again, 3 repairs");
        for n in [most, most + 1] {
            let ids: Vec<String> = (0..n).map(|i| format!("{i}.0")).collect();
            let text = format!("{{\"ids\": [{}], \"note\": \"{note}\"}}", ids.join(","));
            let value: serde_json::Value = serde_json::from_str(&text).expect("JSON");
            for args in [Arguments::Text(&text), Arguments::Json(&value)] {
                match parse::<PaddedBatch>("batch", args) {
                    Ok(batch) if n == most => assert_eq!(batch.ids.len(), n),
                    Err(why) if n > most => {
                        assert!(why.contains(&format!("more than {most} numbers")), "{why}");
                        assert!(why.contains("64 in arguments of up to 64 KiB"), "{why}");
                    }
                    other => panic!("{n} whole floats: {:?}", other.map(|b| b.ids)),
                }
            }
        }
        // Small arguments keep every repair; the largest still get one.
        assert_eq!(super::repairs_allowed(64 << 10), MAX_REPAIRS);
        assert_eq!(super::repairs_allowed(100 << 20), 1);
    }

    #[test]
    fn serde_jsons_position_is_left_out_and_nothing_else() {
        for (said, shown) in [
            (
                "invalid type: string \"2\", expected u8 at line 1 column 33",
                "invalid type: string \"2\", expected u8",
            ),
            ("missing field `a` at line 3 column 1", "missing field `a`"),
            ("invalid value: \"at line 2 column 3\"", "invalid value: \"at line 2 column 3\""),
            ("unknown variant `at line 1 column x`", "unknown variant `at line 1 column x`"),
            ("expected u8", "expected u8"),
        ] {
            assert_eq!(without_position(said), shown);
        }
    }

    #[test]
    fn a_number_token_is_an_integer_only_when_its_digits_say_so() {
        for (token, integer) in [
            ("5.0", Some("5")),
            ("-0", Some("0")),
            ("-0.0e7", Some("0")),
            ("1e3", Some("1000")),
            ("1E+3", Some("1000")),
            ("12.50e1", Some("125")),
            ("-4200e-2", Some("-42")),
            ("100.000", Some("100")),
            (
                "340282366920938463463374607431768211455.0",
                Some("340282366920938463463374607431768211455"),
            ),
            ("1e39", Some("1000000000000000000000000000000000000000")),
            ("1e40", None),
            ("1e400", None),
            ("1.5", None),
            ("0.5", None),
            ("1e-400", None),
            ("1.0000000000000001", None),
            ("5", None),
            ("-5", None),
            ("\"5.0\"", None),
            ("5.0x", None),
            ("1e-9223372036854775808", None),
        ] {
            assert_eq!(integer_text(token).as_deref(), integer, "{token}");
        }
    }
}
