//! Dispatch by every format: definitions, repeats, bad input, and every error a model can read.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::*;
use crate::key::{Key, Scope};
use crate::store::{Claim, ClaimRequest, Fence, Outcome, Store, StoreError};
use crate::{Classify, Ctx, Failure, Idem, Policy, RetryBudget, Served, ToolOptions};

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct ChargeArgs {
    customer: String,
    amount_cents: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct BalanceArgs {
    customer: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct ScaleArgs {
    factor: f64,
}

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
enum PayError {
    #[error("card declined: {0}")]
    Declined(String),
    #[error("the provider timed out after the request was sent")]
    Timeout,
    #[error("the provider is unavailable")]
    Unavailable,
}

impl Classify for PayError {
    fn classify(&self) -> Failure {
        match self {
            PayError::Declined(_) => Failure::permanent(),
            PayError::Timeout => Failure::ambiguous(),
            PayError::Unavailable => Failure::transient(),
        }
    }
}

type Behave<A> = fn(&A, u32) -> Result<Value, PayError>;

/// A hand-written tool (the `#[tool]` macro generates the same impl): counts its runs.
struct Fake<A> {
    def: &'static ToolDef,
    runs: Arc<AtomicU32>,
    behave: Behave<A>,
    delay: Duration,
    _args: PhantomData<fn() -> A>,
}

fn fake<A>(name: &'static str, class: RetryClass, behave: Behave<A>) -> Fake<A> {
    fake_with(name, class, ToolOptions::default(), behave)
}

fn fake_with<A>(
    name: &'static str,
    class: RetryClass,
    options: ToolOptions,
    behave: Behave<A>,
) -> Fake<A> {
    let def = Box::leak(Box::new(ToolDef { name, description: "a test tool", class, options }));
    Fake {
        def,
        runs: Arc::new(AtomicU32::new(0)),
        behave,
        delay: Duration::ZERO,
        _args: PhantomData,
    }
}

impl<A> Tool for Fake<A>
where
    A: Serialize + DeserializeOwned + JsonSchema + Clone + Send + Sync + 'static,
{
    type Args = A;
    type Output = Value;
    type Error = PayError;

    fn def(&self) -> &'static ToolDef {
        self.def
    }
    fn run(&self, _cx: &Ctx, args: A) -> impl Future<Output = Result<Value, PayError>> + Send {
        let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        let (behave, delay) = (self.behave, self.delay);
        async move {
            tokio::time::sleep(delay).await;
            behave(&args, n)
        }
    }
}

fn charge_ok(a: &ChargeArgs, n: u32) -> Result<Value, PayError> {
    Ok(json!({"charge_id": format!("ch_{n}"), "amount_cents": a.amount_cents}))
}
fn balance_ok(a: &BalanceArgs, _: u32) -> Result<Value, PayError> {
    Ok(json!({"customer": a.customer, "balance_cents": 0}))
}
fn refund_times_out(_: &ChargeArgs, _: u32) -> Result<Value, PayError> {
    Err(PayError::Timeout)
}

struct Tools {
    set: ToolSet,
    charges: Arc<AtomicU32>,
    refunds: Arc<AtomicU32>,
}

fn tools() -> Tools {
    let charge = fake("charge_card", RetryClass::Keyed, charge_ok);
    let refund = fake("refund", RetryClass::Never, refund_times_out);
    let balance = fake("get_balance", RetryClass::Safe, balance_ok);
    let (charges, refunds) = (charge.runs.clone(), refund.runs.clone());
    let set = ToolSet::new().with(charge).unwrap().with(refund).unwrap().with(balance).unwrap();
    Tools { set, charges, refunds }
}

fn now_ok(_: &NoArgs, _: u32) -> Result<Value, PayError> {
    Ok(json!("12:00"))
}

/// A tool without arguments lists `"properties": {}` in every format: OpenAI refuses the whole
/// request over an object schema without `properties` ("Invalid schema for function: object
/// schema missing properties"), and strict MCP hosts refuse the tool. Calls with no arguments,
/// `{}` or `null` text still run it.
#[tokio::test]
async fn a_tool_without_arguments_lists_empty_properties() {
    let set = ToolSet::new().with(fake("now", RetryClass::Safe, now_ok)).unwrap();
    let empty = json!({});
    assert_eq!(set.definition("now").unwrap().to_mcp()["inputSchema"]["properties"], empty);
    assert_eq!(set.openai_tools()[0]["function"]["parameters"]["properties"], empty);
    assert_eq!(set.anthropic_tools()[0]["input_schema"]["properties"], empty);
    assert_eq!(set.mcp_tools()[0]["inputSchema"]["type"], "object");
    let run = Idem::in_memory().run("conv-now");
    for args in [Arguments::Json(&empty), Arguments::Absent, Arguments::Text("null")] {
        let result = set.call_args(&run, "now", args).await;
        assert!(!result.is_error, "{args:?}: {}", result.text);
        assert_eq!(result.text, "12:00");
    }
}

#[test]
fn definitions_carry_schema_and_annotations_from_the_class() {
    let t = tools();
    let names: Vec<_> = t.set.definitions().map(|d| d.name).collect();
    assert_eq!(names, ["charge_card", "get_balance", "refund"]);

    let charge = t.set.definition("charge_card").unwrap().to_mcp();
    assert_eq!(charge["inputSchema"]["type"], "object");
    assert_eq!(charge["inputSchema"]["properties"]["amount_cents"]["type"], "integer");
    assert_eq!(charge["inputSchema"]["required"], json!(["customer", "amount_cents"]));
    assert_eq!(charge["annotations"], json!({"readOnlyHint": false, "idempotentHint": true}));
    let balance = t.set.definition("get_balance").unwrap().to_mcp();
    assert_eq!(balance["annotations"], json!({"readOnlyHint": true}));
    let refund = t.set.definition("refund").unwrap().to_mcp();
    assert_eq!(
        refund["annotations"],
        json!({"readOnlyHint": false, "destructiveHint": true, "idempotentHint": false})
    );

    let openai = t.set.openai_tools();
    assert_eq!(openai[0]["type"], "function");
    assert_eq!(openai[0]["function"]["name"], "charge_card");
    assert_eq!(openai[0]["function"]["parameters"]["type"], "object");
    let anthropic = t.set.anthropic_tools();
    assert_eq!(anthropic[2]["name"], "refund");
    assert_eq!(anthropic[2]["input_schema"]["type"], "object");
}

#[test]
fn bad_tools_are_refused_with_a_reason() {
    let t = tools();
    let dup = fake("charge_card", RetryClass::Keyed, charge_ok);
    assert_eq!(t.set.with(dup).unwrap_err(), ToolSetError::DuplicateName("charge_card"));
    let spaced = fake("charge card", RetryClass::Keyed, charge_ok);
    assert_eq!(ToolSet::new().with(spaced).unwrap_err(), ToolSetError::InvalidName("charge card"));
    // MCP allows `.` and 128 characters; hosts and model APIs refuse a whole tool list over one.
    let long: &'static str = Box::leak("c".repeat(65).into_boxed_str());
    for name in ["payments.charge", long, ""] {
        let tool = fake(name, RetryClass::Keyed, charge_ok);
        let refused = ToolSet::new().with(tool).unwrap_err();
        assert_eq!(refused, ToolSetError::InvalidName(name));
        assert!(refused.to_string().contains("1 to 64 ASCII letters"), "{refused}");
    }
    let at_limit: &'static str = Box::leak("c".repeat(64).into_boxed_str());
    assert!(ToolSet::new().with(fake(at_limit, RetryClass::Keyed, charge_ok)).is_ok());
    fn scalar(_: &u64, _: u32) -> Result<Value, PayError> {
        Ok(Value::Null)
    }
    let scalar_args = fake("scalar", RetryClass::Safe, scalar);
    assert_eq!(ToolSet::new().with(scalar_args).unwrap_err(), ToolSetError::NotAnObject("scalar"));
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
enum Method {
    Card { number: String },
    Transfer { iban: String },
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct PayFlat {
    amount: u64,
    #[serde(flatten)]
    method: Method,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct PayNamed {
    amount: u64,
    method: Method,
}

/// Anthropic refuses a whole request whose tool's `input_schema` has `oneOf`, `anyOf` or
/// `allOf` at its root, and a flattened enum puts `oneOf` there: refused when the set is built,
/// naming the fix; the same enum as a named field is accepted (its `oneOf` is nested).
#[test]
fn arguments_that_combine_schemas_at_their_root_are_refused() {
    fn pay<A>(_: &A, _: u32) -> Result<Value, PayError> {
        Ok(Value::Null)
    }
    let flat = fake("pay", RetryClass::Keyed, pay::<PayFlat>);
    let refused = ToolSet::new().with(flat).unwrap_err();
    assert_eq!(refused, ToolSetError::CombinedAtRoot { tool: "pay", keyword: "oneOf" });
    assert!(refused.to_string().contains("make that enum or option a named field"), "{refused}");
    let named = fake("pay", RetryClass::Keyed, pay::<PayNamed>);
    let set = ToolSet::new().with(named).unwrap();
    let schema = &set.anthropic_tools()[0]["input_schema"];
    assert_eq!(schema["type"], "object");
    for keyword in ["oneOf", "anyOf", "allOf"] {
        assert!(schema.get(keyword).is_none(), "{schema}");
    }
}

#[tokio::test]
async fn repeats_with_new_call_ids_and_reordered_keys_run_once() {
    let t = tools();
    let run = Idem::in_memory().run("conv-1");
    let first = t
        .set
        .call_openai(
            &run,
            &json!({"id": "call_a", "type": "function", "function": {"name": "charge_card",
                "arguments": "{\"customer\":\"cus_1\",\"amount_cents\":4900}"}}),
        )
        .await;
    assert_eq!(first["role"], "tool");
    assert_eq!(first["tool_call_id"], "call_a");
    let again = t
        .set
        .call_openai(
            &run,
            &json!({"id": "call_b", "type": "function", "function": {"name": "charge_card",
                "arguments": "{ \"amount_cents\": 4900, \"customer\": \"cus_1\" }"}}),
        )
        .await;
    assert_eq!(again["tool_call_id"], "call_b");
    assert_eq!(again["content"], first["content"]);
    let block = t
        .set
        .call_anthropic(
            &run,
            &json!({"type": "tool_use", "id": "toolu_1", "name": "charge_card",
                "input": {"amount_cents": 4900, "customer": "cus_1"}}),
        )
        .await;
    assert_eq!(block["is_error"], false);
    assert_eq!(block["content"], first["content"]);
    assert_eq!(t.charges.load(Ordering::SeqCst), 1);
    let content: Value = serde_json::from_str(first["content"].as_str().unwrap()).unwrap();
    assert_eq!(content["charge_id"], "ch_1");

    // Another run is another intent.
    let other = Idem::in_memory().run("conv-2");
    let r = t
        .set
        .call(&other, "charge_card", &json!({"customer": "cus_1", "amount_cents": 4900}))
        .await;
    assert!(!r.is_error);
    assert_eq!(t.charges.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn unknown_tool_lists_the_available_ones() {
    let t = tools();
    let run = Idem::in_memory().run("r");
    let r = t.set.call(&run, "charge", &json!({})).await;
    assert!(r.is_error);
    assert_eq!(r.error_kind, Some(ErrorKind::UnknownTool));
    assert!(r.text.contains("no tool named `charge`"), "{}", r.text);
    assert!(r.text.contains("charge_card, get_balance, refund"), "{}", r.text);
    let block =
        t.set.call_anthropic(&run, &json!({"type": "tool_use", "id": "x", "input": {}})).await;
    assert_eq!(block["is_error"], true);
    assert!(block["content"].as_str().unwrap().contains("invalid_tool_call"));
    assert_eq!(t.charges.load(Ordering::SeqCst), 0);
}

/// Two sets (two `#[tool_set]` blocks, or one and free tools) become one: each tool dispatches
/// from the merged set, and a name both hold is refused with nothing merged.
#[tokio::test]
async fn sets_merge_and_a_name_in_both_is_refused() {
    let t = tools();
    let scale = fake("scale", RetryClass::Safe, |a: &ScaleArgs, _| Ok(json!(a.factor * 2.0)));
    let other = ToolSet::new().with(scale).unwrap();
    let merged = t.set.clone().merge(other.clone()).unwrap();
    let names: Vec<&str> = merged.definitions().map(|d| d.name).collect();
    assert_eq!(names, ["charge_card", "get_balance", "refund", "scale"]);

    let run = Idem::in_memory().run("r");
    let args = json!({"customer": "cus_1", "amount_cents": 500});
    let first = merged.call(&run, "charge_card", &args).await;
    let again = merged.call(&run, "charge_card", &args).await;
    assert!(!first.is_error, "{}", first.text);
    assert_eq!(first.text, again.text);
    assert_eq!(t.charges.load(Ordering::SeqCst), 1, "one charge through the merged set");
    let scaled = merged.call(&run, "scale", &json!({"factor": 1.5})).await;
    assert_eq!(scaled.text, "3.0");
    // An unknown name lists the tools of both sets.
    let unknown = merged.call(&run, "nope", &json!({})).await;
    assert!(unknown.text.contains("charge_card, get_balance, refund, scale"), "{}", unknown.text);

    let clash = ToolSet::new().with(fake("refund", RetryClass::Never, refund_times_out)).unwrap();
    let err = merged.clone().merge(clash).unwrap_err();
    assert!(matches!(err, ToolSetError::DuplicateName("refund")), "{err:?}");

    // A tool a `#[tool_set]` block could not add stays refused, with why, in the merged set.
    let mut block = ToolSet::new();
    block.add_or_keep_refusal(fake("look up", RetryClass::Safe, balance_ok));
    let merged = merged.merge(block).unwrap();
    assert!(matches!(merged.refusal("look up"), Some(ToolSetError::InvalidName("look up"))));
    assert_eq!(merged.refusals().len(), 1);
    let refused = merged.call(&run, "look up", &json!({"customer": "cus_1"})).await;
    assert!(refused.is_error && refused.text.contains("look up"), "{}", refused.text);
}

/// A set whose `#[tool_set]` block left a tool out, and a tool of that name from elsewhere: the
/// set holds that tool and calls run it, so no refusal names it, whichever way the set is
/// built. `merge` dropped the refusal but `with` kept it, so a start-up check on `refusals()`
/// failed or passed by the order the sets were put together in, over a tool that is served.
#[tokio::test]
async fn a_refusal_goes_once_a_tool_of_its_name_is_added() {
    let refusing = || {
        let mut set = ToolSet::new();
        // Arguments that are not an object: refused, as a `#[tool_set]` block refuses a tool.
        set.add_or_keep_refusal(fake::<u32>("now", RetryClass::Safe, |_, _| Ok(json!(0))));
        assert_eq!(set.refusals().len(), 1, "{:?}", set.refusals());
        set
    };
    let served = || fake("now", RetryClass::Safe, now_ok);
    let merged = ToolSet::new().with(served()).unwrap().merge(refusing()).unwrap();
    let added = refusing().with(served()).unwrap();
    let run = Idem::in_memory().run("r");
    for (how, set) in [("merged", merged), ("added", added)] {
        assert_eq!(set.refusals().len(), 0, "{how}: {:?}", set.refusals());
        assert!(set.refusal("now").is_none(), "{how}");
        let result = set.call(&run, "now", &json!({})).await;
        assert_eq!((result.is_error, result.text.as_str()), (false, "12:00"), "{how}");
    }
}

/// An id or a name of the wrong type is refused before anything runs: a numeric id would come
/// back as another id (the host could not match the result to its call), and a numeric name is
/// named as that, not as missing.
#[tokio::test]
async fn an_envelope_field_of_the_wrong_type_is_refused_and_runs_nothing() {
    let t = tools();
    let run = Idem::in_memory().run("r");
    let args = json!({"customer": "c", "amount_cents": 1});
    let openai = |id: Value, name: Value| {
        json!({"id": id, "type": "function",
            "function": {"name": name, "arguments": args.to_string()}})
    };
    let m = t.set.call_openai(&run, &openai(json!(5), json!("charge_card"))).await;
    assert_eq!(m["tool_call_id"], "5", "{m}");
    assert!(m["content"].as_str().unwrap().contains("`id` is a number, not a string"), "{m}");
    let m = t.set.call_openai(&run, &openai(json!("call_1"), json!(5))).await;
    assert_eq!(m["tool_call_id"], "call_1", "{m}");
    assert!(m["content"].as_str().unwrap().contains("`function.name` is a number"), "{m}");
    let b = t
        .set
        .call_anthropic(
            &run,
            &json!({"type": "tool_use", "id": ["x"], "name": "charge_card", "input": args}),
        )
        .await;
    assert_eq!((b["is_error"].clone(), b["tool_use_id"].clone()), (json!(true), json!("[\"x\"]")));
    assert!(b["content"].as_str().unwrap().contains("`id` is an array"), "{b}");
    let b = t
        .set
        .call_anthropic(&run, &json!({"type": "tool_use", "id": "t", "name": {}, "input": args}))
        .await;
    assert!(b["content"].as_str().unwrap().contains("`name` is an object, not a string"), "{b}");
    let e = t.set.call_mcp(&run, &json!({"name": 5, "arguments": args})).await.unwrap_err();
    assert!(e.message.contains("is a number, not a string"), "{e}");
    assert_eq!(t.charges.load(Ordering::SeqCst), 0, "nothing ran");
    // Absent ids are still accepted (and echoed empty).
    let m = t
        .set
        .call_openai(&run, &json!({"function": {"name": "charge_card", "arguments": args}}))
        .await;
    assert_eq!(
        (m["tool_call_id"].clone(), t.charges.load(Ordering::SeqCst)),
        (json!(""), 1),
        "{m}"
    );
}

/// A block or call of another kind is refused: Anthropic runs a `server_tool_use` or
/// `mcp_tool_use` block itself, so running a local tool of the same name would do its effect a
/// second time; a text block is not a call at all.
#[tokio::test]
async fn a_call_of_another_type_runs_nothing() {
    let t = tools();
    let run = Idem::in_memory().run("r");
    let input = json!({"customer": "c", "amount_cents": 1});
    for kind in [json!("server_tool_use"), json!("mcp_tool_use"), json!("text"), json!(1)] {
        let block =
            json!({"type": kind, "id": "srvtoolu_1", "name": "charge_card", "input": input});
        let b = t.set.call_anthropic(&run, &block).await;
        assert_eq!(
            (b["is_error"].clone(), b["tool_use_id"].clone()),
            (json!(true), json!("srvtoolu_1"))
        );
        let text = b["content"].as_str().unwrap();
        assert!(text.contains("`type` is") && text.contains("nothing was executed"), "{text}");
    }
    let b = t
        .set
        .call_anthropic(&run, &json!({"type": "server_tool_use", "id": "s", "name": "charge_card"}))
        .await;
    assert!(b["content"].as_str().unwrap().contains("the provider runs such a call itself"), "{b}");
    for kind in [json!("custom"), json!("function_call"), json!({})] {
        let call = json!({"id": "call_1", "type": kind,
            "function": {"name": "charge_card", "arguments": input.to_string()}});
        let m = t.set.call_openai(&run, &call).await;
        assert!(m["content"].as_str().unwrap().contains("`type` is"), "{m}");
    }
    assert_eq!(t.charges.load(Ordering::SeqCst), 0, "nothing ran");
    // The right kinds, and a call written by hand without one, run.
    let block = json!({"type": "tool_use", "id": "t", "name": "charge_card", "input": input});
    assert_eq!(t.set.call_anthropic(&run, &block).await["is_error"], false);
    let call = json!({"id": "c", "type": "function",
        "function": {"name": "charge_card", "arguments": input.to_string()}});
    assert_eq!(t.set.call_openai(&run, &call).await["role"], "tool");
    assert_eq!(t.charges.load(Ordering::SeqCst), 1, "one intent, one charge");
}

/// What a model sent comes back in error text with its control characters escaped: a result is
/// printed by hosts on terminals and in logs.
#[tokio::test]
async fn control_characters_a_model_sent_are_escaped_in_errors() {
    let t = tools();
    let run = Idem::in_memory().run("r");
    let evil = "x\u{1b}[31mred\u{7}\r\u{202e}";
    let r = t.set.call(&run, evil, &json!({})).await;
    assert_eq!(r.error_kind, Some(ErrorKind::UnknownTool));
    assert!(r.text.contains("`x\\u{1b}[31mred\\u{7}\\r\\u{202e}`"), "{}", r.text);
    let e = t.set.call_mcp(&run, &json!({"name": evil})).await.unwrap_err();
    assert!(!e.message.contains('\u{1b}'), "{e}");
    // Every error text is escaped the same way (a field name or a value serde repeats); line
    // feeds and tabs of a tool's own multi-line error are kept.
    let r = ToolResult::error(ErrorKind::Tool, format!("field `{evil}`:\n\tdetail"), None);
    assert!(r.text.ends_with("field `x\\u{1b}[31mred\\u{7}\\r\\u{202e}`:\n\tdetail"), "{}", r.text);
    for text in [&r.text, r.content["error"]["message"].as_str().unwrap()] {
        assert!(!text.contains(['\u{1b}', '\u{7}', '\r', '\u{202e}']), "{text}");
    }
    assert_eq!(t.charges.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn bad_arguments_name_the_problem_and_run_nothing() {
    let t = tools();
    let run = Idem::in_memory().run("r");
    let cases: [(&str, ErrorKind, &str); 9] = [
        (
            "{\"customer\": \"cus_1\", \"amount_cents\": 49",
            ErrorKind::InvalidArguments,
            "not valid JSON",
        ),
        (
            "{\"customer\": \"cus_1\", \"amount_cents\": NaN}",
            ErrorKind::InvalidArguments,
            "JSON has no NaN",
        ),
        (
            "{\"customer\": \"cus_1\", \"amount_cents\": \"4900\"}",
            ErrorKind::InvalidArguments,
            "field `amount_cents`: invalid type: string \"4900\", expected u64",
        ),
        (
            "{\"customer\": \"cus_1\", \"amount_cents\": -5}",
            ErrorKind::InvalidArguments,
            "field `amount_cents`",
        ),
        ("{\"customer\": \"cus_1\"}", ErrorKind::InvalidArguments, "missing field `amount_cents`"),
        ("[\"cus_1\", 4900]", ErrorKind::InvalidArguments, "must be a JSON object, not an array"),
        // Repeated member names: one rule on every front door (MCP too), at any depth.
        (
            "{\"customer\": \"acct-A\", \"amount_cents\": 500, \"customer\": \"acct-B\"}",
            ErrorKind::InvalidArguments,
            "the member `customer` appears twice in the object at `.`",
        ),
        (
            "{\"customer\": \"c\", \"amount_cents\": 5, \"x\": [{\"k\": 1, \"k\": 2}]}",
            ErrorKind::InvalidArguments,
            "the member `k` appears twice in the object at `x[0]`",
        ),
        (
            "{\"customer\": \"\\ud800\", \"amount_cents\": 5}",
            ErrorKind::InvalidArguments,
            "not valid JSON",
        ),
    ];
    for (args, kind, needle) in cases {
        let r = t.set.call_text(&run, "charge_card", args).await;
        assert!(r.is_error, "{args}");
        assert_eq!(r.error_kind, Some(kind), "{args}");
        assert!(r.text.contains(needle), "{args}: {}", r.text);
        assert!(r.text.contains("nothing was executed"), "{}", r.text);
    }
    assert_eq!(t.charges.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn non_finite_numbers_are_refused_before_the_claim() {
    fn scale(a: &ScaleArgs, _: u32) -> Result<Value, PayError> {
        Ok(json!(a.factor))
    }
    let tool = fake("scale", RetryClass::Keyed, scale);
    let runs = tool.runs.clone();
    let run = Idem::in_memory().run("r");
    let set = ToolSet::new().with(tool).unwrap();
    // JSON cannot carry NaN or infinities: the text is refused before any claim.
    let r = set.call_text(&run, "scale", "{\"factor\": Infinity}").await;
    assert_eq!(r.error_kind, Some(ErrorKind::InvalidArguments));
    assert!(r.text.contains("finite number"), "{}", r.text);
    let r = set.call_text(&run, "scale", "{\"factor\": 1e999}").await;
    assert_eq!(r.error_kind, Some(ErrorKind::InvalidArguments), "{}", r.text);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn outcome_unknown_says_do_not_retry_and_what_to_check() {
    let t = tools();
    let run = Idem::in_memory().run("r");
    let args = json!({"customer": "cus_1", "amount_cents": 100});
    let first = t.set.call(&run, "refund", &args).await;
    let again = t.set.call(&run, "refund", &args).await;
    assert_eq!(t.refunds.load(Ordering::SeqCst), 1, "a never tool runs once");
    for r in [&first, &again] {
        assert!(r.is_error);
        assert_eq!(r.error_kind, Some(ErrorKind::OutcomeUnknown));
        assert!(r.text.contains("may have taken effect"), "{}", r.text);
        assert!(r.text.contains("Do NOT call `refund` again"), "{}", r.text);
        assert!(r.text.contains("read-only tools that may help: get_balance"), "{}", r.text);
        assert!(r.content["error"]["detail"]["idempotency_key"].is_string());
    }
    let mcp = first.to_mcp();
    assert_eq!(mcp["isError"], true);
    assert_eq!(mcp["content"][0]["type"], "text");
    assert!(mcp.get("structuredContent").is_none());
}

#[tokio::test]
async fn a_tool_error_is_readable_and_replayed() {
    fn declined(_: &ChargeArgs, n: u32) -> Result<Value, PayError> {
        Err(PayError::Declined(format!("insufficient funds (run {n})")))
    }
    let tool = fake("charge_card", RetryClass::Keyed, declined);
    let runs = tool.runs.clone();
    let set = ToolSet::new().with(tool).unwrap();
    let run = Idem::in_memory().run("r");
    let args = json!({"customer": "cus_1", "amount_cents": 100});
    let a = set.call(&run, "charge_card", &args).await;
    let b = set.call(&run, "charge_card", &args).await;
    assert_eq!((&a.content, &a.text, a.error_kind), (&b.content, &b.text, b.error_kind));
    let served = |r: &ToolResult| r.report.as_ref().and_then(|r| r.served);
    assert_eq!((served(&a), served(&b)), (Some(Served::Executed), Some(Served::Replayed)));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(a.error_kind, Some(ErrorKind::Tool));
    assert!(a.text.contains("card declined: insufficient funds (run 1)"), "{}", a.text);
    assert_eq!(a.content["error"]["detail"], json!({"Declined": "insufficient funds (run 1)"}));
}

/// An MCP result without its `_meta` (which says how each call was served).
fn without_meta(result: &Value) -> Value {
    let mut out = result.clone();
    out.as_object_mut().map(|o| o.remove("_meta"));
    out
}

#[tokio::test]
async fn a_caller_key_reused_with_other_arguments_is_refused() {
    let t = tools();
    let run = Idem::in_memory().run("session");
    let call = |amount: u64| {
        json!({"name": "charge_card", "arguments": {"customer": "cus_1", "amount_cents": amount},
            "_meta": {"idem/run": "conv-9", "idem/idempotencyKey": "order-17"}})
    };
    let a = t.set.call_mcp(&run, &call(100)).await.unwrap();
    assert_eq!(a["isError"], false);
    assert_eq!(a["structuredContent"]["charge_id"], "ch_1");
    let b = t.set.call_mcp(&run, &call(100)).await.unwrap();
    assert_eq!(without_meta(&a), without_meta(&b));
    assert_eq!(
        (&a["_meta"]["idem/outcome"], &b["_meta"]["idem/outcome"]),
        (&json!("executed"), &json!("replayed"))
    );
    let c = t.set.call_mcp(&run, &call(999)).await.unwrap();
    assert_eq!(c["isError"], true);
    let text = c["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("Error (key_reuse_mismatch)"), "{text}");
    assert!(text.contains("already used with other arguments"), "{text}");
    assert_eq!(t.charges.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn mcp_protocol_errors_for_unroutable_calls() {
    let t = tools();
    let run = Idem::in_memory().run("session");
    let e = t.set.call_mcp(&run, &json!({"name": "nope", "arguments": {}})).await.unwrap_err();
    assert_eq!(e.code, -32602);
    assert_eq!(e.message, "Unknown tool: nope");
    let e = t
        .set
        .call_mcp(
            &run,
            &json!({"name": "get_balance", "arguments": {"customer": "c"},
            "_meta": {"idem/run": 7}}),
        )
        .await
        .unwrap_err();
    assert!(e.message.contains("idem/run"), "{e}");
    // Bad arguments are a tool result, not a protocol error.
    let r = t.set.call_mcp(&run, &json!({"name": "get_balance", "arguments": {}})).await.unwrap();
    assert_eq!(r["isError"], true);
    assert!(r["content"][0]["text"].as_str().unwrap().contains("missing field `customer`"));
}

#[tokio::test]
async fn meta_run_is_the_key_scope() {
    let t = tools();
    let idem = Idem::in_memory();
    let session_a = idem.run("session-a");
    let session_b = idem.run("session-b");
    let call = json!({"name": "charge_card", "arguments": {"customer": "c", "amount_cents": 1},
        "_meta": {"idem/run": "conv-1"}});
    let a = t.set.call_mcp(&session_a, &call).await.unwrap();
    let b = t.set.call_mcp(&session_b, &call).await.unwrap();
    assert_eq!(
        without_meta(&a),
        without_meta(&b),
        "the same run id from two sessions is one intent"
    );
    assert_eq!(a["_meta"]["idem/key"], b["_meta"]["idem/key"]);
    assert_eq!(b["_meta"]["idem/run"], "conv-1");
    assert_eq!(t.charges.load(Ordering::SeqCst), 1);
    let no_meta = json!({"name": "charge_card", "arguments": {"customer": "c", "amount_cents": 1}});
    t.set.call_mcp(&session_a, &no_meta).await.unwrap();
    t.set.call_mcp(&session_b, &no_meta).await.unwrap();
    assert_eq!(
        t.charges.load(Ordering::SeqCst),
        3,
        "without a run id each session is its own scope"
    );
}

/// A client's own key without a run id is the client's across sessions (a resend after a
/// reconnect or a server restart is another session), inside the tenant; with a run id it is
/// that run's.
#[tokio::test]
async fn a_caller_key_without_a_run_survives_a_new_session() {
    let t = tools();
    let idem = Idem::in_memory();
    let call = json!({"name": "charge_card", "arguments": {"customer": "c", "amount_cents": 1},
        "_meta": {"idem/idempotencyKey": "order-17-send"}});
    let first = t.set.call_mcp(&idem.run("session-a"), &call).await.unwrap();
    let resent = t.set.call_mcp(&idem.run("session-b"), &call).await.unwrap();
    assert_eq!(
        (&first["_meta"]["idem/outcome"], &resent["_meta"]["idem/outcome"]),
        (&json!("executed"), &json!("replayed"))
    );
    assert_eq!(first["_meta"]["idem/key"], resent["_meta"]["idem/key"]);
    assert_eq!(first["_meta"].get("idem/run"), None, "no run to name, and none sent back");
    assert_eq!(t.charges.load(Ordering::SeqCst), 1, "one charge for the key");
    // Another tenant's session with the same key is that tenant's own intent.
    let other = idem.run("session-c").in_scope(Scope::run("session-c").with_tenant("bob"));
    let theirs = t.set.call_mcp(&other, &call).await.unwrap();
    assert_eq!(theirs["_meta"]["idem/outcome"], "executed");
    assert_eq!(t.charges.load(Ordering::SeqCst), 2);
}

struct DownStore;

#[async_trait]
impl Store for DownStore {
    async fn claim(&self, _: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
    async fn complete(
        &self,
        _: &Key,
        _: Fence,
        _: &Outcome,
        _: Duration,
    ) -> Result<(), StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
    async fn release(&self, _: &Key, _: Fence) -> Result<(), StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
    async fn renew(&self, _: &Key, _: Fence, _: Duration) -> Result<(), StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
    async fn wait(&self, _: &Key, _: Fence, _: Duration) -> Result<(), StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
    async fn forget(&self, _: &Key) -> Result<bool, StoreError> {
        Err(StoreError::unavailable("connection refused"))
    }
}

#[tokio::test]
async fn store_unavailable_runs_nothing_and_says_so() {
    let t = tools();
    let run = Idem::new(DownStore).run("r");
    let r = t.set.call(&run, "charge_card", &json!({"customer": "c", "amount_cents": 1})).await;
    assert_eq!(r.error_kind, Some(ErrorKind::StoreUnavailable));
    assert!(r.text.contains("nothing was executed"), "{}", r.text);
    assert_eq!(t.charges.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn budget_exhausted_and_timeout_are_readable() {
    fn flaky(_: &ChargeArgs, _: u32) -> Result<Value, PayError> {
        Err(PayError::Unavailable)
    }
    let tool = fake("charge_card", RetryClass::Keyed, flaky);
    let runs = tool.runs.clone();
    let set = ToolSet::new().with(tool).unwrap();
    let idem = Idem::builder(crate::MemoryStore::new())
        .retry_budget(Arc::new(RetryBudget::new(1, 0.1)))
        .seed(7)
        .build();
    let r =
        set.call(&idem.run("r"), "charge_card", &json!({"customer": "c", "amount_cents": 1})).await;
    assert_eq!(r.error_kind, Some(ErrorKind::BudgetExhausted), "{}", r.text);
    assert!(r.text.contains("shared retry budget is exhausted; retry later"), "{}", r.text);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let mut slow = fake_with(
        "charge_card",
        RetryClass::Keyed,
        ToolOptions {
            attempts: Some(2),
            attempt_timeout: Some(Duration::from_millis(500)),
            ..ToolOptions::default()
        },
        charge_ok,
    );
    slow.delay = Duration::from_secs(5);
    let runs = slow.runs.clone();
    let set = ToolSet::new().with(slow).unwrap();
    let idem = Idem::builder(crate::MemoryStore::new()).policy(Policy::default()).seed(7).build();
    let r =
        set.call(&idem.run("r"), "charge_card", &json!({"customer": "c", "amount_cents": 1})).await;
    assert_eq!(r.error_kind, Some(ErrorKind::Timeout), "{}", r.text);
    assert!(r.text.contains("timed out after 500 ms on attempt 2"), "{}", r.text);
    assert!(r.text.contains("calling it again with the same arguments is safe"), "{}", r.text);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_changing_call_without_a_run_id_is_refused_when_the_server_requires_one() {
    let t = tools();
    let session = Idem::in_memory().run("session");
    let args = json!({"customer": "cus_1", "amount_cents": 100});
    let no_run = Map::new();
    let named: Map<String, Value> =
        [(MCP_META_RUN.to_owned(), json!("conv-3"))].into_iter().collect();
    let call = |name, meta| McpCall::new(name, Arguments::Json(&args), Some(meta));
    let refused = t
        .set
        .dispatch_mcp(&session, call("charge_card", &no_run), MissingRun::Refuse)
        .await
        .unwrap();
    assert_eq!(refused.error_kind, Some(ErrorKind::InvalidToolCall));
    assert!(
        refused.text.contains(r#""_meta": {"idem/run": "<conversation id>"}"#),
        "{}",
        refused.text
    );
    assert!(refused.text.contains("nothing was executed"), "{}", refused.text);
    assert_eq!(t.charges.load(Ordering::SeqCst), 0);
    // A safe tool is never refused; a call that names its run runs.
    let balance = json!({"customer": "cus_1"});
    let read = McpCall::new("get_balance", Arguments::Json(&balance), None);
    assert!(!t.set.dispatch_mcp(&session, read, MissingRun::Refuse).await.unwrap().is_error);
    let ran = t
        .set
        .dispatch_mcp(&session, call("charge_card", &named), MissingRun::Refuse)
        .await
        .unwrap();
    assert!(!ran.is_error, "{}", ran.text);
    // The default only warns: the call runs in the session's scope.
    let warned =
        t.set.dispatch_mcp(&session, call("charge_card", &no_run), MissingRun::Warn).await.unwrap();
    assert_eq!(warned.report.unwrap().scope.run_id(), "session");
    assert_eq!(t.charges.load(Ordering::SeqCst), 2);
}

/// An output that counts how often it is serialized.
#[derive(Deserialize)]
struct Counted(u64);

static SERIALIZED: AtomicU32 = AtomicU32::new(0);

impl Serialize for Counted {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        SERIALIZED.fetch_add(1, Ordering::SeqCst);
        self.0.serialize(s)
    }
}

struct Counting;

impl Tool for Counting {
    type Args = BalanceArgs;
    type Output = Counted;
    type Error = PayError;
    fn def(&self) -> &'static ToolDef {
        static DEF: ToolDef = ToolDef {
            name: "counting",
            description: "counts serializations",
            class: RetryClass::Keyed,
            options: ToolOptions::NONE,
        };
        &DEF
    }
    async fn run(&self, _cx: &Ctx, _: BalanceArgs) -> Result<Counted, PayError> {
        Ok(Counted(7))
    }
}

#[tokio::test]
async fn an_output_the_executor_stored_is_not_checked_again() {
    let set = ToolSet::new().with(Counting).unwrap();
    let run = Idem::in_memory().run("r");
    let r = set.call(&run, "counting", &json!({"customer": "c"})).await;
    assert!(!r.is_error, "{r:?}");
    // The executor's check (its JSON, and what that reads back as written again) and the JSON
    // the model gets; checking again would add two.
    assert_eq!(SERIALIZED.load(Ordering::SeqCst), 3);
}

/// A ledger operation whose id is a `u128`, inside an internally tagged enum.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind")]
enum LedgerOp {
    Transfer { id: u128 },
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct LedgerOpArgs {
    op: LedgerOp,
}

/// serde reads an internally tagged enum through a buffer without 128-bit integers, so even
/// `1` is refused there. The refusal said "u128 is not supported; fix the arguments and call
/// again", which no caller can do: it says that the type must change, and nothing runs.
#[tokio::test]
async fn a_wide_integer_serde_cannot_read_where_it_is_says_the_type_must_change() {
    fn op(_: &LedgerOpArgs, _: u32) -> Result<Value, PayError> {
        Ok(json!({}))
    }
    let tool = fake("ledger_op", RetryClass::Keyed, op);
    let runs = tool.runs.clone();
    let set = ToolSet::new().with(tool).unwrap();
    let run = Idem::in_memory().run("r");
    let args = json!({"op": {"kind": "Transfer", "id": 1}});
    for r in [
        set.call(&run, "ledger_op", &args).await,
        set.call_text(&run, "ledger_op", &args.to_string()).await,
    ] {
        assert_eq!(r.error_kind, Some(ErrorKind::InvalidArguments), "{}", r.text);
        assert!(r.text.contains("a u128 cannot be read here, whatever the number"), "{}", r.text);
        assert!(r.text.contains("externally or adjacently tagged"), "{}", r.text);
        assert!(r.text.contains("the tool's argument type must change"), "{}", r.text);
        assert!(!r.text.contains("fix the arguments"), "{}", r.text);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct WidthArgs {
    u: Option<u64>,
    i: Option<i64>,
    s: Option<i32>,
    b: Option<u8>,
    w: Option<u128>,
    n: Option<std::num::NonZeroU64>,
}

#[tokio::test]
async fn an_integer_beyond_its_parameter_type_is_out_of_range_not_a_float() {
    fn widths(_: &WidthArgs, _: u32) -> Result<Value, PayError> {
        Ok(json!({}))
    }
    let tool = fake("widths", RetryClass::Keyed, widths);
    let runs = tool.runs.clone();
    let run = Idem::in_memory().run("r");
    let set = ToolSet::new().with(tool).unwrap();
    let u64_range = "out of range for u64 (an integer from 0 to 18446744073709551615)";
    let i64_range =
        "out of range for i64 (an integer from -9223372036854775808 to 9223372036854775807)";
    let cases: [(&str, &str); 12] = [
        // Beyond 64 bits: serde_json reads a double, which serde called "floating point".
        (r#"{"u": 18446744073709551616}"#, u64_range),
        (r#"{"u": -1}"#, "the number -1 is out of range for u64"),
        (r#"{"u": 1e20}"#, u64_range),
        (r#"{"i": -9223372036854775809}"#, i64_range),
        (r#"{"i": 9223372036854775808}"#, "the number 9223372036854775808 is out of range for i64"),
        (
            r#"{"s": 5000000000}"#,
            "the number 5000000000 is out of range for i32 (an integer from -2147483648 to 2147483647)",
        ),
        (r#"{"b": 300}"#, "the number 300 is out of range for u8 (an integer from 0 to 255)"),
        (r#"{"b": -1}"#, "the number -1 is out of range for u8"),
        (
            r#"{"n": 18446744073709551616}"#,
            "out of range for a nonzero u64 (an integer from 1 to 18446744073709551615)",
        ),
        // What is not a range error keeps serde's words.
        (r#"{"u": 1.5}"#, "invalid type: floating point `1.5`, expected u64"),
        (r#"{"n": 0}"#, "invalid value: integer `0`, expected a nonzero u64"),
        // serde_json reads a u128 from text itself; the refusal still names the field and type.
        (r#"{"w": -1}"#, "field `w`: the number -1 is out of range for u128 (an integer from 0 to"),
    ];
    for (text, needle) in cases {
        let by_text = set.call_text(&run, "widths", text).await;
        let mut said = vec![by_text];
        // The same through a parsed value (MCP without the arguments' text, Anthropic).
        if let Ok(value) = serde_json::from_str::<Value>(text) {
            said.push(set.call(&run, "widths", &value).await);
        }
        for r in said {
            assert_eq!(r.error_kind, Some(ErrorKind::InvalidArguments), "{text}: {}", r.text);
            assert!(r.text.contains(needle), "{text}: {} lacks {needle:?}", r.text);
            assert!(r.text.contains("out of range") || needle.contains("expected"), "{}", r.text);
            assert!(
                !r.text.contains("floating point") || needle.contains("floating"),
                "{}",
                r.text
            );
            assert!(r.text.contains("nothing was executed"), "{}", r.text);
        }
    }
    // In range, but a double beyond 2^53 in a parsed value, whose digits may not be the
    // client's: refused, saying so and how to keep them; the same arguments as text run.
    for text in [r#"{"w": 18446744073709551617}"#, r#"{"u": 1e19}"#, r#"{"i": -1e18}"#] {
        let value: Value = serde_json::from_str(text).unwrap();
        let r = set.call(&run, "widths", &value).await;
        assert_eq!(r.error_kind, Some(ErrorKind::InvalidArguments), "{text}: {}", r.text);
        for needle in ["beyond 2^53 held as a 64-bit float", "ToolSet::call_text"] {
            assert!(r.text.contains(needle), "{text}: {} lacks {needle:?}", r.text);
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    for text in [r#"{"w": 18446744073709551617}"#, r#"{"u": 1e19}"#, r#"{"i": -1e18}"#] {
        let r = set.call_text(&run, "widths", text).await;
        assert!(!r.is_error, "{text}: {}", r.text);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    // A number beyond any double: refused with the reason, for any parameter.
    let r = set.call_text(&run, "widths", r#"{"u": 1e400}"#).await;
    assert_eq!(r.error_kind, Some(ErrorKind::InvalidArguments), "{}", r.text);
    assert!(r.text.contains("number out of range"), "{}", r.text);
    assert!(r.text.contains("largest 64-bit float"), "{}", r.text);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_meta_id_longer_than_the_limit_is_invalid_params_and_runs_nothing() {
    let t = tools();
    let run = Idem::in_memory().run("session");
    let call = |key: &str, id: &str| {
        json!({"name": "charge_card", "arguments": {"customer": "c", "amount_cents": 1},
            "_meta": {key: id}})
    };
    // At the limit (in bytes: 'é' is two), accepted and echoed whole.
    let at_limit = "é".repeat(MAX_META_ID_BYTES / 2);
    let r = t.set.call_mcp(&run, &call(MCP_META_RUN, &at_limit)).await.unwrap();
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(r["_meta"][MCP_META_RUN], at_limit.as_str());
    let r = t.set.call_mcp(&run, &call(MCP_META_IDEMPOTENCY_KEY, &at_limit)).await.unwrap();
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(t.charges.load(Ordering::SeqCst), 2);
    // One byte more, or 100,000: refused as an ill-formed entry, like a number there.
    for key in [MCP_META_RUN, MCP_META_IDEMPOTENCY_KEY] {
        for id in [format!("{at_limit}a"), "r".repeat(100_000)] {
            let e = t.set.call_mcp(&run, &call(key, &id)).await.unwrap_err();
            assert_eq!(e.code, -32602, "{e}");
            assert!(
                e.message.contains(&format!("`_meta[\"{key}\"]` is {} bytes", id.len())),
                "{e}"
            );
            assert!(e.message.contains("at most 1024 bytes"), "{e}");
            assert!(e.message.len() < 300, "the id is not repeated: {e}");
        }
    }
    assert_eq!(t.charges.load(Ordering::SeqCst), 2, "nothing ran");
    // Empty, or only white space (an unset template): refused, not one run for every sender.
    for key in [MCP_META_RUN, MCP_META_IDEMPOTENCY_KEY] {
        for id in ["", " ", "\t\n ", "\u{3000}"] {
            let e = t.set.call_mcp(&run, &call(key, id)).await.unwrap_err();
            assert_eq!(e.code, -32602, "{e}");
            assert!(e.message.contains("more than white space"), "{e}");
        }
    }
    assert_eq!(t.charges.load(Ordering::SeqCst), 2, "nothing ran");
    // An unknown tool's name is repeated at most 128 characters long.
    let long = "x".repeat(100_000);
    let e = t.set.call_mcp(&run, &json!({"name": long, "arguments": {}})).await.unwrap_err();
    assert_eq!(e.message, format!("Unknown tool: {}…", "x".repeat(128)));
    let r = t.set.call(&run, &long, &json!({})).await;
    assert_eq!(r.error_kind, Some(ErrorKind::UnknownTool));
    assert!(r.text.contains(&format!("`{}…`", "x".repeat(128))), "{}", r.text);
    assert!(r.text.len() < 400, "{}", r.text);
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct FloatArgs {
    x: f32,
}

/// JSON has no infinity, so a finite number the parameter's type cannot hold (1e300 for an
/// `f32`) is out of range, by text and by value; nothing runs. (Read into an `f32` from a parsed
/// value it becomes infinity, which has no canonical form: the message must not blame the
/// client for sending one.)
#[tokio::test]
async fn a_float_beyond_an_f32_is_out_of_range_not_an_infinity() {
    fn floats(a: &FloatArgs, _: u32) -> Result<Value, PayError> {
        Ok(json!({ "x": a.x }))
    }
    let tool = fake("floats", RetryClass::Keyed, floats);
    let runs = tool.runs.clone();
    let run = Idem::in_memory().run("r");
    let set = ToolSet::new().with(tool).unwrap();
    for text in [r#"{"x": 1e300}"#, r#"{"x": -1e39}"#] {
        let value: Value = serde_json::from_str(text).unwrap();
        for r in [set.call_text(&run, "floats", text).await, set.call(&run, "floats", &value).await]
        {
            assert_eq!(r.error_kind, Some(ErrorKind::InvalidArguments), "{text}: {}", r.text);
            assert!(r.text.contains("out of range") || r.text.contains("beyond"), "{}", r.text);
            assert!(r.text.contains("3.4e38"), "{}", r.text);
            assert!(!r.text.contains("pass a finite number"), "{}", r.text);
            assert!(r.text.contains("nothing was executed"), "{}", r.text);
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");
    // Within range it runs.
    let r = set.call_text(&run, "floats", r#"{"x": 3.5}"#).await;
    assert_eq!(r.error_kind, None, "{}", r.text);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct WideArgs {
    n: u128,
    m: i128,
}

/// serde_json reads 128-bit integers from text by scanning digits, and stops at a fraction, an
/// exponent, a string or a sign with a syntax error that names no field ("expected `,` or `}`"):
/// said to a model, that is false (the text is valid JSON) and useless. Every such mistake is
/// named at its field, as for 64-bit parameters, by text and by value, and nothing runs.
#[tokio::test]
async fn a_wrong_value_for_a_128_bit_parameter_names_the_field_and_the_type() {
    fn wide(a: &WideArgs, _: u32) -> Result<Value, PayError> {
        Ok(json!(format!("{}/{}", a.n, a.m)))
    }
    let tool = fake("wide", RetryClass::Keyed, wide);
    let runs = tool.runs.clone();
    let run = Idem::in_memory().run("r");
    let set = ToolSet::new().with(tool).unwrap();
    let cases = [
        (r#"{"n": 1.5, "m": 0}"#, "field `n`: invalid type: floating point `1.5`, expected u128"),
        (r#"{"n": 0, "m": -1.5}"#, "field `m`: invalid type: floating point `-1.5`, expected i128"),
        (r#"{"n": "1", "m": 0}"#, "field `n`: invalid type: string \"1\", expected u128"),
        (r#"{"n": -1, "m": 0}"#, "field `n`: the number -1 is out of range for u128"),
        (
            r#"{"n": 0, "m": 340282366920938463463374607431768211456}"#,
            "field `m`: the number is out of range for i128",
        ),
    ];
    for (text, needle) in cases {
        let value: Value = serde_json::from_str(text).unwrap();
        for r in [set.call_text(&run, "wide", text).await, set.call(&run, "wide", &value).await] {
            assert_eq!(r.error_kind, Some(ErrorKind::InvalidArguments), "{text}: {}", r.text);
            assert!(r.text.contains(needle), "{text}: {} lacks {needle:?}", r.text);
            assert!(!r.text.contains("expected `,`"), "{}", r.text);
            assert!(!r.text.contains("f32"), "no float range for an integer: {}", r.text);
            assert!(r.text.contains("nothing was executed"), "{}", r.text);
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");
    // Exact values beyond 64 bits still run, from text.
    let r = set
        .call_text(&run, "wide", r#"{"n": 340282366920938463463374607431768211455, "m": -1}"#)
        .await;
    assert_eq!(r.text, "340282366920938463463374607431768211455/-1");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct NoArgs {}

#[tokio::test]
async fn only_json_whitespace_or_null_is_no_arguments() {
    fn ping(_: &NoArgs, _: u32) -> Result<Value, PayError> {
        Ok(json!("pong"))
    }
    let tool = fake("ping", RetryClass::Keyed, ping);
    let runs = tool.runs.clone();
    let set = ToolSet::new().with(tool).unwrap();
    let idem = Idem::in_memory();
    // RFC 8259's whitespace and `null`, as text: no arguments, as an absent or `null` value.
    for (i, text) in ["", " \t\r\n", "null", " null\n"].into_iter().enumerate() {
        let r = set.call_text(&idem.run(format!("r{i}")), "ping", text).await;
        assert_eq!(r.text, "pong", "{text:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    // Other blank characters are not JSON: refused, and the tool does not run as if it had been
    // sent nothing.
    for text in ["\u{a0}", "\u{3000}\u{2028}", "\u{feff}{}", "\u{85}"] {
        let r = set.call_text(&idem.run("other"), "ping", text).await;
        assert_eq!(r.error_kind, Some(ErrorKind::InvalidArguments), "{text:?}: {}", r.text);
        assert!(r.text.contains("not valid JSON"), "{text:?}: {}", r.text);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 4, "nothing ran for the refused texts");
}

/// JSON Schema's `integer` is any number without a fraction (Validation 2020-12, §6.1.1), and
/// clients that pass numbers through a float send `5.0` for one: it is the integer it equals,
/// by text and by value, with the key of `5` (a repeat replays), for 64 and 128-bit parameters.
#[tokio::test]
async fn a_whole_number_written_as_a_float_is_an_integer_with_the_same_key() {
    fn widths(a: &WidthArgs, _: u32) -> Result<Value, PayError> {
        Ok(json!([a.u, a.i, a.b, a.w.map(|w| w.to_string())]))
    }
    let tool = fake("widths", RetryClass::Keyed, widths);
    let runs = tool.runs.clone();
    let run = Idem::in_memory().run("r");
    let set = ToolSet::new().with(tool).unwrap();
    let first = set.call_text(&run, "widths", r#"{"u": 5, "i": 0, "b": 200, "w": 1000}"#).await;
    assert!(!first.is_error, "{}", first.text);
    assert_eq!(first.content, json!([5, 0, 200, "1000"]));
    let key = first.report.as_ref().unwrap().key;
    let same = [
        r#"{"u": 5.0, "i": -0, "b": 2e2, "w": 1e3}"#,
        r#"{"u": 5.000, "i": -0.0, "b": 200, "w": 1000.0}"#,
    ];
    for text in same {
        let value: Value = serde_json::from_str(text).unwrap();
        for r in [set.call_text(&run, "widths", text).await, set.call(&run, "widths", &value).await]
        {
            assert!(!r.is_error, "{text}: {}", r.text);
            assert_eq!(r.content, json!([5, 0, 200, "1000"]), "{text}");
            assert_eq!(r.report.as_ref().unwrap().key, key, "{text}: the key of the integers");
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "every repeat replayed the first call");
    // A fraction, or a whole number beyond the type, is still refused, naming the field.
    for (text, needle) in [
        (r#"{"u": 5.5}"#, "field `u`: invalid type: floating point `5.5`, expected u64"),
        // Read as the integer 300, which is then what is refused.
        (r#"{"b": 3e2}"#, "field `b`: the number 300 is out of range for u8"),
        (r#"{"n": -0}"#, "field `n`: invalid value: integer `0`, expected a nonzero u64"),
        // The digits decide, not the double they round to, and the refusal quotes them.
        (
            r#"{"u": 1.0000000000000001}"#,
            "field `u`: invalid type: floating point `1.0000000000000001`, expected u64",
        ),
        (
            r#"{"u": 2.9999999999999999}"#,
            "field `u`: invalid type: floating point `2.9999999999999999`",
        ),
        (r#"{"u": 1e-400}"#, "field `u`: invalid type: floating point `1e-400`"),
        (r#"{"u": -1e-400}"#, "field `u`: invalid type: floating point `-1e-400`"),
        (r#"{"w": 1.5E0}"#, "field `w`: invalid type: floating point `1.5E0`, expected u128"),
    ] {
        let r = set.call_text(&run, "widths", text).await;
        assert_eq!(r.error_kind, Some(ErrorKind::InvalidArguments), "{text}: {}", r.text);
        assert!(r.text.contains(needle), "{text}: {} lacks {needle:?}", r.text);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "no refused call ran");
    // Beyond 2^53: the text's digits are exact, a double may be a neighbour of the integer
    // written (`9007199254740993.0` reads as 2^53), so only the text is read as an integer.
    let text = r#"{"u": 9007199254740993.0, "w": 340282366920938463463374607431768211455.0}"#;
    let r = set.call_text(&run, "widths", text).await;
    assert_eq!(r.content, json!([9007199254740993_u64, null, null, u128::MAX.to_string()]));
    let r = set.call(&run, "widths", &serde_json::from_str(text).unwrap()).await;
    assert_eq!(r.error_kind, Some(ErrorKind::InvalidArguments), "{}", r.text);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Calls `tool` with each case's text, as text and as a parsed value: each is refused as
/// invalid arguments, saying the case's needle.
async fn refused_saying(set: &ToolSet, run: &crate::Run, tool: &str, cases: &[(&str, &str)]) {
    for (text, needle) in cases {
        let value: Value = serde_json::from_str(text).unwrap();
        for r in [set.call_text(run, tool, text).await, set.call(run, tool, &value).await] {
            assert_eq!(r.error_kind, Some(ErrorKind::InvalidArguments), "{text}: {}", r.text);
            assert!(r.text.contains(needle), "{text}: {} lacks {needle:?}", r.text);
        }
    }
}

/// Calls `tool` with each of `texts` as text and as a parsed value: every call answers `want`,
/// all under one key, which is returned.
async fn one_key_for(
    set: &ToolSet,
    run: &crate::Run,
    tool: &str,
    texts: &[&str],
    want: &Value,
) -> Key {
    let mut keys = Vec::new();
    for text in texts {
        let value: Value = serde_json::from_str(text).unwrap();
        for r in [set.call_text(run, tool, text).await, set.call(run, tool, &value).await] {
            assert!(!r.is_error, "{text}: {}", r.text);
            assert_eq!(&r.content, want, "{text}");
            keys.push(r.report.expect("a report").key);
        }
    }
    assert!(keys.windows(2).all(|w| w[0] == w[1]), "one intent, one key: {keys:?}");
    keys[0]
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
enum Limit {
    Count(u32),
    Fraction(f32),
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct PageArgs {
    limit: Limit,
    page: u32,
    scale: f64,
    filter: Value,
}

/// Only the number a parameter refused is read as an integer: floats that other parameters
/// accept (an untagged enum's float variant, an `f64`'s negative zero, the numbers inside a
/// free-form `Value`) are read as sent whatever else was refused, so their call and its key do
/// not depend on another field's spelling.
#[tokio::test]
async fn only_the_refused_number_is_read_as_an_integer() {
    fn page(a: &PageArgs, _: u32) -> Result<Value, PayError> {
        let limit = match a.limit {
            Limit::Count(n) => format!("count {n}"),
            Limit::Fraction(f) => format!("fraction {f}"),
        };
        Ok(json!([limit, a.page, a.scale.is_sign_negative(), a.filter.to_string()]))
    }
    let tool = fake("page", RetryClass::Keyed, page);
    let set = ToolSet::new().with(tool).unwrap();
    let run = Idem::in_memory().run("r");
    let plain = r#"{"limit": 0.5, "page": 2, "scale": -0.0, "filter": {"price": 5.0}}"#;
    let spelled = r#"{"limit": 0.5, "page": 2.0, "scale": -0.0, "filter": {"price": 5.0}}"#;
    let want = json!(["fraction 0.5", 2, true, r#"{"price":5.0}"#]);
    one_key_for(&set, &run, "page", &[plain, spelled], &want).await;
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Payment {
    Card { amount: u64, fee: f64, memo: Value },
    Transfer { amount: u64 },
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct Retries {
    retries: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct TaggedArgs {
    payment: Payment,
    #[serde(flatten)]
    retries: Retries,
}

/// serde reads an internally tagged enum, and a `#[serde(flatten)]` field's object, as a whole
/// before it types the parts, and its refusal of `5.0` for an integer there names the enclosing
/// field, not the number: the whole number inside that part equal to the refused one is read as
/// the integer, by text and by value, with the key of the integers. A fraction is still refused,
/// and an `f64` or a `Value` in the same part may take the integer (the same number, the same key).
#[tokio::test]
async fn a_whole_number_inside_a_tagged_enum_or_a_flattened_field_is_an_integer() {
    fn pay(a: &TaggedArgs, _: u32) -> Result<Value, PayError> {
        Ok(match &a.payment {
            Payment::Card { amount, fee, memo } => {
                json!(["card", amount, fee, memo, a.retries.retries])
            }
            Payment::Transfer { amount } => json!(["transfer", amount, a.retries.retries]),
        })
    }
    let tool = fake("pay", RetryClass::Keyed, pay);
    let runs = tool.runs.clone();
    let run = Idem::in_memory().run("r");
    let set = ToolSet::new().with(tool).unwrap();
    let spellings = [
        r#"{"payment": {"kind": "card", "amount": 5, "fee": 0.5, "memo": {"n": 7.5}}, "retries": 2}"#,
        r#"{"payment": {"kind": "card", "amount": 5.0, "fee": 0.5, "memo": {"n": 7.5}}, "retries": 2}"#,
        r#"{"payment": {"kind": "card", "amount": 5e0, "fee": 0.5, "memo": {"n": 7.5}}, "retries": 2.0}"#,
        r#"{"retries": 2e0, "payment": {"memo": {"n": 7.5}, "fee": 0.5, "amount": 500e-2, "kind": "card"}}"#,
    ];
    let want = json!(["card", 5, 0.5, {"n": 7.5}, 2]);
    one_key_for(&set, &run, "pay", &spellings, &want).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "every repeat replayed the first call");
    // Digits inside a string are text, whatever its escapes: the number after it is read.
    let text = r#"{"payment": {"kind": "card", "memo": "5.0 \"5.0\" \\", "fee": 0.5, "amount": 5.0}, "retries": 2}"#;
    let r = set.call_text(&run, "pay", text).await;
    assert_eq!(r.content, json!(["card", 5, 0.5, "5.0 \"5.0\" \\", 2]), "{}", r.text);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // An `f64` and a `Value` in the same part holding the same number as the refused one: the
    // call runs once more (a new intent), with the integer where the type needs one.
    let text =
        r#"{"payment": {"kind": "card", "fee": 9.0, "memo": [9.0], "amount": 9.0}, "retries": 1}"#;
    let value: Value = serde_json::from_str(text).unwrap();
    let mut keys = Vec::new();
    for r in [set.call_text(&run, "pay", text).await, set.call(&run, "pay", &value).await] {
        assert!(!r.is_error, "{}", r.text);
        let c = &r.content;
        assert!(c[0] == "card" && c[1].is_u64() && c[1] == 9 && c[4] == 1, "{c}");
        // The `Value` keeps the float as sent: the repair that wrote it an integer was not
        // needed, and is undone.
        assert!(c[2].as_f64() == Some(9.0) && c[3][0].is_f64(), "{c}");
        keys.push(r.report.unwrap().key);
    }
    assert_eq!(keys[0], keys[1], "one intent, one key");
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    // Zeros: the refused `0.0` is the integer; an `f64` before it holding `-0.0` keeps its sign.
    let text =
        r#"{"payment": {"kind": "card", "fee": -0.0, "memo": null, "amount": 0.0}, "retries": 1}"#;
    let value: Value = serde_json::from_str(text).unwrap();
    for r in [set.call_text(&run, "pay", text).await, set.call(&run, "pay", &value).await] {
        let c = &r.content;
        assert!(c[1].is_u64() && c[1] == 0, "{}", r.text);
        assert!(c[2].as_f64().is_some_and(|f| f == 0.0 && f.is_sign_negative()), "{c}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    // Refused as before: a fraction, a whole number beyond the type, a number for a string.
    let cases = [
        (
            r#"{"payment": {"kind": "transfer", "amount": 5.5}, "retries": 1}"#,
            "field `payment`: invalid type: floating point `5.5`, expected u64",
        ),
        (
            r#"{"payment": {"kind": "transfer", "amount": 1}, "retries": 1.5}"#,
            "invalid type: floating point `1.5`, expected u32",
        ),
        (
            r#"{"payment": {"kind": "transfer", "amount": -1.0}, "retries": 1}"#,
            "field `payment`: the number -1 is out of range for u64",
        ),
    ];
    refused_saying(&set, &run, "pay", &cases).await;
    assert_eq!(runs.load(Ordering::SeqCst), 4, "no refused call ran");
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
enum Recipient {
    Account { account: u64 },
    Named { name: String },
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct SendArgs {
    to: Recipient,
    limit: Limit,
}

/// An untagged enum that no variant takes as sent names no number in its refusal: its whole
/// numbers are read as integers until a variant takes it. One that a variant takes as sent
/// (a float variant) keeps its float (a whole one there is refused: its key would be the
/// integer variant's, `a_whole_float_an_untagged_enum_would_read_as_another_variant_is_refused`).
#[tokio::test]
async fn a_whole_number_inside_an_untagged_enum_no_variant_took_is_an_integer() {
    fn send(a: &SendArgs, _: u32) -> Result<Value, PayError> {
        let to = match &a.to {
            Recipient::Account { account } => json!({ "account": account }),
            Recipient::Named { name } => json!({ "name": name }),
        };
        let limit = match a.limit {
            Limit::Count(n) => format!("count {n}"),
            Limit::Fraction(f) => format!("fraction {f}"),
        };
        Ok(json!([to, limit]))
    }
    let tool = fake("send", RetryClass::Keyed, send);
    let runs = tool.runs.clone();
    let run = Idem::in_memory().run("r");
    let set = ToolSet::new().with(tool).unwrap();
    let want = json!([{"account": 42}, "fraction 0.5"]);
    let spellings =
        [r#"{"to": {"account": 42}, "limit": 0.5}"#, r#"{"to": {"account": 4.2e1}, "limit": 0.5}"#];
    one_key_for(&set, &run, "send", &spellings, &want).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let text = r#"{"to": {"account": 42.5}, "limit": 1}"#;
    for r in [
        set.call_text(&run, "send", text).await,
        set.call(&run, "send", &serde_json::from_str(text).unwrap()).await,
    ] {
        assert_eq!(r.error_kind, Some(ErrorKind::InvalidArguments), "{}", r.text);
        let needle = "field `to`: data did not match any variant of untagged enum Recipient";
        assert!(r.text.contains(needle), "{} lacks {needle:?}", r.text);
    }
    // Refused for another reason (no variant takes a name that is not a string), with more whole
    // numbers than the repairs' limit beside it: the enum's own refusal, not the limit's.
    let floats: Vec<String> = (0..70).map(|i| format!(r#""x{i}": {i}.0"#)).collect();
    let text = format!(r#"{{"to": {{"name": true, {}}}, "limit": 1}}"#, floats.join(", "));
    for r in [
        set.call_text(&run, "send", &text).await,
        set.call(&run, "send", &serde_json::from_str(&text).unwrap()).await,
    ] {
        let needle = "field `to`: data did not match any variant of untagged enum Recipient";
        assert!(r.text.contains(needle), "{} lacks {needle:?}", r.text);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the refused calls did not run");
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct TodoArgs {
    text: String,
    done: bool,
    count: u32,
}

/// A whole number written as a float where no integer is expected (a string, a boolean) is
/// refused in serde's words about what was sent, not about an integer the client never sent.
#[tokio::test]
async fn a_whole_float_where_no_integer_is_expected_is_refused_as_sent() {
    fn todo(_: &TodoArgs, _: u32) -> Result<Value, PayError> {
        Ok(Value::Null)
    }
    let tool = fake("todo", RetryClass::Keyed, todo);
    let runs = tool.runs.clone();
    let run = Idem::in_memory().run("r");
    let set = ToolSet::new().with(tool).unwrap();
    let cases = [
        (
            r#"{"text": 5.0, "done": true, "count": 1}"#,
            "field `text`: invalid type: floating point `5.0`, expected a string",
        ),
        (
            r#"{"text": "a", "done": 1.0, "count": 1}"#,
            "field `done`: invalid type: floating point `1.0`, expected a boolean",
        ),
        (
            r#"{"text": 5.0, "done": true, "count": 1.0}"#,
            "field `text`: invalid type: floating point `5.0`, expected a string",
        ),
    ];
    refused_saying(&set, &run, "todo", &cases).await;
    let ok = set.call_text(&run, "todo", r#"{"text": "a", "done": true, "count": 1.0}"#).await;
    assert!(!ok.is_error, "{}", ok.text);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct Address {
    /// The street and number.
    street: String,
    city: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct ShipArgs {
    from: Address,
    to: Address,
    method: Method,
}

/// The published schema is what every host and model API reads: no `$schema` (Gemini CLI fails
/// calls whose schema names the 2020-12 meta-schema), no `$defs` behind `$ref`s (Gemini refuses
/// them), no Rust type name as a title; nested and repeated types are written in place.
#[test]
fn a_published_schema_has_no_meta_schema_no_references_and_no_type_name() {
    fn ship(_: &ShipArgs, _: u32) -> Result<Value, PayError> {
        Ok(Value::Null)
    }
    let set = ToolSet::new().with(fake("ship", RetryClass::Keyed, ship)).unwrap();
    let schema = &set.definition("ship").unwrap().input_schema;
    let text = Value::Object(schema.clone()).to_string();
    for absent in ["$schema", "$defs", "$ref", "definitions", "\"title\""] {
        assert!(!text.contains(absent), "{absent} in {text}");
    }
    let properties = &schema["properties"];
    for side in ["from", "to"] {
        assert_eq!(properties[side]["type"], "object", "{text}");
        assert_eq!(properties[side]["properties"]["street"]["type"], "string", "{text}");
        assert_eq!(
            properties[side]["properties"]["street"]["description"], "The street and number.",
            "{text}"
        );
    }
    assert!(properties["method"]["oneOf"].is_array(), "{text}");
    // The same for every front door.
    assert_eq!(set.anthropic_tools()[0]["input_schema"], Value::Object(schema.clone()));
    assert_eq!(set.openai_tools()[0]["function"]["parameters"], Value::Object(schema.clone()));
}

/// Some models and OpenAI-compatible servers encode a call's arguments twice: a JSON string
/// holding the object's text. A string is never a tool's arguments, so the object inside is the
/// call, on every front door, with the key of the object sent plainly; a string that holds
/// anything else is refused as before.
#[tokio::test]
async fn arguments_encoded_twice_are_the_object_inside() {
    let t = tools();
    let run = Idem::in_memory().run("r");
    let plain = json!({"customer": "cus_1", "amount_cents": 4900});
    let first = t.set.call(&run, "charge_card", &plain).await;
    assert!(!first.is_error, "{}", first.text);
    let key = first.report.as_ref().unwrap().key;
    let inner = r#" {"amount_cents": 4900, "customer": "cus_1"}"#;
    let encoded = serde_json::to_string(inner).unwrap();
    for r in [
        t.set.call_text(&run, "charge_card", &encoded).await,
        t.set.call(&run, "charge_card", &Value::String(inner.into())).await,
    ] {
        assert!(!r.is_error, "{}", r.text);
        assert_eq!(r.content, first.content);
        assert_eq!(r.report.as_ref().unwrap().key, key, "the key of the plain object");
    }
    let call = json!({"id": "c1", "type": "function",
        "function": {"name": "charge_card", "arguments": encoded}});
    let message = t.set.call_openai(&run, &call).await;
    assert_eq!(message["content"], first.text.as_str(), "{message}");
    assert_eq!(t.charges.load(Ordering::SeqCst), 1, "one charge for every spelling");
    // Inside the string, the same rules: fields named, nothing run.
    let bad = serde_json::to_string(r#"{"customer": "cus_1", "amount_cents": "5"}"#).unwrap();
    let r = t.set.call_text(&run, "charge_card", &bad).await;
    assert_eq!(r.error_kind, Some(ErrorKind::InvalidArguments), "{}", r.text);
    assert!(r.text.contains("field `amount_cents`"), "{}", r.text);
    // A string that is not an object's text, or an object encoded three times, is refused.
    let thrice = serde_json::to_string(&encoded).unwrap();
    for text in [r#""cus_1""#, r#""[1, 2]""#, thrice.as_str()] {
        let r = t.set.call_text(&run, "charge_card", text).await;
        assert_eq!(r.error_kind, Some(ErrorKind::InvalidArguments), "{text}: {}", r.text);
        assert!(r.text.contains("must be a JSON object, not a string"), "{text}: {}", r.text);
    }
    assert_eq!(t.charges.load(Ordering::SeqCst), 1);
}

/// Bridges that pass OpenAI's `arguments` text on as MCP or Anthropic arguments send a tool
/// without parameters `""`: the empty text OpenAI-style models write for no arguments, now inside
/// a JSON string. A string holding no text (or `null`) is no arguments in every shape, as that
/// text is on the OpenAI front door; a tool that needs arguments is then refused for the field it
/// lacks, not for a string.
#[tokio::test]
async fn a_string_holding_no_arguments_is_no_arguments() {
    let set = ToolSet::new().with(fake("now", RetryClass::Safe, now_ok)).unwrap();
    let run = Idem::in_memory().run("conv-now");
    for inside in ["", " \n", "null"] {
        let string = Value::String(inside.into());
        let text = serde_json::to_string(inside).unwrap();
        let block = json!({"type": "tool_use", "id": "t1", "name": "now", "input": string});
        let params = json!({"name": "now", "arguments": string});
        let results =
            [set.call(&run, "now", &string).await, set.call_text(&run, "now", &text).await];
        for r in results {
            assert!(!r.is_error, "{text}: {}", r.text);
            assert_eq!(r.text, "12:00");
        }
        let block = set.call_anthropic(&run, &block).await;
        assert_eq!(block["is_error"], false, "{text}: {block}");
        let mcp = set.call_mcp(&run, &params).await.unwrap();
        assert_eq!(mcp["isError"], false, "{text}: {mcp}");
    }
    let t = tools();
    let r = t.set.call(&run, "charge_card", &json!("")).await;
    assert_eq!(r.error_kind, Some(ErrorKind::InvalidArguments), "{}", r.text);
    assert!(r.text.contains("missing field `customer`"), "{}", r.text);
    assert_eq!(t.charges.load(Ordering::SeqCst), 0);
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct Widths {
    small: u8,
    count: usize,
    amount: u64,
    delta: i32,
    ratio: f64,
    reference: Option<u128>,
    ports: Vec<u16>,
    inner: WidthsInner,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct WidthsInner {
    weight: f32,
}

fn widths_ok(_: &Widths, _: u32) -> Result<Value, PayError> {
    Ok(json!("ok"))
}

/// schemars labels Rust's integer and float widths with OpenAPI-style `format`s (`uint8`,
/// `uint`, `uint64`, `int32`, `double`, `uint128`, ...), which JSON Schema 2020-12 does not
/// define: hosts that compile a tool's schema with Ajv (opencode, Kimi Code, Genkit, Claude Code's
/// `mcp get`) log a warning for every such field on every connection, and Genkit fails the tool.
/// A published number has no `format`; its `type`, `minimum` and `maximum` keep the constraint.
/// Other formats (a string's `date-time`) stay.
#[test]
fn published_numbers_carry_no_format_json_schema_does_not_define() {
    let set = ToolSet::new().with(fake("widths", RetryClass::Safe, widths_ok)).unwrap();
    let schema = Value::Object(set.definition("widths").unwrap().input_schema.clone());
    let mut formats = Vec::new();
    let mut stack = vec![("$".to_owned(), &schema)];
    while let Some((at, value)) = stack.pop() {
        match value {
            Value::Object(members) => {
                if let Some(format) = members.get("format").filter(|_| !at.ends_with("properties"))
                {
                    formats.push(format!("{at}: {format}"));
                }
                stack.extend(members.iter().map(|(k, v)| (format!("{at}.{k}"), v)));
            }
            Value::Array(items) => {
                stack.extend(items.iter().enumerate().map(|(i, v)| (format!("{at}[{i}]"), v)));
            }
            _ => {}
        }
    }
    assert!(formats.is_empty(), "{formats:?} in {schema}");
    let properties = &schema["properties"];
    assert_eq!(properties["small"], json!({"type": "integer", "minimum": 0, "maximum": 255}));
    assert_eq!(properties["amount"], json!({"type": "integer", "minimum": 0}));
    assert_eq!(properties["ratio"], json!({"type": "number"}));
    assert_eq!(properties["ports"]["items"]["maximum"], 65535, "{schema}");
    let mut dated = json!({"type": "object", "properties": {
        "at": {"type": "string", "format": "date-time"},
        "format": {"type": "integer", "format": "int64"}}});
    host_readable(dated.as_object_mut().unwrap());
    assert_eq!(dated["properties"]["at"]["format"], "date-time");
    assert_eq!(dated["properties"]["format"], json!({"type": "integer"}));
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct Node {
    name: String,
    children: Vec<Node>,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct TreeArgs {
    root: Node,
}

/// A recursive type cannot be written in place all the way down: its first use is, and its
/// recursion refers to one `$defs` entry; generating the schema ends.
#[test]
fn a_recursive_argument_type_keeps_one_reference() {
    fn tree(_: &TreeArgs, _: u32) -> Result<Value, PayError> {
        Ok(Value::Null)
    }
    let set = ToolSet::new().with(fake("tree", RetryClass::Keyed, tree)).unwrap();
    let schema = Value::Object(set.definition("tree").unwrap().input_schema.clone());
    assert!(schema["$defs"]["Node"].is_object(), "{schema}");
    let root = &schema["properties"]["root"];
    assert_eq!(root["type"], "object", "{schema}");
    assert_eq!(root["properties"]["children"]["items"]["$ref"], "#/$defs/Node", "{schema}");
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct Bracketed {
    #[serde(rename = "filter[id]")]
    filter_id: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[allow(non_snake_case)]
struct Accented {
    prénom: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct Dotted {
    #[serde(rename = "filter.id")]
    filter_id: String,
    #[serde(rename = "max-results")]
    max: u32,
}

/// Anthropic's API refuses a whole request when one tool has a top-level property whose name is
/// not `^[a-zA-Z0-9_.-]{1,64}$`: refused when the set is built, naming the argument; names
/// within the rule, `.` and `-` included, are accepted.
#[test]
fn an_argument_name_model_apis_refuse_is_refused_when_the_set_is_built() {
    fn any<A>(_: &A, _: u32) -> Result<Value, PayError> {
        Ok(Value::Null)
    }
    let refusals = [
        (ToolSet::new().with(fake("list", RetryClass::Safe, any::<Bracketed>)), "filter[id]"),
        (ToolSet::new().with(fake("greet", RetryClass::Safe, any::<Accented>)), "prénom"),
    ];
    for (built, property) in refusals {
        let refused = built.unwrap_err();
        let ToolSetError::InvalidArgumentName { property: said, .. } = &refused else {
            panic!("{refused:?}")
        };
        assert_eq!(said, property);
        assert!(refused.to_string().contains("1 to 64 ASCII letters"), "{refused}");
    }
    assert!(ToolSet::new().with(fake("find", RetryClass::Safe, any::<Dotted>)).is_ok());
}

#[test]
fn host_readable_rewrites_every_boolean_subschema_but_a_forbidding_keyword() {
    let Value::Object(mut schema) = json!({
        "type": "object",
        "properties": {
            "any": true,
            "none": false,
            "list": {"type": ["array", "null"], "items": true, "description": "d"},
            "open": {"type": "object", "additionalProperties": true},
            "rest": {"type": "object", "unevaluatedProperties": true},
            "closed": {"type": "object", "additionalProperties": false, "unevaluatedProperties": false}
        },
        "additionalProperties": false
    }) else {
        unreachable!()
    };
    host_readable(&mut schema);
    assert_eq!(
        Value::Object(schema),
        json!({
            "type": "object",
            "properties": {
                "any": {},
                "none": {"not": {}},
                "list": {
                    "description": "d",
                    "anyOf": [{"type": "array", "items": {}}, {"type": "null"}]
                },
                "open": {"type": "object", "additionalProperties": {}},
                "rest": {"type": "object", "unevaluatedProperties": {}},
                "closed": {"type": "object", "additionalProperties": false, "unevaluatedProperties": false}
            },
            "additionalProperties": false
        })
    );
}

/// A tool whose output is an empty or blank string answers a text the model's API takes: its
/// JSON (`""`), not an empty text block, which Anthropic's Messages API refuses along with the
/// whole request ("text content blocks must be non-empty"). A replay answers the same text. Any
/// other string is itself.
#[tokio::test]
async fn an_empty_or_blank_string_output_is_written_as_its_json() {
    #[derive(Clone, Serialize, serde::Deserialize, JsonSchema)]
    struct Say {
        say: String,
    }
    fn echo(args: &Say, _: u32) -> Result<Value, PayError> {
        Ok(json!(args.say))
    }
    let tool = fake("echo", RetryClass::Keyed, echo);
    let runs = tool.runs.clone();
    let set = ToolSet::new().with(tool).unwrap();
    let run = Idem::in_memory().run("blank");
    for (say, text) in
        [("", r#""""#), ("  \n", r#""  \n""#), ("\u{3000}", "\"\u{3000}\""), ("ok", "ok")]
    {
        for _ in 0..2 {
            let r = set.call(&run, "echo", &json!({ "say": say })).await;
            assert!(!r.is_error, "{say:?}: {}", r.text);
            assert_eq!(r.text, text, "{say:?}");
            assert_eq!(r.content, json!(say));
            assert_eq!(r.to_mcp()["content"][0]["text"], text);
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 4, "each ran once, and was replayed once");
}

/// The schemas of one type for reading and for writing differ where a member is read but not
/// written (`skip_serializing`): found at any depth (properties, array items, a variant, a map's
/// values). A member read and written under two names (`rename(deserialize = ..)`) is written,
/// and `skip_serializing_if` writes the member when it has a value: neither is reported.
#[test]
fn a_member_read_but_never_written_is_found_in_the_schemas() {
    #[derive(Serialize, Deserialize, JsonSchema)]
    struct Inner {
        kept: u8,
        // Read by a tool in real use: what makes it part of the intent.
        #[allow(dead_code)]
        #[serde(skip_serializing, default)]
        memo: String,
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(tag = "kind")]
    enum Op {
        Pay { inner: Inner },
    }
    #[derive(Serialize, Deserialize, JsonSchema)]
    struct Renamed {
        #[serde(rename(deserialize = "to_account", serialize = "to"))]
        to: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    }
    fn found<T: JsonSchema>() -> Option<String> {
        read_not_written(&input_schema_for::<T>(), &written_schema_for::<T>())
    }
    assert_eq!(found::<Inner>().as_deref(), Some("memo"));
    assert_eq!(found::<Vec<Inner>>().as_deref(), Some("memo"));
    assert_eq!(found::<Op>().as_deref(), Some("inner.memo"));
    assert_eq!(found::<std::collections::BTreeMap<String, Inner>>().as_deref(), Some("memo"));
    assert_eq!(found::<Renamed>(), None);
    assert_eq!(found::<Vec<Renamed>>(), None);
}

/// An object output nested within the depth limit, but so deep that the JSON-RPC message and its
/// `result` around `structuredContent` pass it, keeps only its text block: the whole answer must
/// read back with serde_json (rmcp's client reads it so), which refuses 128 levels.
#[test]
fn an_mcp_answer_stays_within_the_depth_a_reader_accepts() {
    let result = |depth: usize| {
        let content = json!({ "a": crate::limits::nested_arrays(depth - 1, json!(1)) });
        let text = content.to_string();
        ToolResult { content, text, is_error: false, error_kind: None, report: None }
    };
    for (depth, structured) in [(125, true), (126, false), (crate::limits::MAX_DEPTH, false)] {
        let mcp = result(depth).to_mcp();
        assert_eq!(mcp.get("structuredContent").is_some(), structured, "depth {depth}");
        assert!(mcp["content"][0]["text"].as_str().is_some_and(|t| t.starts_with("{\"a\":")));
        let answer = json!({"jsonrpc": "2.0", "id": 1, "result": mcp}).to_string();
        let read = serde_json::from_str::<Value>(&answer);
        assert!(read.is_ok(), "depth {depth}: {read:?}");
    }
}

/// The OpenAI Responses API's shapes: flat definitions that opt out of strict mode, a
/// `function_call` item in, a `function_call_output` item out, and a repeat under a new
/// `call_id` replayed. Items OpenAI ran itself, or of the chat API, run nothing.
#[tokio::test]
async fn openai_responses_items_run_once_and_answer_their_call_id() {
    let t = tools();
    let defs = t.set.openai_responses_tools();
    let chat = t.set.openai_tools();
    let def = defs.iter().find(|d| d["name"] == "charge_card").expect("charge_card listed");
    let chat_def = chat.iter().find(|d| d["function"]["name"] == "charge_card").unwrap();
    assert_eq!((def["type"].clone(), def["strict"].clone()), (json!("function"), json!(false)));
    assert_eq!(def["parameters"], chat_def["function"]["parameters"]);
    assert_eq!(def["description"], chat_def["function"]["description"]);

    let run = Idem::in_memory().run("conv-1");
    let item = |call_id: &str, args: &str| {
        json!({"type": "function_call", "id": "fc_1", "call_id": call_id,
            "name": "charge_card", "arguments": args, "status": "completed"})
    };
    let call = item("call_a", r#"{"customer":"c","amount_cents":7}"#);
    let first = t.set.call_openai_responses(&run, &call).await;
    assert_eq!(
        (first["type"].clone(), first["call_id"].clone()),
        (json!("function_call_output"), json!("call_a")),
        "{first}"
    );
    let output: Value = serde_json::from_str(first["output"].as_str().unwrap()).unwrap();
    assert_eq!(output["charge_id"], "ch_1", "{first}");
    let again = t
        .set
        .call_openai_responses(&run, &item("call_b", r#"{ "amount_cents": 7, "customer": "c" }"#))
        .await;
    assert_eq!(
        (again["call_id"].clone(), again["output"].clone()),
        (json!("call_b"), first["output"].clone())
    );
    assert_eq!(t.charges.load(Ordering::SeqCst), 1, "a repeat under a new call_id replays");

    let input = json!({"customer": "d", "amount_cents": 1});
    for (kind, says) in [
        ("mcp_call", "the provider runs such a call itself"),
        ("function", "dispatch it with `ToolSet::call_openai`"),
        ("custom_tool_call", "not \"function_call\""),
    ] {
        let refused = t
            .set
            .call_openai_responses(
                &run,
                &json!({"type": kind, "call_id": "c", "name": "charge_card", "arguments": input}),
            )
            .await;
        let text = refused["output"].as_str().unwrap();
        assert!(text.contains(says) && text.contains("nothing was executed"), "{kind}: {text}");
    }
    for status in ["incomplete", "in_progress", "INCOMPLETE", " incomplete"] {
        let cut = json!({"type": "function_call", "call_id": "c", "name": "charge_card",
            "arguments": input, "status": status});
        let refused = t.set.call_openai_responses(&run, &cut).await;
        let text = refused["output"].as_str().unwrap();
        assert!(text.contains("may be cut short") && text.contains(status), "{text}");
    }
    for status in [json!(1), json!(["completed"])] {
        let odd = json!({"type": "function_call", "call_id": "c", "name": "charge_card",
            "arguments": input, "status": status});
        let refused = t.set.call_openai_responses(&run, &odd).await;
        let text = refused["output"].as_str().unwrap();
        assert!(text.contains("not the string \"completed\""), "{text}");
    }
    let numeric = json!({"type": "function_call", "call_id": 5, "name": "charge_card",
        "arguments": input});
    let refused = t.set.call_openai_responses(&run, &numeric).await;
    assert_eq!(refused["call_id"], "5");
    assert!(refused["output"].as_str().unwrap().contains("`call_id` is a number"), "{refused}");
    // A client call in another API's shape names its dispatcher, and is not said to have been
    // run by the provider.
    let anthropic = json!({"type": "tool_use", "id": "toolu_1", "name": "charge_card",
        "input": input});
    let refused = t.set.call_openai_responses(&run, &anthropic).await;
    let text = refused["output"].as_str().unwrap();
    assert!(text.contains("`ToolSet::call_anthropic`") && !text.contains("provider"), "{text}");
    let chat_call = json!({"type": "function", "id": "c",
        "function": {"name": "charge_card", "arguments": "{}"}});
    let refused = t.set.call_anthropic(&run, &chat_call).await;
    let text = refused["content"].as_str().unwrap();
    assert!(text.contains("`ToolSet::call_openai`"), "{text}");
    // A Responses item given to the chat API's dispatcher says which one to use.
    let chat = t
        .set
        .call_openai(
            &run,
            &json!({"type": "function_call", "call_id": "c", "name": "charge_card",
            "arguments": input}),
        )
        .await;
    assert!(
        chat["content"].as_str().unwrap().contains("`ToolSet::call_openai_responses`"),
        "{chat}"
    );
    assert_eq!(t.charges.load(Ordering::SeqCst), 1, "nothing else ran");
}

/// Gemini's shapes: declarations whose schema is JSON Schema as written (`parametersJsonSchema`),
/// a `functionCall` part in, a `functionResponse` part out with the call's name and id, and a
/// repeat under a new id replayed. Parts that are not calls run nothing.
#[tokio::test]
async fn gemini_parts_run_once_and_answer_with_the_calls_name() {
    let t = tools();
    let tools = t.set.gemini_tools();
    assert_eq!(tools.len(), 1);
    let declarations = tools[0]["functionDeclarations"].as_array().expect("declarations");
    let chat = t.set.openai_tools();
    let def = declarations.iter().find(|d| d["name"] == "charge_card").expect("charge_card");
    let chat_def = chat.iter().find(|d| d["function"]["name"] == "charge_card").unwrap();
    assert_eq!(def["parametersJsonSchema"], chat_def["function"]["parameters"]);
    assert!(def.get("parameters").is_none(), "the OpenAPI subset field is not used: {def}");

    let run = Idem::in_memory().run("conv-1");
    let part = |id: &str| {
        json!({"functionCall": {"id": id, "name": "charge_card",
            "args": {"customer": "c", "amount_cents": 7}}})
    };
    let first = t.set.call_gemini(&run, &part("fc-1")).await;
    let answer = &first["functionResponse"];
    assert_eq!(
        (answer["id"].clone(), answer["name"].clone()),
        (json!("fc-1"), json!("charge_card"))
    );
    assert_eq!(answer["response"]["output"]["charge_id"], "ch_1", "{first}");
    // The same intent under a new id, and as the bare `functionCall` object without one.
    let again = t.set.call_gemini(&run, &part("fc-2")).await;
    assert_eq!(again["functionResponse"]["response"], answer["response"]);
    let bare = json!({"name": "charge_card", "args": {"amount_cents": 7, "customer": "c"}});
    let bare = t.set.call_gemini(&run, &bare).await;
    assert!(bare["functionResponse"].get("id").is_none(), "no id to echo: {bare}");
    assert_eq!(bare["functionResponse"]["response"], answer["response"]);
    assert_eq!(t.charges.load(Ordering::SeqCst), 1, "one intent, one charge");

    // Errors are `{"error": <text>}`, and nothing runs: other parts, and other APIs' calls
    // (whose arguments would be dropped, or which their provider ran already).
    for (part, says) in [
        (
            json!({"type": "tool_use", "id": "toolu_1", "name": "charge_card", "input": {}}),
            "`ToolSet::call_anthropic`",
        ),
        (
            json!({"type": "server_tool_use", "functionCall": {"name": "charge_card", "args": {}}}),
            "the provider runs such a call itself",
        ),
        (
            json!({"call_id": "c", "name": "charge_card", "arguments": "{}"}),
            "which a Gemini `functionCall` (`id`, `name`, `args`) does not",
        ),
        (json!({"text": "x", "name": "charge_card", "args": {}}), "a `text` part"),
        (json!("charge_card"), "the part is a string, not an object"),
        (json!({"text": "I will charge the card."}), "a `text` part"),
        (json!({"functionCall": "charge_card"}), "is a string, not an object"),
        (json!({"functionCall": {"name": "charge_card", "args": [1]}}), "invalid_arguments"),
        (
            json!({"functionCall": {"id": 3, "name": "charge_card", "args": {}}}),
            "`functionCall.id` is a number",
        ),
        (json!({"functionCall": {"name": "charge"}}), "no tool named `charge`"),
    ] {
        let answer = t.set.call_gemini(&run, &part).await;
        let error = answer["functionResponse"]["response"]["error"].as_str().unwrap_or_default();
        assert!(error.contains(says), "{part}: {answer}");
        assert!(answer["functionResponse"]["response"].get("output").is_none(), "{answer}");
    }
    assert_eq!(t.charges.load(Ordering::SeqCst), 1, "nothing else ran");

    // The other dispatchers name `call_gemini` for a Gemini part.
    let part = json!({"functionCall": {"name": "charge_card", "args": {"customer": "e",
        "amount_cents": 1}}});
    let texts = [
        t.set.call_openai(&run, &part).await["content"].clone(),
        t.set.call_openai_responses(&run, &part).await["output"].clone(),
        t.set.call_anthropic(&run, &part).await["content"].clone(),
    ];
    for text in texts {
        assert!(text.as_str().unwrap().contains("`ToolSet::call_gemini`"), "{text}");
    }
    assert_eq!(t.charges.load(Ordering::SeqCst), 1, "nothing else ran");
}

/// A failure's message repeats what the model sent, and a model may send a megabyte: the message
/// stays bounded, keeping its start and the end that says what to do, and nothing runs.
#[tokio::test]
async fn a_huge_wrong_value_gives_a_bounded_message() {
    let t = tools();
    let run = Idem::in_memory().run("r");
    let args = json!({"customer": "c", "amount_cents": "9".repeat(1 << 20) + "x"});
    let r = t.set.call(&run, "charge_card", &args).await;
    assert!(r.is_error, "{}", &r.text[..200.min(r.text.len())]);
    let chars = r.text.chars().count();
    assert!(chars <= super::result::MAX_MESSAGE_CHARS, "{chars} characters");
    assert!(r.text.starts_with("Error (invalid_arguments)"), "{}", &r.text[..200]);
    assert!(r.text.contains("characters left out"), "{}", &r.text[..200]);
    assert!(r.text.contains("nothing was executed"), "{}", &r.text[r.text.len() - 300..]);
    assert_eq!(t.charges.load(Ordering::SeqCst), 0);
}

/// A long message keeps exactly its first half and last quarter of the limit, and says how much
/// was left out; one at the limit is kept whole.
#[test]
fn a_long_message_keeps_its_start_and_end() {
    use super::result::MAX_MESSAGE_CHARS;
    let at_limit: String = "é".repeat(MAX_MESSAGE_CHARS);
    let kept = ToolResult::error(ErrorKind::InvalidArguments, at_limit.clone(), None);
    assert_eq!(kept.text, format!("Error (invalid_arguments): {at_limit}"));
    let long: String = (0..20_000).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
    let cut = ToolResult::error(ErrorKind::InvalidArguments, long.clone(), None);
    let message = cut.text.strip_prefix("Error (invalid_arguments): ").unwrap();
    let (head, tail) = (MAX_MESSAGE_CHARS / 2, MAX_MESSAGE_CHARS / 4);
    let expected =
        format!("{} … (7712 characters left out) … {}", &long[..head], &long[long.len() - tail..]);
    assert_eq!(message, expected);
    assert_eq!(cut.content["error"]["message"], expected);
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct LedgerArgs {
    amounts: Vec<u128>,
    floor: Option<i128>,
}

/// serde_json reads a 128-bit integer from text by scanning digits, and refuses `1e3` or `2.0`
/// inside an array with a syntax error at the array, not at the number: found by its position,
/// such a number is the integer it equals inside an array as at a field, by text as by value,
/// under the integers' key. A fraction there is refused quoting it as the client wrote it.
#[tokio::test]
async fn a_128_bit_integer_written_as_a_float_inside_an_array_is_the_integer() {
    fn ledger(a: &LedgerArgs, _: u32) -> Result<Value, PayError> {
        Ok(json!(format!("{:?} {:?}", a.amounts, a.floor)))
    }
    let tool = fake("ledger", RetryClass::Keyed, ledger);
    let runs = tool.runs.clone();
    let run = Idem::in_memory().run("r");
    let set = ToolSet::new().with(tool).unwrap();
    let texts = [
        r#"{"amounts": [1000, 2, 1000000000000000], "floor": -10}"#,
        r#"{"amounts": [1e3, 2.0, 1e15], "floor": -1e1}"#,
        r#"{"amounts": [1000.0, 0.2e1, 1000000000000000.0], "floor": -10.0}"#,
    ];
    let want = json!("[1000, 2, 1000000000000000] Some(-10)");
    one_key_for(&set, &run, "ledger", &texts, &want).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "every repeat replayed the first call");
    let cases = [
        (
            r#"{"amounts": [1, 2.5]}"#,
            "field `amounts[1]`: invalid type: floating point `2.5`, expected u128",
        ),
        (r#"{"amounts": [], "floor": -0.5}"#, "field `floor`: invalid type: floating point `-0.5`"),
    ];
    refused_saying(&set, &run, "ledger", &cases).await;
    // From text only, where the digits are kept: quoted as written, not as the double.
    let text = r#"{"amounts": [7, 1.0000000000000001]}"#;
    let r = set.call_text(&run, "ledger", text).await;
    assert!(
        r.text.contains("`amounts[1]`: invalid type: floating point `1.0000000000000001`"),
        "{}",
        r.text
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "no refused call ran");
    // Beyond 64 bits, from text (a parsed value holds only a double there).
    let r = set.call_text(&run, "ledger", r#"{"amounts": [1e21, 12.5e20]}"#).await;
    assert_eq!(r.content, json!("[1000000000000000000000, 1250000000000000000000] None"));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Reads a present member as `Some`, `null` included (the double-option pattern).
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct Line {
    note: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct NotesPatch {
    #[serde(default)]
    lines: Vec<Line>,
    pad: String,
    #[serde(default, deserialize_with = "present")]
    wipe: Option<Option<String>>,
}

/// In megabytes of arguments only the first `null`s are tried one at a time (each try reads
/// the whole arguments again); the rest are left out together, and a clear among them is still
/// found and named, by halving.
#[tokio::test]
async fn a_null_read_as_clear_is_named_among_many_in_large_arguments() {
    fn notes(a: &NotesPatch, _: u32) -> Result<Value, PayError> {
        Ok(json!(format!("{} lines, wipe {:?}", a.lines.len(), a.wipe)))
    }
    let tool = fake("notes", RetryClass::Keyed, notes);
    let runs = tool.runs.clone();
    let run = Idem::in_memory().run("r");
    let set = ToolSet::new().with(tool).unwrap();
    let lines = vec![json!({"note": null}); 10];
    // 900 KiB: four `null`s are tried one at a time.
    let leave = json!({"lines": lines, "pad": "x".repeat(900 << 10)});
    let r = set.call(&run, "notes", &leave).await;
    assert_eq!(r.content, json!("10 lines, wipe None"), "{}", r.text);
    let mut clear = leave.clone();
    clear["wipe"] = Value::Null;
    let text = clear.to_string();
    for r in [set.call(&run, "notes", &clear).await, set.call_text(&run, "notes", &text).await] {
        assert_eq!(r.error_kind, Some(ErrorKind::InvalidArguments), "{}", &r.text[..200]);
        assert!(r.text.contains("argument `wipe` is `Some`"), "{}", &r.text[..200]);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "only the leave ran");
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
enum Amount {
    Cents(u64),
    Dollars(f64),
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct PayoutArgs {
    to: String,
    amount: Amount,
    #[serde(default)]
    splits: Vec<Amount>,
    #[serde(default)]
    fee: f64,
    #[serde(default)]
    memo: Value,
}

/// `5` and `5.0` share a key (RFC 8785 writes them alike), and an untagged enum with an
/// integer and a float variant reads them as two values: a payout of 5 cents and one of 5
/// dollars would share a key, and the second would be answered with the first's outcome. Such a
/// number is refused, naming where it is; a fraction, an integer, and a whole float where the
/// schema has one number type (an `f64`, a `Value`) run as before.
#[tokio::test]
async fn a_whole_float_an_untagged_enum_would_read_as_another_variant_is_refused() {
    fn payout(a: &PayoutArgs, _: u32) -> Result<Value, PayError> {
        Ok(json!(format!("{} {:?} {:?} {} {}", a.to, a.amount, a.splits, a.fee, a.memo)))
    }
    let tool = fake("payout", RetryClass::Keyed, payout);
    let runs = tool.runs.clone();
    let run = Idem::in_memory().run("r");
    let set = ToolSet::new().with(tool).unwrap();
    let r = set.call_text(&run, "payout", r#"{"to": "a", "amount": 5}"#).await;
    assert_eq!(r.content, json!("a Cents(5) [] 0 null"), "{}", r.text);
    let cases = [
        (r#"{"to": "a", "amount": 5.0}"#, "argument `amount` is `5.0`"),
        (r#"{"to": "a", "amount": 5e0, "fee": 1}"#, "argument `amount` is `5.0`"),
        (r#"{"to": "a", "amount": 7, "splits": [1, 2.0]}"#, "argument `splits[1]` is `2.0`"),
    ];
    refused_saying(&set, &run, "payout", &cases).await;
    for (text, _) in cases {
        let r = set.call_text(&run, "payout", text).await;
        assert!(r.text.contains("would share one key"), "{}", r.text);
        assert!(r.text.contains("#[serde(tag"), "{}", r.text);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "no refused call ran");
    // A fraction is a float to the key as well; an f64 and a Value read `5.0` as the number 5.
    let r = set.call_text(&run, "payout", r#"{"to": "a", "amount": 5.5}"#).await;
    assert_eq!(r.content, json!("a Dollars(5.5) [] 0 null"), "{}", r.text);
    let texts = [
        r#"{"to": "b", "amount": 1, "fee": 2.0, "memo": {"n": 3.0}}"#,
        r#"{"to": "b", "amount": 1, "fee": 2, "memo": {"n": 3.0}}"#,
    ];
    one_key_for(&set, &run, "payout", &texts, &json!("b Cents(1) [] 2 {\"n\":3.0}")).await;
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Tipped {
    Card { tip: Amount, amount: u64 },
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct TippedArgs {
    payment: Tipped,
}

/// Inside a part serde reads whole, a refused `5.0` names the part, and the first whole `5.0`
/// found there was read as the integer: an untagged enum's float before the refused number
/// became its integer variant (a tip of 5 dollars read as 5 cents), and ran. Repairs that the
/// arguments read without are undone, so the tip is read as sent and refused as a number two
/// variants read; by text and by value.
#[tokio::test]
async fn a_repair_inside_a_tagged_part_leaves_an_untagged_float_as_sent() {
    fn tipped(a: &TippedArgs, _: u32) -> Result<Value, PayError> {
        let Tipped::Card { tip, amount } = &a.payment;
        Ok(json!(format!("{tip:?} {amount}")))
    }
    let tool = fake("tipped", RetryClass::Keyed, tipped);
    let runs = tool.runs.clone();
    let run = Idem::in_memory().run("r");
    let set = ToolSet::new().with(tool).unwrap();
    let cases = [(
        r#"{"payment": {"kind": "card", "tip": 5.0, "amount": 5.0}}"#,
        "argument `payment.tip` is `5.0`",
    )];
    refused_saying(&set, &run, "tipped", &cases).await;
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");
    for (text, want) in [
        (r#"{"payment": {"kind": "card", "tip": 5.5, "amount": 5.0}}"#, "Dollars(5.5) 5"),
        (r#"{"payment": {"kind": "card", "tip": 5, "amount": 5.0}}"#, "Cents(5) 5"),
    ] {
        let value: Value = serde_json::from_str(text).unwrap();
        for r in [set.call_text(&run, "tipped", text).await, set.call(&run, "tipped", &value).await]
        {
            assert_eq!(r.content, json!(want), "{text}: {}", r.text);
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// The number check runs only for tools whose schema could read one number two ways: a union
/// of two or more non-`null` branches, and both `integer` and `number`. Options (`T` or `null`)
/// and plain integer and float fields side by side are not such a union.
#[test]
fn only_tools_with_a_number_union_pay_for_the_number_check() {
    let set = ToolSet::new()
        .with(fake("payout", RetryClass::Keyed, |_: &PayoutArgs, _| Ok(Value::Null)))
        .unwrap()
        .with(fake("tipped", RetryClass::Keyed, |_: &TippedArgs, _| Ok(Value::Null)))
        .unwrap()
        .with(fake("widths", RetryClass::Keyed, |_: &WidthArgs, _| Ok(Value::Null)))
        .unwrap()
        .with(fake("ledger", RetryClass::Keyed, |_: &LedgerArgs, _| Ok(Value::Null)))
        .unwrap();
    assert_eq!(set.cx.one_number_reading, ["ledger", "widths"]);
}
