//! Appending events with the right seqs and times.

use lineage_log::{Event, EventBody};

/// Builds a log event by event: every pushed event gets the next seq (its index) and the builder's
/// current time, so the seq contract holds by construction. It checks nothing else; the callers in
/// this crate keep the structure valid themselves.
#[derive(Clone, Debug, Default)]
pub struct LogBuilder {
    events: Vec<Event>,
    time_ms: i64,
}

impl LogBuilder {
    /// An empty log whose first event will carry `start_ms`.
    pub fn new(start_ms: i64) -> Self {
        LogBuilder {
            events: Vec::new(),
            time_ms: start_ms,
        }
    }

    /// The seq the next event gets.
    pub fn next_seq(&self) -> u64 {
        self.events.len() as u64
    }

    /// How many events have been pushed.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether nothing has been pushed.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The time the next event gets.
    pub fn time_ms(&self) -> i64 {
        self.time_ms
    }

    /// Moves the clock forward by `ms` (saturating, so extreme start times cannot overflow).
    pub fn advance(&mut self, ms: i64) {
        self.time_ms = self.time_ms.saturating_add(ms);
    }

    /// Pushes `body` at the next seq and the current time; returns its seq.
    pub fn push(&mut self, body: impl Into<EventBody>) -> u64 {
        let seq = self.next_seq();
        self.events.push(Event::new(seq, self.time_ms, body));
        seq
    }

    /// The events so far, in seq order.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// The events, taken out.
    pub fn into_events(self) -> Vec<Event> {
        self.events
    }
}

/// `S(n)` for every n: `digests[k]` is the running digest of the first `k` records, computed record
/// by record (independently of how the code under test computes it).
pub fn running_digests(events: &[Event]) -> Vec<lineage_log::Digest> {
    let mut chain = lineage_log::Chain::new();
    let mut digests = vec![chain.digest()];
    for event in events {
        chain.update(&lineage_log::encode_record(event));
        digests.push(chain.digest());
    }
    digests
}
