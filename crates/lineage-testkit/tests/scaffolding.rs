//! The shared scaffolding keeps its word: turn builders make valid, balanced logs at any seq,
//! readers report what the log says, and a helper process is run, heard and killed.

use lineage_log::{TurnEndReason, check_seed, is_balanced};
use lineage_testkit::process::{after_marker, crash_after_report, helper_command, report_line};
use lineage_testkit::read::{Answer, answer_to, kinds, tool_answers, turn_ends, user_texts};
use lineage_testkit::{TurnStream, ev, last_turn};

/// Names the job of the helper below; without it the helper does nothing.
const JOB_VAR: &str = "LINEAGE_TESTKIT_SCAFFOLDING_JOB";

#[test]
fn completed_turns_numbered_back_to_back_are_a_valid_balanced_log() {
    let mut events = ev::numbered(
        0,
        1_000,
        10,
        ev::completed_turn(1, ev::mid(1), "first", ev::mid(2), "one"),
    );
    let next = events.len() as u64;
    events.extend(ev::numbered(
        next,
        1_000,
        10,
        ev::completed_turn(2, ev::mid(3), "second", ev::mid(4), "two"),
    ));
    check_seed(&events).expect("the log is valid");
    assert!(is_balanced(&events));
    assert_eq!(events.len(), 12);
    assert!(events.iter().enumerate().all(|(i, e)| e.seq == i as u64));
    assert_eq!(events[7].time_ms, 1_070);
    assert_eq!(user_texts(&events), ["first", "second"]);
    assert_eq!(
        turn_ends(&events),
        [TurnEndReason::Completed, TurnEndReason::Completed]
    );
    assert_eq!(kinds(&events[..2]), ["turn/start", "step/start"]);
}

#[test]
fn tool_answers_report_call_text_and_error_code() {
    let events = ev::log([
        ev::turn_start(1),
        ev::step_start(1, 1),
        ev::user(ev::mid(1), "run both"),
        ev::assistant_calls(1, 1, ev::mid(2), &[("c1", "grep"), ("c2", "shell")]),
        ev::tool_call(1, 1, "c1", "grep", "{}"),
        ev::tool_result(1, 1, ev::mid(3), "c1", "found it"),
        ev::tool_call(1, 1, "c2", "shell", "{}"),
        ev::tool_error(1, 1, ev::mid(4), "c2", "Timeout", "TOOL_TIMEOUT"),
        ev::step_end(1, 1),
        ev::turn_completed(1),
    ]);
    check_seed(&events).expect("the log is valid");
    let answers = tool_answers(&events);
    assert_eq!(
        answers[0],
        Answer {
            call: "c1".into(),
            text: "found it".into(),
            is_error: false,
            code: None,
        }
    );
    let failed = answer_to(&answers, "c2");
    assert!(failed.is_error);
    assert_eq!(failed.code.as_deref(), Some("TOOL_TIMEOUT"));
}

#[test]
#[should_panic(expected = "no answer to c9")]
fn answer_to_names_the_missing_call() {
    answer_to(&[], "c9");
}

#[test]
fn a_marker_is_found_after_libtests_own_words() {
    assert_eq!(
        after_marker("test crash_host_child ... reached 42 7", "reached "),
        Some("42 7")
    );
    assert_eq!(after_marker("running 1 test", "reached "), None);
}

/// The test re-runs itself as its own helper: in the child (the environment names the job) it
/// reports `reached <pid>` and waits to be killed, so no helper test sits ignored beside it.
#[test]
fn a_helper_is_heard_then_killed() {
    if std::env::var(JOB_VAR).is_ok() {
        report_line(&format!("reached {}", std::process::id()));
        loop {
            std::thread::park();
        }
    }
    let reached = crash_after_report(
        helper_command("a_helper_is_heard_then_killed").env(JOB_VAR, "1"),
        "reached ",
    );
    let pid: u32 = reached.parse().expect("the helper printed its pid");
    assert_ne!(
        pid,
        std::process::id(),
        "the helper ran in a process of its own"
    );
}

#[test]
fn a_turn_stream_is_valid_in_any_batching_and_regenerates_exactly() {
    let mut stream = TurnStream::new(7, 0, 1);
    let mut events = Vec::new();
    for size in [1, 5, 40, 3, 120] {
        events.extend(stream.take(size));
    }
    events.extend(stream.rest_of_turn());
    check_seed(&events).expect("the stream continues a valid log");
    assert!(
        is_balanced(&events),
        "rest_of_turn closes the turn under way"
    );
    assert_eq!(TurnStream::new(7, 0, 1).take(events.len()), events);
    // A stream continuing the balanced log after its last turn keeps it valid.
    let next = TurnStream::new(8, events.len() as u64, last_turn(&events) + 1).take(50);
    events.extend(next);
    check_seed(&events).expect("the continuation is valid");
}
