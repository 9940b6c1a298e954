//! idem tools inside a rig agent, driven by a scripted completion model (no network).

#[path = "support/scripted.rs"]
mod scripted;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::{Classify, Ctx, Failure, Idem, Run, ToolSet, tool};
use idem_rig::{IdemReport, RigToolSet, RunId};
use rig_agent::AgentBuilder;
// Through idem-rig's re-export, as an agent crate without its own rig-core line would.
use idem_rig::rig_core::tool::ToolContext;
use scripted::{Reply, Seen};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Charge {
    charge_id: String,
    customer: String,
    amount_cents: u64,
}

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
enum PaymentError {
    #[error("the provider did not answer in time (the request was sent)")]
    NoResponse,
}

impl Classify for PaymentError {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

/// A provider that deduplicates charges by the idempotency key (as Stripe's `Idempotency-Key`
/// does) and can lose its next answer after doing the work.
#[derive(Default)]
struct Payments {
    /// Charges by idempotency key: the side effect.
    charges: Mutex<HashMap<String, Charge>>,
    /// Requests that reached the provider, with the key each carried.
    requests: Mutex<Vec<String>>,
    lose_next_answer: AtomicBool,
    /// Milliseconds each charge takes to answer (so parallel calls overlap).
    answer_after_ms: AtomicU64,
    refunds: AtomicU32,
}

impl Payments {
    fn charge_count(&self) -> usize {
        self.charges.lock().unwrap().len()
    }

    /// Charge a customer's card. Amounts are in cents.
    #[tool(retry = "keyed", attempts = 3, timeout = "1s")]
    async fn charge_card(
        &self,
        cx: &Ctx,
        customer: String,
        amount_cents: u64,
    ) -> Result<Charge, PaymentError> {
        self.charge(cx, customer, amount_cents).await
    }

    /// Charge once, with no retry inside the call: a timeout goes back to the model.
    #[tool(retry = "keyed", name = "charge_card_once", attempts = 1, timeout = "1s")]
    async fn charge_once(
        &self,
        cx: &Ctx,
        customer: String,
        amount_cents: u64,
    ) -> Result<Charge, PaymentError> {
        self.charge(cx, customer, amount_cents).await
    }

    /// The provider's side: one charge per idempotency key.
    async fn charge(
        &self,
        cx: &Ctx,
        customer: String,
        amount_cents: u64,
    ) -> Result<Charge, PaymentError> {
        let charge = {
            self.requests.lock().unwrap().push(cx.key().to_owned());
            let mut charges = self.charges.lock().unwrap();
            let next = format!("ch_{}", charges.len() + 1);
            charges
                .entry(cx.key().to_owned())
                .or_insert(Charge { charge_id: next, customer, amount_cents })
                .clone()
        };
        let after = self.answer_after_ms.load(Ordering::SeqCst);
        if after > 0 {
            tokio::time::sleep(Duration::from_millis(after)).await;
        }
        if self.lose_next_answer.swap(false, Ordering::SeqCst) {
            // The charge exists, but the answer never arrives: the attempt times out.
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        Ok(charge)
    }

    /// Refund a charge. The provider has no idempotency key for refunds.
    #[tool(retry = "never", timeout = "1s")]
    async fn refund(&self, charge_id: String) -> Result<String, PaymentError> {
        self.refunds.fetch_add(1, Ordering::SeqCst);
        let _ = charge_id;
        // The refund happens, then the answer is lost.
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok("refunded".into())
    }
}

fn payments_tools(payments: &Arc<Payments>) -> ToolSet {
    ToolSet::new()
        .with(payments.charge_card_tool())
        .and_then(|s| s.with(payments.charge_once_tool()))
        .and_then(|s| s.with(payments.refund_tool()))
        .unwrap()
}

/// Runs one prompt through a rig agent whose tools are `tools`, with `script` as the model, and
/// returns the answer and every tool result the model read (from its last request).
async fn run_agent(
    tools: &RigToolSet,
    cx: ToolContext,
    script: impl Fn(&[Seen]) -> Reply + Send + Sync + 'static,
) -> (String, Vec<Seen>, scripted::Scripted) {
    run_agent_with(tools, cx, 1, script).await
}

/// [`run_agent`] with up to `concurrency` tool calls of one turn running at once.
async fn run_agent_with(
    tools: &RigToolSet,
    cx: ToolContext,
    concurrency: usize,
    script: impl Fn(&[Seen]) -> Reply + Send + Sync + 'static,
) -> (String, Vec<Seen>, scripted::Scripted) {
    let (model, transport) = scripted::model(script);
    let agent = AgentBuilder::new(model).dynamic_tools(tools.dynamic_tools()).build();
    let answer = agent
        .prompt("Charge cus_1 49 dollars.")
        .tool_context(cx)
        .tool_concurrency(concurrency)
        .max_turns(6)
        .await;
    let answer = answer.map(|r| r.output()).unwrap_or_else(|e| panic!("the agent failed: {e:?}"));
    let requests = transport.requests();
    let seen = requests.last().map(scripted::seen).unwrap_or_default();
    (answer, seen, transport)
}

/// The model calls the charge, reads the result, and calls the same charge again (as a model
/// does when it is unsure the first call went through).
fn charge_twice(tool: &'static str) -> impl Fn(&[Seen]) -> Reply + Send + Sync + 'static {
    move |seen: &[Seen]| match seen.len() {
        0 => Reply::call("call_1", tool, json!({"customer": "cus_1", "amount_cents": 4900})),
        1 => Reply::call("call_2", tool, json!({"amount_cents": 4900, "customer": "cus_1"})),
        _ => Reply::Text("done".into()),
    }
}

#[tokio::test(start_paused = true)]
async fn a_charge_that_timed_out_inside_the_tool_and_is_called_again_charges_once() {
    let payments = Arc::new(Payments::default());
    payments.lose_next_answer.store(true, Ordering::SeqCst);
    let tools = RigToolSet::new(payments_tools(&payments), Idem::in_memory().run("conv-1"));

    let (answer, seen, _) =
        run_agent(&tools, ToolContext::new(), charge_twice("charge_card")).await;

    assert_eq!(answer, "done");
    assert_eq!(payments.charge_count(), 1, "one charge for one intent");
    // Attempt 1 reached the provider and timed out; idem retried with the same key, the provider
    // deduplicated it; the model's second call was replayed and never reached the provider.
    let requests = payments.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert_eq!(requests[0], requests[1], "the retry carried the same idempotency key");
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen.iter().all(|s| s.name == "charge_card" && !s.is_error), "{seen:?}");
    assert_eq!(seen[0].text, seen[1].text, "the repeat got the same charge");
    let first: Charge = serde_json::from_str(&seen[0].text).unwrap();
    assert_eq!(first.charge_id, "ch_1");
}

/// An agent hook that keeps, for each tool call, the model's call id and idem's report
/// published in the call's result context.
#[derive(Clone, Default)]
struct Reports(Arc<Mutex<Vec<(String, IdemReport)>>>);

impl rig_agent::agent::AgentHook for Reports {
    async fn on_outcome(
        &self,
        _ctx: &rig_agent::agent::HookContext,
        event: rig_agent::agent::OutcomeEvent<'_>,
    ) -> rig_agent::agent::OutcomeAction {
        if let (Some(call), Some(cx)) = (event.call_id, event.context)
            && let Ok(Some(report)) = cx.result::<IdemReport>()
        {
            self.0.lock().unwrap().push((call.to_string(), report));
        }
        rig_agent::agent::OutcomeAction::Proceed
    }
}

/// A host sees how idem served each call (executed, then replayed), under which key, beside the
/// model's call id: the published report, which the model never reads.
#[tokio::test(start_paused = true)]
async fn a_host_hook_reads_how_each_call_was_served() {
    let payments = Arc::new(Payments::default());
    let tools = RigToolSet::new(payments_tools(&payments), Idem::in_memory().run("conv-1"));
    let reports = Reports::default();
    let (model, _transport) = scripted::model(charge_twice("charge_card"));
    let agent = AgentBuilder::new(model)
        .dynamic_tools(tools.dynamic_tools())
        .add_hook(reports.clone())
        .build();
    let answer = agent.prompt("Charge cus_1 49 dollars.").max_turns(6).await;
    assert_eq!(answer.map(|r| r.output()).expect("the agent answers"), "done");
    assert_eq!(payments.charge_count(), 1);

    let reports = reports.0.lock().unwrap().clone();
    let calls: Vec<&str> = reports.iter().map(|(call, _)| call.as_str()).collect();
    assert_eq!(calls, ["call_1", "call_2"], "{reports:?}");
    let outcomes: Vec<Option<&str>> = reports.iter().map(|(_, r)| r.outcome.as_deref()).collect();
    assert_eq!(outcomes, [Some("executed"), Some("replayed")]);
    assert!(reports.iter().all(|(_, r)| r.run == "conv-1"), "{reports:?}");
    assert_eq!(reports[0].1.key, reports[1].1.key, "one intent, one key");
    assert_eq!(reports[0].1.key.len(), 64);
}

#[tokio::test(start_paused = true)]
async fn a_timeout_the_model_reads_is_safe_to_call_again() {
    let payments = Arc::new(Payments::default());
    payments.lose_next_answer.store(true, Ordering::SeqCst);
    let tools = RigToolSet::new(payments_tools(&payments), Idem::in_memory().run("conv-1"));
    let script = |seen: &[Seen]| {
        let args = json!({"customer": "cus_1", "amount_cents": 4900});
        match seen.len() {
            0..=2 => Reply::call(&format!("call_{}", seen.len() + 1), "charge_card_once", args),
            _ => Reply::Text("done".into()),
        }
    };

    let (_, seen, _) = run_agent(&tools, ToolContext::new(), script).await;

    assert_eq!(seen.len(), 3, "{seen:?}");
    // The first call timed out: an ambiguous outcome the model is told it may repeat.
    assert!(seen[0].is_error);
    assert!(seen[0].text.starts_with("Error (timeout): "), "{}", seen[0].text);
    assert!(seen[0].text.contains("calling it again with the same arguments is safe"));
    // The repeat ran with the same key (the provider deduplicated it), the third was replayed.
    assert!(!seen[1].is_error && !seen[2].is_error, "{seen:?}");
    assert_eq!(seen[1].text, seen[2].text);
    assert_eq!(serde_json::from_str::<Charge>(&seen[1].text).unwrap().charge_id, "ch_1");
    assert_eq!(payments.charge_count(), 1, "one charge for one intent");
    let requests = payments.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2, "the replay did not reach the provider: {requests:?}");
    assert_eq!(requests[0], requests[1]);
}

#[tokio::test]
async fn rig_sees_the_idem_definition() {
    let payments = Arc::new(Payments::default());
    let set = payments_tools(&payments);
    let idem_def = set.definition("charge_card").unwrap().clone();
    let tools = RigToolSet::new(set, Idem::in_memory().run("conv-1"));

    let dynamic = tools.dynamic_tools();
    let names: Vec<String> = dynamic.iter().map(|t| t.name().to_string()).collect();
    assert_eq!(names, ["charge_card", "charge_card_once", "refund"]);
    let def = tools.dynamic_tool("charge_card").unwrap().definition();
    assert_eq!(def.name, "charge_card");
    assert_eq!(def.description, "Charge a customer's card. Amounts are in cents.");
    assert_eq!(def.parameters, serde_json::Value::Object(idem_def.input_schema.clone()));
    assert_eq!(def.parameters["type"], "object");
    assert_eq!(def.parameters["required"], json!(["customer", "amount_cents"]));
    assert!(tools.dynamic_tool("nope").is_none());

    // And what the agent actually sends the model.
    let (_, _, transport) =
        run_agent(&tools, ToolContext::new(), |_| Reply::Text("hi".into())).await;
    let sent = &transport.requests()[0].tools;
    let charge = sent.iter().find(|t| t.name == "charge_card").unwrap();
    assert_eq!(charge, &def);
    assert_eq!(sent.len(), 3);
}

#[tokio::test]
async fn invalid_arguments_are_a_result_the_model_reads_and_nothing_runs() {
    let payments = Arc::new(Payments::default());
    let tools = RigToolSet::new(payments_tools(&payments), Idem::in_memory().run("conv-1"));
    let script = |seen: &[Seen]| match seen.len() {
        0 => Reply::call("c1", "charge_card", json!({"customer": "cus_1", "amount_cents": "49"})),
        1 => Reply::call("c2", "charge_card", json!({"customer": "cus_1"})),
        _ => Reply::Text("gave up".into()),
    };

    let (answer, seen, _) = run_agent(&tools, ToolContext::new(), script).await;

    assert_eq!(answer, "gave up");
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|s| s.is_error));
    assert!(seen[0].text.starts_with("Error (invalid_arguments): "), "{}", seen[0].text);
    assert!(seen[0].text.contains("field `amount_cents`"), "{}", seen[0].text);
    assert!(seen[1].text.contains("missing field `amount_cents`"), "{}", seen[1].text);
    assert!(payments.requests.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_caller_key_reused_with_other_arguments_is_refused() {
    let payments = Arc::new(Payments::default());
    let run = Idem::in_memory().run("conv-1").with_idempotency_key("order-17");
    let tools = RigToolSet::new(payments_tools(&payments), run);
    let script = |seen: &[Seen]| match seen.len() {
        0 => Reply::call("c1", "charge_card", json!({"customer": "cus_1", "amount_cents": 4900})),
        1 => Reply::call("c2", "charge_card", json!({"customer": "cus_1", "amount_cents": 9900})),
        _ => Reply::Text("done".into()),
    };

    let (_, seen, _) = run_agent(&tools, ToolContext::new(), script).await;

    assert!(!seen[0].is_error, "{seen:?}");
    assert!(seen[1].is_error);
    assert!(seen[1].text.starts_with("Error (key_reuse_mismatch): "), "{}", seen[1].text);
    assert!(seen[1].text.contains("already used with other arguments"), "{}", seen[1].text);
    assert_eq!(payments.charge_count(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_unknown_outcome_tells_the_model_not_to_repeat_and_is_not_repeated() {
    let payments = Arc::new(Payments::default());
    let tools = RigToolSet::new(payments_tools(&payments), Idem::in_memory().run("conv-1"));
    let script = |seen: &[Seen]| match seen.len() {
        0 | 1 => Reply::call(&format!("c{}", seen.len()), "refund", json!({"charge_id": "ch_1"})),
        _ => Reply::Text("checking".into()),
    };

    let (_, seen, _) = run_agent(&tools, ToolContext::new(), script).await;

    assert_eq!(seen.len(), 2);
    for s in &seen {
        assert!(s.is_error);
        assert!(s.text.starts_with("Error (outcome_unknown): "), "{}", s.text);
        assert!(s.text.contains("Do NOT call `refund` again"), "{}", s.text);
    }
    assert_eq!(payments.refunds.load(Ordering::SeqCst), 1, "a never tool runs once");
}

#[tokio::test]
async fn the_prompt_names_its_run_in_the_tool_context() {
    let payments = Arc::new(Payments::default());
    let idem = Idem::in_memory();
    let tools = RigToolSet::new(payments_tools(&payments), idem.run("default"));
    let once = |seen: &[Seen]| match seen.len() {
        0 => Reply::call("c1", "charge_card", json!({"customer": "cus_1", "amount_cents": 4900})),
        _ => Reply::Text("done".into()),
    };
    let in_run = |id: &str| {
        let mut cx = ToolContext::new();
        cx.insert(RunId(id.into())).unwrap();
        cx
    };

    let (_, a, _) = run_agent(&tools, in_run("conv-a"), once).await;
    let (_, a_again, _) = run_agent(&tools, in_run("conv-a"), once).await;
    assert_eq!(a, a_again, "the same conversation replays");
    assert_eq!(payments.charge_count(), 1);
    let (_, b, _) = run_agent(&tools, in_run("conv-b"), once).await;
    assert_ne!(a, b, "another conversation is another intent");
    assert_eq!(payments.charge_count(), 2);
    // The same key as a direct call in that run: one intent, whichever way it is called.
    let direct: Run = idem.run("conv-b");
    let replay = payments.charge_card(&direct, "cus_1".into(), 4900).await.unwrap();
    assert_eq!(replay, serde_json::from_str::<Charge>(&b[0].text).unwrap());
    assert_eq!(payments.charge_count(), 2);

    for blank in ["", "  "] {
        let (_, bad, _) = run_agent(&tools, in_run(blank), once).await;
        assert!(bad[0].is_error);
        let said = &bad[0].text;
        assert!(said.contains("`idem/run` must be a string with more than white space"), "{said}");
    }
    assert_eq!(payments.charge_count(), 2);
}

/// The model asks for `calls` (tool, arguments) in one turn, then stops.
fn one_turn(
    calls: Vec<(&'static str, serde_json::Value)>,
) -> impl Fn(&[Seen]) -> Reply + Send + Sync {
    move |seen: &[Seen]| {
        if !seen.is_empty() {
            return Reply::Text("done".into());
        }
        let calls = calls.iter().enumerate();
        Reply::Calls(calls.map(|(i, (t, a))| Reply::call(&format!("c{i}"), t, a.clone())).collect())
    }
}

#[tokio::test(start_paused = true)]
async fn the_same_charge_twice_in_one_turn_charges_once_in_parallel_and_in_order() {
    for concurrency in [1, 2] {
        let payments = Arc::new(Payments::default());
        payments.answer_after_ms.store(100, Ordering::SeqCst);
        let waits = Arc::new(AtomicU32::new(0));
        let run = Idem::in_memory().run("conv-1").with_wait_hook(idem_core::WaitHook::new({
            let waits = Arc::clone(&waits);
            move |_| {
                waits.fetch_add(1, Ordering::SeqCst);
            }
        }));
        let tools = RigToolSet::new(payments_tools(&payments), run);
        let script = one_turn(vec![
            ("charge_card", json!({"customer": "cus_1", "amount_cents": 4900})),
            ("charge_card", json!({"amount_cents": 4900, "customer": "cus_1"})),
        ]);

        let (answer, seen, _) =
            run_agent_with(&tools, ToolContext::new(), concurrency, script).await;

        assert_eq!(answer, "done");
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(seen.iter().all(|s| !s.is_error), "{concurrency}: {seen:?}");
        assert_eq!(seen[0].text, seen[1].text, "{concurrency}: both read the one charge");
        assert_eq!(payments.charge_count(), 1, "{concurrency}: one charge");
        assert_eq!(payments.requests.lock().unwrap().len(), 1, "{concurrency}: one request");
        // In parallel the second call joined the first in flight; in order it was replayed.
        let expected_waits = if concurrency > 1 { 1 } else { 0 };
        assert_eq!(waits.load(Ordering::SeqCst), expected_waits, "{concurrency}");
    }
}

#[tokio::test(start_paused = true)]
async fn two_different_charges_in_one_turn_are_two_charges() {
    let payments = Arc::new(Payments::default());
    payments.answer_after_ms.store(100, Ordering::SeqCst);
    let tools = RigToolSet::new(payments_tools(&payments), Idem::in_memory().run("conv-1"));
    let script = one_turn(vec![
        ("charge_card", json!({"customer": "cus_1", "amount_cents": 4900})),
        ("charge_card", json!({"customer": "cus_1", "amount_cents": 9900})),
    ]);

    let (_, seen, _) = run_agent_with(&tools, ToolContext::new(), 2, script).await;

    assert!(seen.iter().all(|s| !s.is_error), "{seen:?}");
    let charges: Vec<Charge> =
        seen.iter().map(|s| serde_json::from_str(&s.text).unwrap()).collect();
    assert_eq!(charges.iter().map(|c| c.amount_cents).collect::<Vec<_>>(), [4900, 9900]);
    assert_ne!(charges[0].charge_id, charges[1].charge_id);
    assert_eq!(payments.charge_count(), 2);
}

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
enum ShipError {
    #[error("the warehouse is busy")]
    Busy,
    #[error("no such address")]
    BadAddress,
}

impl Classify for ShipError {
    fn classify(&self) -> Failure {
        match self {
            ShipError::Busy => Failure::transient(),
            ShipError::BadAddress => Failure::permanent(),
        }
    }
}

/// A warehouse whose next answers are scripted; every call is one shipment attempt.
#[derive(Default)]
struct Warehouse {
    /// The failures of the next attempts (the last first); then every attempt ships.
    failures: Mutex<Vec<ShipError>>,
    attempts: AtomicU32,
}

impl Warehouse {
    /// Ship an order.
    #[tool(retry = "keyed", attempts = 1)]
    async fn ship(&self, order: String) -> Result<String, ShipError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        match self.failures.lock().unwrap().pop() {
            Some(failure) => Err(failure),
            None => Ok(format!("shipped {order}")),
        }
    }
}

fn ship_twice(seen: &[Seen]) -> Reply {
    match seen.len() {
        0 | 1 => Reply::call(&format!("s{}", seen.len()), "ship", json!({"order": "o-1"})),
        _ => Reply::Text("done".into()),
    }
}

#[tokio::test]
async fn a_transient_failure_repeated_next_turn_runs_again_and_a_permanent_one_is_replayed() {
    // Transient: nothing stored, the repeat runs and succeeds; the hint says retryable.
    let warehouse = Arc::new(Warehouse::default());
    warehouse.failures.lock().unwrap().push(ShipError::Busy);
    let tools = RigToolSet::single(warehouse.ship_tool(), Idem::in_memory().run("conv-1")).unwrap();
    let (_, seen, _) = run_agent(&tools, ToolContext::new(), ship_twice).await;
    assert!(seen[0].is_error && seen[0].text.starts_with("Error (tool_error): "), "{seen:?}");
    assert!(!seen[1].is_error && seen[1].text == "shipped o-1", "{seen:?}");
    assert_eq!(warehouse.attempts.load(Ordering::SeqCst), 2);

    let warehouse = Arc::new(Warehouse::default());
    warehouse.failures.lock().unwrap().push(ShipError::Busy);
    let tools = RigToolSet::single(warehouse.ship_tool(), Idem::in_memory().run("conv-1")).unwrap();
    let tool = tools.dynamic_tool("ship").unwrap();
    let err = tool.execute(json!({"order": "o-1"})).await.unwrap_err();
    assert_eq!((err.code(), err.retryable()), (Some("tool_error"), Some(true)));

    // Permanent: stored, the repeat is replayed and never reaches the warehouse.
    let warehouse = Arc::new(Warehouse::default());
    warehouse.failures.lock().unwrap().push(ShipError::BadAddress);
    let tools = RigToolSet::single(warehouse.ship_tool(), Idem::in_memory().run("conv-1")).unwrap();
    let (_, seen, _) = run_agent(&tools, ToolContext::new(), ship_twice).await;
    assert!(seen.iter().all(|s| s.is_error), "{seen:?}");
    assert_eq!(seen[0].text, seen[1].text);
    assert!(seen[0].text.contains("no such address"), "{}", seen[0].text);
    assert_eq!(warehouse.attempts.load(Ordering::SeqCst), 1);
    let err = tools.dynamic_tool("ship").unwrap().execute(json!({"order": "o-1"})).await;
    let err = err.unwrap_err();
    assert_eq!((err.code(), err.retryable()), (Some("tool_error"), Some(false)));
    assert_eq!(warehouse.attempts.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn arguments_in_odd_shapes_are_refused_and_nothing_runs() {
    let payments = Arc::new(Payments::default());
    let tools = RigToolSet::new(payments_tools(&payments), Idem::in_memory().run("conv-1"));
    let tool = tools.dynamic_tool("charge_card").unwrap();
    // rig parses the model's text into a `Value` before the tool sees it: an integer beyond 64
    // bits arrives as a double, which no integer argument accepts.
    let beyond_64_bits: serde_json::Value =
        serde_json::from_str(r#"{"customer":"cus_1","amount_cents":18446744073709551617}"#)
            .unwrap();
    let cases = [
        (json!("cus_1"), "not a string"),
        (json!([1, 2]), "not an array"),
        (json!(7), "not a number"),
        (json!(null), "missing field `customer`"),
        (beyond_64_bits.clone(), "field `amount_cents`"),
    ];
    for (args, says) in cases {
        let err = tool.execute(args.clone()).await.unwrap_err();
        let text = err.model_feedback().unwrap_or_default();
        assert!(text.starts_with("Error (invalid_arguments): "), "{args}: {text}");
        assert!(text.contains(says) && text.contains("nothing was executed"), "{args}: {text}");
        assert_eq!((err.code(), err.retryable()), (Some("invalid_arguments"), Some(false)));
    }

    // Through the agent: rig answers an array itself (the tool never runs); the number beyond
    // 64 bits is refused by idem.
    let script = move |seen: &[Seen]| match seen.len() {
        0 => Reply::call("c1", "charge_card", json!([1, 2])),
        1 => Reply::call("c2", "charge_card", beyond_64_bits.clone()),
        _ => Reply::Text("gave up".into()),
    };
    let (_, seen, _) = run_agent(&tools, ToolContext::new(), script).await;
    assert!(seen.iter().all(|s| s.is_error), "{seen:?}");
    assert!(seen[1].text.starts_with("Error (invalid_arguments): "), "{}", seen[1].text);
    assert!(payments.requests.lock().unwrap().is_empty(), "nothing ran");

    // Arguments encoded twice (the object's text in a string, as some models send them) are
    // that object: one charge, and the plain form replays it.
    let twice = json!(r#"{"customer":"cus_1","amount_cents":4900}"#);
    tool.execute(twice).await.expect("the object inside the string");
    tool.execute(json!({"customer": "cus_1", "amount_cents": 4900})).await.expect("a replay");
    assert_eq!(payments.charge_count(), 1, "one charge for both spellings");
}
