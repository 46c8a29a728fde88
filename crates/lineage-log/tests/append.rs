//! The append and seed contracts, and the turn/step structure both enforce.
//!
//! Append: a batch continues at the next seq (the log's length), contiguously, and every event is
//! valid where it lands; a refused batch, whatever the reason, leaves the log exactly as it was.
//! Seed: seqs equal indexes from 0 and every event is valid where it stands; a seed need not be
//! balanced.

use lineage_log::{
    ApprovalPolicy, Custom, Event, EventBody, EventKind, InboxSpliced, InboxTarget, Log, LogError,
    PolicySource, SandboxMode, Structure, TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN, TurnEndReason,
    check_append, check_seed, completed_turn_prefix,
};
use lineage_testkit::ev::{self, mid};
use lineage_testkit::realistic_session;

/// A log holding `bodies` at seqs `0..`.
fn log_of(bodies: Vec<EventBody>) -> Log {
    Log::from_seed(ev::log(bodies)).expect("the fixture is a valid seed")
}

/// `bodies` as events continuing `log`.
fn next(log: &Log, bodies: Vec<EventBody>) -> Vec<Event> {
    let first = log.next_seq();
    bodies
        .into_iter()
        .enumerate()
        .map(|(i, body)| Event::new(first + i as u64, 7, body))
        .collect()
}

/// Appends `bodies` to `log`, expecting a refusal that leaves the log unchanged; returns the error.
fn refused(log: &mut Log, bodies: Vec<EventBody>) -> LogError {
    let batch = next(log, bodies);
    let (events, structure) = (log.events().to_vec(), log.structure().clone());
    let err = log.append(batch).expect_err("the batch breaks a rule");
    assert_eq!(log.events(), &events[..], "a refused append adds no event");
    assert_eq!(
        log.structure(),
        &structure,
        "a refused append leaves the structure as it was"
    );
    err
}

/// Appends `bodies` to `log` expecting the refusal [`refused`] checks, an invalid-event error for
/// the event at `seq` of kind `kind`, and returns its reason.
fn refused_as(log: &mut Log, bodies: Vec<EventBody>, seq: u64, kind: EventKind) -> String {
    match refused(log, bodies) {
        LogError::InvalidEvent {
            seq: s,
            kind: k,
            reason,
        } => {
            assert_eq!((s, k), (seq, kind), "the error names the event ({reason})");
            reason
        }
        other => panic!("expected InvalidEvent at seq {seq}, got {other:?}"),
    }
}

fn in_turn_one() -> Log {
    log_of(vec![ev::turn_start(1)])
}

fn in_step_one() -> Log {
    log_of(vec![ev::turn_start(1), ev::step_start(1, 1)])
}

// ---- seqs ----

#[test]
fn the_first_event_of_an_empty_log_must_have_seq_0() {
    let mut log = Log::new();
    let err = log
        .append(vec![Event::new(1, 0, ev::turn_start(1))])
        .unwrap_err();
    assert_eq!(
        err,
        LogError::SeqMismatch {
            index: 0,
            expected: 0,
            got: 1
        }
    );
    assert!(log.events().is_empty());
    assert_eq!(log.structure(), &Structure::new());
}

#[test]
fn a_gap_inside_a_batch_names_its_index_the_expected_seq_and_the_seq_found() {
    let mut log = log_of(vec![ev::user(mid(1), "hi")]);
    let batch = vec![
        Event::new(1, 0, ev::turn_start(1)),
        Event::new(2, 0, ev::step_start(1, 1)),
        Event::new(4, 0, ev::step_end(1, 1)),
    ];
    let before = log.events().to_vec();
    let err = log.append(batch).unwrap_err();
    assert_eq!(
        err,
        LogError::SeqMismatch {
            index: 2,
            expected: 3,
            got: 4
        }
    );
    let message = err.to_string();
    assert!(message.contains('2') && message.contains('3') && message.contains('4'));
    assert_eq!(
        log.events(),
        &before[..],
        "the valid head of the batch is not kept either"
    );
    assert_eq!(log.next_seq(), 1);
}

#[test]
fn a_repeated_seq_is_refused() {
    let mut log = log_of(vec![ev::user(mid(1), "hi")]);
    let err = log
        .append(vec![Event::new(0, 0, ev::user(mid(2), "again"))])
        .unwrap_err();
    assert_eq!(
        err,
        LogError::SeqMismatch {
            index: 0,
            expected: 1,
            got: 0
        }
    );
}

#[test]
fn batches_continue_where_the_log_ends() {
    let mut log = Log::new();
    log.append(ev::log([ev::user(mid(1), "a"), ev::turn_start(1)]))
        .unwrap();
    assert_eq!(log.next_seq(), 2);
    assert_eq!(log.structure().next_seq(), 2);
    log.append(next(&log, vec![ev::turn_completed(1)])).unwrap();
    assert_eq!(log.next_seq(), 3);
    assert!(log.is_balanced());
}

#[test]
fn an_empty_batch_changes_nothing() {
    let mut log = in_step_one();
    let before = log.clone();
    log.append(Vec::new()).unwrap();
    assert_eq!(log.events(), before.events());
    assert_eq!(log.structure(), before.structure());
}

#[test]
fn check_append_leaves_the_given_structure_alone_and_returns_the_next_one() {
    let log = in_turn_one();
    let structure = log.structure().clone();
    let after = check_append(&structure, &next(&log, vec![ev::step_start(1, 1)])).unwrap();
    assert_eq!(log.structure(), &structure);
    assert_eq!(after.open_step(), Some(1));
    assert_eq!(after.next_seq(), 2);
    assert!(check_append(&structure, &next(&log, vec![ev::step_start(1, 2)])).is_err());
}

#[test]
fn a_refused_append_changes_nothing_whatever_the_reason() {
    let mut log = in_step_one();
    let cases: Vec<(&str, Vec<EventBody>)> = vec![
        (
            "nested turn",
            vec![ev::text_delta(1, 1, "ok"), ev::turn_start(2)],
        ),
        ("turn end with open step", vec![ev::turn_completed(1)]),
        ("wrong step", vec![ev::step_end(1, 2)]),
        (
            "unanswerable result",
            vec![ev::tool_result(1, 1, mid(1), "nope", "x")],
        ),
        (
            "bad shape",
            vec![EventBody::from(lineage_log::Message {
                role: lineage_log::Role::Assistant,
                ..ev::user_text_message(mid(2), "x")
            })],
        ),
    ];
    for (what, bodies) in cases {
        let err = refused(&mut log, bodies);
        assert!(
            matches!(err, LogError::InvalidEvent { .. }),
            "{what}: {err:?}"
        );
    }
    // A wrong seq too.
    let before = log.events().to_vec();
    assert!(
        log.append(vec![Event::new(9, 0, ev::step_end(1, 1))])
            .is_err()
    );
    assert_eq!(log.events(), &before[..]);
    // The log still takes the events that are valid.
    log.append(next(&log, vec![ev::step_end(1, 1), ev::turn_completed(1)]))
        .unwrap();
    assert!(log.is_balanced());
}

// ---- turns ----

#[test]
fn turns_are_numbered_from_one() {
    let mut log = Log::new();
    let reason = refused_as(&mut log, vec![ev::turn_start(2)], 0, EventKind::TurnStart);
    assert!(reason.contains("expected turn 1"), "{reason}");
    refused(&mut log, vec![ev::turn_start(0)]);
    log.append(next(&log, vec![ev::turn_start(1)])).unwrap();
}

#[test]
fn turns_are_consecutive() {
    let mut log = log_of(vec![ev::turn_start(1), ev::turn_completed(1)]);
    refused_as(&mut log, vec![ev::turn_start(3)], 2, EventKind::TurnStart);
    refused_as(&mut log, vec![ev::turn_start(1)], 2, EventKind::TurnStart);
    log.append(next(&log, vec![ev::turn_start(2)])).unwrap();
}

#[test]
fn turns_do_not_nest() {
    let mut log = in_turn_one();
    let reason = refused_as(&mut log, vec![ev::turn_start(2)], 1, EventKind::TurnStart);
    assert!(reason.contains("still open"), "{reason}");
}

#[test]
fn turn_end_must_name_the_open_turn() {
    for (mut log, end, seq) in [
        (in_turn_one(), ev::turn_completed(2), 1),
        (Log::new(), ev::turn_completed(1), 0),
    ] {
        refused_as(&mut log, vec![end], seq, EventKind::TurnEnd);
    }
}

#[test]
fn a_turn_cannot_end_while_its_step_is_open() {
    let mut log = in_step_one();
    let reason = refused_as(&mut log, vec![ev::turn_completed(1)], 2, EventKind::TurnEnd);
    assert!(reason.contains("step 1"), "{reason}");
    log.append(next(&log, vec![ev::step_end(1, 1), ev::turn_completed(1)]))
        .unwrap();
}

#[test]
fn a_turn_may_end_for_any_reason_with_calls_unanswered() {
    let mut log = in_step_one();
    log.append(next(
        &log,
        vec![
            ev::assistant_calls(1, 1, mid(1), &[("c1", "grep")]),
            ev::tool_call(1, 1, "c1", "grep", "{}"),
            ev::step_end(1, 1),
            ev::turn_end(1, TurnEndReason::Blocked),
        ],
    ))
    .unwrap();
    assert!(log.is_balanced());
}

// ---- steps ----

#[test]
fn steps_are_numbered_from_one_within_each_turn() {
    let mut log = in_turn_one();
    let start = vec![ev::step_start(1, 2)];
    refused_as(&mut log, start, 1, EventKind::StepStart);
    log.append(next(
        &log,
        vec![
            ev::step_start(1, 1),
            ev::step_end(1, 1),
            ev::step_start(1, 2),
            ev::step_end(1, 2),
            ev::turn_completed(1),
            ev::turn_start(2),
        ],
    ))
    .unwrap();
    // A new turn numbers its steps from 1 again.
    refused(&mut log, vec![ev::step_start(2, 3)]);
    log.append(next(&log, vec![ev::step_start(2, 1)])).unwrap();
}

#[test]
fn steps_are_consecutive() {
    let mut log = log_of(vec![
        ev::turn_start(1),
        ev::step_start(1, 1),
        ev::step_end(1, 1),
    ]);
    let start = vec![ev::step_start(1, 3)];
    let reason = refused_as(&mut log, start, 3, EventKind::StepStart);
    assert!(reason.contains("expected step 2"), "{reason}");
    refused(&mut log, vec![ev::step_start(1, 1)]);
}

#[test]
fn steps_do_not_nest() {
    let mut log = in_step_one();
    let start = vec![ev::step_start(1, 2)];
    refused_as(&mut log, start, 2, EventKind::StepStart);
}

#[test]
fn a_step_opens_only_inside_its_turn() {
    for (mut log, start, seq) in [
        (Log::new(), ev::step_start(1, 1), 0),
        (in_turn_one(), ev::step_start(2, 1), 1),
    ] {
        refused_as(&mut log, vec![start], seq, EventKind::StepStart);
    }
}

#[test]
fn step_end_must_name_the_open_step() {
    for (mut log, end, seq) in [
        (in_step_one(), ev::step_end(1, 2), 2),
        (in_step_one(), ev::step_end(2, 1), 2),
        (in_turn_one(), ev::step_end(1, 1), 1),
    ] {
        refused_as(&mut log, vec![end], seq, EventKind::StepEnd);
    }
}

// ---- step contents ----

#[test]
fn a_chunk_outside_a_step_is_refused() {
    let chunk = |log: &mut Log, step, seq| {
        let delta = vec![ev::text_delta(1, step, "x")];
        refused_as(log, delta, seq, EventKind::AssistantChunk)
    };
    let reason = chunk(&mut Log::new(), 1, 0);
    assert!(reason.contains("no turn is open"), "{reason}");
    chunk(&mut in_turn_one(), 1, 1);
    let mut wrong_step = in_step_one();
    chunk(&mut wrong_step, 2, 2);
    wrong_step
        .append(next(&wrong_step, vec![ev::text_delta(1, 1, "x")]))
        .unwrap();
}

#[test]
fn assistant_messages_and_tool_calls_belong_to_the_open_step() {
    // Outside a step, then inside step 1 naming another turn (the message) or step (the call).
    for (mut log, seq, (message_turn, message_step), (call_turn, call_step)) in [
        (in_turn_one(), 1, (1, 1), (1, 1)),
        (in_step_one(), 2, (2, 1), (1, 2)),
    ] {
        let message = vec![ev::assistant_text(message_turn, message_step, mid(1), "x")];
        refused_as(&mut log, message, seq, EventKind::AssistantMessage);
        let call = vec![ev::tool_call(call_turn, call_step, "c", "grep", "{}")];
        refused_as(&mut log, call, seq, EventKind::ToolCall);
    }
}

#[test]
fn a_tool_result_needs_a_pending_tool_call_of_its_step() {
    let mut log = in_step_one();
    let asked_only = vec![
        ev::assistant_calls(1, 1, mid(1), &[("c1", "grep")]),
        ev::tool_result(1, 1, mid(2), "c1", "x"),
    ];
    refused_as(&mut log, asked_only, 3, EventKind::ToolResult);
    log.append(next(
        &log,
        vec![
            ev::assistant_calls(1, 1, mid(1), &[("c1", "grep")]),
            ev::tool_call(1, 1, "c1", "grep", "{}"),
            ev::tool_result(1, 1, mid(2), "c1", "x"),
        ],
    ))
    .unwrap();
    // One result per tool/call.
    let result = vec![ev::tool_result(1, 1, mid(3), "c1", "again")];
    refused_as(&mut log, result, 5, EventKind::ToolResult);
}

#[test]
fn a_result_in_a_later_step_does_not_answer_a_call_of_an_earlier_step() {
    let mut log = log_of(vec![
        ev::turn_start(1),
        ev::step_start(1, 1),
        ev::tool_call(1, 1, "c1", "grep", "{}"),
        ev::step_end(1, 1),
        ev::step_start(1, 2),
    ]);
    for step in [2, 1] {
        let late = ev::tool_result(1, step, mid(1), "c1", "late");
        refused_as(&mut log, vec![late], 5, EventKind::ToolResult);
    }
}

#[test]
fn a_synthetic_tool_not_started_result_needs_no_tool_call() {
    let mut log = in_step_one();
    log.append(next(
        &log,
        vec![
            ev::assistant_calls(1, 1, mid(1), &[("c1", "grep")]),
            ev::tool_error(1, 1, mid(2), "c1", "ToolNotStarted", TOOL_NOT_STARTED),
        ],
    ))
    .unwrap();
}

#[test]
fn only_tool_not_started_is_exempt_from_the_pending_call_rule() {
    let mut log = in_step_one();
    for code in [TOOL_OUTCOME_UNKNOWN, "TOOL_FAILED", "tool_not_started"] {
        refused_as(
            &mut log,
            vec![ev::tool_error(1, 1, mid(2), "c1", "Error", code)],
            2,
            EventKind::ToolResult,
        );
    }
    // Even the synthetic result must sit in the open step.
    let mut no_step = in_turn_one();
    refused(
        &mut no_step,
        vec![ev::tool_error(
            1,
            1,
            mid(2),
            "c1",
            "ToolNotStarted",
            TOOL_NOT_STARTED,
        )],
    );
}

#[test]
fn log_only_events_may_appear_anywhere() {
    let anywhere = || -> Vec<EventBody> {
        vec![
            ev::user(mid(1), "typed"),
            InboxSpliced {
                target: InboxTarget::NextStep,
                start: 0,
                removed: 0,
                inserted: vec![ev::user_text_message(mid(2), "steer")],
                canceled: false,
            }
            .into(),
            ApprovalPolicy {
                policy: "never".into(),
                source: PolicySource::Own,
            }
            .into(),
            SandboxMode {
                mode: "read-only".into(),
                source: PolicySource::Delegation,
            }
            .into(),
            Custom {
                type_name: "todo/write".into(),
                payload: "[]".into(),
                ignorable: false,
            }
            .into(),
            lineage_log::Opaque {
                tag: 4_000_000,
                payload: vec![1, 2, 3].into(),
            }
            .into(),
        ]
    };
    for mut log in [Log::new(), in_turn_one(), in_step_one()] {
        let before = log.structure().clone();
        log.append(next(&log, anywhere())).unwrap();
        assert_eq!(log.structure().open_turn(), before.open_turn());
        assert_eq!(log.structure().open_step(), before.open_step());
    }
}

// ---- seeds ----

#[test]
fn a_seed_seq_that_differs_from_its_index_is_refused_naming_the_index() {
    let mut events = ev::log([
        ev::user(mid(1), "a"),
        ev::user(mid(2), "b"),
        ev::user(mid(3), "c"),
    ]);
    events[2].seq = 5;
    match check_seed(&events) {
        Err(LogError::InvalidSeed { index: 2, reason }) => {
            assert!(reason.contains('5'), "{reason}")
        }
        other => panic!("expected InvalidSeed at index 2, got {other:?}"),
    }
    assert!(Log::from_seed(events).is_err());
}

#[test]
fn a_seed_starts_at_seq_0() {
    let events = vec![Event::new(1, 0, ev::user(mid(1), "a"))];
    assert!(matches!(
        check_seed(&events),
        Err(LogError::InvalidSeed { index: 0, .. })
    ));
}

#[test]
fn a_seed_that_breaks_the_structure_is_refused_naming_the_index() {
    let events = ev::log([ev::turn_start(1), ev::turn_start(2)]);
    assert!(matches!(
        check_seed(&events),
        Err(LogError::InvalidSeed { index: 1, .. })
    ));
    let events = ev::log([ev::turn_start(1), ev::text_delta(1, 1, "no step")]);
    assert!(matches!(
        check_seed(&events),
        Err(LogError::InvalidSeed { index: 1, .. })
    ));
}

#[test]
fn an_unbalanced_seed_is_accepted() {
    let events = ev::log([
        ev::turn_start(1),
        ev::step_start(1, 1),
        ev::assistant_calls(1, 1, mid(1), &[("c1", "grep")]),
        ev::tool_call(1, 1, "c1", "grep", "{}"),
    ]);
    let structure = check_seed(&events).unwrap();
    assert!(!structure.is_balanced());
    assert_eq!(
        (structure.open_turn(), structure.open_step()),
        (Some(1), Some(1))
    );
    let mut log = Log::from_seed(events).unwrap();
    assert!(!log.is_balanced());
    // The seeded log keeps enforcing the rules where the seed left off.
    let pending = vec![ev::tool_result(1, 1, mid(2), "c1", "ok")];
    log.append(next(&log, pending)).unwrap();
}

#[test]
fn the_empty_seed_is_the_empty_log() {
    assert_eq!(check_seed(&[]).unwrap(), Structure::new());
    assert!(Log::from_seed(Vec::new()).unwrap().events().is_empty());
}

#[test]
fn seeding_and_appending_event_by_event_fold_to_the_same_structure() {
    let events = realistic_session(11, 300);
    let mut log = Log::new();
    for event in &events {
        log.append(vec![event.clone()]).unwrap();
    }
    assert_eq!(log.structure(), &check_seed(&events).unwrap());
    assert_eq!(
        log.structure(),
        Log::from_seed(events.clone()).unwrap().structure()
    );
    assert_eq!(log.events(), &events[..]);
}

#[test]
fn a_balanced_log_has_the_structure_balanced_at_its_length_and_last_turn() {
    let events = realistic_session(12, 300);
    let prefix = completed_turn_prefix(&events[..250]);
    let last_turn = check_seed(prefix).unwrap().last_turn();
    assert!(last_turn > 0);
    assert_eq!(
        check_seed(prefix).unwrap(),
        Structure::balanced_at(prefix.len() as u64, last_turn)
    );
    assert_eq!(check_seed(&[]).unwrap(), Structure::balanced_at(0, 0));
}
