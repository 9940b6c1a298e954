//! Checks shared by tests/adversarial_redis.rs and tests/adversarial_postgres.rs (the Redis string
//! records and the PostgreSQL claim function): waiters on other store instances are woken, and
//! fences increase from one owner to the next under contention.

#![allow(dead_code)] // each test binary uses a part of it

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::store::{Claim, ClaimRequest, OnExpired, Outcome, Store};
use tokio::time::Instant;

/// How a holder's lease ends while another store instance waits on it.
#[derive(Clone, Copy, Debug)]
pub enum End {
    Complete,
    Release,
    Forget,
    TakeOver,
}

/// [`waiters_wake`] for every way a lease ends, over four store instances: the first holds, the
/// next two wait, the last ends the lease.
pub async fn every_end_wakes_waiters(s: &[Arc<dyn Store>]) {
    for end in [End::Complete, End::Release, End::Forget, End::TakeOver] {
        let took = waiters_wake(
            Arc::clone(&s[0]),
            vec![Arc::clone(&s[1]), Arc::clone(&s[2])],
            Arc::clone(&s[3]),
            end,
        )
        .await;
        eprintln!("{end:?}: slowest waiter {took:?}");
    }
}

/// `holder` acquires (lease 30 s, or 1 s for a takeover), `waiters` (other instances) wait with a
/// 20 s max; `ender` (a third instance) ends the lease. Every waiter must return well before its
/// max and, except for a takeover, well before the lease ends. Returns the slowest wait.
pub async fn waiters_wake(
    holder: Arc<dyn Store>,
    waiters: Vec<Arc<dyn Store>>,
    ender: Arc<dyn Store>,
    end: End,
) -> Duration {
    let (key, fp) = idem_core::conformance::fresh_key("adversarial_wake", &format!("{end:?}"));
    let lease =
        if matches!(end, End::TakeOver) { Duration::from_secs(1) } else { Duration::from_secs(30) };
    let req = ClaimRequest {
        key: &key,
        fingerprint: &fp,
        lease,
        on_expired: OnExpired::TakeOver,
        origin: Default::default(),
    };
    let Claim::Acquired { fence, .. } = holder.claim(req).await.expect("claim") else {
        panic!("fresh key must be acquired")
    };
    let max = Duration::from_secs(20);
    let started = Instant::now();
    let tasks: Vec<_> = waiters
        .into_iter()
        .flat_map(|w| (0..3).map(move |_| Arc::clone(&w)))
        .map(|w| {
            tokio::spawn(async move {
                w.wait(&key, fence, max).await.expect("wait");
                started.elapsed()
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    match end {
        End::Complete => ender
            .complete(&key, fence, &Outcome::Success("1".into()), Duration::from_secs(30))
            .await
            .expect("complete"),
        End::Release => ender.release(&key, fence).await.expect("release"),
        End::Forget => idem_tests::assert_answer!(ender.forget(&key).await, Ok(true)),
        End::TakeOver => {
            tokio::time::sleep(Duration::from_millis(900)).await;
            let req = idem_tests::claim_req(&key, &fp);
            match ender.claim(req).await.expect("claim") {
                Claim::Acquired { takeover: true, .. } => {}
                other => panic!("the expired lease must be taken over, got {other:?}"),
            }
        }
    }
    let mut slowest = Duration::ZERO;
    for t in tasks {
        let took = tokio::time::timeout(Duration::from_secs(15), t)
            .await
            .unwrap_or_else(|_| panic!("{end:?}: a waiter did not return within 15 s"))
            .expect("waiter task");
        slowest = slowest.max(took);
    }
    assert!(slowest < Duration::from_secs(10), "{end:?}: slowest waiter took {slowest:?}");
    slowest
}

/// `tasks` workers over `stores` claim one key and release it at once, for `run`. Acquisitions
/// are exclusive, so the order in which they are answered is the order of ownership. Returns
/// how many acquisitions there were and every (previous, next) pair whose next fence is not
/// above the previous one.
pub async fn owner_order_fences(
    stores: Vec<Arc<dyn Store>>,
    tasks: usize,
    run: Duration,
) -> (usize, Vec<(u64, u64)>) {
    let (key, fp) = idem_core::conformance::fresh_key("owner_order_fences", "{}");
    let order = Arc::new(Mutex::new(Vec::<u64>::new()));
    let end = Instant::now() + run;
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let store = Arc::clone(&stores[i % stores.len()]);
            let order = Arc::clone(&order);
            tokio::spawn(async move {
                while Instant::now() < end {
                    let req = idem_tests::claim_req(&key, &fp);
                    match store.claim(req).await.expect("claim") {
                        Claim::Acquired { fence, .. } => {
                            order.lock().unwrap().push(fence.0);
                            store.release(&key, fence).await.expect("release by the owner");
                        }
                        Claim::InFlight { .. } => tokio::task::yield_now().await,
                        other => panic!("{other:?}"),
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.await.expect("task");
    }
    let order = order.lock().unwrap();
    let backwards = order.windows(2).filter(|w| w[1] <= w[0]).map(|w| (w[0], w[1])).collect();
    (order.len(), backwards)
}
