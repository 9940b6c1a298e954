//! JSON text as callers send it, parsed with unique member names.
//!
//! RFC 8259 §4 says the names within an object SHOULD be unique and leaves the meaning of a
//! repeat to each parser; I-JSON (RFC 7493 §2.3) and RFC 8785 (canonical JSON, which keys are
//! derived from) require them to be unique. `serde_json::Value` keeps the last of two equal
//! names, so `{"to":"acct-A","to":"acct-B"}` would silently become an intent the caller may not
//! have meant. Every front door refuses such text instead ([`parse_unique`]).

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Why a JSON text was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JsonTextError {
    /// Not JSON that serde_json can represent: a syntax error, a number beyond `f64`, a lone
    /// surrogate escape, nesting deeper than [`crate::MAX_DEPTH`] (127) levels, trailing characters.
    #[error("{0}")]
    Syntax(#[source] serde_json::Error),
    /// An object names the same member twice (after unescaping: `"a"` and `"\u0061"` are equal).
    #[error("the member `{member}` appears twice in the object at `{path}`")]
    DuplicateMember {
        /// Where the object is: `.` for the top level, else like `items[2].address`.
        path: String,
        /// The repeated name.
        member: String,
    },
}

/// Parses `text` (one JSON value, surrounding whitespace allowed) into a [`Value`], refusing an
/// object that repeats a member name at any depth.
///
/// Errors: [`JsonTextError`]. serde_json's nesting limit ([`crate::MAX_DEPTH`], 127 levels) bounds both passes.
pub fn parse_unique(text: &str) -> Result<Value, JsonTextError> {
    check_unique(text)?;
    serde_json::from_str(text).map_err(JsonTextError::Syntax)
}

/// Checks `text` as [`parse_unique`] does without building a value: one JSON value that
/// serde_json can represent, with no object that repeats a member name.
///
/// Errors: [`JsonTextError`].
pub fn check_unique(text: &str) -> Result<(), JsonTextError> {
    let mut found = None;
    let mut de = serde_json::Deserializer::from_str(text);
    let checked = Unique { path: Path::Root, found: &mut found }.deserialize(&mut de);
    match (found, checked.and_then(|()| de.end())) {
        (Some(dup), _) => Err(dup),
        (None, Err(e)) => Err(JsonTextError::Syntax(e)),
        (None, Ok(())) => Ok(()),
    }
}

/// Whether two JSON texts hold the same value as stored results are compared: the same once
/// whitespace is dropped, object members are sorted by name and strings are read (`"é"` and
/// `"\u00e9"` are one string); numbers as written, so `1.0` and `1` differ and integers beyond
/// 64 bits compare exactly. `false` when either is not JSON.
pub fn same_json(a: &str, b: &str) -> bool {
    let normalized = |text: &str| {
        let raw: &serde_json::value::RawValue = serde_json::from_str(text).ok()?;
        let mut out = String::with_capacity(text.len());
        sorted_compact(raw, Compact { sets: false, read_strings: true }, &mut out).ok()?;
        Some(out)
    };
    normalized(a).is_some_and(|a| normalized(b).is_some_and(|b| a == b))
}

/// The arguments of a call to `tool` as JSON text: one object with unique member names.
///
/// Errors: the message the model reads (kind `invalid_arguments` on every front door), saying
/// what is wrong and that nothing was executed.
pub fn parse_arguments(tool: &str, text: &str) -> Result<Map<String, Value>, String> {
    match parse_unique(text) {
        Ok(Value::Object(args)) => Ok(args),
        Ok(other) => Err(not_an_object(tool, &other)),
        Err(e) => Err(not_json(tool, text, &e)),
    }
}

/// The text of an object that was sent as a JSON string holding it (`"{\"a\":1}"`): some
/// models and OpenAI-compatible servers encode a call's arguments twice. A string is never a
/// tool's arguments, so when its content is an object's text, that object is what was meant;
/// each front door reads it instead (one level only). `None` for any other text.
pub fn twice_encoded(text: &str) -> Option<String> {
    if !text.trim_start_matches(JSON_WHITESPACE).starts_with('"') {
        return None;
    }
    let inner: String = serde_json::from_str(text).ok()?;
    is_object_text(&inner).then_some(inner)
}

/// Whether `text` (a string's content) reads as an object's text: its first character after
/// JSON's whitespace opens one.
pub(crate) fn is_object_text(text: &str) -> bool {
    text.trim_start_matches(JSON_WHITESPACE).starts_with('{')
}

/// Whether `text` (a string's content) is the text of no arguments: nothing but JSON's whitespace,
/// or `null`, as OpenAI-style argument text for a tool without parameters is.
pub fn is_no_arguments_text(text: &str) -> bool {
    matches!(text.trim_matches(JSON_WHITESPACE), "" | "null")
}

/// Whether `text` is a JSON string holding the text of no arguments ([`is_no_arguments_text`]):
/// OpenAI's argument text for none, encoded once more.
pub fn is_no_arguments_string(text: &str) -> bool {
    text.trim_start_matches(JSON_WHITESPACE).starts_with('"')
        && serde_json::from_str::<String>(text).is_ok_and(|s| is_no_arguments_text(&s))
}

/// RFC 8259 §2: the whitespace JSON allows around a value.
pub(crate) const JSON_WHITESPACE: [char; 4] = [' ', '\t', '\n', '\r'];

/// Checks argument text as [`parse_arguments`] does, without building a value (one pass).
///
/// Errors: as [`parse_arguments`].
pub fn check_arguments(tool: &str, text: &str) -> Result<(), String> {
    if let Err(e) = check_unique(text) {
        return Err(not_json(tool, text, &e));
    }
    if text.trim_start().starts_with('{') {
        return Ok(());
    }
    match serde_json::from_str::<Value>(text) {
        Ok(other) => Err(not_an_object(tool, &other)),
        Err(e) => Err(not_json(tool, text, &e)),
    }
}

/// "the arguments of `tool` are not valid JSON (..); nothing was executed. Send one JSON object".
pub fn not_json(tool: &str, text: &str, e: &dyn fmt::Display) -> String {
    let mut msg = format!(
        "the arguments of `{tool}` are not valid JSON ({e}); nothing was executed. Send one JSON object"
    );
    if e.to_string().starts_with("recursion limit exceeded") {
        msg.push_str(&format!(
            " (arrays and objects may nest at most {} levels deep)",
            crate::limits::MAX_DEPTH
        ));
    }
    if e.to_string().starts_with("number out of range") {
        // Valid JSON grammar, but no double holds it (RFC 8259 §6 lets a parser limit range).
        msg.push_str(
            " (a number's magnitude must be below about 1.8e308, the largest 64-bit float)",
        );
    }
    if bare_non_finite(text) {
        msg.push_str(" (JSON has no NaN or Infinity: pass a finite number)");
    }
    msg
}

/// Whether `text` holds `NaN` or `Infinity` outside its strings, where a number belongs (what
/// JavaScript and Python write for them); inside a string they are text like any other.
fn bare_non_finite(text: &str) -> bool {
    chars_in_strings(text).any(|(i, _, in_string)| {
        !in_string && (text[i..].starts_with("NaN") || text[i..].starts_with("Infinity"))
    })
}

/// Each character of JSON `text`, with its byte offset and whether it belongs to a string (its
/// quotes included): what is outside every string is structure, whitespace, numbers and
/// literals. An escaped quote stays inside its string.
pub fn chars_in_strings(text: &str) -> impl Iterator<Item = (usize, char, bool)> + '_ {
    let (mut in_string, mut escaped) = (false, false);
    text.char_indices().map(move |(i, c)| {
        let part = in_string || c == '"';
        if !in_string {
            in_string = c == '"';
        } else if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == '"' {
            in_string = false;
        }
        (i, c, part)
    })
}

/// What kind of JSON value `value` is, for an error message: "null", "a boolean", "a number",
/// "a string", "an array" or "an object".
pub fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// "the arguments of `tool` must be a JSON object, not an array; nothing was executed".
pub fn not_an_object(tool: &str, value: &Value) -> String {
    let kind = kind(value);
    format!("the arguments of `{tool}` must be a JSON object, not {kind}; nothing was executed")
}

/// Where a value sits, as a linked list up to the root (rendered only for an error).
#[derive(Clone, Copy)]
enum Path<'a> {
    Root,
    Member(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => f.write_str("."),
            Path::Member(Path::Root, name) => f.write_str(name),
            Path::Member(parent, name) => write!(f, "{parent}.{name}"),
            Path::Index(Path::Root, i) => write!(f, "[{i}]"),
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

/// Walks one value, recording the first repeated member name in `found`.
struct Unique<'p, 'f> {
    path: Path<'p>,
    found: &'f mut Option<JsonTextError>,
}

impl<'de> DeserializeSeed<'de> for Unique<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Unique<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_i128<E>(self, _: i128) -> Result<(), E> {
        Ok(())
    }
    fn visit_u128<E>(self, _: u128) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        loop {
            let path = Path::Index(&self.path, i);
            if seq.next_element_seed(Unique { path, found: self.found })?.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = HashSet::new();
        while let Some(name) = map.next_key::<String>()? {
            let path = Path::Member(&self.path, &name);
            map.next_value_seed(Unique { path, found: self.found })?;
            if !seen.insert(name.clone()) {
                *self.found = Some(JsonTextError::DuplicateMember {
                    path: self.path.to_string(),
                    member: name,
                });
                return Err(de::Error::custom("duplicate member"));
            }
        }
        Ok(())
    }
}

/// What [`sorted_compact`] changes besides whitespace and member order.
#[derive(Clone, Copy)]
pub(crate) struct Compact {
    /// The elements of every array of distinct elements are sorted by their own text (a set
    /// lists its members in an order of its own); an array with a repeated element keeps its
    /// order.
    pub sets: bool,
    /// Strings are read and written again (`"\u00e9"` as `"é"`); otherwise as written.
    pub read_strings: bool,
}

/// Appends `raw` compact, object members sorted by name, every other token as written (integers
/// beyond 64 bits exact) but as `how` says. Recursive: callers pass text already checked against
/// the depth limit (or that serde_json parsed, which stops at 128 levels).
pub(crate) fn sorted_compact(
    raw: &serde_json::value::RawValue,
    how: Compact,
    out: &mut String,
) -> Result<(), serde_json::Error> {
    use serde_json::value::RawValue;
    let text = raw.get();
    match text.as_bytes().first() {
        Some(b'{') => {
            let members: std::collections::BTreeMap<String, &RawValue> =
                serde_json::from_str(text)?;
            out.push('{');
            for (i, (name, value)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::to_string(&name)?);
                out.push(':');
                sorted_compact(value, how, out)?;
            }
            out.push('}');
        }
        Some(b'[') => {
            let items: Vec<&RawValue> = serde_json::from_str(text)?;
            let mut written = Vec::with_capacity(items.len());
            for item in items {
                let mut one = String::new();
                sorted_compact(item, how, &mut one)?;
                written.push(one);
            }
            if how.sets {
                let mut sorted = written.clone();
                sorted.sort_unstable();
                if sorted.windows(2).all(|w| w[0] != w[1]) {
                    written = sorted;
                }
            }
            out.push('[');
            out.push_str(&written.join(","));
            out.push(']');
        }
        Some(b'"') if how.read_strings => {
            out.push_str(&serde_json::to_string(&serde_json::from_str::<String>(text)?)?);
        }
        _ => out.push_str(text),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn same_json_reads_past_whitespace_member_order_and_escapes_only() {
        assert!(same_json(
            r#"{"b":2,"a":[1, {"d":1,"c":2}]}"#,
            r#" { "a": [1,{"c":2,"d":1}], "b": 2 } "#
        ));
        assert!(same_json("18446744073709551617", "18446744073709551617"));
        assert!(!same_json("18446744073709551617", "18446744073709551616"));
        assert!(!same_json("1.0", "1"));
        assert!(same_json(r#"{"s":"é"}"#, r#"{"\u0073":"\u00e9"}"#));
        assert!(!same_json("[1,2]", "[2,1]"));
        assert!(!same_json("{", "{"), "not JSON, even when equal");
        assert!(!same_json("nope", "\"nope\""));
    }

    fn dup(text: &str) -> (String, String) {
        match parse_unique(text) {
            Err(JsonTextError::DuplicateMember { path, member }) => (path, member),
            other => panic!("{text}: not a duplicate: {other:?}"),
        }
    }

    #[test]
    fn repeated_members_are_refused_at_any_depth_with_their_path() {
        assert_eq!(
            dup(r#"{"to":"acct-A","amount_cents":500,"to":"acct-B"}"#),
            (".".into(), "to".into())
        );
        assert_eq!(dup(r#"{"a":{"b":[1,{"c":1,"c":1}]}}"#), ("a.b[1]".into(), "c".into()));
        assert_eq!(dup(r#"[{"x":1},{"x":1,"x":1}]"#), ("[1]".into(), "x".into()));
        // Equal after unescaping.
        assert_eq!(dup(r#"{"a":1,"\u0061":2}"#), (".".into(), "a".into()));
    }

    #[test]
    fn unique_text_parses_to_its_value() {
        let text = r#"{"to":"acct-A","nested":{"to":"acct-B"},"list":[{"k":1},{"k":2}]}"#;
        assert_eq!(
            parse_unique(text).unwrap(),
            json!({"to":"acct-A","nested":{"to":"acct-B"},"list":[{"k":1},{"k":2}]})
        );
    }

    #[test]
    fn the_nan_hint_is_given_for_a_bare_nan_or_infinity_only() {
        let hint = "JSON has no NaN or Infinity";
        for text in [r#"{"n": NaN}"#, r#"{"n": -Infinity}"#, r#"[1, Infinity]"#] {
            let e = parse_arguments("t", text).unwrap_err();
            assert!(e.contains(hint), "{text}: {e}");
        }
        // Inside strings they are text, and say nothing about the mistake.
        for text in [
            r#"{"title": "Infinity War", "n": }"#,
            r#"{"note": "NaN \" Infinity", "n": 1"#,
            r#"{"NaN": 1,}"#,
        ] {
            let e = parse_arguments("t", text).unwrap_err();
            assert!(e.contains("not valid JSON") && !e.contains(hint), "{text}: {e}");
        }
    }

    #[test]
    fn what_serde_json_cannot_represent_is_a_syntax_error() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        for text in ["1e400", r#""\ud800""#, "{\"a\":1", "{} x", deep.as_str()] {
            assert!(matches!(parse_unique(text), Err(JsonTextError::Syntax(_))), "{text}");
        }
    }
}
