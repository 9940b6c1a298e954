//! The JSON text a `RawValue` holds, read with every object member kept in order.
//!
//! `serde_json::Value` keeps only the last of two members with one name, so reading raw text
//! through it would give `{"to":"A","to":"B"}` the key of `{"to":"B"}`, while the tool, reading
//! the text itself, may act on `A`. RFC 8785 §3.1 forbids such objects; kept whole, the repeat
//! reaches the object writer, which refuses it with its path.

use std::fmt;
use std::sync::LazyLock;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeStruct, Serializer};

use super::serializer::NUMBER_TOKEN;

/// One JSON value, numbers as serde_json reads them into a `Value`.
pub(super) enum Json {
    Null,
    Bool(bool),
    U64(u64),
    I64(i64),
    F64(f64),
    /// Number text (serde_json's `arbitrary_precision`), written as the `Value` it would be.
    Number(String),
    Str(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Json::Null => s.serialize_unit(),
            Json::Bool(b) => s.serialize_bool(*b),
            Json::U64(n) => s.serialize_u64(*n),
            Json::I64(n) => s.serialize_i64(*n),
            Json::F64(f) => s.serialize_f64(*f),
            Json::Number(text) => {
                let mut number = s.serialize_struct(NUMBER_TOKEN, 1)?;
                number.serialize_field(NUMBER_TOKEN, text)?;
                number.end()
            }
            Json::Str(v) => s.serialize_str(v),
            Json::Array(items) => s.collect_seq(items),
            Json::Object(members) => {
                let mut map = s.serialize_map(Some(members.len()))?;
                for (name, value) in members {
                    map.serialize_entry(name, value)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Json, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::U64(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(Json::I64(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Json, E> {
        Ok(Json::F64(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::Str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut members = Vec::new();
        while let Some(name) = map.next_key::<String>()? {
            // With `arbitrary_precision`, serde_json hands a number over as a one-member map
            // holding its text, and `Value` reads it as the number; without, it is an object.
            if members.is_empty() && name == NUMBER_TOKEN && numbers_as_text() {
                let text: String = map.next_value()?;
                if map.next_key::<de::IgnoredAny>()?.is_some() {
                    return Err(de::Error::custom("number text followed by more members"));
                }
                return Ok(Json::Number(text));
            }
            members.push((name, map.next_value()?));
        }
        Ok(Json::Object(members))
    }
}

/// Whether this build's serde_json keeps number text (its `arbitrary_precision` feature, which
/// any crate in the build may turn on).
fn numbers_as_text() -> bool {
    static ON: LazyLock<bool> = LazyLock::new(|| {
        const BEYOND_U64: &str = "18446744073709551616";
        serde_json::from_str::<serde_json::Number>(BEYOND_U64)
            .is_ok_and(|n| n.to_string() == BEYOND_U64)
    });
    *ON
}
