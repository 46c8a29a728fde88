//! Failed group commits: a storage backend whose writes or syncs fail on demand. A failed commit
//! is reported by the append that waited for it and by every later flush, keeps its batches queued
//! in order ahead of newer ones, and commits them once storage works again.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::*;
use lineage_log::{Event, SessionId};
use lineage_store::{Store, StoreError, StoreOptions};
use redb::StorageBackend;
use redb::backends::InMemoryBackend;

/// Which backend operation the switch breaks.
#[derive(Clone, Copy, Debug)]
enum Breaks {
    Sync,
    Write,
    /// Every read, write and sync: even reopening the storage fails.
    Everything,
}

/// Memory storage whose `sync_data` or `write` fails with an I/O error while the switch is on.
#[derive(Debug, Clone)]
struct Flaky {
    memory: Arc<InMemoryBackend>,
    failing: Arc<AtomicBool>,
    breaks: Breaks,
}

impl Flaky {
    fn new(breaks: Breaks) -> (Flaky, Arc<AtomicBool>) {
        let failing = Arc::new(AtomicBool::new(false));
        let backend = Flaky {
            memory: Arc::new(InMemoryBackend::new()),
            failing: failing.clone(),
            breaks,
        };
        (backend, failing)
    }

    fn fail(&self, what: &str) -> std::io::Result<()> {
        if self.failing.load(Ordering::SeqCst) {
            Err(std::io::Error::other(format!("injected {what} failure")))
        } else {
            Ok(())
        }
    }
}

impl StorageBackend for Flaky {
    fn len(&self) -> Result<u64, redb::BackendError> {
        self.memory.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), redb::BackendError> {
        if let Breaks::Everything = self.breaks {
            self.fail("read")?;
        }
        self.memory.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), redb::BackendError> {
        self.memory.set_len(len)
    }
    fn sync_data(&self) -> Result<(), redb::BackendError> {
        if let Breaks::Sync | Breaks::Everything = self.breaks {
            self.fail("sync")?;
        }
        self.memory.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), redb::BackendError> {
        if let Breaks::Write | Breaks::Everything = self.breaks {
            self.fail("write")?;
        }
        self.memory.write(offset, data)
    }
    // Single-writer mode needs range locks; one database at a time is opened over this storage.
    granted_locks!();
}

/// A store over `backend`'s memory that the writer may reopen after a failed commit, as it
/// reopens a file.
fn open_over(backend: &Flaky) -> Store {
    let backend = backend.clone();
    Store::with_backend_factory(move || backend.clone(), StoreOptions::default())
        .expect("the store opens")
}

fn flaky_store(breaks: Breaks) -> (Store, Arc<AtomicBool>, Flaky) {
    let (backend, failing) = Flaky::new(breaks);
    let store = open_over(&backend);
    (store, failing, backend)
}

/// Closes `store` and opens another over the same memory with storage working: a restart.
fn restart(store: Store, failing: &AtomicBool, backend: &Flaky) -> Store {
    drop(store);
    failing.store(false, Ordering::SeqCst);
    open_over(backend)
}

fn assert_commit_failed<T: std::fmt::Debug>(result: Result<T, StoreError>, what: &str) {
    match result {
        Err(StoreError::CommitFailed { .. }) => {}
        other => panic!("{what}: expected CommitFailed, got {other:?}"),
    }
}

/// A store holding one committed turn of `id`, with the switch still off.
fn store_with_a_committed_turn(breaks: Breaks) -> (Store, Arc<AtomicBool>, Flaky, SessionId) {
    let (store, failing, backend) = flaky_store(breaks);
    let (id, header) = fresh();
    store
        .import(header, &completed_turn(1, 0, "committed"))
        .unwrap();
    (store, failing, backend, id)
}

#[test]
fn a_failed_commit_is_reported_by_the_append_and_by_every_later_flush() {
    for breaks in [Breaks::Sync, Breaks::Write] {
        let (store, failing, backend, id) = store_with_a_committed_turn(breaks);
        let before = store.info(id).unwrap();
        failing.store(true, Ordering::SeqCst);
        assert_commit_failed(
            store.append(id, &completed_turn(2, 6, "lost?")),
            &format!("{breaks:?}: append"),
        );
        for attempt in 0..3 {
            assert_commit_failed(store.flush(id), &format!("{breaks:?}: flush {attempt}"));
            assert_commit_failed(
                store.flush_all(),
                &format!("{breaks:?}: flush_all {attempt}"),
            );
        }
        // Nothing of the failed batch reached storage: after a restart the committed turn is all.
        let store = restart(store, &failing, &backend);
        assert_eq!(store.info(id).unwrap(), before, "{breaks:?}");
        assert_eq!(
            store.read_from(id, 0).unwrap(),
            completed_turn(1, 0, "committed")
        );
        assert_intact(&store.verify().unwrap());
    }
}

#[test]
fn batches_admitted_after_a_failed_commit_queue_behind_it_in_order() {
    for breaks in [Breaks::Sync, Breaks::Write] {
        let (store, failing, backend, id) = store_with_a_committed_turn(breaks);
        failing.store(true, Ordering::SeqCst);
        let second = completed_turn(2, 6, "second");
        assert_commit_failed(store.append(id, &second), &format!("{breaks:?}"));
        // The failed batch still holds seqs 6..12: re-sending it is a seq mismatch, and the batch
        // after it is admitted at 12.
        match store.admit(id, &second) {
            Err(StoreError::SeqMismatch {
                expected: 12,
                got: 6,
                ..
            }) => {}
            other => panic!("{breaks:?}: expected SeqMismatch 12/6, got {other:?}"),
        }
        store.admit(id, &completed_turn(3, 12, "third")).unwrap();
        assert_commit_failed(store.flush(id), &format!("{breaks:?}: flush"));
        let store = restart(store, &failing, &backend);
        assert_eq!(
            store.info(id).unwrap().len,
            6,
            "{breaks:?}: nothing committed"
        );
    }
}

#[test]
fn once_storage_recovers_a_flush_commits_every_queued_batch_in_order() {
    for breaks in [Breaks::Sync, Breaks::Write] {
        let (store, failing, _backend, id) = store_with_a_committed_turn(breaks);
        let (new, new_header) = fresh();
        store.create(new_header.clone()).unwrap();
        failing.store(true, Ordering::SeqCst);
        let second = completed_turn(2, 6, "second");
        let third = completed_turn(3, 12, "third");
        assert_commit_failed(store.append(id, &second), &format!("{breaks:?}: append"));
        store.admit(id, &third).unwrap();
        store.admit(new, &completed_turn(1, 0, "new")).unwrap();
        assert_commit_failed(
            store.flush_all(),
            &format!("{breaks:?}: retry while failing"),
        );

        failing.store(false, Ordering::SeqCst);
        store
            .flush_all()
            .unwrap_or_else(|e| panic!("{breaks:?}: the flush after recovery failed: {e}"));
        let mut expected: Vec<Event> = completed_turn(1, 0, "committed");
        expected.extend(second);
        expected.extend(third);
        let loaded = store.load(id).unwrap();
        assert_eq!(
            loaded.events, expected,
            "{breaks:?}: both batches, in order"
        );
        let info = store.info(id).unwrap();
        assert_eq!(info.head, digest_of(&expected));
        assert_eq!(
            info.revision, 2,
            "{breaks:?}: the retried batches are one commit"
        );
        // The session first written by the retried commit got its header with it.
        let listed = store.info(new).unwrap();
        assert_eq!(listed.header, new_header);
        assert_eq!(listed.len, 6);
        assert_intact(&store.verify().unwrap());
    }
}

#[test]
fn while_storage_keeps_failing_every_error_names_the_io_error() {
    let (store, failing, _backend, id) = store_with_a_committed_turn(Breaks::Everything);
    failing.store(true, Ordering::SeqCst);
    let second = completed_turn(2, 6, "second");
    let error = store.append(id, &second).unwrap_err();
    assert!(
        matches!(error, StoreError::CommitFailed { .. }) && error.to_string().contains("injected"),
        "the append names the I/O error: {error}"
    );
    // The failed handle was dropped and reopening the storage fails too: nothing says only that
    // the store is closed.
    for attempt in 0..3 {
        let error = store.flush_all().unwrap_err();
        assert!(
            matches!(error, StoreError::CommitFailed { .. })
                && error.to_string().contains("injected read failure"),
            "flush {attempt} names why the file cannot be reopened: {error}"
        );
        match store.info(id) {
            Err(StoreError::Unavailable { reason }) => {
                assert!(
                    reason.contains("injected read failure"),
                    "read {attempt}: {reason}"
                )
            }
            other => panic!("read {attempt}: expected Unavailable, got {other:?}"),
        }
    }
    failing.store(false, Ordering::SeqCst);
    store
        .flush_all()
        .unwrap_or_else(|e| panic!("the flush after recovery failed: {e}"));
    let mut expected = completed_turn(1, 0, "committed");
    expected.extend(second);
    assert_eq!(store.load(id).unwrap().events, expected);
    assert_intact(&store.verify().unwrap());
}

/// Which operation a [`Countdown`] fault hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Write,
    Sync,
    SetLen,
    /// A write that stores the first half of its bytes, then fails.
    Torn,
}

/// Memory storage whose `at`-th operation of one kind (counted from arming) fails: once, or
/// from then on while `sticky`, until the fault is cleared. The memory is shared by every clone,
/// so a reopened handle sees what the failed one wrote.
#[derive(Debug, Clone)]
struct Countdown {
    memory: Arc<InMemoryBackend>,
    fault: Arc<std::sync::Mutex<Option<Fault>>>,
    injected: Arc<std::sync::atomic::AtomicU64>,
}

#[derive(Debug)]
struct Fault {
    op: Op,
    /// Operations of the kind still to pass before one fails.
    left: u64,
    sticky: bool,
    fired: bool,
}

impl Countdown {
    fn new() -> Countdown {
        Countdown {
            memory: Arc::new(InMemoryBackend::new()),
            fault: Arc::default(),
            injected: Arc::default(),
        }
    }

    fn arm(&self, op: Op, at: u64, sticky: bool) {
        *self.fault.lock().unwrap() = Some(Fault {
            op,
            left: at,
            sticky,
            fired: false,
        });
    }

    fn clear(&self) {
        *self.fault.lock().unwrap() = None;
    }

    fn injected(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    /// Whether this operation of kind `op` fails.
    fn hit(&self, op: Op) -> bool {
        let mut fault = self.fault.lock().unwrap();
        let Some(fault) = fault.as_mut().filter(|f| f.op == op) else {
            return false;
        };
        let fails = if fault.fired {
            fault.sticky
        } else if fault.left == 0 {
            fault.fired = true;
            true
        } else {
            fault.left -= 1;
            false
        };
        if fails {
            self.injected.fetch_add(1, Ordering::SeqCst);
        }
        fails
    }
}

fn injected(op: Op) -> std::io::Error {
    std::io::Error::other(format!("injected {op:?} failure"))
}

impl StorageBackend for Countdown {
    fn len(&self) -> Result<u64, redb::BackendError> {
        self.memory.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), redb::BackendError> {
        self.memory.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), redb::BackendError> {
        if self.hit(Op::SetLen) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                "injected: no space left on device",
            )
            .into());
        }
        self.memory.set_len(len)
    }
    fn sync_data(&self) -> Result<(), redb::BackendError> {
        // The data is in memory all the same: a failed sync that still wrote.
        if self.hit(Op::Sync) {
            return Err(injected(Op::Sync).into());
        }
        self.memory.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), redb::BackendError> {
        if self.hit(Op::Torn) {
            self.memory.write(offset, &data[..data.len() / 2])?;
            return Err(injected(Op::Torn).into());
        }
        if self.hit(Op::Write) {
            return Err(injected(Op::Write).into());
        }
        self.memory.write(offset, data)
    }
    granted_locks!();
}

fn countdown_store(backend: &Countdown) -> Store {
    let backend = backend.clone();
    let options = StoreOptions {
        commit_window: std::time::Duration::ZERO,
        ..StoreOptions::default()
    };
    Store::with_backend_factory(move || backend.clone(), options).expect("the store opens")
}

/// The turns `0..turns` of one session, each six events.
fn turns(range: std::ops::Range<u64>) -> Vec<Vec<Event>> {
    range
        .map(|t| completed_turn(t as u32 + 1, t * 6, &format!("turn {t}")))
        .collect()
}

/// A store over a new countdown backend with one session whose first of `turns_in_all` turns is
/// appended: the backend, the store, the session and all its turns.
fn first_batch_appended(turns_in_all: u64) -> (Countdown, Store, SessionId, Vec<Vec<Event>>) {
    let backend = Countdown::new();
    let store = countdown_store(&backend);
    let (id, header) = fresh();
    store.create(header).unwrap();
    let batches = turns(0..turns_in_all);
    store.append(id, &batches[0]).unwrap();
    (backend, store, id, batches)
}

/// For every operation kind, once and sticky, the `at`-th operation fails while two sessions
/// append: every batch whose append or flush returned `Ok` is stored byte for byte afterwards,
/// every error names what is not durable, and once storage works every batch admitted is
/// committed, in order, and the store verifies (read back over the same memory and as a new
/// handle would).
#[test]
fn a_fault_at_any_operation_loses_nothing_acknowledged() {
    let mut faults = 0;
    for op in [Op::Write, Op::Sync, Op::SetLen, Op::Torn] {
        for sticky in [false, true] {
            for at in 0..12 {
                let backend = Countdown::new();
                let store = countdown_store(&backend);
                let sessions: Vec<(SessionId, Vec<Vec<Event>>)> = (0..2)
                    .map(|_| {
                        let (id, header) = fresh();
                        store.create(header).unwrap();
                        (id, turns(0..8))
                    })
                    .collect();
                let plan = format!("{op:?} at {at}, sticky {sticky}");
                backend.arm(op, at, sticky);
                // Acknowledged seqs of each session (everything before is durable).
                let mut acked = [0u64; 2];
                for turn in 0..8 {
                    if sticky && turn == 5 {
                        backend.clear();
                    }
                    for (i, (id, batches)) in sessions.iter().enumerate() {
                        let batch = &batches[turn];
                        let end = batch.last().unwrap().seq + 1;
                        let result = if turn % 2 == 0 {
                            store.append(*id, batch)
                        } else {
                            store.admit(*id, batch).unwrap();
                            store.flush_all()
                        };
                        match result {
                            Ok(()) => acked[i] = end,
                            Err(StoreError::CommitFailed { not_durable, .. }) => {
                                let named = not_durable.iter().find(|n| n.session == *id);
                                match named {
                                    // Unnamed: everything of it is durable.
                                    None => acked[i] = end,
                                    Some(named) => {
                                        assert_eq!(named.seqs.end, end, "{plan}: {named}");
                                        assert!(named.seqs.start >= acked[i], "{plan}: {named}");
                                        acked[i] = named.seqs.start;
                                    }
                                }
                            }
                            Err(other) => panic!("{plan}: turn {turn}: {other}"),
                        }
                    }
                }
                faults += backend.injected();
                backend.clear();
                store
                    .flush_all()
                    .or_else(|_| store.flush_all())
                    .unwrap_or_else(|e| panic!("{plan}: the store does not serve again: {e}"));
                for (i, (id, batches)) in sessions.iter().enumerate() {
                    let expected: Vec<Event> = batches.concat();
                    assert!(acked[i] <= expected.len() as u64);
                    assert_eq!(store.load(*id).unwrap().events, expected, "{plan}");
                }
                assert_intact(&store.verify().unwrap());
                drop(store);
                let reopened = countdown_store(&backend);
                for (id, batches) in &sessions {
                    let expected: Vec<Event> = batches.concat();
                    let info = reopened.info(*id).unwrap();
                    assert_eq!(info.len, expected.len() as u64, "{plan}");
                    assert_eq!(info.head, digest_of(&expected), "{plan}");
                    assert_eq!(reopened.read_from(*id, 0).unwrap(), expected, "{plan}");
                }
                assert_intact(&reopened.verify().unwrap());
            }
        }
    }
    assert!(faults > 50, "the sweep injected only {faults} faults");
}

/// A sync that fails after the commit's data reached storage: the writer reads the store back,
/// finds the round there and finishes it, so the append that waited returns `Ok`; nothing is
/// retried as a conflict and later appends continue after it.
#[test]
fn a_commit_whose_sync_failed_but_landed_is_finished_not_refused() {
    let (backend, store, id, batches) = first_batch_appended(3);
    // The commit's sync fails once; the store answers again at once.
    backend.arm(Op::Sync, 0, false);
    match store.append(id, &batches[1]) {
        Ok(()) => {}
        Err(StoreError::CommitFailed { not_durable, .. }) => {
            assert_eq!(not_durable.len(), 1);
            assert_eq!(not_durable[0].seqs, 6..12);
        }
        Err(other) => panic!("{other}"),
    }
    assert_eq!(backend.injected(), 1);
    store.append(id, &batches[2]).unwrap();
    assert_eq!(store.load(id).unwrap().events, batches.concat());
    assert_intact(&store.verify().unwrap());
}

/// While every sync fails, each flush fails naming the session and every seq it waited for,
/// including batches admitted after the first failure; the queued batches are all committed once
/// syncs work again.
#[test]
fn while_syncs_keep_failing_flushes_name_every_seq_not_durable() {
    let (backend, store, id, batches) = first_batch_appended(4);
    backend.arm(Op::Sync, 0, true);
    let error = store.append(id, &batches[1]).unwrap_err();
    match &error {
        StoreError::CommitFailed { not_durable, .. } => {
            assert_eq!(not_durable.len(), 1, "{error}");
            assert_eq!(not_durable[0].session, id);
            assert_eq!(not_durable[0].seqs, 6..12, "{error}");
        }
        other => panic!("{other}"),
    }
    assert!(error.to_string().contains("seqs 6..12"), "{error}");
    store.admit(id, &batches[2]).unwrap();
    store.admit(id, &batches[3]).unwrap();
    for flush in [store.flush(id), store.flush_all()] {
        match flush {
            Err(StoreError::CommitFailed { not_durable, .. }) => {
                assert_eq!(not_durable.len(), 1);
                assert_eq!(not_durable[0].seqs, 6..24);
            }
            other => panic!("expected CommitFailed, got {other:?}"),
        }
    }
    backend.clear();
    store.flush_all().unwrap();
    assert_eq!(store.load(id).unwrap().events, batches.concat());
    drop(store);
    let reopened = countdown_store(&backend);
    assert_eq!(reopened.read_from(id, 0).unwrap(), batches.concat());
    assert_intact(&reopened.verify().unwrap());
}

/// One step of a random schedule against a store whose storage fails on command.
#[derive(Clone, Debug)]
enum Step {
    /// Admits the next turn of a session; flushes it (`Some(true)`: that session, `Some(false)`:
    /// every session) or leaves it queued.
    Admit {
        session: usize,
        flush: Option<bool>,
    },
    /// The `at`-th operation of this kind from now fails, once or from then on.
    Arm {
        op: Op,
        at: u64,
        sticky: bool,
    },
    Clear,
}

fn arb_step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    let op = prop_oneof![
        Just(Op::Write),
        Just(Op::Sync),
        Just(Op::SetLen),
        Just(Op::Torn)
    ];
    prop_oneof![
        6 => (0..3usize, prop_oneof![Just(None), Just(Some(true)), Just(Some(false))])
            .prop_map(|(session, flush)| Step::Admit { session, flush }),
        1 => (op, 0..6u64, any::<bool>()).prop_map(|(op, at, sticky)| Step::Arm { op, at, sticky }),
        1 => Just(Step::Clear),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 48, ..Default::default() })]

    /// Under any schedule of faults, admissions and flushes: a flush that returns `Ok` covered
    /// every batch admitted before it, a failed one names every session it waited for whose
    /// batches are not durable, and once storage works every admitted batch is stored, in order,
    /// byte for byte, in a store that verifies.
    #[test]
    fn no_schedule_of_faults_loses_an_acknowledged_batch(
        steps in proptest::collection::vec(arb_step(), 1..40),
    ) {
        let backend = Countdown::new();
        let store = countdown_store(&backend);
        let ids: Vec<SessionId> = (0..3)
            .map(|_| {
                let (id, header) = fresh();
                store.create(header).unwrap();
                id
            })
            .collect();
        let mut admitted: Vec<Vec<Event>> = vec![Vec::new(); 3];
        let mut acked = [0u64; 3];
        for step in &steps {
            match *step {
                Step::Arm { op, at, sticky } => backend.arm(op, at, sticky),
                Step::Clear => backend.clear(),
                Step::Admit { session, flush } => {
                    let start = admitted[session].len() as u64;
                    let turn = completed_turn((start / 6) as u32 + 1, start, "turn");
                    store.admit(ids[session], &turn).unwrap();
                    admitted[session].extend(turn);
                    let waited: Vec<usize> = match flush {
                        None => continue,
                        Some(true) => vec![session],
                        Some(false) => (0..3).collect(),
                    };
                    let result = if flush == Some(true) {
                        store.flush(ids[session])
                    } else {
                        store.flush_all()
                    };
                    for i in waited {
                        let end = admitted[i].len() as u64;
                        let named = match &result {
                            Ok(()) => None,
                            Err(StoreError::CommitFailed { not_durable, .. }) => {
                                not_durable.iter().find(|n| n.session == ids[i]).cloned()
                            }
                            Err(other) => panic!("{other}"),
                        };
                        match named {
                            None => acked[i] = end,
                            Some(named) => {
                                proptest::prop_assert_eq!(named.seqs.end, end);
                                proptest::prop_assert!(named.seqs.start >= acked[i]);
                            }
                        }
                    }
                }
            }
        }
        backend.clear();
        store.flush_all().or_else(|_| store.flush_all()).unwrap();
        drop(store);
        let reopened = countdown_store(&backend);
        for (i, id) in ids.iter().enumerate() {
            if admitted[i].is_empty() {
                continue;
            }
            proptest::prop_assert!(acked[i] <= admitted[i].len() as u64);
            proptest::prop_assert_eq!(&reopened.read_from(*id, 0).unwrap(), &admitted[i]);
        }
        assert_intact(&reopened.verify().unwrap());
    }
}
