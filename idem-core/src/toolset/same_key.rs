//! Arguments that two calls the tool tells apart would send under one key: the key is the
//! canonical text of what the arguments write (RFC 8785), and JSON writes some values the tool
//! reads as different ones alike. Checked on a tool set, where the arguments come as JSON, after
//! they are read and before anything is claimed, and on a typed call once its key is written.

use std::any::TypeId;
use std::collections::{BTreeMap, HashMap};
use std::sync::{LazyLock, Mutex};

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::arguments::{
    Arguments, PathStep as Step, REPAIR_BYTES, node, node_mut, parse, text_size,
};
use crate::canonical::KeyError;
use crate::json_text;

/// Where the arguments hold a `null` that was read as something other than what its absence
/// reads as, with the same key: a field read with a "null is `Some(None)`" deserializer (the
/// double-option pattern of PATCH-style tools, `null` = clear, absent = leave) and written as
/// `null` whichever it holds (no `skip_serializing_if`). The clear would be answered with the
/// leave's outcome. Only asked when the typed arguments hold a `Some` written as `null`, which
/// the standard `Option` never reads from JSON; then explicit `null` members are left out, the
/// arguments read again (from their text when they came as text, which keeps every number's
/// digits), and compared: the same key with fewer such `Some`s means the two are told apart by
/// the tool but not by the key.
///
/// Only the `null`s where the tool holds such a `Some` are asked about (the arguments written
/// with each marked): leaving out another (a `Value`'s, one whose absence reads as a default)
/// changes the key, and among those left out together would hide the one asked about. Each is
/// tried alone while the reads stay within [`REPAIR_BYTES`] (so one request with megabytes of
/// them cannot cost a read per member); those left are then left out together, and when that
/// shows one, halved until one is named. Arguments that read
/// differently without a `null` in a way the key tells apart, or not at all, are not refused.
pub(super) fn null_read_as_some<T: crate::tool::Tool>(
    tool: &str,
    args: Arguments<'_>,
    parsed: &T::Args,
) -> Option<String> {
    // Most calls hold no explicit `null`: found by a look at the text or a walk of the parsed
    // JSON, before anything is canonicalized again or copied.
    let (read, twice);
    let (value, text): (&Value, Option<&str>) = match args {
        Arguments::Json(Value::String(s)) if s.contains("null") => {
            read = serde_json::from_str::<Value>(s).ok()?;
            (&read, Some(s))
        }
        Arguments::Json(Value::String(_)) | Arguments::Absent => return None,
        Arguments::Json(v) => (v, None),
        Arguments::Text(text) if text.contains("null") => {
            twice = json_text::twice_encoded(text);
            let text = twice.as_deref().unwrap_or(text);
            read = serde_json::from_str::<Value>(text).ok()?;
            (&read, Some(text))
        }
        Arguments::Text(_) => return None,
    };
    if !holds_null_member(value) {
        return None;
    }
    let some_nulls = crate::canonical::canonicalize_counting(parsed, &mut Vec::new()).ok()?;
    if some_nulls == 0 {
        return None;
    }
    let mut nulls = Vec::new();
    null_members(value, &mut Vec::new(), &mut nulls);
    // Only the `null`s where the tool holds such a `Some` are asked about: the others (a
    // `Value`'s, one whose absence reads as a default) change the key when left out, and
    // would hide the one asked about among them. Where none is found at a `null`'s path (a
    // member read under another name than it is written), every `null` is asked about.
    if let Some(marked) = some_null_paths(parsed) {
        let at_some: Vec<Vec<Step>> =
            nulls.iter().filter(|path| marked.contains(path)).cloned().collect();
        if !at_some.is_empty() {
            nulls = at_some;
        }
    }
    let mut key = Vec::new();
    T::write_intent(parsed, &mut key).ok()?;
    // Whether the arguments without the members at `paths` read as arguments of the same key
    // with fewer `Some`s written as `null`.
    let same_key_fewer = |paths: &[Vec<Step>]| {
        let other = match text {
            Some(text) => {
                let Some(without) = text_without(text, paths) else { return false };
                parse::<T::Args>(tool, Arguments::Text(&without))
            }
            None => {
                let mut without = value.clone();
                if paths.iter().any(|path| remove_at(&mut without, path).is_none()) {
                    return false;
                }
                parse::<T::Args>(tool, Arguments::Json(&without))
            }
        };
        let Ok(other) = other else { return false };
        let mut other_key = Vec::new();
        T::write_intent(&other, &mut other_key).is_ok()
            && other_key == key
            && crate::canonical::canonicalize_counting(&other, &mut Vec::new())
                .is_ok_and(|n| n < some_nulls)
    };
    let size = text.map_or_else(|| text_size(value), str::len);
    let alone = (REPAIR_BYTES / size.max(1)).min(nulls.len());
    if let Some(path) =
        nulls[..alone].iter().find(|path| same_key_fewer(std::slice::from_ref(path)))
    {
        return Some(path_text(path));
    }
    let mut left = &nulls[alone..];
    if left.is_empty() || !same_key_fewer(left) {
        return None;
    }
    // At most one read per halving: about 20 for a million `null`s.
    while left.len() > 1 {
        let (first, second) = left.split_at(left.len() / 2);
        left = if same_key_fewer(first) { first } else { second };
    }
    Some(path_text(&left[0]))
}

/// A path as errors show it (`order.items[2].note`).
fn path_text(path: &[Step]) -> String {
    let mut shown = crate::canonical::PathText::default();
    for segment in path {
        match segment {
            Step::Member(name) => shown.key(name),
            Step::Index(i) => shown.index(*i),
        }
    }
    shown.finish()
}

/// `text` (a JSON object) without the object members at `paths`, every other value kept as its
/// text (a number's digits exactly, which a `Value` would round). Members come out in name
/// order, which no typed read depends on (duplicate names were refused before).
fn text_without(text: &str, paths: &[Vec<Step>]) -> Option<String> {
    // The rest of each path that starts with `first`.
    fn under<'p>(paths: &[&'p [Step]], first: &Step) -> Vec<&'p [Step]> {
        paths
            .iter()
            .filter_map(|path| path.split_first().filter(|(step, _)| *step == first))
            .map(|(_, rest)| rest)
            .collect()
    }
    fn without(raw: &RawValue, paths: &[&[Step]]) -> Option<Box<RawValue>> {
        if paths.is_empty() {
            return Some(raw.to_owned());
        }
        let text = if raw.get().trim_start().starts_with('{') {
            let members: BTreeMap<String, &RawValue> = serde_json::from_str(raw.get()).ok()?;
            let mut kept = BTreeMap::new();
            for (name, member) in members {
                let inside = under(paths, &Step::Member(name.clone()));
                if inside.iter().any(|rest| rest.is_empty()) {
                    continue;
                }
                kept.insert(name, without(member, &inside)?);
            }
            serde_json::to_string(&kept).ok()?
        } else {
            let items: Vec<&RawValue> = serde_json::from_str(raw.get()).ok()?;
            let mut kept = Vec::with_capacity(items.len());
            for (i, item) in items.into_iter().enumerate() {
                kept.push(without(item, &under(paths, &Step::Index(i)))?);
            }
            serde_json::to_string(&kept).ok()?
        };
        RawValue::from_string(text).ok()
    }
    let raw: &RawValue = serde_json::from_str(text).ok()?;
    let paths: Vec<&[Step]> = paths.iter().map(Vec::as_slice).collect();
    Some(without(raw, &paths)?.get().to_owned())
}

/// Whether an object member somewhere in `value` is `null` (what [`null_members`] lists, found
/// without building paths). Recursive: the arguments were checked against the depth limit when
/// they were read.
fn holds_null_member(value: &Value) -> bool {
    match value {
        Value::Object(members) => {
            members.values().any(|member| member.is_null() || holds_null_member(member))
        }
        Value::Array(items) => items.iter().any(holds_null_member),
        _ => false,
    }
}

/// The paths of the object members whose value is `null`, outermost first. Recursive: the
/// arguments were checked against the depth limit when they were read.
fn null_members(value: &Value, at: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    match value {
        Value::Object(members) => {
            for (name, member) in members {
                at.push(Step::Member(name.clone()));
                if member.is_null() {
                    out.push(at.clone());
                } else {
                    null_members(member, at, out);
                }
                at.pop();
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                at.push(Step::Index(i));
                null_members(item, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

/// The paths where `parsed` holds a `Some` written as `null`, as its canonical text names them.
fn some_null_paths<A: serde::Serialize>(parsed: &A) -> Option<Vec<Vec<Step>>> {
    fn walk(value: &Value, at: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
        match value {
            Value::String(s) if s == crate::canonical::SOME_NULL_MARK => out.push(at.clone()),
            Value::Object(members) => members.iter().for_each(|(name, member)| {
                at.push(Step::Member(name.clone()));
                walk(member, at, out);
                at.pop();
            }),
            Value::Array(items) => items.iter().enumerate().for_each(|(i, item)| {
                at.push(Step::Index(i));
                walk(item, at, out);
                at.pop();
            }),
            _ => {}
        }
    }
    let marked = crate::canonical::with_some_nulls_marked(parsed).ok()?;
    let marked: Value = serde_json::from_str(&marked).ok()?;
    let mut out = Vec::new();
    walk(&marked, &mut Vec::new(), &mut out);
    Some(out)
}

/// Removes the object member at `path` (its last step names it).
fn remove_at(value: &mut Value, path: &[Step]) -> Option<()> {
    let (last, parents) = path.split_last()?;
    let at = node_mut(value, parents)?;
    match last {
        Step::Member(name) => at.as_object_mut()?.remove(name.as_str()).map(drop),
        Step::Index(_) => None,
    }
}

/// Where the tool reads a whole number written as a float (`5.0`, `1e3`) as another value than
/// its key reads back as, at a place whose schema takes an integer and another number as two
/// alternatives: the key writes the number as the integer (RFC 8785 writes a double without
/// its fraction when it has none), and an untagged enum with an integer and a float variant
/// (`Cents(u64)`, `Dollars(f64)`) reads `5` as `Cents(5)` and `5.0` as `Dollars(5.0)`. A payment
/// of 5 cents and one of 5 dollars would share a key, and the second would be answered with the
/// first's outcome. A `Value` or an `f64` tells `5` from `5.0` too, but its schema does not: to
/// it they are one number (`docs/key-spec.md`), and it is not refused.
///
/// Only asked when the arguments hold such a number (a scan of the text, or a walk of the
/// value) and the tool holds one as a float; then their canonical text is read back and
/// compared, as JSON values (which tell `5` from `5.0`), with what the tool reads. `(path, the
/// number as the tool read it)`.
pub(super) fn float_keyed_as_integer<T: crate::tool::Tool>(
    args: Arguments<'_>,
    parsed: &T::Args,
) -> Option<(String, String)> {
    let twice;
    let holds = match args {
        Arguments::Json(Value::String(s)) => holds_whole_float_token(s),
        Arguments::Json(v) => holds_whole_float(v),
        Arguments::Text(text) => {
            twice = json_text::twice_encoded(text);
            holds_whole_float_token(twice.as_deref().unwrap_or(text))
        }
        Arguments::Absent => false,
    };
    if !holds {
        return None;
    }
    read_back_otherwise::<T>(parsed)
}

/// Where `parsed`'s canonical text reads back with a whole float turned into an integer, or the
/// reverse, and the schema there takes both: [`float_keyed_as_integer`] once the arguments
/// were seen to hold a whole float.
fn read_back_otherwise<T: crate::tool::Tool>(parsed: &T::Args) -> Option<(String, String)> {
    // A whole number read as an integer (an integer parameter, the repair of `arguments.rs`)
    // reads back as itself: only one the tool holds as a float is asked about.
    let read = as_json(parsed)?;
    if !holds_whole_float(&read) {
        return None;
    }
    let mut canonical = Vec::new();
    crate::canonical::canonicalize(parsed, &mut canonical).ok()?;
    let back: T::Args = serde_json::from_slice(&canonical).ok()?;
    let keyed = as_json(&back)?;
    if read == keyed {
        return None;
    }
    let schema = super::input_schema_for::<T::Args>();
    let mut at = Vec::new();
    let path = read_otherwise(&read, &keyed, &schema, &mut at)?;
    let number = node(&read, &path).map(Value::to_string)?;
    Some((path_text(&path), number))
}

/// The checks of this file for a typed call ([`crate::Run::call`]), whose arguments the
/// application built and [`crate::Tool::write_intent`] wrote as `canonical`: a `Some(None)` the
/// key cannot tell from `None` ([`KeyError::AmbiguousNull`]), and a whole float where the
/// schema also takes an integer, as an untagged enum's ([`KeyError::AmbiguousNumber`]). `seen` is what that
/// writing held; nothing is asked unless it held a `Some` written as `null` or a whole float,
/// and the float check only of argument types whose schema could read one number two ways
/// (decided once per type). The null check reads the key's own text back, so arguments whose
/// text does not read back (a skipped parameter that is required, a member written with
/// `skip_serializing_if` and read without `default`) are not checked for it.
pub(crate) fn typed_call<T: crate::tool::Tool>(
    tool: &str,
    parsed: &T::Args,
    canonical: &[u8],
    seen: crate::canonical::Seen,
) -> Option<KeyError> {
    if seen.some_nulls > 0
        && let Ok(text) = std::str::from_utf8(canonical)
        && let Some(path) = null_read_as_some::<T>(tool, Arguments::Text(text), parsed)
    {
        return Some(KeyError::AmbiguousNull { path });
    }
    if seen.whole_floats && may_read_a_number_two_ways_of::<T::Args>() {
        // Not the read-back a tool set makes: an application can build either variant, so a
        // whole float there is ambiguous even where its text reads back as itself (a float
        // variant declared before the integer one).
        let read = as_json(parsed)?;
        let schema = super::input_schema_for::<T::Args>();
        let path = whole_float_between(&read, &schema, &mut Vec::new())?;
        let number = node(&read, &path).map(Value::to_string)?;
        return Some(KeyError::AmbiguousNumber { path: path_text(&path), number });
    }
    None
}

/// The first path where `read` holds a whole float and the schema takes an integer and a number
/// there as two alternatives.
fn whole_float_between(read: &Value, root: &Value, at: &mut Vec<Step>) -> Option<Vec<Step>> {
    match read {
        Value::Number(n) if n.is_f64() && n.as_f64().is_some_and(|f| f.fract() == 0.0) => {
            alternatives_integer_and_number(root, at).then(|| at.clone())
        }
        Value::Array(items) => items.iter().enumerate().find_map(|(i, item)| {
            at.push(Step::Index(i));
            let found = whole_float_between(item, root, at);
            at.pop();
            found
        }),
        Value::Object(members) => members.iter().find_map(|(name, member)| {
            at.push(Step::Member(name.clone()));
            let found = whole_float_between(member, root, at);
            at.pop();
            found
        }),
        _ => None,
    }
}

/// [`may_read_a_number_two_ways`] of `A`'s schema, generated once per type in the process.
fn may_read_a_number_two_ways_of<A: schemars::JsonSchema + 'static>() -> bool {
    static KNOWN: LazyLock<Mutex<HashMap<TypeId, bool>>> = LazyLock::new(Mutex::default);
    let id = TypeId::of::<A>();
    if let Some(&may) = crate::sync::lock(&KNOWN).get(&id) {
        return may;
    }
    // Outside the lock: the schema is the application's code. One that panics cannot be asked
    // where a number is (its path's schema): not checked.
    let schema = std::panic::catch_unwind(super::input_schema_for::<A>);
    let may = matches!(schema, Ok(Value::Object(schema)) if may_read_a_number_two_ways(&schema));
    crate::sync::lock(&KNOWN).insert(id, may);
    may
}

/// `value` as a JSON value, through its text when `to_value` refuses it: a `Value` holds an
/// integer beyond 64 bits only as a double, and such a number beside the one asked about must
/// not end the check (it is compared as that double on both sides).
fn as_json<T: serde::Serialize>(value: &T) -> Option<Value> {
    serde_json::to_value(value)
        .ok()
        .or_else(|| serde_json::from_str(&serde_json::to_string(value).ok()?).ok())
}

/// Whether a tool's arguments schema could read one number two ways: it holds a union
/// (`anyOf`, `oneOf`) of two or more branches that are not `null`, and names both the types
/// `integer` and `number`. Without both, [`float_keyed_as_integer`] can find nothing, so a tool
/// set asks it only of tools where this holds. Errs towards yes: a tagged enum is a union too.
pub(super) fn may_read_a_number_two_ways(schema: &Map<String, Value>) -> bool {
    #[derive(Default)]
    struct Seen {
        union: bool,
        integer: bool,
        number: bool,
    }
    fn object(members: &Map<String, Value>, seen: &mut Seen) {
        for (name, member) in members {
            match (name.as_str(), member) {
                ("type", Value::String(t)) => {
                    seen.integer |= t == "integer";
                    seen.number |= t == "number";
                }
                ("type", Value::Array(types)) => {
                    seen.integer |= types.iter().any(|t| t == "integer");
                    seen.number |= types.iter().any(|t| t == "number");
                }
                ("anyOf" | "oneOf", Value::Array(branches)) => {
                    let null = |b: &Value| b.get("type") == Some(&Value::from("null"));
                    seen.union |= branches.iter().filter(|b| !null(b)).count() > 1;
                }
                _ => {}
            }
            value(member, seen);
        }
    }
    fn value(v: &Value, seen: &mut Seen) {
        match v {
            Value::Object(members) => object(members, seen),
            Value::Array(items) => items.iter().for_each(|item| value(item, seen)),
            _ => {}
        }
    }
    let mut seen = Seen::default();
    object(schema, &mut seen);
    seen.union && seen.integer && seen.number
}

/// Whether `text` (JSON) holds a number token not written as an integer whose double is whole:
/// `5.0` and `1e3`, and also `4.9999999999999999` and `1e-400`, which read as the doubles `5`
/// and `0`, and are keyed as those integers.
fn holds_whole_float_token(text: &str) -> bool {
    super::arguments::number_token_in(text, (0, text.len()), |token| {
        // `-0` too: serde_json reads it as a float, to keep its sign.
        (token.contains(['.', 'e', 'E']) || token == "-0")
            && token.parse::<f64>().is_ok_and(|f| f.is_finite() && f.fract() == 0.0)
    })
    .is_some()
}

/// Whether `value` holds a whole number read as a float. Recursive: the arguments were checked
/// against the depth limit when they were read.
fn holds_whole_float(value: &Value) -> bool {
    match value {
        Value::Number(n) => n.is_f64() && n.as_f64().is_some_and(|f| f.fract() == 0.0),
        Value::Array(items) => items.iter().any(holds_whole_float),
        Value::Object(members) => members.values().any(holds_whole_float),
        _ => false,
    }
}

/// The first path where `read` holds a whole float and `keyed` an integer (or the reverse) and
/// the schema there takes both as alternatives.
fn read_otherwise(
    read: &Value,
    keyed: &Value,
    root: &Value,
    at: &mut Vec<Step>,
) -> Option<Vec<Step>> {
    match (read, keyed) {
        (Value::Number(a), Value::Number(b)) if a.is_f64() != b.is_f64() => {
            alternatives_integer_and_number(root, at).then(|| at.clone())
        }
        (Value::Array(a), Value::Array(b)) => {
            a.iter().zip(b).enumerate().find_map(|(i, (a, b))| {
                at.push(Step::Index(i));
                let found = read_otherwise(a, b, root, at);
                at.pop();
                found
            })
        }
        (Value::Object(a), Value::Object(b)) => a.iter().find_map(|(name, a)| {
            at.push(Step::Member(name.clone()));
            let found = b.get(name).and_then(|b| read_otherwise(a, b, root, at));
            at.pop();
            found
        }),
        _ => None,
    }
}

/// Whether the schemas `root` gives the place at `path` (through every `anyOf`, `oneOf` and
/// `allOf` branch, and `$ref`s into `$defs`) include one of type `integer` and one of type
/// `number`: a type that reads a whole number as one or the other by how it is written.
fn alternatives_integer_and_number(root: &Value, path: &[Step]) -> bool {
    let mut places = Vec::new();
    schemas_at(root, root, path, 0, &mut places);
    let typed = |name: &str| {
        places.iter().any(|schema| match schema.get("type") {
            Some(Value::String(t)) => t == name,
            Some(Value::Array(types)) => types.iter().any(|t| t == name),
            _ => false,
        })
    };
    typed("integer") && typed("number")
}

/// How many `$ref`s one walk of a schema follows: a recursive type's schema refers to itself.
const MAX_REFS: usize = 64;

/// Collects into `out` the schemas `schema` gives the place at `path`, every branch of its
/// `anyOf`, `oneOf` and `allOf` included.
fn schemas_at<'s>(
    root: &'s Value,
    schema: &'s Value,
    path: &[Step],
    refs: usize,
    out: &mut Vec<&'s Value>,
) {
    if let Some(Value::String(to)) = schema.get("$ref") {
        let Some(name) = to.strip_prefix("#/$defs/") else {
            if to == "#" && refs < MAX_REFS {
                schemas_at(root, root, path, refs + 1, out);
            }
            return;
        };
        if let Some(target) = root.get("$defs").and_then(|defs| defs.get(name))
            && refs < MAX_REFS
        {
            schemas_at(root, target, path, refs + 1, out);
        }
        return;
    }
    for branches in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(branches)) = schema.get(branches) {
            for branch in branches {
                schemas_at(root, branch, path, refs, out);
            }
        }
    }
    let Some((step, rest)) = path.split_first() else {
        out.push(schema);
        return;
    };
    let next: Vec<&Value> = match step {
        Step::Member(name) => match schema.get("properties").and_then(|p| p.get(name.as_str())) {
            Some(member) => vec![member],
            // A map's value: under `additionalProperties`, or, for integer keys, a pattern
            // (every pattern's schema is taken: erring towards two alternatives).
            None => schema
                .get("patternProperties")
                .and_then(Value::as_object)
                .into_iter()
                .flat_map(|patterns| patterns.values())
                .chain(schema.get("additionalProperties"))
                .collect(),
        },
        Step::Index(i) => schema
            .get("prefixItems")
            .and_then(|p| p.get(*i))
            .or_else(|| schema.get("items"))
            .into_iter()
            .collect(),
    };
    for next in next {
        schemas_at(root, next, rest, refs, out);
    }
}
