//! What an operator sees of a store and how records are settled by hand (`docs/design.md` §5.1):
//! listing by state, one record by key, resolving an unknown outcome, purging and counting.

use std::time::Duration;

use crate::key::{Fingerprint, Key};

use super::{Fence, Outcome};

/// Who made a record: the tool's stable name and the scope of the call, as the executor knew
/// them at the claim. Stored with the record for listing and filtering; never part of the key.
/// Empty strings where nothing is known (a claim made without the executor).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Origin<'a> {
    /// The tool's stable name.
    pub tool: &'a str,
    /// The scope's tenant; empty when none was set.
    pub tenant: &'a str,
    /// The scope's run id.
    pub run: &'a str,
}

/// An [`Origin`] as read back from a store.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoredOrigin {
    /// The tool's stable name.
    pub tool: String,
    /// The scope's tenant; empty when none was set.
    pub tenant: String,
    /// The scope's run id.
    pub run: String,
}

/// The state of a record as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordState {
    /// An owner holds (or held) the claim and no outcome is stored. `lease_remaining` is zero
    /// when the lease ended without a result: a dead owner. A `keyed` or `safe` tool's next call
    /// takes it over; a `never` tool's answers `OutcomeUnknown` until it is resolved.
    InFlight {
        /// Time left on the owner's lease; zero once it has ended.
        lease_remaining: Duration,
    },
    /// The stored outcome.
    Done(Outcome),
}

impl RecordState {
    /// Whether an outcome is stored ([`RecordState::Done`]).
    pub fn is_done(&self) -> bool {
        matches!(self, RecordState::Done(_))
    }
}

/// The states a listing can be restricted to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateFilter {
    /// In flight, lease live or ended ([`RecordState::InFlight`]).
    InFlight,
    /// In flight with the owner's lease ended and no result: a dead owner
    /// ([`RecordState::InFlight`] with no time left; what [`Stats`] counts as `lease_expired`).
    LeaseEnded,
    /// Outcome unknown ([`Outcome::Unknown`]).
    Unknown,
    /// Succeeded ([`Outcome::Success`]).
    Completed,
    /// Failed permanently ([`Outcome::Failure`]).
    Failed,
    /// Ran, output not storable ([`Outcome::NotStorable`]).
    NotStorable,
}

impl StateFilter {
    /// Whether a record in `state` is one this filter selects.
    pub fn matches(self, state: &RecordState) -> bool {
        matches!(
            (self, state),
            (StateFilter::InFlight, RecordState::InFlight { .. })
                | (
                    StateFilter::LeaseEnded,
                    RecordState::InFlight { lease_remaining: Duration::ZERO }
                )
                | (StateFilter::Unknown, RecordState::Done(Outcome::Unknown))
                | (StateFilter::Completed, RecordState::Done(Outcome::Success(_)))
                | (StateFilter::Failed, RecordState::Done(Outcome::Failure(_)))
                | (StateFilter::NotStorable, RecordState::Done(Outcome::NotStorable(_)))
        )
    }
}

/// One record as an operator sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordInfo {
    /// The idempotency key.
    pub key: Key,
    /// The fingerprint of the arguments the record was claimed with.
    pub fingerprint: Fingerprint,
    /// The current fence: pass it to [`Store::resolve`](super::Store::resolve).
    pub fence: Fence,
    /// Tool and scope; `None` for a record written by a version of idem that did not store them.
    pub origin: Option<StoredOrigin>,
    /// In flight or done, with what.
    pub state: RecordState,
    /// Time since the record entered its state (claimed, taken over or completed), on the store's
    /// clock; `None` for a record written by a version of idem that did not store it.
    pub age: Option<Duration>,
}

/// Which records [`Store::list`](super::Store::list) returns. All filters must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// Only records in this state.
    pub state: Option<StateFilter>,
    /// Only records of this tool (its stable name, exact). Records without an origin never match.
    pub tool: Option<String>,
    /// Only records of exactly this run id (`""`: calls made without a run). Records without an
    /// origin never match.
    pub run: Option<String>,
    /// Only records whose run id starts with this. Records without an origin never match.
    pub run_prefix: Option<String>,
    /// Only records at least this old ([`RecordInfo::age`]). Records without an age never match.
    pub older_than: Option<Duration>,
    /// At most this many records in one page (at least 1 is used); 0 means the store's default,
    /// [`DEFAULT_PAGE`].
    pub limit: usize,
    /// Where to go on: [`ListPage::next`] of the previous page; `None` for the first page.
    pub cursor: Option<String>,
}

/// The page size of a listing that names none.
pub const DEFAULT_PAGE: usize = 100;

impl ListQuery {
    /// The page size to use.
    pub fn page_size(&self) -> usize {
        if self.limit == 0 { DEFAULT_PAGE } else { self.limit }
    }

    /// Whether `info` passes every filter (stores that filter in memory use this).
    pub fn selects(&self, info: &RecordInfo) -> bool {
        if let Some(state) = self.state
            && !state.matches(&info.state)
        {
            return false;
        }
        let origin = info.origin.as_ref();
        if let Some(tool) = &self.tool
            && origin.is_none_or(|o| &o.tool != tool)
        {
            return false;
        }
        if let Some(run) = &self.run
            && origin.is_none_or(|o| &o.run != run)
        {
            return false;
        }
        if let Some(prefix) = &self.run_prefix
            && origin.is_none_or(|o| !o.run.starts_with(prefix.as_str()))
        {
            return false;
        }
        if let Some(min) = self.older_than
            && info.age.is_none_or(|age| age < min)
        {
            return false;
        }
        true
    }
}

/// One page of a listing.
///
/// A record the store cannot read (edited by hand, written by another version of idem, damaged)
/// does not fail the page: it is reported in [`ListPage::unreadable`], in its place in the order,
/// and the cursor goes on past it, so one such record never hides the others.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListPage {
    /// The readable records of this page. With [`ListPage::unreadable`], at most the query's page
    /// size. A page may hold fewer (even none) while more follow: a store that scans (Redis)
    /// filters each stretch it scans.
    pub records: Vec<RecordInfo>,
    /// The records of this page that cannot be read, in the listing's order. The SQL stores
    /// filter on columns, so an unreadable record is reported only when the columns the query
    /// filters on select it; the Redis store cannot filter what it cannot read and reports every
    /// unreadable record it scans, whatever the query.
    pub unreadable: Vec<UnreadableRecord>,
    /// The cursor of the next page (opaque, for [`ListQuery::cursor`]); `None` when the listing
    /// is complete.
    pub next: Option<String>,
    /// How many records the store examined for this page, readable or not (progress of a long
    /// scan).
    pub scanned: u64,
}

/// A record a listing found but cannot read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnreadableRecord {
    /// The record's key as stored, as text (bytes that are not UTF-8 replaced by U+FFFD). When it
    /// is an idempotency key (64 hex digits, [`Key::parse`]), [`Store::forget`](super::Store::forget)
    /// with that key removes the record (`idem forget <key>`); a key that is not one was edited
    /// by hand and is removed by hand.
    pub key: String,
    /// Why the record cannot be read (a malformed field, an unknown state or outcome kind, a
    /// schema version this idem does not read), for the operator.
    pub reason: String,
}

/// How an operator settles a record ([`Store::resolve`](super::Store::resolve)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// The effect took place with this outcome: it is stored (kept for `ttl`) and later calls
    /// replay it.
    Happened {
        /// What later calls replay (normally [`Outcome::Success`] with the result's JSON).
        outcome: Outcome,
        /// How long the record is kept.
        ttl: Duration,
    },
    /// The effect did not take place: the record is removed, so the next call runs. Fences of
    /// the key still increase afterwards.
    NotHappened,
}

/// Counts of records by state ([`Store::stats`](super::Store::stats)). Records whose retention
/// ended but that are not yet removed are not counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// In flight with a live lease.
    pub in_flight: u64,
    /// In flight with a lease that ended without a result (dead owners).
    pub lease_expired: u64,
    /// Outcome unknown.
    pub unknown: u64,
    /// Succeeded.
    pub completed: u64,
    /// Failed permanently.
    pub failed: u64,
    /// Output not storable.
    pub not_storable: u64,
    /// Records this version cannot read (another version's, or edited by hand).
    pub unreadable: u64,
}

impl Stats {
    /// Adds one record in `state` to the counts.
    pub fn count(&mut self, state: &RecordState) {
        match state {
            RecordState::InFlight { lease_remaining } if lease_remaining.is_zero() => {
                self.lease_expired += 1
            }
            RecordState::InFlight { .. } => self.in_flight += 1,
            RecordState::Done(Outcome::Unknown) => self.unknown += 1,
            RecordState::Done(Outcome::Success(_)) => self.completed += 1,
            RecordState::Done(Outcome::Failure(_)) => self.failed += 1,
            RecordState::Done(Outcome::NotStorable(_)) => self.not_storable += 1,
        }
    }

    /// All records counted.
    pub fn total(&self) -> u64 {
        self.in_flight
            + self.lease_expired
            + self.unknown
            + self.completed
            + self.failed
            + self.not_storable
            + self.unreadable
    }
}

/// Whether a record may be resolved: its outcome is unknown, or its lease ended without a result.
/// A live owner, or a stored success or failure, is never overwritten by a resolution.
pub fn resolvable(state: &RecordState) -> bool {
    matches!(
        state,
        RecordState::Done(Outcome::Unknown)
            | RecordState::InFlight { lease_remaining: Duration::ZERO }
    )
}

/// The smallest string above every string that starts with `prefix` (in code point order, which is UTF-8's byte order and SQL's binary / "C" collation),
/// for an indexed range; `None` when there is none (a prefix of only U+10FFFF).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        if let Some(next) = (last as u32 + 1..=0x10FFFF).find_map(char::from_u32) {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// What a store's [`Store::forget_seen`](super::Store::forget_seen) step found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Forgot {
    /// The record as seen: removed.
    Removed,
    /// A record, but no longer as seen: left as it is.
    Changed,
    /// No record.
    Absent,
}

impl Forgot {
    /// The answer of `forget_seen`.
    pub(crate) fn answer(self) -> Result<bool, super::StoreError> {
        match self {
            Forgot::Removed => Ok(true),
            Forgot::Changed => Err(super::StoreError::LeaseLost),
            Forgot::Absent => Ok(false),
        }
    }
}

/// The SQL `LIMIT` of a page of `size` rows: one row more, which says whether another page
/// follows (a page that ends the listing has no cursor). Saturates for a size past `i64`.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn page_limit(size: usize) -> i64 {
    i64::try_from(size).unwrap_or(i64::MAX).saturating_add(1)
}

#[cfg(all(test, any(feature = "sqlite", feature = "postgres")))]
mod tests {
    use super::prefix_end;

    #[test]
    fn prefix_end_is_above_every_extension() {
        assert_eq!(prefix_end("run-1").as_deref(), Some("run-2"));
        assert_eq!(prefix_end("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_end("\u{10FFFF}"), None);
        assert_eq!(prefix_end(""), None);
        assert_eq!(prefix_end("\u{D7FF}").as_deref(), Some("\u{E000}"));
    }
}
