//! The build really has the features on: otherwise the vectors would prove nothing.

use std::collections::HashMap;

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
fn a_result_sorts_members_whatever_the_map() {
    let v: Value = serde_json::from_str(r#"{"b":{"y":1,"x":[{"d":1,"c":2}]},"a":"s"}"#).unwrap();
    // The build keeps member order (otherwise this would prove nothing).
    assert_eq!(v.to_string(), r#"{"b":{"y":1,"x":[{"d":1,"c":2}]},"a":"s"}"#);
    let result = idem_core::ToolResult::success(v.clone());
    let sorted = r#"{"a":"s","b":{"x":[{"c":2,"d":1}],"y":1}}"#;
    // What the model reads, and the content every format sends on, in one order.
    assert_eq!(result.text, sorted);
    assert_eq!(result.content.to_string(), sorted);
    assert_eq!(result.content, v, "the same value");
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("never fails")]
struct Never;

impl idem_core::Classify for Never {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::permanent()
    }
}

static RECEIPTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// An output whose members are not in name order, as a tool builds it.
#[idem_core::tool(retry = "keyed")]
async fn receipt(cx: &idem_core::Ctx, order: String) -> Result<Value, Never> {
    let _ = cx;
    RECEIPTS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let text = format!(r#"{{"total":{{"cents":900,"currency":"EUR"}},"order":"{order}"}}"#);
    Ok(serde_json::from_str(&text).unwrap())
}

static STOCK_READS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// An output whose member order changes with every value: a replay decodes a new `HashMap`.
#[idem_core::tool(retry = "keyed")]
async fn stock(cx: &idem_core::Ctx, shelf: u32) -> Result<HashMap<String, u32>, Never> {
    let _ = cx;
    STOCK_READS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Ok((0..32).map(|i| (format!("item{i:02}"), shelf + i)).collect())
}

/// A first call answers with the tool's value, a replay with the stored text read back; with
/// `preserve_order` each keeps its own member order. Every format answers both alike, sorted.
#[tokio::test]
async fn a_replay_answers_every_format_as_its_first_call_did() {
    use serde_json::json;
    use std::sync::atomic::Ordering::SeqCst;
    let idem = idem_core::Idem::in_memory();
    let run = idem.run("conv-order");
    let set = idem_core::ToolSet::new().with(ReceiptTool).and_then(|s| s.with(StockTool));
    let set = set.expect("valid tools");

    let params = json!({"name": "receipt", "arguments": {"order": "o-1"}});
    let first = set.call_mcp(&run, &params).await.expect("a routable call");
    let again = set.call_mcp(&run, &params).await.expect("a routable call");
    assert_eq!(RECEIPTS.load(SeqCst), 1);
    assert_eq!(first["_meta"]["idem/outcome"], "executed");
    assert_eq!(again["_meta"]["idem/outcome"], "replayed");
    let sorted = r#"{"order":"o-1","total":{"cents":900,"currency":"EUR"}}"#;
    for answer in [&first, &again] {
        assert_eq!(answer["structuredContent"].to_string(), sorted, "{answer}");
        assert_eq!(answer["content"][0]["text"], sorted, "{answer}");
    }
    let part = json!({"functionCall": {"name": "receipt", "args": {"order": "o-1"}}});
    let gemini = set.call_gemini(&run, &part).await;
    assert_eq!(gemini["functionResponse"]["response"]["output"].to_string(), sorted);
    assert_eq!(RECEIPTS.load(SeqCst), 1);

    let params = json!({"name": "stock", "arguments": {"shelf": 100}});
    let first = set.call_mcp(&run, &params).await.expect("a routable call");
    let again = set.call_mcp(&run, &params).await.expect("a routable call");
    assert_eq!(STOCK_READS.load(SeqCst), 1);
    assert_eq!(again["_meta"]["idem/outcome"], "replayed");
    assert_eq!(first.to_string().replace("executed", "replayed"), again.to_string());
    let keys: Vec<&String> = first["structuredContent"].as_object().unwrap().keys().collect();
    assert!(keys.is_sorted(), "{keys:?}");
}
