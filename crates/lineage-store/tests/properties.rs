//! Properties of the store over random valid logs: what goes in under any batching comes back
//! identical (after a reopen too), a refused append changes nothing, a fork's seed digest is the
//! parent's running digest, and `verify` finds nothing wrong with anything the store wrote.

mod common;

use common::*;
use lineage_log::{
    Event, EventBody, EventKind, ForkSpec, LogError, SessionId, TurnMarker, fold_header,
    interrupted_turn_closers, last_turn_marker,
};
use lineage_store::{Store, StoreError, StoreOptions};
use lineage_testkit::ev::fork_spec;
use lineage_testkit::{arb_partition, arb_valid_log, balanced_cuts, ev, split_batches};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;

const CASES: u32 = 64;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: CASES,
        // Shrinking re-runs whole stores; a few hundred steps are enough to reach a small log.
        max_shrink_iters: 512,
        ..ProptestConfig::default()
    }
}

/// A log, batch sizes that add up to its length, per-batch "admit only" flags, and block limits.
fn log_partition_and_blocks()
-> impl Strategy<Value = (Vec<Event>, Vec<usize>, Vec<bool>, StoreOptions)> {
    arb_valid_log(5).prop_flat_map(|log| {
        let len = log.len();
        (
            Just(log),
            arb_partition(len),
            vec(any::<bool>(), 40),
            1usize..48,
            48usize..6_000,
        )
            .prop_map(|(log, sizes, admit_only, events, bytes)| {
                let options = StoreOptions {
                    block_events: events,
                    block_bytes: bytes,
                    ..StoreOptions::default()
                };
                (log, sizes, admit_only, options)
            })
    })
}

/// The header a session holding `log` must have for `verify` to agree with it: lineage and
/// descriptor facts folded from the log.
fn header_for(id: SessionId, log: &[Event]) -> lineage_log::Header {
    fold_header(&header(id), log)
}

/// `log` followed by its crash-repair closers.
fn balanced(log: &[Event]) -> Vec<Event> {
    let mut out = log.to_vec();
    out.extend(interrupted_turn_closers(log));
    out
}

/// Writes `log` to `store` batch by batch: a batch flagged in `admit_only` is only admitted, so it
/// shares a later commit with the batches after it.
fn write(store: &Store, id: SessionId, log: &[Event], sizes: &[usize], admit_only: &[bool]) {
    for (i, batch) in split_batches(log, sizes).iter().enumerate() {
        if admit_only.get(i).copied().unwrap_or(false) {
            store.admit(id, batch).expect("a valid batch is admitted");
        } else {
            store.append(id, batch).expect("a valid batch is appended");
        }
    }
    store.flush(id).expect("the flush commits");
}

/// Every stored block keeps the configured limits, except that a single record larger than
/// `block_bytes` gets a block alone; blocks of one session are contiguous from seq 0.
fn check_block_limits(memory: &SharedMemory, options: &StoreOptions) -> Result<(), TestCaseError> {
    use redb::{ReadableDatabase, ReadableTable};
    let db = redb::Builder::new()
        .create_with_backend(memory.clone())
        .expect("redb opens the closed store's memory");
    let txn = db.begin_read().unwrap();
    let events = txn.open_table(EVENTS).unwrap();
    let mut next: std::collections::HashMap<u128, u64> = Default::default();
    for entry in events.iter().unwrap() {
        let (key, value) = entry.unwrap();
        let (session, first_seq) = key.value();
        let bytes = value.value();
        let count = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
        let records = bytes.len() - BLOCK_HEADER_LEN;
        prop_assert_eq!(*next.entry(session).or_default(), first_seq);
        next.insert(session, first_seq + count as u64);
        prop_assert!(count >= 1);
        prop_assert!(
            count == 1 || (count <= options.block_events && records <= options.block_bytes),
            "block at {} holds {} events in {} bytes; limits {} events, {} bytes",
            first_seq,
            count,
            records,
            options.block_events,
            options.block_bytes
        );
    }
    Ok(())
}

fn check_intact(store: &Store) -> Result<(), TestCaseError> {
    let report = store.verify().expect("verify runs");
    let failures: Vec<String> = report
        .failures()
        .map(|s| format!("{}: {:?}", s.session, s.problems))
        .collect();
    prop_assert!(failures.is_empty(), "verify found problems: {failures:?}");
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_logs_under_random_partitions_load_back_identical_and_reopen_identical(
        case in log_partition_and_blocks()
    ) {
        let (log, sizes, admit_only, options) = case;
        let memory = SharedMemory::default();
        let store = Store::with_backend(memory.clone(), options.clone()).unwrap();
        let id = SessionId::new();
        let header = header_for(id, &log);
        store.create(header.clone()).unwrap();
        write(&store, id, &log, &sizes, &admit_only);

        if log.is_empty() {
            prop_assert!(store.list().unwrap().is_empty());
            let unknown = matches!(store.load(id), Err(StoreError::UnknownSession { .. }));
            prop_assert!(unknown, "an unwritten session loads as unknown");
            return Ok(());
        }
        let expected = balanced(&log);
        let closers = expected.len() - log.len();
        let info = store.info(id).unwrap();
        prop_assert_eq!(info.len, log.len() as u64);
        prop_assert_eq!(info.head, digest_of(&log));
        let commits = split_batches(&log, &sizes).iter().filter(|b| !b.is_empty()).count();
        prop_assert!((1..=commits as u64).contains(&info.revision));
        prop_assert_eq!(store.read_from(id, 0).unwrap(), log.clone());
        let inspected = store.inspect(id).unwrap();
        prop_assert_eq!(&inspected.events, &expected);
        prop_assert_eq!(inspected.closers, closers);
        check_intact(&store)?;

        let loaded = store.load(id).unwrap();
        prop_assert_eq!(&loaded.header, &header);
        prop_assert_eq!(&loaded.events, &expected);
        prop_assert_eq!(loaded.closers, closers);
        let after = store.info(id).unwrap();
        prop_assert_eq!(after.revision, info.revision + u64::from(closers > 0));
        store.close().unwrap();
        check_block_limits(&memory, &options)?;

        let store = Store::with_backend(memory, options).unwrap();
        let reopened = store.inspect(id).unwrap();
        prop_assert_eq!(&reopened.events, &expected);
        prop_assert_eq!(reopened.closers, 0);
        prop_assert_eq!(&reopened.header, &header);
        let listed = store.list().unwrap();
        prop_assert_eq!(listed.len(), 1);
        prop_assert_eq!(listed[0].len, expected.len() as u64);
        prop_assert_eq!(listed[0].head, digest_of(&expected));
        for k in [0, expected.len() / 3, expected.len() / 2, expected.len() - 1] {
            prop_assert_eq!(store.read_from(id, k as u64).unwrap(), expected[k..].to_vec());
        }
        check_intact(&store)?;
    }

    #[test]
    fn random_logs_written_to_a_file_reopen_identical(
        log in arb_valid_log(4),
        cut in any::<Index>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = store_location(dir.path());
        let id = SessionId::new();
        let header = header_for(id, &log);
        {
            let store = Store::open(&path).unwrap();
            store.create(header.clone()).unwrap();
            // Two commits: the cut may fall inside a turn, leaving it open across them.
            let cut = if log.is_empty() { 0 } else { cut.index(log.len() + 1) };
            store.append(id, &log[..cut]).unwrap();
            store.append(id, &log[cut..]).unwrap();
            store.close().unwrap();
        }
        let store = Store::open(&path).unwrap();
        if log.is_empty() {
            prop_assert!(store.list().unwrap().is_empty());
            return Ok(());
        }
        prop_assert_eq!(store.read_from(id, 0).unwrap(), log.clone());
        let loaded = store.load(id).unwrap();
        prop_assert_eq!(&loaded.events, &balanced(&log));
        prop_assert_eq!(&loaded.header, &header);
        check_intact(&store)?;
    }

    #[test]
    fn a_refused_append_changes_nothing(
        case in arb_valid_log(4).prop_flat_map(|log| {
            let len = log.len();
            (Just(log), arb_partition(len))
        }),
        at in any::<Index>(),
        within in any::<Index>(),
        structural in any::<bool>(),
        delta in prop_oneof![-3i64..0, 1i64..4],
    ) {
        let (log, sizes) = case;
        let store = mem_store_with(small_blocks(7));
        let id = SessionId::new();
        store.create(header_for(id, &log)).unwrap();
        let batches = split_batches(&log, &sizes);
        let p = at.index(batches.len() + 1);
        for batch in &batches[..p] {
            store.append(id, batch).unwrap();
        }
        let next: u64 = batches[..p].iter().map(|b| b.len() as u64).sum();
        let before = (
            store.list().unwrap(),
            store.info(id).ok(),
            store.read_from(id, 0).ok(),
        );

        let mut bad = batches.get(p).cloned().unwrap_or_default();
        if bad.is_empty() {
            bad.push(at_seq(next, ev::user(mid(next, 7), "extra")));
        }
        let j = within.index(bad.len());
        let expected_error = if structural {
            // A turn that never opened closes: invalid wherever it lands. It replaces event `j`,
            // so every other event keeps its seq and its (valid) shape.
            bad[j] = at_seq(next + j as u64, ev::turn_completed(u32::MAX));
            format!("invalid turn/end at {}", next + j as u64)
        } else {
            let delta = if (bad[j].seq as i64) + delta < 0 { -delta } else { delta };
            for event in bad.iter_mut().skip(j) {
                event.seq = (event.seq as i64 + delta) as u64;
            }
            format!("seq mismatch at index {j}")
        };
        match store.append(id, &bad) {
            Err(StoreError::Rejected { session, source: LogError::InvalidEvent { seq, kind, .. } })
                if structural =>
            {
                prop_assert_eq!(session, id);
                prop_assert_eq!((seq, kind), (next + j as u64, EventKind::TurnEnd));
            }
            // Shapes are checked before seqs, and a `session/lineage` moved off its seq breaks its
            // shape; `contract.rs` pins the SeqMismatch this case should report. Either way the
            // batch is refused whole, which is what the rest of this property checks.
            Err(StoreError::Rejected {
                source: LogError::InvalidEvent { kind: EventKind::SessionLineage, seq, .. },
                ..
            }) if !structural && seq >= bad[j].seq => {}
            Err(StoreError::SeqMismatch { session, index, expected, got }) if !structural => {
                prop_assert_eq!(session, id);
                prop_assert_eq!(index, j);
                prop_assert_eq!(expected, next + j as u64);
                prop_assert_eq!(got, bad[j].seq);
            }
            other => prop_assert!(false, "expected {}, got {:?}", expected_error, other),
        }
        let after = (
            store.list().unwrap(),
            store.info(id).ok(),
            store.read_from(id, 0).ok(),
        );
        prop_assert_eq!(after, before);

        // The refusal left the session's tail as it was: the rest of the log still fits.
        for batch in &batches[p..] {
            store.append(id, batch).unwrap();
        }
        if !log.is_empty() {
            prop_assert_eq!(store.read_from(id, 0).unwrap(), log.clone());
            check_intact(&store)?;
        }
    }

    #[test]
    fn a_forks_seed_digest_is_the_parents_running_digest_at_the_boundary(
        log in arb_valid_log(5),
        pick in any::<Index>(),
        open_pick in any::<Index>(),
        batch in 1usize..30,
        block_events in 1usize..24,
    ) {
        let cuts: Vec<usize> = balanced_cuts(&log).into_iter().filter(|&k| k > 0).collect();
        prop_assume!(!cuts.is_empty());
        let store = mem_store_with(small_blocks(block_events));
        let parent = SessionId::new();
        store.create(header_for(parent, &log)).unwrap();
        for chunk in log.chunks(batch) {
            store.append(parent, chunk).unwrap();
        }
        let parent_before = (store.info(parent).unwrap(), store.read_from(parent, 0).unwrap());

        let seed_len = cuts[pick.index(cuts.len())];
        let child = SessionId::new();
        let spec = fork_spec(child, Some(seed_len as u64 - 1), T0 + 1, 1);
        let header = store.fork(parent, &spec).unwrap();
        let digest = digest_of(&log[..seed_len]);
        prop_assert_eq!(header.seed_digest, Some(digest));
        prop_assert_eq!(header.seed_len, seed_len as u64);
        let child_log = store.read_from(child, 0).unwrap();
        prop_assert_eq!(&child_log[..seed_len], &log[..seed_len]);
        prop_assert_eq!(child_log.len(), seed_len + 1);
        match &child_log[seed_len].body {
            EventBody::SessionLineage(lineage) => {
                prop_assert_eq!(lineage.seed_digest, digest);
                prop_assert_eq!(lineage.parent, parent);
                prop_assert_eq!(lineage.seed_len, seed_len as u64);
            }
            other => prop_assert!(false, "expected session/lineage, got {:?}", other),
        }
        prop_assert_eq!(store.info(child).unwrap().head, digest_of(&child_log));

        // A boundary inside a turn is refused and creates nothing.
        let open: Vec<u64> = (0..log.len() as u64)
            .filter(|&b| {
                matches!(last_turn_marker(&log[..=b as usize]), Some(TurnMarker::Start(_)))
            })
            .collect();
        if !open.is_empty() {
            let boundary = open[open_pick.index(open.len())];
            let refused = SessionId::new();
            let result = store.fork(parent, &ForkSpec { child: refused, boundary: Some(boundary), ..spec });
            let open_turn = matches!(
                result,
                Err(StoreError::Rejected { source: LogError::OpenTurn { .. }, .. })
            );
            prop_assert!(open_turn, "boundary {} inside a turn: {:?}", boundary, result);
            let unknown = matches!(store.info(refused), Err(StoreError::UnknownSession { .. }));
            prop_assert!(unknown, "a refused fork creates nothing");
        }
        prop_assert_eq!(store.children(parent).unwrap(), vec![child]);
        prop_assert_eq!(
            (store.info(parent).unwrap(), store.read_from(parent, 0).unwrap()),
            parent_before
        );
        check_intact(&store)?;
    }

    #[test]
    fn interleaved_sessions_sharing_group_commits_verify_ok(
        logs in vec(arb_valid_log(3), 1..4),
        order in vec(any::<Index>(), 64),
        flushes in vec(any::<bool>(), 64),
        block_events in 1usize..32,
    ) {
        let store = mem_store_with(small_blocks(block_events));
        let ids: Vec<SessionId> = logs.iter().map(|_| SessionId::new()).collect();
        for (id, log) in ids.iter().zip(&logs) {
            store.create(header_for(*id, log)).unwrap();
        }
        // Each session is cut into batches of up to 9 events, admitted in a random interleaving.
        let mut queues: Vec<std::collections::VecDeque<&[Event]>> =
            logs.iter().map(|log| log.chunks(9).collect()).collect();
        let mut step = 0;
        while queues.iter().any(|q| !q.is_empty()) {
            let live: Vec<usize> = (0..queues.len()).filter(|&i| !queues[i].is_empty()).collect();
            let i = live[order[step % order.len()].index(live.len())];
            let batch = queues[i].pop_front().unwrap();
            store.admit(ids[i], batch).unwrap();
            if flushes[step % flushes.len()] {
                store.flush_all().unwrap();
            }
            step += 1;
        }
        store.flush_all().unwrap();
        for (id, log) in ids.iter().zip(&logs) {
            if log.is_empty() {
                prop_assert!(store.info(*id).is_err());
                continue;
            }
            let inspected = store.inspect(*id).unwrap();
            prop_assert_eq!(&inspected.events, &balanced(log));
            let report = store.verify().unwrap();
            let mine = report.sessions.iter().find(|s| s.session == *id).unwrap();
            prop_assert_eq!(mine.events, log.len() as u64);
            prop_assert_eq!(mine.open_turn.is_some(), !interrupted_turn_closers(log).is_empty());
        }
        check_intact(&store)?;
    }
}

/// `body` at `seq`.
fn at_seq(seq: u64, body: EventBody) -> Event {
    Event::new(seq, T0 as i64, body)
}

// The properties that are about the store's behaviour, not redb's pages, hold on PostgreSQL too.
on_postgres_too! {
    random_logs_written_to_a_file_reopen_identical,
    a_refused_append_changes_nothing,
    a_forks_seed_digest_is_the_parents_running_digest_at_the_boundary,
    interleaved_sessions_sharing_group_commits_verify_ok,
}
