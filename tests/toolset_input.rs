//! What a model can send through a tool set: every malformed call is a readable error, and the
//! tool runs only on arguments that mean exactly one thing.

use std::sync::atomic::{AtomicUsize, Ordering};

use idem_core::{Classify, Failure, Idem, ToolSet, tool};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
#[error("declined")]
struct Declined;

impl Classify for Declined {
    fn classify(&self) -> Failure {
        Failure::permanent()
    }
}

static RUNS: AtomicUsize = AtomicUsize::new(0);

/// Charge a card.
#[tool(retry = "keyed")]
async fn charge(customer: String, amount_cents: u64, reference: i128) -> Result<String, Declined> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(format!("{customer}:{amount_cents}:{reference}"))
}

fn set() -> ToolSet {
    ToolSet::new().with(ChargeTool).unwrap()
}

#[tokio::test]
async fn malformed_text_arguments_are_refused_and_nothing_runs() {
    let (set, run) = (set(), Idem::in_memory().run("r"));
    let cases = [
        (
            r#"{"customer":"c","amount_cents":5,"amount_cents":700000,"reference":1}"#,
            "the member `amount_cents` appears twice",
        ),
        (r#"{"customer":"c","amount_cents":5,"reference":1} trailing"#, "not valid JSON"),
        (r#"{"customer":"c","amount_cents":5"#, "not valid JSON"),
        (r#"[1, 2]"#, "must be a JSON object, not an array"),
        (r#"{"customer":"c","amount_cents":NaN,"reference":1}"#, "no NaN"),
        (r#"{"customer":"c","amount_cents":-5,"reference":1}"#, "field `amount_cents`"),
    ];
    for (text, expected) in cases {
        let result = set.call_text(&run, "charge", text).await;
        assert!(result.is_error, "{text}: {result:?}");
        assert_eq!(
            result.error_kind.map(idem_core::ErrorKind::as_str),
            Some("invalid_arguments"),
            "{text}"
        );
        assert!(result.text.contains(expected), "{text}: {}", result.text);
    }
    assert_eq!(RUNS.load(Ordering::SeqCst), 0, "no malformed call ran the tool");

    // Integers beyond 64 bits reach an i128 parameter exactly.
    let big =
        r#"{"customer":"c","amount_cents":5,"reference":-170141183460469231731687303715884105728}"#;
    let result = set.call_text(&run, "charge", big).await;
    assert!(!result.is_error, "{result:?}");
    assert_eq!(result.content, json!("c:5:-170141183460469231731687303715884105728"));
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_mcp_meta_that_is_not_an_object_is_a_protocol_error() {
    let (set, run) = (set(), Idem::in_memory().run("r"));
    let params = json!({
        "name": "charge",
        "arguments": {"customer": "c", "amount_cents": 5, "reference": 1},
        "_meta": "idem/idempotencyKey=order-1",
    });
    let err = set.call_mcp(&run, &params).await.unwrap_err();
    assert_eq!(err.code, -32602);
    assert!(err.message.contains("_meta"), "{}", err.message);
}

#[derive(Debug, Serialize, Deserialize)]
struct Transfer {
    id: u128,
    delta: i128,
    fee: f64,
    legs: Vec<i128>,
}

static TRANSFERS: AtomicUsize = AtomicUsize::new(0);

/// Moves funds; the ledger's ids are 128 bits.
#[tool(retry = "keyed")]
async fn transfer(to: String) -> Result<Transfer, Declined> {
    let _ = to;
    TRANSFERS.fetch_add(1, Ordering::SeqCst);
    Ok(Transfer { id: u128::MAX, delta: i128::MIN, fee: 0.5, legs: vec![-7, 1 << 100] })
}

/// An output with integers beyond 64 bits is JSON (serde_json writes and reads them exactly, and
/// the executor stores it): the model reads it with its exact digits, first and on a replay, not
/// an error that says the output cannot be JSON and that the effect happened.
#[tokio::test]
async fn an_output_with_integers_beyond_64_bits_reaches_the_model_exactly() {
    let set = ToolSet::new().with(TransferTool).unwrap();
    let run = Idem::in_memory().run("r");
    let exact = format!(
        r#"{{"delta":{},"fee":0.5,"id":{},"legs":[-7,{}]}}"#,
        i128::MIN,
        u128::MAX,
        1i128 << 100
    );
    for _ in 0..2 {
        let r = set.call(&run, "transfer", &json!({"to": "acct-1"})).await;
        assert!(!r.is_error, "{}", r.text);
        assert_eq!(r.text, exact);
        // A `Value` holds them as strings of their digits, everything else as it is.
        let content = json!({
            "id": u128::MAX.to_string(),
            "delta": i128::MIN.to_string(),
            "fee": 0.5,
            "legs": [-7, (1i128 << 100).to_string()],
        });
        assert_eq!(r.content, content);
        let mcp = r.to_mcp();
        assert_eq!(mcp["content"][0]["text"], exact.as_str());
        assert_eq!(mcp["structuredContent"], content);
    }
    assert_eq!(TRANSFERS.load(Ordering::SeqCst), 1, "the second call replayed the first");
}

/// A ledger's refusal naming the 128-bit entry it conflicts with.
#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
#[error("conflicts with entry {entry}")]
struct Conflict {
    entry: u128,
}

impl Classify for Conflict {
    fn classify(&self) -> Failure {
        Failure::permanent()
    }
}

/// Books an entry; always in conflict.
#[tool(retry = "keyed")]
async fn book(to: String) -> Result<u32, Conflict> {
    let _ = to;
    Err(Conflict { entry: u128::MAX })
}

/// A tool's error with an integer beyond 64 bits is in the result's detail, the integer as a
/// string of its digits (as in a success's content), not left out.
#[tokio::test]
async fn a_tool_error_with_an_integer_beyond_64_bits_keeps_its_detail() {
    let set = ToolSet::new().with(BookTool).unwrap();
    let r = set.call(&Idem::in_memory().run("r"), "book", &json!({"to": "acct-1"})).await;
    assert!(r.is_error);
    assert_eq!(r.content["error"]["kind"], "tool_error", "{}", r.text);
    assert_eq!(r.content["error"]["detail"], json!({"entry": u128::MAX.to_string()}));
}

static TAGGED: AtomicUsize = AtomicUsize::new(0);

/// Behind an alias, which `#[tool]` cannot see through (a `HashSet` written in the parameter's
/// type is a compile error: `tests/ui/types/hash_set_param.rs`).
type Tags = std::collections::HashSet<String>;

/// Tags a customer with a set of tags.
#[tool(retry = "keyed")]
async fn tag(customer: String, tags: Tags) -> Result<u32, Declined> {
    let _ = (customer, tags);
    TAGGED.fetch_add(1, Ordering::SeqCst);
    Ok(1)
}

/// A `HashSet` lists its members in another order in every copy (its hasher is seeded per
/// set), so the same arguments read twice would get two keys and the tool would run again on
/// every repeat. A parameter of one (here behind an alias, so the macro lets it through) is
/// refused when the call is made, naming it and what to use instead; nothing runs.
#[tokio::test]
async fn a_hash_set_parameter_is_refused_rather_than_keyed_at_random() {
    let set = ToolSet::new().with(TagTool).unwrap();
    let run = Idem::in_memory().run("r");
    let tags: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
    let args = json!({"customer": "c", "tags": tags});
    for _ in 0..3 {
        let r = set.call(&run, "tag", &args).await;
        assert_eq!(r.content["error"]["kind"], "invalid_arguments", "{}", r.text);
        assert!(r.text.contains("argument `tags` is a HashSet"), "{}", r.text);
        assert!(r.text.contains("BTreeSet"), "{}", r.text);
    }
    let typed = tag(&run, "c".into(), tags.into_iter().collect()).await;
    assert!(matches!(typed, Err(idem_core::Error::InvalidArguments { .. })), "{typed:?}");
    // `{e}` names the part refused, the cause why.
    let e = typed.unwrap_err();
    assert!(e.to_string().ends_with("its arguments cannot make an idempotency key"), "{e}");
    let why = idem_core::ErrorChain(&e).to_string();
    assert!(why.contains(": argument `tags` is a HashSet"), "{why}");
    assert_eq!(TAGGED.load(Ordering::SeqCst), 0, "never run, never keyed at random");
}

/// An order whose tags are a `HashSet`, inside a type of the application's own: the parameter's
/// declared type (`Order`) does not say it holds one.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct Order {
    id: String,
    tags: std::collections::HashSet<String>,
}

/// The same fields as a tool's whole arguments (`#[idem(flatten)]`, rmcp's `Parameters<T>` style).
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct Labels {
    id: String,
    labels: Option<std::collections::HashSet<String>>,
}

static NESTED_SET_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Tags an order.
#[tool(retry = "keyed")]
async fn tag_order(order: Order) -> Result<u32, Declined> {
    let _ = order;
    NESTED_SET_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(1)
}

/// Labels an order.
#[tool(retry = "keyed")]
async fn label_order(#[idem(flatten)] labels: Labels) -> Result<u32, Declined> {
    let _ = labels;
    NESTED_SET_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(1)
}

/// A `HashSet` inside a struct of the application's own is read from the same JSON into
/// another order on every call, so the same arguments got another key on every repeat and
/// the tool ran again each time. It is refused like a `HashSet` parameter, naming where it is
/// and what to declare instead, on the typed and the tool-set path; nothing runs.
#[tokio::test]
async fn a_hash_set_inside_an_argument_is_refused_rather_than_keyed_at_random() {
    let set = ToolSet::new().with(TagOrderTool).unwrap().with(LabelOrderTool).unwrap();
    let run = Idem::in_memory().run("r");
    let tags: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
    for (tool, args, path) in [
        ("tag_order", json!({"order": {"id": "o-1", "tags": tags}}), "argument `order.tags`"),
        ("label_order", json!({"id": "o-1", "labels": tags}), "argument `labels`"),
    ] {
        for _ in 0..3 {
            let r = set.call(&run, tool, &args).await;
            assert_eq!(r.content["error"]["kind"], "invalid_arguments", "{tool}: {}", r.text);
            assert!(r.text.contains(&format!("{path} is a HashSet")), "{tool}: {}", r.text);
            assert!(r.text.contains("BTreeSet"), "{}", r.text);
        }
    }
    let order = Order { id: "o-1".into(), tags: tags.iter().cloned().collect() };
    let typed = tag_order(&run, order).await;
    match typed {
        Err(idem_core::Error::InvalidArguments { source, .. }) => {
            assert_eq!(source, idem_core::KeyError::UnorderedSet { path: "order.tags".into() })
        }
        other => panic!("expected InvalidArguments, got {other:?}"),
    }
    assert_eq!(NESTED_SET_RUNS.load(Ordering::SeqCst), 0, "never run, never keyed at random");

    // A set that is not there (`None`) is no set: the call runs once and replays.
    let args = json!({"id": "o-2", "labels": null});
    for _ in 0..2 {
        let r = set.call(&run, "label_order", &args).await;
        assert!(!r.is_error, "{}", r.text);
    }
    assert_eq!(NESTED_SET_RUNS.load(Ordering::SeqCst), 1);
}

/// A webhook call whose payload is forwarded as the model wrote it (a `RawValue`: its own digits).
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct Forward {
    url: String,
    #[schemars(with = "serde_json::Value")]
    payload: Box<serde_json::value::RawValue>,
}

static FORWARDED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Posts a payload to a webhook.
#[tool(retry = "keyed")]
async fn forward(#[idem(flatten)] call: Forward) -> Result<String, Declined> {
    let sent = call.payload.get().to_owned();
    FORWARDED.lock().unwrap().push(sent.clone());
    Ok(sent)
}

/// A raw payload is sent with its own digits, but its key was derived from the numbers read as
/// serde_json reads them (the nearest 64-bit float beyond 64-bit integers): two transfers of
/// 20000000000000000001 and 20000000000000000002 wei shared one key, and the second was answered
/// with the first's outcome without being sent. Such a number is refused, naming it; numbers
/// that are exactly what the canonical form writes (`1.0`, `0.1`, `1e2`, `-0`, 64-bit
/// integers) are keyed as before.
#[tokio::test]
async fn a_raw_number_that_a_float_cannot_hold_is_refused_rather_than_sharing_a_key() {
    let set = ToolSet::new().with(ForwardTool).unwrap();
    let run = Idem::in_memory().run("r");
    for (value, shown) in [
        ("20000000000000000001", "20000000000000000001"),
        ("20000000000000000002", "20000000000000000002"),
        ("1.000000000000000001", "1.000000000000000001"),
        ("1", "1"),
    ] {
        let text = format!(
            r#"{{"url":"https://hooks.example/pay","payload":{{"wei":{value},"memo":"1e999"}}}}"#
        );
        let r = set.call_text(&run, "forward", &text).await;
        if value == "1" {
            assert!(!r.is_error, "{}", r.text);
            assert_eq!(r.content, json!(r#"{"wei":1,"memo":"1e999"}"#));
            continue;
        }
        assert_eq!(r.content["error"]["kind"], "invalid_arguments", "{value}: {}", r.text);
        assert!(
            r.text.contains(&format!("argument `payload` holds the number `{shown}`")),
            "{}",
            r.text
        );
    }
    assert_eq!(*FORWARDED.lock().unwrap(), vec![r#"{"wei":1,"memo":"1e999"}"#.to_owned()]);

    // Numbers the canonical form writes exactly keep their keys: equal values, one key.
    let run = Idem::in_memory().run("r2");
    let mut keys = Vec::new();
    for payload in [
        r#"{"a":1.0,"b":0.1,"c":1e2,"d":-0,"e":18446744073709551615}"#,
        r#"{"e":18446744073709551615,"d":0,"c":100,"b":1e-1,"a":1}"#,
    ] {
        let text = format!(r#"{{"url":"u","payload":{payload}}}"#);
        let r = set.call_text(&run, "forward", &text).await;
        assert!(!r.is_error, "{}", r.text);
        keys.push(r.report.expect("a report").key);
    }
    assert_eq!(keys[0], keys[1]);
    assert_eq!(FORWARDED.lock().unwrap().len(), 2, "the second spelling replayed the first");
}

static PHONE_UPDATES: AtomicUsize = AtomicUsize::new(0);

/// Updates a contact's phone: `None` leaves it as it is, `Some(None)` clears it.
#[tool(retry = "keyed")]
async fn update_phone(contact: String, phone: Option<Option<String>>) -> Result<String, Declined> {
    PHONE_UPDATES.fetch_add(1, Ordering::SeqCst);
    Ok(format!("{contact}: {phone:?}"))
}

/// The same, with `None` left out of the key.
#[tool(retry = "keyed")]
async fn update_fax(
    contact: String,
    #[idem(skip_if_none)] fax: Option<Option<String>>,
) -> Result<String, Declined> {
    PHONE_UPDATES.fetch_add(1, Ordering::SeqCst);
    Ok(format!("{contact}: {fax:?}"))
}

/// `Some(None)` ("clear it") is written `null`, as `None` ("leave it") is: the clear shared the
/// leave's key and was answered with its outcome, so the phone was never cleared. It is refused,
/// naming the parameter and what to declare; a parameter marked `#[idem(skip_if_none)]` tells
/// the two apart (its `None` is left out of the key), and both run.
#[tokio::test]
async fn some_none_is_refused_where_its_key_would_be_the_key_of_none() {
    let run = Idem::in_memory().run("r");
    assert_eq!(update_phone(&run, "c-1".into(), None).await.unwrap(), "c-1: None");
    match update_phone(&run, "c-1".into(), Some(None)).await {
        Err(idem_core::Error::InvalidArguments { source, .. }) => {
            assert_eq!(source, idem_core::KeyError::AmbiguousNull { path: "phone".into() });
            assert!(source.to_string().contains("skip_if_none"), "{source}");
        }
        other => panic!("expected InvalidArguments, got {other:?}"),
    }
    assert_eq!(
        update_phone(&run, "c-1".into(), Some(Some("555".into()))).await.unwrap(),
        r#"c-1: Some(Some("555"))"#
    );
    assert_eq!(PHONE_UPDATES.load(Ordering::SeqCst), 2, "the refused call did not run");

    assert_eq!(update_fax(&run, "c-1".into(), None).await.unwrap(), "c-1: None");
    assert_eq!(update_fax(&run, "c-1".into(), Some(None)).await.unwrap(), "c-1: Some(None)");
    assert_eq!(PHONE_UPDATES.load(Ordering::SeqCst), 4);

    // From JSON, `null` and a missing field are both `None`: one intent, one run.
    let set = ToolSet::new().with(UpdatePhoneTool).unwrap();
    let run = Idem::in_memory().run("r2");
    for args in [json!({"contact": "c-2", "phone": null}), json!({"contact": "c-2"})] {
        let r = set.call(&run, "update_phone", &args).await;
        assert_eq!(r.content, json!("c-2: None"), "{}", r.text);
    }
    assert_eq!(PHONE_UPDATES.load(Ordering::SeqCst), 5);
}

/// A payout whose memo is read but never written: `skip_serializing` keeps it out of the key.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct Payout {
    to: String,
    #[serde(skip_serializing, default)]
    memo: String,
}

/// A batch of payouts, the memo one level down.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct Batch {
    payouts: Vec<Payout>,
}

static PAYOUTS: AtomicUsize = AtomicUsize::new(0);

/// Sends a payout.
#[tool(retry = "keyed")]
async fn payout(#[idem(flatten)] p: Payout) -> Result<String, Declined> {
    PAYOUTS.fetch_add(1, Ordering::SeqCst);
    Ok(format!("{} {}", p.to, p.memo))
}

/// Sends a batch of payouts.
#[tool(retry = "keyed")]
async fn payout_batch(batch: Batch) -> Result<usize, Declined> {
    PAYOUTS.fetch_add(1, Ordering::SeqCst);
    Ok(batch.payouts.len())
}

/// Payouts by id: the memo one level down, below a map whose keys are integers (schemars writes
/// its values under `patternProperties`).
#[tool(retry = "keyed")]
async fn payouts_by_id(
    payouts: std::collections::BTreeMap<u64, Payout>,
) -> Result<usize, Declined> {
    PAYOUTS.fetch_add(1, Ordering::SeqCst);
    Ok(payouts.len())
}

/// A payout stamped with a version it writes but never reads: one member only written beside
/// one only read.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct StampedPayout {
    to: String,
    #[serde(skip_serializing, default)]
    memo: String,
    #[serde(skip_deserializing, default)]
    version: u32,
}

/// Sends a stamped payout.
#[tool(retry = "keyed")]
async fn stamped_payout(#[idem(flatten)] p: StampedPayout) -> Result<String, Declined> {
    PAYOUTS.fetch_add(1, Ordering::SeqCst);
    Ok(format!("{} {} {}", p.to, p.memo, p.version))
}

/// The key is derived from what the arguments write: a member they read but skip when written
/// made `{"to":"a","memo":"rent"}` and `{"to":"a","memo":"refund"}` one key, and the second
/// payout was answered with the first's outcome. Such a tool is refused when the set is built,
/// naming the member; a model never reaches it (the other tools stay).
#[tokio::test]
async fn a_member_read_but_not_written_keeps_the_tool_out_of_the_set() {
    for (tool, member) in [
        (ToolSet::new().with(PayoutTool).map(drop), "memo"),
        (ToolSet::new().with(PayoutBatchTool).map(drop), "batch.payouts.memo"),
        // Both were served: the map's values were not compared, and a member only written
        // made the counts of members read and written equal.
        (ToolSet::new().with(PayoutsByIdTool).map(drop), "payouts.memo"),
        (ToolSet::new().with(StampedPayoutTool).map(drop), "memo"),
    ] {
        match tool {
            Err(idem_core::ToolSetError::ReadButNotKeyed { property, .. }) => {
                assert_eq!(property, member);
            }
            other => panic!("expected ReadButNotKeyed for `{member}`, got {other:?}"),
        }
    }
    // Were it served, the second payout would be answered with the first's outcome.
    let mut set = ToolSet::new().with(ChargeTool).unwrap();
    assert!(set.add(PayoutTool).is_err());
    let run = Idem::in_memory().run("r");
    let r = set.call(&run, "payout", &json!({"to": "a", "memo": "rent"})).await;
    assert_eq!(r.content["error"]["kind"], "unknown_tool", "{}", r.text);
    assert_eq!(PAYOUTS.load(Ordering::SeqCst), 0);
    assert_eq!(set.len(), 1, "the other tools stay");
}

/// Reads a present field as `Some`, `null` included: `null` means "clear it", absence "leave it"
/// (the double-option pattern of PATCH-style tools).
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// A ticket update whose `description: null` clears the description, and whose missing
/// `description` leaves it; both are written `null` (no `skip_serializing_if`).
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct TicketPatch {
    id: String,
    #[serde(default, deserialize_with = "present")]
    description: Option<Option<String>>,
}

/// The same update, with `None` left out when written.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct TicketPatchSkipping {
    id: String,
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    description: Option<Option<String>>,
}

static PATCHES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Updates a ticket.
#[tool(retry = "keyed")]
async fn patch_ticket(#[idem(flatten)] patch: TicketPatch) -> Result<String, Declined> {
    let done = format!("{}: {:?}", patch.id, patch.description);
    PATCHES.lock().unwrap().push(done.clone());
    Ok(done)
}

/// Updates a ticket (`None` left out of the key).
#[tool(retry = "keyed")]
async fn patch_ticket_skipping(
    #[idem(flatten)] patch: TicketPatchSkipping,
) -> Result<String, Declined> {
    let done = format!("{}: {:?}", patch.id, patch.description);
    PATCHES.lock().unwrap().push(done.clone());
    Ok(done)
}

/// `{"id":"t1"}` (leave the description) and `{"id":"t1","description":null}` (clear it) were
/// one key: the clear was answered with the leave's outcome and never ran. The clear is refused,
/// naming the field and what to declare; a field whose `None` is left out of the key runs both.
#[tokio::test]
async fn a_null_read_as_clear_is_refused_where_its_key_is_the_key_of_absence() {
    let set = ToolSet::new().with(PatchTicketTool).unwrap().with(PatchTicketSkippingTool).unwrap();
    let run = Idem::in_memory().run("r");
    let leave = set.call(&run, "patch_ticket", &json!({"id": "t1"})).await;
    assert_eq!(leave.content, json!("t1: None"), "{}", leave.text);
    for clear in [
        set.call(&run, "patch_ticket", &json!({"id": "t1", "description": null})).await,
        set.call_text(&run, "patch_ticket", r#"{"description":null,"id":"t1"}"#).await,
    ] {
        assert_eq!(clear.content["error"]["kind"], "invalid_arguments", "{}", clear.text);
        assert!(clear.text.contains("argument `description` is `Some`"), "{}", clear.text);
        assert!(clear.text.contains("skip_serializing_if"), "{}", clear.text);
    }
    // A value, or a null where absence reads the same, is keyed as before.
    let set_it = set.call(&run, "patch_ticket", &json!({"id": "t1", "description": "x"})).await;
    assert_eq!(set_it.content, json!(r#"t1: Some(Some("x"))"#), "{}", set_it.text);

    for args in [json!({"id": "t2"}), json!({"id": "t2", "description": null})] {
        let r = set.call(&run, "patch_ticket_skipping", &args).await;
        assert!(!r.is_error, "{}", r.text);
    }
    assert_eq!(
        *PATCHES.lock().unwrap(),
        ["t1: None", r#"t1: Some(Some("x"))"#, "t2: None", "t2: Some(None)"],
        "the clear ran only where its key differs from the leave's"
    );
}

/// A line of a ledger update whose note a model may send as `null`.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct Attachment {
    note: Option<String>,
}

/// A ledger update in the shape OpenAI's strict mode sends (every optional member present,
/// `null` when unset), with a limit beyond 64 bits and a `description` whose `null` clears it.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct LedgerPatch {
    id: String,
    #[serde(default)]
    attachments: Vec<Attachment>,
    #[serde(default)]
    limit: Option<u128>,
    #[serde(default, deserialize_with = "present")]
    description: Option<Option<String>>,
}

static LEDGER_PATCHES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Updates a ledger entry.
#[tool(retry = "keyed")]
async fn patch_ledger(#[idem(flatten)] patch: LedgerPatch) -> Result<String, Declined> {
    let done = format!("{}: {:?}", patch.id, patch.description);
    LEDGER_PATCHES.lock().unwrap().push(done.clone());
    Ok(done)
}

/// The clear is refused however many other `null`s come before it (the check once gave up
/// after 16) and whatever numbers beside it a parsed value cannot hold (it read the arguments
/// again from a value, which failed on a limit beyond 64 bits, and the call was accepted): in
/// both, the clear was answered with the leave's outcome and never ran.
#[tokio::test]
async fn a_null_read_as_clear_is_refused_beside_many_nulls_and_wide_numbers() {
    let set = ToolSet::new().with(PatchLedgerTool).unwrap();
    let run = Idem::in_memory().run("r");
    let lines = vec![json!({"note": null}); 40];
    let leave = json!({"id": "t1", "attachments": lines});
    let mut clear = leave.clone();
    clear["description"] = serde_json::Value::Null;
    let r = set.call(&run, "patch_ledger", &leave).await;
    assert_eq!(r.content, json!("t1: None"), "{}", r.text);
    let wide = r#"{"id":"t2","limit":18446744073709551616}"#;
    let r = set.call_text(&run, "patch_ledger", wide).await;
    assert_eq!(r.content, json!("t2: None"), "{}", r.text);
    let clear_text = clear.to_string();
    for r in [
        set.call(&run, "patch_ledger", &clear).await,
        set.call_text(&run, "patch_ledger", &clear_text).await,
        set.call_text(
            &run,
            "patch_ledger",
            r#"{"id":"t2","limit":18446744073709551616,"description":null}"#,
        )
        .await,
        // Encoded twice, as some clients send arguments.
        set.call(
            &run,
            "patch_ledger",
            &json!(r#"{"description":null,"limit":18446744073709551616,"id":"t2"}"#),
        )
        .await,
    ] {
        assert_eq!(r.content["error"]["kind"], "invalid_arguments", "{}", r.text);
        assert!(r.text.contains("argument `description` is `Some`"), "{}", r.text);
    }
    assert_eq!(*LEDGER_PATCHES.lock().unwrap(), ["t1: None", "t2: None"], "only the leaves ran");
}

/// A tip in cents or in dollars, told apart by how the number is written: `5` and `5.0`.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
enum Tip {
    Cents(u64),
    Dollars(f64),
}

static TIPS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Pays tips by order id, with a ledger entry beside them.
#[tool(retry = "keyed")]
async fn pay_tips(
    tips: std::collections::BTreeMap<u64, Tip>,
    ledger: Option<u128>,
) -> Result<String, Declined> {
    let paid = format!("{tips:?} {ledger:?}");
    TIPS.lock().unwrap().push(paid.clone());
    Ok(paid)
}

/// `5.0` dollars was answered with the outcome of `5` cents in three places the check missed:
/// a map with integer keys (its values' schema is under `patternProperties`), beside an
/// integer beyond 64 bits (which a parsed value cannot hold, and the check gave up), and as a
/// fraction whose double is whole (`4.9999999999999999`, read as 5.0, keyed as 5). Each is
/// refused, naming where; the cents run once.
#[tokio::test]
async fn a_whole_float_an_untagged_enum_reads_as_its_integer_is_refused_wherever_it_is() {
    let set = ToolSet::new().with(PayTipsTool).unwrap();
    let run = Idem::in_memory().run("r");
    let wide = "18446744073709551616";
    for cents in
        [r#"{"tips":{"7":5}}"#.to_owned(), format!(r#"{{"tips":{{"7":5}},"ledger":{wide}}}"#)]
    {
        let r = set.call_text(&run, "pay_tips", &cents).await;
        assert!(!r.is_error, "{cents}: {}", r.text);
    }
    for dollars in [
        r#"{"tips":{"7":5.0}}"#.to_owned(),
        format!(r#"{{"tips":{{"7":5.0}},"ledger":{wide}}}"#),
        r#"{"tips":{"7":4.9999999999999999}}"#.to_owned(),
        r#"{"tips":{"7":5e0}}"#.to_owned(),
    ] {
        let r = set.call_text(&run, "pay_tips", &dollars).await;
        assert_eq!(r.content["error"]["kind"], "invalid_arguments", "{dollars}: {}", r.text);
        assert!(r.text.contains("argument `tips.7` is `5.0`"), "{dollars}: {}", r.text);
    }
    let r = set.call(&run, "pay_tips", &json!({"tips": {"7": 5.0}})).await;
    assert_eq!(r.content["error"]["kind"], "invalid_arguments", "{}", r.text);
    // A fraction that is not whole is dollars, and runs.
    let r = set.call_text(&run, "pay_tips", r#"{"tips":{"7":5.5}}"#).await;
    assert!(!r.is_error, "{}", r.text);
    assert_eq!(
        *TIPS.lock().unwrap(),
        [
            "{7: Cents(5)} None",
            "{7: Cents(5)} Some(18446744073709551616)",
            "{7: Dollars(5.5)} None"
        ],
        "each intent ran once; no whole dollars ran, or were answered with cents"
    );
}

/// A document update whose `description: null` clears it, beside a free-form payload and a
/// field whose absence reads as a default other than its `null`.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct DocumentPatch {
    id: String,
    #[serde(default, deserialize_with = "present")]
    description: Option<Option<String>>,
    #[serde(default)]
    attributes: serde_json::Value,
    #[serde(default = "three")]
    copies: Option<u8>,
}

fn three() -> Option<u8> {
    Some(3)
}

static DOCUMENTS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Updates a document.
#[tool(retry = "keyed")]
async fn patch_document(#[idem(flatten)] patch: DocumentPatch) -> Result<String, Declined> {
    let done = format!("{}: {:?}", patch.id, patch.description);
    DOCUMENTS.lock().unwrap().push(done.clone());
    Ok(done)
}

/// The clear was answered with the leave's outcome when the arguments held other `null`s whose
/// absence changes the key (a free-form payload's, a field defaulting to `Some(3)`) and were
/// too large to try each `null` alone: those were left out together with the clear, the key
/// changed, and the clear was never named. Only the `null`s the tool reads as such a `Some` are
/// asked about now.
#[tokio::test]
async fn a_null_read_as_clear_is_refused_beside_nulls_whose_absence_changes_the_key() {
    let set = ToolSet::new().with(PatchDocumentTool).unwrap();
    let run = Idem::in_memory().run("r");
    let attributes: serde_json::Map<String, serde_json::Value> =
        (0..800).map(|i| (format!("k{i:03}"), serde_json::Value::Null)).collect();
    let mut large: serde_json::Map<String, serde_json::Value> =
        (0..10).map(|i| (format!("n{i}"), serde_json::Value::Null)).collect();
    large.insert("pad".into(), json!("p".repeat(900_000)));
    for (id, extra) in [("flat", json!(attributes)), ("large", json!(large))] {
        let leave = json!({"id": id, "attributes": extra, "copies": null});
        let r = set.call(&run, "patch_document", &leave).await;
        assert_eq!(r.content, json!(format!("{id}: None")), "{}", r.text);
        let mut clear = leave.clone();
        clear["description"] = serde_json::Value::Null;
        let text = clear.to_string();
        for r in [
            set.call(&run, "patch_document", &clear).await,
            set.call_text(&run, "patch_document", &text).await,
        ] {
            assert_eq!(r.content["error"]["kind"], "invalid_arguments", "{id}: {}", r.text);
            assert!(r.text.contains("argument `description` is `Some`"), "{id}: {}", r.text);
        }
    }
    assert_eq!(*DOCUMENTS.lock().unwrap(), ["flat: None", "large: None"], "only the leaves ran");
}
