//! `#[tool]` end to end: generated tools called on `Idem::in_memory()`, counting side effects.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::{Classify, Ctx, Error, Failure, Idem, RetryClass, Run, Tool, tool};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
enum PayError {
    #[error("card declined")]
    Declined,
    #[error("provider unreachable")]
    Unreachable,
    #[error("provider timed out after sending")]
    TimedOut,
}

impl Classify for PayError {
    fn classify(&self) -> Failure {
        match self {
            PayError::Declined => Failure::permanent(),
            PayError::Unreachable => Failure::transient(),
            PayError::TimedOut => Failure::ambiguous(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Charge {
    id: String,
    amount_cents: u64,
}

/// Calls `tool` with JSON arguments, as a tool set does for a model's tool call.
async fn call_json<T: Tool>(
    run: &Run,
    tool: &T,
    json: serde_json::Value,
) -> Result<T::Output, Error<T::Error>> {
    let args: T::Args = serde_json::from_value(json).expect("arguments match the schema");
    run.call(tool, args).await
}

static CHARGES: AtomicU32 = AtomicU32::new(0);

/// Charge a customer's card.
///
/// The amount is in cents.
#[tool(retry = "keyed")]
async fn charge(cx: &Ctx, customer: String, amount_cents: u64) -> Result<Charge, PayError> {
    let n = CHARGES.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(Charge { id: format!("ch_{n}_{customer}_{}", &cx.key()[..8]), amount_cents })
}

#[tokio::test]
async fn keyed_tool_called_twice_with_same_args_runs_once() {
    let run = Idem::in_memory().run("r1");
    let first = charge(&run, "cus_1".into(), 4900).await.unwrap();
    let again = charge(&run, "cus_1".into(), 4900).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(CHARGES.load(Ordering::SeqCst), 1);

    let other = charge(&run, "cus_1".into(), 5000).await.unwrap();
    assert_ne!(other.id, first.id);
    assert_eq!(CHARGES.load(Ordering::SeqCst), 2);

    // The same intent from the model, by name with JSON arguments, is a replay too.
    let by_json = call_json(
        &run,
        &ChargeTool,
        serde_json::json!({"customer": "cus_1", "amount_cents": 4900}),
    )
    .await
    .unwrap();
    assert_eq!(by_json, first);
    assert_eq!(CHARGES.load(Ordering::SeqCst), 2);
}

#[test]
fn doc_comment_is_the_description_and_fn_name_the_name() {
    let def = ChargeTool.def();
    assert_eq!(def.name, "charge");
    assert_eq!(def.description, "Charge a customer's card.\n\nThe amount is in cents.");
    assert_eq!(def.class, RetryClass::Keyed);
    assert_eq!(def.options, idem_core::ToolOptions::default());
}

#[test]
fn arguments_schema_lists_parameters_but_not_the_context_and_refuses_unknown_fields() {
    let schema = serde_json::to_value(schemars::schema_for!(ChargeArgs)).unwrap();
    let props = schema["properties"].as_object().unwrap();
    let mut names: Vec<&str> = props.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(names, ["amount_cents", "customer"]);
    assert_eq!(schema["additionalProperties"], serde_json::json!(false));

    let invented = serde_json::json!({"customer": "c", "amount_cents": 1, "currency": "EUR"});
    let Err(err) = serde_json::from_value::<ChargeArgs>(invented) else {
        panic!("an invented field was accepted")
    };
    assert!(err.to_string().contains("unknown field `currency`"), "{err}");
}

#[test]
fn the_schema_the_model_reads_carries_no_rustdoc_text_of_the_arguments_type() {
    // The `..Args` alias's rustdoc ("The arguments of the tool `charge` (see [`charge`]), as
    // the model sends them ..") was the schema's description: link markup and text about the
    // model, sent to the model with every free fn tool (method tools had none).
    let schema = serde_json::to_value(schemars::schema_for!(ChargeArgs)).unwrap();
    assert_eq!(schema.get("description"), None, "{schema}");
}

/// Seven arguments: the typed call takes the run too (eight), which clippy's
/// `too_many_arguments` must not report in the user's crate (`-D warnings`).
#[tool(retry = "safe")]
async fn seven(a: u8, b: u8, c: u8, d: u8, e: u8, f: u8, g: u8) -> Result<u32, PayError> {
    Ok([a, b, c, d, e, f, g].iter().map(|&n| u32::from(n)).sum())
}

struct Wide;

impl Wide {
    /// Six arguments, and the receiver and the run.
    #[tool(retry = "safe")]
    async fn six(&self, a: u8, b: u8, c: u8, d: u8, e: u8, f: u8) -> Result<u32, PayError> {
        Ok([a, b, c, d, e, f].iter().map(|&n| u32::from(n)).sum())
    }
}

#[tokio::test]
async fn tools_with_many_arguments_are_called_like_others() {
    let run = Idem::in_memory().run("conv-wide");
    assert_eq!(seven(&run, 1, 1, 1, 1, 1, 1, 1).await.unwrap(), 7);
    assert_eq!(Arc::new(Wide).six(&run, 1, 1, 1, 1, 1, 1).await.unwrap(), 6);
}

static MAILS: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "keyed")]
async fn send_mail(
    to: String,
    body: String,
    #[idem(skip)] request_id: String,
) -> Result<u32, PayError> {
    let _ = (to, body, request_id);
    Ok(MAILS.fetch_add(1, Ordering::SeqCst) + 1)
}

#[tokio::test]
async fn skipped_parameter_does_not_change_the_key() {
    let run = Idem::in_memory().run("r1");
    let a = send_mail(&run, "a@x".into(), "hi".into(), "req-1".into()).await.unwrap();
    let b = send_mail(&run, "a@x".into(), "hi".into(), "req-2".into()).await.unwrap();
    assert_eq!((a, b), (1, 1));
    assert_eq!(MAILS.load(Ordering::SeqCst), 1);
    send_mail(&run, "a@x".into(), "other".into(), "req-3".into()).await.unwrap();
    assert_eq!(MAILS.load(Ordering::SeqCst), 2);
}

static NOTES: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "keyed", skip(trace_id))]
async fn add_note(text: String, trace_id: u64) -> Result<u32, PayError> {
    let _ = (text, trace_id);
    Ok(NOTES.fetch_add(1, Ordering::SeqCst) + 1)
}

#[tokio::test]
async fn skip_in_the_attribute_works_like_the_parameter_marker() {
    let run = Idem::in_memory().run("r1");
    add_note(&run, "n".into(), 1).await.unwrap();
    add_note(&run, "n".into(), 2).await.unwrap();
    assert_eq!(NOTES.load(Ordering::SeqCst), 1);
}

static LABELS: AtomicU32 = AtomicU32::new(0);

/// A parameter named by a keyword (the JSON field `type`), skipped by its JSON name.
#[tool(retry = "keyed", skip(type))]
async fn label(text: String, r#type: String) -> Result<u32, PayError> {
    let _ = (text, r#type);
    Ok(LABELS.fetch_add(1, Ordering::SeqCst) + 1)
}

#[tokio::test]
async fn skip_names_a_raw_identifier_parameter_by_its_json_name() {
    let run = Idem::in_memory().run("r1");
    label(&run, "n".into(), "a".into()).await.unwrap();
    label(&run, "n".into(), "b".into()).await.unwrap();
    assert_eq!(LABELS.load(Ordering::SeqCst), 1);
    let schema = schemars::schema_for!(LabelArgs);
    assert!(schema.as_value()["properties"]["type"].is_object(), "{schema:?}");
}

/// Two deployments of one tool: the second added an optional `memo`, marked so that the calls
/// without one keep their keys, and an unmarked `priority`, which changes every key.
mod ticket_v1 {
    use super::*;

    pub static OPENED: AtomicU32 = AtomicU32::new(0);

    #[tool(retry = "keyed", name = "open_ticket")]
    pub async fn open_ticket(cx: &Ctx, title: String) -> Result<String, PayError> {
        OPENED.fetch_add(1, Ordering::SeqCst);
        Ok(format!("v1 {title} {}", cx.key()))
    }
}

mod ticket_v2 {
    use super::*;

    #[tool(retry = "keyed", name = "open_ticket")]
    pub async fn open_ticket(
        cx: &Ctx,
        title: String,
        /// A note for the support team.
        #[idem(skip_if_none)]
        memo: Option<String>,
    ) -> Result<String, PayError> {
        ticket_v1::OPENED.fetch_add(1, Ordering::SeqCst);
        Ok(format!("v2 {title} {memo:?} {}", cx.key()))
    }

    #[tool(retry = "keyed", name = "open_ticket")]
    pub async fn open_ticket_unmarked(
        title: String,
        priority: Option<u8>,
    ) -> Result<String, PayError> {
        ticket_v1::OPENED.fetch_add(1, Ordering::SeqCst);
        Ok(format!("v2 unmarked {title} {priority:?}"))
    }
}

#[tokio::test]
async fn an_optional_parameter_skipped_when_none_keeps_the_keys_of_calls_without_it() {
    use serde_json::json;
    use ticket_v1::OPENED;
    let idem = Idem::in_memory();
    let run = idem.run("r-deploy");
    let before = ticket_v1::open_ticket(&run, "printer".into()).await.unwrap();
    assert_eq!(OPENED.load(Ordering::SeqCst), 1);

    // The retry after the deploy, with the memo absent, null or `None`: the first outcome.
    let v2 = ticket_v2::OpenTicketTool;
    for json in [json!({"title": "printer"}), json!({"title": "printer", "memo": null})] {
        let after = call_json(&run, &v2, json).await.unwrap();
        assert_eq!(after, before, "replayed, not opened again");
    }
    let typed = ticket_v2::open_ticket(&run, "printer".into(), None).await.unwrap();
    assert_eq!(typed, before);
    assert_eq!(OPENED.load(Ordering::SeqCst), 1, "one ticket across the deploy");

    // With a memo it is another intent.
    let with_memo =
        ticket_v2::open_ticket(&run, "printer".into(), Some("urgent".into())).await.unwrap();
    assert!(with_memo.starts_with("v2 printer Some(\"urgent\")"), "{with_memo}");
    assert_eq!(OPENED.load(Ordering::SeqCst), 2);

    // The parameter is still an optional argument the model sees, with its description.
    let schema = serde_json::to_value(schemars::schema_for!(ticket_v2::OpenTicketArgs)).unwrap();
    assert_eq!(schema["required"], json!(["title"]));
    assert_eq!(schema["properties"]["memo"]["description"], "A note for the support team.");

    // Without the marker a new optional parameter is `null` in the key: the same retry after
    // the deploy runs the tool again. This is what the marker is for.
    let again = ticket_v2::open_ticket_unmarked(&run, "printer".into(), None).await.unwrap();
    assert!(again.starts_with("v2 unmarked"), "{again}");
    assert_eq!(OPENED.load(Ordering::SeqCst), 3);
}

/// A provider client: the state a method tool holds.
#[derive(Default)]
struct Bank {
    ledger: Mutex<Vec<(String, u64)>>,
}

impl Bank {
    /// Move money between accounts.
    #[tool(retry = "keyed", name = "transfer_funds", attempts = 5)]
    async fn transfer(&self, cx: &Ctx, to: String, amount: u64) -> Result<usize, PayError> {
        let _ = cx.key();
        let mut ledger = self.ledger.lock().unwrap();
        ledger.push((to, amount));
        Ok(ledger.len())
    }

    /// Read a balance.
    #[tool(retry = "safe")]
    async fn balance(&self) -> Result<u64, PayError> {
        Ok(self.ledger.lock().unwrap().iter().map(|(_, a)| a).sum())
    }
}

#[tokio::test]
async fn method_tool_holds_its_receiver_and_runs_once_per_intent() {
    let bank = Arc::new(Bank::default());
    let run = Idem::in_memory().run("r1");
    assert_eq!(bank.transfer(&run, "acct_1".into(), 100).await.unwrap(), 1);
    assert_eq!(bank.transfer(&run, "acct_1".into(), 100).await.unwrap(), 1);

    let tool = bank.transfer_tool();
    assert_eq!(tool.def().name, "transfer_funds");
    assert_eq!(tool.def().description, "Move money between accounts.");
    assert_eq!(tool.def().options.attempts, Some(5));
    let replay =
        call_json(&run, &tool, serde_json::json!({"to": "acct_1", "amount": 100})).await.unwrap();
    assert_eq!(replay, 1);
    let second =
        call_json(&run, &tool, serde_json::json!({"to": "acct_2", "amount": 5})).await.unwrap();
    assert_eq!(second, 2);

    assert_eq!(bank.ledger.lock().unwrap().len(), 2);
    assert_eq!(bank.balance(&run).await.unwrap(), 105);
    assert_eq!(bank.balance_tool().def().class, RetryClass::Safe);
}

static SEEN: Mutex<Vec<(String, u32)>> = Mutex::new(Vec::new());

#[tool(retry = "keyed", attempts = 2)]
async fn flaky(cx: &Ctx, order: String) -> Result<String, PayError> {
    let mut seen = SEEN.lock().unwrap();
    seen.push((cx.key().to_owned(), cx.attempt()));
    if seen.len() < 3 { Err(PayError::Unreachable) } else { Ok(format!("{order} done")) }
}

#[tokio::test(start_paused = true)]
async fn context_gives_the_same_key_to_every_attempt_and_every_repeat() {
    let run = Idem::in_memory().run("r1");
    // Two attempts, both transient: the call fails and the claim is released.
    let err = flaky(&run, "o1".into()).await.unwrap_err();
    assert_eq!(err.tool_error(), Some(&PayError::Unreachable));
    // The model calls again: the same key, a new first attempt, and this time it works.
    assert_eq!(flaky(&run, "o1".into()).await.unwrap(), "o1 done");

    let seen = SEEN.lock().unwrap().clone();
    let attempts: Vec<u32> = seen.iter().map(|(_, a)| *a).collect();
    assert_eq!(attempts, [1, 2, 1]);
    assert!(seen.iter().all(|(k, _)| *k == seen[0].0));
    assert_eq!(seen[0].0.len(), 64);
}

static WIRES: AtomicU32 = AtomicU32::new(0);

/// Send a wire transfer. Nobody can deduplicate it.
#[tool(
    retry = "never",
    name = "wire",
    timeout = "500ms",
    deadline = "2m",
    lease = "10s",
    ttl = "1h"
)]
async fn wire_transfer(iban: String, amount_cents: u64) -> Result<String, PayError> {
    let _ = (iban, amount_cents);
    WIRES.fetch_add(1, Ordering::SeqCst);
    Err(PayError::TimedOut)
}

#[test]
fn options_reach_the_tool_definition() {
    let def = WireTransferTool.def();
    assert_eq!(def.name, "wire");
    assert_eq!(def.class, RetryClass::Never);
    assert_eq!(def.options.attempts, None);
    assert_eq!(def.options.attempt_timeout, Some(Duration::from_millis(500)));
    assert_eq!(def.options.deadline, Some(Duration::from_secs(120)));
    assert_eq!(def.options.lease, Some(Duration::from_secs(10)));
    assert_eq!(def.options.ttl, Some(Duration::from_secs(3600)));
}

#[tokio::test]
async fn never_tool_answers_outcome_unknown_and_does_not_run_again() {
    let run = Idem::in_memory().run("r1");
    let first = wire_transfer(&run, "DE00".into(), 100).await.unwrap_err();
    assert!(matches!(first, Error::OutcomeUnknown { tool: "wire", .. }), "{first:?}");
    let again = wire_transfer(&run, "DE00".into(), 100).await.unwrap_err();
    assert!(matches!(again, Error::OutcomeUnknown { .. }), "{again:?}");
    assert_eq!(WIRES.load(Ordering::SeqCst), 1);
}

static DECLINES: AtomicU32 = AtomicU32::new(0);

type PayResult<T> = Result<T, PayError>;

/// Works with a `Result` alias too.
#[tool(retry = "keyed")]
async fn charge_declined(customer: String) -> PayResult<Charge> {
    let _ = customer;
    DECLINES.fetch_add(1, Ordering::SeqCst);
    Err(PayError::Declined)
}

#[tokio::test]
async fn permanent_error_is_replayed_through_a_result_alias() {
    let run = Idem::in_memory().run("r1");
    for _ in 0..3 {
        let err = charge_declined(&run, "cus_9".into()).await.unwrap_err();
        assert_eq!(err.tool_error(), Some(&PayError::Declined));
    }
    assert_eq!(DECLINES.load(Ordering::SeqCst), 1);
}

static LOOKUPS: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "safe")]
async fn lookup(run: String) -> Result<String, PayError> {
    LOOKUPS.fetch_add(1, Ordering::SeqCst);
    Ok(run.to_uppercase())
}

#[tokio::test]
async fn safe_tool_runs_each_call_and_a_parameter_may_be_named_run() {
    let idem_run = Idem::in_memory().run("r1");
    assert_eq!(lookup(&idem_run, "x".into()).await.unwrap(), "X");
    assert_eq!(lookup(&idem_run, "x".into()).await.unwrap(), "X");
    // Safe tools without caching do not store results: each sequential call runs.
    assert_eq!(LOOKUPS.load(Ordering::SeqCst), 2);
}

/// Parameters that take every name the run parameter tries before a numbered one.
#[tool(retry = "safe")]
async fn relay(run: String, idem_run: String, __idem_run: String) -> Result<String, PayError> {
    Ok(format!("{run}/{idem_run}/{__idem_run}"))
}

#[tokio::test]
async fn parameters_named_like_every_run_name_keep_their_values() {
    let r = Idem::in_memory().run("r1");
    assert_eq!(relay(&r, "a".into(), "b".into(), "c".into()).await.unwrap(), "a/b/c");
    let json = serde_json::json!({"run": "a", "idem_run": "b", "__idem_run": "c"});
    assert_eq!(call_json(&r, &RelayTool, json).await.unwrap(), "a/b/c");
}

static SLOW_CHARGES: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "keyed")]
async fn slow_charge(cx: &Ctx, customer: String) -> Result<String, PayError> {
    // Long enough that every duplicate arrives while the first call is in flight.
    tokio::time::sleep(Duration::from_millis(50)).await;
    SLOW_CHARGES.fetch_add(1, Ordering::SeqCst);
    Ok(format!("{customer}:{}", cx.key()))
}

#[tokio::test(start_paused = true)]
async fn concurrent_duplicates_join_the_first_call() {
    let run = Idem::in_memory().run("r1");
    let calls = (0..12).map(|_| {
        let run = run.clone();
        tokio::spawn(async move { slow_charge(&run, "cus_3".into()).await })
    });
    let answers: Vec<String> = futures_util::future::join_all(calls)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    assert_eq!(answers.len(), 12);
    assert!(answers.iter().all(|a| *a == answers[0]));
    assert_eq!(SLOW_CHARGES.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_same_arguments_in_another_run_are_another_intent() {
    static RUNS: AtomicU32 = AtomicU32::new(0);
    /// Counts its executions.
    #[tool(retry = "keyed")]
    async fn count_me(n: u32) -> Result<u32, PayError> {
        Ok(RUNS.fetch_add(n, Ordering::SeqCst) + n)
    }
    let idem = Idem::in_memory();
    count_me(&idem.run("a"), 1).await.unwrap();
    count_me(&idem.run("a"), 1).await.unwrap();
    count_me(&idem.run("b"), 1).await.unwrap();
    assert_eq!(RUNS.load(Ordering::SeqCst), 2);
}

/// Look up an order; the note is optional.
#[tool(retry = "safe")]
async fn find_order(order_id: String, note: Option<String>) -> Result<String, PayError> {
    Ok(format!("{order_id}:{note:?}"))
}

#[test]
fn arguments_read_and_write_like_a_derived_struct() {
    use serde_json::json;
    // Fields in any order; a missing `Option` is `None`.
    let args: FindOrderArgs =
        serde_json::from_value(json!({"note": "x", "order_id": "o1"})).unwrap();
    assert_eq!(args.0, ("o1".to_owned(), Some("x".to_owned())));
    let args: FindOrderArgs = serde_json::from_value(json!({"order_id": "o1"})).unwrap();
    assert_eq!(args.0.1, None);
    // Written as an object named by the parameters.
    assert_eq!(
        serde_json::to_value(FindOrderArgs::new("o1".into(), None)).unwrap(),
        json!({"order_id": "o1", "note": null})
    );
    assert_eq!(
        format!("{:?}", FindOrderArgs::new("o1".into(), None)),
        r#"FindOrderArgs { order_id: "o1", note: None }"#
    );
    // Errors name the field, in serde's words.
    let err = |v| serde_json::from_value::<FindOrderArgs>(v).unwrap_err().to_string();
    assert_eq!(err(json!({"note": "x"})), "missing field `order_id`");
    assert_eq!(err(json!({"order_id": 1})), "invalid type: integer `1`, expected a string");
    assert_eq!(err(json!(7)), "invalid type: integer `7`, expected struct FindOrderArgs");
    let dup = serde_json::from_str::<FindOrderArgs>(r#"{"order_id":"a","order_id":"b"}"#);
    assert!(dup.unwrap_err().to_string().starts_with("duplicate field `order_id`"));
    // The schema requires what is not an `Option`.
    let schema = serde_json::to_value(schemars::schema_for!(FindOrderArgs)).unwrap();
    assert_eq!(schema["title"], "FindOrderArgs");
    assert_eq!(schema["required"], json!(["order_id"]));
    assert_eq!(schema["properties"]["note"]["type"], json!(["string", "null"]));
}

#[test]
fn the_intent_is_the_canonical_text_of_the_arguments_not_skipped() {
    let args = SendMailArgs::new("a@x".into(), "hi".into(), "req-1".into());
    let mut intent = Vec::new();
    <SendMailTool as Tool>::write_intent(&args, &mut intent).unwrap();
    assert_eq!(String::from_utf8(intent).unwrap(), r#"{"body":"hi","to":"a@x"}"#);
    let mut all = Vec::new();
    <FindOrderTool as Tool>::write_intent(&FindOrderArgs::new("o1".into(), None), &mut all)
        .unwrap();
    assert_eq!(String::from_utf8(all).unwrap(), r#"{"note":null,"order_id":"o1"}"#);
}

/// A client whose tools form one set (`#[tool_set]` on the block).
#[derive(Default)]
struct Shop {
    orders: Mutex<Vec<String>>,
}

#[idem_core::tool_set]
impl Shop {
    /// Place an order for a [`Charge`]; see [the ledger](crate::Bank).
    #[tool(retry = "keyed")]
    async fn place_order(&self, cx: &Ctx, item: String) -> Result<usize, PayError> {
        let _ = cx.key();
        let mut orders = self.orders.lock().unwrap();
        orders.push(item);
        Ok(orders.len())
    }

    #[tool(retry = "safe", description = "Count the orders placed so far.")]
    async fn count_orders(&self) -> Result<usize, PayError> {
        Ok(self.orders.lock().unwrap().len())
    }

    /// Not a tool: stays a plain method.
    fn clear(&self) {
        self.orders.lock().unwrap().clear();
    }
}

#[tokio::test]
async fn tool_set_on_an_impl_block_holds_its_tools_and_runs_them_through_idem() {
    let shop = Arc::new(Shop::default());
    let set = shop.tool_set();
    let names: Vec<&str> = set.definitions().map(|d| d.name).collect();
    assert_eq!(names, ["count_orders", "place_order"]);
    let place = set.definition("place_order").unwrap();
    assert_eq!(place.description, "Place an order for a `Charge`; see the ledger.");
    assert_eq!(
        set.definition("count_orders").unwrap().description,
        "Count the orders placed so far."
    );

    let run = Idem::in_memory().run("r1");
    let args = serde_json::json!({"item": "book"});
    let first = set.call(&run, "place_order", &args).await;
    let again = set.call(&run, "place_order", &args).await;
    assert_eq!((first.is_error, &first.content), (false, &serde_json::json!(1)));
    assert_eq!((again.is_error, again.content), (false, first.content));
    assert_eq!(shop.orders.lock().unwrap().len(), 1, "the repeat was replayed, not run");
    shop.clear();
    assert_eq!(shop.count_orders(&run).await.unwrap(), 0);
}

/// A second block of the same type (one per file, say): its set's method is named, since each
/// block adds one and a type cannot have two `tool_set`s.
#[idem_core::tool_set(fn_name = "refund_tools")]
impl Shop {
    /// Refund the last order.
    #[tool(retry = "keyed")]
    async fn refund_last(&self) -> Result<Option<String>, PayError> {
        Ok(self.orders.lock().unwrap().pop())
    }
}

struct Matcher;

/// A set's method may be named with a keyword, written raw.
#[idem_core::tool_set(fn_name = "r#match")]
impl Matcher {
    /// Match.
    #[tool(retry = "safe")]
    async fn matches(&self, text: String) -> Result<bool, PayError> {
        Ok(text.is_empty())
    }
}

#[test]
fn a_set_method_named_with_a_raw_keyword() {
    let set = Arc::new(Matcher).r#match();
    assert_eq!(set.definitions().map(|d| d.name).collect::<Vec<_>>(), ["matches"]);
}

#[tokio::test]
async fn two_blocks_of_one_type_each_name_their_set_and_merge() {
    let shop = Arc::new(Shop::default());
    let set = shop.tool_set().merge(shop.refund_tools()).expect("no name in both");
    let names: Vec<&str> = set.definitions().map(|d| d.name).collect();
    assert_eq!(names, ["count_orders", "place_order", "refund_last"]);
    let run = Idem::in_memory().run("r2");
    set.call(&run, "place_order", &serde_json::json!({"item": "pen"})).await;
    let refunded = set.call(&run, "refund_last", &serde_json::json!({})).await;
    assert_eq!((refunded.is_error, refunded.content), (false, serde_json::json!("pen")));
    assert!(shop.orders.lock().unwrap().is_empty());
}

#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Destination {
    Card { number: String },
    Bank { iban: String },
}

#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct PayoutArgs {
    amount: u64,
    #[serde(flatten)]
    to: Destination,
}

/// A block with a tool whose arguments' schema model APIs refuse (a flattened enum puts `oneOf`
/// at its root): found only when the set is built.
#[derive(Default)]
struct Payouts;

#[idem_core::tool_set]
impl Payouts {
    #[tool(retry = "never")]
    async fn payout(&self, #[idem(flatten)] args: PayoutArgs) -> Result<u64, PayError> {
        Ok(args.amount)
    }

    #[tool(retry = "safe")]
    async fn status(&self) -> Result<String, PayError> {
        Ok("ok".into())
    }
}

/// The tool set keeps the other tools, and the refused one is not lost without a word: it is
/// listed by `refusals`, and a call of it says why instead of "unknown tool" (MCP too).
#[tokio::test]
async fn a_tool_set_keeps_why_a_tool_was_left_out_and_says_it_on_a_call() {
    let set = Arc::new(Payouts).tool_set();
    let names: Vec<&str> = set.definitions().map(|d| d.name).collect();
    assert_eq!(names, ["status"]);
    let refusals: Vec<String> = set.refusals().map(ToString::to_string).collect();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert!(refusals[0].contains("`payout`") && refusals[0].contains("oneOf"), "{refusals:?}");
    // Printable as it is, for the message of a start-up check.
    assert_eq!(set.refusals().len(), 1);
    let listed = format!("{:?}", set.refusals());
    assert!(listed.contains("payout") && listed.contains("oneOf"), "{listed}");
    let run = Idem::in_memory().run("r1");
    let args = serde_json::json!({"amount": 5, "kind": "card", "number": "4242"});
    let r = set.call(&run, "payout", &args).await;
    assert_eq!(r.error_kind, Some(idem_core::toolset::ErrorKind::UnknownTool), "{}", r.text);
    assert!(r.text.contains("is not available") && r.text.contains("oneOf"), "{}", r.text);
    let mcp = serde_json::json!({"name": "payout", "arguments": args});
    let e = set.call_mcp(&run, &mcp).await.unwrap_err();
    assert!(e.message.contains("left out of the tool set"), "{e}");
}

/// Refund a charge.
#[doc = include_str!("fixtures/refund_doc.md")]
#[tool(retry = "keyed")]
async fn refund(charge_id: String) -> Result<String, PayError> {
    Ok(charge_id)
}

#[test]
fn included_doc_text_is_the_description_with_link_markup_removed() {
    assert_eq!(
        RefundTool.def().description,
        "Refund a charge.\nThe money goes back to the card of the `Charge`.\n\nSee refunds."
    );
}

/// Tools whose parameter is a type of the user's named `Ctx`, and a context marked explicitly.
mod own_ctx {
    use idem_core::tool;
    use serde::{Deserialize, Serialize};

    use super::PayError;

    /// The caller's own context type: an ordinary argument.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
    pub struct Ctx {
        pub tenant: String,
    }

    #[tool(retry = "safe")]
    pub async fn whoami(ctx: Ctx) -> Result<String, PayError> {
        Ok(ctx.tenant)
    }

    /// The context under another spelling, marked.
    pub type IdemCtx = idem_core::Ctx;

    #[tool(retry = "keyed")]
    pub async fn keyed(#[idem(ctx)] cx: &IdemCtx, n: u32) -> Result<String, PayError> {
        Ok(format!("{n}:{}", cx.key().len()))
    }
}

#[tokio::test]
async fn a_type_of_ones_own_named_ctx_is_an_argument_and_the_marked_context_is_not() {
    let run = Idem::in_memory().run("r1");
    let me = own_ctx::whoami(&run, own_ctx::Ctx { tenant: "acme".into() }).await.unwrap();
    assert_eq!(me, "acme");
    let schema = serde_json::to_value(schemars::schema_for!(own_ctx::WhoamiArgs)).unwrap();
    assert_eq!(schema["required"], serde_json::json!(["ctx"]));
    assert_eq!(own_ctx::keyed(&run, 7).await.unwrap(), "7:64");
    let schema = serde_json::to_value(schemars::schema_for!(own_ctx::KeyedArgs)).unwrap();
    assert_eq!(schema["required"], serde_json::json!(["n"]));
}

/// idem-core reached through another path (a facade crate re-exporting it).
mod facade {
    pub use idem_core as idem;
}

#[tool(retry = "safe", crate = "crate::facade::idem")]
async fn through_facade(n: u32) -> Result<u32, PayError> {
    Ok(n + 1)
}

#[tokio::test]
async fn crate_option_names_the_path_idem_core_is_reached_at() {
    let run = facade::idem::Idem::in_memory().run("r1");
    assert_eq!(through_facade(&run, 1).await.unwrap(), 2);
}

/// rmcp's style: one arguments struct whose fields are the tool's arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
struct PartialRefund {
    /// The charge to refund.
    charge_id: String,
    amount_cents: u64,
}

static FLAT_REFUNDS: AtomicU32 = AtomicU32::new(0);

/// Refund part of a charge.
#[tool(retry = "keyed", name = "partial_refund")]
async fn partial_refund(#[idem(flatten)] args: PartialRefund) -> Result<u64, PayError> {
    FLAT_REFUNDS.fetch_add(1, Ordering::SeqCst);
    Ok(args.amount_cents)
}

/// The same tool with the fields as separate parameters, under the same name.
#[tool(retry = "keyed", name = "partial_refund")]
async fn partial_refund_params(
    /// The charge to refund.
    charge_id: String,
    amount_cents: u64,
    note: Option<String>,
) -> Result<u64, PayError> {
    let _ = (charge_id, note);
    Ok(amount_cents)
}

#[tokio::test]
async fn a_flattened_struct_is_the_tools_top_level_arguments_and_intent() {
    let set = idem_core::ToolSet::new().with(PartialRefundTool).unwrap();
    let schema = &set.definition("partial_refund").unwrap().input_schema;
    let mut props: Vec<&str> =
        schema["properties"].as_object().unwrap().keys().map(String::as_str).collect();
    props.sort_unstable();
    assert_eq!(props, ["amount_cents", "charge_id"]);
    assert_eq!(schema["properties"]["charge_id"]["description"], "The charge to refund.");

    // The intent (so the key) is the one of the same fields passed as separate parameters.
    let mut flat = Vec::new();
    let args =
        idem_core::__private::Flat(PartialRefund { charge_id: "ch_1".into(), amount_cents: 5 });
    <PartialRefundTool as Tool>::write_intent(&args, &mut flat).unwrap();
    let mut separate = Vec::new();
    let params = PartialRefundParamsArgs::new("ch_1".into(), 5, None);
    <PartialRefundParamsTool as Tool>::write_intent(&params, &mut separate).unwrap();
    assert_eq!(String::from_utf8(flat).unwrap(), r#"{"amount_cents":5,"charge_id":"ch_1"}"#);
    assert_eq!(
        String::from_utf8(separate).unwrap(),
        r#"{"amount_cents":5,"charge_id":"ch_1","note":null}"#
    );

    // Typed, by JSON from the model, and again: one execution, the rest replayed.
    let run = Idem::in_memory().run("r1");
    let typed = partial_refund(&run, PartialRefund { charge_id: "ch_1".into(), amount_cents: 5 });
    assert_eq!(typed.await.unwrap(), 5);
    let json = serde_json::json!({"charge_id": "ch_1", "amount_cents": 5});
    let replayed = set.call(&run, "partial_refund", &json).await;
    assert_eq!((replayed.is_error, replayed.content), (false, serde_json::json!(5)));
    assert_eq!(FLAT_REFUNDS.load(Ordering::SeqCst), 1);
}

#[test]
fn parameter_doc_comments_describe_the_parameters_and_options_are_not_required() {
    let schema = serde_json::to_value(schemars::schema_for!(PartialRefundParamsArgs)).unwrap();
    assert_eq!(schema["properties"]["charge_id"]["description"], "The charge to refund.");
    assert!(schema["properties"]["amount_cents"].get("description").is_none());
    assert_eq!(schema["required"], serde_json::json!(["charge_id", "amount_cents"]));
}

/// An optional parameter whose type is an alias of `Option`.
type Memo = Option<String>;

/// Open a ticket.
#[tool(retry = "keyed")]
async fn open_case(title: String, memo: Memo) -> Result<String, PayError> {
    Ok(format!("{title}{}", memo.unwrap_or_default()))
}

/// The schema says what the arguments read: a parameter the model may leave out (an `Option`,
/// through an alias too) is not `required`, as schemars' derive decides from the type.
#[test]
fn an_option_through_an_alias_is_not_required_as_the_arguments_read_it_missing() {
    let schema = serde_json::to_value(schemars::schema_for!(OpenCaseArgs)).unwrap();
    assert_eq!(schema["required"], serde_json::json!(["title"]), "{schema}");
    let args: OpenCaseArgs = serde_json::from_value(serde_json::json!({"title": "t"})).unwrap();
    assert_eq!(args.0, ("t".to_owned(), None));
}

/**
 * Void a charge.
 *
 * Only a charge not yet captured: see [`Charge`].
 */
#[tool(retry = "keyed")]
async fn void_charge(
    /** The charge to void. */
    charge_id: String,
    /**
     * Why, for the ledger:
     * shown to the customer.
     */
    reason: String,
    /** Who asked:
     * a name
     *  or an id, see [`Charge`]. */
    asked_by: String,
) -> Result<String, PayError> {
    Ok(format!("{charge_id}: {reason} ({asked_by})"))
}

// A literal's bullets are a list, as rustdoc shows them: not a block comment's frame.
#[tool(retry = "safe")]
#[doc = "Options:\n* by name\n* by id\n"]
async fn find_charge(charge_id: String) -> Result<String, PayError> {
    Ok(charge_id)
}

#[test]
fn a_doc_literal_keeps_its_bullets() {
    assert_eq!(FindChargeTool.def().description, "Options:\n* by name\n* by id");
}

#[test]
fn block_doc_comments_read_as_rustdoc_shows_them() {
    // `/** .. */` comments reach the macro with their frame and a `*` on each line: the model
    // reads the text without them, as rustdoc shows it.
    assert_eq!(
        VoidChargeTool.def().description,
        "Void a charge.\n\nOnly a charge not yet captured: see `Charge`."
    );
    let schema = serde_json::to_value(schemars::schema_for!(VoidChargeArgs)).unwrap();
    assert_eq!(schema["properties"]["charge_id"]["description"], "The charge to void.");
    assert_eq!(
        schema["properties"]["reason"]["description"],
        "Why, for the ledger:\nshown to the customer."
    );
    // `*/` on the last line of text: the stars go all the same, as in rustdoc.
    assert_eq!(
        schema["properties"]["asked_by"]["description"],
        "Who asked:\na name\n or an id, see `Charge`."
    );
}

static FLAKY_RUNS: AtomicU32 = AtomicU32::new(0);

/// Unreachable (transient) for "cus_t", declined (permanent) for anyone else.
#[tool(retry = "keyed", attempts = 1)]
async fn charge_flaky(customer: String) -> Result<u64, PayError> {
    FLAKY_RUNS.fetch_add(1, Ordering::SeqCst);
    Err(if customer == "cus_t" { PayError::Unreachable } else { PayError::Declined })
}

#[tokio::test]
async fn a_tool_result_says_whether_a_repeat_runs_again() {
    let set = idem_core::ToolSet::new().with(ChargeFlakyTool).unwrap();
    let run = Idem::in_memory().run("r1");
    let call = |customer: &str| {
        let json = serde_json::json!({ "customer": customer });
        let (set, run) = (&set, &run);
        async move { set.call(run, "charge_flaky", &json).await }
    };

    let transient = call("cus_t").await;
    assert!(transient.is_error);
    assert_eq!(transient.content["error"]["retryable"], true, "{}", transient.content);
    assert!(transient.text.ends_with("calling it again tries again"), "{}", transient.text);
    let permanent = call("cus_p").await;
    assert_eq!(permanent.content["error"]["retryable"], false, "{}", permanent.content);
    assert_eq!(FLAKY_RUNS.load(Ordering::SeqCst), 2);

    // And so it is: the transient one runs again, the permanent one is replayed.
    assert_eq!(call("cus_t").await.content, transient.content);
    assert_eq!(call("cus_p").await.content, permanent.content);
    assert_eq!(FLAKY_RUNS.load(Ordering::SeqCst), 3);
}

static SENDS: AtomicU32 = AtomicU32::new(0);

/// A provider's error the tool does not classify: `?` makes it an ambiguous `ToolFailure`.
fn provider_timeout() -> Result<(), std::io::Error> {
    Err(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "read timed out after the request was sent",
    ))
}

/// Send a letter. Errors propagate with `?`, anyhow-style.
#[tool(retry = "never")]
async fn send_letter(to: String) -> Result<String, idem_core::ToolFailure> {
    SENDS.fetch_add(1, Ordering::SeqCst);
    if to == "nobody" {
        return Err(idem_core::ToolFailure::permanent("no such recipient"));
    }
    provider_timeout()?;
    Ok(format!("sent to {to}"))
}

#[tokio::test]
async fn a_tool_failure_from_question_mark_is_ambiguous_and_a_permanent_one_is_replayed() {
    let run = Idem::in_memory().run("r1");
    // An unclassified error on a never tool: the letter may be out, so it is not sent again.
    let first = send_letter(&run, "ada".into()).await.unwrap_err();
    assert!(matches!(first, Error::OutcomeUnknown { tool: "send_letter", .. }), "{first:?}");
    let again = send_letter(&run, "ada".into()).await.unwrap_err();
    assert!(matches!(again, Error::OutcomeUnknown { .. }), "{again:?}");
    assert_eq!(SENDS.load(Ordering::SeqCst), 1);

    // A permanent one is stored with its message and replayed; the tool ran once.
    let refused = send_letter(&run, "nobody".into()).await.unwrap_err();
    let replayed = send_letter(&run, "nobody".into()).await.unwrap_err();
    for error in [&refused, &replayed] {
        let failure = error.tool_error().expect("the tool's own error");
        assert_eq!(failure.message(), "no such recipient");
        assert_eq!(failure.kind(), idem_core::FailureKind::Permanent);
    }
    assert_eq!(SENDS.load(Ordering::SeqCst), 2);
}

/// Free-form JSON parameters, undocumented: schemars writes their schemas as `true`.
#[tool(retry = "keyed")]
async fn tag_order(
    order: String,
    extra: serde_json::Value,
    more: Option<serde_json::Value>,
) -> Result<u32, PayError> {
    let _ = (order, extra, more);
    Ok(1)
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Clone)]
struct Labels {
    order: String,
    extra: serde_json::Value,
}

#[tool(retry = "keyed")]
async fn label_order(#[idem(flatten)] labels: Labels) -> Result<u32, PayError> {
    let _ = labels;
    Ok(1)
}

#[test]
fn a_free_form_json_parameter_has_an_object_schema_as_mcp_clients_require() {
    // MCP types each member of `inputSchema.properties` as an object; the TypeScript SDK refuses
    // the whole listing when one is a boolean.
    let set = idem_core::ToolSet::new().with(TagOrderTool).unwrap().with(LabelOrderTool).unwrap();
    for (tool, params) in
        [("tag_order", &["order", "extra", "more"][..]), ("label_order", &["order", "extra"])]
    {
        let schema = &set.definition(tool).unwrap().input_schema;
        for param in params {
            assert!(
                schema["properties"][param].is_object(),
                "{tool}.{param}: {}",
                schema["properties"][param]
            );
        }
    }
    let extra = &set.definition("tag_order").unwrap().input_schema["properties"]["extra"];
    assert_eq!(extra, &serde_json::json!({}), "any JSON, written as an object");
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Clone)]
struct Filter {
    column: String,
    /// Compared as text when absent.
    cast: Option<String>,
    /// Any JSON.
    value: serde_json::Value,
    /// Each a label, or `null` for none.
    labels: Vec<Option<String>>,
    #[serde(default)]
    note: Option<String>,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema, Clone)]
enum Order {
    Asc,
    Desc,
}

/// List the rows of some tables.
#[tool(retry = "safe")]
async fn list_rows(
    order: Option<Order>,
    /// Every table when absent.
    tables: Option<Vec<String>>,
    /// At most this many.
    limit: Option<u32>,
    filter: Option<Filter>,
    payload: Vec<serde_json::Value>,
) -> Result<u32, PayError> {
    let _ = (order, tables, limit, filter, payload);
    Ok(0)
}

/// Every JSON Schema in `schema`, with where it is, depth first.
fn subschemas<'a>(
    at: String,
    schema: &'a serde_json::Value,
    out: &mut Vec<(String, &'a serde_json::Value)>,
) {
    out.push((at.clone(), schema));
    let Some(object) = schema.as_object() else { return };
    for keyword in ["properties", "$defs"] {
        if let Some(serde_json::Value::Object(members)) = object.get(keyword) {
            for (name, sub) in members {
                subschemas(format!("{at}.{keyword}.{name}"), sub, out);
            }
        }
    }
    for keyword in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(serde_json::Value::Array(items)) = object.get(keyword) {
            for (i, sub) in items.iter().enumerate() {
                subschemas(format!("{at}.{keyword}[{i}]"), sub, out);
            }
        }
    }
    for keyword in ["items", "not"] {
        if let Some(sub) = object.get(keyword) {
            subschemas(format!("{at}.{keyword}"), sub, out);
        }
    }
}

/// Gemini's function declarations take one `type` per schema (OpenAPI 3.0's subset): a
/// `"type": ["array", "null"]` anywhere in a tool's parameters, which schemars writes for an
/// `Option`, fails the whole request with 400 ("Proto field is not repeating, cannot start
/// list"), for every tool of the server; hosts that convert schemas for it split such a type
/// into an `anyOf` whose array branch has lost its `items`, refused too. The published schema
/// writes a value that may be `null` as an `anyOf` of one type each, which Gemini reads, with
/// the assertions (`items`, `minimum`) in the branch of their type and the description outside:
/// `null` stays allowed, so a host that makes every property required (OpenAI's strict mode)
/// still lets the model say `None`. A boolean schema (`true` for any JSON) nested anywhere is an
/// object as well.
#[tokio::test]
async fn a_published_schema_has_one_type_per_schema_and_no_boolean_schemas() {
    let set = idem_core::ToolSet::new().with(ListRowsTool).unwrap();
    let schema =
        serde_json::Value::Object(set.definition("list_rows").unwrap().input_schema.clone());
    let mut all = Vec::new();
    subschemas("$".into(), &schema, &mut all);
    for (at, sub) in &all {
        assert!(sub.is_object(), "{at} is {sub}, in {schema}");
        assert!(!sub["type"].is_array(), "{at} has the type {}, in {schema}", sub["type"]);
        if sub["type"] == "array" {
            assert!(sub["items"].is_object(), "{at} is an array without items, in {schema}");
        }
    }
    let nothing = serde_json::json!({"type": "null"});
    let properties = &schema["properties"];
    assert_eq!(
        properties["tables"],
        serde_json::json!({"description": "Every table when absent.", "anyOf": [
            {"type": "array", "items": {"type": "string"}}, nothing]}),
        "{schema}"
    );
    assert_eq!(
        properties["limit"],
        serde_json::json!({"description": "At most this many.", "anyOf": [
            {"type": "integer", "minimum": 0}, nothing]}),
        "{schema}"
    );
    let filter = &properties["filter"]["anyOf"];
    assert_eq!(filter[1], nothing, "{schema}");
    assert_eq!(filter[0]["type"], "object", "{schema}");
    let filter = &filter[0]["properties"];
    assert_eq!(
        filter["cast"],
        serde_json::json!({"description": "Compared as text when absent.",
            "anyOf": [{"type": "string"}, nothing]}),
        "{schema}"
    );
    assert_eq!(filter["note"]["anyOf"], serde_json::json!([{"type": "string"}, nothing]));
    assert_eq!(filter["value"], serde_json::json!({"description": "Any JSON."}), "{schema}");
    assert_eq!(
        filter["labels"]["items"],
        serde_json::json!({"anyOf": [{"type": "string"}, nothing]}),
        "{schema}"
    );
    assert_eq!(
        properties["order"]["anyOf"],
        serde_json::json!([{"type": "string", "enum": ["Asc", "Desc"]}, nothing]),
        "{schema}"
    );
    assert_eq!(schema["required"], serde_json::json!(["payload"]), "{schema}");
    assert_eq!(properties["payload"]["items"], serde_json::json!({}), "{schema}");
    // What the model may send is as before: absent, `null` and a value.
    let run = Idem::in_memory().run("r");
    for args in [
        serde_json::json!({"payload": []}),
        serde_json::json!({"payload": [], "tables": null, "limit": null, "filter": null}),
        serde_json::json!({"payload": [1], "tables": ["a"], "limit": 3, "filter": {
            "column": "c", "value": true, "labels": ["x", null]}}),
    ] {
        let r = set.call(&run, "list_rows", &args).await;
        assert!(!r.is_error, "{args}: {}", r.text);
    }
}

/// A crate linted with clippy's pedantic group and some restriction lints. `#[tool]` requires an
/// `async fn` and passes every parameter on, so a body that awaits nothing and a parameter named
/// `_note` (taken, not used) are the user's to write: the expansion's own use of them must not
/// be reported, nor the items it adds (its calling the body once, the arguments' names as an
/// empty `pub enum`, the typed call returning a future without `#[must_use]` or `#[inline]`).
/// `cargo clippy --all-targets -- -D warnings` checks this module.
#[warn(
    clippy::used_underscore_binding,
    clippy::unused_async,
    clippy::exhaustive_enums,
    clippy::single_call_fn,
    clippy::must_use_candidate,
    clippy::missing_inline_in_public_items
)]
pub mod pedantic_user {
    use idem_core::{ToolFailure, tool};

    /// Echo a number.
    #[tool(retry = "safe")]
    pub async fn echo(n: u32, _note: Option<String>) -> Result<u32, ToolFailure> {
        Ok(n)
    }

    /// A service whose tools await nothing.
    #[derive(Default)]
    pub struct Counter;

    #[idem_core::tool_set]
    impl Counter {
        /// Count.
        #[tool(retry = "keyed")]
        pub async fn count(&self, n: u32, _note: Option<String>) -> Result<u32, ToolFailure> {
            Ok(n)
        }
    }
}

#[tokio::test]
async fn tools_that_await_nothing_and_take_unused_parameters_are_called_like_others() {
    let run = Idem::in_memory().run("r");
    assert_eq!(pedantic_user::echo(&run, 3, None).await.unwrap(), 3);
    let counter = Arc::new(pedantic_user::Counter);
    assert_eq!(counter.count(&run, 4, Some("n".into())).await.unwrap(), 4);
}

/// Tag an order with free-form metadata.
#[tool(retry = "keyed")]
async fn annotate_order(
    order: String,
    metadata: std::collections::BTreeMap<String, serde_json::Value>,
    extra: Option<std::collections::HashMap<String, serde_json::Value>>,
) -> Result<u32, PayError> {
    let _ = (order, metadata, extra);
    Ok(1)
}

/// A map of any JSON (free-form metadata, a common parameter) is where schemars writes
/// `"additionalProperties": true`: a boolean schema like the `true` of a `Value` parameter, which
/// the published schema writes as `{}` (the same meaning) for hosts that take no boolean schema.
/// Only `additionalProperties: false`, which forbids members, stays as it is.
#[test]
fn a_map_of_any_json_has_no_boolean_schema_for_its_values() {
    let set = idem_core::ToolSet::new().with(AnnotateOrderTool).unwrap();
    let schema = &set.definition("annotate_order").unwrap().input_schema;
    assert_eq!(schema["additionalProperties"], serde_json::json!(false), "{schema:?}");
    assert_eq!(
        schema["properties"]["metadata"],
        serde_json::json!({"type": "object", "additionalProperties": {}}),
        "{schema:?}"
    );
    assert_eq!(
        schema["properties"]["extra"]["anyOf"][0],
        serde_json::json!({"type": "object", "additionalProperties": {}}),
        "{schema:?}"
    );
}

/// A client whose tool methods are instrumented with `tracing`.
struct Traced;

impl Traced {
    #[tool(retry = "safe")]
    #[tracing::instrument(skip(self))]
    async fn lookup_order(&self, order: String) -> Result<String, PayError> {
        Ok(order)
    }

    #[tool(retry = "safe")]
    #[tracing::instrument(name = "orders.cancel", skip_all)]
    async fn cancel_order(&self, order: String) -> Result<String, PayError> {
        Ok(order)
    }

    // A name given as a bare string: `instrument` refuses a second one.
    #[tool(retry = "safe")]
    #[tracing::instrument("orders.refund", skip_all)]
    async fn refund_order(&self, order: String) -> Result<String, PayError> {
        Ok(order)
    }
}

/// `#[tracing::instrument]` names its span after the fn it is on; a method tool's body is a
/// hidden method of another name, so the span is named as the user's method unless the
/// attribute names it.
#[tokio::test]
async fn an_instrumented_method_tool_has_its_span_named_as_the_method() {
    use tracing_subscriber::layer::SubscriberExt;

    #[derive(Clone, Default)]
    struct Names(Arc<Mutex<Vec<String>>>);
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Names {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            _id: &tracing::span::Id,
            _ctx: tracing_subscriber::layer::Context<'_, S>,
        ) {
            self.0.lock().unwrap().push(attrs.metadata().name().to_owned());
        }
    }

    let names = Names::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(names.clone()));
    tracing::callsite::rebuild_interest_cache();
    let run = Idem::in_memory().run("r");
    let traced = Arc::new(Traced);
    traced.lookup_order(&run, "o_1".into()).await.unwrap();
    traced.cancel_order(&run, "o_1".into()).await.unwrap();
    traced.refund_order(&run, "o_1".into()).await.unwrap();
    let names = names.0.lock().unwrap().clone();
    assert!(names.iter().any(|n| n == "lookup_order"), "{names:?}");
    assert!(names.iter().any(|n| n == "orders.cancel"), "{names:?}");
    assert!(names.iter().any(|n| n == "orders.refund"), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("__idem")), "{names:?}");
}

/// Two tools that each took the name of their fn, `get`, in two modules: the name is part of
/// every key, so the second would be answered with the first one's stored result.
mod users {
    use idem_core::{NoError, tool};

    #[tool(retry = "keyed")]
    pub async fn get(id: u64) -> Result<String, NoError> {
        Ok(format!("user-{id}"))
    }

    pub static LOOKUPS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

    /// `get` rewritten under another fn name, keeping the tool's name.
    #[tool(retry = "keyed", name = "get")]
    pub async fn lookup(id: u64) -> Result<String, NoError> {
        LOOKUPS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(format!("user {id}"))
    }
}

mod orders {
    use idem_core::{NoError, tool};

    pub static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

    #[tool(retry = "keyed")]
    pub async fn get(id: u64) -> Result<String, NoError> {
        RUNS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(format!("order-{id}"))
    }
}

/// The same method name on two types, written once by a macro: two tools of one name.
macro_rules! services {
    ($($ty:ident),*) => {$(
        struct $ty;

        impl $ty {
            #[tool(retry = "keyed")]
            async fn lookup(&self, id: u64) -> Result<String, idem_core::NoError> {
                Ok(format!("{}-{id}", stringify!($ty)))
            }
        }
    )*};
}

services!(SvcA, SvcB);

#[tokio::test]
async fn the_same_method_of_another_type_under_the_same_name_is_refused() {
    let run = Idem::in_memory().run("methods");
    assert_eq!(Arc::new(SvcA).lookup(&run, 1).await.unwrap(), "SvcA-1");
    let err = Arc::new(SvcB).lookup(&run, 1).await.unwrap_err();
    let Error::NameTaken { declared_at, held_by, .. } = &err else { panic!("{err}") };
    assert_eq!(declared_at, "macro_tools::lookup, a method of macro_tools::SvcB", "{err}");
    assert_eq!(held_by, "macro_tools::lookup, a method of macro_tools::SvcA", "{err}");
}

#[tokio::test]
async fn a_second_tool_under_a_name_another_tool_was_called_by_is_refused() {
    let idem = Idem::in_memory();
    let run = idem.run("same-name");
    assert_eq!(users::get(&run, 1).await.unwrap(), "user-1");
    // Not `user-1` from the store: refused, naming both declarations, and its body never ran.
    let err = orders::get(&run, 1).await.unwrap_err();
    assert_eq!(err.kind().as_str(), "tool_name_taken");
    let Error::NameTaken { tool, declared_at, held_by } = &err else { panic!("{err}") };
    assert_eq!(*tool, "get");
    assert_eq!(declared_at, "macro_tools::orders::get", "{err}");
    assert_eq!(held_by, "macro_tools::users::get", "{err}");
    assert!(err.to_string().contains("#[tool(name ="), "{err}");
    assert_eq!(orders::RUNS.load(Ordering::SeqCst), 0);
    // Refused in another run too (the keys would meet there as well), and every time.
    assert!(matches!(orders::get(&idem.run("other"), 2).await, Err(Error::NameTaken { .. })));
    // The holder goes on; another `Idem` (its own store) takes the other declaration.
    assert_eq!(users::get(&run, 1).await.unwrap(), "user-1");
    assert_eq!(orders::get(&Idem::in_memory().run("same-name"), 1).await.unwrap(), "order-1");
    // A tool given the name (`name = "get"`) says it is that tool (a version renamed or
    // rewritten): it shares the keys, as `open_ticket`'s versions above do.
    assert_eq!(users::lookup(&run, 1).await.unwrap(), "user-1");
    assert_eq!(users::LOOKUPS.load(Ordering::SeqCst), 0, "replayed");
}

static SETTLES: AtomicU32 = AtomicU32::new(0);

/// Settles an order with a provider that never answers: every call ends with its outcome
/// unknown, for an operator to resolve.
#[tool(retry = "never")]
async fn settle(order: String) -> Result<Charge, PayError> {
    let _ = order;
    SETTLES.fetch_add(1, Ordering::SeqCst);
    std::future::pending().await
}

/// Settles a transfer in wei, whose amounts go beyond 64 bits; its provider never answers.
#[tool(retry = "never")]
async fn settle_wei(order: String) -> Result<u128, PayError> {
    let _ = order;
    SETTLES.fetch_add(1, Ordering::SeqCst);
    std::future::pending().await
}

/// Calls a `never` tool whose provider never answers, waits past its owner's lease, resolves
/// the record as an operator does with `given` as the result, and calls it once more: what that
/// replay returns.
async fn resolved_by_hand<O, F>(
    store: &Arc<idem_core::store::MemoryStore>,
    call: impl Fn() -> F,
    given: &str,
) -> Result<O, Error<PayError>>
where
    F: std::future::Future<Output = Result<O, Error<PayError>>>,
{
    use idem_core::store::{Outcome, Resolution, Store};
    assert!(tokio::time::timeout(Duration::from_millis(10), call()).await.is_err());
    // Past the owner's lease: a never tool's record is not run again but reported unknown.
    tokio::time::sleep(Duration::from_secs(120)).await;
    let Err(Error::OutcomeUnknown { key, .. }) = call().await else {
        panic!("{given}: the outcome is unknown");
    };
    let info = store.inspect(&key).await.unwrap().expect("the record");
    let happened = Resolution::Happened {
        outcome: Outcome::Success(given.into()),
        ttl: Duration::from_secs(600),
    };
    store.resolve(&key, info.fence, &happened).await.expect("resolve");
    call().await
}

/// An operator's result (`idem resolve --happened`, written by hand or by a script that passes
/// numbers through a float) may spell an integer `4900.0`: a replay reads it as the integer it
/// equals, as a model's arguments are read, also a 128-bit one, alone or inside the result. A
/// fraction is still no integer: that replay fails, naming it.
#[tokio::test(start_paused = true)]
async fn an_operators_result_replays_a_whole_number_written_as_a_float_as_the_integer() {
    use idem_core::store::{MemoryStore, Store};
    let store = Arc::new(MemoryStore::new());
    let run = Idem::builder_shared(Arc::clone(&store) as Arc<dyn Store>).build().run("r1");
    let wei = 10_u128.pow(21);
    let cases: [(&str, &str, Result<u128, &str>); 7] = [
        ("ord_1", r#"{"id":"ch_op","amount_cents":4900.0}"#, Ok(4900)),
        ("ord_2", r#"{"id":"ch_op","amount_cents":49e2}"#, Ok(4900)),
        ("ord_3", r#"{"id":"ch_op","amount_cents":4900.5}"#, Err("floating point `4900.5`")),
        ("wei_1", "1000000000000000000000.0", Ok(wei)),
        ("wei_2", "1e21", Ok(wei)),
        ("wei_3", " 1.0E+21 ", Ok(wei)),
        (
            "wei_4",
            "1000000000000000000000.5",
            Err("floating point `1000000000000000000000.5`, expected u128"),
        ),
    ];
    for (order, given, want) in cases {
        let got = if order.starts_with("wei") {
            resolved_by_hand(&store, || settle_wei(&run, order.into()), given).await
        } else {
            resolved_by_hand(&store, || settle(&run, order.into()), given).await.map(|charge| {
                assert_eq!(charge.id, "ch_op", "{order}");
                u128::from(charge.amount_cents)
            })
        };
        match (got, want) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "{order}"),
            (Err(Error::ReplayFailed { reason, .. }), Err(needle)) => {
                assert!(reason.contains(needle), "{order}: {reason}");
            }
            (got, _) => panic!("{order}: {got:?}"),
        }
    }
    assert_eq!(SETTLES.load(Ordering::SeqCst), 7, "each order's body ran once, never again");
}
