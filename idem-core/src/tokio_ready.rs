//! Whether the current Tokio runtime has the drivers idem uses. Tokio answers a runtime built
//! without its timer driver (or, for the network stores, its IO driver) with a panic at the first
//! timer or socket; inside a call that could come with the tool's work under way. So a call, and
//! the opening of a network store, asks first and is refused with a configuration error.
//!
//! Tokio has no query for its drivers: each is probed once per runtime and thread by making what
//! needs it inside `catch_unwind` (a refused probe still reaches the process's panic hook, which
//! prints Tokio's own message once). The answer is kept with the runtime's id, so a call pays a
//! thread-local read.

use std::cell::Cell;
use std::panic::catch_unwind;
use std::time::Duration;

use tokio::runtime::{Handle, Id};

/// What the current thread lacks to run idem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lacks {
    /// Not inside a Tokio runtime at all (another executor, `futures::executor::block_on`).
    Runtime,
    /// A runtime built without `enable_time`.
    Timers,
    /// A runtime built without `enable_io` (only asked for a store that uses it).
    Io,
}

impl Lacks {
    /// What to do about it, for a [`StoreError::InvalidConfig`](crate::store::StoreError).
    pub(crate) fn advice(self) -> String {
        match self {
            Lacks::Runtime => "idem runs on Tokio: call it from inside a Tokio runtime with \
                               timers and I/O enabled (`#[tokio::main]`, or `Builder::enable_all`)"
                .into(),
            Lacks::Timers => "idem runs on Tokio's timers (timeouts, backoff, leases), and this \
                              Tokio runtime was built without them: build it with \
                              `Builder::enable_time`, or `enable_all` as `#[tokio::main]` does"
                .into(),
            Lacks::Io => "the store connects through Tokio's I/O, and this Tokio runtime was \
                          built without it: build it with `Builder::enable_io`, or `enable_all` \
                          as `#[tokio::main]` does"
                .into(),
        }
    }
}

/// What was learned of one runtime on this thread; `None` is not asked yet.
#[derive(Clone, Copy)]
struct Seen {
    runtime: Id,
    timers: Option<bool>,
    io: Option<bool>,
}

thread_local! {
    static SEEN: Cell<Option<Seen>> = const { Cell::new(None) };
}

/// Inside a Tokio runtime with its timer and IO drivers (a network store's connections).
#[cfg(any(feature = "postgres", feature = "redis"))]
pub(crate) fn timers_and_io() -> Result<(), Lacks> {
    check(true)
}

/// Inside a Tokio runtime with its timer driver, and its IO driver when `io` (a store that
/// connects through it, [`Store::uses_tokio_io`](crate::store::Store::uses_tokio_io)).
pub(crate) fn for_store(io: bool) -> Result<(), Lacks> {
    check(io)
}

fn check(io: bool) -> Result<(), Lacks> {
    let runtime = Handle::try_current().map_err(|_| Lacks::Runtime)?.id();
    let mut seen = SEEN.with(Cell::get).filter(|seen| seen.runtime == runtime).unwrap_or(Seen {
        runtime,
        timers: None,
        io: None,
    });
    let timers = *seen.timers.get_or_insert_with(probe_timers);
    let io_ok = !io || *seen.io.get_or_insert_with(probe_io);
    SEEN.with(|cell| cell.set(Some(seen)));
    if !timers {
        return Err(Lacks::Timers);
    }
    if !io_ok {
        return Err(Lacks::Io);
    }
    Ok(())
}

fn probe_timers() -> bool {
    // Tokio looks for its timer driver when a sleep is made, before it is polled.
    catch_unwind(|| drop(tokio::time::sleep(Duration::ZERO))).is_ok()
}

/// Registering a socket with the reactor is where Tokio looks for its IO driver. A pair of Unix
/// sockets needs no network; when the process cannot make one, the answer is yes, and the store's
/// own connection will tell.
#[cfg(all(unix, any(feature = "postgres", feature = "redis")))]
fn probe_io() -> bool {
    catch_unwind(|| drop(tokio::net::UnixStream::pair())).is_ok()
}

#[cfg(not(all(unix, any(feature = "postgres", feature = "redis"))))]
fn probe_io() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_a_runtime() {
        assert_eq!(for_store(false), Err(Lacks::Runtime));
    }

    #[test]
    fn a_runtime_without_timers_is_told_apart_from_one_with_them() {
        let without = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let with = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        // Asked twice each, and alternately: the answer kept for one runtime is not the other's.
        for _ in 0..2 {
            assert_eq!(without.block_on(async { for_store(false) }), Err(Lacks::Timers));
            assert_eq!(with.block_on(async { for_store(false) }), Ok(()));
        }
    }

    #[cfg(all(unix, any(feature = "postgres", feature = "redis")))]
    #[test]
    fn a_runtime_without_io_is_told_apart_from_one_with_it() {
        let without = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let with = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        for _ in 0..2 {
            assert_eq!(without.block_on(async { for_store(false) }), Ok(()));
            assert_eq!(without.block_on(async { timers_and_io() }), Err(Lacks::Io));
            assert_eq!(with.block_on(async { timers_and_io() }), Ok(()));
        }
    }
}
