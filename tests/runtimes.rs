//! A store's life across Tokio runtimes: one store kept in a `static` and used by one
//! `#[tokio::test]` after another, each with a runtime of its own that ends with the test. What a
//! store started in the background on the first runtime ended with it; the store must start it
//! again on the next one, not keep working half deaf.
//! Run: cargo test --features sqlite,postgres,redis --test runtimes

#![allow(dead_code)] // each store's part is gated on its feature

use tokio::runtime::Runtime;

#[cfg(feature = "redis")]
#[path = "shared/redis_records.rs"]
mod redis_records;

/// A runtime as `#[tokio::test]` makes one (current thread, timers and I/O).
fn test_runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

/// PostgreSQL wakes waiters with `LISTEN/NOTIFY` on a connection of its own, driven by a task.
#[cfg(feature = "postgres")]
mod postgres {
    use std::time::Duration;

    use idem_core::conformance::fresh_key;
    use idem_core::{PostgresStore, Store};
    use idem_tests::{acquire, or_skip, pg_url};

    use super::test_runtime;

    /// Until the store listens, at most 20 s (a hang guard: the listener connects and hears its
    /// probe at once on a local server).
    async fn listening(store: &PostgresStore) -> bool {
        for _ in 0..400 {
            if store.listening() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// The listener runs on the runtime the store was connected on. Once that runtime ended, the
    /// store said it listened while nobody did (waiters polled at the slow pace meant for a lost
    /// notification) and never listened again; now it says so, and its next wait starts the
    /// listener on the runtime it runs on.
    #[test]
    fn a_store_listens_again_on_the_next_runtime() {
        let first = test_runtime();
        let Some(store) = first.block_on(async {
            let store = or_skip("PostgreSQL", PostgresStore::connect(&pg_url()).await)?;
            assert!(listening(&store).await, "the store listens on its first runtime");
            Some(store)
        }) else {
            return;
        };
        drop(first);
        assert!(!store.listening(), "the listener ended with its runtime: nobody listens");

        test_runtime().block_on(async {
            let (key, fp) = fresh_key("listens_again", "{}");
            let fence = acquire(&store, &key, &fp).await;
            store.wait(&key, fence, Duration::from_millis(10)).await.expect("wait");
            assert!(listening(&store).await, "a wait on the next runtime starts the listener");
            store.release(&key, fence).await.expect("release");
        });
    }
}

/// Redis wakes waiters by pub/sub on a connection of its own, whose messages the redis crate
/// delivers in a task on the runtime it was made on; native claims need a sample of the
/// server's clock, taken in a task.
#[cfg(feature = "redis")]
mod redis {
    use std::time::Duration;

    use idem_core::conformance::{LONG, fresh_key};
    use idem_core::store::{Claim, Outcome, RedisStore, Store};
    use idem_tests::{acquire, claim_req, or_skip, redis_prefix, redis_url};

    use super::test_runtime;

    use super::redis_records as records;

    /// The store on this process's own key prefix, or `None` (skipped) without a server.
    pub(super) async fn open() -> Option<RedisStore> {
        let opened = RedisStore::builder(redis_url()).prefix(redis_prefix()).open().await;
        or_skip("Redis", opened)
    }

    /// The redis crate drives a connection in a task on the runtime it was made on. Once that
    /// runtime ended, the store's first step of each kind that is not sent again by itself (a
    /// wait, a forget, a listing) failed with `StoreUnavailable` ("broken pipe") while the
    /// server was up; now the store connects again on the runtime it runs on.
    #[test]
    fn the_first_steps_on_the_next_runtime_are_answered() {
        let first = test_runtime();
        let Some(store) = first.block_on(open()) else { return };
        let (key, fp) = fresh_key("first_steps_next_runtime", "{}");
        first.block_on(async {
            let fence = acquire(&store, &key, &fp).await;
            store.complete(&key, fence, &Outcome::Success("1".into()), LONG).await.unwrap();
        });
        drop(first);

        test_runtime().block_on(async {
            let (held, _) = fresh_key("first_steps_next_runtime", "held");
            let fence = acquire(&open().await.expect("Redis"), &held, &fp).await;
            idem_tests::assert_answer!(
                store.wait(&held, fence, Duration::from_millis(10)).await,
                Ok(())
            );
            idem_tests::assert_answer!(store.forget(&key).await, Ok(true));
            idem_tests::assert_answer!(store.forget(&held).await, Ok(true));
        });
    }

    /// A store opened with `open_lazy` connects on its first use, on the runtime of that use,
    /// which need not be the one it was opened on: a store opened on a runtime that lives on
    /// (the process's) and first used by a test's. Once that test's runtime ended, the store's
    /// next forget on the living runtime failed with `StoreUnavailable` ("broken pipe") while
    /// the server was up, as the store watched the runtime it was opened on.
    #[test]
    fn a_lazy_store_first_used_on_another_runtime_is_answered_after_it_ended() {
        let living =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build();
        let living = living.expect("runtime");
        let lazy = || RedisStore::builder(redis_url()).prefix(redis_prefix()).open_lazy();
        let Some(store) = living.block_on(async { or_skip("Redis", lazy()) }) else { return };
        let (key, fp) = fresh_key("lazy_first_used_elsewhere", "{}");
        test_runtime().block_on(async {
            let fence = acquire(&store, &key, &fp).await;
            store.complete(&key, fence, &Outcome::Success("1".into()), LONG).await.unwrap();
        });
        living.block_on(async {
            idem_tests::assert_answer!(store.forget(&key).await, Ok(true));
        });
    }

    /// A waiter whose store was opened on an earlier runtime is woken by the completion's
    /// message. The clock is frozen while it waits (a blocking task holds Tokio's paused clock
    /// still), so its periodic re-check never comes: only the message can end the wait. Before,
    /// the messages went to a task of the ended runtime and were lost, and every wait lasted
    /// until a re-check (up to 1 s).
    #[test]
    fn a_waiter_is_woken_by_pub_sub_on_the_next_runtime() {
        let first = test_runtime();
        let Some(waiter) = first.block_on(open()) else { return };
        drop(first);

        test_runtime().block_on(async {
            let holder = open().await.expect("Redis");
            // An earlier test's wait on this runtime (the store's first, which finds the
            // subscriber's old connection gone).
            let (key, fp) = fresh_key("woken_next_runtime", "earlier");
            let fence = acquire(&holder, &key, &fp).await;
            waiter.wait(&key, fence, Duration::from_millis(100)).await.expect("wait");
            holder.release(&key, fence).await.expect("release");

            let (key, fp) = fresh_key("woken_next_runtime", "{}");
            let fence = acquire(&holder, &key, &fp).await;
            let waiting = tokio::spawn({
                let waiter = waiter.clone();
                async move { waiter.wait(&key, fence, Duration::from_secs(3600)).await }
            });
            // Subscribed and flagged: the holder's completion publishes.
            let mut raw = records::raw().await;
            let rec = holder.record_key(&key);
            while records::field(&records::stored(&mut raw, &rec).await, 3) != "1" {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // From here the clock stands still until the blocking task ends (after 30 s at most).
            let (stop, stopped) = std::sync::mpsc::channel::<()>();
            let frozen = tokio::task::spawn_blocking(move || {
                stopped.recv_timeout(Duration::from_secs(30)).is_ok()
            });
            tokio::time::pause();
            holder.complete(&key, fence, &Outcome::Success("1".into()), LONG).await.unwrap();
            let waited = waiting.await.expect("waiter");
            let _ = stop.send(());
            assert!(
                frozen.await.expect("blocking task"),
                "the waiter must be woken by the completion's message, not by a re-check"
            );
            tokio::time::resume();
            waited.expect("wait");
            let replay = waiter.claim(claim_req(&key, &fp)).await.expect("claim");
            assert!(matches!(replay, Claim::Completed(_)), "{replay:?}");
        });
    }

    /// The first claim has the store sample the server's clock in a task. Dropped with its
    /// runtime before the answer came (a test that ends right after its claim), the task kept
    /// the job of sampling for good: no later claim sampled, and every claim ran the script
    /// instead of the native command. Now the next claim samples again.
    #[test]
    fn native_claims_resume_on_the_next_runtime() {
        let first = test_runtime();
        let Some(store) = first.block_on(open()) else { return };
        let (key, fp) = fresh_key("native_next_runtime", "first");
        first.block_on(async {
            // Polled once: the claim has started the sampling task, which has not run yet.
            let mut claim = std::pin::pin!(store.claim(claim_req(&key, &fp)));
            std::future::poll_fn(|cx| {
                let _ = claim.as_mut().poll(cx);
                std::task::Poll::Ready(())
            })
            .await;
        });
        drop(first);

        test_runtime().block_on(async {
            for i in 0..200 {
                let (key, fp) = fresh_key("native_next_runtime", &i.to_string());
                let fence = acquire(&store, &key, &fp).await;
                store.release(&key, fence).await.expect("release");
                if store.native_ready() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("the store never sampled the server's clock again: every claim runs a script");
        });
    }
}

/// Tokio's paused test clock (`#[tokio::test(start_paused = true)]`) skips ahead to the next
/// timer whenever the runtime only waits on I/O, so the bounds on a remote store's steps run
/// out at once, however fast the server answers (a local PostgreSQL's connect often does).
/// The error said the server was not answering; it now says the clock is paused. A server that
/// accepts connections and never answers makes every such timeout run out here.
#[cfg(any(feature = "postgres", feature = "redis"))]
mod paused_clock {
    use idem_core::StoreError;

    /// The port of a server that accepts connections and never answers.
    async fn silent_server() -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        port
    }

    /// An error and its causes, as a report prints them.
    fn chain(e: &(dyn std::error::Error + 'static)) -> String {
        let mut text = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            text.push_str(&format!(": {c}"));
            cause = c.source();
        }
        text
    }

    fn says_paused(what: &str, e: Option<StoreError>) {
        let e = e.unwrap_or_else(|| panic!("{what}: a silent server cannot be opened"));
        let text = chain(&e);
        assert!(text.contains("clock is paused"), "{what}: {text}");
    }

    #[cfg(feature = "postgres")]
    #[tokio::test(start_paused = true)]
    async fn a_postgresql_timeout_on_a_paused_clock_says_so() {
        let port = silent_server().await;
        let url = format!("host=127.0.0.1 port={port} user=postgres dbname=test sslmode=disable");
        says_paused("connect", idem_core::PostgresStore::connect(&url).await.err());
    }

    #[cfg(feature = "redis")]
    #[tokio::test(start_paused = true)]
    async fn a_redis_timeout_on_a_paused_clock_says_so() {
        let port = silent_server().await;
        let url = format!("redis://127.0.0.1:{port}/");
        says_paused("open", idem_core::store::RedisStore::open(&url).await.err());
        // A store that connects on first use: the call's claim runs out instead.
        let lazy = idem_core::store::RedisStore::builder(url).open_lazy().expect("lazy");
        let idem = idem_core::Idem::builder_shared(std::sync::Arc::new(lazy)).build();
        let failed = charge(&idem.run("paused"), "cus_1".into()).await.expect_err("no store");
        assert!(chain(&failed).contains("clock is paused"), "{}", chain(&failed));
    }

    /// A test on a real clock that once paused and advanced it (then resumed): its clock runs
    /// with real time again, ahead of it. A store that really did not answer must not be
    /// explained by a paused clock, which would send the reader after the test's clock instead
    /// of the server.
    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn a_timeout_on_a_resumed_clock_does_not_say_paused() {
        use std::time::Duration;
        tokio::time::pause();
        tokio::time::advance(Duration::from_secs(5)).await;
        tokio::time::resume();
        let port = silent_server().await;
        let opened = idem_core::store::RedisStore::builder(format!("redis://127.0.0.1:{port}/"))
            .connection_timeout(Duration::from_millis(200))
            .response_timeout(Duration::from_millis(200))
            .open()
            .await;
        let Err(e) = opened else { panic!("a silent server cannot be opened") };
        let text = chain(&e);
        assert!(text.contains("did not answer"), "{text}");
        assert!(!text.contains("paused"), "{text}");
    }

    #[cfg(feature = "redis")]
    #[idem_core::tool(retry = "keyed")]
    async fn charge(customer: String) -> Result<String, idem_core::NoError> {
        Ok(customer)
    }
}

/// Outside any Tokio runtime (`futures::executor::block_on`, another executor): a call is refused
/// before anything runs, with a message naming the runtime it needs, instead of Tokio's panic
/// ("there is no reactor running") from inside idem, which came at the first timer or store step:
/// for a tool that was not done at its first poll, with its work under way.
mod no_runtime {
    use std::future::Future;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::task::{Context, Poll, Waker};

    use idem_core::{Error, ErrorKind, Idem, NoError, Run, tool};

    static STARTED: AtomicU32 = AtomicU32::new(0);

    /// Not done at its first poll, as any tool that waits on I/O.
    #[tool(retry = "keyed")]
    async fn charge(amount: u64) -> Result<u64, NoError> {
        STARTED.fetch_add(1, Ordering::SeqCst);
        let mut polled = false;
        std::future::poll_fn(|cx| {
            if polled {
                return Poll::Ready(());
            }
            polled = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        })
        .await;
        Ok(amount)
    }

    /// Polls on this thread until ready, as a minimal executor without Tokio does.
    fn block_on<F: Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
            std::thread::yield_now();
        }
    }

    fn refused(run: &Run) {
        let before = STARTED.load(Ordering::SeqCst);
        let err: Error<NoError> = block_on(charge(run, 7)).expect_err("no runtime");
        assert_eq!(err.kind(), ErrorKind::StoreUnavailable, "{err}");
        let text = idem_core::ErrorChain(&err).to_string();
        assert!(text.contains("call it from inside a Tokio runtime"), "{text}");
        assert_eq!(STARTED.load(Ordering::SeqCst), before, "the tool did not start");
    }

    /// A store's wait used directly (operator code, a store wrapper) outside a runtime, or on
    /// one without timers, is a configuration error, as the SQLite store's other steps are.
    /// Before, the wait's timeout was Tokio's panic.
    #[test]
    fn a_store_wait_outside_a_runtime_or_without_timers_is_refused() {
        use std::time::Duration;

        use idem_core::store::{Claim, ClaimRequest, OnExpired, Store, StoreError};

        fn refused_wait(store: &dyn Store) {
            let (key, fingerprint) = idem_core::conformance::fresh_key("wait_no_runtime", "{}");
            let no_timers = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let full = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let claim = ClaimRequest {
                key: &key,
                fingerprint: &fingerprint,
                lease: Duration::from_secs(60),
                on_expired: OnExpired::TakeOver,
                origin: Default::default(),
            };
            let Ok(Claim::Acquired { fence, .. }) = full.block_on(store.claim(claim)) else {
                panic!("claimed")
            };
            let max = Duration::from_millis(10);
            let outside = block_on(store.wait(&key, fence, max));
            assert!(
                matches!(&outside, Err(StoreError::InvalidConfig(m)) if m.contains("Tokio runtime")),
                "{outside:?}"
            );
            let without = no_timers.block_on(store.wait(&key, fence, max));
            assert!(
                matches!(&without, Err(StoreError::InvalidConfig(m)) if m.contains("enable_time")),
                "{without:?}"
            );
            // With timers it waits, and the record is still in flight.
            assert!(full.block_on(store.wait(&key, fence, max)).is_ok());
        }

        refused_wait(&idem_core::MemoryStore::new());
        #[cfg(feature = "sqlite")]
        {
            let dir = std::env::temp_dir()
                .join(format!("idem-no-runtime-wait-{}", idem_tests::process_tag()));
            std::fs::create_dir_all(&dir).expect("temp dir");
            refused_wait(&idem_core::SqliteStore::open(dir.join("idem.db")).expect("open"));
            let _ = std::fs::remove_dir_all(&dir);
        }
        // Multi-thread: its connections' tasks go on while the test blocks on other runtimes.
        let opening = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        #[cfg(feature = "postgres")]
        refused_wait(
            &opening.block_on(idem_core::PostgresStore::connect(&idem_tests::pg_url())).unwrap(),
        );
        #[cfg(feature = "redis")]
        refused_wait(
            &opening.block_on(idem_core::RedisStore::open(&idem_tests::redis_url())).unwrap(),
        );
        drop(opening);
    }

    #[test]
    fn a_call_outside_a_runtime_is_refused_before_it_runs() {
        let idem = Idem::in_memory();
        refused(&idem.run("no-runtime"));
        // The same call inside a runtime runs once.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let before = STARTED.load(Ordering::SeqCst);
        assert_eq!(rt.block_on(charge(&idem.run("no-runtime"), 7)).expect("runs"), 7);
        assert_eq!(STARTED.load(Ordering::SeqCst) - before, 1);

        #[cfg(feature = "sqlite")]
        {
            let dir =
                std::env::temp_dir().join(format!("idem-no-runtime-{}", idem_tests::process_tag()));
            std::fs::create_dir_all(&dir).expect("temp dir");
            let store = idem_core::SqliteStore::open(dir.join("idem.db")).expect("open");
            // The store used directly, as operator code may (its blocking pool is Tokio's).
            let key = idem_core::conformance::fresh_key("no_runtime", "{}").0;
            let inspected = block_on(idem_core::store::Store::inspect(&store, &key));
            assert!(
                matches!(&inspected, Err(idem_core::store::StoreError::InvalidConfig(m)) if m.contains("Tokio runtime")),
                "{inspected:?}"
            );
            let url = format!("sqlite:{}", dir.join("idem.db").display());
            let opened = block_on(idem_core::store::open(&url)).map(drop);
            assert!(
                matches!(&opened, Err(idem_core::store::StoreError::InvalidConfig(m)) if m.contains("Tokio runtime")),
                "{opened:?}"
            );
            refused(&Idem::builder(store).build().run("no-runtime"));
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// A store's own steps outside a runtime (an operator's script under another executor
    /// forgetting a record, listing, waiting) are refused with the same message, not a panic from
    /// inside the store.
    #[test]
    fn store_steps_outside_a_runtime_are_refused() {
        use std::time::Duration;

        use idem_core::{Store, StoreError};

        fn says_tokio(step: &str, e: StoreError) {
            match e {
                StoreError::InvalidConfig(m) => {
                    assert!(m.contains("call it from inside a Tokio runtime"), "{step}: {m}")
                }
                other => panic!("{step}: {other:?}"),
            }
        }

        let memory = idem_core::MemoryStore::new();
        let (key, fp) = idem_core::conformance::fresh_key("no-runtime-memory", "{}");
        let fence = block_on(idem_tests::acquire(&memory, &key, &fp));
        let waited =
            std::panic::catch_unwind(|| block_on(memory.wait(&key, fence, Duration::from_secs(1))));
        says_tokio("memory wait", waited.expect("no panic").expect_err("refused"));

        #[cfg(feature = "sqlite")]
        {
            let dir = std::env::temp_dir()
                .join(format!("idem-no-runtime-steps-{}", idem_tests::process_tag()));
            std::fs::create_dir_all(&dir).expect("temp dir");
            let store = idem_core::SqliteStore::open(dir.join("idem.db")).expect("open");
            let req = idem_tests::claim_req(&key, &fp);
            let claimed = std::panic::catch_unwind(|| block_on(store.claim(req)));
            says_tokio("sqlite claim", claimed.expect("no panic").expect_err("refused"));
            let forgot = std::panic::catch_unwind(|| block_on(store.forget(&key)));
            says_tokio("sqlite forget", forgot.expect("no panic").expect_err("refused"));
            let stats = std::panic::catch_unwind(|| block_on(store.stats()));
            says_tokio("sqlite stats", stats.expect("no panic").expect_err("refused"));
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// Every step of a network store used directly (an operator's script, a store wrapper, a
    /// store kept in a `static` and reached from another executor) outside a runtime, or on a
    /// runtime without I/O, is refused as a configuration error naming what is missing. Before,
    /// only a call through the executor and a wait were: the others were the connection's panic
    /// from inside the redis or deadpool crate. What the steps would have touched is unchanged.
    #[cfg(any(feature = "postgres", feature = "redis"))]
    fn network_steps_refused(
        store: &dyn idem_core::Store,
        name: &str,
        full: &tokio::runtime::Runtime,
    ) {
        use std::panic::AssertUnwindSafe;
        use std::time::Duration;

        use idem_core::store::{ListQuery, Outcome, Resolution, StoreError};

        let (key, fp) = idem_core::conformance::fresh_key(&format!("network-steps-{name}"), "{}");
        let fence = full.block_on(idem_tests::acquire(store, &key, &fp));
        let no_io =
            tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
        let outcome = Outcome::Success("1".to_owned());
        let ttl = Duration::from_secs(60);
        let resolution = Resolution::NotHappened;
        let query = ListQuery::default();
        // Each step, as a future made anew for each way of running it.
        type Step<'a> = Box<
            dyn Fn() -> std::pin::Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>>
                + 'a,
        >;
        let steps: Vec<(&str, Step<'_>)> = vec![
            (
                "claim",
                Box::new(|| {
                    Box::pin(async {
                        store.claim(idem_tests::claim_req(&key, &fp)).await.map(drop)
                    })
                }),
            ),
            ("complete", Box::new(|| Box::pin(store.complete(&key, fence, &outcome, ttl)))),
            ("release", Box::new(|| Box::pin(store.release(&key, fence)))),
            ("renew", Box::new(|| Box::pin(store.renew(&key, fence, ttl)))),
            ("forget", Box::new(|| Box::pin(async { store.forget(&key).await.map(drop) }))),
            (
                "forget_seen",
                Box::new(|| {
                    Box::pin(async { store.forget_seen(&key, fence, false).await.map(drop) })
                }),
            ),
            ("inspect", Box::new(|| Box::pin(async { store.inspect(&key).await.map(drop) }))),
            ("list", Box::new(|| Box::pin(async { store.list(&query).await.map(drop) }))),
            ("resolve", Box::new(|| Box::pin(store.resolve(&key, fence, &resolution)))),
            ("stats", Box::new(|| Box::pin(async { store.stats().await.map(drop) }))),
        ];
        for (step, make) in &steps {
            for (how, wanted) in
                [("outside a runtime", "Tokio runtime"), ("without I/O", "enable_io")]
            {
                let ran = std::panic::catch_unwind(AssertUnwindSafe(|| match how {
                    "outside a runtime" => block_on(make()),
                    _ => no_io.block_on(make()),
                }));
                let Ok(ran) = ran else { panic!("{name} {step} {how}: panicked") };
                match ran {
                    Err(StoreError::InvalidConfig(m)) if m.contains(wanted) => {}
                    other => panic!("{name} {step} {how}: {other:?}"),
                }
            }
        }
        // Nothing was touched: the key is still in flight under the same fence.
        let info = full.block_on(store.inspect(&key)).expect("inspect").expect("still there");
        assert_eq!(info.fence, fence, "{name}: {info:?}");
        assert!(
            matches!(info.state, idem_core::store::RecordState::InFlight { .. }),
            "{name}: still in flight: {info:?}"
        );
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_steps_outside_a_runtime_or_without_io_are_refused() {
        let full = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        let opened = full.block_on(idem_core::PostgresStore::connect(&idem_tests::pg_url()));
        let Some(store) = idem_tests::or_skip("PostgreSQL", opened) else { return };
        network_steps_refused(&store, "postgres", &full);
    }

    #[cfg(feature = "redis")]
    #[test]
    fn redis_steps_outside_a_runtime_or_without_io_are_refused() {
        let full = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        let Some(store) = full.block_on(super::redis::open()) else { return };
        network_steps_refused(&store, "redis", &full);
    }
}

/// On a Tokio runtime built without its timer driver (`Builder::new_current_thread().build()`
/// with no `enable_time`), or, for the network stores, without its IO driver, Tokio panics at
/// the first timer or socket. A call is refused before anything runs, naming the builder call
/// that is missing; opening a PostgreSQL or Redis store is refused the same way.
mod drivers_missing {
    use std::sync::atomic::{AtomicU32, Ordering};

    use idem_core::{Error, ErrorKind, Idem, NoError, tool};

    static STARTED: AtomicU32 = AtomicU32::new(0);

    #[tool(retry = "keyed")]
    async fn book(seat: u32) -> Result<u32, NoError> {
        STARTED.fetch_add(1, Ordering::SeqCst);
        tokio::task::yield_now().await;
        Ok(seat)
    }

    fn chain(e: &(dyn std::error::Error + 'static)) -> String {
        idem_core::ErrorChain(e).to_string()
    }

    #[test]
    fn a_call_on_a_runtime_without_timers_is_refused_before_it_runs() {
        let idem = Idem::in_memory();
        let no_timers = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        for _ in 0..2 {
            // Twice: the second call is answered from what the first learned of this runtime.
            let err: Error<NoError> =
                no_timers.block_on(book(&idem.run("no-timers"), 3)).expect_err("refused");
            assert_eq!(err.kind(), ErrorKind::StoreUnavailable, "{err}");
            let text = chain(&err);
            assert!(text.contains("enable_time"), "{text}");
        }
        assert_eq!(STARTED.load(Ordering::SeqCst), 0, "the tool never started");
        // The same call on a runtime with timers runs, once.
        let rt = super::test_runtime();
        assert_eq!(rt.block_on(book(&idem.run("no-timers"), 3)).expect("runs"), 3);
        assert_eq!(STARTED.load(Ordering::SeqCst), 1);
        // And the runtime without them is still refused after one with them was seen.
        let err = no_timers.block_on(book(&idem.run("no-timers"), 4)).expect_err("refused");
        assert!(chain(&err).contains("enable_time"), "{err}");
        assert_eq!(STARTED.load(Ordering::SeqCst), 1);
    }

    /// In a build whose panics abort, the probe cannot catch Tokio's panic: it would end the
    /// process at the call, where the call of a tool that finishes at once (no timer needed) was
    /// answered before. Such a build is not probed: the call goes on as it did.
    #[test]
    fn a_build_whose_panics_abort_is_not_ended_by_the_probe() {
        let built = std::process::Command::new(env!("CARGO"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["run", "--quiet", "-p", "idem-core", "--example", "abort_without_timers"])
            .args(["--config", r#"profile.dev.panic="abort""#])
            .output()
            .expect("cargo runs");
        let out = String::from_utf8_lossy(&built.stdout);
        let err = String::from_utf8_lossy(&built.stderr);
        assert!(built.status.success(), "{:?}: {out}{err}", built.status);
        assert_eq!(out.trim(), "booked 1", "{err}");
    }

    /// A runtime with timers and no I/O (`enable_time` alone).
    #[cfg(any(feature = "postgres", feature = "redis"))]
    fn no_io() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime")
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn opening_postgres_on_a_runtime_without_io_is_a_configuration_error() {
        let opened = no_io().block_on(idem_core::PostgresStore::connect(&idem_tests::pg_url()));
        let Err(e) = opened else { panic!("opened without I/O") };
        assert!(matches!(e, idem_core::store::StoreError::InvalidConfig(_)), "{e}");
        assert!(chain(&e).contains("enable_io"), "{e}");
    }

    /// A network store opened on a runtime with I/O, then called on by a runtime without it (a
    /// store kept in a static, shared by every runtime of a process): the call is refused before
    /// anything runs, as the opening would be. Before, the store's first connection, made on the
    /// call's runtime, was Tokio's panic in the middle of the call.
    #[cfg(feature = "redis")]
    #[test]
    fn a_call_on_a_network_store_from_a_runtime_without_io_is_refused_before_it_runs() {
        static BOOKED: AtomicU32 = AtomicU32::new(0);
        #[tool(retry = "keyed")]
        async fn book_io(seat: u32) -> Result<u32, NoError> {
            BOOKED.fetch_add(1, Ordering::SeqCst);
            Ok(seat)
        }
        let url = idem_tests::redis_url();
        let full = super::test_runtime();
        let store = full
            .block_on(async {
                let prefix = format!("idem-no-io-{}", idem_tests::process_tag());
                idem_core::RedisStore::builder(&url).prefix(prefix).open_lazy()
            })
            .expect("opened lazily");
        let idem = Idem::builder(store).build();
        let run = idem.run("no-io");
        let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            no_io().block_on(book_io(&run, 5))
        }));
        let Ok(called) = called else { panic!("the call panicked") };
        let err = called.expect_err("refused");
        assert!(chain(&err).contains("enable_io"), "{err}");
        assert_eq!(BOOKED.load(Ordering::SeqCst), 0, "the tool never started");
        // The same call on a runtime with both runs, once.
        assert_eq!(full.block_on(book_io(&run, 5)).expect("runs"), 5);
        assert_eq!(BOOKED.load(Ordering::SeqCst), 1);
    }

    #[cfg(feature = "redis")]
    #[test]
    fn opening_redis_on_a_runtime_without_io_is_a_configuration_error() {
        let url = idem_tests::redis_url();
        let rt = no_io();
        let opened = rt.block_on(idem_core::RedisStore::open(&url));
        let Err(e) = opened else { panic!("opened without I/O") };
        assert!(matches!(e, idem_core::store::StoreError::InvalidConfig(_)), "{e}");
        assert!(chain(&e).contains("enable_io"), "{e}");
        let lazy = rt.block_on(async { idem_core::RedisStore::builder(&url).open_lazy() });
        let Err(e) = lazy else { panic!("opened lazily without I/O") };
        assert!(chain(&e).contains("enable_io"), "{e}");
    }
}
