//! Crash repair: `interrupted_turn_closers` closes a log torn mid-turn, and nothing else.
//!
//! The closers are, in order: one error `tool/result` per call the open step's assistant messages
//! asked for and never got answered (in the order they were asked; `TOOL_OUTCOME_UNKNOWN` when a
//! `tool/call` was logged for it, `TOOL_NOT_STARTED` when not), then `step/end` if a step is open,
//! then `turn/end {Interrupted}`. Seqs continue from the last event; every closer carries the last
//! event's time.

use lineage_log::{
    ContentBlock, Event, EventBody, EventKind, Log, MessageSource, Role, TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN, ToolResult, TurnEndReason, check_seed, check_shape,
    interrupted_turn_closers, is_balanced,
};
use lineage_testkit::ev::{self, mid};
use lineage_testkit::realistic_session;

/// The prefix every test below tears: one completed turn, then turn 2 with step 1 open.
fn torn_in_step() -> Vec<EventBody> {
    vec![
        ev::user(mid(1), "hello"),
        ev::turn_start(1),
        ev::step_start(1, 1),
        ev::assistant_text(1, 1, mid(2), "hi"),
        ev::step_end(1, 1),
        ev::turn_completed(1),
        ev::turn_start(2),
        ev::step_start(2, 1),
    ]
}

/// [`torn_in_step`] with the assistant's message asking for two `grep` calls, `c1` and `c2`.
fn asked_two_greps() -> Vec<EventBody> {
    let mut bodies = torn_in_step();
    let calls = [("c1", "grep"), ("c2", "grep")];
    bodies.push(ev::assistant_calls(2, 1, mid(3), &calls));
    bodies
}

fn result(event: &Event) -> &ToolResult {
    match &event.body {
        EventBody::ToolResult(r) => r,
        other => panic!("expected a tool/result, got {other:?}"),
    }
}

fn call_of(event: &Event) -> &str {
    match &result(event).message.source {
        MessageSource::Tool { call_id } => call_id.as_str(),
        other => panic!("a tool result has a tool source, got {other:?}"),
    }
}

fn code_of(event: &Event) -> &str {
    result(event)
        .error
        .as_ref()
        .expect("closers carry an error")
        .code
        .as_str()
}

fn kinds(events: &[Event]) -> Vec<EventKind> {
    events.iter().map(Event::kind).collect()
}

fn closed(events: &[Event]) -> Vec<Event> {
    let mut all = events.to_vec();
    all.extend(interrupted_turn_closers(events));
    all
}

#[test]
fn an_empty_log_needs_no_closers() {
    assert!(interrupted_turn_closers(&[]).is_empty());
}

#[test]
fn a_balanced_log_needs_no_closers() {
    let events = realistic_session(1, 200);
    assert!(interrupted_turn_closers(&events).is_empty());
}

#[test]
fn log_only_events_after_the_last_turn_end_keep_a_log_balanced() {
    let mut bodies = torn_in_step();
    bodies.truncate(6);
    bodies.push(ev::user(mid(9), "between turns"));
    bodies.push(
        lineage_log::Custom {
            type_name: "todo/write".into(),
            payload: "{}".into(),
            ignorable: true,
        }
        .into(),
    );
    assert!(interrupted_turn_closers(&ev::log(bodies)).is_empty());
}

#[test]
fn log_only_events_before_any_turn_need_no_closers() {
    let events = ev::log([ev::user(mid(1), "queued"), ev::user(mid(2), "more")]);
    assert!(interrupted_turn_closers(&events).is_empty());
}

#[test]
fn an_open_turn_without_a_step_gets_only_turn_end_interrupted() {
    let mut bodies = torn_in_step();
    bodies.pop();
    let events = ev::log(bodies);
    let closers = interrupted_turn_closers(&events);
    assert_eq!(
        closers,
        vec![Event::new(
            events.len() as u64,
            events.last().unwrap().time_ms,
            lineage_log::TurnEnd {
                turn: 2,
                reason: TurnEndReason::Interrupted,
            },
        )]
    );
}

#[test]
fn an_open_step_is_ended_before_the_turn() {
    let events = ev::log(torn_in_step());
    let closers = interrupted_turn_closers(&events);
    assert_eq!(kinds(&closers), [EventKind::StepEnd, EventKind::TurnEnd]);
    assert_eq!(closers[0].body, ev::step_end(2, 1));
    assert_eq!(closers[1].body, ev::turn_end(2, TurnEndReason::Interrupted));
}

#[test]
fn the_open_step_number_is_the_one_closed() {
    let mut bodies = torn_in_step();
    bodies.extend([ev::step_end(2, 1), ev::step_start(2, 2)]);
    let closers = interrupted_turn_closers(&ev::log(bodies));
    assert_eq!(closers[0].body, ev::step_end(2, 2));
}

#[test]
fn results_come_first_in_the_order_the_calls_were_asked_then_step_end_then_turn_end() {
    let mut bodies = torn_in_step();
    bodies.extend([
        ev::assistant_calls(2, 1, mid(3), &[("c-b", "grep"), ("c-a", "read_file")]),
        ev::tool_call(2, 1, "c-a", "read_file", "{}"),
        ev::assistant_calls(2, 1, mid(4), &[("c-c", "grep")]),
    ]);
    let closers = interrupted_turn_closers(&ev::log(bodies));
    assert_eq!(
        kinds(&closers),
        [
            EventKind::ToolResult,
            EventKind::ToolResult,
            EventKind::ToolResult,
            EventKind::StepEnd,
            EventKind::TurnEnd
        ]
    );
    let calls: Vec<&str> = closers[..3].iter().map(call_of).collect();
    assert_eq!(
        calls,
        ["c-b", "c-a", "c-c"],
        "transcript order, not call-record order"
    );
    let codes: Vec<&str> = closers[..3].iter().map(code_of).collect();
    assert_eq!(
        codes,
        [TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN, TOOL_NOT_STARTED]
    );
}

#[test]
fn a_call_without_a_tool_call_record_is_answered_tool_not_started() {
    let mut bodies = torn_in_step();
    bodies.push(ev::assistant_calls(2, 1, mid(3), &[("c1", "grep")]));
    let closers = interrupted_turn_closers(&ev::log(bodies));
    let r = result(&closers[0]);
    assert_eq!((r.turn, r.step), (2, 1));
    let error = r.error.as_ref().unwrap();
    assert_eq!(error.code, TOOL_NOT_STARTED);
    assert!(!error.name.is_empty());
}

#[test]
fn a_call_with_a_tool_call_record_is_answered_tool_outcome_unknown() {
    let mut bodies = torn_in_step();
    bodies.push(ev::assistant_calls(2, 1, mid(3), &[("c1", "run_shell")]));
    bodies.push(ev::tool_call(
        2,
        1,
        "c1",
        "run_shell",
        r#"{"command":"rm -rf build"}"#,
    ));
    let closers = interrupted_turn_closers(&ev::log(bodies));
    let error = result(&closers[0]).error.as_ref().unwrap();
    assert_eq!(error.code, TOOL_OUTCOME_UNKNOWN);
    assert!(!error.name.is_empty());
}

#[test]
fn a_synthetic_result_is_a_well_formed_error_result_for_its_call() {
    let mut bodies = asked_two_greps();
    bodies.push(ev::tool_call(2, 1, "c2", "grep", "{}"));
    let closers = interrupted_turn_closers(&ev::log(bodies));
    let mut texts = Vec::new();
    for closer in &closers[..2] {
        check_shape(closer).expect("closers have the shape of a tool result");
        let message = &result(closer).message;
        assert_eq!(message.role, Role::User);
        let [
            ContentBlock::ToolResult {
                tool_call_id,
                content,
                is_error,
            },
        ] = message.content.as_slice()
        else {
            panic!("one tool-result block");
        };
        assert_eq!(tool_call_id.as_str(), call_of(closer));
        assert!(is_error);
        let [ContentBlock::Text { text }] = content.as_slice() else {
            panic!("the result explains itself in one text block");
        };
        assert!(!text.is_empty());
        texts.push(text.clone());
    }
    assert_ne!(
        texts[0], texts[1],
        "not started and outcome unknown say different things"
    );
    assert_ne!(
        result(&closers[0]).message.id,
        result(&closers[1]).message.id
    );
}

#[test]
fn closer_seqs_continue_the_log_and_every_closer_has_the_last_events_time() {
    let mut events = ev::log(asked_two_greps());
    // The last event's time, not the largest time and not the clock.
    events.last_mut().unwrap().time_ms = -5;
    let closers = interrupted_turn_closers(&events);
    assert_eq!(closers.len(), 4);
    for (i, closer) in closers.iter().enumerate() {
        assert_eq!(closer.seq, events.len() as u64 + i as u64);
        assert_eq!(closer.time_ms, -5);
    }
}

#[test]
fn calls_answered_before_the_crash_get_nothing() {
    let mut bodies = torn_in_step();
    bodies.extend([
        ev::assistant_calls(
            2,
            1,
            mid(3),
            &[("done", "grep"), ("skipped", "grep"), ("open", "grep")],
        ),
        ev::tool_call(2, 1, "done", "grep", "{}"),
        ev::tool_result(2, 1, mid(4), "done", "3 matches"),
        ev::tool_error(2, 1, mid(5), "skipped", "ToolNotStarted", TOOL_NOT_STARTED),
    ]);
    let closers = interrupted_turn_closers(&ev::log(bodies));
    let answered: Vec<&str> = closers
        .iter()
        .filter(|e| e.kind() == EventKind::ToolResult)
        .map(call_of)
        .collect();
    assert_eq!(answered, ["open"]);
}

#[test]
fn calls_of_a_closed_step_get_nothing() {
    let mut bodies = torn_in_step();
    bodies.extend([
        ev::assistant_calls(2, 1, mid(3), &[("c1", "grep")]),
        ev::tool_call(2, 1, "c1", "grep", "{}"),
        ev::step_end(2, 1),
        ev::step_start(2, 2),
    ]);
    let closers = interrupted_turn_closers(&ev::log(bodies));
    assert_eq!(kinds(&closers), [EventKind::StepEnd, EventKind::TurnEnd]);
}

#[test]
fn calls_of_earlier_closed_turns_get_nothing() {
    let events = ev::log([
        ev::turn_start(1),
        ev::step_start(1, 1),
        ev::assistant_calls(1, 1, mid(1), &[("old", "grep")]),
        ev::tool_call(1, 1, "old", "grep", "{}"),
        ev::step_end(1, 1),
        ev::turn_end(
            1,
            TurnEndReason::Error(Box::new(lineage_log::TurnError {
                message: "provider failed".into(),
                code: "PROVIDER".into(),
                status: Some(500),
                retry_after_ms: None,
                request_id: None,
            })),
        ),
        ev::turn_start(2),
    ]);
    assert!(
        interrupted_turn_closers(&events[..6]).is_empty(),
        "an unanswered call in a closed turn is balanced"
    );
    let closers = interrupted_turn_closers(&events);
    assert_eq!(kinds(&closers), [EventKind::TurnEnd]);
}

#[test]
fn a_tool_call_no_assistant_message_asked_for_gets_nothing() {
    let mut bodies = torn_in_step();
    bodies.push(ev::tool_call(2, 1, "unasked", "grep", "{}"));
    let closers = interrupted_turn_closers(&ev::log(bodies));
    assert_eq!(kinds(&closers), [EventKind::StepEnd, EventKind::TurnEnd]);
}

#[test]
fn a_tool_call_logged_before_the_message_asked_for_it_does_not_count_as_started() {
    let mut bodies = torn_in_step();
    bodies.push(ev::tool_call(2, 1, "early", "grep", "{}"));
    bodies.push(ev::assistant_calls(2, 1, mid(3), &[("early", "grep")]));
    let closers = interrupted_turn_closers(&ev::log(bodies));
    assert_eq!(code_of(&closers[0]), TOOL_NOT_STARTED);
}

#[test]
fn closers_close_the_open_turn_by_its_own_number() {
    let events = ev::log([
        ev::turn_start(1),
        ev::turn_completed(1),
        ev::turn_start(2),
        ev::turn_completed(2),
        ev::turn_start(3),
    ]);
    let closers = interrupted_turn_closers(&events);
    assert_eq!(
        closers,
        vec![Event::new(
            5,
            events[4].time_ms,
            lineage_log::TurnEnd {
                turn: 3,
                reason: TurnEndReason::Interrupted,
            }
        )]
    );
}

#[test]
fn closers_are_deterministic() {
    let mut bodies = asked_two_greps();
    bodies.push(ev::tool_call(2, 1, "c1", "grep", "{}"));
    let events = ev::log(bodies);
    let first = interrupted_turn_closers(&events);
    assert_eq!(first, interrupted_turn_closers(&events));
    assert_eq!(first, interrupted_turn_closers(&events.clone()));
}

#[test]
fn closing_a_torn_log_with_its_closers_balances_it_and_satisfies_the_seed_contract() {
    let mut bodies = torn_in_step();
    bodies.extend([
        ev::text_delta(2, 1, "Let me"),
        ev::assistant_calls(
            2,
            1,
            mid(3),
            &[("c1", "grep"), ("c2", "read_file"), ("c3", "grep")],
        ),
        ev::tool_call(2, 1, "c1", "grep", "{}"),
        ev::tool_call(2, 1, "c2", "read_file", "{}"),
        ev::tool_result(2, 1, mid(4), "c2", "fn main() {}"),
    ]);
    let events = ev::log(bodies);
    let all = closed(&events);
    assert!(is_balanced(&all));
    assert!(
        check_seed(&all)
            .expect("closed logs are valid seeds")
            .is_balanced()
    );
    assert!(
        interrupted_turn_closers(&all).is_empty(),
        "closing is idempotent"
    );

    // Repair appends: the closers are a valid batch for the torn log.
    let mut log = Log::from_seed(events).unwrap();
    log.append(interrupted_turn_closers(log.events())).unwrap();
    assert!(log.is_balanced());
    assert_eq!(log.events(), &all[..]);
    // And the session goes on with the next turn.
    let next = Event::new(log.next_seq(), 0, ev::turn_start(3));
    log.append(vec![next]).unwrap();
}

#[test]
fn every_cut_of_a_realistic_session_closes_into_a_valid_balanced_log() {
    let events = realistic_session(5, 400);
    for cut in 0..=events.len() {
        let all = closed(&events[..cut]);
        let structure = check_seed(&all).unwrap_or_else(|e| panic!("cut {cut}: {e}"));
        assert!(structure.is_balanced(), "cut {cut}");
    }
}
