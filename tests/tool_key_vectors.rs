//! Golden keys through `#[tool]`: fn name, then tool name, then key. The vectors
//! (`tools` in `tests/vectors/keys.json`) come from the independent Python reference
//! `docs/key_vectors.py`, which applies the naming rule of `docs/key-spec.md` ("Tool names"); a
//! change to that rule, to the generated arguments or to the framing fails here.

use std::sync::Arc;

use idem_core::{Classify, Ctx, Failure, Idem, Tool, tool};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
#[error("never fails")]
struct Never;

impl Classify for Never {
    fn classify(&self) -> Failure {
        Failure::permanent()
    }
}

// Every tool answers with the key its call was given, so the test sees the key the executor
// derived, not one it recomputes.

#[tool(retry = "keyed")]
async fn charge_card(cx: &Ctx, customer: String, amount_cents: u64) -> Result<String, Never> {
    let _ = (customer, amount_cents);
    Ok(cx.key().to_owned())
}

#[tool(retry = "keyed", name = "refund-v2")]
async fn refund(cx: &Ctx, charge: String, amount_cents: u64) -> Result<String, Never> {
    let _ = (charge, amount_cents);
    Ok(cx.key().to_owned())
}

#[tool(retry = "never")]
async fn r#move(cx: &Ctx, from: i64, to: i64) -> Result<String, Never> {
    let _ = (from, to);
    Ok(cx.key().to_owned())
}

#[tool(retry = "keyed")]
async fn send_email(
    cx: &Ctx,
    to: String,
    body: String,
    #[idem(skip)] trace_id: String,
) -> Result<String, Never> {
    let _ = (to, body, trace_id);
    Ok(cx.key().to_owned())
}

#[tool(retry = "keyed")]
async fn open_ticket(
    cx: &Ctx,
    title: String,
    #[idem(skip_if_none)] memo: Option<String>,
) -> Result<String, Never> {
    let _ = (title, memo);
    Ok(cx.key().to_owned())
}

#[tool(retry = "keyed", name = "open_ticket")]
async fn open_ticket_v1(cx: &Ctx, title: String) -> Result<String, Never> {
    let _ = title;
    Ok(cx.key().to_owned())
}

#[tool(retry = "keyed", name = "open_ticket")]
async fn open_ticket_unmarked(
    cx: &Ctx,
    title: String,
    memo: Option<String>,
) -> Result<String, Never> {
    let _ = (title, memo);
    Ok(cx.key().to_owned())
}

#[tool(retry = "safe")]
async fn ping(cx: &Ctx) -> Result<String, Never> {
    Ok(cx.key().to_owned())
}

struct Ledger;

impl Ledger {
    #[tool(retry = "keyed")]
    async fn post_entry(&self, cx: &Ctx, account: String, cents: i64) -> Result<String, Never> {
        let _ = (account, cents);
        Ok(cx.key().to_owned())
    }

    #[tool(retry = "safe", name = "ledger_balance")]
    async fn balance(&self, cx: &Ctx, account: String) -> Result<String, Never> {
        let _ = account;
        Ok(cx.key().to_owned())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolVector {
    name: String,
    #[allow(dead_code)]
    declaration: String,
    #[serde(rename = "fn")]
    fn_name: String,
    tool: String,
    tenant: String,
    run: String,
    arguments: String,
    canonical: String,
    key: String,
}

#[derive(Deserialize)]
struct Vectors {
    tools: Vec<ToolVector>,
}

/// What one tool gave for a vector: its name, the canonical arguments, the key its body saw.
struct Seen {
    tool: String,
    canonical: String,
    key: String,
}

async fn through<T: Tool<Output = String>>(tool: &T, v: &ToolVector) -> Result<Seen, String> {
    let args: T::Args =
        serde_json::from_str(&v.arguments).map_err(|e| format!("arguments do not parse: {e}"))?;
    let mut canonical = Vec::new();
    T::write_intent(&args, &mut canonical).map_err(|e| e.to_string())?;
    let scope = idem_core::Scope::run(v.run.as_str()).with_tenant(v.tenant.as_str());
    let run = Idem::in_memory().scope(scope);
    let key = run.call(tool, args).await.map_err(|e| e.to_string())?;
    Ok(Seen {
        tool: tool.def().name.to_owned(),
        canonical: String::from_utf8(canonical).map_err(|e| e.to_string())?,
        key,
    })
}

/// The tool a vector's `fn` names, called with the vector's arguments.
async fn seen(v: &ToolVector) -> Result<Seen, String> {
    let ledger = Arc::new(Ledger);
    match v.fn_name.as_str() {
        "charge_card" => through(&ChargeCardTool, v).await,
        "refund" => through(&RefundTool, v).await,
        "r#move" => through(&MoveTool, v).await,
        "send_email" => through(&SendEmailTool, v).await,
        "open_ticket" => through(&OpenTicketTool, v).await,
        "open_ticket_v1" => through(&OpenTicketV1Tool, v).await,
        "open_ticket_unmarked" => through(&OpenTicketUnmarkedTool, v).await,
        "ping" => through(&PingTool, v).await,
        "post_entry" => through(&Ledger::post_entry_tool(&ledger), v).await,
        "balance" => through(&Ledger::balance_tool(&ledger), v).await,
        other => Err(format!("no tool declared for fn `{other}`: add it to this file")),
    }
}

#[tokio::test]
async fn tool_names_and_keys_through_the_macro_match_the_reference() {
    let vectors: Vectors = match serde_json::from_str(include_str!("vectors/keys.json")) {
        Ok(v) => v,
        Err(e) => panic!("tests/vectors/keys.json: {e}"),
    };
    assert!(vectors.tools.len() >= 7, "the tool vectors went missing");
    let mut diffs = Vec::new();
    for v in &vectors.tools {
        let got = match seen(v).await {
            Ok(got) => got,
            Err(e) => {
                diffs.push(format!("{}: {e}", v.name));
                continue;
            }
        };
        for (what, want, got) in [
            ("tool name", &v.tool, &got.tool),
            ("canonical", &v.canonical, &got.canonical),
            ("key", &v.key, &got.key),
        ] {
            if want != got {
                diffs.push(format!(
                    "{} ({}): {what}\n  want {want}\n  got  {got}",
                    v.name, v.fn_name
                ));
            }
        }
    }
    assert!(diffs.is_empty(), "{} differences:\n{}", diffs.len(), diffs.join("\n"));
}

#[tokio::test]
async fn the_typed_call_gives_the_key_of_the_json_call() {
    // The generated fn (positional parameters) and the JSON arguments are one intent.
    let run = Idem::in_memory().run("run-1");
    let typed = charge_card(&run, "cus_1".into(), 4900).await.ok();
    let by_json: Option<String> = async {
        let args = serde_json::from_str(r#"{"amount_cents":4900,"customer":"cus_1"}"#).ok()?;
        run.call(&ChargeCardTool, args).await.ok()
    }
    .await;
    assert!(typed.is_some());
    assert_eq!(typed, by_json);
}

/// One intent through every front door: the typed call, OpenAI (argument text, in another
/// member order and number spelling, encoded twice), Anthropic (parsed input), OpenAI Responses
/// (argument text), Gemini (parsed arguments), MCP with the run
/// in `_meta` (as idem-mcp dispatches), and `ToolSet::call`. Each hands the tool the same key,
/// so the first call's outcome is replayed to all the others.
#[tokio::test]
async fn every_front_door_gives_the_typed_calls_key() {
    use serde_json::json;
    let idem = Idem::in_memory();
    let run = idem.run("conv-7");
    let typed = charge_card(&run, "cus_1".into(), 4900).await.expect("typed call");
    let set = idem_core::ToolSet::new().with(ChargeCardTool).expect("a valid tool");

    let openai = set
        .call_openai(
            &run,
            &json!({"id": "call_1", "type": "function", "function": {"name": "charge_card",
                "arguments": "\"{\\\"amount_cents\\\":4.9e3, \\\"customer\\\":\\\"cus\\u005f1\\\"}\""}}),
        )
        .await;
    assert_eq!(openai["content"], json!(typed), "{openai}");

    let anthropic = set
        .call_anthropic(
            &run,
            &json!({"type": "tool_use", "id": "toolu_1", "name": "charge_card",
                "input": {"customer": "cus_1", "amount_cents": 4900.0}}),
        )
        .await;
    assert_eq!(anthropic["content"], json!(typed), "{anthropic}");

    let responses = set
        .call_openai_responses(
            &run,
            &json!({"type": "function_call", "call_id": "call_2", "name": "charge_card",
                "arguments": "{\"customer\":\"cus_1\",\"amount_cents\":49e2}"}),
        )
        .await;
    assert_eq!(responses["output"], json!(typed), "{responses}");

    let gemini = set
        .call_gemini(
            &run,
            &json!({"functionCall": {"name": "charge_card",
                "args": {"customer": "cus_1", "amount_cents": 4900}}}),
        )
        .await;
    assert_eq!(gemini["functionResponse"]["response"]["output"], json!(typed), "{gemini}");

    // MCP: another session run, the conversation named in `_meta`.
    let session = idem.run("mcp-session-1");
    let mcp = set
        .call_mcp(
            &session,
            &json!({"name": "charge_card", "arguments": {"amount_cents": 4900, "customer": "cus_1"},
                "_meta": {"idem/run": "conv-7"}}),
        )
        .await
        .expect("a routable call");
    assert_eq!(mcp["structuredContent"], json!(null));
    assert_eq!(mcp["content"][0]["text"], json!(typed), "{mcp}");
    assert_eq!(mcp["_meta"]["idem/key"], json!(typed), "{mcp}");
    assert_eq!(mcp["_meta"]["idem/outcome"], json!("replayed"), "{mcp}");

    let args = json!({"customer": "cus_1", "amount_cents": 4900});
    let plain = set.call(&run, "charge_card", &args).await;
    assert_eq!(plain.content, json!(typed));
    assert_eq!(plain.report.map(|r| r.key.to_string()), Some(typed));
}
