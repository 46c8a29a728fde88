//! Creating a store is crash-safe: a creator killed with SIGKILL at any moment, or failing with an
//! I/O error at any write or sync, leaves either no file at the store's path or a store that
//! opens, and nothing that stops the next open; creators racing on one path end with one store.

mod common;

use std::io::{BufRead, BufReader};
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::*;
use lineage_store::{Store, StoreError, StoreOptions};
use lineage_testkit::files::names_in;
use lineage_testkit::process::{Helper, helper_job, report_line, rerun_this_test};
use redb::StorageBackend;
use redb::backends::FileBackend;

/// The creator process (the kill test re-run with the store's path as its job): prints `ready`,
/// creates the store, prints `created`, closes it and prints `closed`.
fn create(path: &str) {
    report_line("ready");
    let store = Store::open(path).expect("the store is created");
    report_line("created");
    store.close().expect("the new store closes");
    report_line("closed");
}

/// A creator process (the calling test re-run) that has printed `ready`, and its further lines.
fn start_creator(path: &Path) -> (Helper, std::io::Lines<BufReader<std::process::ChildStdout>>) {
    let mut helper = Helper::spawn(&mut rerun_this_test(path));
    let mut lines = BufReader::new(helper.0.stdout.take().expect("piped stdout")).lines();
    loop {
        match lines.next() {
            Some(Ok(line)) if line.ends_with("ready") => break,
            Some(Ok(_)) => {}
            other => panic!("the creator stopped before it was ready: {other:?}"),
        }
    }
    (helper, lines)
}

/// How long, after `ready`, a creator takes to create and close a store: the slowest of a few.
fn creation_time(dir: &Path) -> Duration {
    let mut slowest = Duration::ZERO;
    for round in 0..3 {
        let path = dir.join(format!("calibration-{round}.lineage"));
        let (mut helper, mut lines) = start_creator(&path);
        let start = Instant::now();
        for line in lines.by_ref() {
            if line.unwrap().ends_with("closed") {
                break;
            }
        }
        slowest = slowest.max(start.elapsed());
        assert!(helper.0.wait().unwrap().success());
    }
    slowest
}

#[test]
fn a_creator_killed_at_any_moment_leaves_no_file_or_a_store_that_opens() {
    if let Some(path) = helper_job() {
        return create(&path);
    }
    let dir = tempfile::tempdir().unwrap();
    let window = creation_time(dir.path());
    // Kill moments from right after `ready` to past the end of creation, in fine steps.
    const KILLS: u32 = 90;
    let (mut nothing, mut published, mut leftovers) = (0, 0, 0);
    for k in 0..KILLS {
        let delay = window.mul_f64(1.3 * f64::from(k) / f64::from(KILLS));
        let cycle = dir.path().join(format!("cycle-{k}"));
        std::fs::create_dir(&cycle).unwrap();
        let path = cycle.join("sessions.lineage");
        let (mut helper, _lines) = start_creator(&path);
        let start = Instant::now();
        while start.elapsed() < delay {
            std::hint::spin_loop();
        }
        helper.0.kill().expect("SIGKILL is delivered");
        helper.0.wait().expect("the killed creator is reaped");

        let left = names_in(&cycle);
        leftovers += usize::from(left.iter().any(|n| n != "sessions.lineage"));
        if path.exists() {
            published += 1;
            let reader = Store::open_read_only(&path).unwrap_or_else(|e| {
                panic!("kill {k} after {delay:?} left a store that does not open: {e} ({left:?})")
            });
            assert_intact(&reader.verify().unwrap());
        } else {
            nothing += 1;
        }
        let store = Store::open(&path).unwrap_or_else(|e| {
            panic!(
                "kill {k} after {delay:?}: the next open failed: {e} (the directory held {left:?})"
            )
        });
        let (id, header) = fresh();
        store.import(header, &completed_turns(1)).unwrap();
        store.close().unwrap();
        assert_eq!(
            names_in(&cycle),
            vec!["sessions.lineage".to_owned()],
            "kill {k}: the next writer removed the interrupted creation's leftovers"
        );
        let reopened = Store::open_read_only(&path).unwrap();
        assert_eq!(reopened.read_from(id, 0).unwrap(), completed_turns(1));
    }
    println!(
        "creation kills: {KILLS} over {window:?}: {nothing} left no file, {published} a store, \
         {leftovers} a temporary file"
    );
    assert!(
        nothing > 0 && published > 0,
        "the kills fell before and after the store appeared"
    );
    assert!(leftovers > 0, "some kills fell in the middle of a creation");
}

/// Which operation of the new file's backend fails.
#[derive(Clone, Copy, Debug)]
enum Fault {
    Write,
    Sync,
    SetLen,
}

/// The file backend of a new store whose `nth` operation of one kind fails with an I/O error.
#[derive(Debug)]
struct Failing {
    file: FileBackend,
    fault: Fault,
    nth: usize,
    seen: Arc<AtomicUsize>,
}

impl Failing {
    fn count(&self, fault: Fault) -> std::io::Result<()> {
        if std::mem::discriminant(&fault) == std::mem::discriminant(&self.fault)
            && self.seen.fetch_add(1, Ordering::SeqCst) + 1 == self.nth
        {
            return Err(std::io::Error::other(format!(
                "injected failure of {fault:?} number {}",
                self.nth
            )));
        }
        Ok(())
    }
}

impl StorageBackend for Failing {
    fn len(&self) -> Result<u64, redb::BackendError> {
        self.file.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), redb::BackendError> {
        self.file.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), redb::BackendError> {
        self.count(Fault::SetLen)?;
        self.file.set_len(len)
    }
    fn sync_data(&self) -> Result<(), redb::BackendError> {
        self.count(Fault::Sync)?;
        self.file.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), redb::BackendError> {
        self.count(Fault::Write)?;
        self.file.write(offset, data)
    }
    fn close(&self) -> Result<(), redb::BackendError> {
        self.file.close()
    }
    fn try_lock_range(&self, a: Bound<u64>, b: Bound<u64>) -> Result<bool, redb::BackendError> {
        self.file.try_lock_range(a, b)
    }
    fn try_lock_shared_range(
        &self,
        a: Bound<u64>,
        b: Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.file.try_lock_shared_range(a, b)
    }
    fn lock_range(&self, a: Bound<u64>, b: Bound<u64>) -> Result<(), redb::BackendError> {
        self.file.lock_range(a, b)
    }
    fn lock_shared_range(&self, a: Bound<u64>, b: Bound<u64>) -> Result<(), redb::BackendError> {
        self.file.lock_shared_range(a, b)
    }
    fn unlock_range(&self, a: Bound<u64>, b: Bound<u64>) -> Result<(), redb::BackendError> {
        self.file.unlock_range(a, b)
    }
    fn query_lock_range(&self, a: Bound<u64>, b: Bound<u64>) -> Result<bool, redb::BackendError> {
        self.file.query_lock_range(a, b)
    }
}

/// Creates the store at `path` with the `nth` operation of kind `fault` failing; returns the
/// result and how many operations of that kind the creation made.
fn create_failing(path: &Path, fault: Fault, nth: usize) -> (Result<Store, StoreError>, usize) {
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    let result = Store::open_creating_with(path, StoreOptions::default(), move |file| {
        Ok(Failing {
            file: FileBackend::new(file),
            fault,
            nth,
            seen: counter,
        })
    });
    (result, seen.load(Ordering::SeqCst))
}

#[test]
fn an_io_error_at_any_write_or_sync_of_a_creation_leaves_no_file_and_the_next_open_creates_it() {
    for fault in [Fault::Write, Fault::Sync, Fault::SetLen] {
        let mut failures = 0;
        for nth in 1.. {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("sessions.lineage");
            let (result, seen) = create_failing(&path, fault, nth);
            if seen < nth {
                // The creation made fewer such operations: every one has failed once.
                let store = result.expect("a creation without a failure succeeds");
                store.close().unwrap();
                break;
            }
            failures += 1;
            match result {
                Err(StoreError::CreateFailed {
                    path: named,
                    source,
                }) => {
                    assert_eq!(named, path);
                    let message = StoreError::CreateFailed {
                        path: named,
                        source,
                    }
                    .to_string();
                    assert!(
                        message.contains(&format!("injected failure of {fault:?} number {nth}")),
                        "{fault:?} {nth}: the error names the I/O failure: {message}"
                    );
                }
                other => panic!("{fault:?} {nth}: expected CreateFailed, got {other:?}"),
            }
            assert_eq!(
                names_in(dir.path()),
                Vec::<String>::new(),
                "{fault:?} {nth}: a failed creation leaves nothing behind"
            );
            let store = Store::open(&path)
                .unwrap_or_else(|e| panic!("{fault:?} {nth}: the next open failed: {e}"));
            let (id, header) = fresh();
            store.import(header, &completed_turns(2)).unwrap();
            store.close().unwrap();
            assert_eq!(
                Store::open_read_only(&path)
                    .unwrap()
                    .read_from(id, 0)
                    .unwrap(),
                completed_turns(2)
            );
        }
        assert!(
            failures >= 1,
            "{fault:?}: the creation made such an operation"
        );
    }
}

#[test]
fn creators_racing_on_one_path_end_with_one_store() {
    for round in 0..12 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions.lineage");
        let start = Arc::new(Barrier::new(3));
        let creators: Vec<_> = (0..3)
            .map(|_| {
                let (path, start) = (path.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    match Store::open(&path) {
                        Ok(store) => {
                            let id = store.store_id();
                            store.close().unwrap();
                            Some(id)
                        }
                        // Another creator's store, open for writing by it.
                        Err(StoreError::AlreadyOpen { .. }) => None,
                        Err(e) => panic!("round {round}: a racing creator failed: {e}"),
                    }
                })
            })
            .collect();
        let ids: Vec<_> = creators
            .into_iter()
            .filter_map(|c| c.join().unwrap())
            .collect();
        let stored = Store::open_read_only(&path).unwrap().store_id();
        assert!(
            !ids.is_empty(),
            "round {round}: some creator opened the store"
        );
        assert!(
            ids.iter().all(|id| *id == stored),
            "round {round}: every creator saw the one store at the path"
        );
        drop(Store::open(&path).unwrap());
        assert_eq!(names_in(dir.path()), vec!["sessions.lineage".to_owned()]);
    }
}

#[test]
fn a_leftover_of_an_interrupted_creation_is_never_the_store_and_the_next_writer_removes_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.lineage");
    let leftover = dir.path().join(".sessions.lineage.creating.4242.0");
    std::fs::write(&leftover, vec![0u8; 72 * 1024]).unwrap();
    let unrelated = dir.path().join(".other.lineage.creating.4242.0");
    std::fs::write(&unrelated, b"not ours").unwrap();

    // A reader does not touch it, and finds no store.
    assert!(Store::open_read_only(&path).is_err());
    assert!(leftover.exists());
    let store = Store::open(&path).expect("the store is created beside the leftover");
    assert!(!leftover.exists(), "the writer removed the leftover");
    assert!(
        unrelated.exists(),
        "another store's leftover is not this writer's to remove"
    );
    store.close().unwrap();

    // Also once the store exists.
    std::fs::write(&leftover, b"junk").unwrap();
    Store::open(&path).unwrap().close().unwrap();
    assert!(!leftover.exists());
}
