//! What a call's client missed when it dropped the call's stream, kept for a late resume.
//!
//! A client whose connection breaks mid-call resumes the call's stream with `GET` and
//! `Last-Event-ID` (MCP 2025-11-25 "Transports", resumability). rmcp keeps a request's events
//! after its response for such late resumes (`SessionConfig::completed_cache_ttl`), but 3.11
//! removes them as the response is sent: a resume that came after the call had ended got an
//! empty stream, and the official Python SDK reconnected for ever without the result. So
//! [`Checked`](super::Checked) reads a dropped call's stream on to its end itself, keeps the
//! events the client did not get for `completed_cache_ttl`, and answers a resume of that stream
//! from them. A resume while the call still runs goes to rmcp, which then sends the rest to the
//! resumed stream instead.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;

/// The most of a dropped stream kept (bytes of whole events); a longer one is not kept, and its
/// resume is rmcp's.
const MAX_KEPT_BYTES: usize = 16 << 20;

/// The most kept in all; past it the oldest streams go first. Each stream is kept for a client
/// that may never come back, so what many dropped calls leave behind is bounded.
const MAX_TOTAL_BYTES: usize = 64 << 20;

/// The events kept per (session, rmcp's request stream id).
#[derive(Clone, Debug)]
pub(super) struct LateResults(Arc<Mutex<Kept>>);

#[derive(Debug)]
pub(super) struct Kept {
    /// How long events are kept: rmcp's `completed_cache_ttl`.
    ttl: Duration,
    /// Per session, per rmcp request stream id: its events and the number of their keeping.
    sessions: HashMap<String, HashMap<u64, (Vec<Event>, u64)>>,
    /// What was kept, oldest first: expiry and the total bound take from the front, so that
    /// neither walks every stream (many dropped calls keep many). An entry whose stream has
    /// since gone (its session forgotten, or kept again under a later number) is passed over.
    order: VecDeque<Keeping>,
    /// The number of the next keeping.
    next: u64,
    /// Per session, the dropped streams still being read (their events not kept yet).
    reading: HashMap<String, usize>,
    /// Told whenever a reader ends.
    read: Arc<tokio::sync::Notify>,
    /// The bytes of every kept event.
    bytes: usize,
}

#[derive(Debug)]
struct Keeping {
    session: String,
    stream: u64,
    number: u64,
    at: Instant,
}

/// One whole SSE event and its index in its stream (rmcp's event id `<index>/<stream>`).
#[derive(Debug)]
struct Event {
    index: u64,
    bytes: Bytes,
}

impl LateResults {
    pub(super) fn new(ttl: Duration) -> Self {
        LateResults(Arc::new(Mutex::new(Kept {
            ttl,
            sessions: HashMap::new(),
            order: VecDeque::new(),
            next: 0,
            reading: HashMap::new(),
            read: Arc::default(),
            bytes: 0,
        })))
    }

    pub(super) fn downgrade(&self) -> Weak<Mutex<Kept>> {
        Arc::downgrade(&self.0)
    }

    fn lock(&self) -> MutexGuard<'_, Kept> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The kept events of `session`'s stream named by `last_event_id` (`<index>/<stream>`) that
    /// come after it, as one event-stream body; `None` when none are kept.
    pub(super) fn after(&self, session: &str, last_event_id: &str) -> Option<Bytes> {
        let (index, stream) = last_event_id.trim().split_once('/')?;
        let (index, stream) = (index.parse::<u64>().ok()?, stream.parse::<u64>().ok()?);
        let mut kept = self.lock();
        kept.expire();
        let (events, _) = kept.sessions.get(session)?.get(&stream)?;
        let mut body = Vec::new();
        for event in events.iter().filter(|e| e.index > index) {
            body.extend_from_slice(&event.bytes);
        }
        (!body.is_empty()).then(|| Bytes::from(body))
    }

    /// Reads the rest of a call's stream, dropped by its client, to its end (the call's
    /// response, or the session's end) and keeps its events. `held` (the request's id in its
    /// session, its session's use) is let go of once the stream has ended. Outside a runtime,
    /// the stream is dropped as before.
    pub(super) fn read_on<H: Send + 'static>(
        &self,
        session: String,
        mut body: BoxBody<Bytes, Infallible>,
        held: H,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let results = self.downgrade();
        *self.lock().reading.entry(session.clone()).or_default() += 1;
        let reading = Reading { results: results.clone(), session: session.clone() };
        runtime.spawn(async move {
            let _reading = reading;
            let mut read = Vec::new();
            while let Some(Ok(frame)) = body.frame().await {
                if let Ok(data) = frame.into_data() {
                    if read.len() + data.len() > MAX_KEPT_BYTES {
                        return;
                    }
                    read.extend_from_slice(&data);
                }
            }
            let mut stream = None;
            let mut events = Vec::new();
            for event in whole_events(&read) {
                if let Some((index, of)) = event_id(event) {
                    stream.get_or_insert(of);
                    events.push(Event { index, bytes: Bytes::copy_from_slice(event) });
                }
            }
            if let (Some(stream), Some(results)) = (stream, results.upgrade()) {
                let mut kept = results.lock().unwrap_or_else(PoisonError::into_inner);
                kept.keep((session, stream), events);
            }
            // Once kept: a resume from then on finds it.
            drop(held);
        });
    }
}

/// A dropped stream being read on: counted in [`Kept::reading`] until dropped.
struct Reading {
    results: Weak<Mutex<Kept>>,
    session: String,
}

impl Drop for Reading {
    fn drop(&mut self) {
        let Some(results) = self.results.upgrade() else { return };
        let mut kept = results.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = kept.reading.get_mut(&self.session) {
            *n -= 1;
            if *n == 0 {
                kept.reading.remove(&self.session);
            }
        }
        kept.read.notify_waiters();
    }
}

impl LateResults {
    /// [`after`](Self::after), waiting up to `max` for the dropped streams of `session` still
    /// being read: rmcp drops a request's events as it answers, a moment before the reader of
    /// the dropped stream has kept them, and a resume in between found neither.
    pub(super) async fn after_readers(
        &self,
        session: &str,
        last_event_id: &str,
        max: Duration,
    ) -> Option<Bytes> {
        let deadline = tokio::time::Instant::now() + max;
        loop {
            let read = Arc::clone(&self.lock().read);
            let ended = read.notified();
            tokio::pin!(ended);
            // Registered before the check: a reader that ends in between is not missed.
            ended.as_mut().enable();
            if let Some(kept) = self.after(session, last_event_id) {
                return Some(kept);
            }
            if !self.lock().reading.contains_key(session) {
                return None;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return self.after(session, last_event_id);
            }
        }
    }
}

#[cfg(test)]
impl LateResults {
    /// Keeps `event` (whole, with its id `<index>/<stream>`) as if read from a dropped stream.
    pub(super) fn keep_for_test(&self, session: &str, event: &'static [u8]) {
        let (index, stream) = event_id(event).expect("an event with an rmcp id");
        let events = vec![Event { index, bytes: Bytes::from_static(event) }];
        self.lock().keep((session.to_owned(), stream), events);
    }
}

impl LateResults {
    /// Forgets what is kept for `session` (closed).
    pub(super) fn forget(&self, session: &str) {
        let mut kept = self.lock();
        if let Some(streams) = kept.sessions.remove(session) {
            let freed: usize = streams.values().map(|(events, _)| size(events)).sum();
            kept.bytes = kept.bytes.saturating_sub(freed);
        }
    }
}

/// [`LateResults::forget`] through a weak reference (the task that closes idle sessions).
pub(super) fn forget(results: &Weak<Mutex<Kept>>, session: &str) {
    if let Some(results) = results.upgrade() {
        LateResults(results).forget(session);
    }
}

fn size(events: &[Event]) -> usize {
    events.iter().map(|e| e.bytes.len()).sum()
}

impl Kept {
    fn expire(&mut self) {
        while self.order.front().is_some_and(|oldest| oldest.at.elapsed() >= self.ttl) {
            self.drop_oldest();
        }
    }

    /// Drops the oldest keeping's stream, if it is still kept; `false` when nothing is kept.
    fn drop_oldest(&mut self) -> bool {
        let Some(oldest) = self.order.pop_front() else { return false };
        if let Some(streams) = self.sessions.get_mut(&oldest.session) {
            if streams.get(&oldest.stream).is_some_and(|(_, number)| *number == oldest.number)
                && let Some((events, _)) = streams.remove(&oldest.stream)
            {
                self.bytes = self.bytes.saturating_sub(size(&events));
            }
            if streams.is_empty() {
                self.sessions.remove(&oldest.session);
            }
        }
        true
    }

    fn keep(&mut self, (session, stream): (String, u64), events: Vec<Event>) {
        self.expire();
        let replaced = self.sessions.get_mut(&session).and_then(|streams| streams.remove(&stream));
        if let Some((replaced, _)) = replaced {
            self.bytes = self.bytes.saturating_sub(size(&replaced));
        }
        let adds = size(&events);
        while self.bytes + adds > MAX_TOTAL_BYTES && self.drop_oldest() {}
        let number = self.next;
        self.next += 1;
        self.sessions.entry(session.clone()).or_default().insert(stream, (events, number));
        self.order.push_back(Keeping { session, stream, number, at: Instant::now() });
        self.bytes += adds;
    }
}

/// The whole events of an event stream (each with the blank line that ends it).
fn whole_events(stream: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut start = 0;
    let mut line_start = 0;
    let mut ends = Vec::new();
    for (i, b) in stream.iter().enumerate() {
        if *b == b'\n' {
            let line = &stream[line_start..i];
            if line.strip_suffix(b"\r").unwrap_or(line).is_empty() {
                ends.push((start, i + 1));
                start = i + 1;
            }
            line_start = i + 1;
        }
    }
    ends.into_iter().map(move |(from, to)| &stream[from..to])
}

/// An event's rmcp id, `<index>/<stream>`; `None` for one without (a keep-alive comment).
fn event_id(event: &[u8]) -> Option<(u64, u64)> {
    event.split(|b| *b == b'\n').find_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let id = line.strip_prefix(b"id:")?;
        let id = std::str::from_utf8(id).ok()?.trim();
        let (index, stream) = id.split_once('/')?;
        Some((index.parse().ok()?, stream.parse().ok()?))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_split_and_their_ids_read() {
        let stream = b"data: \nid: 0/7\nretry: 3000\n\n: keep-alive\n\ndata: {\"a\":1}\r\nid: 1/7\r\n\r\npartial";
        let events: Vec<&[u8]> = whole_events(stream).collect();
        assert_eq!(events.len(), 3);
        let ids: Vec<Option<(u64, u64)>> = events.iter().map(|e| event_id(e)).collect();
        assert_eq!(ids, [Some((0, 7)), None, Some((1, 7))]);
    }

    /// What dropped streams leave is bounded in all: the oldest go first.
    #[test]
    fn the_oldest_streams_go_past_the_total_bound() {
        let results = LateResults::new(Duration::from_secs(60));
        let big = |n: u64| {
            let mut bytes = format!("id: 0/{n}\ndata: ").into_bytes();
            bytes.resize(MAX_TOTAL_BYTES / 3, b'x');
            bytes.extend_from_slice(b"\n\n");
            vec![Event { index: 1, bytes: Bytes::from(bytes) }]
        };
        for n in 0..5 {
            results.lock().keep(("s".into(), n), big(n));
        }
        let kept = results.lock();
        let mut streams: Vec<u64> = kept.sessions["s"].keys().copied().collect();
        streams.sort_unstable();
        assert_eq!(streams, [3, 4]);
        assert_eq!(kept.bytes, 2 * (MAX_TOTAL_BYTES / 3 + 2));
    }

    /// Expiry and the total bound take the oldest keeping first, and pass over one whose stream
    /// has gone since (its session forgotten) or was kept again: that stream stays, counted once.
    #[test]
    fn expiry_passes_over_forgotten_and_kept_again_streams() {
        let results = LateResults::new(Duration::from_millis(200));
        let event = |stream: u64| {
            let bytes = format!("data: {{}}\nid: 1/{stream}\n\n").into_bytes();
            vec![Event { index: 1, bytes: Bytes::from(bytes) }]
        };
        let one = size(&event(1));
        results.lock().keep(("a".into(), 1), event(1));
        results.lock().keep(("b".into(), 2), event(2));
        results.lock().keep(("a".into(), 3), event(3));
        results.forget("a");
        assert_eq!(results.lock().bytes, one, "b's stream only");
        // Kept again: its first keeping, now the oldest, must not take it.
        results.lock().keep(("b".into(), 2), event(2));
        assert_eq!(results.lock().bytes, one);
        assert!(results.lock().drop_oldest(), "a's first, gone");
        assert!(results.lock().drop_oldest(), "b's first, kept again since");
        assert!(results.lock().drop_oldest(), "a's second, gone");
        assert!(results.after("b", "0/2").is_some(), "b's stream stays");
        assert_eq!(results.lock().bytes, one);
        std::thread::sleep(Duration::from_millis(250));
        results.lock().keep(("c".into(), 4), event(4));
        let kept = results.lock();
        assert!(!kept.sessions.contains_key("b"), "expired");
        assert_eq!((kept.bytes, kept.order.len()), (one, 1));
    }

    /// A resume that comes while a dropped stream of its session is still being read waits for
    /// the reader, and gets what it keeps; with no reader, it does not wait.
    #[tokio::test]
    async fn a_resume_waits_for_the_readers_of_its_session() {
        let results = LateResults::new(Duration::from_secs(60));
        let (send, frames) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
        let frames = futures_util::stream::unfold(frames, |mut frames| async move {
            let frame = frames.recv().await?;
            Some((Ok::<_, Infallible>(http_body::Frame::data(frame)), frames))
        });
        results.read_on("s".into(), BoxBody::new(http_body_util::StreamBody::new(frames)), ());
        let waiting = {
            let results = results.clone();
            tokio::spawn(
                async move { results.after_readers("s", "0/7", Duration::from_secs(60)).await },
            )
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "waits while the stream is read");
        send.send(Bytes::from_static(b"data: {\"result\":1}\nid: 1/7\n\n")).unwrap();
        drop(send);
        let kept = waiting.await.unwrap();
        assert_eq!(kept.as_deref(), Some(&b"data: {\"result\":1}\nid: 1/7\n\n"[..]));
        // No reader in the session: answered at once.
        let none = tokio::time::timeout(
            Duration::from_secs(30),
            results.after_readers("s", "0/8", Duration::from_secs(60)),
        );
        assert_eq!(none.await.expect("no wait"), None);
        assert!(results.lock().reading.is_empty());
    }

    #[test]
    fn a_resume_gets_the_kept_events_after_its_last_id_of_its_own_session_only() {
        let results = LateResults::new(Duration::from_secs(60));
        let events = vec![
            Event { index: 0, bytes: Bytes::from_static(b"data: \nid: 0/7\n\n") },
            Event { index: 1, bytes: Bytes::from_static(b"data: {}\nid: 1/7\n\n") },
        ];
        results.lock().keep(("s".into(), 7), events);
        assert_eq!(results.after("s", "0/7").as_deref(), Some(&b"data: {}\nid: 1/7\n\n"[..]));
        assert_eq!(results.after("s", "1/7"), None, "nothing after the last");
        assert_eq!(results.after("other", "0/7"), None, "another session's");
        assert_eq!(results.after("s", "0/8"), None, "another stream");
        assert_eq!(results.after("s", "bad"), None);
        results.forget("s");
        assert_eq!(results.after("s", "0/7"), None, "forgotten with its session");
        assert_eq!(results.lock().bytes, 0);
    }
}
