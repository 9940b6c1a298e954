//! The in-memory store behind a wrapper of the test's own: every operation goes first through a
//! [`Hook`](crate::wrapped::Hook) (to count it, delay it, or fail it as a store that went down)
//! and then to the [`MemoryStore`](idem_core::MemoryStore). The executor cannot see through the
//! wrapper, so calls take the generic path of any other store (boxed futures, and the store's
//! timeouts unless the wrapper says it is local).

use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{
    Claim, ClaimRequest, Fence, ListPage, ListQuery, Outcome, RecordInfo, Resolution, Stats,
};
use idem_core::{Key, MemoryStore, Store, StoreError};

/// A store operation as the hook sees it.
#[derive(Debug)]
pub enum Op<'a> {
    Claim(&'a ClaimRequest<'a>),
    Complete { key: &'a Key, fence: Fence, outcome: &'a Outcome },
    Release,
    Renew,
    Wait,
    Forget,
    List,
    Inspect,
    Resolve,
    PurgeExpired,
    Stats,
}

/// What a test does before an operation reaches the in-memory store. An error is the operation's
/// answer, and the store is not touched.
#[async_trait::async_trait]
pub trait Hook: Send + Sync + 'static {
    async fn before(&self, op: Op<'_>) -> Result<(), StoreError>;

    /// What the claim answers, given the in-memory store's answer (a store of someone's own may
    /// word an answer differently). Unchanged by default.
    fn claimed(&self, claim: Claim) -> Claim {
        claim
    }

    /// Whether a wait waits. `false`: it returns at once, as a store of someone's own may (a
    /// wait is a hint). `true` by default.
    fn waits(&self) -> bool {
        true
    }
}

/// A hook that does nothing: the in-memory store, opaque to the executor.
pub struct Pass;

#[async_trait::async_trait]
impl Hook for Pass {
    async fn before(&self, _: Op<'_>) -> Result<(), StoreError> {
        Ok(())
    }
}

/// The in-memory store behind `hook`.
pub struct Wrapped<H> {
    pub inner: Arc<MemoryStore>,
    pub hook: H,
    local: bool,
}

impl<H: Hook> Wrapped<H> {
    /// A fresh in-memory store behind `hook`, which says it is not local (`Store::is_local`), as a
    /// networked store would.
    pub fn new(hook: H) -> Self {
        Self::over(Arc::new(MemoryStore::new()), hook)
    }

    /// `store` behind `hook` (not local).
    pub fn over(store: Arc<MemoryStore>, hook: H) -> Self {
        Self { inner: store, hook, local: false }
    }

    /// Says it is local, as the in-memory store does: the executor then skips the store
    /// timeouts, as for the store itself.
    pub fn local(mut self) -> Self {
        self.local = true;
        self
    }
}

// Through idem's re-export, as a store of one's own would.
#[idem_core::store::async_trait]
impl<H: Hook> Store for Wrapped<H> {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        self.hook.before(Op::Claim(&req)).await?;
        Ok(self.hook.claimed(self.inner.claim(req).await?))
    }
    async fn complete(
        &self,
        key: &Key,
        fence: Fence,
        outcome: &Outcome,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.hook.before(Op::Complete { key, fence, outcome }).await?;
        self.inner.complete(key, fence, outcome, ttl).await
    }
    async fn release(&self, key: &Key, fence: Fence) -> Result<(), StoreError> {
        self.hook.before(Op::Release).await?;
        self.inner.release(key, fence).await
    }
    async fn renew(&self, key: &Key, fence: Fence, lease: Duration) -> Result<(), StoreError> {
        self.hook.before(Op::Renew).await?;
        self.inner.renew(key, fence, lease).await
    }
    async fn wait(&self, key: &Key, fence: Fence, max: Duration) -> Result<(), StoreError> {
        self.hook.before(Op::Wait).await?;
        if !self.hook.waits() {
            return Ok(());
        }
        self.inner.wait(key, fence, max).await
    }
    fn is_local(&self) -> bool {
        self.local
    }
    fn uses_tokio_io(&self) -> bool {
        self.inner.uses_tokio_io()
    }
    async fn forget(&self, key: &Key) -> Result<bool, StoreError> {
        self.hook.before(Op::Forget).await?;
        self.inner.forget(key).await
    }
    async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        self.hook.before(Op::List).await?;
        self.inner.list(query).await
    }
    async fn inspect(&self, key: &Key) -> Result<Option<RecordInfo>, StoreError> {
        self.hook.before(Op::Inspect).await?;
        self.inner.inspect(key).await
    }
    async fn resolve(
        &self,
        key: &Key,
        fence: Fence,
        resolution: &Resolution,
    ) -> Result<(), StoreError> {
        self.hook.before(Op::Resolve).await?;
        self.inner.resolve(key, fence, resolution).await
    }
    async fn purge_expired(&self) -> Result<u64, StoreError> {
        self.hook.before(Op::PurgeExpired).await?;
        self.inner.purge_expired().await
    }
    async fn stats(&self) -> Result<Stats, StoreError> {
        self.hook.before(Op::Stats).await?;
        self.inner.stats().await
    }
}
