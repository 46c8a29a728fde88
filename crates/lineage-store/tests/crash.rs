//! A writer process killed with SIGKILL at pseudo-random moments loses nothing it flushed: after
//! every kill the store opens, holds every seq the writer reported durable (and exactly the events
//! it generated), verifies with at most an open tail turn, closes that turn on load, and the next
//! writer continues after it.

mod common;

use std::io::{BufRead, BufReader};

use common::*;
use lineage_log::{SessionId, is_balanced};
use lineage_store::{Store, StoreError};
use lineage_testkit::SplitMix64;
use lineage_testkit::process::{Helper, helper_arg, helper_job, report_line, rerun_this_test};
use lineage_testkit::{TurnStream, last_turn};

/// The seed of the helper's event stream and batching.
const SEED_VAR: &str = "LINEAGE_STORE_CRASH_SEED";
/// How many times a writer is killed.
const KILLS: usize = 24;
/// A writer left alone stops after this many events of one run (it is always killed far sooner).
const RUN_CAP: u64 = 50_000;

/// The writer process (each test re-run with the store's location as its job): continues the store's only session (creating it on the first run) with a
/// deterministic stream of realistic turns cut into batches of random sizes, so turns are often
/// left open across batches. Each append returns only once durable; its last seq is then printed
/// as `flushed <session> <seq>`. Some batches are only admitted and become durable with the next
/// append, which prints the seq of the last of them.
fn write_until_killed(path: &str) {
    let seed: u64 = helper_arg(SEED_VAR);
    let store = Store::open(path).expect("the writer opens the store");
    let id = match store.list().expect("the store lists").first() {
        Some(info) => info.header.id,
        None => {
            let (id, header) = fresh();
            store.create(header).expect("the session is created");
            id
        }
    };
    let (next_seq, next_turn) = match store.load(id) {
        Ok(loaded) => (loaded.events.len() as u64, last_turn(&loaded.events) + 1),
        Err(StoreError::UnknownSession { .. }) => (0, 1),
        Err(e) => panic!("the writer cannot load its session: {e}"),
    };
    let mut stream = TurnStream::new(seed, next_seq, next_turn);
    let mut rng = SplitMix64::new(seed ^ 0x00c0_ffee);
    let mut written = 0u64;
    while written < RUN_CAP {
        let size = if rng.percent(30) {
            rng.between(1, 3)
        } else {
            rng.between(4, 60)
        };
        let batch = stream.take(size as usize);
        let last = batch.last().expect("batches are not empty").seq;
        written += size;
        if rng.percent(20) {
            store.admit(id, &batch).expect("the batch is admitted");
            continue;
        }
        store.append(id, &batch).expect("the batch is appended");
        report_line(&format!("flushed {id} {last}"));
    }
}

/// Parses a `flushed <session> <seq>` line.
fn flushed(line: &str) -> Option<(SessionId, u64)> {
    let mut words = line.strip_prefix("flushed ")?.split(' ');
    let id = words.next()?.parse().ok()?;
    let seq = words.next()?.parse().ok()?;
    Some((id, seq))
}

#[test]
fn killed_writers_lose_nothing_they_flushed() {
    if let Some(path) = helper_job() {
        return write_until_killed(&path);
    }
    let dir = tempfile::tempdir().unwrap();
    killed_writers_lose_nothing(&dir.path().join("sessions.lineage"), true);
}

/// The same kills with the store in PostgreSQL: a killed writer's open transaction is rolled back
/// by the server, and what it committed is there.
#[test]
fn killed_postgres_writers_lose_nothing_they_flushed() {
    if let Some(path) = helper_job() {
        return write_until_killed(&path);
    }
    let url = lineage_testkit::postgres::postgres().create_database();
    killed_writers_lose_nothing(std::path::Path::new(&url), false);
}

/// `exclusive`: the store admits one writer at a time (a file), which is checked while each
/// writer lives.
fn killed_writers_lose_nothing(path: &std::path::Path, exclusive: bool) {
    let mut rng = SplitMix64::new(0x5eed_cafe);
    let mut session: Option<SessionId> = None;
    // Where the next writer continues: the balanced log's length and its next turn.
    let (mut next_seq, mut next_turn) = (0u64, 1u32);
    let (mut kills, mut checked, mut repaired) = (0usize, 0usize, 0usize);

    for iteration in 0..KILLS {
        let seed = rng.next_u64();
        let mut helper = Helper::spawn(rerun_this_test(path).env(SEED_VAR, seed.to_string()));
        let child = &mut helper.0;
        let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let mut seqs = Vec::new();
        let mut record = |line: &str, seqs: &mut Vec<u64>| {
            if let Some((id, seq)) = flushed(line) {
                assert_eq!(*session.get_or_insert(id), id, "one session throughout");
                seqs.push(seq);
            }
        };
        // The kill comes after the first durable batch and then `further` more.
        let further = rng.below(12) as usize;
        while seqs.len() < 1 + further {
            match lines.next() {
                Some(Ok(line)) => record(&line, &mut seqs),
                _ => panic!(
                    "iteration {iteration}: the writer stopped before it was killed: {:?}",
                    child.wait()
                ),
            }
        }
        // While the writer lives, a second writer is refused and readers are not.
        if iteration % 4 == 0 {
            if exclusive {
                match Store::open(path) {
                    Err(StoreError::AlreadyOpen { path: named }) => assert_eq!(named, path),
                    other => panic!("a second writer beside a live one: {other:?}"),
                }
            }
            let reader = Store::open_read_only(path).expect("a reader opens beside the writer");
            let listed = reader.list().expect("the reader lists");
            assert!(listed.len() == 1 && listed[0].len > seqs[0]);
        }
        child.kill().expect("SIGKILL is delivered");
        let status = child.wait().expect("the killed writer is reaped");
        assert!(!status.success(), "the writer was killed, not finished");
        kills += 1;
        // Lines already in the pipe were printed after their batch was durable too.
        for line in lines.map_while(Result::ok) {
            record(&line, &mut seqs);
        }
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "flushed seqs increase"
        );
        let id = session.expect("a session was reported");

        let store = Store::open(path).expect("the store opens after the kill");
        let info = store.info(id).unwrap();
        let highest = *seqs.last().unwrap();
        assert!(
            info.len > highest,
            "iteration {iteration}: seq {highest} was reported durable, the store holds {}",
            info.len
        );
        // Exactly what the writer generated, from where it started to wherever the kill fell.
        let stored = store.read_from(id, next_seq).unwrap();
        let expected = TurnStream::new(seed, next_seq, next_turn).take(stored.len());
        assert_eq!(
            stored, expected,
            "iteration {iteration}: the stored suffix is the writer's"
        );
        checked += stored.len();

        let report = store.verify().unwrap();
        assert_intact(&report);
        let open = report.sessions[0].open_turn;
        let loaded = store.load(id).unwrap();
        assert_eq!(
            loaded.closers > 0,
            open.is_some(),
            "load closes exactly an open turn"
        );
        assert!(is_balanced(&loaded.events));
        assert_eq!(loaded.events.len() as u64, info.len + loaded.closers as u64);
        repaired += usize::from(loaded.closers > 0);
        let after = store.verify().unwrap();
        assert_intact(&after);
        assert_eq!(after.sessions[0].open_turn, None);
        next_seq = loaded.events.len() as u64;
        next_turn = last_turn(&loaded.events) + 1;
        store.close().unwrap();
    }

    // A last writer continues after the final repair; its first batch lands right after it.
    let store = Store::open(path).unwrap();
    let id = session.unwrap();
    let total = store.info(id).unwrap().len;
    assert_eq!(total, next_seq);
    assert_intact(&store.verify().unwrap());
    println!(
        "crash test: {kills} kills, {checked} written events checked against their writer, \
         {repaired} open turns repaired, {total} events in the final log"
    );
    assert!(kills >= 20);
    assert!(
        repaired > 0,
        "some kills fell inside a turn (otherwise repair went untested)"
    );
}
