//! A scripted completion model for rig: no network, no provider. Each reply is a function of
//! the tool results the model has seen so far, like a model that reads what its tools returned.
//!
//! In rig-core 0.44 a completion model is a wire (what to send, how to read the reply) bound to
//! a transport (how the payload travels). This is a transport for rig's scripted wire
//! `MockScript`: its payload is the `CompletionRequest` itself, and its reply a whole
//! `CompletionResponse`.

use std::sync::{Arc, Mutex, MutexGuard};

use rig_core::completion::{AssistantContent, CompletionRequest, CompletionResponse, Usage};
use rig_core::driver::{Exchange, Model, Opened, Opening, Transport};
use rig_core::error::ProviderError;
use rig_core::message::UserContent;
use rig_core::message::{Message, Origin, ToolCall, ToolFunction, ToolName, ToolResultContent};
use rig_core::test_utils::{MOCK_API, MOCK_PROVIDER, MockFrame, MockScript};
use rig_core::wire::Mode;

/// One tool result as the model read it in its history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// The tool's name.
    pub name: String,
    /// The text the model read (a JSON block as its compact text).
    pub text: String,
    /// Whether rig marked it as a failed call.
    pub is_error: bool,
}

/// What the model says next.
#[derive(Clone, Debug)]
pub enum Reply {
    /// Call `name` with `arguments`; `id` is the model's tool-call id.
    Call { id: String, name: String, arguments: serde_json::Value },
    /// Several tool calls in one turn (parallel tool calls), in call order.
    #[allow(dead_code, reason = "the example makes one call a turn")]
    Calls(Vec<Reply>),
    /// Answer with text and stop.
    Text(String),
}

impl Reply {
    /// A tool call.
    pub fn call(id: &str, name: &str, arguments: serde_json::Value) -> Reply {
        Reply::Call { id: id.to_owned(), name: name.to_owned(), arguments }
    }
}

/// The assistant content of one reply, in order.
fn contents(reply: Reply) -> Result<Vec<AssistantContent>, String> {
    Ok(match reply {
        Reply::Text(text) => vec![AssistantContent::text(text)],
        Reply::Call { id, name, arguments } => {
            let name = ToolName::new(name).map_err(|e| e.to_string())?;
            vec![AssistantContent::ToolCall(ToolCall::from_wire(
                id,
                ToolFunction::new(name, arguments),
            ))]
        }
        Reply::Calls(replies) => {
            let mut out = Vec::new();
            for reply in replies {
                out.extend(contents(reply)?);
            }
            out
        }
    })
}

type Script = dyn Fn(&[Seen]) -> Reply + Send + Sync;

/// The transport of the scripted model: answers each request from the script, and records what
/// it was sent.
#[derive(Clone)]
pub struct Scripted {
    script: Arc<Script>,
    requests: Arc<Mutex<Vec<CompletionRequest>>>,
}

/// The scripted model, as rig's agent builder takes it (`impl Into<DynModel<Completion>>`).
pub type ScriptedModel = Model<MockScript, Scripted>;

/// A model that answers every request with `script(tool results seen so far)`.
pub fn model(
    script: impl Fn(&[Seen]) -> Reply + Send + Sync + 'static,
) -> (ScriptedModel, Scripted) {
    let transport = Scripted { script: Arc::new(script), requests: Arc::default() };
    (Model::new(MockScript::default(), transport.clone()), transport)
}

impl Scripted {
    /// Every request the model received, in order.
    pub fn requests(&self) -> Vec<CompletionRequest> {
        lock(&self.requests).clone()
    }
}

/// The tool results in a request's history, in order.
pub fn seen(request: &CompletionRequest) -> Vec<Seen> {
    let mut out = Vec::new();
    for message in &request.chat_history {
        let Message::User { content } = message else { continue };
        for item in content {
            let UserContent::ToolResult(result) = item else { continue };
            let text = result
                .content
                .iter()
                .map(|c| match c {
                    ToolResultContent::Text(t) => t.text().to_owned(),
                    ToolResultContent::Json { value } => value.to_string(),
                    other => format!("{other:?}"),
                })
                .collect::<Vec<_>>()
                .join("");
            out.push(Seen { name: result.name.to_string(), text, is_error: result.is_error });
        }
    }
    out
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Transport<MockScript> for Scripted {
    fn send(&self, request: CompletionRequest, exchange: Exchange) -> Opening<MockFrame> {
        if exchange.mode != Mode::Unary {
            return Opening::failed(ProviderError::Provider(
                "the scripted model answers unary requests only".into(),
            ));
        }
        let reply = (self.script)(&seen(&request));
        lock(&self.requests).push(request);
        let content = match contents(reply) {
            Ok(content) => content,
            Err(e) => return Opening::failed(ProviderError::Provider(e)),
        };
        let raw = serde_json::to_value(&content).unwrap_or_default();
        let response = CompletionResponse::new(
            content,
            Usage::default(),
            Origin::new(MOCK_API, MOCK_PROVIDER, ""),
            raw.clone(),
        );
        let frames = futures_util::stream::iter([Ok(MockFrame::Response(Box::new(response)))]);
        Opening::ready(Opened::new(frames).with_document(raw))
    }
}
