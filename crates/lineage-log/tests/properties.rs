//! Properties over random valid logs (see `lineage_testkit::arb_valid_log`): every generated log
//! and every prefix of it satisfies the seed contract, so each property below is checked against
//! logs that may end balanced or inside an open turn.

use lineage_log::{
    Digest, Encoder, Event, EventBody, EventKind, ForkSpec, Header, Log, LogError, SessionId,
    SessionLineage, Structure, check_seed, completed_turn_prefix, decode_record, decode_records,
    encode_record, fold_header, fork_session, interrupted_turn_closers, is_balanced, split_record,
};
use lineage_testkit::ev::{self, mid};
use lineage_testkit::running_digests;
use lineage_testkit::{arb_event, arb_partition, arb_valid_log, balanced_cuts, split_batches};
use proptest::prelude::*;

/// At least 256 cases (proptest's default), more when `PROPTEST_CASES` asks for more.
fn config() -> ProptestConfig {
    let default = ProptestConfig::default();
    ProptestConfig {
        cases: default.cases.max(256),
        ..default
    }
}

/// A valid log with a random partition of its events into batches.
fn log_and_partition() -> impl Strategy<Value = (Vec<Event>, Vec<usize>)> {
    arb_valid_log(8).prop_flat_map(|events| {
        let len = events.len();
        (Just(events), arb_partition(len))
    })
}

/// How to break one event so that it cannot be appended where it stands.
#[derive(Clone, Copy, Debug)]
enum Break {
    /// Its seq is not the next one.
    Seq(u64),
    /// It opens a turn with a number no turn of a generated log has.
    TurnNumber,
    /// It closes a turn that is not open.
    TurnEnd,
    /// It ends a step that is not open.
    StepEnd,
    /// It answers a call nobody made.
    Unanswerable,
    /// It is a lineage event whose `seed_len` is not its seq.
    MisplacedLineage,
}

fn arb_break() -> impl Strategy<Value = Break> {
    prop_oneof![
        (1u64..1_000).prop_map(Break::Seq),
        Just(Break::TurnNumber),
        Just(Break::TurnEnd),
        Just(Break::StepEnd),
        Just(Break::Unanswerable),
        Just(Break::MisplacedLineage),
    ]
}

fn broken(event: &Event, how: Break) -> Event {
    // Generated logs have at most a few dozen turns, so u32::MAX names none of them.
    let body = match how {
        Break::Seq(by) => return Event::new(event.seq + by, event.time_ms, event.body.clone()),
        Break::TurnNumber => ev::turn_start(u32::MAX),
        Break::TurnEnd => ev::turn_completed(u32::MAX),
        Break::StepEnd => ev::step_end(u32::MAX, 1),
        Break::Unanswerable => ev::tool_result(1, 1, mid(u64::MAX), "no-such-call", "x"),
        Break::MisplacedLineage => SessionLineage {
            parent: SessionId::from_u128(1),
            seed_len: event.seq + 1,
            seed_digest: Digest::of_empty(),
            delegation_depth: 0,
        }
        .into(),
    };
    Event::new(event.seq, event.time_ms, body)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_partition_of_appends_builds_the_log_the_seed_builds((events, sizes) in log_and_partition()) {
        let seeded = Log::from_seed(events.clone()).unwrap();
        let mut appended = Log::new();
        for batch in split_batches(&events, &sizes) {
            prop_assert!(appended.append(batch).is_ok());
        }
        prop_assert_eq!(appended.events(), &events[..]);
        prop_assert_eq!(appended.structure(), seeded.structure());
        prop_assert_eq!(appended.structure(), &check_seed(&events).unwrap());
        prop_assert_eq!(appended.next_seq(), events.len() as u64);
        prop_assert_eq!(appended.is_balanced(), is_balanced(&events));
    }

    #[test]
    fn every_generated_log_round_trips_through_the_codec(events in arb_valid_log(8)) {
        let mut buf = Vec::new();
        Encoder::new().encode_all(&events, &mut buf);
        let mut decoded = Vec::new();
        decode_records(&buf, 0, &mut decoded).unwrap();
        prop_assert_eq!(&decoded, &events);
        let mut again = Vec::new();
        Encoder::new().encode_all(&decoded, &mut again);
        prop_assert_eq!(again, buf);
    }

    #[test]
    fn any_single_event_round_trips_through_the_codec(event in arb_event()) {
        let bytes = encode_record(&event);
        let (raw, rest) = split_record(&bytes, event.seq).unwrap();
        prop_assert!(rest.is_empty());
        let back = decode_record(event.seq, &raw).unwrap();
        prop_assert_eq!(&back, &event);
        prop_assert_eq!(encode_record(&back), bytes);
    }

    #[test]
    fn a_refused_append_changes_nothing(
        events in arb_valid_log(6),
        split in any::<prop::sample::Index>(),
        victim in any::<prop::sample::Index>(),
        how in arb_break(),
    ) {
        // Append a prefix, then try the rest with one event broken.
        let k = split.index(events.len() + 1);
        let mut log = Log::from_seed(events[..k].to_vec()).unwrap();
        let mut batch = events[k..].to_vec();
        if batch.is_empty() {
            batch.push(Event::new(k as u64, 0, ev::user(mid(0), "filler")));
        }
        let j = victim.index(batch.len());
        let original = batch.clone();
        batch[j] = broken(&batch[j], how);
        let (before_events, before_structure) = (log.events().to_vec(), log.structure().clone());

        let err = log.append(batch).expect_err("a broken event refuses the batch");
        match (&err, how) {
            (LogError::SeqMismatch { index, expected, got }, Break::Seq(by)) => {
                prop_assert_eq!(*index, j);
                prop_assert_eq!(*expected, (k + j) as u64);
                prop_assert_eq!(*got, (k + j) as u64 + by);
            }
            (LogError::InvalidEvent { seq, .. }, how) if !matches!(how, Break::Seq(_)) => {
                prop_assert_eq!(*seq, (k + j) as u64);
            }
            _ => prop_assert!(false, "unexpected error {:?} for {:?}", err, how),
        }
        prop_assert_eq!(log.events(), &before_events[..]);
        prop_assert_eq!(log.structure(), &before_structure);
        // Nothing was poisoned: the intact batch still goes in.
        prop_assert!(log.append(original).is_ok());
    }

    #[test]
    fn closers_balance_every_prefix_into_a_valid_seed(events in arb_valid_log(5)) {
        for k in 0..=events.len() {
            let prefix = &events[..k];
            let closers = interrupted_turn_closers(prefix);
            prop_assert_eq!(&closers, &interrupted_turn_closers(prefix), "deterministic");
            prop_assert_eq!(closers.is_empty(), is_balanced(prefix), "k = {}", k);
            if let Some(last) = prefix.last() {
                for (i, closer) in closers.iter().enumerate() {
                    prop_assert_eq!(closer.seq, last.seq + 1 + i as u64);
                    prop_assert_eq!(closer.time_ms, last.time_ms);
                }
            }
            if let Some(end) = closers.last() {
                prop_assert_eq!(end.kind(), EventKind::TurnEnd);
            }
            let mut closed = prefix.to_vec();
            closed.extend(closers.iter().cloned());
            let structure = check_seed(&closed);
            prop_assert!(structure.is_ok(), "k = {}: {:?}", k, structure);
            prop_assert!(structure.unwrap().is_balanced());
            prop_assert!(interrupted_turn_closers(&closed).is_empty());
            // The repair path appends the closers to the torn log as one batch.
            let mut log = Log::from_seed(prefix.to_vec()).unwrap();
            prop_assert!(log.append(closers).is_ok());
        }
    }

    #[test]
    fn balance_is_the_same_whichever_way_it_is_asked(events in arb_valid_log(5)) {
        for k in 0..=events.len() {
            let prefix = &events[..k];
            let by_structure = check_seed(prefix).unwrap().is_balanced();
            prop_assert_eq!(is_balanced(prefix), by_structure);
            prop_assert_eq!(interrupted_turn_closers(prefix).is_empty(), by_structure);
        }
    }

    #[test]
    fn the_completed_turn_prefix_is_balanced_and_ends_at_the_last_turn_end(events in arb_valid_log(6)) {
        let prefix = completed_turn_prefix(&events);
        prop_assert!(is_balanced(prefix));
        match events.iter().rposition(|e| e.kind() == EventKind::TurnEnd) {
            Some(i) => prop_assert_eq!(prefix.len(), i + 1),
            None => prop_assert!(prefix.is_empty()),
        }
        let structure = check_seed(prefix).unwrap();
        prop_assert_eq!(
            structure.clone(),
            Structure::balanced_at(prefix.len() as u64, structure.last_turn())
        );
    }

    #[test]
    fn a_forks_seed_digest_is_the_parents_running_digest_at_its_boundary(
        events in arb_valid_log(6),
        pick in any::<prop::sample::Index>(),
    ) {
        let cuts: Vec<usize> = balanced_cuts(&events).into_iter().filter(|&k| k > 0).collect();
        prop_assume!(!cuts.is_empty());
        let seed_len = *pick.get(&cuts);
        let parent = Header::new(SessionId::from_u128(0xAA), 5);
        let spec = ForkSpec {
            child: SessionId::from_u128(0xCC),
            boundary: Some(seed_len as u64 - 1),
            time_ms: 77,
            delegation_depth: 1,
            agent_preset: None,
        };
        let before = events.clone();
        let forked = fork_session(&parent, &events, &spec).unwrap();
        prop_assert_eq!(&events, &before);
        let digests = running_digests(&events);
        let EventBody::SessionLineage(lineage) = &forked.events[seed_len].body else {
            panic!("the child's own suffix starts with its lineage");
        };
        prop_assert_eq!(lineage.seed_len, seed_len as u64);
        prop_assert_eq!(lineage.seed_digest, digests[seed_len]);
        prop_assert_eq!(&forked.events[..seed_len], &events[..seed_len]);
        prop_assert_eq!(forked.events.len(), seed_len + 1);
        prop_assert!(check_seed(&forked.events).is_ok());
        prop_assert_eq!(&fold_header(&forked.header, &forked.events), &forked.header);
    }

    #[test]
    fn a_fork_boundary_is_accepted_exactly_where_no_turn_is_open(
        events in arb_valid_log(4),
        pick in any::<prop::sample::Index>(),
    ) {
        prop_assume!(!events.is_empty());
        let boundary = pick.index(events.len());
        let parent = Header::new(SessionId::from_u128(0xAA), 5);
        let spec = ForkSpec {
            child: SessionId::from_u128(0xCC),
            boundary: Some(boundary as u64),
            time_ms: 77,
            delegation_depth: 0,
            agent_preset: None,
        };
        let prefix = &events[..=boundary];
        match fork_session(&parent, &events, &spec) {
            Ok(_) => prop_assert!(is_balanced(prefix)),
            Err(LogError::OpenTurn { boundary: b, turn }) => {
                prop_assert_eq!(b, boundary as u64);
                prop_assert_eq!(check_seed(prefix).unwrap().open_turn(), Some(turn));
            }
            Err(other) => prop_assert!(false, "unexpected {:?}", other),
        }
    }
}

proptest! {
    #![proptest_config(config())]

    /// Replaying only the open tail turn of a valid log gives the structure a full replay gives,
    /// for the log and for every prefix of it.
    #[test]
    fn the_structure_of_a_valid_log_needs_only_its_tail_turn(log in arb_valid_log(6)) {
        for cut in 0..=log.len() {
            let prefix = &log[..cut];
            let full = lineage_log::check_seed(prefix).expect("generated logs are valid");
            let tail = lineage_log::Structure::of_valid_log(prefix).expect("valid");
            prop_assert_eq!(tail, full, "prefix of {} events", cut);
        }
    }
}
