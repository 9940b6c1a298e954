//! Waiting for another owner's result ([`Store::wait`]): woken by completion and release, never
//! past `max`, and prompt when there is nothing to wait for.

use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::{
    LONG, WAIT_SLACK, acquire, assert_completed, assert_in_flight, claim, complete, fresh_key,
    success,
};
use crate::key::Key;
use crate::store::{Fence, Store};

pub(super) async fn wait_for(
    store: &dyn Store,
    key: &Key,
    fence: Fence,
    max: Duration,
) -> Duration {
    let start = Instant::now();
    if let Err(e) = store.wait(key, fence, max).await {
        panic!("wait failed: {e}");
    }
    start.elapsed()
}

/// A waiter wakes promptly (well before `max`) when the holder completes, and then replays.
pub async fn wait_wakes_on_complete(store: &dyn Store) {
    let (key, fp) = fresh_key("wait_wakes_on_complete", "{}");
    let fence = acquire(store, &key, &fp, LONG).await;
    let max = Duration::from_secs(20);
    let holder = async {
        sleep(Duration::from_millis(100)).await;
        complete(store, &key, fence, &success("7"), LONG).await;
    };
    let (waited, ()) = tokio::join!(wait_for(store, &key, fence, max), holder);
    assert!(waited < max / 2, "wait must return soon after complete, took {waited:?} of {max:?}");
    assert_completed("after wait", claim(store, &key, &fp, LONG).await, &fp, &success("7"));
}

/// A waiter wakes promptly (well before `max`) when the holder releases, and then acquires.
pub async fn wait_wakes_on_release(store: &dyn Store) {
    let (key, fp) = fresh_key("wait_wakes_on_release", "{}");
    let fence = acquire(store, &key, &fp, LONG).await;
    let max = Duration::from_secs(20);
    let holder = async {
        sleep(Duration::from_millis(100)).await;
        store.release(&key, fence).await.expect("release");
    };
    let (waited, ()) = tokio::join!(wait_for(store, &key, fence, max), holder);
    assert!(waited < max / 2, "wait must return soon after release, took {waited:?} of {max:?}");
    let next = acquire(store, &key, &fp, LONG).await;
    assert!(next > fence, "the fence after release must be higher");
}

/// A waiter on a live lease returns by `max` (plus [`WAIT_SLACK`]) even though nothing happens.
pub async fn wait_never_past_max(store: &dyn Store) {
    let (key, fp) = fresh_key("wait_never_past_max", "{}");
    let fence = acquire(store, &key, &fp, LONG).await;
    for max in [Duration::ZERO, Duration::from_millis(1), Duration::from_millis(300)] {
        let waited = wait_for(store, &key, fence, max).await;
        assert!(
            waited <= max + WAIT_SLACK,
            "wait({max:?}) must not wait past max, took {waited:?}"
        );
    }
    assert_in_flight("after waits", claim(store, &key, &fp, LONG).await, fence);
}

/// wait returns promptly when the key is not held under that fence: absent, completed, held
/// under another fence.
pub async fn wait_returns_when_not_held(store: &dyn Store) {
    let max = Duration::from_secs(20);
    let (key, fp) = fresh_key("wait_returns_when_not_held", "{}");
    let waited = wait_for(store, &key, Fence(1), max).await;
    assert!(waited < max / 2, "wait on an absent key must return promptly, took {waited:?}");
    let fence = acquire(store, &key, &fp, LONG).await;
    let waited = wait_for(store, &key, Fence(fence.0 + 1), max).await;
    assert!(waited < max / 2, "wait on another fence must return promptly, took {waited:?}");
    complete(store, &key, fence, &success("1"), LONG).await;
    let waited = wait_for(store, &key, fence, max).await;
    assert!(waited < max / 2, "wait on a completed key must return promptly, took {waited:?}");
}
