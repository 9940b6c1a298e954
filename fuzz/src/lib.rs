//! What the fuzz targets share: a small tool set on an in-memory store, and a runtime.

use std::sync::OnceLock;

use idem_core::{Classify, Ctx, Failure, Idem, ToolResult, ToolSet, tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
pub enum FuzzError {
    #[error("declined")]
    Declined,
    #[error("flaky")]
    Flaky,
}

impl Classify for FuzzError {
    fn classify(&self) -> Failure {
        match self {
            FuzzError::Declined => Failure::permanent(),
            FuzzError::Flaky => Failure::transient(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Line {
    pub sku: String,
    pub quantity: u32,
    pub price: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub enum Mode {
    Charge { cents: u64 },
    Refund(i64),
    Void,
}

/// Echoes its argument tree: the output is as deep and as large as the input.
#[tool(retry = "keyed")]
pub async fn echo(tree: Value) -> Result<Value, FuzzError> {
    Ok(tree)
}

/// Typed arguments of every kind serde has.
#[tool(retry = "keyed")]
pub async fn order(
    cx: &Ctx,
    customer: String,
    lines: Vec<Line>,
    mode: Mode,
    note: Option<String>,
    #[idem(skip)] trace: Option<Value>,
) -> Result<String, FuzzError> {
    let _ = (lines, note, trace);
    match mode {
        Mode::Refund(n) if n < 0 => Err(FuzzError::Declined),
        _ => Ok(format!("{customer}:{}", cx.key())),
    }
}

/// A never tool that fails transiently on odd amounts.
#[tool(retry = "never")]
pub async fn wire(amount: i64, memo: String) -> Result<i64, FuzzError> {
    let _ = memo;
    if amount % 2 != 0 { Err(FuzzError::Flaky) } else { Ok(amount) }
}

/// A safe tool.
#[tool(retry = "safe")]
pub async fn lookup(id: u64, fields: Vec<String>) -> Result<Vec<String>, FuzzError> {
    Ok(fields.into_iter().map(|f| format!("{id}.{f}")).collect())
}

pub const NAMES: [&str; 5] = ["echo", "order", "wire", "lookup", "missing"];

pub fn tools() -> ToolSet {
    let set = ToolSet::new()
        .with(EchoTool)
        .and_then(|s| s.with(OrderTool))
        .and_then(|s| s.with(WireTool))
        .and_then(|s| s.with(LookupTool));
    match set {
        Ok(set) => set,
        Err(e) => panic!("the fuzz tool set is invalid: {e}"),
    }
}

pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| match tokio::runtime::Builder::new_current_thread().enable_time().build() {
        Ok(rt) => rt,
        Err(e) => panic!("runtime: {e}"),
    })
}

/// A fresh executor per input, so the store does not grow across the run.
pub fn idem() -> Idem {
    Idem::in_memory()
}

/// What every front door must answer: a result that says whether it failed, with text.
pub fn check_result(r: &ToolResult) {
    assert_eq!(r.is_error, r.error_kind.is_some(), "{r:?}");
    if r.is_error {
        assert!(r.text.starts_with("Error ("), "{r:?}");
    }
}
