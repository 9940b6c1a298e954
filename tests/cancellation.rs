//! Cancellation at every await point. Agent hosts drop calls all the time (a timeout around the
//! agent's turn, a `select!`, a client that went away): a call's future dropped at any poll must
//! leave the key in a state `docs/design.md` allows (§3, "its claim is left to its lease"; §5, a
//! claim dropped mid-flight releases what it acquired).
//!
//! The harness polls a call `n` times, each poll after the call's own wake-up (so real I/O
//! progresses between polls on the network stores, and the paused clock advances on the
//! in-memory one), then drops it, for n = 1, 2, 3, .. until the call completes on its own: on
//! every store, for every retry class, through the typed call and through `ToolSet::call_mcp` and
//! `ToolSet::call_openai`. After each drop it checks:
//!
//! - the tool's effect ran at most once for the dropped call;
//! - a later call of the same intent is answered (bounded: no waiter left hanging) and answers
//!   consistently: a replay of a stored outcome, or a run only when the record was released or its
//!   lease ended; a `never` tool never runs twice, answers "outcome unknown" when its body may
//!   have run, and runs when its body never started (the claim was released);
//! - every repeat after that gives the same answer, and runs nothing;
//! - fences seen by the tool for one intent only increase;
//! - once the record is forgotten, nothing writes it again behind the next caller's back: the
//!   next call runs the tool.
//!
//! Joiners: a duplicate dropped while it waits for the first call does not stop that call, and
//! dropping the first call while duplicates wait lets one of them proceed within the lease.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use idem_core::key::{Scope, derive_key};
use idem_core::store::admin::RecordState;
use idem_core::store::{MemoryStore, Store};
use idem_core::{Classify, Ctx, Error, Failure, Idem, Key, Policy, Reconciled, Run, ToolSet};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::Notify;

/// The tools' errors: `Busy` means nothing happened (transient), `Lost` that the effect may
/// have happened (ambiguous).
#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
enum Declined {
    #[error("busy")]
    Busy,
    #[error("reply lost")]
    Lost,
}

impl Classify for Declined {
    fn classify(&self) -> Failure {
        match self {
            Declined::Busy => Failure::transient(),
            Declined::Lost => Failure::ambiguous(),
        }
    }
}

/// How a body's next run of an intent ends (by default: its effect, then its output).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Step {
    /// Refused before anything happened (transient).
    Busy,
    /// Its effect, then a lost reply (ambiguous).
    EffectThenLost,
}

/// The tools' side effects, by intent (`id`).
#[derive(Default)]
struct Ledger {
    /// Bodies that started (were polled once), by id.
    started: Mutex<HashMap<String, u32>>,
    /// Effects by id: the key and fence each ran under (fence 0: none).
    effects: Mutex<HashMap<String, Vec<(String, u64)>>>,
    /// How the next run of an id ends, when not as usual.
    script: Mutex<HashMap<String, Step>>,
}

#[idem_core::tool_set]
impl Ledger {
    /// Reads (safe).
    #[tool(retry = "safe")]
    async fn look(&self, cx: &Ctx, id: String) -> Result<String, Declined> {
        self.body(cx, &id).await
    }

    /// Pays with the key forwarded (keyed).
    #[tool(retry = "keyed")]
    async fn pay(&self, cx: &Ctx, id: String) -> Result<String, Declined> {
        self.body(cx, &id).await
    }

    /// Ships, once (never).
    #[tool(retry = "never")]
    async fn ship(&self, cx: &Ctx, id: String) -> Result<String, Declined> {
        self.body(cx, &id).await
    }

    /// Ships, once, and can be asked whether it did (never, with a check).
    #[tool(retry = "never", reconcile = shipped)]
    async fn post(&self, cx: &Ctx, id: String) -> Result<String, Declined> {
        self.body(cx, &id).await
    }

    /// The check of `post`: its effect under `key`, looked up with await points of its own.
    async fn shipped(&self, key: &Key, id: String) -> Reconciled<String> {
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(2)).await;
        let effects = self.effects(&id);
        match effects.iter().find(|(k, _)| k == key.as_str()) {
            Some((_, fence)) => Reconciled::Happened(format!("{id}@{fence}")),
            None => Reconciled::NotHappened,
        }
    }
}

impl Ledger {
    /// Several await points before and after the effect; the output names the fence, so a
    /// replay is told from a second run.
    async fn body(&self, cx: &Ctx, id: &str) -> Result<String, Declined> {
        *self.started.lock().unwrap().entry(id.to_owned()).or_default() += 1;
        let step = self.script.lock().unwrap().remove(id);
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(3)).await;
        if step == Some(Step::Busy) {
            return Err(Declined::Busy);
        }
        let fence = cx.fence().map_or(0, |f| f.0);
        self.effects
            .lock()
            .unwrap()
            .entry(id.to_owned())
            .or_default()
            .push((cx.key().to_owned(), fence));
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(3)).await;
        if step == Some(Step::EffectThenLost) {
            return Err(Declined::Lost);
        }
        Ok(format!("{id}@{fence}"))
    }

    fn started(&self, id: &str) -> u32 {
        self.started.lock().unwrap().get(id).copied().unwrap_or(0)
    }

    fn effects(&self, id: &str) -> Vec<(String, u64)> {
        self.effects.lock().unwrap().get(id).cloned().unwrap_or_default()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Class {
    /// `safe`, not cached: no store.
    Safe,
    /// `safe` with `Policy::cache_safe`.
    SafeCached,
    Keyed,
    Never,
    /// `never` with a reconciliation check.
    NeverChecked,
}

impl Class {
    const ALL: [Class; 5] =
        [Class::Safe, Class::SafeCached, Class::Keyed, Class::Never, Class::NeverChecked];

    fn tool(self) -> &'static str {
        match self {
            Class::Safe | Class::SafeCached => "look",
            Class::Keyed => "pay",
            Class::Never => "ship",
            Class::NeverChecked => "post",
        }
    }

    fn uses_store(self) -> bool {
        self != Class::Safe
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Door {
    Typed,
    Mcp,
    OpenAi,
}

impl Door {
    const ALL: [Door; 3] = [Door::Typed, Door::Mcp, Door::OpenAi];
}

/// What a caller got, the same for every front door.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Answer {
    Ok(String),
    Unknown,
    Other(String),
}

fn typed_answer(r: Result<String, Error<Declined>>) -> Answer {
    match r {
        Ok(v) => Answer::Ok(v),
        Err(Error::OutcomeUnknown { .. }) => Answer::Unknown,
        Err(e) => Answer::Other(e.to_string()),
    }
}

/// A tool result's text (MCP `content[0].text`, OpenAI `content`) as an answer.
fn text_answer(text: &str, is_error: bool) -> Answer {
    if text.starts_with("Error (outcome_unknown)") {
        Answer::Unknown
    } else if is_error || text.starts_with("Error (") {
        Answer::Other(text.to_owned())
    } else {
        Answer::Ok(text.to_owned())
    }
}

/// One executor on one store: what every scenario needs.
struct Env {
    name: &'static str,
    store: Arc<dyn Store>,
    ledger: Arc<Ledger>,
    set: ToolSet,
    /// Safe tools not cached, and the rest.
    plain: Idem,
    /// The same store with `cache_safe`.
    cached: Idem,
    /// Another executor on the same store (another process's view: no shared in-process flight).
    other: Idem,
    lease: Duration,
    /// Tokio's clock is paused (and moves only when every task waits): times on it are exact.
    paused: bool,
    /// The longest a call may take to be answered before it counts as hanging.
    hang: Duration,
    run_tag: String,
}

impl Env {
    fn new(name: &'static str, store: Arc<dyn Store>, lease: Duration, hang: Duration) -> Env {
        Env::with_clock(name, store, lease, hang, false)
    }

    /// On Tokio's paused clock (`paused`), with a lease of 10 s and a minute before a call
    /// counts as hanging, both in virtual time.
    fn paused(name: &'static str, store: Arc<dyn Store>) -> Env {
        Env::with_clock(name, store, Duration::from_secs(10), Duration::from_secs(60), true)
    }

    fn with_clock(
        name: &'static str,
        store: Arc<dyn Store>,
        lease: Duration,
        hang: Duration,
        paused: bool,
    ) -> Env {
        let policy = Policy { lease, ..Policy::default() };
        let build =
            |policy: Policy| Idem::builder_shared(Arc::clone(&store)).policy(policy).build();
        let ledger = Arc::new(Ledger::default());
        Env {
            name,
            set: ledger.tool_set(),
            ledger,
            plain: build(policy),
            cached: build(Policy { cache_safe: true, ..policy }),
            other: build(Policy { cache_safe: true, ..policy }),
            store,
            lease,
            paused,
            hang,
            run_tag: format!("cancel-{}-{}", name, idem_tests::process_tag()),
        }
    }

    fn idem(&self, class: Class) -> &Idem {
        if class == Class::SafeCached { &self.cached } else { &self.plain }
    }

    fn run(&self, class: Class) -> Run {
        self.idem(class).run(self.run_tag.clone())
    }

    fn key(&self, class: Class, id: &str) -> Key {
        let canonical = serde_json::to_vec(&json!({ "id": id })).unwrap();
        derive_key(&Scope::run(self.run_tag.clone()), class.tool(), &canonical)
    }

    /// A call of `class` with `id` through `door`, as a future of its answer.
    fn call<'a>(
        &'a self,
        run: &'a Run,
        class: Class,
        door: Door,
        id: &'a str,
    ) -> std::pin::Pin<Box<dyn Future<Output = Answer> + Send + 'a>> {
        let ledger = &self.ledger;
        match door {
            Door::Typed => Box::pin(async move {
                let r = match class {
                    Class::Safe | Class::SafeCached => ledger.look(run, id.to_owned()).await,
                    Class::Keyed => ledger.pay(run, id.to_owned()).await,
                    Class::Never => ledger.ship(run, id.to_owned()).await,
                    Class::NeverChecked => ledger.post(run, id.to_owned()).await,
                };
                typed_answer(r)
            }),
            Door::Mcp => Box::pin(async move {
                let params = json!({ "name": class.tool(), "arguments": { "id": id } });
                match self.set.call_mcp(run, &params).await {
                    Ok(v) => {
                        let text = v["content"][0]["text"].as_str().unwrap_or_default();
                        text_answer(text, v["isError"] == Value::Bool(true))
                    }
                    Err(e) => Answer::Other(format!("protocol error: {e:?}")),
                }
            }),
            Door::OpenAi => Box::pin(async move {
                let args = json!({ "id": id }).to_string();
                let call = json!({
                    "id": "call_1",
                    "type": "function",
                    "function": { "name": class.tool(), "arguments": args },
                });
                let v = self.set.call_openai(run, &call).await;
                text_answer(v["content"].as_str().unwrap_or_default(), false)
            }),
        }
    }

    /// A bounded typed call: a call not answered within `hang` fails the test.
    async fn call_bounded(&self, class: Class, id: &str, what: &str) -> Answer {
        let run = self.run(class);
        match tokio::time::timeout(self.hang, self.call(&run, class, Door::Typed, id)).await {
            Ok(answer) => answer,
            Err(_) => {
                panic!("{}: {what} of {class:?} {id} was not answered: a hanging waiter", self.name)
            }
        }
    }
}

/// Wakes the harness when the polled call asks to be polled again.
struct Wakeup(Notify);

impl Wake for Wakeup {
    fn wake(self: Arc<Self>) {
        self.0.notify_one();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.notify_one();
    }
}

/// How a call polled by [`poll_then_drop`] ended.
enum Polled<T> {
    /// It completed.
    Done(T),
    /// It was dropped after `n` polls, still pending.
    Dropped,
}

/// Polls `call` up to `n` times, each poll after the previous one's wake-up (at most `between`
/// later when given; without it a call not woken within `hang` fails the test: something would
/// hang), then drops it if it is still pending.
async fn poll_then_drop<F: Future>(
    call: F,
    n: usize,
    between: Option<Duration>,
    hang: Duration,
) -> Polled<F::Output> {
    let wakeup = Arc::new(Wakeup(Notify::new()));
    let waker = Waker::from(Arc::clone(&wakeup));
    let mut call = Box::pin(call);
    for i in 1..=n {
        if let Poll::Ready(out) = call.as_mut().poll(&mut Context::from_waker(&waker)) {
            return Polled::Done(out);
        }
        if i == n {
            break;
        }
        match between {
            Some(d) => {
                let _ = tokio::time::timeout(d, wakeup.0.notified()).await;
            }
            None => {
                if tokio::time::timeout(hang, wakeup.0.notified()).await.is_err() {
                    panic!("a pending call was not woken within {hang:?} after poll {i}");
                }
            }
        }
    }
    drop(call);
    Polled::Dropped
}

/// Where the dropped call was when it was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Phase {
    /// Its body had not started.
    BeforeBody,
    /// Its body started; no effect yet.
    InBody,
    /// Its effect happened.
    AfterEffect,
}

/// Counts of drops per phase and completions, for one store.
#[derive(Default)]
struct Coverage {
    drops: Mutex<HashMap<(Class, Door, Phase, Left), usize>>,
    completed: AtomicUsize,
}

impl Coverage {
    fn print(&self, store: &str) {
        let drops = self.drops.lock().unwrap();
        let total: usize = drops.values().sum();
        let mut by_phase: HashMap<(Phase, Left), usize> = HashMap::new();
        for ((_, _, phase, left), n) in drops.iter() {
            *by_phase.entry((*phase, *left)).or_default() += n;
        }
        let mut phases: Vec<_> = by_phase.into_iter().collect();
        phases.sort();
        eprintln!(
            "{store}: {total} drop points ({phases:?}), {} calls completed before their drop",
            self.completed.load(Ordering::Relaxed)
        );
    }
}

/// Where a call is cut off.
#[derive(Clone, Copy, Debug)]
enum Cut {
    /// After `n` polls, each after the call's own wake-up.
    Polls(usize),
    /// Once this much real time has passed since its first poll, polled again after every
    /// `yield_now` meanwhile (spurious polls included): the drop lands anywhere inside the
    /// store's I/O, not only between wake-ups.
    After(Duration),
}

/// Polls `call` as `cut` says, then drops it if it is still pending.
async fn cut_off<F: Future>(call: F, cut: Cut, hang: Duration) -> Polled<F::Output> {
    let d = match cut {
        Cut::Polls(n) => return poll_then_drop(call, n, None, hang).await,
        Cut::After(d) => d,
    };
    let waker = Waker::noop();
    let mut call = std::pin::pin!(call);
    let start = std::time::Instant::now();
    loop {
        if let Poll::Ready(out) = call.as_mut().poll(&mut Context::from_waker(waker)) {
            return Polled::Done(out);
        }
        if start.elapsed() >= d {
            return Polled::Dropped;
        }
        tokio::task::yield_now().await;
    }
}

/// What the dropped call's record was right after the drop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Left {
    Nothing,
    InFlight,
    Done,
}

/// One call of `class` through `door` cut off as `cut` says, and every check after it. Returns
/// whether the call was dropped (rather than completed on its own).
async fn drop_at(env: &Env, class: Class, door: Door, cut: Cut, cov: &Coverage) -> bool {
    let id = match cut {
        Cut::Polls(n) => format!("{class:?}-{door:?}-p{n}"),
        Cut::After(d) => format!("{class:?}-{door:?}-t{}", d.as_micros()),
    };
    let run = env.run(class);
    let dropped = match cut_off(env.call(&run, class, door, &id), cut, env.hang).await {
        Polled::Done(answer) => {
            assert_eq!(answer, Answer::Ok(format!("{id}@{}", fence_of(env, &id))), "{}", env.name);
            cov.completed.fetch_add(1, Ordering::Relaxed);
            false
        }
        Polled::Dropped => true,
    };
    let started = env.ledger.started(&id);
    let effects = env.ledger.effects(&id);
    let at = |what: &str| format!("{}: {class:?} via {door:?}, cut at {cut:?}: {what}", env.name);
    assert!(effects.len() <= 1, "{}", at(&format!("{} effects", effects.len())));
    // No record outlives its lease in flight: what a dropped call left is in flight for at most
    // a lease (a renewal it sent may still land).
    let mut left = Left::Nothing;
    if class.uses_store()
        && let Ok(Some(info)) = env.store.inspect(&env.key(class, &id)).await
    {
        left = Left::Done;
        if let RecordState::InFlight { lease_remaining } = info.state {
            left = Left::InFlight;
            assert!(
                lease_remaining <= env.lease + Duration::from_millis(50),
                "{}",
                at(&format!(
                    "in flight for {lease_remaining:?}, past its lease of {:?}",
                    env.lease
                ))
            );
        }
    }
    if dropped {
        let phase = match (started, effects.len()) {
            (0, _) => Phase::BeforeBody,
            (_, 0) => Phase::InBody,
            _ => Phase::AfterEffect,
        };
        *cov.drops.lock().unwrap().entry((class, door, phase, left)).or_default() += 1;
    }

    // The next call of the intent.
    let next = env.call_bounded(class, &id, "the repeat after the drop").await;
    let after = env.ledger.effects(&id);
    match class {
        Class::Safe => {
            assert_eq!(next, Answer::Ok(format!("{id}@0")), "{}", at("the repeat"));
            assert_eq!(after.len(), effects.len() + 1, "{}", at("a safe tool runs again"));
        }
        Class::SafeCached | Class::Keyed => {
            let Answer::Ok(v) = &next else { panic!("{}", at(&format!("the repeat: {next:?}"))) };
            if after.len() == effects.len() {
                // A replay: the dropped call's outcome was stored.
                assert!(dropped || !effects.is_empty(), "{}", at("replayed what never ran"));
                assert_eq!(Some(v), effects.last().map(|(_, f)| format!("{id}@{f}")).as_ref());
            } else {
                assert_eq!(after.len(), effects.len() + 1, "{}", at("one run"));
                assert_eq!(v, &format!("{id}@{}", after.last().unwrap().1), "{}", at("the run's"));
            }
        }
        Class::NeverChecked => {
            // Whatever the drop left, the check settles it: the one effect's output, or a run.
            assert_eq!(after.len(), 1, "{}", at(&format!("{next:?} after {} runs", after.len())));
            assert_eq!(next, Answer::Ok(format!("{id}@{}", after[0].1)), "{}", at("the repeat"));
        }
        Class::Never => {
            assert!(after.len() <= 1, "{}", at(&format!("a never tool ran {} times", after.len())));
            match (&next, started, effects.len()) {
                // Its body never started: the claim was released (or never made), so the tool
                // runs now.
                (Answer::Ok(v), 0, 0) => {
                    assert_eq!(after.len(), 1, "{}", at("the repeat runs"));
                    assert_eq!(v, &format!("{id}@{}", after[0].1));
                }
                (other, 0, _) => panic!(
                    "{}",
                    at(&format!("the body never started, yet the repeat answered {other:?}"))
                ),
                // It may have run: "unknown" unless its outcome was stored.
                (Answer::Unknown, _, _) => assert_eq!(after.len(), effects.len()),
                (Answer::Ok(v), _, 1) => {
                    assert_eq!(after.len(), 1, "{}", at("replayed, not run"));
                    assert_eq!(v, &format!("{id}@{}", after[0].1));
                }
                (other, _, _) => panic!("{}", at(&format!("the repeat answered {other:?}"))),
            }
        }
    }
    // Every repeat after that answers the same, and runs nothing (but a safe tool not cached).
    if class != Class::Safe {
        let again = env.call_bounded(class, &id, "a second repeat").await;
        assert_eq!(again, next, "{}", at("a second repeat answers as the first"));
        assert_eq!(env.ledger.effects(&id).len(), after.len(), "{}", at("a replay runs nothing"));
    }
    fences_increase(env, &id, &at(""));

    // Forgotten: nothing the dropped call left behind (a claim finished in the background, a
    // late completion, a renewal) writes the record again, so the next call runs the tool.
    if class.uses_store() {
        let key = env.key(class, &id);
        env.store.forget(&key).await.expect("forget");
        let before = env.ledger.effects(&id).len();
        let fresh = env.call_bounded(class, &id, "the call after a forget").await;
        let ran = env.ledger.effects(&id);
        assert_eq!(ran.len(), before + 1, "{}", at(&format!("after a forget: {fresh:?}")));
        assert_eq!(
            fresh,
            Answer::Ok(format!("{id}@{}", ran.last().unwrap().1)),
            "{}",
            at("forgot")
        );
        fences_increase(env, &id, &at("after a forget"));
    }
    dropped
}

/// The fence of the one effect of `id` (0 if none).
fn fence_of(env: &Env, id: &str) -> u64 {
    env.ledger.effects(id).last().map_or(0, |(_, f)| *f)
}

/// Every effect of `id` ran under one key, with fences that only increase.
fn fences_increase(env: &Env, id: &str, at: &str) {
    let effects = env.ledger.effects(id);
    for pair in effects.windows(2) {
        assert_eq!(pair[0].0, pair[1].0, "{at}: one intent, one key");
        if pair[0].1 != 0 || pair[1].1 != 0 {
            assert!(pair[0].1 < pair[1].1, "{at}: fences {} then {}", pair[0].1, pair[1].1);
        }
    }
}

/// Every drop point of every class through every door on `env`: n = 1, 2, .. polls until the
/// call completes on its own, then (`timed`, for a store with real I/O) cut off after a real time
/// growing from 0 until it completes. One class and door after another, or (`together`) all at
/// once, each on its own intents, so that leases run out side by side on a store with a real
/// clock.
async fn every_drop_point(env: &Env, cov: &Coverage, together: bool, timed: bool) {
    let combos = Class::ALL.into_iter().flat_map(|c| Door::ALL.map(|d| (c, d)));
    let streams = combos.map(|(class, door)| async move {
        let mut n = 1;
        while drop_at(env, class, door, Cut::Polls(n), cov).await {
            n += 1;
            assert!(n < 500, "{}: a call that never completes", env.name);
        }
        let mut micros = 0u64;
        while timed
            && drop_at(env, class, door, Cut::After(Duration::from_micros(micros)), cov).await
        {
            micros = (micros * 3 / 2).max(micros + 50);
            assert!(micros < 5_000_000, "{}: a call that never completes", env.name);
        }
    });
    if together {
        futures_util::future::join_all(streams).await;
    } else {
        for stream in streams {
            stream.await;
        }
    }
}

/// A duplicate dropped at its `n`th poll while the first call runs: the first call goes on and
/// its outcome is everybody's. `other`: the duplicate is another executor's (it waits through the
/// store, not the in-process flight).
async fn dropped_joiner(env: &Env, class: Class, other: bool, n: usize) -> bool {
    let id = format!("joiner-{class:?}-{other}-{n}");
    let run = env.run(class);
    let first = env.call(&run, class, Door::Typed, &id);
    let first = tokio::time::timeout(env.hang, first);
    let joiner = async {
        // The first call has claimed once its body started.
        while env.ledger.started(&id) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let joiner_run = if other { env.other.run(env.run_tag.clone()) } else { run.clone() };
        let joiner = env.call(&joiner_run, class, Door::Typed, &id);
        // Between polls at most a millisecond: the joiner waits for the first call, which may
        // wake it only when it finishes.
        let polled = poll_then_drop(joiner, n, Some(Duration::from_millis(1)), env.hang).await;
        matches!(polled, Polled::Dropped)
    };
    let (first, dropped) = tokio::join!(first, joiner);
    let at =
        format!("{}: {class:?} joiner (other executor: {other}) dropped at poll {n}", env.name);
    let first = first.unwrap_or_else(|_| panic!("{at}: the first call hangs"));
    let effects = env.ledger.effects(&id);
    assert_eq!(effects.len(), 1, "{at}: one run");
    let expected = Answer::Ok(format!("{id}@{}", effects[0].1));
    assert_eq!(first, expected, "{at}: the first call finished");
    let again = env.call_bounded(class, &id, "a repeat").await;
    assert_eq!(again, expected, "{at}: replayed");
    assert_eq!(env.ledger.effects(&id).len(), 1, "{at}");
    dropped
}

/// The first call dropped at its `n`th poll while duplicates wait (two in this executor, one in
/// another): they are answered within the lease, all alike; a keyed tool runs at most once more,
/// a never tool never does once its body started.
async fn dropped_owner(env: &Env, class: Class, n: usize) -> bool {
    let id = format!("owner-{class:?}-{n}");
    let run = env.run(class);
    let other = env.other.run(env.run_tag.clone());
    let owner = env.call(&run, class, Door::Typed, &id);
    let at = format!("{}: {class:?} owner dropped at poll {n}", env.name);
    let (polled, answers) = tokio::join!(poll_then_drop(owner, n, None, env.hang), async {
        // The duplicates arrive once the owner's body started (it holds the key).
        let mut waited = 0;
        while env.ledger.started(&id) == 0 && waited < 50 {
            tokio::time::sleep(Duration::from_millis(1)).await;
            waited += 1;
        }
        let dups = [
            env.call(&run, class, Door::Typed, &id),
            env.call(&run, class, Door::Mcp, &id),
            env.call(&other, class, Door::Typed, &id),
        ]
        .map(|c| tokio::time::timeout(env.hang, c));
        let arrived = tokio::time::Instant::now();
        let answers = futures_util::future::join_all(dups).await;
        // On the paused clock: the owner's lease, counted from before they arrived, bounds
        // their wait (the time the tool takes aside).
        if env.paused {
            let waited = arrived.elapsed();
            let bound = env.lease + Duration::from_secs(1);
            assert!(waited <= bound, "{id}: duplicates waited {waited:?}, past the lease");
        }
        answers
    });
    let dropped = matches!(polled, Polled::Dropped);
    let effects = env.ledger.effects(&id);
    let answers: Vec<Answer> = answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|_| panic!("{at}: a duplicate hangs")))
        .collect();
    match class {
        Class::Keyed | Class::SafeCached => {
            assert!(effects.len() <= 2, "{at}: {} runs", effects.len());
            let last = effects.last().expect("a run");
            for a in &answers {
                assert_eq!(a, &Answer::Ok(format!("{id}@{}", last.1)), "{at}: {answers:?}");
            }
        }
        Class::Never => {
            assert!(effects.len() <= 1, "{at}: a never tool ran {} times", effects.len());
            let first = &answers[0];
            for a in &answers {
                assert_eq!(a, first, "{at}: every duplicate answers alike: {answers:?}");
            }
            match first {
                Answer::Ok(v) => {
                    assert_eq!(effects.len(), 1, "{at}");
                    assert_eq!(v, &format!("{id}@{}", effects[0].1), "{at}");
                }
                Answer::Unknown => {}
                other => panic!("{at}: {other:?}"),
            }
        }
        Class::NeverChecked => {
            assert_eq!(effects.len(), 1, "{at}: a never tool with a check ran once");
            for a in &answers {
                assert_eq!(a, &Answer::Ok(format!("{id}@{}", effects[0].1)), "{at}: {answers:?}");
            }
        }
        Class::Safe => {}
    }
    fences_increase(env, &id, &at);
    dropped
}

/// A dead owner: a call of `id` dropped right after its effect (its record left in flight),
/// then `n` polls of the repeat that finds its lease ended (a takeover, the check of a never
/// tool with one, or "unknown"), dropped in turn; the call after that is answered, alike for
/// every caller, and a never tool has run once.
async fn dropped_after_takeover(env: &Env, class: Class, n: usize) -> bool {
    let id = format!("takeover-{class:?}-{n}");
    let at = format!("{}: {class:?}, the repeat after a dead owner dropped at poll {n}", env.name);
    let run = env.run(class);
    // The dead owner: polled until its effect happened, then dropped.
    {
        let mut call = Box::pin(env.call(&run, class, Door::Typed, &id));
        let wakeup = Arc::new(Wakeup(Notify::new()));
        let waker = Waker::from(Arc::clone(&wakeup));
        while env.ledger.effects(&id).is_empty() {
            let polled = call.as_mut().poll(&mut Context::from_waker(&waker));
            assert!(polled.is_pending(), "{at}: the first call ended before its effect");
            if env.ledger.effects(&id).is_empty() {
                let woken = tokio::time::timeout(env.hang, wakeup.0.notified()).await;
                assert!(woken.is_ok(), "{at}: the first call hangs");
            }
        }
    }
    tokio::time::sleep(env.lease + Duration::from_millis(100)).await;
    let second = poll_then_drop(env.call(&run, class, Door::Typed, &id), n, None, env.hang).await;
    let dropped = matches!(second, Polled::Dropped);
    let last = env.call_bounded(class, &id, "the call after both").await;
    let again = env.call_bounded(class, &id, "a repeat").await;
    assert_eq!(again, last, "{at}: a repeat answers alike");
    if let Polled::Done(second) = &second {
        assert_eq!(second, &last, "{at}: the second call's answer stands");
    }
    let effects = env.ledger.effects(&id);
    match class {
        Class::Keyed | Class::SafeCached => {
            assert!(effects.len() <= 3, "{at}: {} runs", effects.len());
            assert_eq!(last, Answer::Ok(format!("{id}@{}", effects.last().unwrap().1)), "{at}");
        }
        Class::NeverChecked => {
            assert_eq!(effects.len(), 1, "{at}: a never tool with a check ran once");
            assert_eq!(last, Answer::Ok(format!("{id}@{}", effects[0].1)), "{at}");
        }
        Class::Never => {
            assert_eq!(effects.len(), 1, "{at}: a never tool ran once");
            assert_eq!(last, Answer::Unknown, "{at}");
        }
        Class::Safe => {}
    }
    fences_increase(env, &id, &at);
    dropped
}

/// A call whose first run does not end well (`step`) cut off as `cut` says: a retry pause, a
/// release after a transient failure, the "unknown" stored after an ambiguous one, the check
/// asked after it. The repeat is bounded and answers as the class allows.
async fn scripted_drop_at(env: &Env, class: Class, step: Step, cut: Cut) -> bool {
    let id = match cut {
        Cut::Polls(n) => format!("{class:?}-{step:?}-p{n}"),
        Cut::After(d) => format!("{class:?}-{step:?}-t{}", d.as_micros()),
    };
    let at = |what: &str| format!("{}: {class:?} {step:?}, cut at {cut:?}: {what}", env.name);
    env.ledger.script.lock().unwrap().insert(id.clone(), step);
    let run = env.run(class);
    let first = match cut_off(env.call(&run, class, Door::Typed, &id), cut, env.hang).await {
        Polled::Done(answer) => Some(answer),
        Polled::Dropped => None,
    };
    let started = env.ledger.started(&id);
    let effects = env.ledger.effects(&id).len();
    assert!(effects <= 1, "{}", at(&format!("{effects} effects")));
    // Dropped before its body started: the repeat is the intent's first run, and runs as usual.
    env.ledger.script.lock().unwrap().remove(&id);
    let left = match env.store.inspect(&env.key(class, &id)).await {
        Ok(Some(info)) if info.state.is_done() => Left::Done,
        Ok(Some(_)) => Left::InFlight,
        _ => Left::Nothing,
    };
    let next = env.call_bounded(class, &id, "the repeat after the drop").await;
    let after = env.ledger.effects(&id);
    let one = |i: usize| Answer::Ok(format!("{id}@{}", after[i].1));
    match (class, step) {
        (Class::Keyed, Step::Busy) => {
            assert!(after.len() <= effects + 1, "{}", at("one run more at most"));
            assert_eq!(next, one(after.len() - 1), "{}", at("the repeat"));
        }
        (Class::Never, Step::Busy) => {
            assert_eq!(effects, 0, "{}", at("a refused run has no effect"));
            if let Some(first) = &first {
                assert!(matches!(first, Answer::Other(_)), "{}", at(&format!("{first:?}")));
            }
            match &next {
                // Released (the transient failure, or a claim dropped before the body): runs.
                Answer::Ok(_) => assert_eq!((after.len(), &next), (1, &one(0)), "{}", at("ran")),
                // Dropped before the release landed: left to its lease, and the body had run.
                Answer::Unknown => {
                    assert!(started > 0 && left != Left::Nothing, "{}", at("unknown"));
                    assert!(after.is_empty(), "{}", at("unknown, yet ran"));
                }
                other => panic!("{}", at(&format!("the repeat answered {other:?}"))),
            }
        }
        (Class::Never, Step::EffectThenLost) if started == 0 => {
            assert_eq!((after.len(), &next), (1, &one(0)), "{}", at("the claim was released"));
        }
        (Class::Never, Step::EffectThenLost) => {
            assert!(after.len() <= 1, "{}", at(&format!("{} runs", after.len())));
            assert_eq!(next, Answer::Unknown, "{}", at("the repeat"));
            if let Some(first) = &first {
                assert_eq!(first, &Answer::Unknown, "{}", at("the call"));
            }
        }
        (Class::NeverChecked, Step::EffectThenLost) => {
            assert_eq!(after.len(), 1, "{}", at("the check found the one effect"));
            assert_eq!(next, one(0), "{}", at("the repeat"));
            if let Some(first) = &first {
                assert_eq!(first, &one(0), "{}", at("the call"));
            }
        }
        _ => unreachable!(),
    }
    let again = env.call_bounded(class, &id, "a second repeat").await;
    assert_eq!(again, next, "{}", at("a second repeat answers as the first"));
    assert_eq!(env.ledger.effects(&id).len(), after.len(), "{}", at("a replay runs nothing"));
    fences_increase(env, &id, &at(""));
    first.is_none()
}

/// [`scripted_drop_at`] at every poll (and, `timed`, every real time) until the call completes.
async fn every_scripted_drop_point(env: &Env, timed: bool) {
    let scenarios = [
        (Class::Keyed, Step::Busy),
        (Class::Never, Step::Busy),
        (Class::Never, Step::EffectThenLost),
        (Class::NeverChecked, Step::EffectThenLost),
    ];
    let streams = scenarios.map(|(class, step)| async move {
        let mut n = 1;
        while scripted_drop_at(env, class, step, Cut::Polls(n)).await {
            n += 1;
            assert!(n < 500, "{}: a call that never completes", env.name);
        }
        let mut micros = 0u64;
        let mut timed_drops = 0;
        while timed
            && scripted_drop_at(env, class, step, Cut::After(Duration::from_micros(micros))).await
        {
            timed_drops += 1;
            micros = (micros * 3 / 2).max(micros + 50);
            assert!(micros < 5_000_000, "{}: a call that never completes", env.name);
        }
        eprintln!("{}: {class:?} {step:?}: {} + {timed_drops} drops", env.name, n - 1);
    });
    futures_util::future::join_all(streams).await;
}

/// Joiners and owners dropped at every poll, for every class that uses the store (`together`:
/// the scenarios side by side, as in [`every_drop_point`]).
/// `steady`: the environment the joiners run in, where the first call must keep its lease while
/// the joiner is polled and dropped (on a real clock, a longer lease than `env`'s: a loaded
/// machine that delays a renewal past a short lease lets the other executor take the key over,
/// which is the protocol working, not what this scenario checks).
async fn joiners_and_owners(env: &Env, steady: &Env, together: bool) {
    let classes = [Class::SafeCached, Class::Keyed, Class::Never, Class::NeverChecked];
    let mut streams: Vec<std::pin::Pin<Box<dyn Future<Output = ()> + Send + '_>>> = Vec::new();
    for class in classes {
        for other in [false, true] {
            streams.push(Box::pin(async move {
                let mut n = 1;
                while dropped_joiner(steady, class, other, n).await {
                    n += 1;
                    assert!(n < 500, "{}: a joiner that never completes", env.name);
                }
                eprintln!(
                    "{}: {class:?} joiner (other executor: {other}): {} drops",
                    env.name,
                    n - 1
                );
            }));
        }
        streams.push(Box::pin(async move {
            let mut n = 1;
            while dropped_owner(env, class, n).await {
                n += 1;
                assert!(n < 500, "{}: an owner that never completes", env.name);
            }
            eprintln!("{}: {class:?} owner with duplicates waiting: {} drops", env.name, n - 1);
        }));
        // The repeats after a dead owner, several side by side (each waits out a lease first).
        streams.push(Box::pin(async move {
            let mut n = 1;
            loop {
                let batch = (n..n + 8).map(|n| dropped_after_takeover(env, class, n));
                let dropped = futures_util::future::join_all(batch).await;
                if !dropped.iter().all(|d| *d) {
                    n += dropped.iter().take_while(|d| **d).count();
                    break;
                }
                n += 8;
                assert!(n < 500, "{}: a repeat that never completes", env.name);
            }
            eprintln!("{}: {class:?} repeat after a dead owner: {} drops", env.name, n - 1);
        }));
    }
    if together {
        futures_util::future::join_all(streams).await;
    } else {
        for stream in streams {
            stream.await;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn memory_store_every_drop_point() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let env = Env::paused("memory", store);
    let cov = Coverage::default();
    every_drop_point(&env, &cov, false, false).await;
    every_scripted_drop_point(&env, false).await;
    cov.print("memory");
}

#[tokio::test(start_paused = true)]
async fn memory_store_joiners_and_owners_dropped() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let env = Env::paused("memory", store);
    joiners_and_owners(&env, &env, false).await;
}

/// Leases on the stores with a real clock: short, so a repeat after a drop waits little.
const LEASE: Duration = Duration::from_millis(500);
/// Leases where a call must keep its lease while others come and go (the joiners).
const STEADY_LEASE: Duration = Duration::from_secs(3);
/// A call not answered in this long hangs (a lease, a store timeout and more).
const HANG: Duration = Duration::from_secs(20);

/// Every scenario on a store with real I/O; `waiting` counts the store's registered waits,
/// none of which may outlive the calls.
async fn network(name: &'static str, store: Arc<dyn Store>, waiting: impl Fn() -> usize) {
    let panics = panics_seen();
    let steady = Env::new(name, Arc::clone(&store), STEADY_LEASE, HANG);
    let env = Env::new(name, store, LEASE, HANG);
    let cov = Coverage::default();
    tokio::join!(
        every_drop_point(&env, &cov, true, true),
        every_scripted_drop_point(&env, true),
        joiners_and_owners(&env, &steady, true)
    );
    cov.print(name);
    assert_eq!(waiting(), 0, "{name}: waits still registered after every call ended");
    // Whatever the dropped calls left to the background (claims finished and released, a
    // subscription brought in line) has had its time; none of it panicked.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(panics_seen(), panics, "{name}: a panic in the background");
}

/// Panics seen so far on Tokio's worker and blocking threads, where tasks spawned in the
/// background run (such a panic does not fail the test that caused it on its own; a test's own
/// assertions run on its thread, not counted), counted by a hook installed on first use.
fn panics_seen() -> usize {
    static PANICS: AtomicUsize = AtomicUsize::new(0);
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() == Some("tokio-runtime-worker") {
                PANICS.fetch_add(1, Ordering::SeqCst);
            }
            default(info);
        }));
    });
    PANICS.load(Ordering::SeqCst)
}

/// The shared PostgreSQL, or `None` (the test is skipped) without one.
async fn postgres_store() -> Option<Arc<idem_core::PostgresStore>> {
    let connected = idem_core::PostgresStore::connect(&idem_tests::pg_url()).await;
    idem_tests::or_skip("PostgreSQL", connected).map(Arc::new)
}

/// The shared Redis under `prefix`, or `None` (the test is skipped) without one.
async fn redis_store(prefix: &str) -> Option<Arc<idem_core::store::RedisStore>> {
    let opened =
        idem_core::store::RedisStore::builder(idem_tests::redis_url()).prefix(prefix).open().await;
    idem_tests::or_skip("Redis", opened).map(Arc::new)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_every_drop_point() {
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("idem-cancellation-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let store = idem_core::SqliteStore::open(&path).expect("open the SQLite file");
    network("sqlite", Arc::new(store), || 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_every_drop_point() {
    let Some(store) = postgres_store().await else { return };
    let watched = Arc::clone(&store);
    network("postgres", store, || watched.waiting_keys()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_every_drop_point() {
    let prefix = format!("{}-every", idem_tests::redis_prefix());
    let Some(store) = redis_store(&prefix).await else { return };
    let watched = Arc::clone(&store);
    network("redis", store, || watched.waiting_keys()).await;
    // No channel is left subscribed on the server once no wait wants it.
    let client = redis::Client::open(idem_tests::redis_url()).expect("redis url");
    let mut raw = client.get_multiplexed_async_connection().await.expect("raw connection");
    let mut channels: Vec<String> = Vec::new();
    for _ in 0..50 {
        channels = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .arg(format!("{prefix}*"))
            .query_async(&mut raw)
            .await
            .unwrap();
        if channels.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(channels.is_empty(), "channels subscribed with no wait on them: {channels:?}");
}

/// The key of `pay(id)` in `run`, claimed on `store` as another process would: a call of it
/// waits for that owner.
async fn held_elsewhere(store: &dyn Store, run: &Run, id: &str) -> Key {
    let canonical = serde_json::to_vec(&json!({ "id": id })).unwrap();
    let key = derive_key(run.scope(), "pay", &canonical);
    let fp = idem_core::Fingerprint::of_derived_key(&key);
    idem_tests::acquire(store, &key, &fp).await;
    key
}

/// Callers that give up while they wait for another process's call (each on its own key) leave
/// no waiter registered in the store: a long-running server would otherwise keep one entry per
/// abandoned wait for as long as the store lives.
async fn dropped_waits_leave_no_waiter(
    name: &str,
    store: Arc<dyn Store>,
    waiting: impl Fn() -> usize,
) {
    let other = Idem::builder_shared(Arc::clone(&store)).build();
    let ledger = Arc::new(Ledger::default());
    let run = other.run(format!("dropped-waits-{name}-{}", idem_tests::process_tag()));
    for i in 0..20 {
        let id = format!("w{i}");
        let key = held_elsewhere(&*store, &run, &id).await;
        let gave_up =
            tokio::time::timeout(Duration::from_millis(300), ledger.pay(&run, id.clone())).await;
        assert!(gave_up.is_err(), "{name}: the call waits for the owner: {gave_up:?}");
        store.forget(&key).await.expect("forget");
    }
    assert_eq!(ledger.effects.lock().unwrap().len(), 0, "{name}: nothing ran");
    assert_eq!(waiting(), 0, "{name}: waits dropped mid-wait are still registered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_waits_dropped_mid_wait_leave_no_waiter() {
    let Some(store) = postgres_store().await else { return };
    let watched = Arc::clone(&store);
    dropped_waits_leave_no_waiter("postgres", store, || watched.waiting_keys()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_waits_dropped_mid_wait_leave_no_waiter() {
    let Some(store) = redis_store(&idem_tests::redis_prefix()).await else { return };
    let watched = Arc::clone(&store);
    dropped_waits_leave_no_waiter("redis", store, || watched.waiting_keys()).await;
}

/// A wait for another process's call dropped once its `SUBSCRIBE` was sent (its caller gave up,
/// or the wait's own bound ran out, before the reply was read) leaves no pub/sub subscription
/// behind on the Redis server: once no wait wants the channel, it is unsubscribed, as it is
/// after a wait that read its reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_waits_dropped_mid_subscribe_leave_no_subscription() {
    let Some(store) = redis_store(&idem_tests::redis_prefix()).await else { return };
    let client = redis::Client::open(idem_tests::redis_url()).expect("redis url");
    let mut raw = client.get_multiplexed_async_connection().await.expect("raw connection");
    let other = Idem::builder_shared(Arc::clone(&store) as Arc<dyn Store>).build();
    let ledger = Arc::new(Ledger::default());
    let run = other.run(format!("mid-subscribe-{}", idem_tests::process_tag()));
    let mut leaked = Vec::new();
    for i in 0..20 {
        let id = format!("s{i}");
        let key = held_elsewhere(&*store, &run, &id).await;
        let mut call = Box::pin(ledger.pay(&run, id.clone()));
        // Polled until its wait registered (the same poll sends the `SUBSCRIBE`)...
        let mut polls = 0;
        while store.waiting_keys() == 0 {
            let polled = call.as_mut().poll(&mut Context::from_waker(Waker::noop()));
            assert!(polled.is_pending(), "the call waits for the owner: {polled:?}");
            polls += 1;
            assert!(polls < 100_000, "the call never waits");
            tokio::task::yield_now().await;
        }
        // ...then not again: the reply arrives, and the caller gives up before it reads it.
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(call);
        let channel = store.channel(&key);
        let mut subscribed = 1;
        for _ in 0..50 {
            let numsub: (String, i64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channel)
                .query_async(&mut raw)
                .await
                .unwrap();
            subscribed = numsub.1;
            if subscribed == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if subscribed != 0 {
            leaked.push(channel);
        }
        store.forget(&key).await.expect("forget");
    }
    assert_eq!(store.waiting_keys(), 0, "no wait is registered");
    assert!(leaked.is_empty(), "channels still subscribed with no wait on them: {leaked:?}");
    assert!(ledger.effects.lock().unwrap().is_empty(), "nothing ran");
}

/// Every store step takes a while (await points of its own, on the paused clock) before it
/// reaches the in-memory store: drops land inside each step of the executor's generic path
/// (boxed store futures, store timeouts, a claim finished in the background).
struct Slow;

#[async_trait::async_trait]
impl idem_tests::wrapped::Hook for Slow {
    async fn before(&self, _: idem_tests::wrapped::Op<'_>) -> Result<(), idem_core::StoreError> {
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn slow_generic_store_every_drop_point() {
    let store: Arc<dyn Store> = Arc::new(idem_tests::wrapped::Wrapped::new(Slow));
    let env = Env::paused("slow", store);
    let cov = Coverage::default();
    every_drop_point(&env, &cov, false, false).await;
    every_scripted_drop_point(&env, false).await;
    joiners_and_owners(&env, &env, false).await;
    cov.print("slow");
}

/// A first call whose future is kept but no longer polled (a host that stopped driving it
/// without dropping it) renews nothing, and its lease ends. A duplicate in this process is then
/// answered as one in another process is, within the lease: a keyed tool is taken over and run
/// again with the same key, a never tool answers "outcome unknown"; it does not wait out its
/// whole deadline for a call that no longer runs.
async fn starved_first_call(env: &Env) {
    for class in [Class::Keyed, Class::Never, Class::NeverChecked] {
        let id = format!("starved-{class:?}");
        let at = format!("{}: {class:?}, the first call no longer polled", env.name);
        let run = env.run(class);
        let mut first = Box::pin(env.call(&run, class, Door::Typed, &id));
        // Polled until its effect happened, then kept.
        while env.ledger.effects(&id).is_empty() {
            let polled = first.as_mut().poll(&mut Context::from_waker(Waker::noop()));
            assert!(polled.is_pending(), "{at}: the first call ended before its effect");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let arrived = tokio::time::Instant::now();
        let dup = env.call_bounded(class, &id, "a duplicate in the same process").await;
        let waited = arrived.elapsed();
        let effects = env.ledger.effects(&id);
        match class {
            Class::Keyed => {
                assert_eq!(effects.len(), 2, "{at}: taken over and run again");
                assert_eq!(dup, Answer::Ok(format!("{id}@{}", effects[1].1)), "{at}");
            }
            Class::Never => assert_eq!((dup, effects.len()), (Answer::Unknown, 1), "{at}"),
            _ => {
                // Taken over, and the check finds the first call's effect.
                assert_eq!(
                    (&dup, effects.len()),
                    (&Answer::Ok(format!("{id}@{}", effects[0].1)), 1)
                );
            }
        }
        assert!(waited <= env.lease + Duration::from_secs(1), "{at}: waited {waited:?}");
        fences_increase(env, &id, &at);
        drop(first);
    }
}

#[tokio::test(start_paused = true)]
async fn memory_store_a_first_call_no_longer_polled() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    starved_first_call(&Env::paused("memory", store)).await;
}

#[tokio::test(start_paused = true)]
async fn slow_generic_store_a_first_call_no_longer_polled() {
    let store: Arc<dyn Store> = Arc::new(idem_tests::wrapped::Wrapped::new(Slow));
    starved_first_call(&Env::paused("slow", store)).await;
}
