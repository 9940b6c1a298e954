//! Property tests of the storability check (`docs/design.md` §6.4) through the executor: an
//! output either replays byte for byte (its JSON after the replay is the first caller's) or is
//! refused with `OutputNotStorable`, and the tool runs once either way. Random `serde_json`
//! values, and hand-written `Serialize` impls that repeat a member or write what no JSON reader
//! keeps (integers past 64 bits, nesting past the limit). Then the same through every front door
//! of a tool set: each answers a replay exactly as it answered the first call.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use idem_core::{Error, Idem, MemoryStore, Run, ToolSet, tool};
use idem_tests::Never;
use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Value, json};

#[path = "shared/json_values.rs"]
mod json_values;
use json_values::json_value;

/// The output each case's tool returns, and how often each case's tool ran.
static OUTPUTS: Mutex<BTreeMap<u64, Value>> = Mutex::new(BTreeMap::new());
static RUNS: Mutex<BTreeMap<u64, u32>> = Mutex::new(BTreeMap::new());
static CASE: AtomicU64 = AtomicU64::new(0);

#[tool(retry = "keyed")]
async fn emit(case: u64) -> Result<Value, Never> {
    *RUNS.lock().unwrap().entry(case).or_default() += 1;
    Ok(OUTPUTS.lock().unwrap()[&case].clone())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap()
}

/// Runs the tool for `value` twice: the first call returns it; the second replays it byte for
/// byte, or (only when `may_refuse`) is refused. The tool runs once.
fn first_then_replay(value: Value, may_refuse: bool) {
    let case = CASE.fetch_add(1, Ordering::SeqCst);
    OUTPUTS.lock().unwrap().insert(case, value.clone());
    runtime().block_on(async {
        let run = Idem::builder(MemoryStore::new()).build().run("props");
        let first = emit(&run, case).await.expect("the first caller gets its output");
        assert_eq!(serde_json::to_string(&first).unwrap(), serde_json::to_string(&value).unwrap());
        match emit(&run, case).await {
            Ok(again) => assert_eq!(
                serde_json::to_string(&again).unwrap(),
                serde_json::to_string(&value).unwrap(),
                "a replay is byte-identical"
            ),
            Err(Error::OutputNotStorable { reason, .. }) if may_refuse => {
                assert!(!reason.is_empty())
            }
            Err(e) => panic!("{value}: expected a replay, got {e:?}"),
        }
    });
    assert_eq!(RUNS.lock().unwrap()[&case], 1, "ran once");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Every `serde_json::Value` (finite numbers, any strings) replays byte for byte.
    #[test]
    fn any_json_value_replays_byte_for_byte(value in json_value()) {
        first_then_replay(value, false);
    }
}

/// Nesting at the depth limit replays; deeper is refused to every caller, the first included
/// (`docs/design.md` §6.4), with a reason that speaks of the output, and the tool runs once.
#[test]
fn nesting_at_and_past_the_limit() {
    let nested = |depth: usize| {
        let mut v = Value::from(1);
        for _ in 0..depth {
            v = Value::Array(vec![v]);
        }
        v
    };
    first_then_replay(nested(idem_core::limits::MAX_DEPTH), false);
    for depth in [idem_core::limits::MAX_DEPTH + 1, 200] {
        let case = CASE.fetch_add(1, Ordering::SeqCst);
        OUTPUTS.lock().unwrap().insert(case, nested(depth));
        runtime().block_on(async {
            let run = Idem::builder(MemoryStore::new()).build().run("deep");
            for caller in ["first", "later"] {
                match emit(&run, case).await {
                    Err(Error::OutputNotStorable { reason, .. }) => {
                        assert!(reason.contains("of the output"), "{caller}: {reason}");
                        assert!(!reason.contains("argument"), "{caller}: {reason}");
                    }
                    other => panic!("{caller} caller at depth {depth}: {other:?}"),
                }
            }
        });
        assert_eq!(RUNS.lock().unwrap()[&case], 1, "ran once at depth {depth}");
    }
}

/// An output past `Policy::max_outcome_bytes`: the first caller gets it, later callers
/// `OutputNotStorable`, and the tool runs once.
#[test]
fn output_past_the_size_limit() {
    let case = CASE.fetch_add(1, Ordering::SeqCst);
    let big = Value::from("x".repeat(100));
    OUTPUTS.lock().unwrap().insert(case, big.clone());
    runtime().block_on(async {
        let policy = idem_core::Policy { max_outcome_bytes: 16, ..idem_core::Policy::default() };
        let run = Idem::builder(MemoryStore::new()).policy(policy).build().run("big");
        assert_eq!(emit(&run, case).await.expect("the first caller gets its output"), big);
        match emit(&run, case).await {
            Err(Error::OutputNotStorable { reason, .. }) => assert!(reason.contains("16 bytes")),
            other => panic!("a later caller: {other:?}"),
        }
    });
    assert_eq!(RUNS.lock().unwrap()[&case], 1, "ran once");
}

static TYPED: Mutex<BTreeMap<&'static str, u32>> = Mutex::new(BTreeMap::new());

/// A map that writes one member twice, with different values; read back, the last one wins.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(transparent)]
struct Repeats(HashMap<String, u32>);

impl Serialize for Repeats {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("a", &1u32)?;
        m.serialize_entry("a", &2u32)?;
        m.end()
    }
}

#[tool(retry = "keyed")]
async fn repeats(n: u32) -> Result<Repeats, Never> {
    *TYPED.lock().unwrap().entry("repeats").or_default() += 1;
    Ok(Repeats(HashMap::from([("a".to_owned(), n)])))
}

#[tool(retry = "keyed")]
async fn wide(n: u32) -> Result<(u128, i128), Never> {
    *TYPED.lock().unwrap().entry("wide").or_default() += 1;
    Ok((u128::MAX - u128::from(n), i128::MIN))
}

/// The first caller's output as JSON, and the second call's answer as JSON or its refusal.
async fn twice<T, F, Fut>(call: F) -> (String, Result<String, String>)
where
    T: Serialize + DeserializeOwned,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error<Never>>>,
{
    let first = serde_json::to_string(&call().await.expect("first caller")).unwrap();
    let second = match call().await {
        Ok(v) => Ok(serde_json::to_string(&v).unwrap()),
        Err(Error::OutputNotStorable { reason, .. }) => Err(reason),
        Err(e) => panic!("expected a replay or OutputNotStorable, got {e:?}"),
    };
    (first, second)
}

/// A repeated member is either refused or replayed as the first caller's JSON, never as another
/// value; integers past 64 bits replay exactly.
#[test]
fn custom_serialize_outputs() {
    runtime().block_on(async {
        let run = Idem::builder(MemoryStore::new()).build().run("typed");
        let (first, second) = twice(|| repeats(&run, 7)).await;
        if let Ok(second) = second {
            assert_eq!(second, first, "a repeated member replays as written");
        }
        let (first, second) = twice(|| wide(&run, 3)).await;
        assert_eq!(second.expect("128-bit integers replay"), first);
    });
    assert_eq!(TYPED.lock().unwrap()["repeats"], 1);
    assert_eq!(TYPED.lock().unwrap()["wide"], 1);
}

/// A struct whose flattened map repeats one of its own fields: `{"x":1,"x":2}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Flat {
    x: u32,
    #[serde(flatten)]
    rest: BTreeMap<String, u32>,
}

#[tool(retry = "keyed")]
async fn flat(n: u32) -> Result<Flat, Never> {
    *TYPED.lock().unwrap().entry("flat").or_default() += 1;
    Ok(Flat { x: n, rest: BTreeMap::from([("x".to_owned(), n + 1)]) })
}

static SCALARS: Mutex<BTreeMap<String, u32>> = Mutex::new(BTreeMap::new());

#[tool(retry = "keyed")]
async fn scalars(
    tag: String,
    a: f32,
    b: i128,
    c: u128,
    d: char,
) -> Result<(f32, i128, u128, char), Never> {
    *SCALARS.lock().unwrap().entry(tag).or_default() += 1;
    Ok((a, b, c, d))
}

/// A flattened member that repeats a field: refused, with a reason that names the output.
#[test]
fn flattened_member_repeating_a_field() {
    runtime().block_on(async {
        let run = Idem::builder(MemoryStore::new()).build().run("flat");
        let (first, second) = twice(|| flat(&run, 4)).await;
        assert_eq!(first, r#"{"x":4,"x":5}"#);
        let reason = second.expect_err("only one of the two would read back");
        assert!(reason.contains("`x` of the output appears twice"), "{reason}");
    });
    assert_eq!(TYPED.lock().unwrap()["flat"], 1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Finite f32s, 128-bit integers and chars replay byte for byte.
    #[test]
    fn scalars_replay_byte_for_byte(
        a in any::<f32>().prop_filter("finite", |f| f.is_finite()),
        b in any::<i128>(), c in any::<u128>(), d in any::<char>(),
    ) {
        let tag = format!("{}", CASE.fetch_add(1, Ordering::SeqCst));
        runtime().block_on(async {
            let run = Idem::builder(MemoryStore::new()).build().run("scalars");
            let (first, second) = twice(|| scalars(&run, tag.clone(), a, b, c, d)).await;
            assert_eq!(second.expect("replays"), first);
        });
        prop_assert_eq!(SCALARS.lock().unwrap()[&tag], 1);
    }
}

/// A `Serialize` that fails: the first caller gets its output, later callers the refusal.
#[derive(Debug, Clone, PartialEq, Deserialize)]
struct Fails(u32);

impl Serialize for Fails {
    fn serialize<S: Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("no JSON today"))
    }
}

#[tool(retry = "keyed")]
async fn fails(n: u32) -> Result<Fails, Never> {
    *TYPED.lock().unwrap().entry("fails").or_default() += 1;
    Ok(Fails(n))
}

#[test]
fn serialize_that_fails() {
    runtime().block_on(async {
        let run = Idem::builder(MemoryStore::new()).build().run("fails");
        assert_eq!(fails(&run, 5).await.expect("the first caller gets its output"), Fails(5));
        match fails(&run, 5).await {
            Err(Error::OutputNotStorable { reason, .. }) => {
                assert!(reason.contains("cannot be serialized as JSON"), "{reason}");
                assert!(reason.contains("no JSON today"), "{reason}");
                assert!(!reason.contains("argument"), "{reason}");
            }
            other => panic!("a later caller: {other:?}"),
        }
    });
    assert_eq!(TYPED.lock().unwrap()["fails"], 1);
}

/// What each front door of a tool set answers for one call of `tool` with `args`, with the
/// outcome a replay reports in place of a first call's (MCP's `_meta["idem/outcome"]`).
async fn through_door(set: &ToolSet, run: &Run, door: usize, tool: &str, args: &Value) -> String {
    let text = args.to_string();
    let answer = match door {
        0 => {
            let r = set.call(run, tool, args).await;
            json!({"text": r.text, "is_error": r.is_error, "mcp": r.to_mcp()})
        }
        1 => set.call_mcp(run, &json!({"name": tool, "arguments": args})).await.unwrap(),
        2 => {
            let call = json!({"id": "c1", "type": "function",
                "function": {"name": tool, "arguments": text}});
            set.call_openai(run, &call).await
        }
        3 => {
            let block = json!({"type": "tool_use", "id": "t1", "name": tool, "input": args});
            set.call_anthropic(run, &block).await
        }
        4 => {
            let item = json!({"type": "function_call", "call_id": "c2", "name": tool,
                "arguments": text});
            set.call_openai_responses(run, &item).await
        }
        _ => set.call_gemini(run, &json!({"functionCall": {"name": tool, "args": args}})).await,
    };
    answer.to_string().replace(r#""idem/outcome":"executed""#, r#""idem/outcome":"replayed""#)
}

const DOORS: usize = 6;

/// Each front door, on a run of its own, answers a replay of `tool` exactly as it answered the
/// first call (byte for byte, members in the same order); returns the first answers.
async fn every_door_replays_as_first(set: &ToolSet, tool: &str, args: &Value) -> Vec<String> {
    let idem = Idem::in_memory();
    let mut firsts = Vec::new();
    for door in 0..DOORS {
        let run = idem.run(format!("door-{door}"));
        let first = through_door(set, &run, door, tool, args).await;
        let again = through_door(set, &run, door, tool, args).await;
        assert_eq!(again, first, "door {door}: a replay answers as the first call did");
        firsts.push(first);
    }
    firsts
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// Every front door (the tool set's own call, MCP, OpenAI chat and Responses, Anthropic,
    /// Gemini) answers a replay of any `serde_json::Value` output byte for byte as its first call.
    #[test]
    fn every_front_door_replays_any_json_value_as_first_answered(value in json_value()) {
        let case = CASE.fetch_add(1, Ordering::SeqCst);
        OUTPUTS.lock().unwrap().insert(case, value);
        runtime().block_on(async {
            let set = ToolSet::new().with(EmitTool).unwrap();
            every_door_replays_as_first(&set, "emit", &json!({"case": case})).await;
        });
        prop_assert_eq!(RUNS.lock().unwrap()[&case], DOORS as u32, "once per door's run");
    }
}

/// How often the tools below ran (their own counter: the other tests call `wide` too).
static DOOR_RUNS: Mutex<BTreeMap<&'static str, u32>> = Mutex::new(BTreeMap::new());

#[tool(retry = "keyed")]
async fn stock(shelf: u32) -> Result<HashMap<String, u32>, Never> {
    *DOOR_RUNS.lock().unwrap().entry("stock").or_default() += 1;
    Ok((0..32).map(|i| (format!("item{i:02}"), shelf + i)).collect())
}

#[tool(retry = "keyed")]
async fn wide_pair(n: u32) -> Result<(u128, i128), Never> {
    *DOOR_RUNS.lock().unwrap().entry("wide_pair").or_default() += 1;
    Ok((u128::MAX - u128::from(n), i128::MIN))
}

/// Outputs whose answer a replay could change: a `HashMap` (read back, it lists its members in
/// another order) and integers past 64 bits (which a `Value` cannot hold).
#[test]
fn every_front_door_replays_maps_and_wide_integers_as_first_answered() {
    runtime().block_on(async {
        let set = ToolSet::new().with(StockTool).unwrap().with(WidePairTool).unwrap();
        let firsts = every_door_replays_as_first(&set, "stock", &json!({"shelf": 100})).await;
        assert!(firsts[1].contains(r#""structuredContent":{"item00":100,"item01":101,"#));
        let firsts = every_door_replays_as_first(&set, "wide_pair", &json!({"n": 1})).await;
        let max = (u128::MAX - 1).to_string();
        assert!(firsts.iter().all(|answer| answer.contains(&max)), "{firsts:?}");
    });
    let runs = DOOR_RUNS.lock().unwrap();
    assert_eq!((runs["stock"], runs["wide_pair"]), (DOORS as u32, DOORS as u32), "once per run");
}

#[tool(retry = "keyed")]
async fn decline(card: u32) -> Result<u32, Never> {
    *DOOR_RUNS.lock().unwrap().entry("decline").or_default() += 1;
    let _ = card;
    Err(Never)
}

/// A permanent failure is stored and replayed: every front door answers the repeat with the
/// error it gave first (same kind, message, detail and `retryable`).
#[test]
fn every_front_door_replays_a_stored_failure_as_first_answered() {
    runtime().block_on(async {
        let set = ToolSet::new().with(DeclineTool).unwrap();
        let firsts = every_door_replays_as_first(&set, "decline", &json!({"card": 7})).await;
        assert!(firsts.iter().all(|answer| answer.contains("never fails")), "{firsts:?}");
    });
    assert_eq!(DOOR_RUNS.lock().unwrap()["decline"], DOORS as u32, "once per run");
}
