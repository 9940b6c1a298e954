//! The canonicalizer, differentially: for any JSON text serde_json reads, the canonical text
//! parses back to the same value, canonicalising it again changes nothing, object members are in
//! UTF-16 code-unit order, and every number prints as ECMAScript does (ryu-js for floats,
//! serde_json's exact digits for integers). Eight bytes of input are also read as an f64.

#![no_main]

use std::cmp::Ordering;
use std::fmt;

use idem_core::{KeyError, to_canonical_string};
use libfuzzer_sys::fuzz_target;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    if let Ok(bits) = <[u8; 8]>::try_from(data) {
        check_float(f64::from_le_bytes(bits));
    }
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(value) = serde_json::from_str::<Value>(text) else { return };
    let canon = match to_canonical_string(&value) {
        Ok(c) => c,
        Err(e) => panic!("parsed JSON must canonicalise: {e}"),
    };
    let back: Value = match serde_json::from_str(&canon) {
        Ok(v) => v,
        Err(e) => panic!("canonical text must parse: {e}: {canon}"),
    };
    assert!(same(&value, &back), "round trip changed the value:\n{value}\n{canon}");
    assert_eq!(to_canonical_string(&back).ok().as_deref(), Some(canon.as_str()), "not idempotent");
    match serde_json::from_str::<Ordered>(&canon) {
        Ok(ordered) => ordered.check(),
        Err(e) => panic!("{e}"),
    }
    numbers(&value);
});

fn ecmascript(x: f64) -> String {
    if x == 0.0 { "0".to_owned() } else { ryu_js::Buffer::new().format_finite(x).to_owned() }
}

fn check_float(x: f64) {
    match to_canonical_string(&x) {
        Ok(text) => {
            assert!(x.is_finite());
            assert_eq!(text, ecmascript(x));
            let back: f64 = text.parse().unwrap_or(f64::NAN);
            assert!(back == x, "{x:?} printed as {text} reads back as {back:?}");
        }
        Err(KeyError::NonFinite { .. }) => assert!(!x.is_finite()),
        Err(e) => panic!("{x:?}: {e}"),
    }
}

/// Every number of `v` canonicalises to the ECMAScript (float) or exact (integer) digits.
fn numbers(v: &Value) {
    match v {
        Value::Number(n) => {
            let text = to_canonical_string(n).unwrap_or_default();
            if n.is_f64() {
                assert_eq!(text, ecmascript(n.as_f64().unwrap_or(f64::NAN)), "{n}");
            } else {
                assert_eq!(text, n.to_string(), "integers are exact");
            }
        }
        Value::Array(items) => items.iter().for_each(numbers),
        Value::Object(members) => members.values().for_each(numbers),
        _ => {}
    }
}

/// The same JSON data: numbers equal as numbers (4900.0 and 4900 are one number; integers
/// exactly), everything else structurally.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i128(), y.as_i128()) {
            (Some(i), Some(j)) if !x.is_f64() && !y.is_f64() => i == j,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, p)| y.get(k).is_some_and(|q| same(p, q)))
        }
        _ => a == b,
    }
}

/// A JSON value with its object members in the order they were written.
enum Ordered {
    Leaf,
    Array(Vec<Ordered>),
    Object(Vec<(String, Ordered)>),
}

impl Ordered {
    fn check(&self) {
        match self {
            Ordered::Leaf => {}
            Ordered::Array(items) => items.iter().for_each(Ordered::check),
            Ordered::Object(members) => {
                for pair in members.windows(2) {
                    let order = pair[0].0.encode_utf16().cmp(pair[1].0.encode_utf16());
                    assert_eq!(order, Ordering::Less, "{:?} before {:?}", pair[0].0, pair[1].0);
                }
                members.iter().for_each(|(_, v)| v.check());
            }
        }
    }
}

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Ordered;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("JSON")
            }
            fn visit_bool<E>(self, _: bool) -> Result<Ordered, E> {
                Ok(Ordered::Leaf)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Ordered, E> {
                Ok(Ordered::Leaf)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Ordered, E> {
                Ok(Ordered::Leaf)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Ordered, E> {
                Ok(Ordered::Leaf)
            }
            fn visit_str<E>(self, _: &str) -> Result<Ordered, E> {
                Ok(Ordered::Leaf)
            }
            fn visit_unit<E>(self) -> Result<Ordered, E> {
                Ok(Ordered::Leaf)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Ordered, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Ordered::Array(items))
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Ordered, M::Error> {
                let mut members = Vec::new();
                while let Some((k, v)) = map.next_entry()? {
                    members.push((k, v));
                }
                Ok(Ordered::Object(members))
            }
        }
        d.deserialize_any(V)
    }
}
