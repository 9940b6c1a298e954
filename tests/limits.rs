//! The depth and size limits of `docs/key-spec.md` ("Limits") on every way in: the typed call,
//! `ToolSet::call`, and the OpenAI, Anthropic and MCP entry points. Each deep case runs on a
//! thread with a 2 MiB stack (what `std::thread::spawn` gives), at the limit, one past it, and
//! 100,000 levels deep; past the limit nothing is claimed and the tool body never runs.

use idem_tests::wrapped::{Hook, Op, Wrapped};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::limits::{drop_flat, nested_arrays};
use idem_core::store::{Claim, ClaimRequest, Outcome};
use idem_core::{
    Classify, Error, Failure, Idem, KeyError, MAX_DEPTH, Policy, Store, StoreError, ToolSet, tool,
};
use idem_tests::Never;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// What reaches the store: claims, completions, and the largest outcome it was asked to keep.
#[derive(Default)]
struct Counts {
    claims: AtomicU32,
    completes: AtomicU32,
    largest_outcome: AtomicUsize,
}

#[async_trait]
impl Hook for Counts {
    async fn before(&self, op: Op<'_>) -> Result<(), StoreError> {
        match op {
            Op::Claim(_) => {
                self.claims.fetch_add(1, Ordering::SeqCst);
            }
            Op::Complete { outcome, .. } => {
                self.completes.fetch_add(1, Ordering::SeqCst);
                let size = match outcome {
                    Outcome::Success(json)
                    | Outcome::Failure(json)
                    | Outcome::NotStorable(json) => json.len(),
                    _ => 0,
                };
                self.largest_outcome.fetch_max(size, Ordering::SeqCst);
            }
            _ => {}
        }
        Ok(())
    }
}

/// The in-memory store, counting what reaches it (local, as the store itself).
fn counting() -> Arc<Wrapped<Counts>> {
    Arc::new(Wrapped::new(Counts::default()).local())
}

static TREES: AtomicU32 = AtomicU32::new(0);

/// The tests count runs of the same tools: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Stores a tree of JSON.
#[tool(retry = "keyed")]
async fn save_tree(tree: Value) -> Result<u32, Never> {
    drop_flat(tree);
    Ok(TREES.fetch_add(1, Ordering::SeqCst) + 1)
}

static NOTES: AtomicU32 = AtomicU32::new(0);

/// The tree is not part of the intent, but the tool still receives it.
#[tool(retry = "keyed")]
async fn annotate(note: String, #[idem(skip)] tree: Value) -> Result<u32, Never> {
    let _ = note;
    drop_flat(tree);
    Ok(NOTES.fetch_add(1, Ordering::SeqCst) + 1)
}

/// Runs `f` on a fresh thread with a 2 MiB stack and a current-thread runtime.
fn on_small_stack<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let thread = std::thread::Builder::new().stack_size(2 << 20).spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build();
        rt.expect("runtime").block_on(f());
    });
    thread.expect("thread").join().expect("the test thread panicked or overflowed");
}

fn executor() -> (Arc<Wrapped<Counts>>, Idem) {
    let store = counting();
    let idem = Idem::builder_shared(Arc::clone(&store) as Arc<dyn Store>).build();
    (store, idem)
}

/// The path of a `TooDeep` refusal.
fn too_deep<O: std::fmt::Debug>(r: Result<O, Error<Never>>) -> String {
    match r {
        Err(Error::InvalidArguments { source: KeyError::TooDeep { path, limit }, .. }) => {
            assert_eq!(limit, MAX_DEPTH);
            path
        }
        other => panic!("expected InvalidArguments(TooDeep), got {other:?}"),
    }
}

// The arguments object is one level, so the tree may nest MAX_DEPTH - 1 levels.
const AT: usize = MAX_DEPTH - 1;

#[test]
fn typed_call_at_the_depth_limit_runs_once() {
    let _serial = serial();
    on_small_stack(|| async {
        let (store, idem) = executor();
        let run = idem.run("typed-at");
        let before = TREES.load(Ordering::SeqCst);
        assert!(save_tree(&run, nested_arrays(AT, json!(1))).await.is_ok());
        assert!(save_tree(&run, nested_arrays(AT, json!(1))).await.is_ok());
        assert_eq!(TREES.load(Ordering::SeqCst) - before, 1, "the repeat is a replay");
        assert_eq!(store.hook.claims.load(Ordering::SeqCst), 2);
        assert_eq!(store.hook.completes.load(Ordering::SeqCst), 1);
    });
}

#[test]
fn typed_call_past_the_depth_limit_is_refused_before_the_claim() {
    let _serial = serial();
    for depth in [AT + 1, 100_000] {
        on_small_stack(move || async move {
            let (store, idem) = executor();
            let run = idem.run("typed-past");
            let before = TREES.load(Ordering::SeqCst);
            let path = too_deep(save_tree(&run, nested_arrays(depth, json!(1))).await);
            assert!(path.starts_with("tree[0][0][0]"), "{path}");
            assert!(path.ends_with("levels)"), "the path is shortened: {path}");
            assert_eq!(TREES.load(Ordering::SeqCst), before, "the body never ran");
            assert_eq!(store.hook.claims.load(Ordering::SeqCst), 0, "nothing was claimed");
            assert_eq!(store.hook.completes.load(Ordering::SeqCst), 0);
        });
    }
}

#[test]
fn a_skipped_parameter_is_held_to_the_same_limit() {
    let _serial = serial();
    on_small_stack(|| async {
        let (store, idem) = executor();
        let run = idem.run("skip");
        let before = NOTES.load(Ordering::SeqCst);
        assert!(annotate(&run, "n".into(), nested_arrays(AT, json!(1))).await.is_ok());
        for depth in [AT + 1, 100_000] {
            let path = too_deep(annotate(&run, "n".into(), nested_arrays(depth, json!(1))).await);
            assert!(path.starts_with("tree[0]"), "{path}");
        }
        assert_eq!(NOTES.load(Ordering::SeqCst) - before, 1);
        assert_eq!(store.hook.claims.load(Ordering::SeqCst), 1);
    });
}

fn tool_set() -> ToolSet {
    ToolSet::new().with(SaveTreeTool).expect("a valid tool")
}

/// `{"tree": <depth nested arrays around 2>}`, built without recursion.
fn deep_args(depth: usize) -> Value {
    let mut args = serde_json::Map::new();
    args.insert("tree".into(), nested_arrays(depth, json!(2)));
    Value::Object(args)
}

/// `members` as a JSON object, moved in (no recursive copy of deep values).
fn object(members: Vec<(&str, Value)>) -> Value {
    Value::Object(members.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

/// Every way a model's parsed arguments come in, with `deep_args(depth)` as the arguments.
async fn every_entry_point(tools: &ToolSet, run: &idem_core::Run, depth: usize) -> Vec<Value> {
    let args = deep_args(depth);
    let direct = tools.call(run, "save_tree", &args).await;
    drop_flat(args);
    let mut out = vec![json!({"text": direct.text, "is_error": direct.is_error})];
    let function = object(vec![("name", json!("save_tree")), ("arguments", deep_args(depth))]);
    let openai =
        object(vec![("id", json!("c1")), ("type", json!("function")), ("function", function)]);
    out.push(tools.call_openai(run, &openai).await);
    drop_flat(openai);
    let anthropic = object(vec![
        ("type", json!("tool_use")),
        ("id", json!("t1")),
        ("name", json!("save_tree")),
        ("input", deep_args(depth)),
    ]);
    out.push(tools.call_anthropic(run, &anthropic).await);
    drop_flat(anthropic);
    let mcp = object(vec![("name", json!("save_tree")), ("arguments", deep_args(depth))]);
    out.push(tools.call_mcp(run, &mcp).await.unwrap_or_else(|e| e.to_json()));
    drop_flat(mcp);
    let responses = object(vec![
        ("type", json!("function_call")),
        ("call_id", json!("r1")),
        ("name", json!("save_tree")),
        ("arguments", deep_args(depth)),
    ]);
    out.push(tools.call_openai_responses(run, &responses).await);
    drop_flat(responses);
    let call = object(vec![("name", json!("save_tree")), ("args", deep_args(depth))]);
    let gemini = object(vec![("functionCall", call)]);
    out.push(tools.call_gemini(run, &gemini).await);
    drop_flat(gemini);
    out
}

#[test]
fn tool_set_entry_points_at_the_depth_limit_run_once() {
    let _serial = serial();
    on_small_stack(|| async {
        let (store, idem) = executor();
        let run = idem.run("set-at");
        let before = TREES.load(Ordering::SeqCst);
        let results = every_entry_point(&tool_set(), &run, AT).await;
        for r in &results {
            let text = r.to_string();
            let failed = ["\"is_error\":true", "\"isError\":true", "Error ("];
            assert!(!failed.iter().any(|f| text.contains(f)), "{text}");
        }
        assert_eq!(results.len(), 6);
        assert_eq!(TREES.load(Ordering::SeqCst) - before, 1, "one run, five replays");
        assert_eq!(store.hook.claims.load(Ordering::SeqCst), 6);
    });
}

#[test]
fn tool_set_entry_points_past_the_depth_limit_are_refused_before_the_claim() {
    let _serial = serial();
    for depth in [AT + 1, 100_000] {
        on_small_stack(move || async move {
            let (store, idem) = executor();
            let run = idem.run("set-past");
            let before = TREES.load(Ordering::SeqCst);
            let results = every_entry_point(&tool_set(), &run, depth).await;
            for r in &results {
                let text = r.to_string();
                assert!(text.contains("invalid_arguments"), "{text}");
                assert!(text.contains("argument `tree[0][0]"), "{text}");
                assert!(text.contains("more than 127 levels deep"), "{text}");
                assert!(text.contains("nothing was executed"), "{text}");
            }
            assert_eq!(TREES.load(Ordering::SeqCst), before, "the body never ran");
            assert_eq!(store.hook.claims.load(Ordering::SeqCst), 0, "nothing was claimed");
        });
    }
}

#[test]
fn openai_argument_text_has_the_same_limit() {
    let _serial = serial();
    on_small_stack(|| async {
        let (store, idem) = executor();
        let run = idem.run("text");
        let tools = tool_set();
        let text =
            |depth: usize| format!("{{\"tree\":{}1{}}}", "[".repeat(depth), "]".repeat(depth));
        let call = |args: String| {
            json!({"id": "c1", "type": "function",
                   "function": {"name": "save_tree", "arguments": args}})
        };
        let before = TREES.load(Ordering::SeqCst);
        let at = tools.call_openai(&run, &call(text(AT))).await;
        assert!(!at["content"].as_str().unwrap_or_default().starts_with("Error"), "{at}");
        for depth in [AT + 1, 100_000] {
            let past = tools.call_openai(&run, &call(text(depth))).await;
            let content = past["content"].as_str().unwrap_or_default();
            assert!(content.starts_with("Error (invalid_arguments)"), "{content}");
            assert!(content.contains("at most 127 levels deep"), "{content}");
        }
        assert_eq!(TREES.load(Ordering::SeqCst) - before, 1);
        assert_eq!(store.hook.claims.load(Ordering::SeqCst), 1);
    });
}

#[test]
fn arguments_larger_than_the_policy_are_refused_before_the_claim() {
    let _serial = serial();
    on_small_stack(|| async {
        let store = counting();
        let policy = Policy { max_argument_bytes: 1024, ..Policy::default() };
        let idem =
            Idem::builder_shared(Arc::clone(&store) as Arc<dyn Store>).policy(policy).build();
        let run = idem.run("size");
        let before = TREES.load(Ordering::SeqCst);
        // {"tree":"xx..."}: 11 bytes of framing.
        assert!(save_tree(&run, json!("x".repeat(1024 - 11))).await.is_ok());
        match save_tree(&run, json!("x".repeat(1024 - 10))).await {
            Err(Error::InvalidArguments { source: KeyError::TooLarge { size, limit }, .. }) => {
                assert_eq!((size, limit), (1025, 1024));
            }
            other => panic!("expected InvalidArguments(TooLarge), got {other:?}"),
        }
        assert_eq!(TREES.load(Ordering::SeqCst) - before, 1);
        assert_eq!(store.hook.claims.load(Ordering::SeqCst), 1, "the large call claimed nothing");

        // The default is 1 MiB, and the message says both numbers.
        let (store, idem) = executor();
        let err = save_tree(&idem.run("size"), json!("x".repeat(2 << 20))).await;
        // The cause is the error's source (each cause is given once, not also in the message).
        let message = err
            .err()
            .and_then(|e| std::error::Error::source(&e).map(ToString::to_string))
            .unwrap_or_default();
        assert!(message.contains("2097163 bytes"), "{message}");
        assert!(message.contains("limit of 1048576 bytes"), "{message}");
        assert_eq!(store.hook.claims.load(Ordering::SeqCst), 0);
    });
}

// Outputs and stored outcomes.

static GROWN: AtomicU32 = AtomicU32::new(0);

/// Answers with a tree `depth` levels deep: the output is as deep as the caller asks.
#[tool(retry = "keyed")]
async fn grow(depth: usize) -> Result<Value, Never> {
    GROWN.fetch_add(1, Ordering::SeqCst);
    Ok(nested_arrays(depth, json!("leaf")))
}

static BIG: AtomicU32 = AtomicU32::new(0);

/// Answers with `bytes` bytes of text.
#[tool(retry = "keyed")]
async fn big(bytes: usize) -> Result<String, Never> {
    BIG.fetch_add(1, Ordering::SeqCst);
    Ok("x".repeat(bytes))
}

#[test]
fn an_output_at_the_depth_limit_is_stored_and_replayed() {
    let _serial = serial();
    on_small_stack(|| async {
        let (store, idem) = executor();
        let run = idem.run("out-at");
        let before = GROWN.load(Ordering::SeqCst);
        let first = grow(&run, MAX_DEPTH).await;
        let again = grow(&run, MAX_DEPTH).await;
        assert!(matches!((&first, &again), (Ok(a), Ok(b)) if a == b));
        assert_eq!(GROWN.load(Ordering::SeqCst) - before, 1, "the repeat is a replay");
        assert_eq!(store.hook.completes.load(Ordering::SeqCst), 1);
        // And through a tool set, which turns the output into JSON for the model.
        let tools = ToolSet::new().with(GrowTool).expect("a valid tool");
        let result = tools.call(&run, "grow", &json!({ "depth": MAX_DEPTH })).await;
        assert!(!result.is_error, "{}", result.text);
        for v in [first.ok(), again.ok(), Some(result.content)].into_iter().flatten() {
            drop_flat(v);
        }
    });
}

#[test]
fn an_output_past_the_depth_limit_ran_once_and_the_record_says_so() {
    let _serial = serial();
    for depth in [MAX_DEPTH + 1, 100_000] {
        on_small_stack(move || async move {
            let (store, idem) = executor();
            let run = idem.run("out-past");
            let before = GROWN.load(Ordering::SeqCst);
            match grow(&run, depth).await {
                Err(Error::OutputNotStorable { reason, .. }) => {
                    assert!(reason.contains("the tool ran, but its output could not be stored"));
                    assert!(reason.contains("more than 127 levels deep"), "{reason}");
                }
                other => panic!("expected the output to be refused, got {other:?}"),
            }
            assert_eq!(GROWN.load(Ordering::SeqCst) - before, 1, "the effect happened once");
            // Only the short record that the output could not be stored.
            assert_eq!(store.hook.completes.load(Ordering::SeqCst), 1);
            assert!(store.hook.largest_outcome.load(Ordering::SeqCst) < 1000);
            // A repeat hears it and runs nothing.
            let again = grow(&run, depth).await;
            assert!(matches!(again, Err(Error::OutputNotStorable { .. })), "{again:?}");
            assert_eq!(GROWN.load(Ordering::SeqCst) - before, 1, "nothing ran again");
            // A tool set answers the model instead of overflowing while writing JSON.
            let tools = ToolSet::new().with(GrowTool).expect("a valid tool");
            let result =
                tools.call(&idem.run("out-past-2"), "grow", &json!({ "depth": depth })).await;
            assert!(
                result.is_error && result.text.contains("could not be stored"),
                "{}",
                result.text
            );
            assert_eq!(store.hook.completes.load(Ordering::SeqCst), 2);
        });
    }
}

#[test]
fn an_outcome_larger_than_the_policy_never_reaches_the_store() {
    let _serial = serial();
    on_small_stack(|| async {
        // 64 MB: what must never be written to a shared Redis (the default limit is 4 MiB).
        let (store, idem) = executor();
        let before = BIG.load(Ordering::SeqCst);
        let run = idem.run("big");
        // This caller has the output; the store gets only the record that it was not stored.
        let first = big(&run, 64 << 20).await;
        assert_eq!(first.map(|s| s.len()).ok(), Some(64 << 20));
        assert_eq!(store.hook.completes.load(Ordering::SeqCst), 1);
        let largest = store.hook.largest_outcome.load(Ordering::SeqCst);
        assert!(largest < 1000, "{largest} bytes reached the store");
        match big(&run, 64 << 20).await {
            Err(Error::OutputNotStorable { reason, .. }) => {
                assert!(reason.contains("67108866 bytes"), "{reason}");
                assert!(reason.contains("limit of 4194304 bytes"), "{reason}");
            }
            other => panic!("expected the stored refusal, got {:?}", other.map(|s| s.len())),
        }
        assert_eq!(BIG.load(Ordering::SeqCst) - before, 1, "the effect happened once");

        // At the limit exactly it is stored: `"` + bytes + `"`.
        let store = counting();
        let policy = Policy { max_outcome_bytes: 1000, ..Policy::default() };
        let idem =
            Idem::builder_shared(Arc::clone(&store) as Arc<dyn Store>).policy(policy).build();
        assert!(big(&idem.run("small"), 998).await.is_ok());
        assert!(big(&idem.run("small"), 999).await.is_ok());
        assert!(matches!(big(&idem.run("small"), 999).await, Err(Error::OutputNotStorable { .. })));
        assert_eq!(store.hook.largest_outcome.load(Ordering::SeqCst), 1000);
        assert_eq!(store.hook.completes.load(Ordering::SeqCst), 2);
    });
}

#[test]
fn a_stored_outcome_deeper_than_the_limit_is_a_replay_failure() {
    let _serial = serial();
    on_small_stack(|| async {
        for depth in [MAX_DEPTH + 1, 100_000] {
            // A record planted in the store (another version, or tampering): decoding it must
            // stop at the limit, not overflow.
            let (store, idem) = executor();
            let run = idem.run("planted");
            let canonical = br#"{"depth":3}"#;
            let key = idem_core::key::derive_key(run.scope(), "grow", canonical);
            let fp = idem_core::Fingerprint::of_derived_key(&key);
            let req = ClaimRequest {
                key: &key,
                fingerprint: &fp,
                lease: Duration::from_secs(30),
                on_expired: idem_core::store::OnExpired::TakeOver,
                origin: Default::default(),
            };
            let Ok(Claim::Acquired { fence, .. }) = store.claim(req).await else { panic!("claim") };
            let text = "[".repeat(depth) + &"]".repeat(depth);
            let planted = Outcome::Success(text);
            let stored = store.complete(&key, fence, &planted, Duration::from_secs(60)).await;
            assert!(stored.is_ok());
            let before = GROWN.load(Ordering::SeqCst);
            match grow(&run, 3).await {
                Err(Error::ReplayFailed { reason, .. }) => {
                    assert!(reason.contains("recursion limit exceeded"), "{reason}")
                }
                other => panic!("expected ReplayFailed, got {other:?}"),
            }
            assert_eq!(GROWN.load(Ordering::SeqCst), before, "nothing ran again");
        }
    });
}

// Tool errors.

/// A provider's error carrying the provider's own body, as deep as the provider made it; dropped
/// without recursion (its owner's business), written by serde like any error.
#[derive(Serialize, Deserialize)]
struct DeepError {
    body: Value,
    permanent: bool,
}

impl Drop for DeepError {
    fn drop(&mut self) {
        drop_flat(std::mem::take(&mut self.body));
    }
}

impl std::fmt::Debug for DeepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeepError")
    }
}

impl std::fmt::Display for DeepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the provider refused the request")
    }
}

impl Classify for DeepError {
    fn classify(&self) -> Failure {
        if self.permanent {
            Failure::permanent()
        } else {
            // Rate limited past the call's deadline: no retry, the budget says why.
            Failure::transient().retry_after(Duration::from_secs(3600))
        }
    }
}

static REFUSED: AtomicU32 = AtomicU32::new(0);

/// Fails with a body `depth` levels deep.
#[tool(retry = "keyed", deadline = "60s")]
async fn refuse(depth: usize, permanent: bool) -> Result<u32, DeepError> {
    REFUSED.fetch_add(1, Ordering::SeqCst);
    Err(DeepError { body: nested_arrays(depth, json!("why")), permanent })
}

/// A tool's error nested past the limit reaches the model as its message, without the error as
/// JSON (which no one may write), whether the error ended the call or its last attempt before the
/// retry budget or deadline did: the process does not overflow its stack writing it.
#[test]
fn a_tool_error_past_the_depth_limit_reaches_the_model_without_its_json() {
    let _serial = serial();
    for depth in [MAX_DEPTH + 1, 100_000] {
        on_small_stack(move || async move {
            let (_store, idem) = executor();
            let set = ToolSet::new().with(RefuseTool).expect("a valid tool");
            for (permanent, kind) in [(true, "tool_error"), (false, "budget_exhausted")] {
                let run = idem.run(format!("refused-{depth}-{permanent}"));
                let before = REFUSED.load(Ordering::SeqCst);
                let args = json!({"depth": depth, "permanent": permanent});
                let r = set.call(&run, "refuse", &args).await;
                assert_eq!(REFUSED.load(Ordering::SeqCst) - before, 1, "one attempt");
                assert!(r.is_error, "{}", r.text);
                assert_eq!(r.content["error"]["kind"], kind, "{}", r.text);
                assert!(r.text.contains("the provider refused the request"), "{}", r.text);
                let detail = &r.content["error"]["detail"];
                assert!(detail.get("body").is_none(), "{detail}");
                assert!(detail["tool_error"].get("body").is_none(), "{detail}");
            }
        });
    }
}

/// A tool call's id nested 100,000 levels (a host's call built in code, not parsed) is refused as
/// any id that is not a string is, without overflowing the stack to echo it.
#[test]
fn a_deep_tool_call_id_is_refused_without_overflow() {
    let _serial = serial();
    on_small_stack(|| async {
        let (store, idem) = executor();
        let run = idem.run("deep-id");
        let before = TREES.load(Ordering::SeqCst);
        let block = object(vec![
            ("type", json!("tool_use")),
            ("id", nested_arrays(100_000, json!("id"))),
            ("name", json!("save_tree")),
            ("input", deep_args(1)),
        ]);
        let answer = tool_set().call_anthropic(&run, &block).await;
        drop_flat(block);
        assert_eq!(answer["is_error"], true, "{answer}");
        assert!(answer["content"].as_str().unwrap().contains("not a string"), "{answer}");
        let call = object(vec![
            ("id", nested_arrays(100_000, json!("id"))),
            ("type", json!("function")),
            ("function", object(vec![("name", json!("save_tree")), ("arguments", deep_args(1))])),
        ]);
        let answer = tool_set().call_openai(&run, &call).await;
        drop_flat(call);
        assert!(answer["content"].as_str().unwrap().contains("not a string"), "{answer}");
        assert_eq!(TREES.load(Ordering::SeqCst), before, "nothing ran");
        assert_eq!(store.hook.claims.load(Ordering::SeqCst), 0);
    });
}
