use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;
use serde::{Serialize, ser};
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
    let order =
        Order { items: vec![Item { price: 1.0 }, Item { price: 2.0 }, Item { price: f64::NAN }] };
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
    // Booleans as serde_json writes (and reads) them.
    let bools = BTreeMap::from([(true, 1), (false, 2)]);
    assert_eq!(canon(&bools), r#"{"false":2,"true":1}"#);
    // A float key is not: `1.0` and `1` would be one name.
    struct FloatKeys;
    impl Serialize for FloatKeys {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_map([(1.0f64, 1)])
        }
    }
    assert_eq!(
        to_canonical_string(&FloatKeys),
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
    // Raw text is read as a `Value` reads it: without `arbitrary_precision` (this build) an
    // object named like serde_json's private number is an object.
    let text = r#"{"$serde_json::private::Number":"5x"}"#;
    let value: serde_json::Value = serde_json::from_str(text).unwrap();
    assert_eq!(raw(text), canon(&value));
    assert_eq!(raw(text), text);
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
    assert_eq!(canon(&Args { z: 1, n: Nested, a: 2 }), r#"{"a":2,"n":"{\"x\":2,\"y\":1}","z":1}"#);
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

/// JSON text as serde_json's `RawValue` hands it to a serializer: a private one-field struct.
struct Raw(&'static str);

impl Serialize for Raw {
    fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use ser::SerializeStruct;
        let mut st = s.serialize_struct(RAW_VALUE_TOKEN, 1)?;
        st.serialize_field(RAW_VALUE_TOKEN, self.0)?;
        st.end()
    }
}

#[test]
fn raw_json_inside_counts_from_where_it_sits() {
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

#[test]
fn the_word_test_finds_every_escaped_byte() {
    use super::leaves::{ESCAPE, word_needs_escape};
    let bytewise = |w: [u8; 8]| w.iter().any(|&b| ESCAPE[usize::from(b)] != 0);
    for b in 0..=255u8 {
        for at in 0..8 {
            for fill in [b'a', 0x7f, 0x80, 0xff, b' ', b'!', b'#', b'[', b']'] {
                let mut w = [fill; 8];
                w[at] = b;
                assert_eq!(word_needs_escape(u64::from_le_bytes(w)), bytewise(w), "{w:?}");
            }
        }
    }
    // Random words, several escaped bytes among them.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..200_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        assert_eq!(word_needs_escape(x), bytewise(x.to_le_bytes()), "{x:#x}");
    }
}

/// A hash set lists its members in another order in every copy, so an intent holding one would
/// get another key on every call: refused wherever it is written, with its path. Ordered
/// sequences (a `Vec`, a `BTreeSet`, a slice) and maps (sorted like any object) are written; an
/// output (not an intent) writes the set in the order it lists it.
#[test]
fn a_hash_set_anywhere_in_an_intent_is_refused_with_its_path() {
    use std::collections::{BTreeSet, HashSet};
    #[derive(Serialize)]
    struct Order {
        id: u32,
        tags: HashSet<String>,
    }
    #[derive(Serialize)]
    struct Args {
        orders: Vec<Order>,
    }
    let tags: HashSet<String> = ["a", "b", "c"].into_iter().map(String::from).collect();
    let args = Args { orders: vec![Order { id: 1, tags: tags.clone() }] };
    assert_eq!(
        to_canonical_string(&args),
        Err(KeyError::UnorderedSet { path: "orders[0].tags".into() })
    );
    // Empty or not, it is the type that has no order.
    assert_eq!(
        to_canonical_string(&vec![HashSet::<u8>::new()]),
        Err(KeyError::UnorderedSet { path: "[0]".into() })
    );
    assert_eq!(
        to_canonical_string(&Some(tags.clone())),
        Err(KeyError::UnorderedSet { path: String::new() })
    );
    let keys: HashMap<u8, u8> = [(1, 1), (2, 2)].into_iter().collect();
    struct Keys<'a>(&'a HashMap<u8, u8>);
    impl Serialize for Keys<'_> {
        fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_seq(self.0.keys())
        }
    }
    assert_eq!(to_canonical_string(&Keys(&keys)), Err(KeyError::UnorderedSet { path: "".into() }));
    // Behind the standard iterator adapters too: a map written as a list of pairs.
    struct Pairs<'a>(&'a HashMap<u8, u8>);
    impl Serialize for Pairs<'_> {
        fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_seq(self.0.iter().map(|(k, v)| (*k, *v)).filter(|(k, _)| *k > 0))
        }
    }
    assert_eq!(to_canonical_string(&Pairs(&keys)), Err(KeyError::UnorderedSet { path: "".into() }));
    // An adapter over an ordered sequence of sets is in order (its sets are not: refused there).
    struct Lens<'a>(&'a [HashSet<String>]);
    impl Serialize for Lens<'_> {
        fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_seq(self.0.iter().map(HashSet::len))
        }
    }
    assert_eq!(canon(&Lens(std::slice::from_ref(&tags))), "[3]");
    for name in ["core::iter::adapters::map::Map<", "core::iter::adapters::map::Map<>", "&&"] {
        assert!(!serializer::unordered_seq(name), "{name}");
    }

    // Ordered sequences and maps are written as before.
    let sorted: BTreeSet<&str> = ["b", "a"].into_iter().collect();
    assert_eq!(canon(&sorted), r#"["a","b"]"#);
    assert_eq!(canon(&vec![2, 1]), "[2,1]");
    assert_eq!(canon(&[2, 1][..]), "[2,1]");
    assert_eq!(canon(&keys), r#"{"1":1,"2":2}"#);

    // Not an intent: written in the order the set lists its members.
    let mut out = Vec::new();
    canonicalize_counting(&args, &mut out).expect("an output may hold a set");
    let text = String::from_utf8(out).expect("utf-8");
    assert!(text.starts_with(r#"{"orders":[{"id":1,"tags":["#), "{text}");
    let said = KeyError::UnorderedSet { path: "orders[0].tags".into() }.to_string();
    assert!(said.contains("argument `orders[0].tags` is a HashSet"), "{said}");
}

/// A `RawValue`'s numbers are read as serde_json reads them (the nearest float beyond 64-bit
/// integers), while whoever reads the text reads its digits: a number the canonical form writes
/// as another value is refused, so two raw texts that differ in a number never share a key.
/// Spellings of the value the canonical form writes are kept (`1.0`, `1e2`, `-0`, `0.1`).
#[test]
fn raw_numbers_that_the_canonical_form_would_round_are_refused() {
    #[derive(Serialize)]
    struct Args {
        payload: Raw,
    }
    for (text, canonical) in [
        ("1.0", "1"),
        ("1e2", "100"),
        ("-0", "0"),
        ("-0.0e7", "0"),
        ("0e999999999999999999999", "0"),
        ("0.1", "0.1"),
        ("0.30000000000000004", "0.30000000000000004"),
        ("5e-324", "5e-324"),
        ("1E21", "1e+21"),
        ("18446744073709551615", "18446744073709551615"),
        ("-9223372036854775808", "-9223372036854775808"),
        ("18446744073709552000", "18446744073709552000"),
        (
            r#"{"n":1.50,"s":"1.000000000000000001 \" 18446744073709551617"}"#,
            r#"{"n":1.5,"s":"1.000000000000000001 \" 18446744073709551617"}"#,
        ),
    ] {
        assert_eq!(canon(&Raw(text)), canonical, "{text}");
    }
    for (text, number) in [
        ("18446744073709551617", "18446744073709551617"),
        ("18446744073709551616", "18446744073709551616"),
        ("-9223372036854775809", "-9223372036854775809"),
        ("1.000000000000000001", "1.000000000000000001"),
        (
            "0.3000000000000000444089209850062616169452667236328125",
            "0.3000000000000000444089209850062616169452667236328125",
        ),
        ("1e-400", "1e-400"),
        (r#"[1,{"wei":20000000000000000001}]"#, "20000000000000000001"),
    ] {
        assert_eq!(
            to_canonical_string(&Args { payload: Raw(text) }),
            Err(KeyError::InexactNumber { path: "payload".into(), number: number.into() }),
            "{text}"
        );
    }
}
