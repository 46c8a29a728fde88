//! The generators keep their promises: valid by construction, deterministic, and varied.

use std::collections::BTreeSet;

use lineage_log::{
    Chain, Encoder, Event, EventBody, EventKind, Log, TOOL_NOT_STARTED, TurnEndReason, check_seed,
    encode_record, interrupted_turn_closers, is_balanced,
};
use lineage_testkit::{
    SplitMix64, arb_balanced_log, arb_partition, arb_valid_log, balanced_cuts, random_event_body,
    realistic_session, split_batches, valid_log_from_ops,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

fn bytes(events: &[Event]) -> Vec<u8> {
    let mut out = Vec::new();
    Encoder::new().encode_all(events, &mut out);
    out
}

/// Draws `n` values of `strategy` from a runner with a fixed seed.
fn sample<S: Strategy>(strategy: S, n: usize) -> Vec<S::Value> {
    let mut runner = TestRunner::deterministic();
    (0..n)
        .map(|_| strategy.new_tree(&mut runner).unwrap().current())
        .collect()
}

#[test]
fn realistic_session_is_a_valid_balanced_log_of_whole_turns() {
    for seed in 0..20 {
        let events = realistic_session(seed, 500);
        let structure = check_seed(&events).expect("realistic sessions satisfy the seed contract");
        assert!(structure.is_balanced());
        assert!(is_balanced(&events));
        assert!(interrupted_turn_closers(&events).is_empty());
        assert!(events.len() >= 500);
        assert_eq!(events.last().unwrap().kind(), EventKind::TurnEnd);
        // It stops at the first turn boundary at or past the target: dropping the last turn
        // leaves fewer than the target.
        let last_start = events
            .iter()
            .rposition(|e| e.kind() == EventKind::TurnStart)
            .unwrap();
        assert!(
            last_start < 500,
            "seed {seed}: a whole extra turn past the target"
        );
        for (i, event) in events.iter().enumerate() {
            assert_eq!(event.seq, i as u64);
        }
        for pair in events.windows(2) {
            let dt = pair[1].time_ms - pair[0].time_ms;
            assert!((1..=6).contains(&dt), "times grow by a few ms, got {dt}");
        }
    }
}

#[test]
fn realistic_session_is_byte_identical_for_a_seed_and_differs_across_seeds() {
    let a = realistic_session(42, 2_000);
    let b = realistic_session(42, 2_000);
    assert_eq!(a, b);
    assert_eq!(bytes(&a), bytes(&b));
    assert_ne!(bytes(&a), bytes(&realistic_session(43, 2_000)));
}

#[test]
fn realistic_session_of_zero_events_is_empty() {
    assert!(realistic_session(7, 0).is_empty());
    assert!(!realistic_session(7, 1).is_empty());
}

#[test]
fn realistic_turns_have_the_documented_shape() {
    let events = realistic_session(9, 3_000);
    let mut chunks_per_step = Vec::new();
    let mut steps_per_turn = Vec::new();
    let mut steps = 0;
    let mut chunks = 0;
    for (i, event) in events.iter().enumerate() {
        match &event.body {
            EventBody::TurnStart(_) => {
                let EventBody::InboxSpliced(queued) = &events[i - 1].body else {
                    panic!("a turn starts right after its prompt is queued");
                };
                assert_eq!((queued.removed, queued.inserted.len()), (0, 1));
                let EventBody::InboxSpliced(claimed) = &events[i + 1].body else {
                    panic!("a turn claims its prompt right after it starts");
                };
                assert_eq!((claimed.removed, claimed.canceled), (1, false));
                assert!(claimed.inserted.is_empty());
                steps = 0;
            }
            EventBody::StepStart(_) => {
                steps += 1;
                chunks = 0;
            }
            EventBody::AssistantChunk(_) => chunks += 1,
            EventBody::StepEnd(_) => chunks_per_step.push(chunks),
            EventBody::TurnEnd(end) => {
                assert_eq!(end.reason, TurnEndReason::Completed);
                steps_per_turn.push(steps);
            }
            EventBody::UserMessage(m) => {
                let len = m.text().len();
                assert!(
                    (200..=600).contains(&len),
                    "prompt of a few hundred bytes, got {len}"
                );
            }
            EventBody::ToolResult(r) => {
                let len = encode_record(event).len();
                assert!(
                    (900..=1_400).contains(&len),
                    "tool result of about 1 KiB, got {len}"
                );
                assert!(r.error.is_none());
            }
            EventBody::ToolCall(c) => {
                assert!(c.arguments.starts_with('{') && c.arguments.ends_with('}'));
            }
            _ => {}
        }
    }
    assert!(steps_per_turn.iter().all(|s| (2..=3).contains(s)));
    assert!(
        chunks_per_step.iter().all(|&c| c >= 20),
        "dozens of chunks per step"
    );
}

#[test]
fn random_event_bodies_reach_every_variant() {
    let mut rng = SplitMix64::new(1);
    let kinds: BTreeSet<EventKind> = (0..2_000)
        .map(|_| random_event_body(&mut rng).kind())
        .collect();
    let mut expected: BTreeSet<EventKind> = EventKind::KNOWN.into_iter().collect();
    expected.insert(EventKind::Opaque);
    assert_eq!(kinds, expected);
}

#[test]
fn generated_logs_cover_the_vocabulary_and_both_tails() {
    let logs = sample(arb_valid_log(6), 300);
    let mut kinds = BTreeSet::new();
    let (mut balanced, mut open, mut not_started, mut lineage) = (0, 0, 0, 0);
    let mut unanswered_in_closed_step = 0;
    for log in &logs {
        kinds.extend(log.iter().map(Event::kind));
        if is_balanced(log) {
            balanced += 1;
        } else {
            open += 1;
        }
        for event in log {
            match &event.body {
                EventBody::ToolResult(r)
                    if r.error.as_ref().is_some_and(|e| e.code == TOOL_NOT_STARTED) =>
                {
                    not_started += 1
                }
                EventBody::SessionLineage(_) => lineage += 1,
                _ => {}
            }
        }
        // A log whose closers answer a call: some calls stay pending at the tail.
        if interrupted_turn_closers(log)
            .iter()
            .any(|e| e.kind() == EventKind::ToolResult)
        {
            unanswered_in_closed_step += 1;
        }
    }
    let mut expected: BTreeSet<EventKind> = EventKind::KNOWN.into_iter().collect();
    expected.insert(EventKind::Opaque);
    assert_eq!(kinds, expected, "every kind appears in some generated log");
    assert!(
        balanced > 30 && open > 30,
        "balanced {balanced}, open {open}"
    );
    assert!(not_started > 0 && lineage > 0);
    assert!(unanswered_in_closed_step > 0);
}

#[test]
fn valid_log_from_ops_is_deterministic() {
    let ops: Vec<u64> = (0..400).map(|i| i * 0x9E37_79B9).collect();
    let a = valid_log_from_ops(1_000, &ops, 5, false);
    assert_eq!(a, valid_log_from_ops(1_000, &ops, 5, false));
    check_seed(&a).unwrap();
    let closed = valid_log_from_ops(1_000, &ops, 5, true);
    assert!(is_balanced(&closed));
    assert_eq!(&closed[..a.len()], &a[..], "closing only appends");
}

#[test]
fn split_batches_keeps_order_and_tolerates_bad_sizes() {
    let events = realistic_session(3, 50);
    let batches = split_batches(&events, &[0, 5, 0, 7]);
    assert_eq!(batches.len(), 5);
    assert_eq!(batches.concat(), events);
    let batches = split_batches(&events, &[events.len() + 10, 3]);
    assert_eq!(batches.concat(), events);
    assert!(batches[1].is_empty());
}

proptest! {
    #[test]
    fn every_prefix_of_a_generated_log_satisfies_the_seed_contract(events in arb_valid_log(6)) {
        // Replaying event by event checks each prefix once; check_seed on the whole log re-checks
        // the same fold from scratch.
        let mut log = Log::new();
        for event in &events {
            prop_assert!(log.append(vec![event.clone()]).is_ok(), "refused {:?}", event);
        }
        prop_assert!(check_seed(&events).is_ok());
    }

    #[test]
    fn balanced_generated_logs_are_balanced(events in arb_balanced_log(4)) {
        prop_assert!(check_seed(&events).unwrap().is_balanced());
        prop_assert_eq!(balanced_cuts(&events).last().copied(), Some(events.len()));
    }

    #[test]
    fn lineage_events_carry_the_running_digest_of_the_events_before_them(events in arb_valid_log(4)) {
        let mut chain = Chain::new();
        for event in &events {
            if let EventBody::SessionLineage(lineage) = &event.body {
                prop_assert_eq!(lineage.seed_len, event.seq);
                prop_assert_eq!(lineage.seed_digest, chain.digest());
            }
            chain.update(&encode_record(event));
        }
    }

    #[test]
    fn balanced_cuts_are_exactly_the_balanced_prefixes(events in arb_valid_log(4)) {
        let cuts = balanced_cuts(&events);
        for k in 0..=events.len() {
            prop_assert_eq!(cuts.contains(&k), is_balanced(&events[..k]), "k = {}", k);
        }
    }

    #[test]
    fn partitions_add_up((len, sizes) in (0usize..400).prop_flat_map(|len| (Just(len), arb_partition(len)))) {
        prop_assert_eq!(sizes.iter().sum::<usize>(), len);
    }
}
