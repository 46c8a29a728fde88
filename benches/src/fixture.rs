//! One workload written to every contender.

use std::path::PathBuf;

use lineage_log::{Encoder, Event, EventKind, Header, SessionId};
use lineage_store::{Store, StoreOptions};
use tempfile::TempDir;

use crate::{jsonl, sqlite};

/// Events per durable batch when fixtures are written.
pub const BATCH: usize = 512;

/// A realistic session of a given size, stored by Lineage, JSON Lines and SQLite, plus its raw
/// records in one file for the limits.
pub struct Fixture {
    /// Holds every file; removed on drop.
    pub dir: TempDir,
    /// The session's id.
    pub session: SessionId,
    /// Its header.
    pub header: Header,
    /// The events.
    pub events: Vec<Event>,
    /// The framed records of every event, back to back.
    pub records: Vec<u8>,
    /// The Lineage store file.
    pub lineage: PathBuf,
    /// The JSON Lines file.
    pub jsonl: PathBuf,
    /// The SQLite database.
    pub sqlite: PathBuf,
    /// The raw records file.
    pub raw: PathBuf,
}

impl Fixture {
    /// Generates a session of about `target_events` events from `seed` and writes it everywhere.
    pub fn build(target_events: usize, seed: u64) -> Fixture {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let events = lineage_testkit::realistic_session(seed, target_events);
        let session =
            SessionId::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0001 + seed as u128);
        let header = Header::new(session, 1_780_000_000_000);
        let mut records = Vec::new();
        Encoder::new().encode_all(&events, &mut records);

        let lineage = dir.path().join("sessions.lineage");
        // Written as a host writes: durable batches of 512 events, each its own commit.
        let store = Store::open_with(&lineage, StoreOptions::default()).expect("open the store");
        store.create(header.clone()).expect("create the session");
        for batch in events.chunks(BATCH) {
            store.append(session, batch).expect("append a batch");
        }
        store.close().expect("close the store");

        let jsonl = dir.path().join("session.jsonl");
        jsonl::write(&jsonl, &header, &events).expect("write JSON Lines");

        let sqlite = dir.path().join("sessions.sqlite");
        let mut conn = sqlite::open(&sqlite).expect("open SQLite");
        let mut offset = 0;
        for batch in events.chunks(BATCH) {
            let mut buf = Vec::new();
            Encoder::new().encode_all(batch, &mut buf);
            sqlite::append(&mut conn, session.as_uuid().as_bytes(), batch[0].seq, &buf)
                .expect("fill SQLite");
            offset += buf.len();
        }
        debug_assert_eq!(offset, records.len());
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
            .expect("checkpoint SQLite");
        drop(conn);

        let raw = dir.path().join("records.bin");
        std::fs::write(&raw, &records).expect("write the raw records");

        Fixture {
            dir,
            session,
            header,
            events,
            records,
            lineage,
            jsonl,
            sqlite,
            raw,
        }
    }

    /// The seq of the last `turn/end`: where a fork at the last completed turn cuts.
    pub fn last_turn_end(&self) -> u64 {
        self.events
            .iter()
            .rev()
            .find(|e| e.kind() == EventKind::TurnEnd)
            .map_or(0, |e| e.seq)
    }
}

/// A file's size in bytes (0 when it does not exist).
pub fn file_size(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}
