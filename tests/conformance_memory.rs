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
