//! A rig agent with idem tools: the model re-calls a charge that timed out, and the customer is
//! charged once.
//!
//! The model is scripted (no network, no API key, no services): it asks for `charge_card`, reads
//! the result, and, unsure the charge went through, asks for the same charge again. The fake
//! provider loses its first answer after charging, so idem's first attempt times out and is
//! retried with the same idempotency key; the model's repeat is replayed from idem's store.
//!
//! Run: `cargo run -p idem-rig --example rig_agent` (about half a second).

#[path = "../tests/support/scripted.rs"]
mod scripted;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::{Classify, Ctx, Failure, Idem, ToolSet, tool};
use idem_rig::{IdemReport, RigToolSet};
use rig_agent::AgentBuilder;
use rig_agent::agent::{AgentHook, HookContext, OutcomeAction, OutcomeEvent};
use scripted::{Reply, Seen};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Charge {
    charge_id: String,
    amount_cents: u64,
}

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
enum PaymentError {
    #[error("the provider did not answer in time")]
    NoResponse,
}

impl Classify for PaymentError {
    fn classify(&self) -> Failure {
        // The request was sent: the charge may exist. Retry only with the same key.
        Failure::ambiguous()
    }
}

/// A provider that deduplicates charges by idempotency key, and loses its first answer.
#[derive(Default)]
struct Payments {
    charges: Mutex<HashMap<String, Charge>>,
    answered_once: AtomicBool,
}

impl Payments {
    /// Charge a customer's card. Amounts are in cents.
    #[tool(retry = "keyed", attempts = 3, timeout = "300ms")]
    async fn charge_card(
        &self,
        cx: &Ctx,
        customer: String,
        amount_cents: u64,
    ) -> Result<Charge, PaymentError> {
        let charge = {
            let mut charges = self.charges.lock().map_err(|_| PaymentError::NoResponse)?;
            let id = format!("ch_{}", charges.len() + 1);
            let charge = charges
                .entry(cx.key().to_owned())
                .or_insert(Charge { charge_id: id, amount_cents })
                .clone();
            println!(
                "  provider: charge request for {customer} (attempt {}, key {}…) -> {}",
                cx.attempt(),
                &cx.key()[..12.min(cx.key().len())],
                charge.charge_id
            );
            charge
        };
        if !self.answered_once.swap(true, Ordering::SeqCst) {
            println!("  provider: ...and the answer is lost on the way back");
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        Ok(charge)
    }
}

/// The host's side: how idem served each tool call, which idem-rig publishes in the call's result
/// context (the model never sees it), beside the model's call id.
struct ShowReports;

impl AgentHook for ShowReports {
    async fn on_outcome(&self, _: &HookContext, event: OutcomeEvent<'_>) -> OutcomeAction {
        if let (Some(call), Some(cx)) = (event.call_id, event.context)
            && let Ok(Some(report)) = cx.result::<IdemReport>()
        {
            println!(
                "host: {call} in run {} was {} (key {}…)",
                report.run,
                report.outcome.as_deref().unwrap_or("not served"),
                report.key.get(..12).unwrap_or(&report.key)
            );
        }
        OutcomeAction::Proceed
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let payments = Arc::new(Payments::default());
    let idem = Idem::in_memory();
    let tools = RigToolSet::new(
        ToolSet::new().with(payments.charge_card_tool())?,
        idem.run("conversation-42"),
    );

    // The scripted model: charge, then charge again (the same intent), then answer.
    let (model, transport) = scripted::model(|seen: &[Seen]| {
        let args = json!({"customer": "cus_1", "amount_cents": 4900});
        match seen.len() {
            n @ (0 | 1) => {
                println!("model: charge_card({args}) as call_{}", n + 1);
                Reply::call(&format!("call_{}", n + 1), "charge_card", args)
            }
            _ => Reply::Text(format!(
                "Charged. Results I read: {}",
                seen.iter().map(|s| s.text.as_str()).collect::<Vec<_>>().join(" and ")
            )),
        }
    });
    let agent =
        AgentBuilder::new(model).dynamic_tools(tools.dynamic_tools()).add_hook(ShowReports).build();

    println!("user: Charge cus_1 $49.");
    let answer = agent.prompt("Charge cus_1 $49.").max_turns(5).await?;
    for (i, seen) in
        transport.requests().last().map(scripted::seen).unwrap_or_default().iter().enumerate()
    {
        println!("model read tool result {}: {}", i + 1, seen.text);
    }
    println!("assistant: {}", answer.output());

    let charges = payments.charges.lock().map(|c| c.len()).unwrap_or_default();
    println!("charges at the provider: {charges}");
    if charges != 1 {
        return Err(format!("expected one charge, found {charges}").into());
    }
    Ok(())
}
