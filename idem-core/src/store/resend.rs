//! Lost replies on the remote stores: a step the server carried out whose answer never arrived
//! (the connection reset after the command, a response timeout) is resolved by the caller that
//! sent it, never left for a lease to expire.
//!
//! - Every claim carries an owner token unique to the attempt ([`Owner`]), stored in the
//!   in-flight record. A claim sent again with the same token finds its own record and answers
//!   `Acquired` with the fence it was given, so the first send's record is not orphaned.
//! - complete, release and renew are sent again marked as resends, and answer as the first send
//!   would have: a resent completion that finds the record completed under its fence succeeded
//!   (only the fence's holder can have completed it, and fences are never shared), a resent
//!   release that finds the record no longer held under its fence succeeded, and a renewal is
//!   idempotent. A second completion that is not a resend is still refused.
//! - A claim that gives up (every send failed, or its caller dropped it mid-flight) releases in
//!   the background the record it may have created, by owner token: a record another owner holds
//!   is never touched.
//!
//! Resending is bounded: [`PAUSES`] before each new send, then the last error is returned.

use std::future::Future;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::StoreError;

/// The pauses before each new send of a step whose reply may have been lost: three resends.
/// With a 1 s response timeout a hung server costs 4 sends and 0.62 s of pauses, inside the
/// executor's default 5 s store timeout.
pub(crate) const PAUSES: [Duration; 3] =
    [Duration::from_millis(20), Duration::from_millis(100), Duration::from_millis(500)];

/// How long a claim that gave up keeps trying to release the record it may have created: 16
/// sends with backoff from 100 ms to 10 s, about 100 s. Past that the server has been away for
/// longer than a lease usually lasts, and the record is handled as any holder's that vanished.
const GIVE_UP_SENDS: u32 = 16;

/// An owner token: 32 lowercase hex digits, unique to one claim call. The first 16 are random for
/// the process (the OS's generator), the last 16 count claims in it, so tokens never repeat within
/// a process, and two processes share them only if they drew the same 64 random bits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner([u8; 32]);

impl Owner {
    pub(crate) fn new() -> Owner {
        static PROCESS: OnceLock<u64> = OnceLock::new();
        static COUNT: AtomicU64 = AtomicU64::new(0);
        let process = *PROCESS.get_or_init(|| {
            use rand::{RngCore, SeedableRng};
            rand::rngs::SmallRng::from_os_rng().next_u64()
        });
        let n = COUNT.fetch_add(1, Ordering::Relaxed);
        // Written digit by digit: a claim makes one, and `format!` would allocate.
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut token = [0u8; 32];
        for (i, digit) in token.iter_mut().enumerate() {
            let (word, at) = if i < 16 { (process, i) } else { (n, i - 16) };
            *digit = HEX[((word >> (60 - 4 * at)) & 0xf) as usize];
        }
        Owner(token)
    }

    pub(crate) fn as_str(&self) -> &str {
        // Always ASCII hex digits (see `new`).
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl std::fmt::Debug for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How one send of a step failed.
pub(crate) enum Failed {
    /// The request may have reached the server and been carried out: send it again.
    Lost(StoreError),
    /// The server answered (an error, or an answer this version refuses): final.
    Answered(StoreError),
}

/// Runs `send` until it answers, sending it again after each [`Failed::Lost`] with a pause from
/// [`PAUSES`]. `send` gets whether this is a resend.
pub(crate) async fn resend<T, F, Fut>(mut send: F) -> Result<T, StoreError>
where
    F: FnMut(bool) -> Fut,
    Fut: Future<Output = Result<T, Failed>>,
{
    let mut again = false;
    let sent = resend_if(
        |failed| matches!(failed, Failed::Lost(_)),
        || send(std::mem::replace(&mut again, true)),
    );
    sent.await.map_err(|(Failed::Lost(e) | Failed::Answered(e))| e)
}

/// `send`'s answer, sent again after each of [`PAUSES`] while `lost` says its failure may have
/// lost the reply; the last failure once they are spent. For errors of a backend's own kind
/// (the Redis operator's commands, whose callers read the error).
pub(crate) async fn resend_if<T, E, F, Fut>(lost: impl Fn(&E) -> bool, mut send: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut pauses = PAUSES.iter();
    loop {
        let answer = send().await;
        match (&answer, pauses.next()) {
            (Err(e), Some(&pause)) if lost(e) => tokio::time::sleep(pause).await,
            _ => return answer,
        }
    }
}

/// A future the give-up path runs in the background.
pub(crate) type Background = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Releases, by owner token, the record a claim may have created unless the claim is answered:
/// armed when the claim starts, disarmed by [`GiveUp::answered`]. Dropped armed (every send
/// failed, or the claim's future was dropped mid-flight), it spawns its future on the current
/// tokio runtime (see [`release_eventually`]). The closure is kept unboxed: arming costs a claim
/// no allocation, only the rare give-up builds its future.
pub(crate) struct GiveUp<F: FnOnce() -> Background> {
    release: Option<F>,
}

impl<F: FnOnce() -> Background> GiveUp<F> {
    pub(crate) fn arm(release: F) -> Self {
        GiveUp { release: Some(release) }
    }

    /// The claim has its answer: nothing to release.
    pub(crate) fn answered(mut self) {
        self.release = None;
    }
}

impl<F: FnOnce() -> Background> Drop for GiveUp<F> {
    fn drop(&mut self) {
        let Some(release) = self.release.take() else { return };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(release());
        }
    }
}

/// Sends a release by owner token until the server answers it (`Ok`, whether or not there was a
/// record to release) or [`GIVE_UP_SENDS`] sends failed, with backoff from 100 ms to 10 s.
pub(crate) async fn release_eventually<F, Fut>(mut send: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, StoreError>>,
{
    let mut pause = Duration::from_millis(100);
    for _ in 0..GIVE_UP_SENDS {
        match send().await {
            Ok(released) => {
                if released {
                    tracing::debug!("released the record of a claim whose reply was lost");
                }
                return;
            }
            Err(StoreError::Unavailable(_)) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(10));
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not release the record of a claim that gave up");
                return;
            }
        }
    }
    tracing::warn!("gave up releasing the record of a claim whose reply was lost");
}

#[cfg(test)]
mod tests {
    use super::Owner;

    #[test]
    fn owner_tokens_are_32_hex_digits_and_differ() {
        let (a, b) = (Owner::new(), Owner::new());
        for t in [a, b] {
            assert_eq!(t.as_str().len(), 32);
            assert!(t.as_str().bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)));
        }
        assert_ne!(a, b);
        // The same process part; the counter moved on.
        assert_eq!(a.as_str()[..16], b.as_str()[..16]);
        let count = |t: Owner| u64::from_str_radix(&t.as_str()[16..], 16).unwrap();
        assert!(count(b) > count(a));
    }
}
