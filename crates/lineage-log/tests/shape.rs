//! `check_shape`: the rules one event satisfies on its own, wherever it lands.
//!
//! User messages and inbox insertions have role user; assistant messages have role assistant and a
//! model source naming endpoint and model; a tool result has role user, a tool source, and exactly
//! one tool-result block answering the call its source names; `session/lineage` sits at
//! `seq == seed_len`; a custom event names its type and carries strict JSON. Append and seed both
//! enforce these.

use lineage_log::{
    CallId, ContentBlock, Custom, Digest, Event, EventBody, EventKind, InboxSpliced, InboxTarget,
    Log, LogError, Message, MessageSource, Role, SessionId, SessionLineage, ToolResult, check_seed,
    check_shape,
};
use lineage_testkit::ev::{self, mid};

fn at(seq: u64, body: impl Into<EventBody>) -> Event {
    Event::new(seq, 0, body)
}

fn ok(body: impl Into<EventBody>) {
    let event = at(3, body);
    assert_eq!(check_shape(&event), Ok(()), "{event:?}");
}

fn bad(body: impl Into<EventBody>) -> String {
    let event = at(3, body);
    check_shape(&event).expect_err("the shape is wrong")
}

fn assistant_with(message: Message) -> EventBody {
    lineage_log::AssistantMessage {
        turn: 1,
        step: 1,
        message,
        usage: None,
        interrupted: false,
    }
    .into()
}

fn tool_result_with(message: Message) -> EventBody {
    ToolResult {
        turn: 1,
        step: 1,
        message,
        error: None,
    }
    .into()
}

#[test]
fn a_user_message_has_role_user_and_any_source() {
    ok(ev::user(mid(1), "hi"));
    for source in [
        MessageSource::Coordinator {
            sender: SessionId::from_u128(1),
        },
        MessageSource::SubagentSettled {
            sender: SessionId::from_u128(2),
            summary: "done".into(),
        },
        MessageSource::Plugin {
            name: "goal".into(),
        },
    ] {
        ok(EventBody::from(Message {
            source,
            ..ev::user_text_message(mid(1), "x")
        }));
    }
    let reason = bad(EventBody::from(Message {
        role: Role::Assistant,
        ..ev::user_text_message(mid(1), "x")
    }));
    assert!(reason.contains("role user"), "{reason}");
}

#[test]
fn an_assistant_message_has_role_assistant_and_a_model_source_naming_endpoint_and_model() {
    ok(ev::assistant_text(1, 1, mid(1), "hi"));
    ok(ev::assistant(1, 1, mid(1), Vec::new()));
    let good = ev::assistant_message(mid(1), vec![ContentBlock::text("x")]);
    let reason = bad(assistant_with(Message {
        role: Role::User,
        ..good.clone()
    }));
    assert!(reason.contains("role assistant"), "{reason}");
    for source in [
        MessageSource::User,
        MessageSource::Model {
            endpoint: "".into(),
            model: "m".into(),
        },
        MessageSource::Model {
            endpoint: "p".into(),
            model: "".into(),
        },
        MessageSource::Tool {
            call_id: CallId::new("c"),
        },
    ] {
        let reason = bad(assistant_with(Message {
            source,
            ..good.clone()
        }));
        assert!(reason.contains("model source"), "{reason}");
    }
}

#[test]
fn a_tool_result_has_role_user_and_a_tool_source() {
    ok(ev::tool_result(1, 1, mid(1), "c1", "out"));
    let good = ev::tool_result_message(mid(1), "c1", "out", false);
    bad(tool_result_with(Message {
        role: Role::Assistant,
        ..good.clone()
    }));
    let reason = bad(tool_result_with(Message {
        source: MessageSource::User,
        ..good
    }));
    assert!(reason.contains("tool source"), "{reason}");
}

#[test]
fn a_tool_result_holds_exactly_one_tool_result_block() {
    let good = ev::tool_result_message(mid(1), "c1", "out", true);
    let block = good.content[0].clone();
    for content in [
        Vec::new(),
        vec![block.clone(), block.clone()],
        vec![ContentBlock::text("out")],
        vec![block.clone(), ContentBlock::text("trailing")],
    ] {
        let reason = bad(tool_result_with(Message {
            content,
            ..good.clone()
        }));
        assert!(reason.contains("exactly one tool-result block"), "{reason}");
    }
    // The block's own content is free, even empty.
    ok(tool_result_with(Message {
        content: vec![ContentBlock::ToolResult {
            tool_call_id: CallId::new("c1"),
            content: Vec::new(),
            is_error: false,
        }],
        ..good
    }));
}

#[test]
fn a_tool_result_block_answers_the_call_its_source_names() {
    let mut message = ev::tool_result_message(mid(1), "c1", "out", false);
    message.source = MessageSource::Tool {
        call_id: CallId::new("c2"),
    };
    let reason = bad(tool_result_with(message));
    assert!(reason.contains("c1") && reason.contains("c2"), "{reason}");
}

#[test]
fn inbox_insertions_are_user_messages() {
    let splice = |inserted| InboxSpliced {
        target: InboxTarget::NextTurn,
        start: 0,
        removed: 0,
        inserted,
        canceled: false,
    };
    ok(splice(vec![
        ev::user_text_message(mid(1), "a"),
        ev::user_text_message(mid(2), "b"),
    ]));
    ok(splice(Vec::new()));
    bad(splice(vec![
        ev::user_text_message(mid(1), "a"),
        ev::assistant_message(mid(2), Vec::new()),
    ]));
}

#[test]
fn session_lineage_sits_at_seq_equal_to_seed_len() {
    let lineage = |seed_len| SessionLineage {
        parent: SessionId::from_u128(7),
        seed_len,
        seed_digest: Digest::of_empty(),
        delegation_depth: 1,
    };
    assert_eq!(check_shape(&at(0, lineage(0))), Ok(()));
    assert_eq!(check_shape(&at(12, lineage(12))), Ok(()));
    let reason = check_shape(&at(12, lineage(11))).unwrap_err();
    assert!(reason.contains("seed_len"), "{reason}");
    assert!(check_shape(&at(12, lineage(13))).is_err());
}

#[test]
fn a_custom_event_names_its_type() {
    let custom = |type_name: &str| Custom {
        type_name: type_name.into(),
        payload: "{}".into(),
        ignorable: false,
    };
    ok(custom("todo/write"));
    bad(custom(""));
}

fn custom_with(payload: &str) -> Custom {
    Custom {
        type_name: "todo/write".into(),
        payload: payload.into(),
        ignorable: false,
    }
}

#[test]
fn a_custom_payload_is_strict_json() {
    ok(custom_with(r#"{"todos": [{"done": false, "cost": -0.5}]}"#));
    for (payload, problem) in [
        ("not json", "expected a value"),
        (r#"{"cost": NaN}"#, "NaN is not a JSON number"),
        ("[Infinity]", "Infinity is not a JSON number"),
        (r#"{"delta": -0}"#, "-0 is negative zero"),
        ("1e999", "too large for a double"),
        ("", "ends where a value was expected"),
        ("{} trailing", "more after the value"),
    ] {
        let reason = bad(custom_with(payload));
        assert!(
            reason.contains("todo/write") && reason.contains(problem),
            "{payload:?}: {reason}"
        );
    }
}

#[test]
fn a_log_refuses_a_batch_with_a_custom_payload_json_cannot_carry_and_keeps_nothing_of_it() {
    let mut log = Log::new();
    log.append(vec![at(0, custom_with("{}"))]).unwrap();
    let batch = vec![at(1, custom_with("[1]")), at(2, custom_with("[NaN]"))];
    match log.append(batch) {
        Err(LogError::InvalidEvent {
            seq: 2,
            kind,
            reason,
        }) => {
            assert_eq!(kind, EventKind::Custom);
            assert!(reason.contains("NaN"), "{reason}");
        }
        other => panic!("expected the event at seq 2 to be refused, got {other:?}"),
    }
    assert_eq!(
        log.next_seq(),
        1,
        "nothing of the refused batch entered the log"
    );
    assert!(check_seed(&[at(0, custom_with("-0.0"))]).is_err());
}

#[test]
fn structural_events_have_no_shape_of_their_own() {
    ok(ev::turn_start(9));
    ok(ev::step_end(4, 2));
    ok(ev::text_delta(1, 1, ""));
    ok(ev::tool_call(1, 1, "c", "grep", "not even json"));
}

#[test]
fn append_refuses_a_misshapen_event_naming_its_seq_and_kind() {
    let mut log = Log::new();
    let event = at(
        0,
        EventBody::from(Message {
            role: Role::Assistant,
            ..ev::user_text_message(mid(1), "x")
        }),
    );
    match log.append(vec![event]) {
        Err(LogError::InvalidEvent {
            seq: 0,
            kind: EventKind::UserMessage,
            ..
        }) => {}
        other => panic!("expected InvalidEvent for seq 0, got {other:?}"),
    }
    assert!(log.events().is_empty());
}

#[test]
fn a_seed_with_a_misshapen_event_is_refused_naming_its_index() {
    let mut events = ev::log([ev::user(mid(1), "ok"), ev::user(mid(2), "ok")]);
    events.push(at(
        2,
        SessionLineage {
            parent: SessionId::from_u128(7),
            seed_len: 0,
            seed_digest: Digest::of_empty(),
            delegation_depth: 0,
        },
    ));
    assert!(matches!(
        check_seed(&events),
        Err(LogError::InvalidSeed { index: 2, .. })
    ));
}
