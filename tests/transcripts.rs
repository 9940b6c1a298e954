//! Recorded agent transcripts (OpenAI chat, OpenAI Responses items, Anthropic messages and
//! Gemini contents, `tests/transcripts/*.json`) replayed through a `ToolSet`: every tool call the
//! model made is dispatched again, in order, with the model's own call ids and argument text. The
//! results must equal what the transcript says the model read, and the provider must see one
//! effect per intent.
//!
//! A transcript file: `{"format": "openai" | "openai_responses" | "anthropic" | "gemini", "run",
//! "notes", "messages": [..] (a Responses transcript's input items, a Gemini one's contents),
//! "expect": {"charges", "charge_requests", "refunds", "refund_requests"}}`. A tool result
//! marked `"x-idem-harness": "timeout"` is one the agent framework gave up on after 10 s (the
//! dispatch is dropped, as a framework's timeout drops the future); its text is the framework's.
//! Keys (64 hex digits) in texts are compared as `<key>`.
//!
//! `TRANSCRIPTS_RECORD=1 cargo test --test transcripts` rewrites the expected texts from the
//! current results (read the diff before committing).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::join_all;
use idem_core::{Classify, Ctx, Failure, Idem, Run, ToolSet, tool};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The agent framework's timeout for one tool call.
const HARNESS_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the provider takes to answer a charge (after it took effect).
const CHARGE_LATENCY: Duration = Duration::from_secs(20);
/// A refund of this amount takes effect and then times out.
const AMBIGUOUS_REFUND_CENTS: u64 = 13;

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
enum PaymentError {
    #[error("no charge `{0}`")]
    UnknownCharge(String),
    #[error("the provider did not answer in time (the request was sent)")]
    Timeout,
}

impl Classify for PaymentError {
    fn classify(&self) -> Failure {
        match self {
            PaymentError::UnknownCharge(_) => Failure::permanent(),
            PaymentError::Timeout => Failure::ambiguous(),
        }
    }
}

#[derive(Clone, Debug, Default)]
struct Ledger {
    /// (charge id, customer, amount, idempotency key)
    charges: Vec<(String, String, u64, String)>,
    /// (refund id, charge id, amount)
    refunds: Vec<(String, String, u64)>,
    charge_requests: u64,
    refund_requests: u64,
}

/// A fake payment provider: charges are deduplicated by the forwarded idempotency key; the effect
/// happens before the (slow) answer; refunds cannot be deduplicated.
#[derive(Default)]
struct Payments {
    ledger: Mutex<Ledger>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Charge {
    charge_id: String,
    customer: String,
    amount_cents: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Refund {
    refund_id: String,
    charge_id: String,
    amount_cents: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Balance {
    customer: String,
    balance_cents: i64,
}

impl Payments {
    /// Charge a customer's card `amount_cents` (in cents). Returns the charge id.
    #[tool(retry = "keyed")]
    async fn charge_card(
        &self,
        cx: &Ctx,
        customer: String,
        amount_cents: u64,
    ) -> Result<Charge, PaymentError> {
        let charge_id = {
            let mut l = self.ledger.lock().unwrap();
            l.charge_requests += 1;
            match l.charges.iter().find(|c| c.3 == cx.key()) {
                Some(c) => c.0.clone(),
                None => {
                    let id = format!("ch_{:04}", l.charges.len() + 1);
                    l.charges.push((id.clone(), customer.clone(), amount_cents, cx.key().into()));
                    id
                }
            }
        };
        tokio::time::sleep(CHARGE_LATENCY).await;
        Ok(Charge { charge_id, customer, amount_cents })
    }

    /// A customer's balance: charged minus refunded, in cents.
    #[tool(retry = "safe")]
    async fn get_balance(&self, customer: String) -> Result<Balance, PaymentError> {
        let l = self.ledger.lock().unwrap();
        let mut cents = 0i64;
        for (id, who, amount, _) in &l.charges {
            if *who == customer {
                cents += *amount as i64;
                cents -= l.refunds.iter().filter(|r| r.1 == *id).map(|r| r.2 as i64).sum::<i64>();
            }
        }
        Ok(Balance { customer, balance_cents: cents })
    }

    /// Refund `amount_cents` (in cents) of the charge `charge_id`. Never retried.
    #[tool(retry = "never")]
    async fn refund(&self, charge_id: String, amount_cents: u64) -> Result<Refund, PaymentError> {
        let mut l = self.ledger.lock().unwrap();
        l.refund_requests += 1;
        if !l.charges.iter().any(|c| c.0 == charge_id) {
            return Err(PaymentError::UnknownCharge(charge_id));
        }
        let refund_id = format!("re_{:04}", l.refunds.len() + 1);
        l.refunds.push((refund_id.clone(), charge_id.clone(), amount_cents));
        if amount_cents == AMBIGUOUS_REFUND_CENTS {
            return Err(PaymentError::Timeout);
        }
        Ok(Refund { refund_id, charge_id, amount_cents })
    }
}

fn tool_set(payments: &Arc<Payments>) -> ToolSet {
    ToolSet::new()
        .with(payments.charge_card_tool())
        .and_then(|s| s.with(payments.get_balance_tool()))
        .and_then(|s| s.with(payments.refund_tool()))
        .expect("the payment tools form a valid set")
}

/// 64 lowercase hex digits (an idempotency key) replaced by `<key>`.
fn mask_keys(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let run = bytes[i..].iter().take_while(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')).count();
        let boundary_before = i == 0 || !bytes[i - 1].is_ascii_alphanumeric();
        let boundary_after = bytes.get(i + 64).is_none_or(|b| !b.is_ascii_alphanumeric());
        if run == 64 && boundary_before && boundary_after {
            out.push_str("<key>");
            i += 64;
        } else {
            let ch = text[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// One tool call of the model, in either format.
struct Call {
    /// The model's call id (`tool_call_id` / `tool_use_id` of its result).
    id: String,
    raw: Value,
}

/// Where the transcript says the model read the result of `id`.
fn find_result<'a>(messages: &'a mut [Value], format: &str, id: &str) -> &'a mut Value {
    for m in messages.iter_mut() {
        match format {
            "openai" => {
                if m["role"] == "tool" && m["tool_call_id"] == id {
                    return m;
                }
            }
            "openai_responses" => {
                if m["type"] == "function_call_output" && m["call_id"] == id {
                    return m;
                }
            }
            "gemini" => {
                if let Some(parts) = m.get_mut("parts").and_then(Value::as_array_mut) {
                    for p in parts.iter_mut() {
                        if p["functionResponse"]["id"] == id {
                            return p;
                        }
                    }
                }
            }
            _ => {
                if let Some(blocks) = m.get_mut("content").and_then(Value::as_array_mut) {
                    for b in blocks.iter_mut() {
                        if b["type"] == "tool_result" && b["tool_use_id"] == id {
                            return b;
                        }
                    }
                }
            }
        }
    }
    panic!("the transcript has no result for tool call {id}")
}

/// The tool calls of each assistant turn, in order.
fn turns(messages: &[Value], format: &str) -> Vec<Vec<Call>> {
    let mut out = Vec::new();
    if format == "openai_responses" {
        // One response's `function_call` items are consecutive in the input.
        let mut turn = Vec::new();
        for item in messages {
            if item["type"] == "function_call" {
                let id = item["call_id"].as_str().unwrap().into();
                turn.push(Call { id, raw: item.clone() });
            } else if !turn.is_empty() {
                out.push(std::mem::take(&mut turn));
            }
        }
        if !turn.is_empty() {
            out.push(turn);
        }
        return out;
    }
    for m in messages.iter().filter(|m| m["role"] == "assistant" || m["role"] == "model") {
        let calls: Vec<Call> = match format {
            "gemini" => m["parts"]
                .as_array()
                .map(|parts| {
                    parts
                        .iter()
                        .filter(|p| p.get("functionCall").is_some())
                        .map(|p| {
                            let id = p["functionCall"]["id"].as_str().unwrap().into();
                            Call { id, raw: p.clone() }
                        })
                        .collect()
                })
                .unwrap_or_default(),
            "openai" => m["tool_calls"]
                .as_array()
                .map(|calls| {
                    calls
                        .iter()
                        .map(|c| Call { id: c["id"].as_str().unwrap().into(), raw: c.clone() })
                        .collect()
                })
                .unwrap_or_default(),
            _ => m["content"]
                .as_array()
                .map(|blocks| {
                    blocks
                        .iter()
                        .filter(|b| b["type"] == "tool_use")
                        .map(|b| Call { id: b["id"].as_str().unwrap().into(), raw: b.clone() })
                        .collect()
                })
                .unwrap_or_default(),
        };
        if !calls.is_empty() {
            out.push(calls);
        }
    }
    out
}

/// What the model read of a result, as text: the message's string, or Gemini's `response`
/// object as JSON (members sorted by name, also where rig-core turns on serde_json's
/// `preserve_order` in the workspace build: `call_gemini` writes them so).
fn result_text(format: &str, result: &Value) -> String {
    match format {
        "openai_responses" => result["output"].as_str().unwrap().to_owned(),
        "gemini" => result["functionResponse"]["response"].to_string(),
        _ => result["content"].as_str().unwrap().to_owned(),
    }
}

fn set_result_text(format: &str, result: &mut Value, text: &str) {
    match format {
        "openai_responses" => result["output"] = text.into(),
        "gemini" => result["functionResponse"]["response"] = serde_json::from_str(text).unwrap(),
        _ => result["content"] = text.into(),
    }
}

async fn dispatch(set: &ToolSet, run: &Run, format: &str, call: &Value) -> Value {
    match format {
        "openai" => set.call_openai(run, call).await,
        "openai_responses" => set.call_openai_responses(run, call).await,
        "gemini" => set.call_gemini(run, call).await,
        _ => set.call_anthropic(run, call).await,
    }
}

/// Replays one transcript; returns the provider's ledger.
async fn replay(path: &Path) -> Ledger {
    let text = std::fs::read_to_string(path).unwrap();
    let mut transcript: Value = serde_json::from_str(&text).unwrap();
    let format = transcript["format"].as_str().unwrap().to_owned();
    assert!(
        ["openai", "openai_responses", "anthropic", "gemini"].contains(&format.as_str()),
        "{}: unknown format",
        path.display()
    );
    let payments = Arc::new(Payments::default());
    let set = tool_set(&payments);
    let run = Idem::in_memory().run(transcript["run"].as_str().unwrap());
    let record = std::env::var_os("TRANSCRIPTS_RECORD").is_some();
    let messages = transcript["messages"].as_array_mut().unwrap();

    for turn in turns(messages, &format) {
        // An assistant turn's calls run concurrently, as agent frameworks run parallel calls.
        let timeouts: Vec<bool> = turn
            .iter()
            .map(|c| {
                let result = find_result(messages, &format, &c.id);
                result.get("x-idem-harness").is_some_and(|h| h == "timeout")
            })
            .collect();
        let results = join_all(turn.iter().zip(&timeouts).map(|(call, &timeout)| {
            let (set, run, format) = (&set, &run, &format);
            async move {
                if timeout {
                    let dispatch = dispatch(set, run, format, &call.raw);
                    let r = tokio::time::timeout(HARNESS_TIMEOUT, dispatch).await;
                    assert!(r.is_err(), "call {} was expected to time out", call.id);
                    None
                } else {
                    Some(dispatch(set, run, format, &call.raw).await)
                }
            }
        }))
        .await;
        for (call, got) in turn.iter().zip(results) {
            let Some(got) = got else { continue };
            let expected = find_result(messages, &format, &call.id);
            let err_field = (format == "anthropic").then_some("is_error");
            let got_text = mask_keys(&result_text(&format, &got));
            if record {
                set_result_text(&format, expected, &got_text);
                if let Some(f) = err_field {
                    expected[f] = got[f].clone();
                }
                continue;
            }
            assert_eq!(
                got_text,
                result_text(&format, expected),
                "{}: the result of {} differs from what the model read",
                path.display(),
                call.id
            );
            if let Some(f) = err_field {
                assert_eq!(got[f], expected[f], "{}: {} of {}", path.display(), f, call.id);
            }
        }
    }
    if record {
        let pretty = serde_json::to_string_pretty(&transcript).unwrap() + "\n";
        std::fs::write(path, pretty).unwrap();
    }
    let ledger = payments.ledger.lock().unwrap().clone();
    if !record {
        let expect = &transcript["expect"];
        let counts = json!({
            "charges": ledger.charges.len(),
            "charge_requests": ledger.charge_requests,
            "refunds": ledger.refunds.len(),
            "refund_requests": ledger.refund_requests,
        });
        assert_eq!(&counts, expect, "{}: provider effects", path.display());
    }
    ledger
}

fn transcripts(prefix: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/transcripts");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "json")
                && p.file_name().unwrap().to_string_lossy().starts_with(prefix)
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no {prefix}*.json transcripts in {}", dir.display());
    files
}

/// Every distinct charge intent (customer, amount) has exactly one charge.
fn one_charge_per_intent(ledger: &Ledger) {
    let mut intents: Vec<(&str, u64)> =
        ledger.charges.iter().map(|c| (c.1.as_str(), c.2)).collect();
    let all = intents.len();
    intents.sort_unstable();
    intents.dedup();
    assert_eq!(intents.len(), all, "an intent was charged twice: {:?}", ledger.charges);
}

#[tokio::test(start_paused = true)]
async fn openai_transcripts_cause_one_effect_per_intent() {
    for path in transcripts("openai_") {
        let ledger = replay(&path).await;
        one_charge_per_intent(&ledger);
    }
}

#[tokio::test(start_paused = true)]
async fn openai_responses_transcripts_cause_one_effect_per_intent() {
    for path in transcripts("responses_") {
        let ledger = replay(&path).await;
        one_charge_per_intent(&ledger);
    }
}

#[tokio::test(start_paused = true)]
async fn gemini_transcripts_cause_one_effect_per_intent() {
    for path in transcripts("gemini_") {
        let ledger = replay(&path).await;
        one_charge_per_intent(&ledger);
    }
}

#[tokio::test(start_paused = true)]
async fn anthropic_transcripts_cause_one_effect_per_intent() {
    for path in transcripts("anthropic_") {
        let ledger = replay(&path).await;
        one_charge_per_intent(&ledger);
    }
}

#[test]
fn keys_are_masked_only_when_whole() {
    let k = "a".repeat(64);
    assert_eq!(mask_keys(&format!("key {k}.")), "key <key>.");
    assert_eq!(mask_keys(&format!("x{k}")), format!("x{k}"));
    assert_eq!(mask_keys("ch_0001"), "ch_0001");
}
