//! The common claim in native commands: a fresh claim or a replay is one `SET rec <record> NX GET`
//! (Redis 7.0 or later) pipelined with a `GET` of the fence counter, one round trip and no script.
//! Everything else (a record in flight under another owner, a takeover, a mismatch of an
//! in-flight record, a version 1 hash to migrate, a fence that must be raised above the counter)
//! goes to the claim script, with the same owner token.
//!
//! What the script did with the server's clock, the client does here with an estimate of it:
//!
//! - **Lease end.** The record's lease end is the server's time plus the lease, as estimated from a
//!   `TIME` sample: `TIME`'s answer, plus the whole round trip of that sample (the server read
//!   its clock at some point inside it), plus the time elapsed since on this process's monotonic
//!   clock. It is never earlier than the true server time plus the lease, except by the drift
//!   between the two clocks since the sample: samples are renewed every [`RESAMPLE`] and used for
//!   at most [`MAX_AGE`] (at 100 ppm, 6 ms of a 30 s lease). A sample whose round trip took
//!   longer than [`MAX_SAMPLE_RTT`] is not used; without a usable sample, claims take the script.
//!   Nor is a sample used once the monotonic clock and the system clock disagree on its age by
//!   more than [`MAX_DISAGREEMENT`]: the monotonic clock stands still while the machine sleeps
//!   (a laptop's suspend, a paused VM), so after a resume the estimate would be behind the
//!   server by the whole sleep and a claim would write a lease that had already ended, which
//!   another caller takes over at once while this one runs the tool. Nor is one taken on
//!   another connection than the claim's: a connection made again after a failover reaches
//!   another server, with a clock of its own.
//!   Whether a lease has ended is still decided only by the scripts, on the server's clock.
//! - **Fence.** A new fence is the estimated server time in µs, as the script's was. It must be
//!   above every fence the key had before: while a record exists it holds that fence and the
//!   `SET .. NX` does not write; when there is none the highest earlier fence is in the counter,
//!   which the pipelined `GET` reads after the `SET`. While the new record exists nobody but its
//!   owner can move the counter (complete, release and takeover need the record's fence; forget
//!   ends the record). So if the counter read is at or above the new fence, the claim script
//!   raises this owner's fence above it before anyone has seen it; otherwise the fence is above
//!   every earlier one. Fences stay strictly increasing per key whatever the clocks do.
//! - **Lost replies.** The pipeline is sent again as it was (same record, same owner token): the
//!   `SET .. NX GET` then answers the record the first send wrote, which this claim recognizes by
//!   its owner token and acquires with the fence in it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use redis::Value;

use super::SCHEMA_VERSION;
use crate::store::resend::{Failed, Owner};
use crate::store::{Claim, ClaimRequest, Fence, StoreError};

/// How often the server's clock is sampled again (in the background, by the next claim).
pub(super) const RESAMPLE: Duration = Duration::from_secs(10);
/// The oldest sample a claim uses.
pub(super) const MAX_AGE: Duration = Duration::from_secs(60);
/// A sample whose round trip took longer tells the server's time too loosely: not used.
pub(super) const MAX_SAMPLE_RTT: Duration = Duration::from_millis(20);
/// How far the monotonic and the system clock may disagree on a sample's age before the sample
/// is set aside (a suspend or a clock step between them); NTP's slewing, at most 500 ppm, moves
/// them 30 ms apart in [`MAX_AGE`].
pub(super) const MAX_DISAGREEMENT: Duration = Duration::from_millis(50);

/// The server's clock as this process estimates it.
#[derive(Default)]
pub(super) struct ServerClock {
    sample: Mutex<Option<Sample>>,
    sampling: AtomicBool,
}

#[derive(Clone, Copy)]
struct Sample {
    /// When the sample's answer arrived, on this process's monotonic clock.
    at: Instant,
    /// The same moment on the system clock, which goes on while the machine sleeps.
    wall: SystemTime,
    /// The generation of the connection the sample was taken on.
    generation: u64,
    /// The server's time then, in µs since the Unix epoch, at the latest: `TIME`'s answer plus
    /// the sample's round trip.
    server_us: u64,
}

impl ServerClock {
    /// The server's time now in µs (an upper estimate, see the module docs) for a claim on the
    /// connection of `generation`, or `None` without a usable sample. `stale` is set when a new
    /// sample is due.
    pub(super) fn now_us(&self, generation: u64) -> (Option<u64>, bool) {
        let sample = *crate::sync::lock(&self.sample);
        match sample {
            None => (None, true),
            Some(s) => {
                let age = s.at.elapsed();
                // Backwards (an error) when the system clock stepped back since.
                let wall_age = SystemTime::now().duration_since(s.wall).ok();
                let slept = wall_age.is_none_or(|w| w.abs_diff(age) > MAX_DISAGREEMENT);
                if slept || s.generation != generation {
                    return (None, true);
                }
                let now = s.server_us.saturating_add(u64::try_from(age.as_micros()).unwrap_or(0));
                ((age <= MAX_AGE).then_some(now), age >= RESAMPLE)
            }
        }
    }

    /// Takes the job of sampling, if nobody has it.
    pub(super) fn start_sampling(&self) -> bool {
        !self.sampling.swap(true, Ordering::AcqRel)
    }

    /// Records a `TIME` answer (`time`: seconds, microseconds) read between `sent` and
    /// `answered` on the connection of `generation`.
    pub(super) fn record(
        &self,
        sent: Instant,
        answered: Instant,
        time: (u64, u64),
        generation: u64,
    ) {
        let rtt = answered.saturating_duration_since(sent);
        if rtt <= MAX_SAMPLE_RTT {
            let rtt_us = u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX);
            let server_us = time.0.saturating_mul(1_000_000).saturating_add(time.1);
            let sample = Sample {
                at: answered,
                // Read beside `answered`: the two clocks' readings of one moment.
                wall: SystemTime::now(),
                generation,
                server_us: server_us.saturating_add(rtt_us),
            };
            *crate::sync::lock(&self.sample) = Some(sample);
        }
        self.sampling.store(false, Ordering::Release);
    }

    /// The sampling failed: the next claim tries again.
    pub(super) fn failed(&self) {
        self.sampling.store(false, Ordering::Release);
    }
}

/// Whether native claims are off: turned off by the builder, or refused by the server (`SET ..
/// NX GET` is Redis 7.0 or later).
pub(super) struct Support(AtomicBool);

impl Support {
    /// `on`: try native claims until the server refuses them.
    pub(super) fn new(on: bool) -> Self {
        Support(AtomicBool::new(!on))
    }
    pub(super) fn usable(&self) -> bool {
        !self.0.load(Ordering::Relaxed)
    }
    fn refused(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What the native claim ended with.
pub(super) enum Native {
    /// The claim's answer.
    Answer(Claim),
    /// A completed record, as stored: the caller decodes it.
    Completed(Vec<u8>),
    /// The claim script must answer (with the same owner token).
    Script,
}

/// The pipeline of a native claim: the in-flight record of `owner` with `fence` and a lease
/// ending at `lease_end_ms`, written only if the key has no record, and the fence counter.
pub(super) fn pipeline(
    record_key: &str,
    counter_key: &str,
    req: &ClaimRequest<'_>,
    owner: &Owner,
    fence: u64,
    lease_end_ms: u64,
) -> redis::Pipeline {
    // The layout of the claim script's `inflight` (see the parent module): not waited on.
    // Since: the estimated server time the fence is made of, in ms.
    // One buffer, sized once: a claim builds this for every call, replays included.
    // Written part by part: `write!` costs a first call about 3,000 instructions here.
    let origin = &req.origin;
    let mut record =
        String::with_capacity(176 + origin.tool.len() + origin.tenant.len() + origin.run.len());
    let mut number = itoa::Buffer::new();
    for part in [SCHEMA_VERSION, "|f|", number.format(fence), "|0|"] {
        record.push_str(part);
    }
    for part in [number.format(lease_end_ms), "|", req.fingerprint.as_str(), "|", owner.as_str()] {
        record.push_str(part);
    }
    for part in ["|", number.format(fence / 1000), "|"] {
        record.push_str(part);
    }
    super::reply::write_origin(&mut record, origin);
    record.push('|');
    let mut set = redis::Cmd::with_capacity(5, 16 + record_key.len() + record.len());
    set.arg("SET").arg(record_key).arg(record).arg("NX").arg("GET");
    let mut get = redis::Cmd::with_capacity(2, 8 + counter_key.len());
    get.arg("GET").arg(counter_key);
    let mut pipe = redis::Pipeline::with_capacity(2);
    pipe.add_command(set).add_command(get);
    // Each reply on its own: a refused `SET` is read above, not a failure of the pipeline.
    pipe.ignore_errors();
    pipe
}

/// Reads the pipeline's replies: `[previous record or nil, counter or nil]`.
pub(super) fn read(
    support: &Support,
    owner: &Owner,
    fence: u64,
    replies: redis::RedisResult<Vec<Value>>,
) -> Result<Native, Failed> {
    let replies = match replies {
        Ok(r) => r,
        Err(e) => return Err(super::reply::failed(e)),
    };
    let mut replies = replies.into_iter();
    let (previous, counter) = match (replies.next(), replies.next(), replies.next()) {
        (Some(previous), Some(counter), None) => (previous, counter),
        other => {
            return Err(Failed::Answered(StoreError::Incompatible(format!(
                "unexpected reply to the native claim: {other:?}"
            ))));
        }
    };
    if let Value::ServerError(e) = &previous {
        // A server before 7.0 refuses NX with GET (a syntax error): scripts from now on. Any
        // other refusal (WRONGTYPE: a version 1 hash, or a key of another type) is the script's
        // to migrate or explain.
        if e.code() == "ERR" {
            support.refused();
            tracing::debug!(error = ?e, "SET .. NX GET refused; claims use the script");
        }
        return Ok(Native::Script);
    }
    let counter = match &counter {
        Value::Nil => 0,
        Value::BulkString(b) => match std::str::from_utf8(b).ok().and_then(|t| t.parse().ok()) {
            Some(c) => c,
            // Not a counter this version wrote: the script says what is wrong.
            None => return Ok(Native::Script),
        },
        _ => return Ok(Native::Script),
    };
    let held = match previous {
        Value::Nil => fence,
        Value::BulkString(record) => {
            if super::reply::is_completed(&record) {
                return Ok(Native::Completed(record));
            }
            match own_fence(&record, owner) {
                // Written by an earlier send of this claim, whose reply was lost.
                Some(f) => f,
                None => return Ok(Native::Script),
            }
        }
        _ => return Ok(Native::Script),
    };
    if counter >= held {
        // An earlier owner's fence is not below this one: the script raises it.
        return Ok(Native::Script);
    }
    Ok(Native::Answer(Claim::Acquired { fence: Fence(held), takeover: false }))
}

/// The fence of an in-flight record held by `owner`, else `None`.
fn own_fence(record: &[u8], owner: &Owner) -> Option<u64> {
    let fields: Vec<&[u8]> = record.splitn(8, |&b| b == b'|').collect();
    match fields.as_slice() {
        [v, b"f", fence, _, _, _, o, _]
            if *v == SCHEMA_VERSION.as_bytes() && *o == owner.as_str().as_bytes() =>
        {
            std::str::from_utf8(fence).ok()?.parse().ok()
        }
        _ => None,
    }
}

/// Reads a `TIME` reply: seconds and microseconds.
pub(super) fn time_reply(reply: &[String]) -> Option<(u64, u64)> {
    match reply {
        [secs, micros] => Some((secs.parse().ok()?, micros.parse().ok()?)),
        _ => None,
    }
}

impl super::RedisStore {
    /// A claim in native commands: `None` when it cannot be tried (a server before 7.0, or no
    /// recent sample of the server's clock yet).
    pub(super) async fn native_claim(
        &self,
        req: &ClaimRequest<'_>,
        owner: &Owner,
        record: &str,
        counter: &str,
    ) -> Option<Result<Native, StoreError>> {
        if !self.inner.native.usable() {
            return None;
        }
        // Only on one server (see `RedisStoreBuilder::open_lazy`).
        let super::route::Conn::One(conn) = &self.inner.conn else { return None };
        // The claim's first send goes on this connection, which the sample must come from.
        let mut first = Some(conn.manager());
        let generation = first.as_ref().map_or(0, |(generation, _)| *generation);
        let (now_us, stale) = self.inner.clock.now_us(generation);
        if stale {
            self.sample_clock();
        }
        let fence = now_us?;
        // Rounded up: the lease is never shorter than asked.
        let lease_end_ms = fence.div_ceil(1000).saturating_add(crate::clock::ms(req.lease));
        let pipe = pipeline(record, counter, req, owner, fence, lease_end_ms);
        Some(
            crate::store::resend::resend(|_| {
                // A send again takes the current connection: one that reached a replica or went
                // silent is replaced (`route.rs`), and native claims follow.
                let (generation, mut manager) = first.take().unwrap_or_else(|| conn.manager());
                let pipe = &pipe;
                async move {
                    let replies = conn.saw(generation, pipe.query_async(&mut manager).await);
                    read(&self.inner.native, owner, fence, replies)
                }
            })
            .await,
        )
    }

    /// Samples the server's clock in the background (one `TIME`), unless a sample is under way.
    fn sample_clock(&self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let super::route::Conn::One(conn) = &self.inner.conn else { return };
        if !self.inner.clock.start_sampling() {
            return;
        }
        let (generation, mut conn) = conn.manager();
        let inner = std::sync::Arc::clone(&self.inner);
        // Given back when the task ends, also unanswered (its runtime ended first, as a
        // `#[tokio::test]`'s does): else no claim would ever sample again, and each would take
        // the script.
        let mut sampling = Sampling { inner, generation, answer: None };
        rt.spawn(async move {
            let sent = Instant::now();
            let reply: redis::RedisResult<Vec<String>> =
                redis::cmd("TIME").query_async(&mut conn).await;
            let answered = Instant::now();
            let time = reply.ok().as_deref().and_then(time_reply);
            sampling.answered(time.map(|time| (sent, answered, time)));
        });
    }
}

/// A sampling task's job: records its answer when dropped, or gives the job back without one.
struct Sampling {
    inner: std::sync::Arc<super::Inner>,
    /// The generation of the connection the `TIME` goes on.
    generation: u64,
    /// When the `TIME` was sent and answered, and its answer (seconds, microseconds).
    answer: Option<(Instant, Instant, (u64, u64))>,
}

impl Sampling {
    fn answered(&mut self, answer: Option<(Instant, Instant, (u64, u64))>) {
        self.answer = answer;
    }
}

impl Drop for Sampling {
    fn drop(&mut self) {
        match self.answer {
            Some((sent, answered, time)) => {
                self.inner.clock.record(sent, answered, time, self.generation);
            }
            None => self.inner.clock.failed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clock with one sample taken on the connection of generation 1, `monotonic_age` ago on
    /// this process's monotonic clock and `wall_age` ago on the system clock.
    fn sampled(monotonic_age: Duration, wall_age: Duration) -> ServerClock {
        let clock = ServerClock::default();
        *crate::sync::lock(&clock.sample) = Some(Sample {
            at: Instant::now() - monotonic_age,
            wall: SystemTime::now() - wall_age,
            generation: 1,
            server_us: 1_000_000_000_000,
        });
        clock
    }

    #[test]
    fn a_sample_is_used_while_both_clocks_agree_on_its_age() {
        let (now, stale) = sampled(Duration::from_secs(2), Duration::from_secs(2)).now_us(1);
        let now = now.expect("a usable sample");
        assert!(now >= 1_000_002_000_000, "the age is added: {now}");
        assert!(!stale);
        let (now, stale) = sampled(Duration::from_secs(11), Duration::from_secs(11)).now_us(1);
        assert!(now.is_some() && stale, "used, and a new one is due");
        assert_eq!(sampled(Duration::from_secs(61), Duration::from_secs(61)).now_us(1).0, None);
    }

    /// The monotonic clock stood still while the machine slept: after a resume it says the
    /// sample is a second old where a minute passed, and the estimate would be a minute behind
    /// the server (a lease written from it would have ended already).
    #[test]
    fn a_sample_from_before_a_sleep_is_set_aside() {
        let clock = sampled(Duration::from_secs(1), Duration::from_secs(61));
        assert_eq!(clock.now_us(1), (None, true), "no estimate, and a new sample is due");
        // The system clock stepped back since the sample.
        let clock = ServerClock::default();
        *crate::sync::lock(&clock.sample) = Some(Sample {
            at: Instant::now(),
            wall: SystemTime::now() + Duration::from_secs(5),
            generation: 1,
            server_us: 1,
        });
        assert_eq!(clock.now_us(1), (None, true));
    }

    /// A connection made again (after a failover, a silent connection) may reach another server,
    /// whose clock the sample does not tell.
    #[test]
    fn a_sample_from_another_connection_is_set_aside() {
        let clock = sampled(Duration::from_secs(1), Duration::from_secs(1));
        assert_eq!(clock.now_us(2), (None, true));
        assert!(clock.now_us(1).0.is_some());
    }

    #[test]
    fn a_sample_records_its_connection() {
        let clock = ServerClock::default();
        assert!(clock.start_sampling());
        let sent = Instant::now();
        clock.record(sent, sent + Duration::from_millis(1), (1_000, 5), 7);
        assert!(clock.now_us(7).0.is_some_and(|now| now >= 1_000_000_005 + 1_000));
        assert_eq!(clock.now_us(6).0, None);
        assert!(clock.start_sampling(), "the sampling job was given back");
    }
}
