//! Whether an output can be stored: its JSON must read back as the same value, with the
//! strictness of arguments (the canonical forms of the output and of what its JSON reads back as
//! are equal). Otherwise the record says why (`docs/design.md` §6.4).
//!
//! The common path walks the output three times: its JSON text with the canonical form's refusals
//! (`canonical::write_plain`), the text read back as the output type, and what was read written
//! again and compared with the text. Within `write_plain`'s rules equal texts mean equal canonical
//! forms, so no canonical form is built. A value outside those rules (a float, a NaN, a map key
//! that is not a string, a repeated member name, nesting at the limit), a text that does not read
//! back, or one read back differently (a `HashMap` may list its members in another order) takes
//! the full path, which builds and compares the canonical forms and says why when they differ.

use std::cell::Cell;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use crate::key::KeyError;

/// The JSON of `output` if it reads back as the same value; otherwise why not, for
/// [`crate::Error::OutputNotStorable`].
pub(crate) fn storable<O: Serialize + DeserializeOwned>(output: &O) -> Result<String, String> {
    stored_json(output).map_err(|e| e.to_string())
}

/// Why an output cannot be stored faithfully.
pub(crate) enum Unstorable {
    /// Nested past the depth limit: nothing may write it, and dropping it recurses as deep.
    TooDeep(KeyError),
    /// Its `Serialize` or `Deserialize` (the user's code) panicked; the message.
    Panicked(String),
    /// Any other reason, as the record and the error say it.
    Other(String),
}

impl std::fmt::Display for Unstorable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // KeyError's own text speaks of arguments.
            Unstorable::TooDeep(KeyError::TooDeep { path, limit }) => write!(
                f,
                "{} nests arrays and objects more than {limit} levels deep; idem refuses deeper \
                 data (docs/key-spec.md, Limits)",
                within(path)
            ),
            Unstorable::TooDeep(e) => e.fmt(f),
            Unstorable::Panicked(message) => {
                write!(f, "its `Serialize` or `Deserialize` panicked: {message}")
            }
            Unstorable::Other(why) => f.write_str(why),
        }
    }
}

thread_local! {
    /// The text being checked, reused across calls on one thread: a record keeps only its
    /// output's JSON, at its size, not the buffer it was checked in.
    static TEXT: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Buffers up to this size are kept for the next check on the thread.
const KEEP_TEXT: usize = 64 * 1024;

/// [`storable`], telling an output past the depth limit, and one whose own code panicked, apart.
pub(crate) fn stored_json<O: Serialize + DeserializeOwned>(
    output: &O,
) -> Result<String, Unstorable> {
    super::caught::caught(|| checked_json(output)).unwrap_or_else(|m| Err(Unstorable::Panicked(m)))
}

fn checked_json<O: Serialize + DeserializeOwned>(output: &O) -> Result<String, Unstorable> {
    // Taken, not borrowed: the output's own `Serialize` or `Deserialize` may call idem again.
    let mut text = TEXT.try_with(Cell::take).unwrap_or_default();
    text.clear();
    // Sized for a typical output at once: growing from empty costs more than the walk itself.
    text.reserve(256);
    let checked = check_plain(output, &mut text);
    if text.capacity() <= KEEP_TEXT {
        let _ = TEXT.try_with(|t| t.set(text));
    }
    match checked {
        Some(Ok(json)) => Ok(json),
        Some(Err(e)) => Err(e),
        None => full(output),
    }
}

/// The plain path of [`stored_json`], checking in `text`; `None` sends the output the full way.
fn check_plain<O: Serialize + DeserializeOwned>(
    output: &O,
    text: &mut Vec<u8>,
) -> Option<Result<String, Unstorable>> {
    let some_nulls = crate::canonical::write_plain(output, text, true).ok()?;
    // `write_plain` writes only UTF-8 (escaped strings and ASCII), checked once here: read back
    // from a `str`, as a replay reads it, serde_json checks no string again. The record's copy is
    // exactly as long as the text.
    let json = std::str::from_utf8(text).ok()?.to_owned();
    let back = serde_json::from_str::<O>(&json).ok()?;
    let len = text.len();
    // Written again after the text itself, compared, then cut off: no second buffer.
    let again = crate::canonical::write_plain(&back, text, false);
    let same = again.is_ok_and(|n| n == some_nulls) && text[..len] == text[len..];
    text.truncate(len);
    if same {
        return Some(Ok(json));
    }
    // Read back, but written differently: the canonical forms decide (members in another order
    // are the same value, and so are a set's elements).
    Some(same_canonical(output, &back).map(|()| json))
}

/// Whether `output` and `back`, its JSON read back, have the same canonical form (and as many
/// `Some`s written as `null`).
fn same_canonical<O: Serialize>(output: &O, back: &O) -> Result<(), Unstorable> {
    let (canonical, some_nulls) = canonical(output)?;
    let mut again = Vec::with_capacity(canonical.len());
    let nulls_again = crate::canonical::canonicalize_counting(back, &mut again).map_err(|e| {
        Unstorable::Other(format!("its JSON reads back as a value without JSON form: {e}"))
    })?;
    if again != canonical && !same_but_order(&again, &canonical) {
        return Err(different());
    }
    if nulls_again != some_nulls {
        return Err(some_null());
    }
    Ok(())
}

/// The full check, which says why an output cannot be stored. The first canonicalization is
/// also the depth check: it stops at the limit before serde_json, which has none, writes anything.
fn full<O: Serialize + DeserializeOwned>(output: &O) -> Result<String, Unstorable> {
    let (canonical, some_nulls) = canonical(output)?;
    let other = |why: String| Unstorable::Other(why);
    let json = serde_json::to_string(output)
        .map_err(|e| other(format!("it cannot be serialized as JSON: {e}")))?;
    let back: O = serde_json::from_str(&json)
        .map_err(|e| other(format!("its JSON does not read back as the output type: {e}")))?;
    let mut again = Vec::with_capacity(canonical.len());
    let nulls_again = crate::canonical::canonicalize_counting(&back, &mut again)
        .map_err(|e| other(format!("its JSON reads back as a value without JSON form: {e}")))?;
    if again != canonical && !same_but_order(&again, &canonical) {
        return Err(different());
    }
    if nulls_again != some_nulls {
        return Err(some_null());
    }
    Ok(json)
}

/// Whether two canonical texts are the same value once the elements of every array of distinct
/// elements may come in any order: a set (`HashSet`) lists its members in an order of its own,
/// and the same set read back from the same text may list them in another. Only asked when the
/// texts differ.
fn same_but_order(a: &[u8], b: &[u8]) -> bool {
    let order_free = |text: &[u8]| -> Option<String> {
        let raw: &RawValue = serde_json::from_str(std::str::from_utf8(text).ok()?).ok()?;
        let mut out = String::with_capacity(text.len());
        crate::json_text::sorted_compact(
            raw,
            crate::json_text::Compact { sets: true, read_strings: false },
            &mut out,
        )
        .ok()?;
        Some(out)
    };
    matches!((order_free(a), order_free(b)), (Some(a), Some(b)) if a == b)
}

/// The canonical form of `output`, and how many `Some`s of `null` it wrote.
fn canonical<O: Serialize>(output: &O) -> Result<(Vec<u8>, usize), Unstorable> {
    let mut canonical = Vec::with_capacity(256);
    let some_nulls =
        crate::canonical::canonicalize_counting(output, &mut canonical).map_err(|e| match e {
            KeyError::NonFinite { path, value } => {
                Unstorable::Other(format!("{} is {value}, which JSON cannot carry", within(&path)))
            }
            KeyError::NonStringKey { path } => Unstorable::Other(format!(
                "{} is a map whose keys are neither strings, integers nor booleans",
                within(&path)
            )),
            KeyError::DuplicateKey { path } => Unstorable::Other(format!(
                "{} appears twice in one object once map keys are written as strings, and only one \
                 would read back",
                within(&path)
            )),
            e @ KeyError::TooDeep { .. } => Unstorable::TooDeep(e),
            // KeyError's own texts for these speak of arguments.
            KeyError::Custom(why) => {
                Unstorable::Other(format!("it cannot be serialized as JSON: {why}"))
            }
            other => Unstorable::Other(other.to_string()),
        })?;
    Ok((canonical, some_nulls))
}

/// JSON writes `Some(None)` and `Some(Value::Null)` as the `null` of `None`, which an `Option`
/// reads back as `None`.
fn some_null() -> Unstorable {
    Unstorable::Other(
        "it holds `Some` of a value written as `null` (`Some(None)`, `Some(Value::Null)`), \
         which its JSON reads back as `None`"
            .into(),
    )
}

fn different() -> Unstorable {
    Unstorable::Other(
        "its JSON reads back as a different value (is its Serialize mirrored by its Deserialize?)"
            .into(),
    )
}

/// "the output" or "`path` of the output".
fn within(path: &str) -> String {
    if path.is_empty() { "the output".to_owned() } else { format!("`{path}` of the output") }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use serde::{Deserialize, Serialize};
    use serde_json::json;

    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    enum Shape {
        Unit,
        Newtype(u8),
        Tuple(i64, String),
        Struct { name: String, tags: Vec<char> },
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Rich {
        text: String,
        escapes: String,
        signed: i64,
        unsigned: u64,
        ratio: f64,
        whole: f64,
        tiny: f64,
        flag: bool,
        none: Option<u8>,
        some: Option<Box<Option<u32>>>,
        list: Vec<Shape>,
        by_id: BTreeMap<u32, String>,
        by_name: BTreeMap<String, ()>,
        #[serde(with = "serde_bytes_as_seq")]
        raw: Vec<u8>,
        unit: (),
    }

    mod serde_bytes_as_seq {
        pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(v)
        }
        pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
            serde::Deserialize::deserialize(d)
        }
    }

    fn rich() -> Rich {
        Rich {
            text: "héllo \u{1F600} wörld".into(),
            escapes: "quote \" backslash \\ nl \n tab \t ctl \u{1} del \u{7f} slash /".into(),
            signed: i64::MIN,
            unsigned: u64::MAX,
            ratio: 0.1,
            whole: 1.0,
            tiny: 1e-300,
            flag: true,
            none: None,
            some: Some(Box::new(Some(7))),
            list: vec![
                Shape::Unit,
                Shape::Newtype(3),
                Shape::Tuple(-1, "x".into()),
                Shape::Struct { name: "n".into(), tags: vec!['a', '"'] },
            ],
            by_id: BTreeMap::from([(2, "b".into()), (10, "a".into())]),
            by_name: BTreeMap::from([("z".into(), ()), ("a".into(), ())]),
            raw: vec![0, 255],
            unit: (),
        }
    }

    fn plain<T: Serialize + ?Sized>(value: &T) -> Option<String> {
        let mut out = Vec::new();
        crate::canonical::write_plain(value, &mut out, true).ok()?;
        Some(String::from_utf8(out).expect("UTF-8"))
    }

    #[test]
    fn the_plain_text_is_serde_jsons() {
        let values = [
            serde_json::to_value(rich()).unwrap(),
            json!({"b": [1, -2, 3.5, null, true], "a": {"": "", "\u{0}": "\u{1f}"}}),
            json!([]),
            json!({}),
            json!("just a string"),
            json!(12345678901234567u64),
        ];
        for v in &values {
            assert_eq!(plain(v).as_deref(), Some(serde_json::to_string(v).unwrap().as_str()));
        }
        assert_eq!(plain(&rich()).unwrap(), serde_json::to_string(&rich()).unwrap());
        assert_eq!(stored_json(&rich()).ok().unwrap(), serde_json::to_string(&rich()).unwrap());
    }

    #[test]
    fn strings_are_escaped_as_serde_json_does_at_every_position() {
        for len in 0..20 {
            for at in 0..len {
                for c in ['\n', '"', '\\', '\u{1}', '\u{7f}', 'é'] {
                    let text: String = (0..len).map(|i| if i == at { c } else { 'a' }).collect();
                    let expected = serde_json::to_string(&text).unwrap();
                    assert_eq!(plain(&text).as_deref(), Some(expected.as_str()), "{text:?}");
                }
            }
        }
    }

    #[test]
    fn what_the_plain_path_does_not_write_goes_the_full_way() {
        // f32: serde_json writes 0.1f32 as 0.1, which the canonical form tells from 0.1f64.
        assert!(plain(&0.1f32).is_none());
        assert!(plain(&f64::NAN).is_none());
        assert!(plain(&u128::MAX).is_none());
        assert!(plain(&HashMap::from([((1u8, 2u8), 1)])).is_none());
        assert!(plain(&BTreeMap::from([(true, 1)])).is_none());
        let members = |n: usize| -> serde_json::Value {
            serde_json::Value::Object((0..n).map(|i| (i.to_string(), json!(i))).collect())
        };
        // The integer 0 and the string "0" name the same member.
        struct Dup(usize);
        impl Serialize for Dup {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeMap;
                let mut m = s.serialize_map(None)?;
                for i in 0..self.0 {
                    m.serialize_entry(&i, &i)?;
                }
                m.serialize_entry("0", &0)?;
                m.end()
            }
        }
        assert!(plain(&Dup(1)).is_none(), "a small object");
        assert!(plain(&Dup(40)).is_none(), "a large object");
        assert!(plain(&members(40)).is_some(), "distinct names");
        let deep = (0..200).fold(json!(1), |v, _| json!([v]));
        assert!(plain(&deep).is_none());
        let mut out = b"kept".to_vec();
        assert!(crate::canonical::write_plain(&Dup(3), &mut out, true).is_err());
        assert_eq!(out, b"kept", "nothing is left behind");
    }

    #[test]
    fn the_full_path_keeps_its_reasons_and_results() {
        let why = |r: Result<String, Unstorable>| match r {
            Err(e) => e.to_string(),
            Ok(json) => panic!("stored {json}"),
        };
        assert!(why(stored_json(&f64::NAN)).contains("NaN"));
        assert!(why(stored_json(&HashMap::from([((1u8, 2u8), 1)]))).contains("map whose keys"));
        // Another order of the same members is the same value.
        let many: HashMap<String, u32> = (0..50).map(|i| (format!("k{i}"), i)).collect();
        let json = stored_json(&many).ok().unwrap();
        assert_eq!(serde_json::from_str::<HashMap<String, u32>>(&json).unwrap(), many);
        // f32 reads back as itself; an untagged f32-or-f64 does not.
        assert_eq!(stored_json(&0.1f32).ok().unwrap(), "0.1");
        #[derive(Serialize, Deserialize)]
        #[serde(untagged)]
        enum Either {
            Single(f32),
            Double(f64),
        }
        assert!(why(stored_json(&Either::Double(0.1))).contains("different value"));
        let _ = Either::Single(0.0);
        assert_eq!(stored_json(&u128::MAX).ok().unwrap(), u128::MAX.to_string());
        // A set's members in another order are the same set; a list's are not.
        let set: std::collections::HashSet<Vec<u8>> = (0..30).map(|i| vec![i, i + 1]).collect();
        assert!(stored_json(&set).is_ok());
        #[derive(Serialize, Deserialize)]
        struct Reversed(#[serde(deserialize_with = "reversed")] Vec<u8>);
        fn reversed<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
            Vec::<u8>::deserialize(d).map(|v| v.into_iter().rev().collect())
        }
        assert!(why(stored_json(&Reversed(vec![1, 1, 2]))).contains("different value"));
        // `Some` of `null` is the `null` of `None`, which an `Option` reads back as `None`.
        let some_null = why(stored_json(&Some(None::<u8>)));
        assert!(some_null.contains("reads back as `None`"), "{some_null}");
        assert!(why(stored_json(&vec![Some(())])).contains("reads back as `None`"));
        let map = HashMap::from([("k".to_owned(), Some(serde_json::Value::Null))]);
        assert!(why(stored_json(&map)).contains("reads back as `None`"));
        assert_eq!(stored_json(&Some(Some(1))).ok().unwrap(), "1");
        assert_eq!(stored_json(&[None::<u8>, Some(2)]).ok().unwrap(), "[null,2]");
        assert_eq!(stored_json(&Some(json!({"a": null}))).ok().unwrap(), r#"{"a":null}"#);
        // serde's pattern for a field that may be absent or null: `Some(None)` is written as
        // `null` and read back as `Some(None)`, `None` is left out.
        #[derive(Serialize, Deserialize)]
        struct Patch {
            #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "some")]
            note: Option<Option<String>>,
        }
        fn some<'de, D: serde::Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Option<String>>, D::Error> {
            Deserialize::deserialize(d).map(Some)
        }
        for (patch, json) in [(Some(None), r#"{"note":null}"#), (None, "{}")] {
            assert_eq!(stored_json(&Patch { note: patch }).ok().unwrap(), json);
        }
    }
}
