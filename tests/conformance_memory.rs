//! The store conformance suite against the in-memory store: on tokio's paused clock (the way the
//! executor's tests run it), and on the real clock (the way the durable stores run it), which
//! shows the suite itself holds on real time.

use std::sync::Arc;

use idem_core::MemoryStore;

async fn store() -> Option<Arc<MemoryStore>> {
    Some(Arc::new(MemoryStore::new()))
}

idem_core::store_conformance_tests!(
    #[tokio::test(start_paused = true)]
    store().await
);
idem_core::store_admin_conformance_tests!(
    #[tokio::test(start_paused = true)]
    store().await
);

mod real_clock {
    use super::store;

    idem_core::store_conformance_tests!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        store().await
    );
    idem_core::store_admin_conformance_tests!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        store().await
    );
}

/// What a process holds after a burst of calls whose records then expired: about what it held
/// before the burst, not the peak. Measured by the bytes this thread holds from the allocator
/// (a current-thread runtime: every step of the store runs here).
mod retention {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;
    use std::time::Duration;

    use idem_core::store::Outcome;
    use idem_core::{MemoryStore, Store};

    struct Counting;

    thread_local! {
        static HELD: Cell<isize> = const { Cell::new(0) };
    }

    fn count(bytes: isize) {
        let _ = HELD.try_with(|held| held.set(held.get() + bytes));
    }

    // SAFETY: every call is passed on to the system allocator unchanged; the count is a
    // thread-local integer, which allocates nothing.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            count(layout.size() as isize);
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            count(-(layout.size() as isize));
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            count(layout.size() as isize);
            unsafe { System.alloc_zeroed(layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            count(new_size as isize - layout.size() as isize);
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static COUNTING: Counting = Counting;

    fn held() -> isize {
        HELD.with(Cell::get)
    }

    #[tokio::test(start_paused = true)]
    async fn memory_goes_back_down_after_a_burst_of_records_expires() {
        let store = MemoryStore::new();
        let before = held();
        let done = Outcome::Success("1".into());
        for i in 0..100_000 {
            let (key, fp) = idem_core::conformance::fresh_key("burst", &format!("{{\"i\":{i}}}"));
            let fence = idem_tests::acquire(&store, &key, &fp).await;
            store.complete(&key, fence, &done, Duration::from_secs(60)).await.expect("complete");
        }
        let peak = held() - before;
        // Retention and the sweep interval over: the next claim sweeps every record.
        tokio::time::advance(Duration::from_secs(121)).await;
        let (key, fp) = idem_core::conformance::fresh_key("after the burst", "{}");
        idem_tests::acquire(&store, &key, &fp).await;
        assert_eq!(store.len(), 1, "the burst's records were swept");
        let after = held() - before;
        assert!(
            after < 1 << 20,
            "100,000 expired records held {peak} bytes at the peak; one record holds {after} \
             bytes after they were swept"
        );
    }
}
