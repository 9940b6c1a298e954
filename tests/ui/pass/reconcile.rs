//! `reconcile = check` on a free fn, a flattened one, a keyed one and a method in a tool set;
//! checks named like the values the check is called with (`key`, `args`).
use std::sync::Arc;

use idem_core::{Ctx, Key, Reconciled, tool};

#[derive(Debug, serde::Serialize, serde::Deserialize, thiserror::Error)]
#[error("failed")]
struct Failed;

impl idem_core::Classify for Failed {
    fn classify(&self) -> idem_core::Failure {
        idem_core::Failure::ambiguous()
    }
}

async fn wire_sent(key: &Key, to: String, cents: u64) -> Reconciled<String> {
    let _ = (key, cents);
    Reconciled::Happened(to)
}

#[tool(retry = "never", reconcile = wire_sent)]
async fn wire(cx: &Ctx, to: String, #[idem(skip)] cents: u64) -> Result<String, Failed> {
    Ok(format!("{to}{cents}{}", cx.key()))
}

#[derive(Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
struct PayArgs {
    to: String,
}

mod checks {
    pub async fn paid(_key: &idem_core::Key, args: super::PayArgs) -> idem_core::Reconciled<String> {
        idem_core::Reconciled::Happened(args.to)
    }
}

#[tool(retry = "keyed", reconcile = checks::paid)]
async fn pay(#[idem(flatten)] args: PayArgs) -> Result<String, Failed> {
    Ok(args.to)
}

/// Named as the key it is given: the fn, not the key, is called.
async fn key(key: &Key, n: u64) -> Reconciled<u64> {
    let _ = key;
    Reconciled::Happened(n)
}

#[tool(retry = "never", reconcile = key)]
async fn post(n: u64) -> Result<u64, Failed> {
    Ok(n)
}

async fn args(_key: &Key, n: u64) -> Reconciled<u64> {
    Reconciled::Happened(n)
}

#[tool(retry = "keyed", reconcile = args)]
async fn file(n: u64) -> Result<u64, Failed> {
    Ok(n)
}

struct Bank;

#[idem_core::tool_set]
impl Bank {
    #[tool(retry = "never", reconcile = sent)]
    async fn send(&self, to: String) -> Result<String, Failed> {
        Ok(to)
    }

    async fn sent(&self, _key: &Key, to: String) -> Reconciled<String> {
        Reconciled::Happened(to)
    }
}

fn main() {
    let _ = WireTool;
    let _ = PayTool;
    let _ = (PostTool, FileTool);
    let _ = Arc::new(Bank).tool_set();
}
