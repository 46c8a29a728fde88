//! The store's contract, operation by operation: lazy create, append, load and inspect, read_from,
//! the children index, fork, stats, read-only and exclusive opens, foreign files and formats.

mod common;

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use lineage_log::{
    Event, EventBody, EventKind, FORMAT_VERSION, ForkSpec, Header, LogError, SessionId,
    SessionLineage, encode_record, fork_session, interrupted_turn_closers, put_varint,
};
use lineage_store::{
    KindStats, Problem, STORE_FORMAT_VERSION, SessionInfo, Store, StoreError, StoreOptions,
};
use lineage_testkit::ev::fork_spec;
use lineage_testkit::{SplitMix64, balanced_cuts, ev, realistic_session};
use lineage_testkit::{TurnStream, last_turn};
use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata};

/// Everything a reader can observe of one session and of the store's listing.
#[derive(Debug, PartialEq)]
struct Snapshot {
    info: SessionInfo,
    events: Vec<Event>,
    list: Vec<SessionInfo>,
}

fn snapshot(store: &Store, session: SessionId) -> Snapshot {
    Snapshot {
        info: store.info(session).expect("the session is stored"),
        events: store.read_from(session, 0).expect("the session reads"),
        list: store.list().expect("the store lists"),
    }
}

fn spec(child: SessionId, boundary: Option<u64>) -> ForkSpec {
    fork_spec(child, boundary, T0 + 5_000, 0)
}

fn store_file(dir: &tempfile::TempDir) -> std::path::PathBuf {
    store_location(dir.path())
}

fn assert_unknown<T: std::fmt::Debug>(result: Result<T, StoreError>, id: SessionId) {
    match result {
        Err(StoreError::UnknownSession { session }) => assert_eq!(session, id),
        other => panic!("expected UnknownSession for {id}, got {other:?}"),
    }
}

fn assert_read_only<T: std::fmt::Debug>(result: Result<T, StoreError>) {
    match result {
        Err(StoreError::ReadOnly) => {}
        other => panic!("expected ReadOnly, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Lazy create and the first append.

#[test]
fn create_writes_nothing_until_the_first_append() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_file(&dir);
    let store = Store::open(&path).unwrap();
    let (id, header) = fresh();
    store.create(header.clone()).unwrap();

    assert!(
        store.list().unwrap().is_empty(),
        "a created session is not listed"
    );
    assert_unknown(store.load(id), id);
    assert_unknown(store.inspect(id), id);
    assert_unknown(store.read_from(id, 0), id);
    assert_unknown(store.info(id), id);
    assert!(matches!(
        store.create(header.clone()),
        Err(StoreError::SessionExists { session }) if session == id
    ));
    assert_eq!(store.stats().unwrap().sessions, 0);
    store.close().unwrap();

    assert_eq!(
        raw_counts(&path),
        (0, 0),
        "the file holds no session row and no block"
    );
    // The registration lived only in the closed handle: a reopened store has never heard of it.
    let store = Store::open(&path).unwrap();
    assert!(store.list().unwrap().is_empty());
    assert_unknown(store.load(id), id);
    store.create(header).unwrap();
}

#[test]
fn first_append_writes_the_header_and_the_batch_together() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_file(&dir);
    let store = Store::open(&path).unwrap();
    let (id, header) = fresh();
    store.create(header.clone()).unwrap();
    let batch = completed_turn(1, 0, "hello");
    store.append(id, &batch).unwrap();

    let expected = SessionInfo {
        header: header.clone(),
        len: 6,
        head: digest_of(&batch),
        revision: 1,
    };
    assert_eq!(store.list().unwrap(), vec![expected.clone()]);
    assert_eq!(store.read_from(id, 0).unwrap(), batch);
    store.close().unwrap();
    assert_eq!(raw_counts(&path), (1, 1), "one row and one block");

    let store = Store::open(&path).unwrap();
    assert_eq!(store.list().unwrap(), vec![expected]);
    let inspected = store.inspect(id).unwrap();
    assert_eq!(inspected.header, header);
    assert_eq!(inspected.events, batch);
    assert_eq!(inspected.closers, 0);
}

#[test]
fn append_to_a_session_never_created_is_refused() {
    let store = mem_store();
    let id = SessionId::new();
    assert_unknown(store.append(id, &completed_turn(1, 0, "x")), id);
    assert!(store.list().unwrap().is_empty());
}

#[test]
fn create_refuses_a_header_of_another_format_or_with_a_relative_cwd() {
    let store = mem_store();
    let (id, mut newer) = fresh();
    newer.format_version = FORMAT_VERSION + 1;
    match store.create(newer) {
        Err(StoreError::NewerFormat {
            what,
            found,
            supported,
        }) => {
            assert!(what.contains(&id.to_string()), "{what}");
            assert_eq!((found, supported), (FORMAT_VERSION + 1, FORMAT_VERSION));
        }
        other => panic!("expected NewerFormat, got {other:?}"),
    }
    let (id, relative) = (SessionId::new(), Header::new(SessionId::new(), T0));
    let relative = Header {
        id,
        ..relative.with_cwd("relative/dir")
    };
    match store.create(relative) {
        Err(StoreError::Rejected {
            session,
            source: LogError::InvalidHeader { field: "cwd", .. },
        }) => assert_eq!(session, id),
        other => panic!("expected Rejected(InvalidHeader cwd), got {other:?}"),
    }
    // Neither refusal registered the id.
    store.create(header(id)).unwrap();
}

#[test]
fn import_writes_a_valid_seed_and_refuses_an_invalid_one() {
    let store = mem_store();
    let (id, header) = fresh();
    let seed = open_turn_log();
    store.import(header.clone(), &seed).unwrap();
    assert_eq!(store.read_from(id, 0).unwrap(), seed);

    let (bad, bad_header) = fresh();
    let mut broken = completed_turns(2);
    broken[7].seq = 70;
    match store.import(bad_header, &broken) {
        Err(StoreError::InvalidSeed { session, index, .. }) => {
            assert_eq!((session, index), (bad, 7));
        }
        other => panic!("expected InvalidSeed, got {other:?}"),
    }
    assert_unknown(store.info(bad), bad);
    assert!(matches!(
        store.import(header, &seed),
        Err(StoreError::SessionExists { session }) if session == id
    ));
}

// ---------------------------------------------------------------------------------------------
// Append refusals.

#[test]
fn append_that_does_not_continue_at_the_next_seq_is_refused_and_changes_nothing() {
    let store = mem_store();
    let (id, header) = fresh();
    store.create(header).unwrap();
    store.append(id, &completed_turn(1, 0, "first")).unwrap();
    let before = snapshot(&store, id);

    let next = completed_turn(2, 6, "second");
    let mut internal_gap = next.clone();
    internal_gap[3].seq = 10;
    let mut duplicate = next.clone();
    duplicate[2].seq = 7;
    let cases: Vec<(&str, Vec<Event>, usize, u64, u64)> = vec![
        ("re-append", completed_turn(2, 0, "again"), 0, 6, 0),
        ("gap", completed_turn(2, 7, "gap"), 0, 6, 7),
        ("internal gap", internal_gap, 3, 9, 10),
        ("duplicate seq", duplicate, 2, 8, 7),
    ];
    for (what, batch, index, expected, got) in cases {
        match store.append(id, &batch) {
            Err(StoreError::SeqMismatch {
                session,
                index: i,
                expected: e,
                got: g,
            }) => {
                assert_eq!(session, id, "{what}");
                assert_eq!((i, e, g), (index, expected, got), "{what}");
            }
            other => panic!("{what}: expected SeqMismatch, got {other:?}"),
        }
        assert_eq!(snapshot(&store, id), before, "{what} changed the store");
    }
    // The refusals left the writer's view of the session intact: the right batch still fits.
    store.append(id, &next).unwrap();
    let after = store.info(id).unwrap();
    assert_eq!((after.len, after.revision), (12, before.info.revision + 1));
}

#[test]
fn first_append_must_start_at_seq_zero() {
    let store = mem_store();
    let (id, header) = fresh();
    store.create(header).unwrap();
    match store.append(id, &completed_turn(1, 1, "late")) {
        Err(StoreError::SeqMismatch {
            session,
            index: 0,
            expected: 0,
            got: 1,
        }) => assert_eq!(session, id),
        other => panic!("expected SeqMismatch at 0, got {other:?}"),
    }
    assert!(store.list().unwrap().is_empty());
    store.append(id, &completed_turn(1, 0, "on time")).unwrap();
}

#[test]
fn batch_with_an_invalid_event_is_refused_whole() {
    let store = mem_store();
    let (id, header) = fresh();
    store.create(header).unwrap();
    store.append(id, &completed_turn(1, 0, "first")).unwrap();
    let before = snapshot(&store, id);

    let cases: Vec<(&str, Vec<EventBody>, u64, EventKind)> = vec![
        (
            "turn numbers skip",
            vec![ev::turn_start(3)],
            6,
            EventKind::TurnStart,
        ),
        (
            "turn closes with its step open",
            vec![
                ev::turn_start(2),
                ev::step_start(2, 1),
                ev::turn_completed(2),
            ],
            8,
            EventKind::TurnEnd,
        ),
        (
            "result for a call never made",
            vec![
                ev::turn_start(2),
                ev::step_start(2, 1),
                ev::tool_result(2, 1, mid(8, 9), "nobody-called", "output"),
            ],
            8,
            EventKind::ToolResult,
        ),
        (
            "step outside any turn",
            vec![ev::user(mid(6, 9), "between turns"), ev::step_start(2, 1)],
            7,
            EventKind::StepStart,
        ),
        (
            "custom payload that JSON cannot carry",
            vec![
                ev::user(mid(6, 9), "between turns"),
                EventBody::from(lineage_log::Custom {
                    type_name: "budget/spent".into(),
                    payload: r#"{"cents": NaN}"#.into(),
                    ignorable: true,
                }),
            ],
            7,
            EventKind::Custom,
        ),
    ];
    for (what, bodies, bad_seq, bad_kind) in cases {
        match store.append(id, &events_from(6, bodies)) {
            Err(StoreError::Rejected {
                session,
                source: LogError::InvalidEvent { seq, kind, .. },
            }) => {
                assert_eq!(session, id, "{what}");
                assert_eq!((seq, kind), (bad_seq, bad_kind), "{what}");
            }
            other => panic!("{what}: expected Rejected(InvalidEvent), got {other:?}"),
        }
        assert_eq!(snapshot(&store, id), before, "{what} changed the store");
    }
    // None of the valid leading events of the refused batches was admitted: turn 2 opens now.
    store
        .append(id, &events_from(6, vec![ev::turn_start(2)]))
        .unwrap();
    assert_eq!(store.info(id).unwrap().len, 7);
}

#[test]
fn empty_batch_is_a_no_op() {
    let store = mem_store();
    let (id, header) = fresh();
    store.create(header).unwrap();
    store.append(id, &[]).unwrap();
    store.admit(id, &[]).unwrap();
    store.flush(id).unwrap();
    assert!(
        store.list().unwrap().is_empty(),
        "an empty batch writes no session row"
    );

    store.append(id, &completed_turn(1, 0, "x")).unwrap();
    let before = snapshot(&store, id);
    store.append(id, &[]).unwrap();
    assert_eq!(snapshot(&store, id), before);
}

// ---------------------------------------------------------------------------------------------
// Load, inspect, read_from.

#[test]
fn load_appends_the_closers_of_an_open_turn_durably() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_file(&dir);
    let log = open_turn_log();
    let closers = interrupted_turn_closers(&log);
    assert_eq!(
        closers.len(),
        4,
        "two synthetic results, step/end, turn/end"
    );
    let mut balanced = log.clone();
    balanced.extend(closers.clone());

    // `warm` is loaded by the handle that wrote it; `cold` only after a reopen.
    let (warm, warm_header) = fresh();
    let (cold, cold_header) = fresh();
    let store = Store::open(&path).unwrap();
    store.import(warm_header.clone(), &log).unwrap();
    store.import(cold_header.clone(), &log).unwrap();
    let revision = store.info(warm).unwrap().revision;

    let loaded = store.load(warm).unwrap();
    assert_eq!(loaded.closers, 4);
    assert_eq!(loaded.events, balanced);
    assert_eq!(loaded.header, warm_header);
    let info = store.info(warm).unwrap();
    assert_eq!(info.len, 15);
    assert_eq!(info.revision, revision + 1, "the repair is one commit");
    assert_eq!(info.head, digest_of(&balanced));
    store.close().unwrap();

    let store = Store::open(&path).unwrap();
    let reopened = store.inspect(warm).unwrap();
    assert_eq!(
        (reopened.events, reopened.closers),
        (balanced.clone(), 0),
        "the closers were durable"
    );

    let loaded = store.load(cold).unwrap();
    assert_eq!(
        (loaded.events.clone(), loaded.closers),
        (balanced.clone(), 4)
    );
    assert_eq!(store.info(cold).unwrap().revision, revision + 1);
    assert_eq!(store.read_from(cold, 0).unwrap(), balanced);

    for id in [warm, cold] {
        // A balanced log loads without writing.
        let before = store.info(id).unwrap();
        let again = store.load(id).unwrap();
        assert_eq!((again.events, again.closers), (balanced.clone(), 0));
        assert_eq!(store.info(id).unwrap(), before);
        // The next append continues after the closers.
        match store.append(id, &completed_turn(3, 11, "stale")) {
            Err(StoreError::SeqMismatch {
                expected: 15,
                got: 11,
                ..
            }) => {}
            other => panic!("expected SeqMismatch 15/11, got {other:?}"),
        }
        store.append(id, &completed_turn(3, 15, "third")).unwrap();
        assert_eq!(store.info(id).unwrap().len, 21);
    }
    let report = store.verify().unwrap();
    assert_intact(&report);
    assert!(report.sessions.iter().all(|s| s.open_turn.is_none()));
}

#[test]
fn inspect_balances_in_memory_and_leaves_the_store_untouched() {
    let store = mem_store();
    let (id, header) = fresh();
    let log = open_turn_log();
    store.import(header.clone(), &log).unwrap();
    let before = snapshot(&store, id);
    let mut balanced = log.clone();
    balanced.extend(interrupted_turn_closers(&log));

    let inspected = store.inspect(id).unwrap();
    assert_eq!(inspected.header, header);
    assert_eq!(inspected.events, balanced);
    assert_eq!(inspected.closers, 4);
    assert_eq!(
        store.inspect(id).unwrap(),
        inspected,
        "inspect is repeatable"
    );
    assert_eq!(snapshot(&store, id), before, "inspect wrote nothing");
    assert_eq!(store.verify().unwrap().sessions[0].open_turn, Some(2));

    // The stored log still ends mid-turn: the next event continues at the stored length.
    let result = events_from(
        11,
        vec![ev::tool_result(2, 1, mid(11, 1), "c1", "found it")],
    );
    store.append(id, &result).unwrap();
    let loaded = store.load(id).unwrap();
    assert_eq!(
        loaded.closers, 3,
        "c2 not started, step/end, turn/end: c1 has its result"
    );
}

#[test]
fn load_then_inspect_give_the_same_balanced_view() {
    let store = mem_store();
    let (id, header) = fresh();
    store.import(header, &open_turn_log()).unwrap();
    let inspected = store.inspect(id).unwrap();
    let loaded = store.load(id).unwrap();
    assert_eq!(loaded, inspected);
    let after = store.inspect(id).unwrap();
    assert_eq!(after.events, loaded.events);
    assert_eq!(after.closers, 0);
}

#[test]
fn read_from_returns_exactly_the_stored_suffix_for_every_k() {
    let store = mem_store_with(small_blocks(5));
    let (id, header) = fresh();
    store.create(header).unwrap();
    let mut log = realistic_session(7, 150);
    let n = log.len() as u64;
    let turn = last_turn(&log) + 1;
    log.extend(events_from(
        n,
        vec![
            ev::turn_start(turn),
            ev::step_start(turn, 1),
            ev::user(mid(n, 1), "open"),
        ],
    ));
    let mut start = 0;
    for size in [1, 7, 13, 2, 40, 5].into_iter().cycle() {
        if start == log.len() {
            break;
        }
        let end = (start + size).min(log.len());
        store.append(id, &log[start..end]).unwrap();
        start = end;
    }
    let revision = store.info(id).unwrap().revision;
    let len = log.len() as u64;
    for k in 0..=len + 1 {
        let from = (k as usize).min(log.len());
        assert_eq!(
            store.read_from(id, k).unwrap(),
            log[from..],
            "read_from({k})"
        );
    }
    assert!(store.read_from(id, u64::MAX).unwrap().is_empty());
    assert_eq!(
        store.info(id).unwrap().revision,
        revision,
        "read_from repairs nothing"
    );
}

#[test]
fn read_from_an_unknown_session_names_it() {
    let store = mem_store();
    let id = SessionId::new();
    assert_unknown(store.read_from(id, 0), id);
}

// ---------------------------------------------------------------------------------------------
// Children and forks.

#[test]
fn children_and_descendants_follow_the_forks() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_file(&dir);
    let store = Store::open(&path).unwrap();
    let (root, header) = fresh();
    store.import(header, &completed_turns(3)).unwrap();
    let (a, b, aa) = (SessionId::new(), SessionId::new(), SessionId::new());
    store.fork(root, &spec(a, Some(5))).unwrap();
    store.fork(root, &spec(b, None)).unwrap();
    store.fork(a, &spec(aa, None)).unwrap();
    store.close().unwrap();

    let store = Store::open(&path).unwrap();
    assert_eq!(store.children(root).unwrap(), vec![a, b]);
    assert_eq!(store.children(a).unwrap(), vec![aa]);
    assert!(store.children(b).unwrap().is_empty());
    assert!(store.children(aa).unwrap().is_empty());
    assert!(store.children(SessionId::new()).unwrap().is_empty());
    assert_eq!(
        store.descendants(root).unwrap(),
        vec![a, b, aa],
        "breadth first"
    );
    assert_eq!(store.descendants(a).unwrap(), vec![aa]);
    assert!(store.descendants(aa).unwrap().is_empty());
    assert_eq!(store.list().unwrap().len(), 4);
    assert_intact(&store.verify().unwrap());
}

#[test]
fn fork_refuses_a_boundary_inside_an_open_turn() {
    let store = mem_store();
    let (parent, header) = fresh();
    store.import(header, &open_turn_log()).unwrap();
    let before = snapshot(&store, parent);
    let child = SessionId::new();
    for (boundary, named) in [(Some(6), 6), (Some(7), 7), (Some(10), 10), (None, 10)] {
        match store.fork(parent, &spec(child, boundary)) {
            Err(StoreError::Rejected {
                session,
                source: LogError::OpenTurn { boundary: b, turn },
            }) => {
                assert_eq!(session, parent);
                assert_eq!((b, turn), (named, 2), "boundary {boundary:?}");
            }
            other => panic!("boundary {boundary:?}: expected OpenTurn, got {other:?}"),
        }
        assert_eq!(snapshot(&store, parent), before);
        assert!(store.children(parent).unwrap().is_empty());
        assert_unknown(store.info(child), child);
    }
    // Nothing was registered: the same child id forks at the completed turn.
    let header = store.fork(parent, &spec(child, Some(5))).unwrap();
    assert_eq!(header.seed_len, 6);
}

#[test]
fn fork_refuses_a_boundary_past_the_end() {
    let store = mem_store();
    let (parent, header) = fresh();
    store.import(header, &completed_turns(2)).unwrap();
    let before = snapshot(&store, parent);
    let child = SessionId::new();
    for boundary in [12, 13, u64::MAX] {
        match store.fork(parent, &spec(child, Some(boundary))) {
            Err(StoreError::Rejected {
                session,
                source: LogError::InvalidBoundary { boundary: b, len },
            }) => {
                assert_eq!(session, parent);
                assert_eq!((b, len), (boundary, 12));
            }
            other => panic!("boundary {boundary}: expected InvalidBoundary, got {other:?}"),
        }
    }
    assert_eq!(snapshot(&store, parent), before);
    assert_unknown(store.info(child), child);
    assert!(store.children(parent).unwrap().is_empty());
}

#[test]
fn fork_refuses_a_taken_child_id_before_looking_at_the_boundary() {
    let store = mem_store();
    let (parent, header) = fresh();
    store.import(header, &completed_turns(2)).unwrap();
    let (stored, stored_header) = fresh();
    store.import(stored_header, &completed_turns(1)).unwrap();
    let (created, created_header) = fresh();
    store.create(created_header).unwrap();
    let before = snapshot(&store, parent);
    for taken in [stored, created, parent] {
        // The boundary is past the end too; the taken id is what is reported.
        match store.fork(parent, &spec(taken, Some(99))) {
            Err(StoreError::SessionExists { session }) => assert_eq!(session, taken),
            other => panic!("expected SessionExists for {taken}, got {other:?}"),
        }
    }
    assert_eq!(snapshot(&store, parent), before);
    assert_eq!(
        store.read_from(stored, 0).unwrap(),
        completed_turns(1),
        "the taken session is untouched"
    );
}

#[test]
fn fork_of_an_unknown_parent_is_refused() {
    let store = mem_store();
    let parent = SessionId::new();
    let child = SessionId::new();
    assert_unknown(store.fork(parent, &spec(child, None)), parent);
    assert_unknown(store.info(child), child);
}

#[test]
fn fork_copies_the_prefix_verbatim_then_writes_session_lineage() {
    let store = mem_store_with(small_blocks(16));
    let (parent, parent_header) = fresh();
    store.create(parent_header.clone()).unwrap();
    let mut log = realistic_session(11, 400);
    let n = log.len() as u64;
    let turn = last_turn(&log) + 1;
    log.extend(events_from(n, vec![ev::turn_start(turn)]));
    for batch in log.chunks(37) {
        store.append(parent, batch).unwrap();
    }
    let before = snapshot(&store, parent);

    let cuts: Vec<usize> = balanced_cuts(&log).into_iter().filter(|&k| k > 0).collect();
    let picks = [cuts[0], cuts[cuts.len() / 2], cuts[cuts.len() - 1]];
    for seed_len in picks {
        let child = SessionId::new();
        let spec = fork_spec(child, Some(seed_len as u64 - 1), T0 + 77, 2);
        let header = store.fork(parent, &spec).unwrap();
        let expected = fork_session(&parent_header, &log, &spec).unwrap();
        assert_eq!(header, expected.header, "seed_len {seed_len}");

        let seed_digest = digest_of(&log[..seed_len]);
        assert_eq!(header.parent, Some(parent));
        assert_eq!(header.seed_len, seed_len as u64);
        assert_eq!(header.seed_digest, Some(seed_digest));
        assert_eq!(header.delegation_depth, 2);
        assert_eq!(header.cwd, parent_header.cwd);
        assert_eq!(header.created_at_ms, T0 + 77);

        let child_log = store.inspect(child).unwrap();
        assert_eq!(child_log.closers, 0);
        assert_eq!(child_log.header, header);
        assert_eq!(
            child_log.events[..seed_len],
            log[..seed_len],
            "verbatim prefix"
        );
        assert_eq!(
            child_log.events[seed_len],
            Event::new(
                seed_len as u64,
                (T0 + 77) as i64,
                SessionLineage {
                    parent,
                    seed_len: seed_len as u64,
                    seed_digest,
                    delegation_depth: 2,
                }
            )
        );
        assert_eq!(child_log.events, expected.events);
        let info = store.info(child).unwrap();
        assert_eq!(info.len, seed_len as u64 + 1);
        assert_eq!(info.head, digest_of(&expected.events));
        assert_eq!(info.revision, 1);
    }
    assert_eq!(
        snapshot(&store, parent).info,
        before.info,
        "parent untouched"
    );
    assert_eq!(snapshot(&store, parent).events, before.events);
    assert_intact(&store.verify().unwrap());
}

#[test]
fn a_forked_child_continues_its_turns_after_the_lineage_event() {
    let store = mem_store();
    let (parent, header) = fresh();
    store.import(header, &completed_turns(2)).unwrap();
    let child = SessionId::new();
    store.fork(parent, &spec(child, None)).unwrap();
    assert_eq!(store.info(child).unwrap().len, 13);
    match store.append(child, &completed_turn(1, 13, "restart numbering")) {
        Err(StoreError::Rejected {
            source: LogError::InvalidEvent { seq: 13, .. },
            ..
        }) => {}
        other => panic!("expected turn numbering to continue at 3, got {other:?}"),
    }
    store
        .append(child, &completed_turn(3, 13, "third"))
        .unwrap();
    let loaded = store.load(child).unwrap();
    assert_eq!(loaded.events.len(), 19);
    assert_eq!(store.read_from(parent, 0).unwrap(), completed_turns(2));
    assert_intact(&store.verify().unwrap());
}

// ---------------------------------------------------------------------------------------------
// Stats.

#[test]
fn stats_count_sessions_events_blocks_and_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_file(&dir);
    let store = Store::open(&path).unwrap();
    let (a, a_header) = fresh();
    let (b, b_header) = fresh();
    let (c, c_header) = fresh();
    let a_log = completed_turns(2);
    store.create(a_header).unwrap();
    store.append(a, &a_log[..6]).unwrap();
    store.append(a, &a_log[6..]).unwrap();
    store.import(b_header, &open_turn_log()).unwrap();
    store.create(c_header).unwrap();
    let _ = c;

    let all: Vec<Event> = a_log
        .iter()
        .chain(open_turn_log().iter())
        .cloned()
        .collect();
    let mut by_kind = std::collections::BTreeMap::<EventKind, KindStats>::new();
    for event in &all {
        let slot = by_kind.entry(event.kind()).or_default();
        slot.events += 1;
        slot.bytes += encode_record(event).len() as u64;
    }
    let record_bytes: u64 = by_kind.values().map(|k| k.bytes).sum();
    let stats = store.stats().unwrap();
    assert_eq!(
        stats.sessions, 2,
        "a created, unwritten session is not counted"
    );
    assert_eq!(stats.events, 23);
    assert_eq!(stats.blocks, 3, "one block per committed append");
    assert_eq!(stats.record_bytes, record_bytes);
    // Stored blocks are packed: headers, a body byte each, records in less room than their own.
    assert!(
        stats.block_bytes > 3 * (BLOCK_HEADER_LEN as u64 + 1)
            && stats.block_bytes < record_bytes + 3 * (BLOCK_HEADER_LEN as u64 + 1),
        "{} stored bytes for {record_bytes} record bytes",
        stats.block_bytes
    );
    assert_eq!(stats.by_kind, by_kind);
    assert_eq!(stats.file_bytes, file_len(&path));
    let _ = b;

    let memory = mem_store();
    assert_eq!(memory.stats().unwrap().file_bytes, None);
    assert_eq!(memory.stats().unwrap().events, 0);
}

// ---------------------------------------------------------------------------------------------
// Read-only and exclusive opens.

#[test]
fn a_read_only_handle_refuses_writes_and_serves_reads() {
    let dir = tempfile::tempdir().unwrap();
    let log = open_turn_log();
    let (path, header) = closed_store_with(dir.path(), &log);
    let id = header.id;
    let bytes_before = store_contents(&path);

    let store = Store::open_read_only(&path).unwrap();
    assert!(store.is_read_only());
    let (other, other_header) = fresh();
    assert_read_only(store.create(other_header.clone()));
    assert_read_only(store.import(other_header, &completed_turns(1)));
    assert_read_only(store.append(id, &completed_turn(3, 11, "x")));
    assert_read_only(store.admit(id, &completed_turn(3, 11, "x")));
    assert_read_only(store.load(id));

    assert_eq!(store.list().unwrap().len(), 1);
    assert_eq!(store.read_from(id, 0).unwrap(), log);
    let inspected = store.inspect(id).unwrap();
    assert_eq!((inspected.header, inspected.closers), (header, 4));
    assert_eq!(store.info(id).unwrap().len, 11);
    let report = store.verify().unwrap();
    assert_intact(&report);
    assert_eq!(report.sessions[0].open_turn, Some(2));
    assert_eq!(store.stats().unwrap().events, 11);
    assert!(store.children(id).unwrap().is_empty());
    assert_unknown(store.info(other), other);
    store.flush(id).unwrap();
    store.close().unwrap();
    assert_eq!(
        store_contents(&path),
        bytes_before,
        "a read-only handle wrote nothing"
    );
}

#[test]
fn fork_on_a_read_only_handle_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, header) = closed_store_with(dir.path(), &completed_turns(2));
    let parent = header.id;

    let store = Store::open_read_only(&path).unwrap();
    let child = SessionId::new();
    // On a separate thread with a deadline: a fork that waits for a writer that a read-only
    // handle does not have would never return.
    let (done, outcome) = mpsc::channel();
    let worker = store.clone();
    std::thread::spawn(move || {
        let _ = done.send(worker.fork(parent, &spec(child, None)));
    });
    match outcome.recv_timeout(Duration::from_secs(5)) {
        Ok(result) => assert_read_only(result),
        Err(_) => panic!("fork on a read-only store did not return within 5 s"),
    }
    assert_unknown(store.info(child), child);
}

#[test]
fn a_second_writable_open_of_the_same_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_file(&dir);
    let first = Store::open(&path).unwrap();
    for attempt in [
        Store::open(&path),
        Store::open_with(&path, StoreOptions::default()),
    ] {
        match attempt {
            Err(StoreError::AlreadyOpen { path: named }) => assert_eq!(named, path),
            other => panic!("expected AlreadyOpen, got {other:?}"),
        }
    }
    let (id, header) = fresh();
    first.import(header, &completed_turns(1)).unwrap();
    drop(first);
    let second = Store::open(&path).unwrap();
    assert_eq!(second.info(id).unwrap().len, 6);
}

// ---------------------------------------------------------------------------------------------
// Files that are not stores, and stores of other formats.

fn assert_not_a_store<T: std::fmt::Debug>(result: Result<T, StoreError>, path: &Path) {
    match result {
        Err(StoreError::NotAStore { path: named, .. }) => assert_eq!(named, path),
        other => panic!("expected NotAStore for {}, got {other:?}", path.display()),
    }
}

#[test]
fn a_file_of_random_bytes_is_not_a_store_and_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = SplitMix64::new(99);
    for (name, len) in [("large", 64 * 1024), ("small", 100), ("one page", 4096)] {
        let path = dir.path().join(name);
        let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        assert_not_a_store(Store::open(&path), &path);
        assert_not_a_store(Store::open_read_only(&path), &path);
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "{name}: file changed");
    }
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, b"just some notes\n").unwrap();
    assert_not_a_store(Store::open(&text), &text);
    assert_eq!(std::fs::read(&text).unwrap(), b"just some notes\n");
}

#[test]
fn a_redb_database_with_other_tables_is_not_a_store_and_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.redb");
    let other: redb::TableDefinition<u64, u64> = redb::TableDefinition::new("inventory");
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(other).unwrap().insert(1, 42).unwrap();
        txn.commit().unwrap();
    }
    assert_not_a_store(Store::open(&path), &path);
    assert_not_a_store(Store::open_read_only(&path), &path);
    let db = raw_db(&path);
    let txn = db.begin_read().unwrap();
    let table = txn.open_table(other).unwrap();
    assert_eq!(table.get(1).unwrap().unwrap().value(), 42);
    assert!(
        txn.open_table(META).is_err(),
        "no Lineage table was added to it"
    );
}

#[test]
fn a_redb_database_whose_meta_lacks_the_magic_is_not_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fake.redb");
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META)
            .unwrap()
            .insert(
                "format_version",
                STORE_FORMAT_VERSION.to_le_bytes().as_slice(),
            )
            .unwrap();
        txn.commit().unwrap();
    }
    assert_not_a_store(Store::open(&path), &path);
    assert_not_a_store(Store::open_read_only(&path), &path);
}

#[test]
fn an_empty_file_becomes_a_new_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_file(&dir);
    std::fs::write(&path, b"").unwrap();
    let store = Store::open(&path).unwrap();
    assert!(store.list().unwrap().is_empty());
    let id = store.store_id();
    drop(store);
    assert_eq!(Store::open_read_only(&path).unwrap().store_id(), id);
}

fn set_store_format(path: &Path, version: u32) {
    let db = raw_db(path);
    let txn = db.begin_write().unwrap();
    txn.open_table(META)
        .unwrap()
        .insert("format_version", version.to_le_bytes().as_slice())
        .unwrap();
    txn.commit().unwrap();
}

#[test]
fn a_store_of_a_newer_or_older_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, header) = closed_store_with(dir.path(), &completed_turns(1));
    let id = header.id;

    set_store_format(&path, STORE_FORMAT_VERSION + 1);
    for result in [
        Store::open(&path).map(drop),
        Store::open_read_only(&path).map(drop),
    ] {
        match result {
            Err(StoreError::NewerFormat {
                what,
                found,
                supported,
            }) => {
                assert!(what.contains(&path.display().to_string()), "{what}");
                assert_eq!(
                    (found, supported),
                    (STORE_FORMAT_VERSION + 1, STORE_FORMAT_VERSION)
                );
            }
            other => panic!("expected NewerFormat, got {other:?}"),
        }
    }
    // Format 1 opens read-only until it is upgraded (tests/upgrade.rs reads real ones).
    set_store_format(&path, 1);
    match Store::open(&path) {
        Err(StoreError::UpgradeRequired { store, found: 1 }) => {
            assert!(store.contains(&path.display().to_string()), "{store}");
        }
        other => panic!("expected UpgradeRequired, got {other:?}"),
    }
    assert!(Store::open_read_only(&path).unwrap().is_read_only());
    set_store_format(&path, 0);
    for result in [
        Store::open(&path).map(drop),
        Store::open_read_only(&path).map(drop),
    ] {
        match result {
            Err(StoreError::OlderFormat {
                found, supported, ..
            }) => {
                assert_eq!((found, supported), (0, STORE_FORMAT_VERSION));
            }
            other => panic!("expected OlderFormat, got {other:?}"),
        }
    }
    set_store_format(&path, STORE_FORMAT_VERSION);
    let store = Store::open(&path).unwrap();
    assert_eq!(store.read_from(id, 0).unwrap(), completed_turns(1));
}

#[test]
fn a_session_in_a_newer_or_older_log_format_is_refused_by_every_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_file(&dir);
    let (id, header) = fresh();
    let (fine, fine_header) = fresh();
    let store = Store::open(&path).unwrap();
    store.import(header, &completed_turns(1)).unwrap();
    store.import(fine_header, &completed_turns(1)).unwrap();
    store.close().unwrap();

    for version in [FORMAT_VERSION + 1, FORMAT_VERSION - 1] {
        rewrite_row(&path, id, |r| r.header.format_version = version);
        let store = Store::open(&path).unwrap();
        let results = [
            store.load(id).map(drop),
            store.inspect(id).map(drop),
            store.read_from(id, 0).map(drop),
            store.info(id).map(drop),
            store.append(id, &completed_turn(2, 6, "more")),
        ];
        for result in results {
            match result {
                Err(StoreError::NewerFormat { what, found, .. }) if version > FORMAT_VERSION => {
                    assert!(what.contains(&id.to_string()), "{what}");
                    assert_eq!(found, version);
                }
                Err(StoreError::OlderFormat { what, found, .. }) if version < FORMAT_VERSION => {
                    assert!(what.contains(&id.to_string()), "{what}");
                    assert_eq!(found, version);
                }
                other => panic!("format v{version}: expected a format refusal, got {other:?}"),
            }
        }
        assert_eq!(store.load(fine).unwrap().events, completed_turns(1));

        // verify cannot read the session either, and says so instead of passing it.
        let report = store.verify().unwrap();
        assert!(
            !report.is_ok(),
            "format v{version}: verify passed a session it cannot read"
        );
        let theirs = report.sessions.iter().find(|r| r.session == id).unwrap();
        assert_eq!(
            theirs.problems,
            vec![Problem::UnsupportedFormat {
                found: version,
                supported: FORMAT_VERSION
            }]
        );
        let ours = report.sessions.iter().find(|r| r.session == fine).unwrap();
        assert!(ours.problems.is_empty(), "{:?}", ours.problems);
    }
}

/// A hand-framed record: `tag` and `flags` outside a payload of `payload` bytes, at time 0.
fn raw_record(tag: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    put_varint(&mut body, u64::from(tag));
    body.push(flags);
    body.push(0); // time 0, zigzag-encoded
    body.extend_from_slice(payload);
    let mut record = Vec::new();
    put_varint(&mut record, body.len() as u64);
    record.extend_from_slice(&body);
    record
}

/// Appends one block holding `record` at the end of `session` in a closed store file, with its
/// digest and the session row updated as a writer of a newer build would.
fn append_raw_record(path: &Path, session: SessionId, stored: &[Event], record: &[u8]) {
    let mut chain = lineage_log::Chain::new();
    for event in stored {
        chain.update(&encode_record(event));
    }
    chain.update(record);
    let digest = chain.digest();
    let seq = stored.len() as u64;
    let block = packed_block(1, digest, record);
    {
        let db = raw_db(path);
        let txn = db.begin_write().unwrap();
        txn.open_table(EVENTS)
            .unwrap()
            .insert((session.as_u128(), seq), block.as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    rewrite_row(path, session, |r| {
        r.next_seq = seq + 1;
        r.head = digest;
        r.revision += 1;
    });
}

#[test]
fn a_record_of_an_unknown_kind_is_refused_unless_marked_ignorable() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_file(&dir);
    let (strict, strict_header) = fresh();
    let (lenient, lenient_header) = fresh();
    let log = completed_turns(1);
    let store = Store::open(&path).unwrap();
    store.import(strict_header, &log).unwrap();
    store.import(lenient_header, &log).unwrap();
    store.close().unwrap();
    append_raw_record(&path, strict, &log, &raw_record(4_000, 0, &[1, 2, 3]));
    let ignorable = raw_record(4_000, lineage_log::FLAG_IGNORABLE, &[1, 2, 3]);
    append_raw_record(&path, lenient, &log, &ignorable);

    let store = Store::open(&path).unwrap();
    for result in [
        store.load(strict).map(drop),
        store.inspect(strict).map(drop),
    ] {
        match result {
            Err(StoreError::UnsupportedRecord {
                session,
                source: LogError::UnknownKind { seq: 6, tag: 4_000 },
            }) => assert_eq!(session, strict),
            other => panic!("expected UnsupportedRecord, got {other:?}"),
        }
    }
    let loaded = store.load(lenient).unwrap();
    assert_eq!(loaded.events.len(), 7);
    assert_eq!(loaded.events[..6], log[..]);
    assert_eq!(loaded.events[6].kind(), EventKind::Opaque);
    assert_eq!(
        encode_record(&loaded.events[6]),
        ignorable,
        "kept byte for byte"
    );
    // An opaque record does not stop the session from growing.
    store
        .append(lenient, &completed_turn(2, 7, "after opaque"))
        .unwrap();
    let report = store.verify().unwrap();
    let lenient_report = report
        .sessions
        .iter()
        .find(|s| s.session == lenient)
        .unwrap();
    assert!(lenient_report.problems.is_empty(), "{lenient_report:?}");
    let strict_report = report
        .sessions
        .iter()
        .find(|s| s.session == strict)
        .unwrap();
    assert!(
        !strict_report.problems.is_empty(),
        "verify names the unreadable record"
    );
    // Stats frame records without decoding them: both records of the unknown tag count as opaque.
    assert_eq!(store.stats().unwrap().by_kind[&EventKind::Opaque].events, 2);
}

#[test]
fn the_file_holds_one_row_per_session_and_the_children_index_per_fork() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_file(&dir);
    let (parent, header) = fresh();
    let child = SessionId::new();
    let store = Store::open(&path).unwrap();
    store.import(header, &completed_turns(2)).unwrap();
    store.fork(parent, &spec(child, Some(5))).unwrap();
    store.close().unwrap();
    let db = raw_db(&path);
    let txn = db.begin_read().unwrap();
    assert_eq!(txn.open_table(SESSIONS).unwrap().len().unwrap(), 2);
    let children = txn.open_table(CHILDREN).unwrap();
    let keys: Vec<(u128, u128)> = children
        .range((parent.as_u128(), 0)..=(parent.as_u128(), u128::MAX))
        .unwrap()
        .map(|e| e.unwrap().0.value())
        .collect();
    assert_eq!(keys, vec![(parent.as_u128(), child.as_u128())]);
}

#[test]
fn a_store_opens_over_redbs_in_memory_backend() {
    // `Store::with_backend` documents `redb::backends::InMemoryBackend` as a backend it takes.
    let store = Store::with_backend(
        redb::backends::InMemoryBackend::new(),
        StoreOptions::default(),
    )
    .expect("a store opens over redb's in-memory backend");
    let (id, header) = fresh();
    store.import(header, &completed_turns(1)).unwrap();
    assert_eq!(store.info(id).unwrap().len, 6);
}

// ---------------------------------------------------------------------------------------------
// Admission, group commit and flush.

/// Options whose commit window never elapses during a test: only a flush commits.
fn flush_only() -> StoreOptions {
    StoreOptions {
        commit_window: Duration::from_secs(3_600),
        ..StoreOptions::default()
    }
}

#[test]
fn admitted_batches_are_durable_only_after_a_flush() {
    let store = mem_store_with(flush_only());
    let (id, header) = fresh();
    store.create(header).unwrap();
    let log = completed_turns(2);
    store.admit(id, &log[..6]).unwrap();
    assert_unknown(store.info(id), id);
    assert!(store.list().unwrap().is_empty());
    // Admission already holds the seqs: the next batch continues after the admitted one.
    store.admit(id, &log[6..]).unwrap();
    store.flush(id).unwrap();
    assert_eq!(store.read_from(id, 0).unwrap(), log);
}

#[test]
fn one_flush_commits_every_admitted_batch_as_one_block_per_session() {
    let store = mem_store_with(flush_only());
    let (a, a_header) = fresh();
    let (b, b_header) = fresh();
    store.create(a_header).unwrap();
    store.create(b_header).unwrap();
    let log = completed_turns(3);
    for batch in log.chunks(4) {
        store.admit(a, batch).unwrap();
        store.admit(b, batch).unwrap();
    }
    store.flush_all().unwrap();
    for id in [a, b] {
        let info = store.info(id).unwrap();
        assert_eq!((info.len, info.revision), (18, 1), "one commit");
        assert_eq!(store.read_from(id, 0).unwrap(), log);
    }
    assert_eq!(
        store.stats().unwrap().blocks,
        2,
        "adjacent admitted batches share a block"
    );
}

/// Commits too small to fill a block leave small blocks that a later commit rewrites into full
/// ones: however a log is committed, every block but the last few fills most of `block_bytes`,
/// reads at every step see exactly the log so far, and the rewritten store verifies.
#[test]
fn small_commits_are_rewritten_into_full_blocks() {
    let options = StoreOptions {
        block_bytes: 8_000,
        ..StoreOptions::default()
    };
    let store = mem_store_with(options);
    let (id, header) = fresh();
    store.create(header).unwrap();
    let log = lineage_testkit::realistic_session(5, 4_000);
    let mut at = 0;
    for (i, size) in [1usize, 3, 7, 2, 40, 5, 120, 1].iter().cycle().enumerate() {
        if at == log.len() {
            break;
        }
        let end = (at + size).min(log.len());
        store.append(id, &log[at..end]).unwrap();
        at = end;
        if i % 7 == 0 {
            assert_eq!(
                store.read_from(id, 0).unwrap(),
                log[..at],
                "after {at} events"
            );
        }
    }
    assert_eq!(store.load(id).unwrap().events, log);
    assert!(store.verify().unwrap().is_ok());
    let stats = store.stats().unwrap();
    // Full blocks hold at least 90 % of the limit; at most a few small ones trail them.
    let full_blocks = stats.block_bytes / (8_000 * 9 / 10);
    assert!(
        stats.blocks <= full_blocks + 4,
        "{} blocks for {} stored bytes",
        stats.blocks,
        stats.block_bytes
    );
}

#[test]
fn load_flushes_admitted_events_before_repairing() {
    let store = mem_store_with(flush_only());
    let (id, header) = fresh();
    store.create(header).unwrap();
    let log = open_turn_log();
    store.admit(id, &log[..3]).unwrap();
    store.admit(id, &log[3..]).unwrap();
    let loaded = store.load(id).unwrap();
    let mut balanced = log.clone();
    balanced.extend(interrupted_turn_closers(&log));
    assert_eq!((loaded.events, loaded.closers), (balanced.clone(), 4));
    assert_eq!(store.read_from(id, 0).unwrap(), balanced);
}

#[test]
fn fork_flushes_the_parents_admitted_events_first() {
    let store = mem_store_with(flush_only());
    let (parent, header) = fresh();
    store.create(header).unwrap();
    store.admit(parent, &completed_turns(2)).unwrap();
    let child = SessionId::new();
    let forked = store.fork(parent, &spec(child, None)).unwrap();
    assert_eq!(forked.seed_len, 12);
    assert_eq!(
        store.read_from(child, 0).unwrap()[..12],
        completed_turns(2)[..]
    );
}

#[test]
fn close_commits_what_was_admitted() {
    let memory = SharedMemory::default();
    let (id, header) = fresh();
    {
        let store = Store::with_backend(memory.clone(), flush_only()).unwrap();
        store.create(header).unwrap();
        store.admit(id, &completed_turns(1)).unwrap();
        store.close().unwrap();
    }
    let store = Store::with_backend(memory, flush_only()).unwrap();
    assert_eq!(store.read_from(id, 0).unwrap(), completed_turns(1));
}

#[test]
fn appenders_on_many_threads_share_one_writer() {
    let store = mem_store();
    let ids: Vec<SessionId> = (0..4).map(|_| SessionId::new()).collect();
    for &id in &ids {
        store.create(header(id)).unwrap();
    }
    let workers: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(k, &id)| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut stream = TurnStream::new(k as u64, 0, 1);
                for _ in 0..30 {
                    store.append(id, &stream.take(7)).unwrap();
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("an appender panicked");
    }
    for (k, &id) in ids.iter().enumerate() {
        let expected = TurnStream::new(k as u64, 0, 1).take(210);
        assert_eq!(store.read_from(id, 0).unwrap(), expected);
    }
    assert_intact(&store.verify().unwrap());
}

#[test]
fn list_is_in_id_order_and_a_stored_id_cannot_be_created_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_file(&dir);
    let mut ids: Vec<SessionId> = (0..5).map(|_| SessionId::new()).collect();
    let store = Store::open(&path).unwrap();
    for &id in ids.iter().rev() {
        store.import(header(id), &completed_turns(1)).unwrap();
    }
    store.close().unwrap();
    let store = Store::open(&path).unwrap();
    ids.sort();
    let listed: Vec<SessionId> = store.list().unwrap().iter().map(|i| i.header.id).collect();
    assert_eq!(listed, ids);
    match store.create(header(ids[2])) {
        Err(StoreError::SessionExists { session }) => assert_eq!(session, ids[2]),
        other => panic!("expected SessionExists, got {other:?}"),
    }
}

#[test]
fn fork_with_setup_writes_the_setup_after_lineage_in_the_same_commit() {
    use lineage_log::{
        ApprovalPolicy, DescriptorMode, Origin, PolicySource, SubagentDescriptor, Text,
    };
    let store = mem_store();
    let (parent, header) = fresh();
    store.import(header, &completed_turns(2)).unwrap();
    let descriptor = SubagentDescriptor {
        version: 2,
        mode: DescriptorMode::Continuable,
        provider: Text::from("fork"),
        label: Some(Text::from("helper")),
        endpoint: None,
        model: None,
        persona: None,
        tool_filter: None,
    };
    let policy = ApprovalPolicy {
        policy: Text::from(ApprovalPolicy::NEVER),
        source: PolicySource::Delegation,
    };
    let setup: Vec<EventBody> = vec![descriptor.clone().into(), policy.clone().into()];
    let child = SessionId::new();
    let spec = ForkSpec {
        child,
        boundary: Some(5),
        time_ms: T0 + 9,
        delegation_depth: 1,
        agent_preset: None,
    };
    let forked = store.fork_with_setup(parent, &spec, setup).unwrap();
    assert_eq!(forked.origin, Some(Origin::Subagent));
    assert_eq!(forked.seed_len, 6);
    let events = store.read_from(child, 0).unwrap();
    assert_eq!(events.len(), 9);
    assert_eq!(events[..6], completed_turns(2)[..6]);
    assert_eq!(events[6].kind(), EventKind::SessionLineage);
    assert_eq!(events[7].body, EventBody::from(descriptor));
    assert_eq!(events[8].body, EventBody::from(policy));
    let info = store.info(child).unwrap();
    assert_eq!((info.len, info.revision), (9, 1), "one commit");
    assert_eq!(info.header, forked);
    assert_intact(&store.verify().unwrap());

    // A setup that breaks the log's rules is refused and creates nothing.
    let refused = SessionId::new();
    let bad = vec![ev::step_start(3, 1)];
    match store.fork_with_setup(
        parent,
        &ForkSpec {
            child: refused,
            ..spec
        },
        bad,
    ) {
        Err(StoreError::Rejected {
            source: LogError::InvalidEvent { seq: 7, .. },
            ..
        }) => {}
        other => panic!("expected the setup refused at seq 7, got {other:?}"),
    }
    assert_unknown(store.info(refused), refused);
    assert_eq!(store.children(parent).unwrap(), vec![child]);
}

#[test]
fn a_batch_off_the_next_seq_is_a_seq_mismatch_even_when_it_holds_session_lineage() {
    let store = mem_store();
    let (id, header) = fresh();
    let log = completed_turns(1);
    store.import(header, &log).unwrap();
    // A lineage event valid at seq 6, sent at seq 7: the seq is what is wrong.
    let lineage = SessionLineage {
        parent: SessionId::new(),
        seed_len: 6,
        seed_digest: digest_of(&log),
        delegation_depth: 0,
    };
    let batch = vec![Event::new(7, T0 as i64, lineage)];
    match store.append(id, &batch) {
        Err(StoreError::SeqMismatch {
            session,
            index: 0,
            expected: 6,
            got: 7,
        }) => assert_eq!(session, id),
        other => panic!("expected SeqMismatch 6/7, got {other:?}"),
    }
}

#[test]
fn a_refused_batch_names_its_first_offending_event() {
    let store = mem_store();
    let (id, header) = fresh();
    store.import(header, &completed_turns(1)).unwrap();
    // Seq 6 closes a turn that is not open; seq 7 is a user message spoken by the assistant.
    let mut wrong_role = ev::user(mid(7, 1), "who speaks?");
    if let EventBody::UserMessage(message) = &mut wrong_role {
        message.role = lineage_log::Role::Assistant;
    }
    let batch = events_from(6, vec![ev::turn_completed(9), wrong_role]);
    match store.append(id, &batch) {
        Err(StoreError::Rejected {
            source: LogError::InvalidEvent { seq, kind, .. },
            ..
        }) => assert_eq!((seq, kind), (6, EventKind::TurnEnd)),
        other => panic!("expected the turn/end at seq 6 named, got {other:?}"),
    }
    assert_eq!(store.info(id).unwrap().len, 6);
}

#[test]
fn a_descriptor_in_the_own_suffix_makes_the_stored_origin_subagent() {
    let store = mem_store();
    let (id, header) = fresh();
    store
        .import(header, &completed_turn(1, 0, "before"))
        .unwrap();
    let descriptor =
        lineage_log::SubagentDescriptor::new(lineage_log::DescriptorMode::OneShot, "spawn");
    store
        .append(id, &[at(6, EventBody::from(descriptor))])
        .unwrap();
    assert_eq!(
        store.info(id).unwrap().header.origin,
        Some(lineage_log::Origin::Subagent),
        "the header caches what the log says"
    );
    assert_intact(&store.verify().unwrap());
}

#[test]
fn a_lineage_event_that_contradicts_the_header_is_refused() {
    let store = mem_store();
    let (id, header) = fresh();
    store.create(header).unwrap();
    let stranger = lineage_log::SessionLineage {
        parent: SessionId::new(),
        seed_len: 0,
        seed_digest: lineage_log::Digest::of_empty(),
        delegation_depth: 1,
    };
    match store.append(id, &[at(0, EventBody::from(stranger))]) {
        Err(StoreError::Rejected { session, .. }) => assert_eq!(session, id),
        other => panic!("expected Rejected, got {other:?}"),
    }
    assert!(store.list().unwrap().is_empty(), "nothing was written");
}

/// A header made for a session id.
type HeaderOf<'a> = Box<dyn Fn(SessionId) -> lineage_log::Header + 'a>;

#[test]
fn import_refuses_a_header_its_log_contradicts_and_writes_nothing() {
    let store = mem_store();
    let parent = SessionId::new();
    let lineage = lineage_log::SessionLineage {
        parent,
        seed_len: 0,
        seed_digest: lineage_log::Digest::of_empty(),
        delegation_depth: 2,
    };
    let stated =
        |header: lineage_log::Header| lineage_log::with_log_facts(&header, Some(&lineage), false);
    let cases: Vec<(&str, HeaderOf<'_>, Vec<Event>)> = vec![
        (
            "parent",
            Box::new(|id| lineage_log::Header {
                parent: Some(SessionId::new()),
                ..header(id)
            }),
            completed_turn(1, 0, "no lineage"),
        ),
        (
            "origin",
            Box::new(|id| lineage_log::Header {
                origin: Some(lineage_log::Origin::Subagent),
                ..header(id)
            }),
            completed_turn(1, 0, "no descriptor"),
        ),
        (
            "delegation_depth",
            Box::new(move |id| lineage_log::Header {
                delegation_depth: 1,
                ..stated(header(id))
            }),
            vec![Event::new(0, 0, lineage.clone())],
        ),
        (
            "seed_len",
            Box::new(move |id| lineage_log::Header {
                seed_len: 3,
                ..stated(header(id))
            }),
            vec![Event::new(0, 0, lineage.clone())],
        ),
    ];
    for (field, make, events) in cases {
        let id = SessionId::new();
        match store.import(make(id), &events) {
            Err(StoreError::HeaderContradictsLog {
                session,
                field: named,
                ..
            }) => {
                assert_eq!(session, id, "{field}");
                assert_eq!(named, field);
            }
            other => panic!("{field}: expected HeaderContradictsLog, got {other:?}"),
        }
        assert!(
            matches!(store.info(id), Err(StoreError::UnknownSession { .. })),
            "{field}: nothing was written"
        );
        // The id is free: the same session with an agreeing header is imported.
        store
            .import(lineage_log::fold_header(&make(id), &events), &events)
            .unwrap_or_else(|e| panic!("{field}: the agreeing header is refused: {e}"));
    }
}

#[test]
fn a_created_header_naming_a_parent_needs_its_lineage_where_it_says() {
    let store = mem_store();
    let (id, plain) = fresh();
    let header = lineage_log::Header {
        parent: Some(SessionId::new()),
        delegation_depth: 1,
        seed_digest: Some(lineage_log::Digest::of_empty()),
        ..plain
    };
    store.create(header.clone()).unwrap();
    match store.append(id, &completed_turn(1, 0, "no lineage")) {
        Err(StoreError::Rejected {
            session,
            source: LogError::InvalidEvent { seq: 0, reason, .. },
        }) => {
            assert_eq!(session, id);
            assert!(reason.contains("session/lineage"), "{reason}");
        }
        other => panic!("expected the event at seq 0 refused, got {other:?}"),
    }
    let lineage = lineage_log::SessionLineage {
        parent: header.parent.unwrap(),
        seed_len: 0,
        seed_digest: lineage_log::Digest::of_empty(),
        delegation_depth: 1,
    };
    store.append(id, &[Event::new(0, 0, lineage)]).unwrap();
    assert_eq!(store.info(id).unwrap().header.parent, header.parent);
}

// Every test above that is about the store's behaviour, not redb's file, runs on PostgreSQL too.
on_postgres_too! {
    create_writes_nothing_until_the_first_append,
    first_append_writes_the_header_and_the_batch_together,
    append_to_a_session_never_created_is_refused,
    create_refuses_a_header_of_another_format_or_with_a_relative_cwd,
    import_writes_a_valid_seed_and_refuses_an_invalid_one,
    append_that_does_not_continue_at_the_next_seq_is_refused_and_changes_nothing,
    first_append_must_start_at_seq_zero,
    batch_with_an_invalid_event_is_refused_whole,
    empty_batch_is_a_no_op,
    load_appends_the_closers_of_an_open_turn_durably,
    inspect_balances_in_memory_and_leaves_the_store_untouched,
    load_then_inspect_give_the_same_balanced_view,
    read_from_returns_exactly_the_stored_suffix_for_every_k,
    read_from_an_unknown_session_names_it,
    children_and_descendants_follow_the_forks,
    fork_refuses_a_boundary_inside_an_open_turn,
    fork_refuses_a_boundary_past_the_end,
    fork_refuses_a_taken_child_id_before_looking_at_the_boundary,
    fork_of_an_unknown_parent_is_refused,
    fork_copies_the_prefix_verbatim_then_writes_session_lineage,
    a_forked_child_continues_its_turns_after_the_lineage_event,
    stats_count_sessions_events_blocks_and_kinds,
    a_read_only_handle_refuses_writes_and_serves_reads,
    fork_on_a_read_only_handle_is_refused,
    admitted_batches_are_durable_only_after_a_flush,
    one_flush_commits_every_admitted_batch_as_one_block_per_session,
    small_commits_are_rewritten_into_full_blocks,
    load_flushes_admitted_events_before_repairing,
    fork_flushes_the_parents_admitted_events_first,
    close_commits_what_was_admitted,
    appenders_on_many_threads_share_one_writer,
    list_is_in_id_order_and_a_stored_id_cannot_be_created_again,
    fork_with_setup_writes_the_setup_after_lineage_in_the_same_commit,
    a_batch_off_the_next_seq_is_a_seq_mismatch_even_when_it_holds_session_lineage,
    a_refused_batch_names_its_first_offending_event,
    a_descriptor_in_the_own_suffix_makes_the_stored_origin_subagent,
    a_lineage_event_that_contradicts_the_header_is_refused,
    import_refuses_a_header_its_log_contradicts_and_writes_nothing,
    a_created_header_naming_a_parent_needs_its_lineage_where_it_says,
}
