//! Helpers shared by the store's integration tests: headers, stores, hand-written and generated
//! logs, digests, and direct access to the redb tables of a closed store file.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use lineage_log::{Chain, Digest, Event, EventBody, Header, SessionId, TurnNo, encode_record};
use lineage_store::{Store, StoreOptions, VerifyReport};
use lineage_testkit::ev;
use redb::backends::InMemoryBackend;
use redb::{ReadableDatabase, ReadableTable, StorageBackend, TableDefinition};
use serde::{Deserialize, Serialize};

/// Creation time of every test header, and the base of every hand-written event time.
pub const T0: u64 = 1_750_000_000_000;

/// The tables of the store layout, by their on-disk names, for tests that read or damage a closed
/// store file directly.
pub const META: TableDefinition<&str, &[u8]> = TableDefinition::new("lineage/meta");
pub const SESSIONS: TableDefinition<u128, &[u8]> = TableDefinition::new("lineage/sessions");
pub const EVENTS: TableDefinition<(u128, u64), &[u8]> = TableDefinition::new("lineage/events");
pub const CHILDREN: TableDefinition<(u128, u128), ()> = TableDefinition::new("lineage/children");

/// Bytes before a block's body: record count (u32 LE) and the running digest at its last record.
pub const BLOCK_HEADER_LEN: usize = 4 + 32;

/// A block value in store format 2 (`schema/FORMAT.md` §4), written here independently of the
/// store: the body packed but neither run-packed nor compressed, each record re-framed with its
/// time as the difference from the previous record's.
pub fn packed_block(count: u32, digest: Digest, records: &[u8]) -> Vec<u8> {
    let mut block = count.to_le_bytes().to_vec();
    block.extend_from_slice(&digest.0);
    block.push(0); // body: packed, stored as is
    let mut previous = 0i64;
    let mut rest = records;
    while !rest.is_empty() {
        let (record, after) = lineage_log::split_record(rest, 0).expect("canonical records");
        let dt = record.time_ms.wrapping_sub(previous);
        previous = record.time_ms;
        let mut body = Vec::new();
        lineage_log::put_varint(&mut body, u64::from(record.tag));
        body.push(record.flags);
        lineage_log::put_varint(&mut body, ((dt << 1) ^ (dt >> 63)) as u64);
        body.extend_from_slice(record.payload);
        lineage_log::put_varint(&mut block, body.len() as u64);
        block.extend_from_slice(&body);
        rest = after;
    }
    block
}

/// A session's row as the store writes it (postcard of these fields in this order), so tests can
/// read and craft rows without the crate's private type.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RawSessionRecord {
    pub header: Header,
    pub next_seq: u64,
    pub head: Digest,
    pub revision: u64,
}

/// The header of a fresh top-level session.
pub fn header(id: SessionId) -> Header {
    Header::new(id, T0).with_cwd("/work/project")
}

/// A new session id and its header.
pub fn fresh() -> (SessionId, Header) {
    let id = SessionId::new();
    (id, header(id))
}

/// A store at [`store_location`] in `dir` holding one session of `log`, closed: its location and
/// the session's header.
pub fn closed_store_with(dir: &Path, log: &[Event]) -> (std::path::PathBuf, Header) {
    let path = store_location(dir);
    let (_, header) = fresh();
    let store = Store::open(&path).unwrap();
    store.import(header.clone(), log).unwrap();
    store.close().unwrap();
    (path, header)
}

/// The engine under the stores the helpers make on this thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// redb, over memory or in a file.
    Redb,
    /// A fresh database of the test process's private PostgreSQL server, per store.
    Postgres,
}

thread_local! {
    static ENGINE: std::cell::Cell<Engine> = const { std::cell::Cell::new(Engine::Redb) };
}

/// The engine the helpers use on this thread.
pub fn engine() -> Engine {
    ENGINE.get()
}

/// Runs `test`, a test of behaviour, with every store the helpers make on PostgreSQL: the same
/// test, unchanged, on the other engine.
pub fn run_on_postgres(test: fn()) {
    ENGINE.set(Engine::Postgres);
    test();
}

/// Declares, in a module `on_postgres`, a second test for each named test of this file that runs
/// it on PostgreSQL ([`run_on_postgres`]).
#[macro_export]
macro_rules! on_postgres_too {
    ($($test:ident),* $(,)?) => {
        mod on_postgres {
            $(
                #[test]
                fn $test() {
                    $crate::common::run_on_postgres(super::$test);
                }
            )*
        }
    };
}

/// Where a new store lives: `dir`'s store file on redb, a fresh database's URL on PostgreSQL.
pub fn store_location(dir: &Path) -> std::path::PathBuf {
    match engine() {
        Engine::Redb => dir.join("sessions.lineage"),
        Engine::Postgres => lineage_testkit::postgres::postgres()
            .create_database()
            .into(),
    }
}

/// A new writable store: over memory on redb, in a fresh database on PostgreSQL.
pub fn mem_store() -> Store {
    mem_store_with(StoreOptions::default())
}

/// A new writable store with `options` (see [`mem_store`]).
pub fn mem_store_with(options: StoreOptions) -> Store {
    match engine() {
        Engine::Redb => Store::with_backend(SharedMemory::default(), options)
            .expect("a store opens over memory"),
        Engine::Postgres => {
            let url = lineage_testkit::postgres::postgres().create_database();
            Store::open_with(&url, options).expect("a store opens in a fresh database")
        }
    }
}

/// Options whose blocks hold at most `events` events (and 4 KiB), so multi-block paths run.
pub fn small_blocks(events: usize) -> StoreOptions {
    StoreOptions {
        block_events: events,
        block_bytes: 4096,
        ..StoreOptions::default()
    }
}

/// Range-lock methods of a `StorageBackend` that grant every lock (see [`SharedMemory`]).
#[macro_export]
macro_rules! granted_locks {
    () => {
        $crate::granted_locks!(try_lock_range -> bool = true);
        $crate::granted_locks!(try_lock_shared_range -> bool = true);
        $crate::granted_locks!(lock_range -> () = ());
        $crate::granted_locks!(lock_shared_range -> () = ());
        $crate::granted_locks!(unlock_range -> () = ());
        $crate::granted_locks!(query_lock_range -> bool = false);
    };
    ($method:ident -> $answer:ty = $value:expr) => {
        fn $method(
            &self,
            _: std::ops::Bound<u64>,
            _: std::ops::Bound<u64>,
        ) -> Result<$answer, redb::BackendError> {
            Ok($value)
        }
    };
}

/// A memory backend that outlives the stores opened over it: closing a store and opening another
/// over a clone is a reopen of the same bytes.
///
/// Its range locks always succeed. The store opens every database in redb's single-writer mode,
/// which needs range locks, and `InMemoryBackend` has none; one test process never opens two
/// databases over the same clone at once, so granting every lock is sound here.
#[derive(Clone, Debug, Default)]
pub struct SharedMemory(Arc<InMemoryBackend>);

impl StorageBackend for SharedMemory {
    fn len(&self) -> Result<u64, redb::BackendError> {
        self.0.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), redb::BackendError> {
        self.0.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), redb::BackendError> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> Result<(), redb::BackendError> {
        self.0.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), redb::BackendError> {
        self.0.write(offset, data)
    }
    granted_locks!();
}

/// `S(n)` at the last of `events`: one running blake3 over their framed records.
pub fn digest_of(events: &[Event]) -> Digest {
    let mut chain = Chain::new();
    for event in events {
        chain.update(&encode_record(event));
    }
    chain.digest()
}

/// The event at `seq` with a time derived from it.
pub fn at(seq: u64, body: EventBody) -> Event {
    Event::new(seq, T0 as i64 + 10 * seq as i64, body)
}

/// `bodies` as consecutive events starting at `first_seq`.
pub fn events_from(first_seq: u64, bodies: Vec<EventBody>) -> Vec<Event> {
    ev::numbered(first_seq, T0 as i64, 10, bodies)
}

/// A message id unique to `(seq, salt)`.
pub fn mid(seq: u64, salt: u64) -> lineage_log::MessageId {
    lineage_log::MessageId::derived(&[b"store-tests", &seq.to_le_bytes(), &salt.to_le_bytes()])
}

/// One completed turn `turn` starting at `first_seq`: turn/start, step/start, the user's `text`,
/// the answer, step/end, turn/end. Six events.
pub fn completed_turn(turn: TurnNo, first_seq: u64, text: &str) -> Vec<Event> {
    let bodies = ev::completed_turn(turn, mid(first_seq, 1), text, mid(first_seq, 2), "done");
    events_from(first_seq, bodies)
}

/// `turns` completed turns numbered from 1, starting at seq 0.
pub fn completed_turns(turns: TurnNo) -> Vec<Event> {
    let mut events = Vec::new();
    for turn in 1..=turns {
        let next = events.len() as u64;
        events.extend(completed_turn(turn, next, &format!("question {turn}")));
    }
    events
}

/// A log whose tail turn was interrupted: turn 1 completed (seqs 0..6), then turn 2 opens a step
/// in which the model asks for calls `c1` and `c2`; `c1` has a `tool/call` and no result, `c2`
/// never started. Its closers are a `TOOL_OUTCOME_UNKNOWN` result for `c1`, a `TOOL_NOT_STARTED`
/// result for `c2`, `step/end` and `turn/end {Interrupted}`.
pub fn open_turn_log() -> Vec<Event> {
    let mut events = completed_turn(1, 0, "first question");
    events.extend(events_from(
        6,
        vec![
            ev::turn_start(2),
            ev::step_start(2, 1),
            ev::user(mid(8, 1), "second question"),
            ev::assistant_calls(2, 1, mid(9, 1), &[("c1", "grep"), ("c2", "read_file")]),
            ev::tool_call(2, 1, "c1", "grep", r#"{"pattern":"x"}"#),
        ],
    ));
    events
}

/// Fails with every problem `verify` found; open tail turns are not problems.
pub fn assert_intact(report: &VerifyReport) {
    let failures: Vec<String> = report
        .failures()
        .map(|s| {
            let problems: Vec<String> = s.problems.iter().map(|p| p.to_string()).collect();
            format!("{}: {}", s.session, problems.join("; "))
        })
        .collect();
    assert!(failures.is_empty(), "verify found problems: {failures:#?}");
}

/// Opens a closed store file with redb directly.
pub fn raw_db(path: &Path) -> redb::Database {
    redb::Database::open(path).expect("the store file opens with redb")
}

/// Rewrites `session`'s row in a closed store file through `change`.
pub fn rewrite_row(path: &Path, session: SessionId, change: impl FnOnce(&mut RawSessionRecord)) {
    let db = raw_db(path);
    let txn = db.begin_write().unwrap();
    {
        let mut sessions = txn.open_table(SESSIONS).unwrap();
        let mut record: RawSessionRecord = {
            let row = sessions.get(session.as_u128()).unwrap().expect("row");
            postcard::from_bytes(row.value()).expect("the row decodes")
        };
        change(&mut record);
        let bytes = postcard::to_stdvec(&record).unwrap();
        sessions
            .insert(session.as_u128(), bytes.as_slice())
            .unwrap();
    }
    txn.commit().unwrap();
}

/// The PostgreSQL URL a location is, if it is one.
fn url_of(location: &Path) -> Option<&str> {
    location.to_str().filter(|l| l.starts_with("postgres://"))
}

/// Everything a closed store holds, to compare before and after: the file's bytes on redb, a
/// dump of the tables on PostgreSQL.
pub fn store_contents(location: &Path) -> Vec<u8> {
    match url_of(location) {
        Some(url) => lineage_testkit::postgres::postgres()
            .psql(
                url,
                "SELECT (SELECT string_agg(name || encode(value, 'hex'), ',' ORDER BY name) FROM lineage_meta) \
                 || (SELECT coalesce(string_agg(id::text || encode(row, 'hex'), ',' ORDER BY id), '') FROM lineage_sessions) \
                 || (SELECT coalesce(string_agg(session::text || first_seq || encode(value, 'hex'), ',' ORDER BY session, first_seq), '') FROM lineage_blocks) \
                 || (SELECT coalesce(string_agg(parent::text || child::text, ',' ORDER BY parent, child), '') FROM lineage_children)",
            )
            .into_bytes(),
        None => std::fs::read(location).expect("the store file reads"),
    }
}

/// The size `stats` reports for the store: its file's, or none for a database.
pub fn file_len(location: &Path) -> Option<u64> {
    match url_of(location) {
        Some(_) => None,
        None => Some(std::fs::metadata(location).expect("the store file").len()),
    }
}

/// How many session rows and event blocks a closed store holds.
pub fn raw_counts(path: &Path) -> (u64, u64) {
    use redb::ReadableTableMetadata;
    if let Some(url) = url_of(path) {
        let count = |table: &str| {
            lineage_testkit::postgres::postgres()
                .psql(url, &format!("SELECT count(*) FROM {table}"))
                .parse()
                .expect("a count")
        };
        return (count("lineage_sessions"), count("lineage_blocks"));
    }
    let db = raw_db(path);
    let txn = db.begin_read().expect("read transaction");
    let sessions = txn.open_table(SESSIONS).map_or(0, |t| t.len().unwrap());
    let blocks = txn.open_table(EVENTS).map_or(0, |t| t.len().unwrap());
    (sessions, blocks)
}

/// Every entry of the three session tables of a closed store, as raw bytes (a file's or a
/// database's).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Dump {
    pub rows: BTreeMap<u128, Vec<u8>>,
    pub blocks: BTreeMap<(u128, u64), Vec<u8>>,
    pub children: Vec<(u128, u128)>,
}

impl Dump {
    pub fn of(path: &Path) -> Dump {
        if let Some(url) = path.to_str().filter(|p| p.starts_with("postgres://")) {
            return Dump::of_database(url);
        }
        let db = raw_db(path);
        let txn = db.begin_read().unwrap();
        let mut dump = Dump::default();
        for entry in txn.open_table(SESSIONS).unwrap().iter().unwrap() {
            let (k, v) = entry.unwrap();
            dump.rows.insert(k.value(), v.value().to_vec());
        }
        for entry in txn.open_table(EVENTS).unwrap().iter().unwrap() {
            let (k, v) = entry.unwrap();
            dump.blocks.insert(k.value(), v.value().to_vec());
        }
        for entry in txn.open_table(CHILDREN).unwrap().iter().unwrap() {
            dump.children.push(entry.unwrap().0.value());
        }
        dump
    }

    /// The same tables of a PostgreSQL store.
    fn of_database(url: &str) -> Dump {
        let server = lineage_testkit::postgres::postgres();
        let id = |s: &str| s.parse::<SessionId>().expect("a session id").as_u128();
        let hex = |s: &str| -> Vec<u8> {
            (0..s.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
                .collect()
        };
        let lines = |sql: &str| -> Vec<Vec<String>> {
            server
                .psql(url, sql)
                .lines()
                .map(|line| line.split('|').map(str::to_owned).collect())
                .collect()
        };
        let mut dump = Dump::default();
        for row in lines("SELECT id, encode(row, 'hex') FROM lineage_sessions") {
            dump.rows.insert(id(&row[0]), hex(&row[1]));
        }
        for row in lines("SELECT session, first_seq, encode(value, 'hex') FROM lineage_blocks") {
            let first_seq = row[1].parse().expect("a seq");
            dump.blocks.insert((id(&row[0]), first_seq), hex(&row[2]));
        }
        for row in lines("SELECT parent, child FROM lineage_children ORDER BY parent, child") {
            dump.children.push((id(&row[0]), id(&row[1])));
        }
        dump
    }

    /// Only what belongs to sessions other than `gone` (index entries naming them either way
    /// included in `gone`'s part).
    pub fn without(&self, gone: &[SessionId]) -> Dump {
        let gone: Vec<u128> = gone.iter().map(|s| s.as_u128()).collect();
        Dump {
            rows: self
                .rows
                .iter()
                .filter(|(k, _)| !gone.contains(k))
                .map(|(k, v)| (*k, v.clone()))
                .collect(),
            blocks: self
                .blocks
                .iter()
                .filter(|((s, _), _)| !gone.contains(s))
                .map(|(k, v)| (*k, v.clone()))
                .collect(),
            children: self
                .children
                .iter()
                .filter(|(p, c)| !gone.contains(p) && !gone.contains(c))
                .copied()
                .collect(),
        }
    }

    pub fn holds_anything_of(&self, session: SessionId) -> bool {
        let id = session.as_u128();
        self.rows.contains_key(&id)
            || self.blocks.keys().any(|(s, _)| *s == id)
            || self.children.iter().any(|(p, c)| *p == id || *c == id)
    }
}
