//! The build really has the features on: otherwise the vectors would prove nothing.

use serde_json::Value;

#[test]
fn arbitrary_precision_keeps_number_text_and_keys_do_not_see_it() {
    let v: Value = serde_json::from_str(r#"{"big":18446744073709551616,"f":1.0}"#).unwrap();
    // With `arbitrary_precision` the Value holds the text as written.
    assert_eq!(v.to_string(), r#"{"big":18446744073709551616,"f":1.0}"#);
    assert_eq!(
        idem_core::to_canonical_string(&v).unwrap(),
        r#"{"big":18446744073709552000,"f":1}"#
    );
}

#[test]
fn preserve_order_keeps_member_order_and_keys_do_not_see_it() {
    let v: Value = serde_json::from_str(r#"{"b":1,"a":2}"#).unwrap();
    assert_eq!(v.to_string(), r#"{"b":1,"a":2}"#);
    assert_eq!(idem_core::to_canonical_string(&v).unwrap(), r#"{"a":2,"b":1}"#);
}

#[test]
fn raw_value_is_written_as_the_data_it_holds() {
    let raw = serde_json::value::RawValue::from_string(r#"{ "b": 1.50, "a": [1e2] }"#.into());
    let raw = raw.unwrap();
    assert_eq!(idem_core::to_canonical_string(&raw).unwrap(), r#"{"a":[100],"b":1.5}"#);
    // Numbers arrive as text here too, and a repeated member is refused as without the features.
    let raw = serde_json::value::RawValue::from_string(
        r#"[18446744073709552000, -0, 1.0e0, -9223372036854775808, 7]"#.into(),
    );
    assert_eq!(
        idem_core::to_canonical_string(&raw.unwrap()).unwrap(),
        "[18446744073709552000,0,1,-9223372036854775808,7]"
    );
    // A number the canonical form would round is refused as without the features: the raw
    // text keeps its digits, which another number sharing its double would not.
    for number in ["18446744073709551616", "-9223372036854775809"] {
        let raw = serde_json::value::RawValue::from_string(format!("[{number}]")).unwrap();
        assert_eq!(
            idem_core::to_canonical_string(&raw),
            Err(idem_core::KeyError::InexactNumber { path: String::new(), number: number.into() })
        );
    }
    // An object named like serde_json's private number is that number here, as for a `Value`.
    let text = r#"{"$serde_json::private::Number":"1.50"}"#;
    let value: Value = serde_json::from_str(text).unwrap();
    let raw = serde_json::value::RawValue::from_string(text.into()).unwrap();
    assert_eq!(idem_core::to_canonical_string(&raw).unwrap(), "1.5");
    assert_eq!(idem_core::to_canonical_string(&value).unwrap(), "1.5");
    let raw = serde_json::value::RawValue::from_string(r#"{"a":1.5,"a":2}"#.into());
    assert_eq!(
        idem_core::to_canonical_string(&raw.unwrap()),
        Err(idem_core::KeyError::DuplicateKey { path: "a".into() })
    );
}

#[test]
fn the_text_a_model_reads_sorts_members_whatever_the_map() {
    let v: Value = serde_json::from_str(r#"{"b":{"y":1,"x":[{"d":1,"c":2}]},"a":"s"}"#).unwrap();
    let result = idem_core::ToolResult::success(v.clone());
    assert_eq!(result.text, r#"{"a":"s","b":{"x":[{"c":2,"d":1}],"y":1}}"#);
    assert_eq!(result.content.to_string(), r#"{"b":{"y":1,"x":[{"d":1,"c":2}]},"a":"s"}"#);
}
