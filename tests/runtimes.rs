//! A store's life across Tokio runtimes: one store kept in a `static` and used by one
//! `#[tokio::test]` after another, each with a runtime of its own that ends with the test. What a
//! store started in the background on the first runtime ended with it; the store must start it
//! again on the next one, not keep working half deaf.
//! Run: cargo test --features sqlite,postgres,redis --test runtimes

#![allow(dead_code)] // each store's part is gated on its feature

use tokio::runtime::Runtime;

/// A runtime as `#[tokio::test]` makes one (current thread, timers and I/O).
fn test_runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

/// Redis wakes waiters by pub/sub on a connection of its own, whose messages the redis crate
/// delivers in a task on the runtime it was made on; native claims need a sample of the
/// server's clock, taken in a task.
#[cfg(feature = "redis")]
mod redis {
    use std::time::Duration;

    use idem_core::conformance::{LONG, fresh_key};
    use idem_core::store::{Outcome, RedisStore, Store};
    use idem_tests::{acquire, or_skip, redis_prefix, redis_url};

    use super::test_runtime;

    async fn open() -> Option<RedisStore> {
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
}
