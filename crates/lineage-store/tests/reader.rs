//! A read-only reader in another process follows a live writer: every view it gets is a committed
//! prefix of what the writer wrote (contiguous seqs, the writer's exact events, `verify` clean
//! apart from an open tail turn), and lengths never go backwards.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};

use common::*;
use lineage_log::{Event, SessionId};
use lineage_store::Store;
use lineage_testkit::SplitMix64;
use lineage_testkit::TurnStream;
use lineage_testkit::process::{Helper, helper_arg, helper_job, report_line, rerun_this_test};

/// `<session>:<seed>` pairs, comma separated: the sessions the writer fills, each with the
/// `TurnStream` seed it draws from (starting at seq 0, turn 1).
const SESSIONS_VAR: &str = "LINEAGE_STORE_READER_SESSIONS";
/// The session whose appearance tells the reader the writer is done.
const SENTINEL_VAR: &str = "LINEAGE_STORE_READER_SENTINEL";

/// Rounds of appends by the writer.
const ROUNDS: usize = 160;
/// Every this many rounds the writer waits until the reader has seen its latest commit.
const SYNC_EVERY: usize = 16;

/// The reader process (the test re-run with the store's path as its job). Repeatedly lists and inspects the store through one read-only handle and
/// prints `seen <session> <len>` whenever a session's length changes, `inconsistent <what>` for
/// any view that is not a committed prefix of the writer's stream, and `done <passes>` once the
/// sentinel session appears and a last pass is checked.
fn follow(path: &str) {
    let sessions: Vec<(SessionId, u64)> = std::env::var(SESSIONS_VAR)
        .expect("the parent names the sessions")
        .split(',')
        .map(|pair| {
            let (id, seed) = pair.split_once(':').expect("session:seed");
            (
                id.parse().expect("a session id"),
                seed.parse().expect("a seed"),
            )
        })
        .collect();
    let sentinel: SessionId = helper_arg(SENTINEL_VAR);
    let store = match Store::open_read_only(path) {
        Ok(store) => store,
        Err(e) => {
            report_line(&format!("inconsistent read-only open failed: {e}"));
            std::process::exit(1);
        }
    };
    // The writer's streams, regenerated here and extended as the store grows.
    let mut streams: HashMap<SessionId, (TurnStream, Vec<Event>)> = sessions
        .iter()
        .map(|&(id, seed)| (id, (TurnStream::new(seed, 0, 1), Vec::new())))
        .collect();
    let mut seen: HashMap<SessionId, u64> = HashMap::new();
    let mut passes = 0u64;
    let mut last_pass = false;
    // A backstop, not synchronisation: a reader whose writer died stops instead of spinning.
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        passes += 1;
        if std::time::Instant::now() > give_up {
            report_line("inconsistent the writer never created the sentinel session");
            std::process::exit(1);
        }
        let mut problems = Vec::new();
        match store.list() {
            Err(e) => problems.push(format!("list failed: {e}")),
            Ok(list) => {
                last_pass |= list.iter().any(|info| info.header.id == sentinel);
                for info in list.iter().filter(|i| i.header.id != sentinel) {
                    let id = info.header.id;
                    let Some((stream, expected)) = streams.get_mut(&id) else {
                        problems.push(format!("unexpected session {id}"));
                        continue;
                    };
                    let previous = seen.get(&id).copied().unwrap_or(0);
                    if info.len < previous {
                        problems.push(format!("{id} shrank from {previous} to {}", info.len));
                    }
                    // A later read sees at least what the listing saw.
                    let inspected = match store.inspect(id) {
                        Ok(inspected) => inspected,
                        Err(e) => {
                            problems.push(format!("inspect {id} failed: {e}"));
                            continue;
                        }
                    };
                    let stored = &inspected.events[..inspected.events.len() - inspected.closers];
                    let len = stored.len() as u64;
                    if len < info.len {
                        problems.push(format!("{id}: listed {} then inspected {len}", info.len));
                    }
                    if let Some((i, e)) = inspected
                        .events
                        .iter()
                        .enumerate()
                        .find(|(i, e)| e.seq != *i as u64)
                    {
                        problems.push(format!("{id}: event {i} has seq {}", e.seq));
                    }
                    if expected.len() < stored.len() {
                        let more = stored.len() - expected.len();
                        expected.extend(stream.take(more));
                    }
                    if stored != &expected[..stored.len()] {
                        problems.push(format!("{id}: the first {len} events are not the writer's"));
                    }
                    if len != previous {
                        seen.insert(id, len);
                        report_line(&format!("seen {id} {len}"));
                    }
                }
            }
        }
        match store.verify() {
            Err(e) => problems.push(format!("verify failed: {e}")),
            Ok(report) => {
                for failure in report.failures() {
                    problems.push(format!(
                        "verify {}: {:?}",
                        failure.session, failure.problems
                    ));
                }
            }
        }
        for problem in problems {
            report_line(&format!("inconsistent {problem}"));
        }
        if last_pass {
            report_line(&format!("done {passes}"));
            return;
        }
    }
}

#[test]
fn a_read_only_reader_in_another_process_sees_only_committed_prefixes() {
    if let Some(path) = helper_job() {
        return follow(&path);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.lineage");
    let store = Store::open(&path).unwrap();
    let sessions: Vec<(SessionId, u64)> = vec![(SessionId::new(), 11), (SessionId::new(), 12)];
    let sentinel = SessionId::new();
    for &(id, _) in &sessions {
        store.create(header(id)).unwrap();
    }
    let pairs: Vec<String> = sessions
        .iter()
        .map(|(id, seed)| format!("{id}:{seed}"))
        .collect();
    let mut helper = Helper::spawn(
        rerun_this_test(&path)
            .env(SESSIONS_VAR, pairs.join(","))
            .env(SENTINEL_VAR, sentinel.to_string()),
    );
    let reader = &mut helper.0;
    let mut lines = BufReader::new(reader.stdout.take().expect("piped stdout")).lines();
    let mut inconsistencies = Vec::new();
    let mut observed: HashMap<SessionId, Vec<u64>> = HashMap::new();
    // Reads reader lines until `until` holds for a line, recording everything seen.
    let mut read_until = |until: &mut dyn FnMut(&str) -> bool| loop {
        let line = match lines.next() {
            Some(Ok(line)) => line,
            other => panic!("the reader stopped early: {other:?}"),
        };
        if let Some(problem) = line.strip_prefix("inconsistent ") {
            inconsistencies.push(problem.to_owned());
        }
        if let Some(rest) = line.strip_prefix("seen ") {
            let (id, len) = rest.split_once(' ').expect("seen <id> <len>");
            observed
                .entry(id.parse().expect("an id"))
                .or_default()
                .push(len.parse().expect("a length"));
        }
        if until(&line) {
            return;
        }
    };

    let mut streams: Vec<TurnStream> = sessions
        .iter()
        .map(|&(_, seed)| TurnStream::new(seed, 0, 1))
        .collect();
    let mut lens = vec![0u64; sessions.len()];
    let mut rng = SplitMix64::new(77);
    for round in 0..ROUNDS {
        let size = rng.between(1, 40) as usize;
        if rng.percent(25) {
            // Both sessions in one group commit.
            for (i, stream) in streams.iter_mut().enumerate() {
                store.admit(sessions[i].0, &stream.take(size)).unwrap();
                lens[i] += size as u64;
            }
            store.flush_all().unwrap();
        } else {
            let i = rng.below(sessions.len() as u64) as usize;
            store.append(sessions[i].0, &streams[i].take(size)).unwrap();
            lens[i] += size as u64;
        }
        if (round + 1) % SYNC_EVERY == 0 {
            let (id, target) = (sessions[0].0, lens[0]);
            let wanted = format!("seen {id} ");
            read_until(&mut |line: &str| {
                line.strip_prefix(&wanted)
                    .and_then(|len| len.parse::<u64>().ok())
                    .is_some_and(|len| len >= target)
            });
        }
    }
    store.import(header(sentinel), &completed_turns(1)).unwrap();
    read_until(&mut |line: &str| line.starts_with("done "));
    let status = reader.wait().expect("the reader exits");

    assert!(status.success(), "the reader failed: {status:?}");
    assert!(
        inconsistencies.is_empty(),
        "the reader saw: {inconsistencies:#?}"
    );
    for (i, &(id, _)) in sessions.iter().enumerate() {
        let lengths = observed.get(&id).cloned().unwrap_or_default();
        assert!(
            lengths.windows(2).all(|w| w[0] < w[1]),
            "{id}: lengths only grow: {lengths:?}"
        );
        assert_eq!(
            lengths.last().copied(),
            Some(lens[i]),
            "{id}: the reader saw the final commit"
        );
        if i == 0 {
            assert!(
                lengths.len() >= ROUNDS / SYNC_EVERY,
                "{id}: the reader saw the log grow: {lengths:?}"
            );
        }
    }
    println!(
        "reader test: the reader saw {} and {} distinct lengths",
        observed[&sessions[0].0].len(),
        observed.get(&sessions[1].0).map_or(0, Vec::len)
    );
}
