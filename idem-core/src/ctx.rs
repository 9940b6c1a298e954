//! The per-attempt context a tool body may ask for.

use std::time::Duration;

use tokio::time::Instant;

use crate::key::Key;
use crate::store::Fence;

/// What a tool body knows about its call: the idempotency key to forward to the provider, the
/// attempt number and the deadline. Declare a `cx: &Ctx` parameter to receive it; it is not part
/// of the intent.
#[derive(Clone, Debug)]
pub struct Ctx {
    pub(crate) key: Key,
    pub(crate) attempt: u32,
    pub(crate) deadline: Instant,
    pub(crate) fence: Option<Fence>,
}

impl Ctx {
    /// The idempotency key (64 lowercase hex digits): send it as the provider's `Idempotency-Key`
    /// header (IETF draft-ietf-httpapi-idempotency-key-header) so a retry after an ambiguous
    /// failure is deduplicated there too. The same for every attempt and every repeat of the intent.
    pub fn key(&self) -> &str {
        self.key.as_str()
    }
    /// The key as a typed value.
    pub fn idempotency_key(&self) -> &Key {
        &self.key
    }
    /// The attempt number, 1 for the first.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
    /// When this attempt times out (tokio's clock).
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
    /// Time left before this attempt times out; zero when past.
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
    /// The fencing token of this claim (`None` for a `safe` tool that does not use the store).
    pub fn fence(&self) -> Option<Fence> {
        self.fence
    }
}
