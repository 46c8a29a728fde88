//! `Store`: the public face of the store.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use lineage_log::{
    Digest, Encoder, Event, EventBody, EventKind, Header, LogError, SessionId, Structure,
    check_append, check_append_before_descriptor_contract, check_seed, interrupted_turn_closers,
};
use uuid::Uuid;

use crate::engine::{Coordination, Engine as StorageEngine, View};
use crate::error::{EngineError, EngineErrorKind};
use crate::layout::{Block, BlockFormat, MAX_RECORD_BYTES, SessionRecord};
use crate::lease::Keeper;
use crate::owners::Owners;
use crate::read::{read_from, read_log, read_record};
use crate::writer::{self, PendingBlock, Queue, Tail};
use crate::{Result, StoreError};

/// The version of the store layout (tables, keys, blocks) this build reads and writes, kept in the
/// `meta` table.
pub const STORE_FORMAT_VERSION: u32 = 2;

/// How long the writer waits, by default, after the first admitted batch before committing, so that
/// batches admitted close together share one commit. A flush skips the wait.
pub const DEFAULT_COMMIT_WINDOW: Duration = Duration::from_millis(200);

/// The default most bytes a stored block takes (packed and compressed): 32 KiB less room for its
/// key and the B-tree leaf around it, so that a full block fills one 32 KiB page. The storage
/// engine gives a value the smallest power-of-two run of pages that holds it, so the writer fills
/// blocks up to this size (see [`StoreOptions::block_bytes`]).
pub const DEFAULT_BLOCK_BYTES: usize = 32 * 1024 - 768;

/// The default most events in one stored block: more than a full block of streamed chunks holds,
/// so that blocks end by size.
pub const DEFAULT_BLOCK_EVENTS: usize = 4096;

/// The default page cache of an open store.
pub const DEFAULT_CACHE_BYTES: usize = 64 * 1024 * 1024;

/// How long a lease on a shared store lasts unless renewed ([`StoreOptions::lease_ttl`]).
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

/// The range of [`StoreOptions::lease_ttl`]: renewals come every third of it, and the database
/// computes expiries from it.
const MIN_LEASE_TTL: Duration = Duration::from_millis(100);
const MAX_LEASE_TTL: Duration = Duration::from_secs(24 * 3600);

/// Tuning of a writable store.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// How long an admitted batch may wait for others before the writer commits it. A flush (and
    /// so an append) commits at once.
    pub commit_window: Duration,
    /// The most events one stored block holds.
    pub block_events: usize,
    /// The most bytes one stored block takes as stored (a single larger record gets a block
    /// alone). The writer fills blocks up to it: a commit too small to fill one writes a small
    /// block, and a later commit rewrites the small blocks into a full one.
    pub block_bytes: usize,
    /// The storage engine's page cache, in bytes. Reads stream through it, so it bounds the
    /// memory a scan of a large session adds on top of the decoded events.
    pub cache_bytes: usize,
    /// How long a session's lease lasts on a shared store (see [`Store::own`]), from 100 ms to a
    /// day; it is renewed every third of that while held. A host that dies is replaced this long
    /// after its last renewal at most.
    pub lease_ttl: Duration,
    /// Whether the hosts of a shared store wake each other when mail is posted or taken
    /// (PostgreSQL's `LISTEN`/`NOTIFY`, about a round trip) instead of finding it by polling
    /// (every 50 ms). On by default; turn it off behind a connection pooler in transaction
    /// mode, which does not carry notifications (a server that refuses `LISTEN` is polled
    /// anyway).
    pub mail_push: bool,
    /// The bounds of every wait on a PostgreSQL server (ignored by a store file).
    pub postgres: PostgresTimeouts,
}

/// How long a store on PostgreSQL waits for its server, at most. A server that does not answer
/// (a black-holed address, a half-open connection after a partition, a stalled server) fails the
/// call that waits with an [`crate::EngineErrorKind::Timeout`] error, which names the operation
/// and the bound, instead of holding the caller.
///
/// So [`Store::open`] of a database whose server does not answer fails within `connect` (the
/// connection and its start-up, authentication included), and once connected each step of the
/// open within `call`; each later call of the store waits `call` at most (a commit that waited
/// that long is in doubt, and the writer reads it back before it commits again). The server
/// enforces `statement`, `lock` and `idle_in_transaction` itself (`statement_timeout`,
/// `lock_timeout`, `idle_in_transaction_session_timeout`, sent at connection start-up unless the
/// URL's `options` set them); `Duration::ZERO` leaves one of these three to the server's own
/// setting. The TCP keepalive finds a connection whose peer is gone within about
/// `keepalive_idle` plus three probes a second apart, also while nothing is asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PostgresTimeouts {
    /// How long making a connection may take, start-up and authentication included (5 s).
    pub connect: Duration,
    /// The server's `statement_timeout`: the longest one statement runs (10 s).
    pub statement: Duration,
    /// The server's `lock_timeout`: the longest a statement waits for a lock (5 s).
    pub lock: Duration,
    /// The server's `idle_in_transaction_session_timeout`: how long the server keeps a
    /// transaction whose client went silent, with its locks (15 s).
    pub idle_in_transaction: Duration,
    /// How long a connection is idle before TCP keepalive probes start (5 s; then a probe a
    /// second, three at most, and sent data unacknowledged as long fails the connection).
    pub keepalive_idle: Duration,
    /// The longest the store waits for one call to the server, the deadline of every engine
    /// call (15 s). A call past it fails, and the connection it used is dropped.
    pub call: Duration,
}

impl Default for PostgresTimeouts {
    fn default() -> Self {
        PostgresTimeouts {
            connect: Duration::from_secs(5),
            statement: Duration::from_secs(10),
            lock: Duration::from_secs(5),
            idle_in_transaction: Duration::from_secs(15),
            keepalive_idle: Duration::from_secs(5),
            call: Duration::from_secs(15),
        }
    }
}

impl PostgresTimeouts {
    /// Refuses bounds that would wait for ever or not at all.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn check(&self) -> Result<()> {
        let positive = [
            ("postgres.connect", self.connect),
            ("postgres.keepalive_idle", self.keepalive_idle),
            ("postgres.call", self.call),
        ];
        for (field, bound) in positive {
            if bound.is_zero() || bound > MAX_LEASE_TTL {
                return Err(StoreError::InvalidOption {
                    field,
                    reason: format!("{bound:?} is outside 1 ns to {MAX_LEASE_TTL:?}"),
                });
            }
        }
        Ok(())
    }
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            commit_window: DEFAULT_COMMIT_WINDOW,
            block_events: DEFAULT_BLOCK_EVENTS,
            block_bytes: DEFAULT_BLOCK_BYTES,
            cache_bytes: DEFAULT_CACHE_BYTES,
            lease_ttl: DEFAULT_LEASE_TTL,
            mail_push: true,
            postgres: PostgresTimeouts::default(),
        }
    }
}

/// A session read back from the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loaded {
    /// The session's header.
    pub header: Header,
    /// Every event, balanced: an interrupted tail turn is closed by crash-repair events.
    pub events: Vec<Event>,
    /// How many of the last events are crash-repair closers (0 for a balanced log).
    pub closers: usize,
}

/// A stored session's header and position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    /// The header.
    pub header: Header,
    /// How many events are stored.
    pub len: u64,
    /// The running digest at the last stored event.
    pub head: Digest,
    /// Incremented once per committed write to the session.
    pub revision: u64,
}

/// Space used, overall and by event kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Stored sessions.
    pub sessions: u64,
    /// Stored events.
    pub events: u64,
    /// Stored blocks.
    pub blocks: u64,
    /// Bytes of framed records.
    pub record_bytes: u64,
    /// Bytes of block values (records plus block headers).
    pub block_bytes: u64,
    /// The store file's size, when the store is a file.
    pub file_bytes: Option<u64>,
    /// Events and record bytes by kind; records whose tag this build does not know count as
    /// `opaque`.
    pub by_kind: BTreeMap<EventKind, KindStats>,
}

/// Events of one kind and their record bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KindStats {
    /// How many.
    pub events: u64,
    /// Their framed record bytes.
    pub bytes: u64,
}

pub(crate) struct Inner {
    pub engine: Arc<dyn StorageEngine>,
    pub coordination: Arc<dyn Coordination>,
    pub path: Option<PathBuf>,
    pub store_id: Uuid,
    /// How the store lays out its blocks: format 2, or format 1 on a store opened read-only
    /// before its upgrade.
    pub format: BlockFormat,
    pub queue: Arc<Queue>,
    pub options: StoreOptions,
    /// Sessions a live writer owns (see the `owners` module).
    pub owners: Owners,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// The thread renewing leases, on a shared store.
    keeper: Mutex<Option<Keeper>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        {
            let mut state = self.queue.lock();
            state.shutdown = true;
            self.queue.wake_writer.notify_one();
        }
        let handle = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(handle) = handle
            && handle.join().is_err()
        {
            tracing::error!(path = ?self.path, "the store's writer thread panicked");
        }
        if let Some(keeper) = self.keeper.lock().unwrap_or_else(|p| p.into_inner()).take() {
            keeper.stop();
            // The last writes are in: the next holder may take over at once.
            let leases: Vec<_> = self.queue.lock().leases.drain().collect();
            for (session, held) in leases.into_iter().filter(|(_, held)| held.lost.is_none()) {
                if let Ok(Err(error)) | Err(error) =
                    contained(|| self.coordination.release_lease(session, held.fence))
                        .map_err(|panic| EngineError::new(EngineErrorKind::Other, panic))
                {
                    tracing::warn!(%session, %error, "releasing the session's lease failed; it expires by itself");
                }
            }
        }
        // Failures after the last flush have no caller left to return to: they are reported here.
        let state = self.queue.lock();
        if state.pending_blocks > 0 {
            let failure = state.last_failure.as_ref().map(|e| e.to_string());
            tracing::error!(
                path = ?self.path,
                blocks = state.pending_blocks,
                failure = failure.as_deref().unwrap_or("none recorded"),
                "the store closed with admitted batches that could not be committed; they are lost"
            );
        }
        drop(state);
        self.engine.release();
    }
}

/// A Lineage session store: one redb file holding many sessions.
///
/// Cheap to clone; every clone shares one writer. Open one writable `Store` per file: another
/// process (or another handle in this one) gets [`StoreError::AlreadyOpen`], while any number of
/// [`Store::open_read_only`] handles may follow its commits.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.inner.path)
            .field("store_id", &self.inner.store_id)
            .field("read_only", &self.is_read_only())
            .finish()
    }
}

impl Store {
    /// Opens the store at `path` for writing, creating it if the file does not exist.
    pub fn open(path: impl AsRef<Path>) -> Result<Store> {
        Self::open_with(path, StoreOptions::default())
    }

    /// Opens the store at `path` for writing, with `options`.
    ///
    /// A store that does not exist is created crash-safely: it is built whole under a temporary
    /// name beside `path` and then linked into place, so a crash or an I/O error leaves either no
    /// file at `path` or a store that opens. (An existing empty file is initialized in place.)
    ///
    /// After a failed commit the storage engine refuses the handle that saw the failure, so the
    /// writer reopens the file before it retries.
    ///
    /// `path` may instead be a `postgres://` (or `postgresql://`) URL: the store is then the
    /// database's Lineage tables, created in a database that has none, shared by every host that
    /// opens it (see [`Store::open_postgres`]).
    pub fn open_with(path: impl AsRef<Path>, options: StoreOptions) -> Result<Store> {
        if let Some(url) = path.as_ref().to_str().filter(|p| crate::engine::is_url(p)) {
            return Self::open_postgres(url, options);
        }
        Self::open_file(path.as_ref(), options)
    }

    /// Opens a writable store in the PostgreSQL database at `url`, creating its tables in a
    /// database that has none. Many hosts may open one database at once: each session's write is
    /// conditional on where its log ends, so of two writers racing on one session one commits and
    /// the other's flush fails with [`StoreError::SeqMismatch`], nothing of its batch written.
    ///
    /// Needs lineage-store's `postgres` feature; without it the URL is refused as
    /// [`StoreError::NotAStore`].
    pub fn open_postgres(url: &str, options: StoreOptions) -> Result<Store> {
        #[cfg(feature = "postgres")]
        {
            guard(|| {
                let (mut engine, store_id, format) =
                    crate::engine::postgres::PgEngine::open(url, false, &options.postgres)?;
                engine.mail_push = options.mail_push;
                writable_format(&crate::engine::display_location(Path::new(url)), format)?;
                let engine = Arc::new(engine);
                Self::start_writer(engine.clone(), engine, None, store_id, options)
            })
        }
        #[cfg(not(feature = "postgres"))]
        {
            let _ = options;
            Err(no_postgres(url))
        }
    }

    /// Opens the store at `path` read-only. Each read sees the writer's latest commit. The file is
    /// never modified. `path` may be a `postgres://` URL, as for [`Store::open_with`].
    ///
    /// A file whose writer stopped without closing it (a killed process) is read as that writer
    /// left it: every commit it made, repaired in memory only, while the file awaits recovery by
    /// its next writer ([`Store::awaits_recovery`]). Once a writer has opened the file, the next
    /// read follows the writer's commits instead.
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Store> {
        if let Some(url) = path.as_ref().to_str().filter(|p| crate::engine::is_url(p)) {
            #[cfg(feature = "postgres")]
            return guard(|| {
                let (engine, store_id, format) = crate::engine::postgres::PgEngine::open(
                    url,
                    true,
                    &PostgresTimeouts::default(),
                )?;
                let engine = Arc::new(engine);
                Ok(Self::reader(engine.clone(), engine, None, store_id, format))
            });
            #[cfg(not(feature = "postgres"))]
            return Err(no_postgres(url));
        }
        Self::open_file_read_only(path.as_ref())
    }

    /// A read-only store over `engine`: no writer thread.
    pub(crate) fn reader(
        engine: Arc<dyn StorageEngine>,
        coordination: Arc<dyn Coordination>,
        path: Option<PathBuf>,
        store_id: Uuid,
        format: BlockFormat,
    ) -> Store {
        Store {
            inner: Arc::new(Inner {
                engine,
                coordination,
                path,
                store_id,
                format,
                queue: Arc::new(Queue::without_writer()),
                options: StoreOptions::default(),
                owners: Owners::default(),
                writer: Mutex::new(None),
                keeper: Mutex::new(None),
            }),
        }
    }

    /// A writable store over `engine`, with its writer thread.
    pub(crate) fn start_writer(
        engine: Arc<dyn StorageEngine>,
        coordination: Arc<dyn Coordination>,
        path: Option<PathBuf>,
        store_id: Uuid,
        options: StoreOptions,
    ) -> Result<Store> {
        if coordination.shared() && !(MIN_LEASE_TTL..=MAX_LEASE_TTL).contains(&options.lease_ttl) {
            return Err(StoreError::InvalidOption {
                field: "lease_ttl",
                reason: format!(
                    "{:?} is outside {MIN_LEASE_TTL:?} to {MAX_LEASE_TTL:?}",
                    options.lease_ttl
                ),
            });
        }
        let queue = Arc::new(Queue::new());
        let handle = {
            let (engine, queue, options) = (engine.clone(), queue.clone(), options.clone());
            std::thread::Builder::new()
                .name("lineage-store-writer".into())
                .spawn(move || writer::run(engine, queue, options))
                .map_err(|e| StoreError::Storage(EngineError::io(e)))?
        };
        let keeper = if coordination.shared() {
            let keeper = Keeper::start(coordination.clone(), queue.clone(), options.lease_ttl)
                .map_err(|e| StoreError::Storage(EngineError::io(e)))?;
            Some(keeper)
        } else {
            None
        };
        Ok(Store {
            inner: Arc::new(Inner {
                engine,
                coordination,
                path,
                store_id,
                format: BlockFormat::V2,
                queue,
                options,
                owners: Owners::default(),
                writer: Mutex::new(Some(handle)),
                keeper: Mutex::new(keeper),
            }),
        })
    }

    /// This handle's id as the holder of leases on a shared store: each open store is a holder
    /// of its own (nil on an embedded file, which needs no leases).
    pub fn holder(&self) -> Uuid {
        self.inner.coordination.holder()
    }

    /// The file the store lives in, if it is a file.
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// The store's id, minted when it was created.
    pub fn store_id(&self) -> Uuid {
        self.inner.store_id
    }

    /// Whether the store was opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.inner.engine.read_only()
    }

    /// Whether the file awaits recovery by its next writer: its last writer stopped without
    /// closing it, and no writer has opened it since. Only a read-only handle can say so (a
    /// writable one recovered the file when it opened it); it then reads the file as the stopped
    /// writer left it, every commit included, without modifying it.
    pub fn awaits_recovery(&self) -> bool {
        self.inner.engine.awaits_recovery()
    }

    /// A consistent read view of the latest commit.
    pub(crate) fn view(&self) -> Result<Box<dyn View>> {
        self.inner.engine.view()
    }

    pub(crate) fn writable(&self) -> Result<()> {
        if self.is_read_only() {
            Err(StoreError::ReadOnly)
        } else {
            Ok(())
        }
    }

    /// Registers a new session. Nothing is written until its first append, which writes the
    /// header and the batch in one transaction; until then the session is not listed.
    ///
    /// The events appended later must agree with the header (a `session/lineage` must state its
    /// parent, seed and depth); [`Store::import`] checks the whole log against it at once.
    pub fn create(&self, header: Header) -> Result<()> {
        self.writable()?;
        let session = header.id;
        header
            .validate()
            .map_err(|e| StoreError::from_log(session, e))?;
        self.ensure_new(session)?;
        let mut state = self.inner.queue.lock();
        let state = &mut *state;
        match state.tails.entry(session) {
            std::collections::hash_map::Entry::Occupied(_) => {
                Err(StoreError::SessionExists { session })
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                // A new session may take the id of one this handle deleted.
                state.deleted.remove(&session);
                slot.insert(Tail {
                    header,
                    row_written: false,
                    revision: 0,
                    next_seq: 0,
                    structure: Structure::new(),
                    chain: lineage_log::Chain::new(),
                    pending: Vec::new(),
                    last_ticket: 0,
                    verbatim: false,
                });
                Ok(())
            }
        }
    }

    /// Refuses an id that is already created or stored.
    pub(crate) fn ensure_new(&self, session: SessionId) -> Result<()> {
        if self.inner.queue.lock().tails.contains_key(&session) {
            return Err(StoreError::SessionExists { session });
        }
        match guard(|| read_record(&*self.view()?, session)) {
            Err(StoreError::UnknownSession { .. }) => Ok(()),
            Err(e) => Err(e),
            Ok(_) => Err(StoreError::SessionExists { session }),
        }
    }

    /// Forgets a session that was created (see [`Store::create`]) but never written, so that its id
    /// is free again: nothing of it is durable, so nothing is removed from the store. Returns
    /// whether it was forgotten.
    ///
    /// A session is kept (and `false` returned) once any batch of it has been admitted, durable or
    /// not, or once a fork has taken it as its parent (the child names it); so is an id this
    /// handle does not know or that is stored. A read-only handle has nothing to forget.
    pub fn forget_unwritten(&self, session: SessionId) -> bool {
        let mut state = self.inner.queue.lock();
        let unwritten = state
            .tails
            .get(&session)
            .is_some_and(|tail| !tail.row_written && tail.next_seq == 0 && tail.pending.is_empty());
        if !unwritten
            || state
                .tails
                .values()
                .any(|tail| tail.header.parent == Some(session))
        {
            return false;
        }
        state.tails.remove(&session);
        true
    }

    /// Creates a session holding `events`, which must satisfy the seed contract, durably and in
    /// one transaction. The header must agree with them: it names the parent, seed length, seed
    /// digest and delegation depth the log's own `session/lineage` states (none without one), and
    /// a subagent origin only with a `subagent/descriptor` in the own suffix; otherwise nothing is
    /// written and [`StoreError::HeaderContradictsLog`] names the field.
    pub fn import(&self, header: Header, events: &[Event]) -> Result<()> {
        let session = header.id;
        check_seed(events).map_err(|e| StoreError::from_log(session, e))?;
        check_header_against_log(&header, events)?;
        self.create(header)?;
        self.append(session, events)
    }

    /// Appends `events` durably: admits them, then flushes the session.
    ///
    /// If the commit fails the batch stays admitted, in order, and the error is returned; the next
    /// flush retries it.
    pub fn append(&self, session: SessionId, events: &[Event]) -> Result<()> {
        self.admit(session, events)?;
        self.flush(session)
    }

    /// Admits `events` for the next group commit without waiting for it. The batch must continue
    /// at the session's next seq, contiguously, and keep the log's rules; otherwise it is refused
    /// whole and nothing changes. An empty batch is a no-op.
    pub fn admit(&self, session: SessionId, events: &[Event]) -> Result<()> {
        self.admit_with(session, events, check_append)
    }

    /// [`Store::append`] as a build before the descriptor contract ran it: a
    /// `subagent/descriptor` of any version and shape is written. It exists so tests can make the
    /// stores such builds left behind; it is not part of the stable API.
    #[doc(hidden)]
    pub fn append_before_descriptor_contract(
        &self,
        session: SessionId,
        events: &[Event],
    ) -> Result<()> {
        self.admit_with(session, events, check_append_before_descriptor_contract)?;
        self.flush(session)
    }

    fn admit_with(
        &self,
        session: SessionId,
        events: &[Event],
        check: fn(&Structure, &[Event]) -> std::result::Result<Structure, LogError>,
    ) -> Result<()> {
        self.writable()?;
        if events.is_empty() {
            return Ok(());
        }
        let queue = &self.inner.queue;
        // Refused before anything is read: a lease that lapsed may mean a silent database.
        if let Some(refusal) = queue
            .lock()
            .leases
            .get(&session)
            .and_then(|h| h.refusal(session))
        {
            return Err(refusal);
        }
        self.ensure_tail(session)?;
        // Validate against a snapshot of the tail outside the lock (in order: each event's seq,
        // shape and place, so the first offending event is the one named), then encode, which
        // walks only values already known to be well formed. If another admission to the same
        // session won the race meanwhile, validate again.
        loop {
            let before = {
                let state = queue.lock();
                // A session whose lease this store lost is another host's now.
                if let Some(refusal) = state.leases.get(&session).and_then(|h| h.refusal(session)) {
                    return Err(refusal);
                }
                let tail = state
                    .tails
                    .get(&session)
                    .ok_or(StoreError::UnknownSession { session })?;
                tail.structure.clone()
            };
            let after = check(&before, events).map_err(|e| StoreError::from_log(session, e))?;
            let mut records = Vec::with_capacity(events.len() * 48);
            let mut encoder = Encoder::new();
            for event in events {
                let before = records.len();
                encoder.encode(event, &mut records);
                let bytes = records.len() - before;
                if bytes > MAX_RECORD_BYTES {
                    return Err(StoreError::RecordTooLarge {
                        session,
                        seq: event.seq,
                        bytes,
                        limit: MAX_RECORD_BYTES,
                    });
                }
            }
            let mut state = queue.lock();
            let tail = state
                .tails
                .get_mut(&session)
                .ok_or(StoreError::UnknownSession { session })?;
            if tail.structure != before {
                continue;
            }
            let origin =
                header_facts(&tail.header, events).map_err(|e| StoreError::from_log(session, e))?;
            let blocks = vec![pending_block(tail, records, events.len())];
            tail.structure = after;
            tail.header.origin = origin;
            queue.enqueue(&mut state, session, blocks);
            return Ok(());
        }
    }

    /// Waits until everything admitted for `session` before this call is durable. After a failed
    /// commit it retries the queued batches and reports a repeated failure.
    ///
    /// A session this handle deleted is [`StoreError::UnknownSession`]: what was admitted to it
    /// and not yet durable was discarded with it.
    ///
    /// On a store other hosts write too (PostgreSQL), a commit refuses a session's batches when
    /// another writer extended the session first: the flush reports [`StoreError::SeqMismatch`]
    /// (`expected` the stored end, `got` where the batches began), nothing of them is written,
    /// and they are dropped with everything admitted to the session since; the next append reads
    /// the session from the store again. The other sessions of that commit are durable.
    pub fn flush(&self, session: SessionId) -> Result<()> {
        let state = self.inner.queue.lock();
        if state.deleted.contains(&session) && !state.tails.contains_key(&session) {
            return Err(StoreError::UnknownSession { session });
        }
        // A session whose tail a refused commit dropped answers with the refusal.
        let target = match state.tails.get(&session) {
            Some(tail) => tail.last_ticket,
            None => state.refused.get(&session).map_or(0, |r| r.upto),
        };
        self.inner.queue.wait_durable(state, Some(session), target)
    }

    /// The seq the next event admitted to `session` must carry, as this store's writer knows it:
    /// what is stored plus what was admitted and is not yet durable. `None` when the writer keeps
    /// no tail for the session (nothing of it is waiting; after a commit refused the session's
    /// write, what was admitted to it is dropped with its tail): the next admission reads it
    /// from the store. A live writer compares it with its own log to learn whether the store
    /// still holds everything it admitted.
    pub fn admitted_next_seq(&self, session: SessionId) -> Option<u64> {
        self.inner
            .queue
            .lock()
            .tails
            .get(&session)
            .map(|tail| tail.next_seq)
    }

    /// Flushes what was admitted to `session` before reading it. A batch a commit refused (another
    /// writer of a shared store got there first) is not this read's error: the batch's own flushes
    /// report it, and the read sees what the store holds.
    pub(crate) fn flush_before_read(&self, session: SessionId) -> Result<()> {
        let state = self.inner.queue.lock();
        let Some(target) = state.tails.get(&session).map(|tail| tail.last_ticket) else {
            // Nothing admitted to it is waiting (a refused batch went with its tail).
            return Ok(());
        };
        let result = self.inner.queue.wait_durable(state, Some(session), target);
        let refused = self
            .inner
            .queue
            .lock()
            .refused
            .get(&session)
            .is_some_and(|r| target > 0 && r.upto >= target);
        if refused { Ok(()) } else { result }
    }

    /// Waits until everything admitted to any session before this call is durable.
    pub fn flush_all(&self) -> Result<()> {
        let state = self.inner.queue.lock();
        let target = state.next_ticket;
        self.inner.queue.wait_durable(state, None, target)
    }

    /// Flushes everything and closes this handle (the writer stops when the last clone is gone).
    pub fn close(self) -> Result<()> {
        if self.is_read_only() {
            Ok(())
        } else {
            self.flush_all()
        }
    }

    /// Makes sure the writer knows `session`'s tail, reading it from the store if needed.
    pub(crate) fn ensure_tail(&self, session: SessionId) -> Result<()> {
        guard(|| {
            if self.inner.queue.lock().tails.contains_key(&session) {
                return Ok(());
            }
            let stored = read_log(&*self.view()?, self.inner.format, session)?;
            self.remember(session, stored.record, stored.chain, stored.structure);
            Ok(())
        })
    }

    /// Caches a committed session's tail for the writer, unless it already has a newer one, or
    /// the session was deleted since it was read (an append to it then finds no tail).
    fn remember(
        &self,
        session: SessionId,
        record: SessionRecord,
        chain: lineage_log::Chain,
        structure: Structure,
    ) {
        let mut state = self.inner.queue.lock();
        if state.deleted.contains(&session) {
            return;
        }
        state.tails.entry(session).or_insert(Tail {
            header: record.header,
            row_written: true,
            revision: record.revision,
            next_seq: record.next_seq,
            structure,
            chain,
            pending: Vec::new(),
            last_ticket: 0,
            verbatim: false,
        });
    }

    /// Loads a session, balanced. If its tail turn was interrupted (the process stopped mid-turn),
    /// the crash-repair closers are appended durably before it is returned. Admitted events are
    /// flushed first. Every block's digest is checked.
    ///
    /// On a shared store a repair is written only under the session's lease: one is taken for it
    /// and released after, and the load is refused ([`StoreError::HeldElsewhere`]) while another
    /// host holds it. A session that needs no repair is read without one.
    pub fn load(&self, session: SessionId) -> Result<Loaded> {
        self.writable()?;
        if self.is_owned(session) {
            self.check_owned_load(session)?;
        } else if self.inner.coordination.shared() {
            self.flush_before_read(session)?;
            let loaded = self.inspect(session)?;
            if loaded.closers == 0 {
                return Ok(loaded);
            }
            let (_owner, loaded) = self.own_and_load(session)?;
            return Ok(loaded);
        }
        self.load_repairing(session)
    }

    /// [`Store::load`]'s reading and repair, with ownership already settled.
    pub(crate) fn load_repairing(&self, session: SessionId) -> Result<Loaded> {
        guard(|| {
            self.flush_before_read(session)?;
            let stored = read_log(&*self.view()?, self.inner.format, session)?;
            let closers = interrupted_turn_closers(&stored.events);
            let header = stored.record.header.clone();
            let mut events = stored.events;
            self.remember(session, stored.record, stored.chain, stored.structure);
            if !closers.is_empty() {
                self.append(session, &closers)?;
            }
            let count = closers.len();
            events.extend(closers);
            Ok(Loaded {
                header,
                events,
                closers: count,
            })
        })
    }

    /// Reads a session's committed events, balanced with crash-repair closers in memory only: the
    /// store is not touched. Works on read-only stores.
    pub fn inspect(&self, session: SessionId) -> Result<Loaded> {
        guard(|| {
            let stored = read_log(&*self.view()?, self.inner.format, session)?;
            let closers = interrupted_turn_closers(&stored.events);
            let count = closers.len();
            let mut events = stored.events;
            events.extend(closers);
            Ok(Loaded {
                header: stored.record.header,
                events,
                closers: count,
            })
        })
    }

    /// The committed events with `seq >= from` (empty when `from` is past the end). No repair.
    pub fn read_from(&self, session: SessionId, from: u64) -> Result<Vec<Event>> {
        guard(|| read_from(&*self.view()?, self.inner.format, session, from))
    }

    /// A stored session's header and position.
    pub fn info(&self, session: SessionId) -> Result<SessionInfo> {
        guard(|| {
            let record = read_record(&*self.view()?, session)?;
            Ok(info_of(record))
        })
    }

    /// The bytes a stored session's blocks take (record bytes plus each block's small header).
    /// One range scan over the session's blocks, without decoding them.
    pub fn session_bytes(&self, session: SessionId) -> Result<u64> {
        guard(|| {
            let mut bytes = 0u64;
            for block in self.view()?.blocks(session, 0)? {
                bytes += block?.1.len() as u64;
            }
            Ok(bytes)
        })
    }

    /// Every stored session, in id order (which is creation order for UUIDv7 ids). A damaged
    /// row fails the whole list; [`Store::list_each`] lists the others.
    pub fn list(&self) -> Result<Vec<SessionInfo>> {
        self.list_each()?.into_iter().collect()
    }

    /// Every stored session, in id order, each row decoded on its own: a row that does not
    /// decode is that session's [`StoreError::CorruptHeader`], and the others are still listed.
    /// The outer error is a failure to read the rows at all.
    pub fn list_each(&self) -> Result<Vec<Result<SessionInfo>>> {
        guard(|| {
            let rows = self.view()?.rows()?;
            Ok(rows
                .into_iter()
                .map(|(session, row)| Ok(info_of(SessionRecord::decode(session, &row)?)))
                .collect())
        })
    }

    /// The children of `parent` (sessions whose header names it), in id order, from the children
    /// index without scanning sessions.
    pub fn children(&self, parent: SessionId) -> Result<Vec<SessionId>> {
        guard(|| self.view()?.children(parent))
    }

    /// Every descendant of `root`, breadth first, in one read view.
    pub fn descendants(&self, root: SessionId) -> Result<Vec<SessionId>> {
        guard(|| self.view()?.descendants(root))
    }

    /// Space used, overall and by event kind.
    pub fn stats(&self) -> Result<StoreStats> {
        guard(|| {
            let view = self.view()?;
            let rows = view.rows()?;
            let mut stats = StoreStats {
                sessions: rows.len() as u64,
                file_bytes: self
                    .inner
                    .path
                    .as_ref()
                    .and_then(|p| std::fs::metadata(p).ok())
                    .map(|m| m.len()),
                ..StoreStats::default()
            };
            for (session, _) in rows {
                for block in view.blocks(session, 0)? {
                    let (first_seq, bytes) = block?;
                    let block = Block::parse(self.inner.format, session, first_seq, &bytes)?;
                    stats.blocks += 1;
                    stats.block_bytes += bytes.len() as u64;
                    for item in lineage_log::Records::new(&block.records, first_seq) {
                        let (_, raw) = item.map_err(|e| StoreError::from_log(session, e))?;
                        let kind = raw.kind().unwrap_or(EventKind::Opaque);
                        let slot = stats.by_kind.entry(kind).or_default();
                        slot.events += 1;
                        slot.bytes += raw.bytes.len() as u64;
                        stats.events += 1;
                        stats.record_bytes += raw.bytes.len() as u64;
                    }
                }
            }
            Ok(stats)
        })
    }
}

/// The refusal of a PostgreSQL URL by a build without the PostgreSQL engine.
#[cfg(not(feature = "postgres"))]
pub(crate) fn no_postgres(url: &str) -> StoreError {
    StoreError::NotAStore {
        path: crate::engine::redact(url).into(),
        reason: "a PostgreSQL URL, and this build has no PostgreSQL engine (lineage-store's \
                 `postgres` feature)"
            .into(),
    }
}

/// Runs a storage operation, turning a panic inside the storage engine into an error.
///
/// The engine trusts its own file: some damage to a page's structure makes it panic rather than
/// return an error. Such a panic is contained here and reported as [`StoreError::Damaged`], so no
/// input file can take the host process down.
///
/// A lock the engine poisoned in an earlier panic makes it refuse the handle from then on; that is
/// the same damage, reported the same way.
pub(crate) fn guard<T>(operation: impl FnOnce() -> Result<T>) -> Result<T> {
    match contained(operation) {
        Ok(Err(StoreError::Storage(engine))) if engine.kind() == EngineErrorKind::Poisoned => {
            let at = engine
                .poisoned_at()
                .map_or(String::new(), |at| format!(" (a lock poisoned at {at})"));
            Err(StoreError::Damaged {
                reason: format!("the storage engine failed on this file earlier{at}"),
            })
        }
        Ok(result) => result,
        Err(reason) => Err(StoreError::Damaged { reason }),
    }
}

/// Runs `operation`, returning the message of a panic inside it instead of unwinding.
pub(crate) fn contained<T>(operation: impl FnOnce() -> T) -> std::result::Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(operation)).map_err(|panic| {
        panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "the storage engine panicked".to_owned())
    })
}

/// Keeps the header a cache of the log: the session's own `session/lineage` (at or after the
/// header's `seed_len`) must say what the header says, a header naming a parent must find its
/// `session/lineage` at `seed_len`, and a `subagent/descriptor` in the own suffix makes the
/// session's origin `Subagent`. Returns the origin after `events`.
fn header_facts(
    header: &Header,
    events: &[Event],
) -> Result<Option<lineage_log::Origin>, LogError> {
    let mut origin = header.origin;
    for event in events {
        match &event.body {
            // Lineage events before `seed_len` are ancestors', inherited with the prefix.
            EventBody::SessionLineage(l)
                if event.seq >= header.seed_len
                    && (header.parent != Some(l.parent)
                        || header.seed_len != l.seed_len
                        || header.seed_digest != Some(l.seed_digest)
                        || header.delegation_depth != l.delegation_depth) =>
            {
                return Err(LogError::InvalidEvent {
                    seq: event.seq,
                    kind: event.kind(),
                    reason: "session/lineage disagrees with the session's header (parent, seed \
                             length, seed digest or delegation depth)"
                        .into(),
                });
            }
            EventBody::SubagentDescriptor(_) if event.seq >= header.seed_len => {
                origin = Some(lineage_log::Origin::Subagent);
            }
            // A header that names a parent says where the session's own `session/lineage` sits.
            EventBody::SessionLineage(_) => {}
            _ if header.parent.is_some() && event.seq == header.seed_len => {
                return Err(LogError::InvalidEvent {
                    seq: event.seq,
                    kind: event.kind(),
                    reason: format!(
                        "the session's header names parent {} with seed length {}, so the event \
                         at seq {} must be its session/lineage",
                        header.parent.unwrap_or_default(),
                        header.seed_len,
                        event.seq
                    ),
                });
            }
            _ => {}
        }
    }
    Ok(origin)
}

/// Refuses a header that contradicts the log it is created with: its parent, seed length, seed
/// digest and delegation depth are what the log's own `session/lineage` states (none without one),
/// and a subagent origin needs a `subagent/descriptor` in the own suffix.
fn check_header_against_log(header: &Header, events: &[Event]) -> Result<()> {
    let facts = lineage_log::fold_header(header, events);
    let session = header.id;
    let refuse = |field: &'static str, header_says: String, log_says: String| {
        Err(StoreError::HeaderContradictsLog {
            session,
            field,
            header_says,
            log_says,
        })
    };
    let shown = |v: Option<String>| v.unwrap_or_else(|| "none".to_owned());
    if header.parent != facts.parent {
        return refuse(
            "parent",
            shown(header.parent.map(|p| p.to_string())),
            shown(facts.parent.map(|p| p.to_string())),
        );
    }
    if header.seed_len != facts.seed_len {
        return refuse(
            "seed_len",
            header.seed_len.to_string(),
            facts.seed_len.to_string(),
        );
    }
    if header.seed_digest != facts.seed_digest {
        return refuse(
            "seed_digest",
            shown(header.seed_digest.map(|d| d.to_string())),
            shown(facts.seed_digest.map(|d| d.to_string())),
        );
    }
    if header.delegation_depth != facts.delegation_depth {
        return refuse(
            "delegation_depth",
            header.delegation_depth.to_string(),
            facts.delegation_depth.to_string(),
        );
    }
    if header.origin == Some(lineage_log::Origin::Subagent) && facts.origin.is_none() {
        return refuse(
            "origin",
            "subagent".to_owned(),
            "no subagent/descriptor in the session's own events".to_owned(),
        );
    }
    Ok(())
}

fn info_of(record: SessionRecord) -> SessionInfo {
    SessionInfo {
        header: record.header,
        len: record.next_seq,
        head: record.head,
        revision: record.revision,
    }
}

/// Queues a validated batch's records as one pending block, advancing the tail's seq and digest.
/// (The writer cuts what it commits into stored blocks.)
pub(crate) fn pending_block(tail: &mut Tail, records: Vec<u8>, count: usize) -> PendingBlock {
    let start = tail.chain.clone();
    tail.chain.update(&records);
    let block = PendingBlock {
        first_seq: tail.next_seq,
        count: count as u32,
        records,
        digest: tail.chain.digest(),
        start,
        ticket: 0,
    };
    tail.next_seq += count as u64;
    block
}

/// The block format of store layout version `version`, refusing one this build does not read,
/// naming the store `shown`.
pub(crate) fn check_store_version(shown: &str, version: u32) -> Result<BlockFormat> {
    let what = format!("store {shown}");
    let supported = STORE_FORMAT_VERSION;
    if let Some(format) = BlockFormat::of_version(version) {
        return Ok(format);
    }
    if version > supported {
        Err(StoreError::NewerFormat {
            what,
            found: version,
            supported,
        })
    } else {
        Err(StoreError::OlderFormat {
            what,
            found: version,
            supported,
        })
    }
}

/// Refuses to write to a store of an older layout: it opens read-only until it is upgraded.
pub(crate) fn writable_format(shown: &str, format: BlockFormat) -> Result<()> {
    match format {
        BlockFormat::V2 => Ok(()),
        BlockFormat::V1 => Err(StoreError::UpgradeRequired {
            store: shown.to_owned(),
            found: 1,
        }),
    }
}
