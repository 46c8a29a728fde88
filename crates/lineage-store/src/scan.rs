//! Streaming reads: a session's events one block at a time, in constant memory.
//!
//! [`Store::scan`] reads like [`Store::inspect`] (every block's digest checked in order, the
//! header's count and head digest checked at the end, the open tail turn replayed, the in-memory
//! crash-repair closers computed) but holds one block's events at a time instead of the whole log.
//! [`Store::scan_unchecked`] reads like [`Store::read_from`]: from the block holding a seq, with no
//! digest checks (they need the log from seq 0).

use crate::engine::Blocks;
use crate::layout::{Block, BlockFormat};
use crate::read::read_record;
use crate::store::guard;
use crate::{Result, SessionInfo, Store, StoreError};
use lineage_log::{
    Chain, Event, EventBody, LogError, Records, SessionId, Structure, decode_record,
    interrupted_turn_closers,
};

/// A session's events, read block by block inside one read transaction: an iterator of
/// `Result<Event>` that ends after the first error.
///
/// Every event comes from the same snapshot as [`Scan::info`]: commits made while the scan runs
/// are not seen. Dropping the scan early ends the read transaction; nothing else needs closing.
///
/// A checked scan ([`Store::scan`]) reports damage in seq order as it meets it, so the events of
/// the blocks before a damaged one have already been yielded when the error comes; the damaged
/// block's own events never are. Its end (the header's event count and head digest, and the
/// replay of an open tail turn) is checked when the last event has been yielded, before the
/// iterator ends: only a scan that ended without an error has [`Scan::closers`].
pub struct Scan {
    blocks: Blocks,
    format: BlockFormat,
    session: SessionId,
    info: SessionInfo,
    from: u64,
    /// The decoded events of the current block not yet yielded.
    current: std::vec::IntoIter<Event>,
    /// `Some` for a checked scan.
    check: Option<Checks>,
    closers: Option<Vec<Event>>,
    done: bool,
}

/// What a checked scan folds as it goes.
struct Checks {
    chain: Chain,
    /// The first seq the next block must hold.
    expected: u64,
    /// The open turn's structure, replayed event by event from its `turn/start` (as loading the
    /// whole log replays its open tail turn).
    turn: Option<Structure>,
    /// The first rule the open turn broke, if it broke one: an error only if the log ends inside
    /// that turn, since a later `turn/start` or `turn/end` means the full read never replays it.
    turn_error: Option<LogError>,
    /// The events of the open turn that crash repair depends on: its `turn/start` and, since the
    /// last `step/end`, the step's start, calls and results (see [`RepairTail`]).
    repair: RepairTail,
    /// The last event read (the closers continue after it).
    last: Option<Event>,
}

impl std::fmt::Debug for Scan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scan")
            .field("session", &self.session)
            .field("len", &self.info.len)
            .field("from", &self.from)
            .field("checked", &self.check.is_some())
            .field("done", &self.done)
            .finish()
    }
}

impl Store {
    /// Streams `session`'s committed events with `seq >= from`, checking them as
    /// [`Store::inspect`] does, in constant memory.
    ///
    /// Every block from seq 0 is read, its digest checked in order and its records decoded (the
    /// events before `from` are checked, not yielded). When the last event has been yielded the
    /// header's event count and head digest are checked, an open tail turn is replayed, and
    /// [`Scan::closers`] gives the crash-repair closers `inspect` would append. The store is not
    /// touched; works on read-only stores.
    pub fn scan(&self, session: SessionId, from: u64) -> Result<Scan> {
        guard(|| self.start_scan(session, from, true))
    }

    /// Streams `session`'s committed events with `seq >= from`, starting at the block that holds
    /// `from`, like [`Store::read_from`] in constant memory: records are decoded, but digests are
    /// not checked (that needs the log from seq 0) and no closers are computed.
    pub fn scan_unchecked(&self, session: SessionId, from: u64) -> Result<Scan> {
        guard(|| self.start_scan(session, from, false))
    }

    fn start_scan(&self, session: SessionId, from: u64, checked: bool) -> Result<Scan> {
        let view = self.view()?;
        let record = read_record(&*view, session)?;
        let start = if checked {
            0
        } else {
            view.block_start(session, from)?
        };
        let blocks = view.blocks(session, start)?;
        let info = SessionInfo {
            len: record.next_seq,
            head: record.head,
            revision: record.revision,
            header: record.header,
        };
        // An unchecked scan past the end has nothing to read.
        let done = !checked && from >= info.len;
        Ok(Scan {
            blocks,
            format: self.inner.format,
            session,
            info,
            from,
            current: Vec::new().into_iter(),
            check: checked.then(|| Checks {
                chain: Chain::new(),
                expected: 0,
                turn: None,
                turn_error: None,
                repair: RepairTail::default(),
                last: None,
            }),
            closers: None,
            done,
        })
    }
}

impl Scan {
    /// The session's header and position in the scan's snapshot: `info().len` is the number of
    /// stored events the scan reads (from seq 0; it yields those at or after its `from`).
    pub fn info(&self) -> &SessionInfo {
        &self.info
    }

    /// The crash-repair closers [`Store::inspect`] would append (empty for a balanced log), once a
    /// checked scan has ended without an error; `None` before then and for an unchecked scan.
    pub fn closers(&self) -> Option<&[Event]> {
        self.closers.as_deref()
    }

    /// Reads the next block into `current`, or checks the end. `Ok(false)` when there is nothing
    /// more to read.
    fn advance(&mut self) -> Result<bool> {
        let session = self.session;
        let Some(entry) = self.blocks.next() else {
            if let Some(check) = self.check.take() {
                self.closers = Some(check.finish(session, &self.info)?);
            }
            return Ok(false);
        };
        let (first_seq, value) = entry?;
        let block = Block::parse(self.format, session, first_seq, &value)?;
        let last_seq = block.last_seq(first_seq);
        if let Some(check) = &mut self.check {
            if first_seq != check.expected {
                return Err(StoreError::CorruptBlock {
                    session,
                    first_seq,
                    last_seq,
                    reason: format!(
                        "seq gap: expected a block starting at seq {}",
                        check.expected
                    ),
                });
            }
            check.expected = last_seq + 1;
            check.chain.update(&block.records);
            if check.chain.digest() != block.digest {
                return Err(StoreError::CorruptBlock {
                    session,
                    first_seq,
                    last_seq,
                    reason: "digest mismatch: the block's records are not the ones written".into(),
                });
            }
        }
        let mut events = Vec::with_capacity(block.count as usize);
        let mut records = Records::new(&block.records, first_seq);
        for item in records.by_ref() {
            let (seq, raw) = item.map_err(|e| StoreError::from_log(session, e))?;
            if seq > last_seq {
                return Err(StoreError::CorruptBlock {
                    session,
                    first_seq,
                    last_seq,
                    reason: "holds more records than its header counts".into(),
                });
            }
            let event = decode_record(seq, &raw).map_err(|e| StoreError::from_log(session, e))?;
            if let Some(check) = &mut self.check {
                check.observe(&event);
                if seq == last_seq {
                    // Only the log's last event is needed: one clone per block.
                    check.last = Some(event.clone());
                }
            }
            if seq >= self.from {
                events.push(event);
            }
        }
        if records.next_seq() != last_seq + 1 {
            return Err(StoreError::CorruptBlock {
                session,
                first_seq,
                last_seq,
                reason: format!(
                    "header counts {} records, the block holds {}",
                    block.count,
                    records.next_seq() - first_seq
                ),
            });
        }
        self.current = events.into_iter();
        Ok(true)
    }
}

impl Iterator for Scan {
    type Item = Result<Event>;

    fn next(&mut self) -> Option<Result<Event>> {
        loop {
            if let Some(event) = self.current.next() {
                return Some(Ok(event));
            }
            if self.done {
                return None;
            }
            match guard(|| self.advance()) {
                Ok(true) => {}
                Ok(false) => {
                    self.done = true;
                    return None;
                }
                Err(e) => {
                    self.done = true;
                    self.current = Vec::new().into_iter();
                    return Some(Err(e));
                }
            }
        }
    }
}

impl std::iter::FusedIterator for Scan {}

impl Checks {
    /// Folds one decoded event into the running checks.
    fn observe(&mut self, event: &Event) {
        match &event.body {
            EventBody::TurnStart(start) => {
                let mut structure = Structure::balanced_at(event.seq, start.turn.saturating_sub(1));
                self.turn_error = structure.admit(event).err();
                self.turn = self.turn_error.is_none().then_some(structure);
            }
            EventBody::TurnEnd(_) => {
                self.turn = None;
                self.turn_error = None;
            }
            _ => {
                if let Some(structure) = &mut self.turn
                    && let Err(e) = structure.admit(event)
                {
                    self.turn_error = Some(e);
                    self.turn = None;
                }
            }
        }
        self.repair.observe(event);
    }

    /// Checks the end as the full read does and returns the closers.
    fn finish(self, session: SessionId, info: &SessionInfo) -> Result<Vec<Event>> {
        if self.expected != info.len {
            return Err(StoreError::CorruptHeader {
                session,
                reason: format!(
                    "the header records {} events, the blocks hold {}",
                    info.len, self.expected
                ),
            });
        }
        if self.chain.digest() != info.head {
            return Err(StoreError::CorruptHeader {
                session,
                reason: "the header's head digest differs from its blocks'".into(),
            });
        }
        if let Some(error) = self.turn_error {
            return Err(match error {
                LogError::InvalidEvent { seq, reason, .. } => StoreError::Corrupt {
                    session,
                    seq,
                    reason,
                },
                other => StoreError::from_log(session, other),
            });
        }
        Ok(self.repair.closers(self.last))
    }
}

/// The few events of a log's open tail turn that its crash-repair closers depend on, folded
/// event by event: the turn's `turn/start`, then, since the last `step/end`, the open step's
/// `step/start`, the assistant messages that ask for tools, the `tool/call`s and the
/// `tool/result`s. A `step/end` answers or abandons everything before it, so it leaves only the
/// `turn/start`; a `turn/end` leaves nothing. [`interrupted_turn_closers`] over these events and
/// the log's last event gives what it gives over the whole log, holding one step at most.
#[derive(Default)]
struct RepairTail {
    events: Vec<Event>,
}

impl RepairTail {
    fn observe(&mut self, event: &Event) {
        match &event.body {
            EventBody::TurnStart(_) => {
                self.events.clear();
                self.events.push(event.clone());
            }
            EventBody::TurnEnd(_) => self.events.clear(),
            EventBody::StepEnd(_) => self.events.truncate(1),
            EventBody::StepStart(_) | EventBody::ToolCall(_) | EventBody::ToolResult(_)
                if !self.events.is_empty() =>
            {
                self.events.push(event.clone());
            }
            EventBody::AssistantMessage(m)
                if !self.events.is_empty() && m.message.tool_calls().next().is_some() =>
            {
                self.events.push(event.clone());
            }
            _ => {}
        }
    }

    /// The closers after the log whose last event is `last`.
    fn closers(mut self, last: Option<Event>) -> Vec<Event> {
        if self.events.is_empty() {
            return Vec::new();
        }
        if let Some(last) = last
            && self.events.last().map(|e| e.seq) != Some(last.seq)
        {
            self.events.push(last);
        }
        interrupted_turn_closers(&self.events)
    }
}

#[cfg(test)]
mod tests {
    use lineage_log::{Event, EventKind, Header, SessionId, interrupted_turn_closers};
    use lineage_testkit::{arb_valid_log, realistic_session};
    use proptest::prelude::*;

    use super::RepairTail;
    use crate::engine::redb::tables::damage_block;
    use crate::{Store, StoreError, StoreOptions};

    /// Small blocks, so a few hundred events span many of them.
    fn small_blocks() -> StoreOptions {
        StoreOptions {
            block_events: 16,
            ..StoreOptions::default()
        }
    }

    /// A store holding `log` as one session, written in batches of 7 events.
    fn store_with(dir: &std::path::Path, log: &[Event]) -> (std::path::PathBuf, SessionId) {
        let path = dir.join("scan.lineage");
        let id = SessionId::new();
        let store = Store::open_with(&path, small_blocks()).unwrap();
        store.create(Header::new(id, 1_750_000_000_000)).unwrap();
        for batch in log.chunks(7) {
            store.append(id, batch).unwrap();
        }
        store.close().unwrap();
        (path, id)
    }

    /// A realistic log cut inside its last turn, after a `tool/call` whose result never came.
    fn torn_log() -> Vec<Event> {
        let mut log = realistic_session(11, 400);
        let call = log
            .iter()
            .rposition(|e| e.kind() == EventKind::ToolCall)
            .expect("the session calls tools");
        log.truncate(call + 1);
        log
    }

    #[test]
    fn a_checked_scan_yields_what_inspect_reads_from_any_seq() {
        let dir = tempfile::tempdir().unwrap();
        for log in [
            realistic_session(5, 300),
            torn_log(),
            realistic_session(2, 1),
        ] {
            let (path, id) = store_with(dir.path(), &log);
            let store = Store::open_read_only(&path).unwrap();
            let loaded = store.inspect(id).unwrap();
            let stored = &loaded.events[..loaded.events.len() - loaded.closers];
            let len = stored.len();
            for from in [
                0,
                1,
                15,
                16,
                17,
                len / 2,
                len.saturating_sub(1),
                len,
                len + 5,
            ] {
                let mut scan = store.scan(id, from as u64).unwrap();
                assert_eq!(scan.info().len, len as u64);
                assert_eq!(scan.info().header, loaded.header);
                assert_eq!(scan.closers(), None, "known only at the end");
                let events: Vec<Event> = scan.by_ref().map(Result::unwrap).collect();
                assert_eq!(events, stored[from.min(len)..], "from {from}");
                assert_eq!(
                    scan.closers(),
                    Some(&loaded.events[len..]),
                    "the closers inspect appends, from {from}"
                );
            }
            drop(store);
            std::fs::remove_file(&path).unwrap();
        }
    }

    #[test]
    fn a_torn_log_scans_with_its_closers() {
        let dir = tempfile::tempdir().unwrap();
        let log = torn_log();
        let (path, id) = store_with(dir.path(), &log);
        let store = Store::open_read_only(&path).unwrap();
        let mut scan = store.scan(id, 0).unwrap();
        assert_eq!(scan.by_ref().count(), log.len());
        let closers = scan.closers().unwrap();
        assert_eq!(closers, interrupted_turn_closers(&log));
        assert_eq!(closers.first().unwrap().kind(), EventKind::ToolResult);
        assert_eq!(closers.last().unwrap().kind(), EventKind::TurnEnd);
    }

    #[test]
    fn an_unchecked_scan_yields_what_read_from_reads() {
        let dir = tempfile::tempdir().unwrap();
        let (path, id) = store_with(dir.path(), &realistic_session(6, 250));
        let store = Store::open_read_only(&path).unwrap();
        let len = store.info(id).unwrap().len;
        for from in [0, 1, 16, 40, len - 1, len, len + 3] {
            let scan = store.scan_unchecked(id, from).unwrap();
            let events: Vec<Event> = scan.map(Result::unwrap).collect();
            assert_eq!(events, store.read_from(id, from).unwrap(), "from {from}");
        }
        assert_eq!(store.scan_unchecked(id, 0).unwrap().closers(), None);
    }

    #[test]
    fn an_unknown_session_is_refused_before_anything_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = store_with(dir.path(), &realistic_session(1, 20));
        let store = Store::open_read_only(&path).unwrap();
        let stranger = SessionId::new();
        assert!(matches!(
            store.scan(stranger, 0),
            Err(StoreError::UnknownSession { session }) if session == stranger
        ));
    }

    #[test]
    fn a_damaged_block_ends_the_scan_with_its_seqs_after_the_blocks_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let log = realistic_session(8, 200);
        let (path, id) = store_with(dir.path(), &log);
        // Flip a bit in the last record byte of the third block, leaving its digest as it was.
        let (first_seq, block) =
            damage_block(&path, id, 2, |bytes| *bytes.last_mut().unwrap() ^= 0x01);
        let last_seq =
            crate::layout::Block::parse(crate::layout::BlockFormat::V2, id, first_seq, &block)
                .unwrap()
                .last_seq(first_seq);
        let store = Store::open_read_only(&path).unwrap();
        let mut scan = store.scan(id, 0).unwrap();
        let before: Vec<Event> = scan.by_ref().map_while(Result::ok).collect();
        assert_eq!(
            before,
            log[..first_seq as usize],
            "every event before the damage"
        );
        // `map_while` consumed the error; a fresh scan returns it.
        let error = store
            .scan(id, 0)
            .unwrap()
            .find_map(Result::err)
            .expect("the damage is reported");
        match error {
            StoreError::CorruptBlock {
                session,
                first_seq: f,
                last_seq: l,
                ..
            } => assert_eq!((session, f, l), (id, first_seq, last_seq)),
            other => panic!("expected a corrupt block, got {other}"),
        }
        assert!(scan.next().is_none(), "the scan ends after its error");
        assert_eq!(scan.closers(), None);
    }

    /// The closers folded event by event, as a scan computes them.
    fn folded(events: &[Event]) -> Vec<Event> {
        let mut tail = RepairTail::default();
        for event in events {
            tail.observe(event);
        }
        tail.closers(events.last().cloned())
    }

    proptest! {
        /// Folding the repair tail event by event gives the closers of the whole log, for every
        /// prefix of valid logs (so for logs torn at every event).
        #[test]
        fn the_folded_repair_tail_closes_like_the_whole_log(log in arb_valid_log(6)) {
            for cut in 0..=log.len() {
                let prefix = &log[..cut];
                prop_assert_eq!(folded(prefix), interrupted_turn_closers(prefix), "cut {}", cut);
            }
        }
    }
}
