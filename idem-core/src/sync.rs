//! The one way this crate takes a `std::sync::Mutex`.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, and goes on when a panic poisoned it. Every mutex in this crate guards state
/// that each update leaves consistent (one insert, remove or assignment; a SQLite connection whose
/// transaction rolls back as the panic unwinds), so the poison flag carries no information and a
/// panic elsewhere must not turn every later call into a second panic.
pub(crate) fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
