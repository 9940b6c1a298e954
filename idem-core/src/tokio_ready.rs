//! Whether the current Tokio runtime has the drivers idem uses. Tokio answers a runtime built
//! without its timer driver (or, for the network stores, its IO driver) with a panic at the first
//! timer or socket; inside a call that could come with the tool's work under way. So a call, and
//! the opening of a network store, asks first and is refused with a configuration error.
//!
//! Tokio has no query for its drivers: each is probed once per runtime and thread by making what
//! needs it inside `catch_unwind` (a refused probe still reaches the process's panic hook, which
//! prints Tokio's own message once). The answer is kept with the runtime's id, for the last few
//! runtimes a thread served, so a call pays a thread-local read. A build whose panics abort has
//! nothing to catch: it is not probed, and meets Tokio's panic where a timer or socket is made.

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

/// How many runtimes each thread remembers. One thread may serve several in turn (a test's
/// runtimes, a blocking thread's caller, a program with a runtime per subsystem): with one kept,
/// each switch probed again, and a runtime without a driver went through the panic hook at every
/// call. Past this many, the least recently used is probed again.
const REMEMBERED: usize = 4;

thread_local! {
    /// Most recently used first.
    static SEEN: Cell<[Option<Seen>; REMEMBERED]> = const { Cell::new([None; REMEMBERED]) };
}

/// Inside a Tokio runtime with its timer driver, and its IO driver when `io` (a store that
/// connects through it, [`Store::uses_tokio_io`](crate::store::Store::uses_tokio_io)).
pub(crate) fn for_store(io: bool) -> Result<(), Lacks> {
    check(io)
}

/// [`for_store`] as a store step's error: a wait's timeout (every store's), a network store's
/// connections, would be Tokio's panic.
pub(crate) fn store_step(io: bool) -> Result<(), crate::store::StoreError> {
    for_store(io).map_err(|lacks| crate::store::StoreError::InvalidConfig(lacks.advice()))
}

fn check(io: bool) -> Result<(), Lacks> {
    let runtime = Handle::try_current().map_err(|_| Lacks::Runtime)?.id();
    // The common case, every call after the first on a runtime with its drivers: the most recent
    // entry says so, read alone, and nothing is written back.
    let recent = SEEN.with(|known| known.as_array_of_cells()[0].get());
    if let Some(seen) = recent
        && seen.runtime == runtime
        && seen.timers == Some(true)
        && (!io || seen.io == Some(true))
    {
        return Ok(());
    }
    let mut known = SEEN.with(Cell::get);
    // This runtime's entry moves to the front; a new one pushes the least recent out.
    let at = known
        .iter()
        .position(|seen| seen.is_some_and(|seen| seen.runtime == runtime))
        .unwrap_or(REMEMBERED - 1);
    let mut seen = known[at].filter(|seen| seen.runtime == runtime).unwrap_or(Seen {
        runtime,
        timers: None,
        io: None,
    });
    let timers = *seen.timers.get_or_insert_with(probe_timers);
    // An answer the probe could not give (no socket pair to be had) is not kept: asked again.
    let io_ok = !io
        || match seen.io {
            Some(known) => known,
            None => {
                seen.io = probe_io();
                seen.io.unwrap_or(true)
            }
        };
    known[..=at].rotate_right(1);
    known[0] = Some(seen);
    SEEN.with(|cell| cell.set(known));
    if !timers {
        return Err(Lacks::Timers);
    }
    if !io_ok {
        return Err(Lacks::Io);
    }
    Ok(())
}

fn probe_timers() -> bool {
    if cfg!(panic = "abort") {
        // Nothing to catch: the probe would end the process. Tokio's own panic, where a timer is
        // made, is left as it was.
        return true;
    }
    // Tokio looks for its timer driver when a sleep is made, before it is polled.
    catch_unwind(|| drop(tokio::time::sleep(Duration::ZERO))).is_ok()
}

/// Registering a socket with the reactor is where Tokio looks for its IO driver. A pair of Unix
/// sockets needs no network. `None` when the process cannot make one now (out of file
/// descriptors): not known, so the call goes on (a connection it makes meets the same shortage
/// first, as an error) and the next call asks again.
#[cfg(all(unix, any(feature = "postgres", feature = "redis")))]
fn probe_io() -> Option<bool> {
    if cfg!(panic = "abort") {
        return Some(true);
    }
    match catch_unwind(tokio::net::UnixStream::pair) {
        Ok(Ok(_)) => Some(true),
        Ok(Err(_)) => None,
        Err(_) => Some(false),
    }
}

#[cfg(not(all(unix, any(feature = "postgres", feature = "redis"))))]
fn probe_io() -> Option<bool> {
    Some(true)
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

    /// A thread that serves a runtime without timers and others in turn probes the one without
    /// them once: each probe it refuses goes through the process's panic hook (printed, or sent
    /// to the app's crash reporter). Before, only the last runtime was kept, and every call after
    /// a switch probed again.
    #[test]
    fn a_thread_that_switches_runtimes_probes_each_once() {
        use std::sync::atomic::{AtomicU32, Ordering};
        static PROBED: AtomicU32 = AtomicU32::new(0);
        thread_local! {
            static COUNTED: Cell<bool> = const { Cell::new(false) };
        }
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // Only this test's thread counts; other tests' panics go to the hook before.
            if COUNTED.with(Cell::get) {
                PROBED.fetch_add(1, Ordering::SeqCst);
            } else {
                before(info);
            }
        }));
        COUNTED.with(|c| c.set(true));
        let without = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let with = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let also = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        for _ in 0..3 {
            assert_eq!(without.block_on(async { for_store(false) }), Err(Lacks::Timers));
            assert_eq!(with.block_on(async { for_store(false) }), Ok(()));
            assert_eq!(also.block_on(async { for_store(false) }), Ok(()));
        }
        COUNTED.with(|c| c.set(false));
        assert_eq!(PROBED.load(Ordering::SeqCst), 1, "panics seen by the hook");
    }

    #[cfg(all(unix, any(feature = "postgres", feature = "redis")))]
    #[test]
    fn a_runtime_without_io_is_told_apart_from_one_with_it() {
        let without = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let with = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        for _ in 0..2 {
            assert_eq!(without.block_on(async { for_store(false) }), Ok(()));
            assert_eq!(without.block_on(async { for_store(true) }), Err(Lacks::Io));
            assert_eq!(with.block_on(async { for_store(true) }), Ok(()));
        }
    }
}
