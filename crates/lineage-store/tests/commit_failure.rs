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
    fn len(&self) -> std::io::Result<u64> {
        self.memory.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        if let Breaks::Everything = self.breaks {
            self.fail("read")?;
        }
        self.memory.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.memory.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        if let Breaks::Sync | Breaks::Everything = self.breaks {
            self.fail("sync")?;
        }
        self.memory.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
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
