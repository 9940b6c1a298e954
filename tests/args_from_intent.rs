//! A retry's arguments read back from the intent (`Tool::ARGS_FROM_INTENT`): no attempt copies
//! the arguments first, every attempt gets arguments equal to the caller's, and a tool whose
//! arguments do not read back as written is not retried with other ones.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Mutex;

use idem_core::{
    Classify, Ctx, Error, Failure, Idem, NoError, RetryClass, Tool, ToolDef, ToolOptions, tool,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

thread_local! {
    /// Copies of `Order` made on this thread (each test's runtime runs on its own thread).
    static CLONES: Cell<usize> = const { Cell::new(0) };
}

#[derive(Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Order {
    customer: String,
    cents: u64,
    tags: Vec<String>,
    meta: BTreeMap<String, String>,
    note: Option<String>,
}

impl Clone for Order {
    fn clone(&self) -> Self {
        CLONES.with(|c| c.set(c.get() + 1));
        Order {
            customer: self.customer.clone(),
            cents: self.cents,
            tags: self.tags.clone(),
            meta: self.meta.clone(),
            note: self.note.clone(),
        }
    }
}

fn order() -> Order {
    Order {
        customer: "cus_\u{e9}\"1\"".into(),
        cents: u64::MAX,
        tags: vec!["b".into(), "a".into()],
        meta: BTreeMap::from([("z".into(), "1".into()), ("\u{1f600}".into(), "2".into())]),
        note: None,
    }
}

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
#[error("provider busy")]
struct Busy;

impl Classify for Busy {
    fn classify(&self) -> Failure {
        Failure::transient()
    }
}

static DEF: ToolDef = ToolDef {
    name: "place_order",
    description: "Places an order.",
    class: RetryClass::Keyed,
    options: ToolOptions::NONE,
};

/// Fails its first `failures` attempts, keeping the arguments each attempt got.
struct Flaky<A, const FROM_INTENT: bool> {
    failures: usize,
    seen: Mutex<Vec<A>>,
}

impl<A, const FROM_INTENT: bool> Flaky<A, FROM_INTENT> {
    fn new(failures: usize) -> Self {
        Flaky { failures, seen: Mutex::new(Vec::new()) }
    }

    fn runs(&self) -> usize {
        self.seen.lock().expect("lock").len()
    }
}

impl<A, const FROM_INTENT: bool> Tool for Flaky<A, FROM_INTENT>
where
    A: Serialize + serde::de::DeserializeOwned + JsonSchema + Clone + Send + Sync + 'static,
{
    type Args = A;
    type Output = usize;
    type Error = Busy;
    const ARGS_FROM_INTENT: bool = FROM_INTENT;

    fn def(&self) -> &'static ToolDef {
        &DEF
    }

    async fn run(&self, _cx: &Ctx, args: A) -> Result<usize, Busy> {
        let mut seen = self.seen.lock().expect("lock");
        seen.push(args);
        if seen.len() <= self.failures { Err(Busy) } else { Ok(seen.len()) }
    }
}

#[tokio::test(start_paused = true)]
async fn a_retry_reads_its_arguments_back_instead_of_copying_them() {
    let run = Idem::in_memory().run("orders");
    let tool = Flaky::<Order, true>::new(2);
    let got = run.call(&tool, order()).await;
    assert_eq!(got.expect("the third attempt succeeds"), 3);
    assert_eq!(CLONES.with(Cell::get), 0, "no attempt copied the arguments first");
    {
        let seen = tool.seen.lock().expect("lock");
        assert!(seen.iter().all(|o| *o == order()), "every attempt got the caller's: {seen:?}");
    }

    // The same tool without the declaration: the first two attempts each ran on a copy.
    let run = Idem::in_memory().run("orders");
    let copying = Flaky::<Order, false>::new(2);
    assert_eq!(run.call(&copying, order()).await.expect("succeeds"), 3);
    assert_eq!(CLONES.with(Cell::get), 2);
    assert!(copying.seen.lock().expect("lock").iter().all(|o| *o == order()));
}

/// Written with `lost`, read back without it: a tool that declares `ARGS_FROM_INTENT` for these
/// declares something false.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
struct Lossy {
    kept: String,
    #[serde(skip_deserializing)]
    lost: String,
}

#[tokio::test(start_paused = true)]
async fn arguments_that_read_back_as_others_are_not_retried() {
    let run = Idem::in_memory().run("orders");
    let tool = Flaky::<Lossy, true>::new(usize::MAX);
    let args = || Lossy { kept: "a".into(), lost: "b".into() };
    let got = run.call(&tool, args()).await;
    assert!(
        matches!(got, Err(Error::Tool { error: Busy, .. })),
        "the last attempt's error: {got:?}"
    );
    assert_eq!(tool.runs(), 1, "no retry with arguments other than the caller's");
    assert!(tool.seen.lock().expect("lock")[0].lost == "b");
    // Nothing was stored and the key was released: the next call runs.
    let _ = run.call(&tool, args()).await;
    assert_eq!(tool.runs(), 2);
}

/// Standard types only: `#[tool]` declares that they read back.
#[tool(retry = "keyed")]
async fn standard(
    customer: String,
    cents: u64,
    tags: Vec<String>,
    meta: BTreeMap<String, String>,
    note: Option<String>,
) -> Result<u64, NoError> {
    let _ = (customer, tags, meta, note);
    Ok(cents)
}

#[tool(retry = "keyed")]
async fn with_float(amount: f64) -> Result<u64, NoError> {
    Ok(amount as u64)
}

#[tool(retry = "keyed")]
async fn with_skip(customer: String, #[idem(skip)] trace: String) -> Result<u64, NoError> {
    let _ = (customer, trace);
    Ok(0)
}

#[tool(retry = "keyed")]
async fn with_own_type(order: Order) -> Result<u64, NoError> {
    Ok(order.cents)
}

#[tool(retry = "keyed")]
async fn with_some_null(
    slots: Vec<Option<Option<String>>>,
    marks: Option<()>,
) -> Result<u64, NoError> {
    let _ = (slots, marks);
    Ok(0)
}

#[test]
fn tool_declares_it_for_standard_types_only() {
    const fn declares<T: Tool>(_: &T) -> bool {
        T::ARGS_FROM_INTENT
    }
    assert!(declares(&StandardTool));
    // RFC 8785 writes `-0.0` as `0`, a skipped parameter is not in the intent, and a type of
    // the application's own may read back otherwise.
    assert!(!declares(&WithFloatTool));
    assert!(!declares(&WithSkipTool));
    assert!(!declares(&WithOwnTypeTool));
    // `Some(None)` and `Some(())` are written `null`, and read back as `None`: a retry read its
    // arguments back and ran a "leave it" where the call sent a "clear it".
    assert!(!declares(&WithSomeNullTool));
    let _ = (standard, with_float, with_skip, with_own_type, with_some_null);
}

static SLOT_ATTEMPTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Sets or clears slots (`Some(None)` clears one); busy on its first attempt.
#[tool(retry = "keyed")]
async fn set_slots(slots: Vec<Option<Option<String>>>) -> Result<usize, Busy> {
    let mut seen = SLOT_ATTEMPTS.lock().unwrap();
    seen.push(format!("{slots:?}"));
    if seen.len() == 1 { Err(Busy) } else { Ok(seen.len()) }
}

/// The retry of a call whose slots hold a `Some(None)` ran with that slot read back from the
/// intent as `None`: a "leave" where the call sent a "clear". Both attempts get the caller's.
#[tokio::test(start_paused = true)]
async fn a_retry_gets_the_callers_some_none_not_what_the_intent_reads_back_as() {
    let run = Idem::in_memory().run("r");
    let done = run.call(&SetSlotsTool, SetSlotsArgs::new(vec![Some(None), None])).await;
    assert_eq!(done.unwrap(), 2, "the second attempt answered");
    assert_eq!(*SLOT_ATTEMPTS.lock().unwrap(), ["[Some(None), None]", "[Some(None), None]"]);
}
