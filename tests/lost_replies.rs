//! Lost replies: a store step that the server carried out but whose reply never arrived (the
//! connection reset right after the command) is resolved by the caller that sent it. Each remote
//! store (Redis, PostgreSQL) runs behind a TCP proxy that forwards one request, drops its reply
//! and closes the connection; for each step (claim, complete, release, renew) the caller gets the
//! answer the first send earned, the tool body runs once, and no in-flight record is left without
//! an owner. A claim that gives up (every resend fails) releases what it created once the server
//! is back.

#![cfg(any(feature = "redis", feature = "postgres"))]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::conformance::{LONG, fresh_key};
use idem_core::store::{Claim, ClaimRequest, OnExpired, Outcome, Record, Store};
use idem_core::{Ctx, Error, Idem, Key, RetryClass, Run, Scope, StoreError, Tool, ToolDef};
use idem_tests::proxy::Proxy;
use idem_tests::{Never, acquire, claim_req};

/// A store behind a proxy (`through`), the same store reached directly (`direct`, to look behind
/// the caller's back), and the proxy.
struct Rig {
    proxy: Proxy,
    through: Arc<dyn Store>,
    direct: Arc<dyn Store>,
    /// `through`, when it is the Redis store.
    #[cfg(feature = "redis")]
    redis: Option<idem_core::RedisStore>,
}

/// The Redis rig with the store's clock sampled, so its claims take the native path
/// (`SET .. NX GET`, `idem-core/src/store/redis/native.rs`).
#[cfg(feature = "redis")]
async fn redis_rig() -> Option<Rig> {
    let rig = redis_rig_scripts().await?;
    let through = rig.redis.as_ref().expect("a Redis rig");
    // A first claim samples the server's clock in the background.
    let (key, fp) = fresh_key("warm_up", "{}");
    through.claim(claim_req(&key, &fp)).await.expect("warm-up claim");
    for _ in 0..200 {
        if through.native_ready() {
            return Some(rig);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the Redis store never sampled the server's clock");
}

/// The Redis rig on a new store, whose first claims take the claim script.
#[cfg(feature = "redis")]
async fn redis_rig_scripts() -> Option<Rig> {
    use idem_core::RedisStore;
    let url = idem_tests::redis_url();
    idem_tests::or_skip("Redis", RedisStore::open(&url).await)?;
    // `redis://[user:password@]host:port[/db]`: the proxy stands for host:port.
    let (scheme, rest) = url.split_once("://").expect("IDEM_REDIS_URL has a scheme");
    let (auth, rest) = rest.rsplit_once('@').map_or(("", rest), |(a, r)| (a, r));
    let (addr, path) = rest.split_once('/').unwrap_or((rest, ""));
    let proxy = Proxy::start(addr).await;
    let auth = if auth.is_empty() { String::new() } else { format!("{auth}@") };
    let proxied = format!("{scheme}://{auth}127.0.0.1:{}/{path}", proxy.port());
    // A prefix of this process alone: the shared server's other clients never see these keys.
    let prefix = format!("idem-lost-{}-{}", std::process::id(), nanos());
    let through = RedisStore::builder(proxied).prefix(&prefix).open().await.expect("through");
    let direct = RedisStore::builder(url).prefix(&prefix).open().await.expect("direct");
    let redis = Some(through.clone());
    Some(Rig { proxy, through: Arc::new(through), direct: Arc::new(direct), redis })
}

#[cfg(feature = "postgres")]
#[path = "shared/pg.rs"]
mod pg;

#[cfg(feature = "postgres")]
async fn postgres_rig() -> Option<Rig> {
    use idem_core::PostgresStore;
    let url = idem_tests::pg_url();
    let direct = idem_tests::or_skip("PostgreSQL", PostgresStore::connect(&url).await)?;
    let proxy = Proxy::start(pg::target()).await;
    // One connection, so every step goes through the one the proxy resets.
    let config = std::str::FromStr::from_str(&pg::through(proxy.port())).expect("config");
    let through = PostgresStore::connect_with(config, 1).await.expect("through");
    Some(Rig {
        proxy,
        through: Arc::new(through),
        direct: Arc::new(direct),
        #[cfg(feature = "redis")]
        redis: None,
    })
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

fn never(req: ClaimRequest<'_>) -> ClaimRequest<'_> {
    ClaimRequest { on_expired: OnExpired::Unknown, ..req }
}

/// The claim's reply is lost: the resend finds the claim's own record and acquires it with the
/// same fence; the record is held (in flight under that fence), then completes normally.
async fn claim(rig: Rig) {
    let (key, fp) = fresh_key("lost_claim", "{}");
    rig.proxy.lose_reply_to(key.as_str());
    let got = rig.through.claim(never(claim_req(&key, &fp))).await;
    assert_eq!(rig.proxy.lost(), 1, "the proxy must have lost the claim's reply");
    let Ok(Claim::Acquired { fence, .. }) = got else {
        panic!("a claim whose reply was lost must acquire on its resend, got {got:?}")
    };
    match rig.direct.claim(never(claim_req(&key, &fp))).await {
        Ok(Claim::InFlight { fence: held, .. }) => assert_eq!(held, fence, "held by the caller"),
        other => panic!("the record must be in flight under the caller's fence, got {other:?}"),
    }
    let ok = Outcome::Success("\"done\"".into());
    rig.through.complete(&key, fence, &ok, LONG).await.expect("the owner completes");
    let replay = rig.direct.claim(never(claim_req(&key, &fp))).await;
    assert_eq!(replay.unwrap(), Claim::Completed(Record { fingerprint: fp, outcome: ok }));
}

/// The completion's reply is lost: the resend finds the record completed under its fence and
/// succeeds (not LeaseLost); the record replays the outcome.
async fn complete(rig: Rig) {
    let (key, fp) = fresh_key("lost_complete", "{}");
    let fence = acquire(&*rig.through, &key, &fp).await;
    let ok = Outcome::Success("\"stored once\"".into());
    rig.proxy.lose_reply_to(key.as_str());
    let got = rig.through.complete(&key, fence, &ok, LONG).await;
    assert_eq!(rig.proxy.lost(), 1, "the proxy must have lost the completion's reply");
    assert!(got.is_ok(), "a completion whose reply was lost must succeed on its resend: {got:?}");
    let replay = rig.direct.claim(never(claim_req(&key, &fp))).await;
    assert_eq!(replay.unwrap(), Claim::Completed(Record { fingerprint: fp, outcome: ok }));
}

/// The completion's reply is lost and the record is kept for no time (gone at once): the resend
/// finds no record but the fence in the key's counter and succeeds (not LeaseLost); the key is
/// free, and its next fence is above the completed one.
async fn complete_kept_for_no_time(rig: Rig) {
    let (key, fp) = fresh_key("lost_complete_no_retention", "{}");
    let fence = acquire(&*rig.through, &key, &fp).await;
    rig.proxy.lose_reply_to(key.as_str());
    let got =
        rig.through.complete(&key, fence, &Outcome::Success("1".into()), Duration::ZERO).await;
    assert_eq!(rig.proxy.lost(), 1, "the proxy must have lost the completion's reply");
    assert!(got.is_ok(), "a completion whose reply was lost must succeed on its resend: {got:?}");
    match rig.direct.claim(never(claim_req(&key, &fp))).await {
        Ok(Claim::Acquired { fence: next, takeover: false }) => assert!(next > fence, "{next:?}"),
        other => panic!("the key must be free, got {other:?}"),
    }
}

/// The release's reply is lost: the resend succeeds, and the key is free (the next claim
/// acquires with a higher fence).
async fn release(rig: Rig) {
    let (key, fp) = fresh_key("lost_release", "{}");
    let fence = acquire(&*rig.through, &key, &fp).await;
    rig.proxy.lose_reply_to(key.as_str());
    let got = rig.through.release(&key, fence).await;
    assert_eq!(rig.proxy.lost(), 1, "the proxy must have lost the release's reply");
    assert!(got.is_ok(), "a release whose reply was lost must succeed on its resend: {got:?}");
    match rig.direct.claim(never(claim_req(&key, &fp))).await {
        Ok(Claim::Acquired { fence: next, .. }) => assert!(next > fence, "{next:?} > {fence:?}"),
        other => panic!("a released key must be free, got {other:?}"),
    }
}

/// The renewal's reply is lost: the resend succeeds and the lease is the renewed one.
async fn renew(rig: Rig) {
    let (key, fp) = fresh_key("lost_renew", "{}");
    let short = ClaimRequest { lease: Duration::from_secs(5), ..claim_req(&key, &fp) };
    let Ok(Claim::Acquired { fence, .. }) = rig.through.claim(short).await else {
        panic!("a fresh key must be acquired")
    };
    rig.proxy.lose_reply_to(key.as_str());
    let got = rig.through.renew(&key, fence, LONG).await;
    assert_eq!(rig.proxy.lost(), 1, "the proxy must have lost the renewal's reply");
    assert!(got.is_ok(), "a renewal whose reply was lost must succeed on its resend: {got:?}");
    match rig.direct.claim(never(claim_req(&key, &fp))).await {
        // Renewed to 30 s: well past the 5 s it was claimed with.
        Ok(Claim::InFlight { fence: held, lease_remaining }) => {
            assert_eq!(held, fence);
            assert!(lease_remaining > Duration::from_secs(20), "{lease_remaining:?}");
        }
        other => panic!("the record must be in flight under the caller's fence, got {other:?}"),
    }
}

/// The claim's reply is lost and the server stays away: every resend fails and the caller gets
/// `Unavailable`. Once the server is back, the record that first send created is released by
/// the claim that gave up, so a `never` tool's next claim acquires instead of answering Unknown.
async fn give_up(rig: Rig) {
    let (key, fp) = fresh_key("lost_give_up", "{}");
    rig.proxy.lose_reply_and_cut(key.as_str());
    let got = rig.through.claim(never(claim_req(&key, &fp))).await;
    assert_eq!(rig.proxy.lost(), 1, "the proxy must have lost the claim's reply");
    assert!(matches!(got, Err(StoreError::Unavailable(_))), "resends fail while cut: {got:?}");
    // The first send's record, in flight with nobody to complete it.
    let held = rig.direct.claim(never(claim_req(&key, &fp))).await;
    assert!(matches!(held, Ok(Claim::InFlight { .. })), "created by the first send: {held:?}");
    rig.proxy.restore();
    // The release runs in the background with backoff (100 ms doubling): poll for it.
    let mut last = None;
    for _ in 0..100 {
        match rig.direct.claim(never(claim_req(&key, &fp))).await {
            Ok(Claim::Acquired { .. }) => return,
            other => last = Some(other),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the record of the claim that gave up was never released; last answer {last:?}");
}

/// A record in flight under a dead owner whose lease (100 ms) has ended: the key a takeover takes.
async fn abandoned(
    rig: &Rig,
    name: &str,
) -> (Key, idem_core::Fingerprint, idem_core::store::Fence) {
    let (key, fp) = fresh_key(name, "{}");
    let short = ClaimRequest { lease: Duration::from_millis(100), ..claim_req(&key, &fp) };
    let Ok(Claim::Acquired { fence, .. }) = rig.direct.claim(short).await else {
        panic!("a fresh key must be acquired")
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    (key, fp, fence)
}

/// A takeover's reply is lost: the resend finds the record it took over and answers a takeover
/// again (not a fresh acquisition), so the executor still asks a `never` tool's reconciliation
/// check before running it; the fence is above the dead owner's.
async fn takeover(rig: Rig) {
    let (key, fp, dead) = abandoned(&rig, "lost_takeover").await;
    rig.proxy.lose_reply_to(key.as_str());
    let got = rig.through.claim(claim_req(&key, &fp)).await;
    assert_eq!(rig.proxy.lost(), 1, "the proxy must have lost the takeover's reply");
    let Ok(Claim::Acquired { fence, takeover }) = got else {
        panic!("a takeover whose reply was lost must acquire on its resend, got {got:?}")
    };
    assert!(takeover, "the resend must still say the record was taken over (fence {fence:?})");
    assert!(fence > dead, "the takeover's fence {fence:?} must be above the dead owner's {dead:?}");
    match rig.direct.claim(claim_req(&key, &fp)).await {
        Ok(Claim::InFlight { fence: held, .. }) => assert_eq!(held, fence, "held by the caller"),
        other => panic!("the record must be in flight under the caller's fence, got {other:?}"),
    }
}

/// A takeover's reply is lost and the server stays away: the caller gets `Unavailable`. The
/// claim that gave up must not release a record it took over (that would erase the dead owner's
/// attempt, and the next caller would run the tool as if it never had): the record is left to its
/// lease, and the next claim after it takes the key over again. (Where the lost request was only
/// a read, PostgreSQL's common statement or Redis's `SET .. NX GET`, nothing was taken over and
/// the next claim takes the dead owner's record over itself: also not a fresh key.)
async fn takeover_give_up(rig: Rig) {
    let (key, fp, dead) = abandoned(&rig, "lost_takeover_give_up").await;
    rig.proxy.lose_reply_and_cut(key.as_str());
    // Longer than the resends take to give up (about a second), so the lease is still running
    // when the server is back and the release would be sent.
    let lease = ClaimRequest { lease: Duration::from_secs(4), ..claim_req(&key, &fp) };
    let got = rig.through.claim(lease).await;
    assert_eq!(rig.proxy.lost(), 1, "the proxy must have lost the takeover's reply");
    assert!(matches!(got, Err(StoreError::Unavailable(_))), "resends fail while cut: {got:?}");
    rig.proxy.restore();
    // Time for the background release the claim would send (100 ms backoff, doubling).
    tokio::time::sleep(Duration::from_millis(600)).await;
    match rig.direct.claim(claim_req(&key, &fp)).await {
        Ok(Claim::InFlight { fence, .. }) => assert!(fence > dead, "the takeover holds it"),
        Ok(Claim::Acquired { takeover: true, .. }) => return,
        other => {
            panic!("the taken-over record must stay in flight until its lease ends: {other:?}")
        }
    }
    let mut last = None;
    for _ in 0..100 {
        match rig.direct.claim(claim_req(&key, &fp)).await {
            Ok(Claim::Acquired { takeover: true, .. }) => return,
            other => last = Some(other),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("after the lease, the next claim must take the key over; last answer {last:?}");
}

// ---------------------------------------------------------------------------------------------
// Through the executor: the caller's view.

static WIRE: ToolDef = ToolDef {
    name: "wire",
    description: "never",
    class: RetryClass::Never,
    options: idem_core::ToolOptions::NONE,
};

/// A `never` tool that counts its bodies; with `lose_completion`, its body arms the proxy so the
/// completion that follows loses its reply.
struct Wire {
    bodies: AtomicU32,
    keys: Mutex<Vec<String>>,
    lose_completion: Option<Arc<Rig>>,
}

impl Tool for Wire {
    type Args = u32;
    type Output = String;
    type Error = Never;
    fn def(&self) -> &'static ToolDef {
        &WIRE
    }
    async fn run(&self, cx: &Ctx, amount: u32) -> Result<String, Never> {
        self.bodies.fetch_add(1, Ordering::SeqCst);
        self.keys.lock().unwrap().push(cx.key().to_owned());
        if let Some(rig) = &self.lose_completion {
            rig.proxy.lose_reply_to(cx.key());
        }
        Ok(format!("wired {amount}"))
    }
}

/// The key the executor derives for `wire(amount)` in `run` (docs/key-spec.md).
fn wire_key(run: &str, amount: u32) -> Key {
    idem_core::key::derive_key(&Scope::run(run), "wire", amount.to_string().as_bytes())
}

/// A `never` tool's claim loses its reply: the call runs the body once and answers its output
/// (no StoreUnavailable, no OutcomeUnknown), and a repeat replays it.
async fn never_tool_claim(rig: Rig) {
    let rig = Arc::new(rig);
    let idem = Idem::builder_shared(Arc::clone(&rig.through)).build();
    let run_id = format!("lost-claim-{}", nanos());
    let run: Run = idem.run(&run_id);
    let tool = Wire { bodies: AtomicU32::new(0), keys: Mutex::default(), lose_completion: None };
    let key = wire_key(&run_id, 7);
    rig.proxy.lose_reply_to(key.as_str());
    let first = run.call(&tool, 7).await;
    assert_eq!(rig.proxy.lost(), 1, "the proxy must have lost the claim's reply");
    assert_eq!(tool.keys.lock().unwrap().as_slice(), [key.as_str().to_owned()]);
    assert_eq!(first.expect("the call must run and answer"), "wired 7");
    let again = run.call(&tool, 7).await;
    assert_eq!(again.expect("the repeat must replay"), "wired 7");
    assert_eq!(tool.bodies.load(Ordering::SeqCst), 1, "the body ran exactly once");
}

/// A `never` tool's completion loses its reply: the caller gets the output, the record is
/// completed (not left in flight to answer OutcomeUnknown), and a repeat replays it.
async fn never_tool_complete(rig: Rig) {
    let rig = Arc::new(rig);
    let idem = Idem::builder_shared(Arc::clone(&rig.through)).build();
    let run_id = format!("lost-complete-{}", nanos());
    let run: Run = idem.run(&run_id);
    let tool = Wire {
        bodies: AtomicU32::new(0),
        keys: Mutex::default(),
        lose_completion: Some(Arc::clone(&rig)),
    };
    let first = run.call(&tool, 9).await;
    assert_eq!(rig.proxy.lost(), 1, "the proxy must have lost the completion's reply");
    assert_eq!(first.expect("the call must answer its output"), "wired 9");
    let key = wire_key(&run_id, 9);
    let fp = idem_core::Fingerprint::of_derived_key(&key);
    match rig.direct.claim(never(claim_req(&key, &fp))).await {
        Ok(Claim::Completed(record)) => {
            assert_eq!(record.outcome, Outcome::Success("\"wired 9\"".into()));
        }
        other => panic!("the record must be completed, got {other:?}"),
    }
    let again = run.call(&tool, 9).await;
    match again {
        Ok(out) => assert_eq!(out, "wired 9"),
        Err(e @ Error::OutcomeUnknown { .. }) => panic!("false unknown outcome: {e}"),
        Err(e) => panic!("the repeat must replay: {e}"),
    }
    assert_eq!(tool.bodies.load(Ordering::SeqCst), 1, "the body ran exactly once");
}

macro_rules! lost_reply_tests {
    ($store:ident, $feature:literal, $rig:ident) => {
        #[cfg(feature = $feature)]
        mod $store {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn claim_reply_lost() {
                let Some(rig) = $rig().await else { return };
                claim(rig).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn complete_reply_lost() {
                let Some(rig) = $rig().await else { return };
                complete(rig).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn complete_reply_lost_kept_for_no_time() {
                let Some(rig) = $rig().await else { return };
                complete_kept_for_no_time(rig).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn release_reply_lost() {
                let Some(rig) = $rig().await else { return };
                release(rig).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn renew_reply_lost() {
                let Some(rig) = $rig().await else { return };
                renew(rig).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn claim_that_gives_up_releases_its_record() {
                let Some(rig) = $rig().await else { return };
                give_up(rig).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn takeover_reply_lost_is_still_a_takeover() {
                let Some(rig) = $rig().await else { return };
                takeover(rig).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn takeover_that_gives_up_is_left_to_its_lease() {
                let Some(rig) = $rig().await else { return };
                takeover_give_up(rig).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn never_tool_claim_reply_lost_runs_once() {
                let Some(rig) = $rig().await else { return };
                never_tool_claim(rig).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn never_tool_completion_reply_lost_replays() {
                let Some(rig) = $rig().await else { return };
                never_tool_complete(rig).await;
            }
        }
    };
}

lost_reply_tests!(redis, "redis", redis_rig);
lost_reply_tests!(redis_scripts, "redis", redis_rig_scripts);
lost_reply_tests!(postgres, "postgres", postgres_rig);
