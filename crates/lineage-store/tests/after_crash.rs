//! Inspection right after a crash: when a writer process is killed, at any moment, even right after
//! it opened the store and before it wrote anything, a read-only open reads the store as the
//! writer left it (every event it reported durable), verifies it, says that the file awaits
//! recovery by its next writer, and never modifies the file. The next writer recovers it, and a
//! read-only handle opened before then follows that writer.

mod common;

use std::io::{BufRead, BufReader, Lines};
use std::path::{Path, PathBuf};
use std::process::ChildStdout;

use common::*;
use lineage_log::SessionId;
use lineage_store::Store;
use lineage_testkit::SplitMix64;
use lineage_testkit::TurnStream;
use lineage_testkit::process::{Helper, helper_job, report_line, rerun_this_test};

/// The seed of the helper's events; without it the helper writes nothing.
const SEED_VAR: &str = "LINEAGE_STORE_AFTER_CRASH_SEED";
/// A writer left alone stops writing after this many events and waits to be killed.
const RUN_CAP: u64 = 20_000;

/// The writer process (each test re-run with the store's path as its job): opens the store
/// (creating it if needed) and prints `opened`. With a seed it then writes one new session from a
/// deterministic stream of turns cut into batches of random sizes, printing
/// `flushed <session> <seq>` once each batch is durable. Then it waits to be killed, its store
/// still open.
fn write_until_killed(path: &str) {
    let store = Store::open(path).expect("the writer opens the store");
    report_line("opened");
    if let Ok(seed) = std::env::var(SEED_VAR) {
        let seed: u64 = seed.parse().expect("the seed is a number");
        let id = SessionId::from_u128(u128::from(seed) << 64 | 1);
        store.create(header(id)).expect("the session is created");
        let mut stream = TurnStream::new(seed, 0, 1);
        let mut rng = SplitMix64::new(seed ^ 0x0bad_cafe);
        let mut written = 0;
        while written < RUN_CAP {
            let size = rng.between(1, 40);
            let batch = stream.take(size as usize);
            written += size;
            store.append(id, &batch).expect("the batch is appended");
            report_line(&format!("flushed {id} {}", batch.last().unwrap().seq));
        }
    }
    loop {
        std::thread::park();
    }
}

/// A writer process (the calling test re-run), running.
struct Writer {
    helper: Helper,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Writer {
    fn start(path: &Path, seed: Option<u64>) -> Writer {
        let mut command = rerun_this_test(path);
        if let Some(seed) = seed {
            command.env(SEED_VAR, seed.to_string());
        }
        let mut helper = Helper::spawn(&mut command);
        let lines = BufReader::new(helper.0.stdout.take().expect("piped stdout")).lines();
        let mut writer = Writer { helper, lines };
        while writer.line() != "opened" {}
        writer
    }

    /// The next protocol line (the test harness may print its own words before one).
    fn line(&mut self) -> String {
        match self.lines.next() {
            Some(Ok(line)) => match line.find("flushed ") {
                Some(at) => line[at..].to_owned(),
                None if line.ends_with("opened") => "opened".to_owned(),
                None => line,
            },
            other => panic!(
                "the writer stopped before it was killed ({other:?}): {:?}",
                self.helper.0.wait()
            ),
        }
    }

    /// Waits for `n` more durable batches; returns the session and the last durable seq.
    fn flushed(&mut self, n: usize) -> (SessionId, u64) {
        let mut last = None;
        for _ in 0..n {
            let line = self.line();
            let mut words = line
                .strip_prefix("flushed ")
                .unwrap_or_else(|| panic!("unexpected line {line:?}"))
                .split(' ');
            let id: SessionId = words.next().unwrap().parse().unwrap();
            let seq: u64 = words.next().unwrap().parse().unwrap();
            last = Some((id, seq));
        }
        last.expect("at least one batch")
    }

    /// SIGKILL; returns the last seq printed before the writer died (lines already in the pipe
    /// were printed after their batch was durable, too).
    fn kill(mut self) -> Option<u64> {
        self.helper.0.kill().expect("SIGKILL is delivered");
        let status = self.helper.0.wait().expect("the killed writer is reaped");
        assert!(!status.success(), "the writer was killed, not finished");
        self.lines
            .map_while(Result::ok)
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .last()
    }
}

/// Every read a person inspecting the store would do, each checked to succeed.
fn inspect_all(store: &Store) {
    assert_intact(&store.verify().expect("verify runs"));
    store.stats().expect("stats");
    for info in store.list().expect("list") {
        let id = info.header.id;
        let inspected = store.inspect(id).expect("inspect");
        assert_eq!(
            inspected.events.len() as u64,
            info.len + inspected.closers as u64
        );
        assert_eq!(store.read_from(id, 0).unwrap().len() as u64, info.len);
        store.session_bytes(id).expect("session bytes");
        store.children(id).expect("children");
        store.descendants(id).expect("descendants");
    }
}

/// A store holding one session of three completed turns, closed cleanly.
fn closed_store(dir: &Path) -> (PathBuf, SessionId) {
    let path = dir.join("sessions.lineage");
    let store = Store::open(&path).unwrap();
    let (id, header) = fresh();
    store.import(header, &completed_turns(3)).unwrap();
    store.close().unwrap();
    (path, id)
}

#[test]
fn a_writer_killed_right_after_it_opened_the_store_leaves_it_readable_read_only() {
    if let Some(path) = helper_job() {
        return write_until_killed(&path);
    }
    let dir = tempfile::tempdir().unwrap();
    let (path, id) = closed_store(dir.path());
    let clean = Store::open_read_only(&path).unwrap();
    assert!(
        !clean.awaits_recovery(),
        "a cleanly closed file awaits nothing"
    );
    drop(clean);

    Writer::start(&path, None).kill();
    let before = std::fs::read(&path).unwrap();

    let store = Store::open_read_only(&path).expect("a read-only open right after the kill");
    assert!(store.is_read_only());
    assert!(
        store.awaits_recovery(),
        "the file awaits recovery by its next writer"
    );
    assert_eq!(store.read_from(id, 0).unwrap(), completed_turns(3));
    inspect_all(&store);
    assert!(store.awaits_recovery());
    drop(store);
    assert!(
        std::fs::read(&path).unwrap() == before,
        "the read-only open, the reads and the close left the file's bytes as they were"
    );

    // The next writer recovers it.
    let writer = Store::open(&path).unwrap();
    assert!(!writer.awaits_recovery());
    writer.close().unwrap();
    let after = Store::open_read_only(&path).unwrap();
    assert!(!after.awaits_recovery(), "the writer recovered the file");
    assert_eq!(after.read_from(id, 0).unwrap(), completed_turns(3));
}

#[test]
fn a_writer_killed_after_it_wrote_leaves_every_durable_event_readable_read_only() {
    if let Some(path) = helper_job() {
        return write_until_killed(&path);
    }
    let mut rng = SplitMix64::new(0xaf7e_c0a5);
    for round in 0..6 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions.lineage");
        let seed = rng.next_u64();
        let mut writer = Writer::start(&path, Some(seed));
        // Killed while it keeps writing: between batches, mid-commit or mid-fsync.
        let (id, mut highest) = writer.flushed(1 + rng.below(30) as usize);
        if let Some(later) = writer.kill() {
            highest = highest.max(later);
        }
        let before = std::fs::read(&path).unwrap();

        let store = Store::open_read_only(&path)
            .unwrap_or_else(|e| panic!("round {round}: read-only open after the kill: {e}"));
        assert!(store.awaits_recovery(), "round {round}");
        let info = store.info(id).unwrap();
        assert!(
            info.len > highest,
            "round {round}: seq {highest} was reported durable, the store holds {}",
            info.len
        );
        let stored = store.read_from(id, 0).unwrap();
        assert_eq!(
            stored,
            TurnStream::new(seed, 0, 1).take(stored.len()),
            "round {round}: exactly what the writer wrote"
        );
        inspect_all(&store);
        drop(store);
        assert!(
            std::fs::read(&path).unwrap() == before,
            "round {round}: the file is unchanged"
        );

        let recovered = Store::open(&path).unwrap();
        let loaded = recovered.load(id).unwrap();
        assert_eq!(loaded.events[..stored.len()], stored[..], "round {round}");
        recovered.close().unwrap();
        let after = Store::open_read_only(&path).unwrap();
        assert!(!after.awaits_recovery(), "round {round}");
        assert_intact(&after.verify().unwrap());
    }
}

#[test]
fn a_read_only_handle_opened_after_a_crash_follows_the_next_writer() {
    if let Some(path) = helper_job() {
        return write_until_killed(&path);
    }
    let dir = tempfile::tempdir().unwrap();
    let (path, id) = closed_store(dir.path());
    Writer::start(&path, None).kill();

    let reader = Store::open_read_only(&path).unwrap();
    assert!(reader.awaits_recovery());
    assert_eq!(reader.info(id).unwrap().len, 18);

    // A writer opens the file (repairing it on disk) while the reader has it open.
    let writer = Store::open(&path).expect("a writer opens beside the read-only handle");
    assert!(
        !reader.awaits_recovery(),
        "once a writer has opened the file it no longer awaits recovery"
    );
    writer.append(id, &completed_turn(4, 18, "after")).unwrap();
    let mut expected = completed_turns(3);
    expected.extend(completed_turn(4, 18, "after"));
    assert_eq!(
        reader.read_from(id, 0).unwrap(),
        expected,
        "the reader follows the writer's commits"
    );
    assert_intact(&reader.verify().unwrap());

    // The writer closes; the reader still reads what it committed.
    drop(writer);
    assert_eq!(reader.info(id).unwrap().len, 24);
}
