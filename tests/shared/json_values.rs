//! A proptest strategy of JSON values, shared by the key properties (tests/keys.rs) and the
//! output replay properties (tests/output_replay_props.rs).

use proptest::prelude::*;
use serde_json::Value;

/// JSON values nested up to 4 deep: integers over the whole i64/u64 range, finite floats with
/// the edge cases of number formatting (-0, the smallest subnormal, 1e21 where JavaScript's
/// notation changes, the largest finite, 0.1), strings of any Unicode plus runs of what must or
/// may be escaped (controls, quote, backslash, DEL, U+2028/2029, noncharacters), and objects with
/// any member names.
pub(crate) fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        prop_oneof![Just(-0.0f64), Just(5e-324), Just(1e21), Just(f64::MAX), Just(0.1)]
            .prop_map(Value::from),
        any::<String>().prop_map(Value::from),
        "[\\x00-\\x20\"\\\\\\u{7f}\\u{2028}\\u{2029}\\u{fffe}\\u{10ffff}a]{0,12}"
            .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((any::<String>(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}
