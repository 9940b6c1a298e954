//! A tool body that panics: the panic ends its attempt and becomes the caller's error, the key
//! is settled at once (released, or "outcome unknown" for a never tool) instead of staying
//! claimed until its lease ends, and nothing else unwinds.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem_core::{Classify, Error, ErrorKind, Failure, Idem, Served, ToolSet, tool};
use idem_tests::wrapped::{Pass, Wrapped};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::time::Instant;

#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
#[error("declined")]
struct Declined;

impl Classify for Declined {
    fn classify(&self) -> Failure {
        Failure::permanent()
    }
}

static CHARGES: AtomicU32 = AtomicU32::new(0);

/// Panics on its first run only; allows three attempts.
#[tool(retry = "keyed", attempts = 3)]
async fn charge(customer: String) -> Result<String, Declined> {
    if CHARGES.fetch_add(1, Ordering::SeqCst) == 0 {
        panic!("index out of bounds for {customer}");
    }
    Ok(format!("ch_{customer}"))
}

#[tokio::test(start_paused = true)]
async fn a_keyed_tool_that_panics_is_not_retried_and_its_key_is_free_for_a_repeat() {
    let run = Idem::in_memory().run("r1");
    match charge(&run, "cus_1".into()).await {
        Err(Error::Panicked { tool, attempt, message }) => {
            assert_eq!((tool, attempt), ("charge", 1));
            assert_eq!(message, "index out of bounds for cus_1");
        }
        other => panic!("expected Panicked, got {other:?}"),
    }
    assert_eq!(CHARGES.load(Ordering::SeqCst), 1, "no retry after a panic");
    let before = Instant::now();
    assert_eq!(charge(&run, "cus_1".into()).await.unwrap(), "ch_cus_1");
    assert_eq!(CHARGES.load(Ordering::SeqCst), 2, "the repeat ran the tool again");
    assert_eq!(before.elapsed(), Duration::ZERO, "the key was free: no lease to wait out");
}

static REFUNDS: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "never")]
async fn refund(charge_id: String) -> Result<String, Declined> {
    REFUNDS.fetch_add(1, Ordering::SeqCst);
    panic!("refund of {charge_id} lost its connection mid-write");
}

#[tokio::test(start_paused = true)]
async fn a_never_tool_that_panics_is_outcome_unknown_for_every_repeat() {
    let run = Idem::in_memory().run("r1");
    for _ in 0..3 {
        let result = refund(&run, "ch_1".into()).await;
        assert!(matches!(result, Err(Error::OutcomeUnknown { .. })), "{result:?}");
    }
    assert_eq!(REFUNDS.load(Ordering::SeqCst), 1, "a never tool runs once, panic or not");
}

static GATED: AtomicU32 = AtomicU32::new(0);
static GATE: Semaphore = Semaphore::const_new(0);

/// Waits for the gate, then panics on its first run.
#[tool(retry = "keyed", lease = "30s")]
async fn send_mail(to: String) -> Result<u32, Declined> {
    let n = GATED.fetch_add(1, Ordering::SeqCst);
    if n == 0 {
        GATE.acquire().await.unwrap().forget();
        panic!("template missing for {to}");
    }
    Ok(n)
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_waiting_on_a_panicking_owner_is_answered_without_waiting_out_the_lease() {
    let run = Idem::in_memory().run("r1");
    let owner = tokio::spawn({
        let run = run.clone();
        async move { send_mail(&run, "a@example.com".into()).await }
    });
    tokio::task::yield_now().await;
    let joiner = tokio::spawn({
        let run = run.clone();
        async move { run.call_reported(&SendMailTool, SendMailArgs::new("a@example.com".into())).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    GATE.add_permits(1);
    let owner = owner.await.expect("the panic did not unwind out of the call");
    assert!(matches!(owner, Err(Error::Panicked { .. })), "{owner:?}");
    let (joined, report) = joiner.await.unwrap();
    // The duplicate in this process shares the owner's failure, as for a transient error: no
    // run of the tool for each waiting duplicate in turn.
    assert!(matches!(joined, Err(Error::Panicked { .. })), "{joined:?}");
    assert_eq!(report.unwrap().served, Some(Served::Joined));
    assert_eq!(GATED.load(Ordering::SeqCst), 1);
    // The key was released at the panic, not left to its lease: the next call runs at once.
    let before = Instant::now();
    let (again, report) =
        run.call_reported(&SendMailTool, SendMailArgs::new("a@example.com".into())).await;
    assert_eq!(again.unwrap(), 1);
    assert_eq!(before.elapsed(), Duration::ZERO, "the key was released, not left to its lease");
    assert_eq!(report.unwrap().served, Some(Served::Executed), "executed, not taken over");
    assert_eq!(GATED.load(Ordering::SeqCst), 2);
}

static DURABLE_CHARGES: AtomicU32 = AtomicU32::new(0);
static DURABLE_REFUNDS: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "keyed", attempts = 3)]
async fn charge_durable(customer: String) -> Result<String, Declined> {
    if DURABLE_CHARGES.fetch_add(1, Ordering::SeqCst) == 0 {
        panic!("charge of {customer} hit a bug");
    }
    Ok(format!("ch_{customer}"))
}

#[tool(retry = "never")]
async fn refund_durable(charge_id: String) -> Result<String, Declined> {
    DURABLE_REFUNDS.fetch_add(1, Ordering::SeqCst);
    panic!("refund of {charge_id} hit a bug");
}

/// The same through a store the executor treats as any durable one (boxed steps, the store's
/// own release and completion), not the in-memory store's direct path.
#[tokio::test(start_paused = true)]
async fn on_a_durable_store_a_panic_releases_the_key_or_records_the_outcome_unknown() {
    let run = Idem::new(Wrapped::new(Pass)).run("r1");
    let first = charge_durable(&run, "cus_d".into()).await;
    assert!(matches!(first, Err(Error::Panicked { attempt: 1, .. })), "{first:?}");
    let before = Instant::now();
    assert_eq!(charge_durable(&run, "cus_d".into()).await.unwrap(), "ch_cus_d");
    assert_eq!(before.elapsed(), Duration::ZERO, "the key was released, not left to its lease");
    assert_eq!(DURABLE_CHARGES.load(Ordering::SeqCst), 2);

    for _ in 0..3 {
        let result = refund_durable(&run, "ch_d".into()).await;
        assert!(matches!(result, Err(Error::OutcomeUnknown { .. })), "{result:?}");
    }
    assert_eq!(DURABLE_REFUNDS.load(Ordering::SeqCst), 1);
}

static LOOKUPS: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "safe")]
async fn lookup(id: u64) -> Result<u64, Declined> {
    LOOKUPS.fetch_add(1, Ordering::SeqCst);
    let table: Vec<u64> = Vec::new();
    Ok(table[id as usize])
}

#[tokio::test]
async fn a_tool_set_answers_a_panic_with_an_error_result() {
    let set = ToolSet::new().with(LookupTool).unwrap();
    let run = Idem::in_memory().run("r1");
    let result = set.call(&run, "lookup", &serde_json::json!({"id": 3})).await;
    assert!(result.is_error);
    assert_eq!(result.error_kind, Some(ErrorKind::Panicked));
    assert!(
        result.text.starts_with(
            "Error (tool_panicked): tool `lookup` panicked in attempt 1: index out of bounds"
        ),
        "{}",
        result.text
    );
    assert_eq!(LOOKUPS.load(Ordering::SeqCst), 1);
}

#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
#[error("rate limited")]
struct Flaky;

impl Classify for Flaky {
    fn classify(&self) -> Failure {
        panic!("classify: no rule for this error yet")
    }
}

static CLASSIFIED: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "keyed", attempts = 3)]
async fn quote(item: String) -> Result<String, Flaky> {
    CLASSIFIED.fetch_add(1, Ordering::SeqCst);
    let _ = item;
    Err(Flaky)
}

/// A panic in the error type's `Classify::classify` (the user's code, as the body is) ends the
/// attempt as a body's panic does: the caller gets `Panicked` naming it, nothing is retried, and
/// the key is free at once instead of staying claimed until its lease ends.
#[tokio::test(start_paused = true)]
async fn a_panic_in_classify_ends_the_attempt_as_a_bodys_panic_does() {
    let run = Idem::in_memory().run("r1");
    match quote(&run, "bolt".into()).await {
        Err(Error::Panicked { tool, attempt, message }) => {
            assert_eq!((tool, attempt), ("quote", 1));
            assert!(message.contains("`Classify::classify` panicked"), "{message}");
            assert!(message.contains("no rule for this error yet"), "{message}");
        }
        other => panic!("expected Panicked, got {other:?}"),
    }
    assert_eq!(CLASSIFIED.load(Ordering::SeqCst), 1, "no retry after the panic");
    let before = Instant::now();
    assert!(matches!(quote(&run, "bolt".into()).await, Err(Error::Panicked { .. })));
    assert_eq!(before.elapsed(), Duration::ZERO, "the key was free: no lease to wait out");
    assert_eq!(CLASSIFIED.load(Ordering::SeqCst), 2);
}

static RECEIPTS: AtomicU32 = AtomicU32::new(0);

/// An output whose `Serialize` panics (the user's code, as the body is): the effect happened,
/// and storing its output unwinds.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
struct Receipt {
    id: String,
}

impl Serialize for Receipt {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        panic!("receipt {} has no serializer for its currency yet", self.id)
    }
}

#[tool(retry = "never")]
async fn send_receipt(order: String) -> Result<Receipt, Declined> {
    RECEIPTS.fetch_add(1, Ordering::SeqCst);
    Ok(Receipt { id: format!("rc_{order}") })
}

/// A panic while the outcome of a `never` tool is stored, after its body ran: the caller gets an
/// error naming the panic, not an unwind, and the record says the effect happened (every repeat
/// hears that its output could not be stored), on the in-memory store and on a durable one; the
/// body ran once.
#[tokio::test(start_paused = true)]
async fn a_panic_in_the_outputs_serialize_is_an_error_and_the_effect_is_recorded() {
    for (name, idem) in [("memory", Idem::in_memory()), ("durable", Idem::new(Wrapped::new(Pass)))]
    {
        let before = RECEIPTS.load(Ordering::SeqCst);
        let run = idem.run("r1");
        let first = tokio::spawn({
            let run = run.clone();
            async move { send_receipt(&run, "o1".into()).await.map(|r| r.id) }
        })
        .await;
        let first = first.unwrap_or_else(|e| panic!("{name}: the call unwound: {e}"));
        match first {
            Err(Error::OutputNotStorable { reason, .. }) => assert!(
                reason.contains("panicked: receipt rc_o1 has no serializer"),
                "{name}: {reason}"
            ),
            other => panic!("{name}: expected OutputNotStorable naming the panic, got {other:?}"),
        }
        for _ in 0..2 {
            let again = send_receipt(&run, "o1".into()).await;
            assert!(
                matches!(&again, Err(Error::OutputNotStorable { reason, .. }) if reason.contains("panicked")),
                "{name}: a repeat must hear that the effect happened: {again:?}"
            );
        }
        assert_eq!(RECEIPTS.load(Ordering::SeqCst) - before, 1, "{name}: the body ran once");
    }
}

static LABELS: AtomicU32 = AtomicU32::new(0);

/// An output whose `Deserialize` panics on a replay (the stored JSON is read back as the type).
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
struct Label {
    text: String,
}

impl<'de> Deserialize<'de> for Label {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Plain {
            text: String,
        }
        let plain = Plain::deserialize(d)?;
        // Read back once when the output is checked before it is stored; a replay is the second.
        if LABELS.load(Ordering::SeqCst) > 0 && plain.text.starts_with("replayed") {
            panic!("label {} cannot be read back here", plain.text);
        }
        Ok(Label { text: plain.text })
    }
}

static PRINTS: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "keyed")]
async fn print_label(text: String) -> Result<Label, Declined> {
    PRINTS.fetch_add(1, Ordering::SeqCst);
    Ok(Label { text })
}

/// A panic in the output's `Deserialize` while a stored outcome is replayed: the caller gets
/// `ReplayFailed` naming it, the tool does not run again, and the record is left as it is.
#[tokio::test(start_paused = true)]
async fn a_panic_in_the_outputs_deserialize_on_a_replay_is_a_replay_that_failed() {
    let run = Idem::new(Wrapped::new(Pass)).run("r1");
    let first = print_label(&run, "replayed-1".into()).await.expect("the first call runs");
    assert_eq!(first.text, "replayed-1");
    LABELS.store(1, Ordering::SeqCst);
    for _ in 0..2 {
        match print_label(&run, "replayed-1".into()).await {
            Err(Error::ReplayFailed { reason, .. }) => {
                assert!(reason.contains("panicked: label replayed-1"), "{reason}")
            }
            other => panic!("expected ReplayFailed naming the panic, got {other:?}"),
        }
    }
    assert_eq!(PRINTS.load(Ordering::SeqCst), 1, "a replay never runs the tool again");
}

/// An argument whose `Deserialize` panics on one value (the user's code, run when a tool set
/// reads a model's arguments).
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
struct Sku(String);

impl<'de> Deserialize<'de> for Sku {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if text == "legacy" {
            panic!("sku {text} has no parser yet");
        }
        Ok(Sku(text))
    }
}

/// A permanent error whose `Display` panics (the user's code, run when a tool set writes the
/// result the model reads).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct OutOfStock;

impl std::fmt::Display for OutOfStock {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        panic!("no message for out-of-stock yet")
    }
}

impl std::error::Error for OutOfStock {}

impl Classify for OutOfStock {
    fn classify(&self) -> Failure {
        Failure::permanent()
    }
}

static RESERVATIONS: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "keyed")]
async fn reserve(sku: Sku) -> Result<String, OutOfStock> {
    RESERVATIONS.fetch_add(1, Ordering::SeqCst);
    if sku.0 == "gone" {
        return Err(OutOfStock);
    }
    Ok(format!("reserved {}", sku.0))
}

/// Panics in a tool's own code around the call, through a tool set: each is an error result of
/// kind `tool_panicked` naming it, not an unwind through the host; arguments that could not be
/// read ran nothing, and a stored failure whose text panics is not run again.
#[tokio::test]
async fn a_tool_set_answers_a_panic_around_the_call_with_an_error_result() {
    let set = ToolSet::new().with(ReserveTool).unwrap();
    let run = Idem::in_memory().run("r1");
    let unread = set.call(&run, "reserve", &serde_json::json!({"sku": "legacy"})).await;
    assert_eq!(unread.error_kind, Some(ErrorKind::Panicked), "{}", unread.text);
    assert!(unread.text.contains("sku legacy has no parser yet"), "{}", unread.text);
    assert_eq!(RESERVATIONS.load(Ordering::SeqCst), 0, "nothing ran");

    for _ in 0..2 {
        let failed = set.call(&run, "reserve", &serde_json::json!({"sku": "gone"})).await;
        assert_eq!(failed.error_kind, Some(ErrorKind::Panicked), "{}", failed.text);
        assert!(failed.text.contains("no message for out-of-stock yet"), "{}", failed.text);
    }
    assert_eq!(RESERVATIONS.load(Ordering::SeqCst), 1, "the stored failure is replayed");

    let ok = set.call(&run, "reserve", &serde_json::json!({"sku": "a1"})).await;
    assert!(!ok.is_error, "{}", ok.text);
}

/// An argument whose `Clone` panics (the user's code: the executor copies the arguments before
/// each attempt but the last).
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct Manifest(u32);

impl Clone for Manifest {
    fn clone(&self) -> Self {
        panic!("manifest {} cannot be copied", self.0)
    }
}

static LAUNCHES: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "keyed", attempts = 3, lease = "10s")]
async fn launch(manifest: Manifest) -> Result<u32, Declined> {
    LAUNCHES.fetch_add(1, Ordering::SeqCst);
    Ok(manifest.0)
}

/// A panic in the arguments' `Clone`, before an attempt runs: `Panicked` naming it, not an
/// unwind, and the key is released (nothing ran), so a repeat does not wait out the lease.
#[tokio::test(start_paused = true)]
async fn a_panic_in_the_arguments_clone_is_an_error_and_frees_the_key() {
    let run = Idem::in_memory().run("r1");
    for _ in 0..2 {
        let before = Instant::now();
        let call = tokio::spawn({
            let run = run.clone();
            async move { launch(&run, Manifest(7)).await }
        })
        .await
        .expect("the call did not unwind");
        match call {
            Err(Error::Panicked { message, .. }) => {
                assert!(message.contains("`Clone` panicked: manifest 7"), "{message}")
            }
            other => panic!("expected Panicked, got {other:?}"),
        }
        assert_eq!(before.elapsed(), Duration::ZERO, "the key was free");
    }
    assert_eq!(LAUNCHES.load(Ordering::SeqCst), 0, "no attempt ran");
}

/// An argument whose `Serialize` panics on one value (the user's code: the key is derived from
/// the arguments' canonical form before anything is claimed).
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
struct Parcel(u32);

impl Serialize for Parcel {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.0 == 13 {
            panic!("parcel 13 has no wire form");
        }
        serializer.serialize_u32(self.0)
    }
}

static SHIPMENTS: AtomicU32 = AtomicU32::new(0);

#[tool(retry = "keyed")]
async fn ship(parcel: Parcel) -> Result<u32, Declined> {
    SHIPMENTS.fetch_add(1, Ordering::SeqCst);
    Ok(parcel.0)
}

/// A panic in the arguments' `Serialize` refuses the call with an error naming it, instead of
/// unwinding out of `Run::call`; nothing ran and nothing was claimed, so other calls go on.
#[tokio::test]
async fn a_panic_in_the_arguments_serialize_refuses_the_call() {
    let run = Idem::in_memory().run("r1");
    let call = tokio::spawn({
        let run = run.clone();
        async move { ship(&run, Parcel(13)).await }
    })
    .await
    .expect("the call did not unwind");
    match call {
        Err(Error::InvalidArguments { source, .. }) => {
            let text = source.to_string();
            assert!(text.contains("`Serialize` panicked: parcel 13 has no wire form"), "{text}");
        }
        other => panic!("expected InvalidArguments, got {other:?}"),
    }
    assert_eq!(SHIPMENTS.load(Ordering::SeqCst), 0, "nothing ran");
    assert_eq!(ship(&run, Parcel(14)).await.unwrap(), 14);
    assert_eq!(SHIPMENTS.load(Ordering::SeqCst), 1);
}

// A tool written by hand (not `#[tool]`) whose `run` does some of its work before the future it
// returns: a panic there is the tool's code too, and must end the attempt as a panic in the
// future's body does, not unwind out of the call with the key claimed until its lease ends.

static PROVISIONS: AtomicU32 = AtomicU32::new(0);

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
struct Region {
    name: String,
}

struct Provision {
    def: &'static idem_core::ToolDef,
}

const fn provision_def(class: idem_core::RetryClass) -> idem_core::ToolDef {
    idem_core::ToolDef {
        name: "provision",
        description: "",
        class,
        options: idem_core::ToolOptions::NONE,
    }
}
static PROVISION_KEYED: idem_core::ToolDef = provision_def(idem_core::RetryClass::Keyed);
static PROVISION_NEVER: idem_core::ToolDef = provision_def(idem_core::RetryClass::Never);

impl idem_core::Tool for Provision {
    type Args = Region;
    type Output = String;
    type Error = Declined;
    fn def(&self) -> &'static idem_core::ToolDef {
        self.def
    }
    fn run(
        &self,
        _cx: &idem_core::Ctx,
        args: Region,
    ) -> impl std::future::Future<Output = Result<String, Declined>> + Send {
        // Before the future: the effect may have begun here.
        let n = PROVISIONS.fetch_add(1, Ordering::SeqCst);
        if n == 0 || self.def.class == idem_core::RetryClass::Never {
            panic!("no quota left in {}", args.name);
        }
        async move { Ok(format!("vm_{}", args.name)) }
    }
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_a_hand_written_run_before_its_future_is_an_error_and_settles_the_key() {
    let run = Idem::in_memory().run("r1");
    let keyed = Provision { def: &PROVISION_KEYED };
    let region = || Region { name: "eu-1".into() };
    let first = tokio::spawn({
        let run = run.clone();
        async move { run.call(&Provision { def: &PROVISION_KEYED }, region()).await }
    })
    .await
    .expect("the panic did not unwind out of the call");
    assert!(matches!(first, Err(Error::Panicked { attempt: 1, .. })), "{first:?}");
    let before = Instant::now();
    assert_eq!(run.call(&keyed, region()).await.unwrap(), "vm_eu-1");
    assert_eq!(before.elapsed(), Duration::ZERO, "the key was released, not left to its lease");
    assert_eq!(PROVISIONS.load(Ordering::SeqCst), 2);

    // A never tool: outcome unknown at once, for every repeat, and run once.
    let run = Idem::in_memory().run("r2");
    for _ in 0..3 {
        let before = Instant::now();
        let result = tokio::spawn({
            let run = run.clone();
            async move { run.call(&Provision { def: &PROVISION_NEVER }, region()).await }
        })
        .await
        .expect("the panic did not unwind out of the call");
        assert!(matches!(result, Err(Error::OutcomeUnknown { .. })), "{result:?}");
        assert_eq!(before.elapsed(), Duration::ZERO, "no lease to wait out");
    }
    assert_eq!(PROVISIONS.load(Ordering::SeqCst), 3, "the never tool ran once");
}

static POSTS: AtomicU32 = AtomicU32::new(0);
static POST_GATE: Semaphore = Semaphore::const_new(0);

#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
#[error("busy")]
struct Busy;

impl Classify for Busy {
    fn classify(&self) -> Failure {
        Failure::transient()
    }
}

/// The first run waits for the gate and fails with nothing done; the next ones post.
#[tool(retry = "never", attempts = 1, lease = "30s")]
async fn post_ledger(entry: String) -> Result<String, Busy> {
    if POSTS.fetch_add(1, Ordering::SeqCst) == 0 {
        POST_GATE.acquire().await.unwrap().forget();
        return Err(Busy);
    }
    Ok(format!("posted_{entry}"))
}

/// A wait hook is the caller's code too: one that panics when its call becomes the owner (after
/// the claim) must not unwind out of the call with the key claimed, which for a never tool would
/// read as "outcome unknown" to every later caller though nothing ran.
#[tokio::test(start_paused = true)]
async fn a_panic_in_a_wait_hook_does_not_leave_the_key_claimed() {
    let store: std::sync::Arc<dyn idem_core::store::Store> =
        std::sync::Arc::new(idem_core::store::MemoryStore::new());
    let a = Idem::builder_shared(store.clone()).build();
    let b = Idem::builder_shared(store).build();
    let owner = tokio::spawn({
        let run = a.run("r1");
        async move { post_ledger(&run, "e1".into()).await }
    });
    while POSTS.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let hook = idem_core::WaitHook::new(|_| {}).on_owner(|_| panic!("progress channel closed"));
    let waiter = tokio::spawn({
        let run = b.run("r1").with_wait_hook(hook);
        async move { post_ledger(&run, "e1".into()).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    POST_GATE.add_permits(1);
    assert!(owner.await.unwrap().is_err(), "the first attempt failed with nothing done");
    let waited = waiter.await;
    let before = Instant::now();
    let again = post_ledger(&b.run("r1"), "e1".into()).await;
    assert_eq!(before.elapsed(), Duration::ZERO, "the key was not left claimed");
    match waited {
        Ok(result) => assert_eq!(result.unwrap(), "posted_e1"),
        Err(e) => panic!("the hook's panic unwound out of the call: {e:?}"),
    }
    assert_eq!(again.unwrap(), "posted_e1", "replayed");
}

static DISPATCHES: AtomicU32 = AtomicU32::new(0);
static DISPATCH_CHECKS: AtomicU32 = AtomicU32::new(0);

/// The carrier's own record: whether the dispatch was made.
async fn dispatch_made(_key: &idem_core::Key, order: String) -> idem_core::Reconciled<String> {
    DISPATCH_CHECKS.fetch_add(1, Ordering::SeqCst);
    match DISPATCHES.load(Ordering::SeqCst) {
        0 => idem_core::Reconciled::NotHappened,
        _ => idem_core::Reconciled::Happened(format!("dispatched_{order}")),
    }
}

/// Dispatches, then panics while reading the carrier's answer.
#[tool(retry = "never", reconcile = dispatch_made)]
async fn dispatch(order: String) -> Result<String, Declined> {
    DISPATCHES.fetch_add(1, Ordering::SeqCst);
    panic!("the carrier's answer to {order} was lost");
}

/// A never tool with a reconciliation check is answered by its check before "outcome unknown"
/// (`Tool::reconciles`): after a panic in its body too, as after any other attempt whose outcome
/// is not known. Without asking, the record says "unknown" for good though the check knows.
#[tokio::test(start_paused = true)]
async fn a_never_tool_that_panics_asks_its_check_before_answering_outcome_unknown() {
    let run = Idem::in_memory().run("r1");
    let first = dispatch(&run, "o1".into()).await;
    assert_eq!(DISPATCH_CHECKS.load(Ordering::SeqCst), 1, "the check was asked: {first:?}");
    assert_eq!(first.unwrap(), "dispatched_o1");
    assert_eq!(dispatch(&run, "o1".into()).await.unwrap(), "dispatched_o1", "replayed");
    assert_eq!(DISPATCHES.load(Ordering::SeqCst), 1, "a never tool runs once");
}

// The same for a hand-written `reconcile`: the check is the tool's code, and asked while the
// call holds the key's fence (after a never tool's panic or ambiguous failure, on taking a dead
// owner's record over). A panic before its future is its verdict "unknown", as one inside it.

static SHIPS: AtomicU32 = AtomicU32::new(0);
static SHIP_CHECKS: AtomicU32 = AtomicU32::new(0);

struct Ship;

static SHIP_DEF: idem_core::ToolDef = idem_core::ToolDef {
    name: "ship_crate",
    description: "",
    class: idem_core::RetryClass::Never,
    options: idem_core::ToolOptions::NONE,
};

impl idem_core::Tool for Ship {
    type Args = Region;
    type Output = String;
    type Error = Declined;
    fn def(&self) -> &'static idem_core::ToolDef {
        &SHIP_DEF
    }
    async fn run(&self, _cx: &idem_core::Ctx, args: Region) -> Result<String, Declined> {
        SHIPS.fetch_add(1, Ordering::SeqCst);
        panic!("the carrier's answer for {} was lost", args.name);
    }
    fn reconciles(&self) -> bool {
        true
    }
    fn reconcile(
        &self,
        _key: &idem_core::Key,
        args: &Region,
    ) -> impl std::future::Future<Output = idem_core::Reconciled<String>> + Send {
        SHIP_CHECKS.fetch_add(1, Ordering::SeqCst);
        // Before the future: a lookup that panics on what it reads.
        panic!("the carrier's index has no {}", args.name);
        #[allow(unreachable_code)]
        std::future::ready(idem_core::Reconciled::Unknown)
    }
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_a_hand_written_check_before_its_future_is_the_verdict_unknown() {
    let run = Idem::in_memory().run("r1");
    let region = || Region { name: "eu-1".into() };
    for _ in 0..2 {
        let before = Instant::now();
        let result = tokio::spawn({
            let run = run.clone();
            async move { run.call(&Ship, region()).await }
        })
        .await
        .expect("the check's panic did not unwind out of the call");
        assert!(matches!(result, Err(Error::OutcomeUnknown { .. })), "{result:?}");
        assert_eq!(before.elapsed(), Duration::ZERO, "settled at once, not left to its lease");
    }
    assert_eq!(SHIPS.load(Ordering::SeqCst), 1, "a never tool runs once");
    assert_eq!(SHIP_CHECKS.load(Ordering::SeqCst), 1);
}
