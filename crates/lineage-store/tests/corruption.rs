//! Damage to a closed store file: a flipped byte inside a stored block is named by `verify` with the
//! block's seq range and refused by every read that checks digests, other sessions stay readable,
//! and no truncated or garbled file makes the store panic.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use common::*;
use lineage_log::{Event, ForkSpec, SessionId};
use lineage_store::{Problem, Store, StoreError, StoreOptions};
use lineage_testkit::last_turn;
use lineage_testkit::{SplitMix64, ev};

/// Every offset at which `needle` occurs in `haystack`.
fn occurrences(haystack: &[u8], needle: &[u8]) -> Vec<usize> {
    haystack
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i)
        .collect()
}

/// Flips one bit of the marker's middle byte wherever the marker sits in the file, and returns
/// how many copies were flipped. redb writes pages copy-on-write, so freed pages may still hold
/// stale copies of a block; flipping all of them makes sure the live copy is among them, and
/// damaging unreachable pages changes nothing a reader sees.
fn flip_marker(path: &Path, marker: &str) -> usize {
    let mut bytes = std::fs::read(path).unwrap();
    let hits = occurrences(&bytes, marker.as_bytes());
    for &at in &hits {
        // 'A' ^ 0x02 == 'C': the text stays valid UTF-8, so only the digest can notice.
        bytes[at + marker.len() / 2] ^= 0x02;
    }
    std::fs::write(path, &bytes).unwrap();
    hits.len()
}

/// Three sessions; the middle one's third batch (a completed turn, then another) holds `marker` in
/// a user message. Returns (path, sessions, victim, the victim's log, the marker's seq, the
/// victim's batch boundaries).
struct Damaged {
    _dir: tempfile::TempDir,
    path: PathBuf,
    others: Vec<(SessionId, Vec<Event>)>,
    victim: SessionId,
    victim_log: Vec<Event>,
    marker_seq: u64,
}

fn damaged_store() -> Damaged {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.lineage");
    let marker = format!("MARKER-{}-AAAA", SessionId::new().as_uuid().simple());
    let store = Store::open(&path).unwrap();

    let mut others = Vec::new();
    let (a, a_header) = fresh();
    store.import(a_header, &completed_turns(3)).unwrap();
    others.push((a, completed_turns(3)));

    let (victim, victim_header) = fresh();
    store.create(victim_header).unwrap();
    let mut log = completed_turns(2); // seqs 0..12, appended as two batches
    store.append(victim, &log[..6]).unwrap();
    store.append(victim, &log[6..]).unwrap();
    // Third batch: turn 3 carrying the marker (seqs 12..18), then turn 4 (seqs 18..24).
    let mut third = completed_turn(3, 12, &format!("please keep {marker} safe"));
    third.extend(completed_turn(4, 18, "next"));
    let marker_seq = 14;
    store.append(victim, &third).unwrap();
    log.extend(third);
    let fourth = completed_turn(5, 24, "after the damage");
    store.append(victim, &fourth).unwrap();
    log.extend(fourth);

    let (c, c_header) = fresh();
    store.import(c_header, &open_turn_log()).unwrap();
    others.push((c, open_turn_log()));
    store.close().unwrap();

    let flipped = flip_marker(&path, &marker);
    assert!(flipped >= 1, "the marker is stored in the file as written");
    Damaged {
        _dir: dir,
        path,
        others,
        victim,
        victim_log: log,
        marker_seq,
    }
}

/// Checks that `result` is the refusal of `d`'s damaged block.
fn assert_corrupt_block<T: std::fmt::Debug>(result: Result<T, StoreError>, d: &Damaged) {
    let (victim, marker_seq) = (d.victim, d.marker_seq);
    match result {
        Err(StoreError::CorruptBlock {
            session,
            first_seq,
            last_seq,
            ..
        }) => {
            assert_eq!(session, victim);
            assert!(
                (first_seq..=last_seq).contains(&marker_seq),
                "the named block {first_seq}..={last_seq} holds seq {marker_seq}"
            );
            assert_eq!((first_seq, last_seq), (12, 23), "exactly the damaged block");
        }
        other => panic!("expected CorruptBlock, got {other:?}"),
    }
}

fn check_report(store: &Store, d: &Damaged) {
    let report = store.verify().unwrap();
    assert!(!report.is_ok());
    let failures: Vec<_> = report.failures().collect();
    assert_eq!(failures.len(), 1, "only the victim: {failures:?}");
    assert_eq!(failures[0].session, d.victim);
    let named = failures[0].problems.iter().any(|p| {
        matches!(p, Problem::CorruptBlock { first_seq, last_seq, .. }
            if (*first_seq..=*last_seq).contains(&d.marker_seq))
    });
    assert!(
        named,
        "verify names the block holding seq {}: {:?}",
        d.marker_seq, failures[0].problems
    );
}

#[test]
fn a_flipped_byte_in_a_block_is_named_by_verify_and_refused_by_load() {
    let d = damaged_store();
    let store = Store::open(&d.path).unwrap();
    check_report(&store, &d);
    assert_corrupt_block(store.load(d.victim), &d);
    assert_corrupt_block(store.inspect(d.victim), &d);
    // A refused load wrote nothing: the victim is as it was.
    assert_eq!(store.info(d.victim).unwrap().len, d.victim_log.len() as u64);
    for (id, log) in &d.others {
        let loaded = store.load(*id).unwrap();
        assert_eq!(
            loaded.events[..log.len()],
            log[..],
            "session {id} is intact"
        );
    }
    // Blocks before the damage still read: read_from serves suffixes without the prefix digest.
    assert_eq!(
        store.read_from(d.victim, 24).unwrap(),
        d.victim_log[24..],
        "later blocks are undamaged"
    );
}

#[test]
fn a_read_only_open_reports_the_damaged_block_too() {
    let d = damaged_store();
    let store = Store::open_read_only(&d.path).unwrap();
    check_report(&store, &d);
    assert_corrupt_block(store.inspect(d.victim), &d);
    for (id, log) in &d.others {
        assert_eq!(store.inspect(*id).unwrap().events[..log.len()], log[..]);
    }
}

#[test]
fn appending_to_a_damaged_session_is_refused() {
    let d = damaged_store();
    let store = Store::open(&d.path).unwrap();
    let next = completed_turn(6, 30, "more");
    assert_corrupt_block(store.append(d.victim, &next), &d);
    assert_eq!(store.info(d.victim).unwrap().len, 30);
}

#[test]
fn a_fork_before_the_damaged_block_succeeds_and_one_through_it_is_refused() {
    let d = damaged_store();
    let store = Store::open(&d.path).unwrap();
    let spec = |boundary| ForkSpec {
        child: SessionId::new(),
        boundary: Some(boundary),
        time_ms: T0,
        delegation_depth: 0,
        agent_preset: None,
    };
    // Seqs 0..12 sit in intact blocks.
    let ok = spec(11);
    store.fork(d.victim, &ok).unwrap();
    assert_eq!(
        store.read_from(ok.child, 0).unwrap()[..12],
        d.victim_log[..12]
    );
    // Through the damaged block: past its end, and at turn 3's end inside it (past the marker).
    for boundary in [29, 17] {
        let through = spec(boundary);
        assert_corrupt_block(store.fork(d.victim, &through), &d);
        match store.info(through.child) {
            Err(StoreError::UnknownSession { .. }) => {}
            other => panic!("boundary {boundary}: the refused fork created {other:?}"),
        }
    }
}

/// Opens `path` writable and read-only and exercises every read, catching panics. Errors are fine;
/// a panic is reported with what was being done.
fn poke(path: &Path, what: &str) -> Vec<String> {
    let mut panics = Vec::new();
    let mut attempt = |label: &str, f: &dyn Fn()| {
        if catch_unwind(AssertUnwindSafe(f)).is_err() {
            panics.push(format!("{what}: {label}"));
        }
    };
    let exercise = |store: &Store| {
        let ids: Vec<SessionId> = store
            .list()
            .map(|l| l.into_iter().map(|i| i.header.id).collect())
            .unwrap_or_default();
        let _ = store.verify();
        let _ = store.stats();
        for id in ids {
            let _ = store.inspect(id);
            let _ = store.read_from(id, 3);
            let _ = store.children(id);
            let _ = store.descendants(id);
        }
    };
    attempt("read-only", &|| {
        if let Ok(store) = Store::open_read_only(path) {
            exercise(&store);
        }
    });
    attempt("writable", &|| {
        if let Ok(store) = Store::open_with(path, StoreOptions::default()) {
            exercise(&store);
            for info in store.list().unwrap_or_default() {
                let _ = store.load(info.header.id);
            }
            // A commit onto the damaged file, then the drop, which closes it.
            let (id, header) = fresh();
            let imported = store.import(header, &completed_turn(1, 0, "onto damage"));
            // `Closed` from a store still open means its writer thread died of a panic.
            assert!(
                !matches!(imported, Err(StoreError::Closed)),
                "the writer thread stopped"
            );
            let _ = store.info(id);
        }
    });
    panics
}

fn sample_store(path: &Path) {
    let store = Store::open(path).unwrap();
    for seed in 0..3 {
        let (id, header) = fresh();
        store.create(header).unwrap();
        let log = lineage_testkit::realistic_session(seed, 300);
        for batch in log.chunks(60) {
            store.append(id, batch).unwrap();
        }
        let n = log.len() as u64;
        let turn = last_turn(&log) + 1;
        store
            .append(id, &events_from(n, vec![ev::turn_start(turn)]))
            .unwrap();
        let child = SessionId::new();
        store
            .fork(
                id,
                &ForkSpec {
                    child,
                    boundary: Some(n - 1),
                    time_ms: T0,
                    delegation_depth: 1,
                    agent_preset: None,
                },
            )
            .unwrap();
    }
    store.close().unwrap();
}

/// A copy of a sample store's bytes, and a scratch path beside it.
fn pristine_bytes(dir: &tempfile::TempDir) -> (Vec<u8>, PathBuf) {
    let pristine = dir.path().join("pristine.lineage");
    sample_store(&pristine);
    (
        std::fs::read(&pristine).unwrap(),
        dir.path().join("work.lineage"),
    )
}

#[test]
fn truncated_files_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, work) = pristine_bytes(&dir);
    let len = bytes.len();
    let mut panics = Vec::new();
    let mut cuts = vec![
        1,
        7,
        64,
        511,
        512,
        4095,
        4096,
        4097,
        len / 3,
        len / 2,
        len - 1,
    ];
    cuts.extend((1..8).map(|k| k * len / 8));
    for cut in cuts {
        std::fs::write(&work, &bytes[..cut]).unwrap();
        panics.extend(poke(&work, &format!("truncated to {cut} of {len} bytes")));
    }
    assert!(panics.is_empty(), "the store panicked on: {panics:#?}");
}

#[test]
fn garbled_files_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, work) = pristine_bytes(&dir);
    let len = bytes.len();
    let mut panics = Vec::new();
    let mut rng = SplitMix64::new(2024);
    for round in 0..24 {
        let mut garbled = bytes.clone();
        let start = rng.below(len as u64) as usize;
        let span = (rng.between(1, 2048) as usize).min(len - start);
        for b in &mut garbled[start..start + span] {
            *b = rng.next_u64() as u8;
        }
        std::fs::write(&work, &garbled).unwrap();
        panics.extend(poke(
            &work,
            &format!("round {round}: {span} random bytes at {start}"),
        ));
    }
    for round in 0..16 {
        let mut flipped = bytes.clone();
        let at = rng.below(len as u64) as usize;
        flipped[at] ^= 1 << rng.below(8);
        std::fs::write(&work, &flipped).unwrap();
        panics.extend(poke(&work, &format!("flip {round}: one bit at {at}")));
    }
    assert!(panics.is_empty(), "the store panicked on: {panics:#?}");
}

/// Files on which the storage engine panicked where the store did not contain it: reading a
/// session row to create one, committing on the writer thread, closing the file at drop.
#[test]
fn the_fuzzers_damaged_files_never_panic() {
    let found = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions/open_store");
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work.lineage");
    let mut panics = Vec::new();
    let mut files = 0;
    for entry in std::fs::read_dir(&found).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), &work).unwrap();
        panics.extend(poke(&work, &entry.file_name().to_string_lossy()));
        files += 1;
    }
    assert!(files >= 3, "the regressions are at {}", found.display());
    assert!(panics.is_empty(), "the store panicked on: {panics:#?}");
}

// ---------------------------------------------------------------------------------------------
// Caches that disagree with the log: `verify` rebuilds them and names each difference.

/// The problems `verify` reports for `session`.
fn problems_of(store: &Store, session: SessionId) -> Vec<Problem> {
    store
        .verify()
        .unwrap()
        .sessions
        .into_iter()
        .find(|s| s.session == session)
        .map(|s| s.problems)
        .unwrap_or_default()
}

/// `log` as one stored block value.
fn block_of(log: &[Event]) -> Vec<u8> {
    let mut records = Vec::new();
    lineage_log::Encoder::new().encode_all(log, &mut records);
    packed_block(log.len() as u32, digest_of(log), &records)
}

#[test]
fn verify_names_a_missing_or_stray_children_index_and_a_stale_header_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.lineage");
    let (parent, parent_header) = fresh();
    let (other, other_header) = fresh();
    let child = SessionId::new();
    let stray = SessionId::new();
    {
        let store = Store::open(&path).unwrap();
        store.import(parent_header, &completed_turns(2)).unwrap();
        store.import(other_header, &completed_turns(1)).unwrap();
        store
            .fork(
                parent,
                &ForkSpec {
                    child,
                    boundary: Some(5),
                    time_ms: T0,
                    delegation_depth: 1,
                    agent_preset: None,
                },
            )
            .unwrap();
        assert_intact(&store.verify().unwrap());
        store.close().unwrap();
    }
    {
        let db = raw_db(&path);
        let txn = db.begin_write().unwrap();
        {
            let mut children = txn.open_table(CHILDREN).unwrap();
            children
                .remove((parent.as_u128(), child.as_u128()))
                .unwrap();
            children
                .insert((other.as_u128(), stray.as_u128()), ())
                .unwrap();
        }
        txn.commit().unwrap();
    }
    rewrite_row(&path, other, |r| r.header.delegation_depth = 3);

    let store = Store::open_read_only(&path).unwrap();
    assert_eq!(
        problems_of(&store, child),
        vec![Problem::MissingChildIndex { parent }]
    );
    let problems = problems_of(&store, other);
    assert!(
        problems.contains(&Problem::StrayChildIndex { child: stray }),
        "{problems:?}"
    );
    assert!(
        problems.iter().any(|p| matches!(
            p,
            Problem::HeaderMismatch { field: "delegation_depth", stored, folded }
                if stored == "3" && folded == "0"
        )),
        "{problems:?}"
    );
    assert!(problems_of(&store, parent).is_empty());
    assert_eq!(
        store.children(parent).unwrap(),
        Vec::<SessionId>::new(),
        "the index is what it is"
    );
}

#[test]
fn a_missing_block_is_a_seq_gap_for_verify_and_a_corrupt_block_for_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.lineage");
    let (id, header) = fresh();
    let log = completed_turns(3);
    {
        let store = Store::open(&path).unwrap();
        store.create(header).unwrap();
        for turn in log.chunks(6) {
            store.append(id, turn).unwrap();
        }
        store.close().unwrap();
    }
    {
        let db = raw_db(&path);
        let txn = db.begin_write().unwrap();
        txn.open_table(EVENTS)
            .unwrap()
            .remove((id.as_u128(), 6))
            .unwrap();
        txn.commit().unwrap();
    }
    let store = Store::open(&path).unwrap();
    let problems = problems_of(&store, id);
    assert!(
        problems.contains(&Problem::SeqGap {
            expected: 6,
            found: 12
        }),
        "{problems:?}"
    );
    match store.load(id) {
        Err(StoreError::CorruptBlock {
            session,
            first_seq: 12,
            last_seq: 17,
            ..
        }) => assert_eq!(session, id),
        other => panic!("expected CorruptBlock 12..=17, got {other:?}"),
    }
}

#[test]
fn a_row_that_disagrees_with_its_blocks_is_named_by_verify_and_refused_by_load() {
    for damage in ["length", "head"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions.lineage");
        let (id, header) = fresh();
        {
            let store = Store::open(&path).unwrap();
            store.import(header, &completed_turns(2)).unwrap();
            store.close().unwrap();
        }
        rewrite_row(&path, id, |r| match damage {
            "length" => r.next_seq += 1,
            _ => r.head = digest_of(&completed_turns(1)),
        });
        let store = Store::open(&path).unwrap();
        let problems = problems_of(&store, id);
        assert!(
            problems
                .iter()
                .any(|p| matches!(p, Problem::HeadMismatch { .. })),
            "{damage}: {problems:?}"
        );
        match store.load(id) {
            Err(StoreError::CorruptHeader { session, .. }) => assert_eq!(session, id),
            other => panic!("{damage}: expected CorruptHeader, got {other:?}"),
        }
    }
}

#[test]
fn verify_names_a_child_whose_inherited_prefix_is_not_its_parents() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sessions.lineage");
    let (parent, header) = fresh();
    let child = SessionId::new();
    {
        let store = Store::open(&path).unwrap();
        store.import(header, &completed_turns(1)).unwrap();
        store
            .fork(
                parent,
                &ForkSpec {
                    child,
                    boundary: None,
                    time_ms: T0,
                    delegation_depth: 0,
                    agent_preset: None,
                },
            )
            .unwrap();
        store.close().unwrap();
    }
    // The parent's history is replaced by a different, self-consistent one.
    let rewritten = completed_turn(1, 0, "a different question");
    {
        let db = raw_db(&path);
        let txn = db.begin_write().unwrap();
        txn.open_table(EVENTS)
            .unwrap()
            .insert((parent.as_u128(), 0), block_of(&rewritten).as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    rewrite_row(&path, parent, |r| r.head = digest_of(&rewritten));

    let store = Store::open(&path).unwrap();
    assert!(
        problems_of(&store, parent).is_empty(),
        "the parent is consistent"
    );
    assert_eq!(
        problems_of(&store, child),
        vec![Problem::SeedDigestMismatch {
            parent,
            seed_len: 6
        }]
    );
    assert_eq!(store.load(parent).unwrap().events, rewritten);
}
