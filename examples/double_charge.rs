//! The double charge, and how idem prevents it.
//!
//! A fake payment provider creates a charge and then loses the response: the caller sees a
//! timeout, although the money moved. Three ways to call it:
//!
//! 1. a naive retry loop: the retry charges the customer a second time;
//! 2. `#[tool(retry = "keyed")]`: every attempt and every repeat carries the same idempotency key,
//!    the provider deduplicates by it, and idem replays the stored result; concurrent duplicates
//!    join the first call;
//! 3. `#[tool(retry = "never")]` for an action nobody can deduplicate: one attempt, then the
//!    honest answer "the outcome is unknown, do not retry".
//!
//! Run: `cargo run --example double_charge` (finishes in well under a second).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::{
    Backoff, Classify, Ctx, Error, Failure, Idem, MemoryStore, Policy, Run, Tool, tool,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// The fake payment provider
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Charge {
    id: String,
    customer: String,
    amount_cents: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
enum PaymentError {
    #[error("the card was declined")]
    Declined,
    #[error("the provider did not answer")]
    NoResponse,
}

impl Classify for PaymentError {
    fn classify(&self) -> Failure {
        match self {
            PaymentError::Declined => Failure::permanent(),
            // The request was sent: the charge may exist. A retry is only safe with the same key.
            PaymentError::NoResponse => Failure::ambiguous(),
        }
    }
}

/// A provider that honours the `Idempotency-Key` header (IETF draft-ietf-httpapi-idempotency-key-header)
/// for charges, and can be told to lose the next response after doing the work.
#[derive(Default)]
struct Provider {
    charges: Mutex<Vec<Charge>>,
    by_key: Mutex<HashMap<String, Charge>>,
    refunds: Mutex<Vec<String>>,
    lose_next_response: AtomicBool,
    /// Requests received, deduplicated or not.
    requests: AtomicU32,
    /// How long a request takes.
    latency_ms: u64,
}

impl Provider {
    fn new(latency_ms: u64) -> Arc<Provider> {
        Arc::new(Provider { latency_ms, ..Provider::default() })
    }

    async fn create_charge(
        &self,
        customer: &str,
        amount_cents: u64,
        idempotency_key: Option<&str>,
    ) -> Charge {
        self.requests.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(self.latency_ms)).await;
        if let Some(key) = idempotency_key
            && let Some(existing) = self.by_key.lock().unwrap().get(key)
        {
            println!("     provider: key {}… seen before, returning {}", short(key), existing.id);
            return existing.clone();
        }
        let charge = {
            let mut charges = self.charges.lock().unwrap();
            let charge = Charge {
                id: format!("ch_{}", charges.len() + 1),
                customer: customer.to_owned(),
                amount_cents,
            };
            charges.push(charge.clone());
            charge
        };
        if let Some(key) = idempotency_key {
            self.by_key.lock().unwrap().insert(key.to_owned(), charge.clone());
        }
        self.maybe_lose_response(&format!("created {}", charge.id)).await;
        charge
    }

    async fn refund(&self, charge_id: &str) -> String {
        self.requests.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(self.latency_ms)).await;
        let id = {
            let mut refunds = self.refunds.lock().unwrap();
            refunds.push(charge_id.to_owned());
            format!("re_{}", refunds.len())
        };
        self.maybe_lose_response(&format!("refunded {charge_id} as {id}")).await;
        id
    }

    /// The work is done; if told to, the response never reaches the caller.
    async fn maybe_lose_response(&self, what: &str) {
        if self.lose_next_response.swap(false, Ordering::SeqCst) {
            println!("     provider: {what}, but the response is lost on the way back");
            std::future::pending::<()>().await;
        }
        println!("     provider: {what}");
    }

    fn charges_for(&self, customer: &str) -> Vec<String> {
        let charges = self.charges.lock().unwrap();
        charges.iter().filter(|c| c.customer == customer).map(|c| c.id.clone()).collect()
    }
}

fn short(key: &str) -> &str {
    &key[..key.len().min(8)]
}

// ---------------------------------------------------------------------------------------------
// The tools: a client holding the provider, with two annotated methods
// ---------------------------------------------------------------------------------------------

/// The timeout of one attempt, as the tools declare it below.
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(100);

struct Payments {
    provider: Arc<Provider>,
}

impl Payments {
    /// Charge a customer's card. Amounts are in cents.
    #[tool(retry = "keyed", timeout = "100ms", attempts = 3)]
    async fn charge_card(
        &self,
        cx: &Ctx,
        customer: String,
        amount_cents: u64,
    ) -> Result<Charge, PaymentError> {
        if cx.attempt() > 1 {
            println!(
                "     idem: attempt {} with the same key {}… (64 hex digits, shortened here)",
                cx.attempt(),
                short(cx.key())
            );
        }
        // The key goes to the provider, which deduplicates retries after an ambiguous failure.
        Ok(self.provider.create_charge(&customer, amount_cents, Some(cx.key())).await)
    }

    /// Refund a charge. The provider cannot deduplicate refunds, so this runs at most once.
    #[tool(retry = "never", timeout = "100ms")]
    async fn refund(&self, charge_id: String) -> Result<String, PaymentError> {
        Ok(self.provider.refund(&charge_id).await)
    }
}

// ---------------------------------------------------------------------------------------------
// The agent side: tool calls by name with JSON arguments, answers as text the model reads
// ---------------------------------------------------------------------------------------------

/// Calls `tool` with the model's JSON arguments and renders the answer the model would read.
async fn call_json<T: Tool>(run: &Run, tool: &T, args: Value) -> String
where
    T::Output: Serialize,
{
    let args: T::Args = match serde_json::from_value(args) {
        Ok(args) => args,
        Err(e) => return format!("error: bad arguments: {e}"),
    };
    match run.call(tool, args).await {
        Ok(out) => serde_json::to_string(&out).unwrap_or_default(),
        Err(e) => format!("error: {e}"),
    }
}

/// The agent loop's dispatch: one tool call from the model, by name.
async fn dispatch(run: &Run, tools: &Arc<Payments>, name: &str, args: Value) -> String {
    println!("   model -> {name} {args}");
    let answer = match name {
        "charge_card" => call_json(run, &tools.charge_card_tool(), args).await,
        "refund" => call_json(run, &tools.refund_tool(), args).await,
        other => format!("error: unknown tool `{other}`"),
    };
    println!("   <- {answer}");
    answer
}

/// What a tool call looks like without idem: a timeout and a blind retry.
async fn naive_charge(provider: &Provider, customer: &str, amount_cents: u64) -> Option<Charge> {
    for attempt in 1..=3 {
        let call = provider.create_charge(customer, amount_cents, None);
        match tokio::time::timeout(ATTEMPT_TIMEOUT, call).await {
            Ok(charge) => return Some(charge),
            Err(_) => println!("   attempt {attempt} timed out after 100 ms; retrying"),
        }
    }
    None
}

#[tokio::main]
async fn main() {
    println!("idem: the double charge, and how a keyed tool prevents it\n");

    // 1. Naive retry.
    println!("1. A naive retry (no idempotency key)");
    let provider = Provider::new(20);
    provider.lose_next_response.store(true, Ordering::SeqCst);
    let charge = naive_charge(&provider, "cus_42", 4900).await;
    let charges = provider.charges_for("cus_42");
    println!(
        "   => the caller got {}, but cus_42 was charged {} times: {}\n",
        charge.map(|c| c.id).unwrap_or_default(),
        charges.len(),
        charges.join(", ")
    );

    // 2. A keyed tool.
    println!("2. #[tool(retry = \"keyed\")]: one key per intent, forwarded to the provider");
    println!("   (a new provider: its charge ids start again at ch_1)");
    let provider = Provider::new(20);
    let tools = Arc::new(Payments { provider: Arc::clone(&provider) });
    let policy = Policy {
        backoff: Backoff { base: Duration::from_millis(10), cap: Duration::from_millis(50) },
        ..Policy::default()
    };
    let idem = Idem::builder(MemoryStore::new()).policy(policy).seed(7).build();
    let run = idem.run("conversation-1");
    let intent = json!({"customer": "cus_42", "amount_cents": 4900});

    provider.lose_next_response.store(true, Ordering::SeqCst);
    let first = dispatch(&run, &tools, "charge_card", intent.clone()).await;
    println!("   (later, the model is unsure and calls again)");
    let before = provider.requests.load(Ordering::SeqCst);
    let again = dispatch(&run, &tools, "charge_card", intent).await;
    let reached = provider.requests.load(Ordering::SeqCst) - before;
    println!(
        "     ({} reached the provider: the result was replayed from idem's store)",
        counted(reached, "request")
    );

    let charges = provider.charges_for("cus_42");
    println!(
        "   => the executor's retry and the model's repeat {} ({}); cus_42 was charged {}: {}",
        if first == again { "received the same charge" } else { "received DIFFERENT answers" },
        charges.first().map(String::as_str).unwrap_or("none"),
        counted(charges.len(), "time"),
        charges.join(", ")
    );

    let duplicates = 12;
    println!(
        "   {duplicates} concurrent duplicates of a new intent, charge_card(cus_7, 2500): the first claims the key, the others join it"
    );
    let before = provider.requests.load(Ordering::SeqCst);
    let calls: Vec<_> = (0..duplicates)
        .map(|_| {
            let (run, tools) = (run.clone(), Arc::clone(&tools));
            tokio::spawn(async move { tools.charge_card(&run, "cus_7".into(), 2500).await })
        })
        .collect();
    let mut ids = Vec::new();
    for call in calls {
        match call.await {
            Ok(Ok(charge)) => ids.push(charge.id),
            Ok(Err(e)) => ids.push(format!("error: {e}")),
            Err(e) => ids.push(format!("task failed: {e}")),
        }
    }
    let received = ids.len();
    ids.dedup();
    let reached = provider.requests.load(Ordering::SeqCst) - before;
    println!(
        "   <- {received} answers, all {}; {} reached the provider (the other {} received its result)",
        ids.join(" / "),
        counted(reached, "request"),
        duplicates - 1
    );
    println!();

    // 3. A never tool.
    println!("3. #[tool(retry = \"never\")]: no second attempt when the outcome is unknown");
    provider.lose_next_response.store(true, Ordering::SeqCst);
    let refund = json!({"charge_id": "ch_1"});
    dispatch(&run, &tools, "refund", refund.clone()).await;
    println!("   (the model tries again)");
    dispatch(&run, &tools, "refund", refund).await;
    let refunds = provider.refunds.lock().unwrap().len();
    println!(
        "   => the provider received {}; the model was told to check, not to retry",
        counted(refunds, "refund request")
    );

    // The typed call gives a matchable error, for code that reconciles.
    let typed = tools.refund(&run, "ch_1".into()).await;
    if let Err(Error::OutcomeUnknown { key, .. }) = typed {
        println!("   (typed call: Error::OutcomeUnknown for key {}…)", short(key.as_str()));
    }
}

/// `n` and `what`, plural unless one: "1 request", "2 requests".
fn counted(n: impl std::fmt::Display, what: &str) -> String {
    let n = n.to_string();
    if n == "1" { format!("1 {what}") } else { format!("{n} {what}s") }
}
