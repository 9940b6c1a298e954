//! What the benches share: a keyed tool with ~200 bytes of arguments that does no work of its
//! own, so what is measured is idem (and its store).

#![allow(dead_code)] // each bench uses its own part

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use idem_core::{Classify, Ctx, Failure, RetryClass, Tool, ToolDef, ToolOptions};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ChargeArgs {
    pub customer: String,
    pub amount_cents: u64,
    pub currency: String,
    pub description: String,
    pub metadata: BTreeMap<String, String>,
}

pub fn charge_args(n: u64) -> ChargeArgs {
    ChargeArgs {
        customer: "cus_Q4tL9mX2aB7cD1".into(),
        amount_cents: 4900 + n,
        currency: "eur".into(),
        description: "Annual subscription, team plan (5 seats), invoice INV-2026-0042".into(),
        metadata: BTreeMap::from([
            ("order_id".into(), "ord_7781".into()),
            ("agent_run".into(), "run_2026_11_29_a".into()),
        ]),
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct NoError;

impl std::fmt::Display for NoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("never fails")
    }
}

impl Classify for NoError {
    fn classify(&self) -> Failure {
        Failure::permanent()
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Charge {
    pub id: String,
    pub amount_cents: u64,
}

pub static DEF: ToolDef = ToolDef {
    name: "charge_card",
    description: "Charge a customer's card.",
    class: RetryClass::Keyed,
    options: ToolOptions::NONE,
};

/// The tool does no work of its own: what is measured is idem's overhead.
pub struct ChargeCard {
    pub gate: Option<Arc<tokio::sync::Semaphore>>,
}

impl Tool for ChargeCard {
    type Args = ChargeArgs;
    type Output = Charge;
    type Error = NoError;
    // What `#[tool]` sets for these parameters (strings, an integer, a `BTreeMap<String, _>`):
    // a retry reads its arguments back from the intent, no attempt copies them first.
    const ARGS_FROM_INTENT: bool = true;
    fn def(&self) -> &'static ToolDef {
        &DEF
    }
    // As `#[tool]` writes for a tool named after its fn: each call checks that no other
    // declaration holds the name (`executor/names.rs`).
    fn declared_at(&self) -> &'static str {
        "benches::charge_card"
    }
    fn run(
        &self,
        _cx: &Ctx,
        args: ChargeArgs,
    ) -> impl Future<Output = Result<Charge, NoError>> + Send {
        let gate = self.gate.clone();
        async move {
            if let Some(gate) = gate {
                let _permit = gate.acquire().await;
            }
            Ok(Charge { id: "ch_3PqR7s".into(), amount_cents: args.amount_cents })
        }
    }
}
