//! Keys this store recently saw completed, so that a claim of one of them, most likely a replay
//! (the model calling again after a timeout, a framework retrying), is first a plain `GET` of the
//! record: one read, as a raw read costs, instead of the claim's `SET rec <record> NX GET` with a
//! `GET` of the fence counter. (On PostgreSQL the claim's statement already answers a replay with
//! one indexed read, and a separate `SELECT` measured no faster: BENCHMARKS.md.)
//!
//! Only a hint: a read that finds a completed record replays it, exactly what the claim would
//! have answered (a completed record does not change until it expires or is forgotten, and the
//! claim would not have written). Anything else (no record: expired or forgotten; a record in
//! flight; one of another type) drops the key from the hint and goes on to the claim as if the
//! hint had not been there, at the cost of one more round trip. A claim in another process (a
//! restart, a second replica) has no hint and takes the claim's path.

use std::collections::HashSet;
use std::sync::Mutex;

use crate::key::Key;

/// How many keys the hint holds (32 bytes each, about 1 MiB with the set's overhead). When
/// full it starts again empty: the hint only has to hold the keys being repeated now.
pub(super) const CAPACITY: usize = 16_384;

pub(super) struct Recent {
    keys: Mutex<HashSet<Key>>,
    /// Replay reads turned off by the store's owner: holds nothing.
    off: bool,
}

impl Recent {
    pub(super) fn new(on: bool) -> Self {
        Recent { keys: Mutex::default(), off: !on }
    }

    /// Whether `key` was seen completed here lately.
    pub(super) fn likely(&self, key: &Key) -> bool {
        !self.off && crate::sync::lock(&self.keys).contains(key)
    }

    /// `key` was completed or replayed here.
    pub(super) fn saw(&self, key: &Key) {
        if self.off {
            return;
        }
        let mut keys = crate::sync::lock(&self.keys);
        if keys.len() >= CAPACITY {
            keys.clear();
        }
        keys.insert(*key);
    }

    /// `key` is no longer known to be completed (a `GET` found otherwise, or it was forgotten).
    pub(super) fn drop_key(&self, key: &Key) {
        crate::sync::lock(&self.keys).remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: usize) -> Key {
        Key::parse(&format!("{n:064x}")).expect("key")
    }

    #[test]
    fn holds_at_most_its_capacity_and_forgets() {
        let recent = Recent::new(true);
        for n in 0..CAPACITY + 10 {
            recent.saw(&key(n));
        }
        assert!(crate::sync::lock(&recent.keys).len() <= CAPACITY);
        assert!(recent.likely(&key(CAPACITY + 9)), "the latest key is held");
        recent.drop_key(&key(CAPACITY + 9));
        assert!(!recent.likely(&key(CAPACITY + 9)));
    }
}
