//! Store outage (fail closed, docs/design.md): the store's server goes away mid-run. Calls fail closed
//! with `StoreUnavailable` and the tool body does not run while it is down; nothing runs twice
//! unprotected; calls work again by themselves once it is back, with no new store or executor.
//!
//! - Redis: the test runs its own `redis-server` on a free port (never the shared one), with an
//!   fsync-always append-only file so a crash loses nothing, and crashes (SIGKILL), restarts,
//!   hangs (SIGSTOP) and resumes (SIGCONT) it.
//! - PostgreSQL: the test puts a TCP proxy between the store and the server (`IDEM_PG_URL`) and
//!   cuts it (open connections dropped, new ones closed at once), then restores it.

#![cfg(any(feature = "redis", feature = "postgres"))]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::store::Store;
use idem_core::{Classify, Ctx, Error, Failure, Idem, Policy, RetryClass, Run, Tool, ToolDef};
use idem_tests::Never;
use idem_tests::workers::{self, Action, Ledger as Files, Log, Spec};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

/// Counts tool bodies and provider effects per intent; a gate lets the test hold bodies open.
#[derive(Default)]
struct Ledger {
    bodies: Mutex<HashMap<(&'static str, u32), u32>>,
    /// The fake provider: one effect per idempotency key for `charge`, none deduplicated for
    /// `wire`.
    provider: Mutex<HashMap<String, String>>,
    effects: Mutex<HashMap<(&'static str, u32), u32>>,
    gate: Option<Arc<Semaphore>>,
}

impl Ledger {
    fn bodies(&self, tool: &'static str, intent: u32) -> u32 {
        self.bodies.lock().unwrap().get(&(tool, intent)).copied().unwrap_or(0)
    }
    fn effects(&self, tool: &'static str, intent: u32) -> u32 {
        self.effects.lock().unwrap().get(&(tool, intent)).copied().unwrap_or(0)
    }
    async fn run(&self, tool: &'static str, intent: u32, cx: &Ctx) -> String {
        *self.bodies.lock().unwrap().entry((tool, intent)).or_default() += 1;
        if let Some(gate) = &self.gate {
            gate.acquire().await.unwrap().forget();
        }
        let effect = format!("{tool}-{intent}-attempt-{}", cx.attempt());
        if tool == "charge" {
            let mut provider = self.provider.lock().unwrap();
            if let Some(charged) = provider.get(cx.key()) {
                return charged.clone();
            }
            provider.insert(cx.key().to_owned(), effect.clone());
        }
        *self.effects.lock().unwrap().entry((tool, intent)).or_default() += 1;
        effect
    }
}

static CHARGE: ToolDef = ToolDef {
    name: "charge",
    description: "keyed",
    class: RetryClass::Keyed,
    options: idem_core::ToolOptions::NONE,
};
static WIRE: ToolDef = ToolDef {
    name: "wire",
    description: "never",
    class: RetryClass::Never,
    options: CHARGE.options,
};

struct Charge(Arc<Ledger>);
struct Wire(Arc<Ledger>);

impl Tool for Charge {
    type Args = u32;
    type Output = String;
    type Error = Never;
    fn def(&self) -> &'static ToolDef {
        &CHARGE
    }
    async fn run(&self, cx: &Ctx, intent: u32) -> Result<String, Never> {
        Ok(self.0.run("charge", intent, cx).await)
    }
}

impl Tool for Wire {
    type Args = u32;
    type Output = String;
    type Error = Never;
    fn def(&self) -> &'static ToolDef {
        &WIRE
    }
    async fn run(&self, cx: &Ctx, intent: u32) -> Result<String, Never> {
        Ok(self.0.run("wire", intent, cx).await)
    }
}

#[path = "shared/outage_servers.rs"]
mod outage_servers;
#[cfg(feature = "postgres")]
use outage_servers::Proxy;
#[cfg(feature = "redis")]
use outage_servers::Server;

#[cfg(feature = "postgres")]
#[path = "shared/pg.rs"]
mod pg;

/// An executor on `store` with a 1.5 s lease.
fn idem_on(store: Arc<dyn Store>) -> Idem {
    let policy = Policy {
        lease: Duration::from_millis(1500),
        attempt_timeout: Duration::from_secs(30),
        deadline: Duration::from_secs(30),
        ..Policy::default()
    };
    Idem::builder_shared(store).policy(policy).build()
}

/// A store server the test takes away and brings back.
enum Backend {
    #[cfg(feature = "redis")]
    Redis(Server),
    #[cfg(feature = "postgres")]
    Postgres(Box<Proxy>),
}

impl Backend {
    /// The store URL for worker processes.
    fn worker_url(&self) -> String {
        match self {
            #[cfg(feature = "redis")]
            Backend::Redis(s) => s.url(),
            #[cfg(feature = "postgres")]
            Backend::Postgres(p) => format!("pg:{}", p.conninfo()),
        }
    }

    async fn store(&self) -> Arc<dyn Store> {
        match self {
            #[cfg(feature = "redis")]
            Backend::Redis(s) => {
                Arc::new(idem_core::RedisStore::builder(s.url()).open_lazy().expect("store"))
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(p) => {
                Arc::new(idem_core::PostgresStore::connect(&p.conninfo()).await.expect("store"))
            }
        }
    }

    async fn idem(&self) -> Idem {
        idem_on(self.store().await)
    }

    fn down(&mut self) {
        match self {
            #[cfg(feature = "redis")]
            Backend::Redis(s) => s.crash(),
            #[cfg(feature = "postgres")]
            Backend::Postgres(p) => p.cut(),
        }
    }

    fn up(&mut self) {
        match self {
            #[cfg(feature = "redis")]
            Backend::Redis(s) => s.spawn().expect("restart redis-server"),
            #[cfg(feature = "postgres")]
            Backend::Postgres(p) => p.restore(),
        }
    }
}

fn unavailable<T: std::fmt::Debug>(what: &str, r: Result<T, Error<Never>>) {
    match r {
        Err(Error::StoreUnavailable { .. }) => {}
        other => panic!("{what}: expected StoreUnavailable, got {other:?}"),
    }
}

/// Calls until the store answers again (it must come back by itself), at most `tries` times.
async fn until_back<T: Tool<Args = u32, Error = Never>>(
    run: &Run,
    tool: &T,
    intent: u32,
) -> T::Output
where
    T::Output: std::fmt::Debug,
{
    for _ in 0..100 {
        match run.call(tool, intent).await {
            Ok(out) => return out,
            Err(Error::StoreUnavailable { .. }) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("after the outage: {e}"),
        }
    }
    panic!("the store did not come back by itself")
}

/// A run id no earlier run used (PostgreSQL keeps records between runs).
fn fresh_run(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{tag}-{}-{nanos}", std::process::id())
}

/// A bound on every call, so a hang fails the test instead of stalling it.
async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("a call hung while the store was down")
}

/// Calls before, during and after an outage: refused while down, no body runs, each intent runs
/// exactly once across it.
async fn outage_fails_closed_and_recovers(mut backend: Backend) {
    let ledger = Arc::new(Ledger::default());
    let (charge, wire) = (Charge(ledger.clone()), Wire(ledger.clone()));
    let idem = backend.idem().await;
    let run = idem.run(fresh_run("outage-calls"));

    for i in 0..3 {
        run.call(&charge, i).await.unwrap();
        run.call(&wire, i).await.unwrap();
    }

    backend.down();
    for i in 0..6 {
        unavailable("charge while down", bounded(run.call(&charge, i)).await);
        unavailable("wire while down", bounded(run.call(&wire, i)).await);
    }
    for i in 3..6 {
        assert_eq!(ledger.bodies("charge", i), 0, "no body may run while the store is down");
        assert_eq!(ledger.bodies("wire", i), 0, "no body may run while the store is down");
    }

    backend.up();
    until_back(&run, &charge, 0).await;
    for i in 0..6 {
        bounded(run.call(&charge, i)).await.unwrap();
        bounded(run.call(&wire, i)).await.unwrap();
    }
    for i in 0..6 {
        for tool in ["charge", "wire"] {
            assert_eq!(ledger.bodies(tool, i), 1, "{tool} {i} ran exactly once across the outage");
            assert_eq!(ledger.effects(tool, i), 1, "{tool} {i}");
        }
    }
}

/// The store goes away while bodies run: their outcomes cannot be stored then. Afterwards the
/// keyed repeat gets the one charge (replayed once the outcome is stored late, or re-run with the
/// same key after the lease: one effect at the provider either way) and the never repeat does not
/// run: it gets the wire's outcome once it is stored late.
async fn outage_during_a_call_runs_nothing_twice(mut backend: Backend) {
    let gate = Arc::new(Semaphore::new(0));
    let ledger = Arc::new(Ledger { gate: Some(gate.clone()), ..Ledger::default() });
    let (charge, wire) = (Arc::new(Charge(ledger.clone())), Arc::new(Wire(ledger.clone())));
    let idem = backend.idem().await;
    let run = idem.run(fresh_run("outage-mid-call"));

    let first_charge = tokio::spawn({
        let (run, charge) = (run.clone(), charge.clone());
        async move { run.call(&*charge, 7).await }
    });
    let first_wire = tokio::spawn({
        let (run, wire) = (run.clone(), wire.clone());
        async move { run.call(&*wire, 7).await }
    });
    for _ in 0..2000 {
        if ledger.bodies("charge", 7) + ledger.bodies("wire", 7) == 2 {
            break;
        }
        assert!(!first_charge.is_finished() && !first_wire.is_finished(), "a body did not start");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(ledger.bodies("charge", 7) + ledger.bodies("wire", 7), 2, "both bodies started");
    backend.down();
    gate.add_permits(2);
    // The effects happened; their outcomes could not be stored. The callers still get them.
    assert_eq!(bounded(first_charge).await.unwrap().unwrap(), "charge-7-attempt-1");
    assert_eq!(bounded(first_wire).await.unwrap().unwrap(), "wire-7-attempt-1");

    backend.up();
    gate.add_permits(100);
    // The claims survived, in flight: the keyed repeat takes over once the lease ends.
    let again = until_back(&run, &*charge, 7).await;
    assert_eq!(again, "charge-7-attempt-1", "the provider's one charge is replayed");
    assert_eq!(ledger.effects("charge", 7), 1, "exactly one charge");
    // The outcomes the store could not take are sent again once it is back (store_later.rs):
    // the wire's repeat gets the wire's own result. Until that lands a repeat whose lease has
    // ended answers unknown; it never runs the wire again.
    let mut wire_again = None;
    for _ in 0..150 {
        match bounded(run.call(&*wire, 7)).await {
            Ok(out) => {
                wire_again = Some(out);
                break;
            }
            Err(Error::OutcomeUnknown { .. } | Error::StoreUnavailable { .. }) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the wire after the outage: {e}"),
        }
    }
    assert_eq!(wire_again.as_deref(), Some("wire-7-attempt-1"), "its late-stored outcome");
    assert_eq!(ledger.bodies("wire", 7), 1, "a never tool never runs twice");
    assert_eq!(ledger.effects("wire", 7), 1);
}

/// Worker processes hammer the intents while the store goes away and comes back: while it is
/// down no body starts; afterwards every worker finishes by itself; across processes the keyed
/// tool has exactly one effect per intent and the never tool at most one.
async fn outage_under_worker_processes(mut backend: Backend, tag: &str) {
    let dir = workers::temp_dir(tag);
    let run = dir.file_name().and_then(|n| n.to_str()).unwrap_or(tag).to_owned();
    let url = backend.worker_url();
    let spec = |id: &str, mode: &'static str| Spec {
        exe: env!("CARGO_BIN_EXE_idem-stress-worker").into(),
        mode,
        url: url.clone(),
        dir: dir.clone(),
        run: run.clone(),
        id: id.to_owned(),
        intents: 8,
        rounds: 2,
        lease_ms: 1000,
        first: None,
        action: Action::None,
    };
    let log = Log::default();
    let handles: Vec<_> =
        ["w1", "w2", "w3", "w4"].map(|id| workers::spawn(spec(id, "hammer"), log.clone())).into();
    let busy = |l: &Log| l.all().iter().filter(|(_, line)| line.starts_with("BODY ")).count() >= 6;
    assert!(log.wait_until(Duration::from_secs(30), busy).await, "workers never got going");

    backend.down();
    // Bodies print right after their claim: one that claimed before the cut has printed by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let down_from = log.all().len();
    let refused = |l: &Log| {
        l.all()[down_from..].iter().filter(|(_, x)| x.contains(" StoreUnavailable ")).count() >= 8
    };
    assert!(log.wait_until(Duration::from_secs(20), refused).await, "calls must fail while down");
    let down_to = log.all().len();
    backend.up();

    let bodies_while_down: Vec<_> = log.all()[down_from..down_to]
        .iter()
        .filter(|(_, x)| x.starts_with("BODY "))
        .cloned()
        .collect();
    assert!(
        bodies_while_down.is_empty(),
        "bodies ran while the store was down: {bodies_while_down:?}"
    );
    for h in handles {
        let exit = h.await.expect("worker task");
        assert!(exit.success, "{} must finish by itself once the store is back", exit.id);
    }

    let final_log = Log::default();
    let exit = workers::spawn(Spec { rounds: 1, ..spec("final", "final") }, final_log.clone())
        .await
        .expect("final task");
    assert!(exit.success, "final pass failed: {:?}", final_log.all());
    let (seen, finals) = (workers::answers(&log), workers::answers(&final_log));
    workers::check(&Files::new(&dir), &seen, &finals, 8, &[], true);
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn crash_fails_closed_and_recovers() {
        let Some(server) = Server::start() else { return };
        outage_fails_closed_and_recovers(Backend::Redis(server)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn crash_during_a_call_runs_nothing_twice() {
        let Some(server) = Server::start() else { return };
        outage_during_a_call_runs_nothing_twice(Backend::Redis(server)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn crash_under_worker_processes() {
        let Some(server) = Server::start() else { return };
        outage_under_worker_processes(Backend::Redis(server), "outage-redis").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hang_fails_closed_within_the_timeout_and_recovers() {
        let Some(server) = Server::start() else { return };
        let ledger = Arc::new(Ledger::default());
        let charge = Charge(ledger.clone());
        let store = idem_core::RedisStore::builder(server.url()).open_lazy().expect("store");
        let idem = idem_on(Arc::new(store));
        let run = idem.run(fresh_run("outage-hang"));
        run.call(&charge, 0).await.unwrap();

        // A hung server (no answers, connections stay open): the response timeout fails the call.
        server.signal("STOP");
        unavailable("charge while hung", bounded(run.call(&charge, 1)).await);
        unavailable("replay while hung", bounded(run.call(&charge, 0)).await);
        assert_eq!(ledger.bodies("charge", 1), 0, "no body may run while the store hangs");
        server.signal("CONT");

        // The hung claim may still have reached the server once it resumed: then intent 1 is in
        // flight with no owner until its lease ends, and is taken over. Either way it runs once.
        until_back(&run, &charge, 1).await;
        assert_eq!(run.call(&charge, 0).await.unwrap(), "charge-0-attempt-1");
        assert_eq!(ledger.bodies("charge", 0), 1);
        assert_eq!(ledger.bodies("charge", 1), 1);
    }
}

#[cfg(feature = "redis")]
mod redis_failover {
    use super::*;

    /// Three new intents of a keyed and of a never tool, each answered by its first attempt
    /// within the bound: the store serves them `when` (after what the test did to it).
    async fn new_intents_run_once(run: &idem_core::Run, charge: &Charge, wire: &Wire, when: &str) {
        for intent in 1..4 {
            match bounded(run.call(charge, intent)).await {
                Ok(out) => assert_eq!(out, format!("charge-{intent}-attempt-1")),
                Err(e) => panic!("charge {intent} {when}: {e}"),
            }
            match bounded(run.call(wire, intent)).await {
                Ok(out) => assert_eq!(out, format!("wire-{intent}-attempt-1")),
                Err(e) => panic!("wire {intent} {when}: {e}"),
            }
        }
    }

    /// A failover behind one address (Sentinel, or a managed Redis whose primary endpoint moves
    /// to the promoted replica): the old master is demoted to a replica and keeps the store's
    /// connection open, refusing every write with `READONLY`, while new connections to the
    /// address reach the new master. The connection manager reconnects only when a connection
    /// drops, so the store must connect again by itself; a refused write ran nothing, so the
    /// call goes on on the new master instead of failing until the process restarts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_master_demoted_behind_its_address_is_left_for_the_new_one() {
        let Some(old) = Server::start() else { return };
        let Some(new) = Server::start() else { return };
        let proxy = idem_tests::proxy::Proxy::start(format!("127.0.0.1:{}", old.port())).await;
        let ledger = Arc::new(Ledger::default());
        let (charge, wire) = (Charge(ledger.clone()), Wire(ledger.clone()));
        let url = format!("redis://127.0.0.1:{}/", proxy.port());
        let store = idem_core::RedisStore::builder(url).open().await.expect("store");
        let idem = idem_on(Arc::new(store));
        let run = idem.run(fresh_run("outage-failover"));
        assert_eq!(run.call(&charge, 0).await.unwrap(), "charge-0-attempt-1");

        let client = ::redis::Client::open(old.url()).unwrap();
        let mut demote = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = ::redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(new.port())
            .query_async(&mut demote)
            .await
            .expect("REPLICAOF");
        proxy.retarget(format!("127.0.0.1:{}", new.port()));

        new_intents_run_once(&run, &charge, &wire, "after the failover").await;
        // A replay is served by the new master too.
        assert_eq!(run.call(&charge, 1).await.unwrap(), "charge-1-attempt-1");
        assert_eq!(ledger.bodies("charge", 1), 1);
    }

    /// A connection that went silent: a NAT or load balancer forgot the idle flow, or the
    /// server's address vanished in a failover, so nothing comes back and nothing closes it (the
    /// kernel gives up only after its retransmissions, about 15 minutes on Linux), while a new
    /// connection works. The connection manager reconnects only when a connection drops, so
    /// every command would wait out the response timeout until then. A timed-out step is sent
    /// again anyway (its reply may have been lost): it goes on a new connection.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_gone_silent_is_replaced() {
        let Some(server) = Server::start() else { return };
        let proxy = idem_tests::proxy::Proxy::start(format!("127.0.0.1:{}", server.port())).await;
        let ledger = Arc::new(Ledger::default());
        let (charge, wire) = (Charge(ledger.clone()), Wire(ledger.clone()));
        let url = format!("redis://127.0.0.1:{}/", proxy.port());
        let store = idem_core::RedisStore::builder(url).open().await.expect("store");
        let idem = idem_on(Arc::new(store));
        let run = idem.run(fresh_run("outage-silent"));
        assert_eq!(run.call(&charge, 0).await.unwrap(), "charge-0-attempt-1");

        proxy.stall();
        new_intents_run_once(&run, &charge, &wire, "after the connection went silent").await;
        assert_eq!(run.call(&charge, 0).await.unwrap(), "charge-0-attempt-1");
        assert_eq!(ledger.bodies("charge", 0), 1);
    }

    /// A connection set up while the server runs another client's long script: past the busy
    /// threshold (5 s) Redis answers `BUSY` to the `SELECT` of the store's database, the
    /// connection manager keeps that failed setup as its connection (it reconnects only after
    /// an I/O error) and would answer every later step with it, long after the script ended.
    /// The store replaces the manager, so calls work again once the script is over.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_setup_refused_while_a_script_ran_is_tried_again() {
        use idem_core::conformance::{LONG, fresh_key};
        use idem_core::store::{Claim, Outcome, RedisStore};
        let Some(server) = Server::start() else { return };
        // Database 1: the connection's setup sends SELECT.
        let store = RedisStore::builder(format!("{}1", server.url())).open().await.expect("store");
        let cycle = |i: u32| {
            let store = &store;
            async move {
                let (key, fp) = fresh_key("busy_setup", &format!("{{\"i\":{i}}}"));
                let Claim::Acquired { fence, .. } =
                    store.claim(idem_tests::claim_req(&key, &fp)).await?
                else {
                    panic!("a fresh key must be acquired");
                };
                store.complete(&key, fence, &Outcome::Success("1".into()), LONG).await
            }
        };
        cycle(0).await.expect("before the script");
        let url = server.url();
        let script = std::thread::spawn(move || {
            let mut conn = ::redis::Client::open(url).unwrap().get_connection().unwrap();
            let busy = "local s = tonumber(redis.call('TIME')[1]) \
                        while tonumber(redis.call('TIME')[1]) - s < 7 do end return 1";
            let _: ::redis::RedisResult<i64> =
                ::redis::cmd("EVAL").arg(busy).arg(0).query(&mut conn);
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Steps during the script fail closed; some set up a connection while it runs.
        let mut i = 1;
        while !script.is_finished() {
            let _ = tokio::time::timeout(Duration::from_secs(5), cycle(i)).await;
            i += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let ended = std::time::Instant::now();
        loop {
            i += 1;
            match tokio::time::timeout(Duration::from_secs(5), cycle(i)).await {
                Ok(Ok(())) => break,
                other => assert!(
                    ended.elapsed() < Duration::from_secs(5),
                    "steps still fail {:?} after the script ended: {other:?}",
                    ended.elapsed()
                ),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The same for the pub/sub connection: its setup refused during another client's long
    /// script (`BUSY`) must not leave waits polling for the life of the store (a server without
    /// pub/sub does); once the script is over, a wait subscribes again, which shows in its record
    /// being flagged as waited on (only a subscribed waiter flags it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pubsub_setup_refused_while_a_script_ran_is_tried_again() {
        use idem_core::conformance::fresh_key;
        use idem_core::store::{Fence, RedisStore};
        let Some(server) = Server::start() else { return };
        let url = format!("{}1", server.url());
        let store = Arc::new(RedisStore::builder(url.as_str()).open().await.expect("store"));
        let (key, fp) = fresh_key("busy_pubsub_warm", "{}");
        let fence = idem_tests::acquire(&*store, &key, &fp).await;
        store.wait(&key, fence, Duration::from_millis(200)).await.expect("warm-up wait");
        let script_url = server.url();
        let script = std::thread::spawn(move || {
            let mut conn = ::redis::Client::open(script_url).unwrap().get_connection().unwrap();
            let busy = "local s = tonumber(redis.call('TIME')[1]) \
                        while tonumber(redis.call('TIME')[1]) - s < 7 do end return 1";
            let _: ::redis::RedisResult<i64> =
                ::redis::cmd("EVAL").arg(busy).arg(0).query(&mut conn);
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut i = 0;
        while !script.is_finished() {
            let (other, _) = fresh_key("busy_pubsub_during", &format!("{{\"i\":{i}}}"));
            let _ = store.wait(&other, Fence(1), Duration::from_secs(1)).await;
            i += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Steps work again (the command connection recovers as above).
        let mut acquired = None;
        for j in 0..25 {
            let (key, fp) = fresh_key("busy_pubsub_after", &format!("{{\"j\":{j}}}"));
            match store.claim(idem_tests::claim_req(&key, &fp)).await {
                Ok(idem_core::store::Claim::Acquired { fence, .. }) => {
                    acquired = Some((key, fence));
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        let (key, fence) = acquired.expect("claims work again after the script");
        let waiting = tokio::spawn({
            let (store, key) = (Arc::clone(&store), key);
            async move { store.wait(&key, fence, Duration::from_secs(3)).await }
        });
        let mut raw = ::redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let mut flagged = false;
        for _ in 0..40 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let record: String = ::redis::cmd("GET")
                .arg(store.record_key(&key))
                .query_async(&mut raw)
                .await
                .expect("record");
            if record.split('|').nth(3) == Some("1") {
                flagged = true;
                break;
            }
        }
        store.release(&key, fence).await.expect("release");
        waiting.await.unwrap().expect("wait");
        assert!(flagged, "the wait after the script never subscribed: waits poll for good");
    }

    /// The pub/sub connection going silent: each wait subscribes to its record's channel first,
    /// and a subscription that gets no answer waits out the response timeout (under one lock,
    /// so waits queue behind each other) before the wait falls back to polling. The connection
    /// must be replaced, so that later waits are woken by the owner's completion again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pubsub_connection_gone_silent_is_replaced() {
        use idem_core::conformance::{LONG, fresh_key};
        use idem_core::store::{Outcome, RedisStore};
        let Some(server) = Server::start() else { return };
        let proxy = idem_tests::proxy::Proxy::start(format!("127.0.0.1:{}", server.port())).await;
        let url = format!("redis://127.0.0.1:{}/", proxy.port());
        let store = RedisStore::builder(url).open().await.expect("store");
        let owner = Arc::new(RedisStore::builder(server.url()).open().await.expect("owner"));
        let held = |tag: &str| {
            let (owner, (key, fp)) = (Arc::clone(&owner), fresh_key(tag, "{}"));
            async move {
                let fence = idem_tests::acquire(&*owner, &key, &fp).await;
                (key, fence)
            }
        };
        let (key, fence) = held("pubsub_warm").await;
        store.wait(&key, fence, Duration::from_millis(300)).await.expect("warm-up wait");

        proxy.stall();
        // This wait meets the silent connections (pub/sub and commands) and replaces them.
        let (key, fence) = held("pubsub_stalled").await;
        let _ = store.wait(&key, fence, Duration::from_secs(4)).await;
        for i in 0..3 {
            let (key, fence) = held("pubsub_after").await;
            let completer = Arc::clone(&owner);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(150)).await;
                let ok = Outcome::Success("1".into());
                completer.complete(&key, fence, &ok, LONG).await.expect("complete");
            });
            let started = std::time::Instant::now();
            store.wait(&key, fence, Duration::from_secs(5)).await.expect("wait");
            let took = started.elapsed();
            assert!(
                took < Duration::from_millis(800),
                "wait {i} took {took:?} for a completion 150 ms in"
            );
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cut_fails_closed_and_recovers() {
        let Some(proxy) = Proxy::start().await else { return };
        outage_fails_closed_and_recovers(Backend::Postgres(Box::new(proxy))).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cut_during_a_call_runs_nothing_twice() {
        let Some(proxy) = Proxy::start().await else { return };
        outage_during_a_call_runs_nothing_twice(Backend::Postgres(Box::new(proxy))).await;
    }

    /// A pooled connection that went silent: a NAT or load balancer forgot the flow, or the
    /// server's address vanished in a failover, so the statement gets no answer and nothing
    /// closes the connection (the kernel gives up only after its retransmissions, about 15
    /// minutes on Linux), while a new connection works. The step that waited on it fails closed
    /// at its bound; the connection must not go back to the pool, whose recycling keeps an open
    /// connection: with one connection in the pool, every later call would be given it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_gone_silent_leaves_the_pool() {
        let Some(proxy) = Proxy::start().await else { return };
        let config: tokio_postgres::Config = proxy.conninfo().parse().expect("conninfo");
        let store = idem_core::PostgresStore::connect_with(config, 1).await.expect("store");
        let ledger = Arc::new(Ledger::default());
        let charge = Charge(ledger.clone());
        let policy = Policy {
            lease: Duration::from_millis(1500),
            store_timeout: Duration::from_secs(1),
            ..Policy::default()
        };
        let idem = Idem::builder(store).policy(policy).build();
        let run = idem.run(fresh_run("outage-pg-silent"));
        assert_eq!(run.call(&charge, 0).await.unwrap(), "charge-0-attempt-1");

        proxy.stall();
        // The first calls meet the silent connection and fail closed; within a few store
        // timeouts it is gone and calls go through on a new one.
        let started = std::time::Instant::now();
        let mut intent = 1;
        while run.call(&charge, intent).await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "calls still fail {:?} after the connection went silent",
                started.elapsed()
            );
            intent += 1;
        }
        for next in intent + 1..intent + 6 {
            match bounded(run.call(&charge, next)).await {
                Ok(out) => assert_eq!(out, format!("charge-{next}-attempt-1")),
                Err(e) => panic!("charge {next} after the silent connection left: {e}"),
            }
        }
        for i in 1..intent {
            assert_eq!(ledger.bodies("charge", i), 0, "a call that failed closed ran its tool");
        }
    }

    /// The listening connection going silent: it only receives, so nothing sent on it fails
    /// and nothing closes it for hours (TCP keepalives start after 2 hours by default), while no
    /// notification arrives. The store must stop counting on it (waiters then poll at the
    /// faster pace) and listen again on a new connection.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_listener_gone_silent_is_replaced() {
        let Some(proxy) = Proxy::start().await else { return };
        let store = idem_core::PostgresStore::connect(&proxy.conninfo()).await.expect("store");
        let until = |listening: bool, within: Duration| {
            let store = store.clone();
            async move {
                let started = std::time::Instant::now();
                while store.listening() != listening {
                    assert!(
                        started.elapsed() < within,
                        "listening() stayed {} for {within:?}",
                        !listening
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        until(true, Duration::from_secs(10)).await;
        proxy.stall();
        until(false, Duration::from_secs(20)).await;
        until(true, Duration::from_secs(10)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cut_under_worker_processes() {
        let Some(proxy) = Proxy::start().await else { return };
        outage_under_worker_processes(Backend::Postgres(Box::new(proxy)), "outage-pg").await;
    }
}

#[cfg(feature = "redis")]
mod ambiguous {
    use super::*;

    /// A `never` tool's error that says the effect may have happened (a reset after send).
    #[derive(Debug, Serialize, Deserialize)]
    struct ResetAfterSend;

    impl std::fmt::Display for ResetAfterSend {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("connection reset after the request was sent")
        }
    }

    impl Classify for ResetAfterSend {
        fn classify(&self) -> Failure {
            Failure::ambiguous()
        }
    }

    static SEND: ToolDef = ToolDef {
        name: "send",
        description: "never, fails ambiguously",
        class: RetryClass::Never,
        options: CHARGE.options,
    };

    /// Its body waits for the gate, then fails ambiguously.
    struct Send(Arc<Semaphore>, Arc<std::sync::atomic::AtomicU32>);

    impl Tool for Send {
        type Args = u32;
        type Output = String;
        type Error = ResetAfterSend;
        fn def(&self) -> &'static ToolDef {
            &SEND
        }
        async fn run(&self, _cx: &Ctx, _intent: u32) -> Result<String, ResetAfterSend> {
            self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.0.acquire().await.unwrap().forget();
            Err(ResetAfterSend)
        }
    }

    /// A `never` tool fails ambiguously while the store is down, so `Unknown` cannot be stored:
    /// the caller is told the outcome is unknown (the body ran), not that nothing was executed;
    /// once the store is back and the lease has ended, a repeat does not run it again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_ambiguous_never_failure_during_outage_is_outcome_unknown() {
        let Some(mut server) = Server::start() else { return };
        let gate = Arc::new(Semaphore::new(0));
        let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let send = Arc::new(Send(gate.clone(), runs.clone()));
        let store = idem_core::RedisStore::builder(server.url()).open_lazy().expect("store");
        let idem = idem_on(Arc::new(store));
        let run = idem.run(fresh_run("outage-ambiguous"));
        let call = tokio::spawn({
            let (run, send) = (run.clone(), send.clone());
            async move { run.call(&*send, 1).await }
        });
        for _ in 0..2000 {
            if runs.load(std::sync::atomic::Ordering::SeqCst) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1, "the body started");
        server.crash();
        gate.add_permits(1);
        match bounded(call).await.unwrap() {
            Err(Error::OutcomeUnknown { .. }) => {}
            other => {
                panic!(
                    "the body ran and failed ambiguously: expected OutcomeUnknown, got {other:?}"
                )
            }
        }
        server.spawn().expect("restart redis-server");
        gate.add_permits(10);
        let mut unknown = false;
        for _ in 0..100 {
            match bounded(run.call(&*send, 1)).await {
                Err(Error::StoreUnavailable { .. }) => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(Error::OutcomeUnknown { .. }) => {
                    unknown = true;
                    break;
                }
                other => panic!("a repeat must answer OutcomeUnknown, got {other:?}"),
            }
        }
        assert!(unknown, "the store did not come back by itself");
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1, "never runs twice");
    }
}
