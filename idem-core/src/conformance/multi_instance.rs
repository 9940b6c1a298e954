//! The multi-instance tier: two store instances over one backend (two handles on one SQLite file,
//! one PostgreSQL database, one Redis server), as two processes would hold them. Each test takes
//! both and checks that the protocol holds across them: what one instance writes, the other
//! reads, waits on, and fences against. Run it with
//! [`store_multi_instance_tests!`](crate::store_multi_instance_tests).

use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::sleep;

use super::wait::wait_for;
use super::{
    LONG, PAST_SHORT, SHORT, acquire, assert_completed, assert_in_flight, assert_lease_lost, claim,
    complete, fence_turns, fresh_key, req, success,
};
use crate::store::{Claim, OnExpired, Store};

/// Generates one `#[tokio::test]` per behaviour of the multi-instance tier.
///
/// The first tokens are the test attribute; then an expression, evaluated in each test's async
/// body, of type `Option<(P, P)>` where `P` derefs to a [`Store`]: two instances over the same
/// backend, each with its own connections. `None` skips the test.
#[macro_export]
macro_rules! store_multi_instance_tests {
    (#[$attr:meta] $make:expr) => {
        $crate::store_multi_instance_tests!(@each #[$attr] $make;
            one_claim_wins_across_instances,
            completion_replays_on_the_other_instance,
            waiter_is_woken_by_the_other_instance,
            takeover_across_instances_after_expiry,
            fences_increase_across_instances,
            a_replayed_key_changed_elsewhere_answers_as_now,
        );
    };
    (@each #[$attr:meta] $make:expr; $($name:ident,)*) => {
        $(
            #[$attr]
            async fn $name() {
                let Some((a, b)) = $make else { return };
                let (a, b): (&dyn $crate::Store, &dyn $crate::Store) = (&*a, &*b);
                $crate::conformance::$name(a, b).await;
            }
        )*
    };
}

/// 16 concurrent claims of one free key on each instance: exactly one of the 32 acquires, and
/// every other, on either instance, sees the winner's fence in flight.
pub async fn one_claim_wins_across_instances(a: &dyn Store, b: &dyn Store) {
    let (key, fp) = fresh_key("one_claim_wins_across_instances", "{}");
    let claims = join_all((0..32).map(|i| {
        let store = if i % 2 == 0 { a } else { b };
        store.claim(req(&key, &fp, LONG, OnExpired::TakeOver))
    }));
    let claims: Vec<Claim> = claims.await.into_iter().map(|r| r.expect("claim failed")).collect();
    super::one_winner(&claims, "over both instances", "a losing claim on either instance");
    // Sequentially too: the other instance sees the holder.
    let (key, fp) = fresh_key("one_claim_wins_across_instances", "{\"sequential\":true}");
    let fence = acquire(a, &key, &fp, LONG).await;
    assert_in_flight("a claim on the other instance", claim(b, &key, &fp, LONG).await, fence);
}

/// A completion on one instance is replayed, exactly, by the other; the other cannot complete
/// the record again under the same fence with another outcome.
pub async fn completion_replays_on_the_other_instance(a: &dyn Store, b: &dyn Store) {
    let (key, fp) = fresh_key("completion_replays_on_the_other_instance", "{}");
    let fence = acquire(a, &key, &fp, LONG).await;
    complete(a, &key, fence, &success("{\"id\":\"ch_1\"}"), LONG).await;
    let got = claim(b, &key, &fp, LONG).await;
    assert_completed("a claim on the other instance", got, &fp, &success("{\"id\":\"ch_1\"}"));
    assert_lease_lost(
        "a second completion on the other instance",
        b.complete(&key, fence, &success("\"other\""), LONG).await,
    );
    let got = claim(a, &key, &fp, LONG).await;
    assert_completed("a claim on the first instance", got, &fp, &success("{\"id\":\"ch_1\"}"));
}

/// A waiter on one instance returns well before its `max` when the holder completes on the
/// other, and then replays; likewise when the holder releases, after which it acquires.
pub async fn waiter_is_woken_by_the_other_instance(a: &dyn Store, b: &dyn Store) {
    let max = Duration::from_secs(20);
    let (key, fp) = fresh_key("waiter_is_woken_by_the_other_instance", "{}");
    let fence = acquire(a, &key, &fp, LONG).await;
    let holder = async {
        sleep(Duration::from_millis(100)).await;
        complete(a, &key, fence, &success("7"), LONG).await;
    };
    let (waited, ()) = tokio::join!(wait_for(b, &key, fence, max), holder);
    assert!(
        waited < max / 2,
        "a wait must return soon after a completion on the other instance, took {waited:?} of \
         {max:?}"
    );
    assert_completed("after the wait", claim(b, &key, &fp, LONG).await, &fp, &success("7"));

    let (key, fp) = fresh_key("waiter_is_woken_by_the_other_instance", "{\"release\":true}");
    let fence = acquire(b, &key, &fp, LONG).await;
    let holder = async {
        sleep(Duration::from_millis(100)).await;
        b.release(&key, fence).await.expect("release");
    };
    let (waited, ()) = tokio::join!(wait_for(a, &key, fence, max), holder);
    assert!(
        waited < max / 2,
        "a wait must return soon after a release on the other instance, took {waited:?} of \
         {max:?}"
    );
    let next = acquire(a, &key, &fp, LONG).await;
    assert!(next > fence, "the fence after the release {next:?} must exceed {fence:?}");
}

/// A lease taken on one instance is not taken over by the other while it lives; once it expired
/// the other takes it over with a higher fence, the first owner's calls fail with `LeaseLost`,
/// and the new owner's result is what both replay.
pub async fn takeover_across_instances_after_expiry(a: &dyn Store, b: &dyn Store) {
    let (key, fp) = fresh_key("takeover_across_instances_after_expiry", "{}");
    let old = acquire(a, &key, &fp, SHORT).await;
    assert_in_flight(
        "a claim on the other instance before expiry",
        claim(b, &key, &fp, LONG).await,
        old,
    );
    sleep(PAST_SHORT).await;
    let new = match claim(b, &key, &fp, LONG).await {
        Claim::Acquired { fence, takeover: true } => fence,
        other => panic!("a claim on the other instance after expiry must take over, got {other:?}"),
    };
    assert!(new > old, "the takeover fence {new:?} must be higher than the old {old:?}");
    assert_lease_lost(
        "the old owner's complete",
        a.complete(&key, old, &success("\"old\""), LONG).await,
    );
    assert_lease_lost("the old owner's renew", a.renew(&key, old, LONG).await);
    assert_lease_lost("the old owner's release", a.release(&key, old).await);
    assert_in_flight("after the old owner's calls", claim(a, &key, &fp, LONG).await, new);
    complete(b, &key, new, &success("\"new\""), LONG).await;
    for (what, store) in [("first", a), ("second", b)] {
        let got = claim(store, &key, &fp, LONG).await;
        assert_completed(&format!("a claim on the {what} instance"), got, &fp, &success("\"new\""));
    }
}

/// Fences of one key strictly increase while the instances take turns: acquire and release on
/// each, a takeover by the other, forget on the other, and retention expiry.
pub async fn fences_increase_across_instances(a: &dyn Store, b: &dyn Store) {
    fence_turns("fences_increase_across_instances", a, b, " across instances").await;
}

/// A key completed and replayed on `a` (which may now read it first as a likely replay), then
/// changed through `b`: forgotten, claimed and held, released. Each claim on `a` answers what the
/// key is now, never the replay `a` saw before: held by `b`'s fence, then acquired by `a` with a
/// fence above `b`'s. Other arguments under the completed key are a mismatch.
pub async fn a_replayed_key_changed_elsewhere_answers_as_now(a: &dyn Store, b: &dyn Store) {
    let (key, fp) = fresh_key("a_replayed_key_changed_elsewhere", "{}");
    let fence = acquire(a, &key, &fp, LONG).await;
    let done = success("1");
    complete(a, &key, fence, &done, LONG).await;
    for round in 0..2 {
        let what = format!("replay {round} on the instance that completed it");
        assert_completed(&what, claim(a, &key, &fp, LONG).await, &fp, &done);
    }
    let other = super::other_fingerprint();
    assert_ne!(fp, other);
    match claim(a, &key, &other, LONG).await {
        Claim::Mismatch => {}
        got => panic!("other arguments under a completed key are a mismatch, got {got:?}"),
    }
    assert!(b.forget(&key).await.expect("forget on the other instance"), "the record existed");
    let held = acquire(b, &key, &fp, LONG).await;
    let what = "a claim after the other instance forgot the key and claimed it again";
    assert_in_flight(what, claim(a, &key, &fp, LONG).await, held);
    b.release(&key, held).await.expect("release on the other instance");
    let again = acquire(a, &key, &fp, LONG).await;
    assert!(again.0 > held.0, "fence {} after the other instance's {}", again.0, held.0);
}
