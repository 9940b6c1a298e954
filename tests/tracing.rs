//! Tracing: one `execute_tool` span per call, with its outcome, and never an argument value.
//! (Its own test binary: a thread-local subscriber must not race other tests for the callsite's
//! cached interest.)

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::{Classify, Ctx, Failure, Idem, RetryClass, Tool, ToolDef, ToolOptions};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct Args {
    customer: String,
    amount_cents: u64,
}

fn args(customer: &str, amount_cents: u64) -> Args {
    Args { customer: customer.into(), amount_cents }
}

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
#[error("connection reset after the request was sent")]
struct Reset;

impl Classify for Reset {
    fn classify(&self) -> Failure {
        Failure::ambiguous()
    }
}

/// Succeeds after 10 ms, or (`reset`) fails ambiguously.
struct Charge {
    def: &'static ToolDef,
    reset: bool,
    runs: AtomicUsize,
}

const fn def(class: RetryClass) -> ToolDef {
    ToolDef { name: "charge_card", description: "", class, options: ToolOptions::NONE }
}
static KEYED: ToolDef = def(RetryClass::Keyed);
static NEVER: ToolDef = def(RetryClass::Never);

impl Tool for Charge {
    type Args = Args;
    type Output = String;
    type Error = Reset;
    fn def(&self) -> &'static ToolDef {
        self.def
    }
    fn run(&self, _cx: &Ctx, _args: Args) -> impl Future<Output = Result<String, Reset>> + Send {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let reset = self.reset;
        async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if reset { Err(Reset) } else { Ok("ch_1".to_owned()) }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tracing: one span per call, with the outcome, and never an argument value.

mod spans {
    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing_subscriber::layer::{Context, SubscriberExt};
    use tracing_subscriber::registry::LookupSpan;

    /// Every span seen: its name and its fields as text; and every event: level and fields.
    #[derive(Clone, Default)]
    pub struct Spans(pub Arc<Mutex<Vec<SpanRecord>>>, pub Arc<Mutex<Vec<EventRecord>>>);

    /// An event's level and its fields as text.
    pub type EventRecord = (tracing::Level, Vec<(String, String)>);

    /// A span's name and its fields as text.
    pub type SpanRecord = (String, Vec<(String, String)>);

    struct Fields(Vec<(String, String)>);
    impl Visit for Fields {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0
                .push((field.name().to_owned(), format!("{value:?}").trim_matches('"').to_owned()));
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.push((field.name().to_owned(), value.to_owned()));
        }
    }

    struct Index(usize);

    impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Spans {
        fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
            let mut fields = Fields(Vec::new());
            attrs.record(&mut fields);
            let mut all = self.0.lock().unwrap();
            all.push((attrs.metadata().name().to_owned(), fields.0));
            if let Some(span) = ctx.span(id) {
                span.extensions_mut().insert(Index(all.len() - 1));
            }
        }
        fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
            let mut fields = Fields(Vec::new());
            event.record(&mut fields);
            self.1.lock().unwrap().push((*event.metadata().level(), fields.0));
        }
        fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
            let mut fields = Fields(Vec::new());
            values.record(&mut fields);
            if let Some(span) = ctx.span(id)
                && let Some(Index(i)) = span.extensions().get::<Index>()
            {
                self.0.lock().unwrap()[*i].1.extend(fields.0);
            }
        }
    }

    impl Spans {
        pub fn install(&self) -> tracing::subscriber::DefaultGuard {
            let guard =
                tracing::subscriber::set_default(tracing_subscriber::registry().with(self.clone()));
            // Other tests run on other threads without a subscriber; their "never interested"
            // answer must not stick to the callsite for this thread.
            tracing::callsite::rebuild_interest_cache();
            guard
        }
        /// The fields, as text, of every event logged at `level`.
        pub fn events(&self, level: tracing::Level) -> Vec<String> {
            let all = self.1.lock().unwrap();
            all.iter()
                .filter(|(at, _)| *at == level)
                .map(|(_, fields)| format!("{fields:?}"))
                .collect()
        }
        /// The last value of `field` in each span named `execute_tool`.
        pub fn field(&self, field: &str) -> Vec<Option<String>> {
            let all = self.0.lock().unwrap();
            all.iter()
                .filter(|(name, _)| name == "execute_tool")
                .map(|(_, fields)| {
                    fields.iter().rev().find(|(k, _)| k == field).map(|(_, v)| v.clone())
                })
                .collect()
        }
        pub fn all_values(&self) -> String {
            format!("{:?}", self.0.lock().unwrap())
        }
    }
}

#[tokio::test(start_paused = true)]
async fn every_call_has_one_span_with_its_outcome_and_no_argument_values() {
    let spans = spans::Spans::default();
    let _guard = spans.install();
    let idem = Idem::in_memory();
    let run = idem.run("r").with_call_id("call_abc");
    let tool = Charge { def: &KEYED, reset: false, runs: AtomicUsize::new(0) };
    let (a, b) = tokio::join!(
        run.call(&tool, args("cus_secret_1", 4242)),
        run.call(&tool, args("cus_secret_1", 4242))
    );
    a.unwrap();
    b.unwrap();
    run.call(&tool, args("cus_secret_1", 4242)).await.unwrap();
    let never = Charge { def: &NEVER, reset: true, runs: AtomicUsize::new(0) };
    let _ = run.call(&never, args("cus_secret_2", 4242)).await;
    assert_eq!(tool.runs.load(Ordering::SeqCst) + never.runs.load(Ordering::SeqCst), 2);

    assert_eq!(
        spans.field("gen_ai.tool.name"),
        vec![Some("charge_card".into()); 4],
        "one span per call"
    );
    let mut outcomes = spans.field("idem.outcome");
    outcomes[..2].sort();
    let outcome = |s: &str| Some(s.to_owned());
    assert_eq!(
        outcomes,
        [outcome("executed"), outcome("joined"), outcome("replayed"), outcome("unknown")]
    );
    assert_eq!(spans.field("error.type"), [None, None, None, outcome("outcome_unknown")]);
    assert_eq!(spans.field("gen_ai.tool.call.id"), vec![outcome("call_abc"); 4]);
    assert_eq!(
        spans.field("idem.class"),
        [outcome("keyed"), outcome("keyed"), outcome("keyed"), outcome("never")]
    );
    let key = spans.field("idem.key")[0].clone().unwrap();
    assert_eq!(key.len(), 64);
    let text = spans.all_values();
    assert!(
        !text.contains("cus_secret") && !text.contains("4242"),
        "argument values leaked: {text}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_mcp_call_that_changes_something_without_a_run_id_is_a_warning() {
    use idem_core::toolset::{Arguments, McpCall, MissingRun};
    use serde_json::{Map, Value, json};

    let spans = spans::Spans::default();
    let _guard = spans.install();
    let set = idem_core::ToolSet::new()
        .with(Charge { def: &KEYED, reset: false, runs: AtomicUsize::new(0) })
        .unwrap();
    let session = Idem::in_memory().run("mcp-session-1");
    let args = json!({"customer": "cus_1", "amount_cents": 5});
    let named: Map<String, Value> =
        [("idem/run".to_owned(), json!("conv-1"))].into_iter().collect();
    for meta in [None, Some(&named)] {
        let call = McpCall::new("charge_card", Arguments::Json(&args), meta);
        let result = set.dispatch_mcp(&session, call, MissingRun::Warn).await.unwrap();
        assert!(!result.is_error, "{}", result.text);
    }
    let warnings = spans.events(tracing::Level::WARN);
    assert_eq!(warnings.len(), 1, "one warning, for the call without a run id: {warnings:?}");
    let text = &warnings[0];
    assert!(text.contains("without _meta"), "{text}");
    assert!(text.contains("charge_card") && text.contains("mcp-session-1"), "{text}");
}

/// A run with an empty or blank id is one scope shared by every caller that passes it (a
/// `conversation_id.unwrap_or_default()` fallback): logged as a warning once per run made, and
/// not for a named run.
#[tokio::test]
async fn a_run_with_an_empty_id_is_a_warning() {
    let spans = spans::Spans::default();
    let _guard = spans.install();
    let idem = Idem::in_memory();
    for id in ["", "  ", "\u{200B}", "conversation-7"] {
        let _ = idem.run(id);
    }
    let _ = idem.scope(idem_core::Scope::run("").with_tenant("acme"));
    let warnings = spans.events(tracing::Level::WARN);
    assert_eq!(warnings.len(), 4, "one for each empty or blank id: {warnings:?}");
    assert!(warnings.iter().all(|w| w.contains("empty id")), "{warnings:?}");
}

/// A tool that takes its name, `get`, from its fn, declared at `at` (as `#[tool]` writes it).
struct Get {
    at: &'static str,
    runs: &'static AtomicUsize,
}

static GET: ToolDef =
    ToolDef { name: "get", description: "", class: RetryClass::Keyed, options: ToolOptions::NONE };

impl Tool for Get {
    type Args = Args;
    type Output = String;
    type Error = Reset;
    fn def(&self) -> &'static ToolDef {
        &GET
    }
    fn declared_at(&self) -> &'static str {
        self.at
    }
    fn run(&self, _cx: &Ctx, args: Args) -> impl Future<Output = Result<String, Reset>> + Send {
        self.runs.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(format!("{} {}", self.at, args.customer)))
    }
}

/// A second declaration under a name another holds, called through a tool set: the model reads
/// what it can do (not repeat the call), not the developer's advice (module paths,
/// `#[tool(name = ..)]`), which goes to the log at error level naming both declarations.
#[tokio::test]
async fn a_name_taken_through_a_tool_set_tells_the_model_not_to_repeat_it_and_logs_why() {
    static USERS_RUNS: AtomicUsize = AtomicUsize::new(0);
    static ORDERS_RUNS: AtomicUsize = AtomicUsize::new(0);
    let spans = spans::Spans::default();
    let _guard = spans.install();
    let run = Idem::in_memory().run("same-name-set");
    let users = Get { at: "app::users::get", runs: &USERS_RUNS };
    let orders = Get { at: "app::orders::get", runs: &ORDERS_RUNS };
    let users_set = idem_core::ToolSet::new().with(users).unwrap();
    let orders_set = idem_core::ToolSet::new().with(orders).unwrap();
    let args = serde_json::json!({ "customer": "cus_7", "amount_cents": 1 });
    let first = users_set.call(&run, "get", &args).await;
    assert_eq!(first.text, "app::users::get cus_7", "{first:?}");
    let refused = orders_set.call(&run, "get", &args).await;
    assert!(refused.is_error, "{refused:?}");
    assert_eq!(refused.error_kind.map(|k| k.as_str()), Some("tool_name_taken"));
    assert!(refused.text.contains("do not repeat it"), "{}", refused.text);
    for internal in ["app::", "#[tool"] {
        assert!(!refused.text.contains(internal), "{}", refused.text);
    }
    assert_eq!(ORDERS_RUNS.load(Ordering::SeqCst), 0, "the body never ran");
    assert_eq!(USERS_RUNS.load(Ordering::SeqCst), 1);
    let errors = spans.events(tracing::Level::ERROR);
    assert_eq!(errors.len(), 1, "{errors:?}");
    for logged in ["app::users::get", "app::orders::get", "#[tool(name ="] {
        assert!(errors[0].contains(logged), "{logged}: {errors:?}");
    }
}
