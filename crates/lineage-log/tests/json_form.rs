//! The stable JSON form (`schema/JSON.md`): every variant round trips to the same event and the
//! same record bytes, whole sessions round trip with their digests, the form's spelling is pinned,
//! and every refusal names its line and seq.

use lineage_log::{
    ContentBlock, Digest, Event, EventBody, Header, JsonFormError, Message, MessageId,
    MessageSource, Role, SessionId, SessionReader, TurnEndReason, encode_record, event_from_json,
    event_line, event_to_json, fold_header, session_from_json_lines, session_to_json_lines,
};
use lineage_testkit::ev::{self, mid};
use lineage_testkit::{SplitMix64, arb_valid_log, random_event_body, running_digests};
use proptest::prelude::*;
use serde_json::{Value, json};

fn config() -> ProptestConfig {
    let default = ProptestConfig::default();
    ProptestConfig {
        cases: default.cases.max(256),
        ..default
    }
}

/// `event` through the JSON form as text and back.
fn through_text(event: &Event) -> Event {
    let text = event_to_json(event).to_string();
    let value: Value = serde_json::from_str(&text).expect("the form is JSON");
    event_from_json(value).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

#[test]
fn every_variant_round_trips_to_the_same_event_and_record() {
    let mut rng = SplitMix64::new(0x150f_0e4d);
    let mut kinds = std::collections::BTreeSet::new();
    for seq in 0..20_000u64 {
        let time_ms = match seq % 4 {
            0 => i64::MIN,
            1 => i64::MAX,
            2 => -1,
            _ => rng.next_u64() as i64,
        };
        let event = Event::new(seq, time_ms, random_event_body(&mut rng));
        kinds.insert(event.kind());
        let back = through_text(&event);
        assert_eq!(back, event);
        assert_eq!(encode_record(&back), encode_record(&event), "seq {seq}");
    }
    assert_eq!(kinds.len(), 16, "every kind, opaque included, was reached");
}

proptest! {
    #![proptest_config(config())]

    /// A whole valid log written in the JSON form reads back as the same events, with the same
    /// running digest at every seq.
    #[test]
    fn sessions_round_trip_with_their_digests(events in arb_valid_log(6)) {
        let header = fold_header(&Header::new(SessionId::from_u128(7), 1_750_000_000_000), &events);
        let text = session_to_json_lines(&header, &events);
        let digests = running_digests(&events)[1..].to_vec();
        for (line, digest) in text.lines().skip(1).zip(&digests) {
            let value: Value = serde_json::from_str(line).unwrap();
            prop_assert_eq!(value["digest"].as_str().unwrap(), digest.to_string());
        }
        let back = session_from_json_lines(&text).unwrap();
        prop_assert_eq!(&back.header, &header);
        prop_assert_eq!(&back.events, &events);
        prop_assert_eq!(back.digest, digests.last().copied().unwrap_or_else(Digest::of_empty));
        // Writing it again gives the same text, byte for byte.
        prop_assert_eq!(session_to_json_lines(&back.header, &back.events), text);
    }
}

/// A small valid session: one completed turn, with a tool call.
fn session() -> (Header, Vec<Event>) {
    let bodies = vec![
        ev::turn_start(1),
        ev::step_start(1, 1),
        ev::user(mid(1), "List the files"),
        ev::assistant(
            1,
            1,
            mid(2),
            vec![ev::call_block("c1", "ls", r#"{"path":"."}"#)],
        ),
        ev::tool_call(1, 1, "c1", "ls", r#"{"path":"."}"#),
        ev::tool_result(1, 1, mid(3), "c1", "README.md"),
        ev::step_end(1, 1),
        ev::turn_completed(1),
    ];
    let events = ev::numbered(0, 1_750_000_000_000, 1_000, bodies);
    let header = Header::new(
        "019b76da-a800-7000-8000-000000000001".parse().unwrap(),
        1_750_000_000_000,
    )
    .with_cwd("/work/project");
    (header, events)
}

fn refused(text: &str) -> JsonFormError {
    match session_from_json_lines(text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e,
    }
}

/// `text` with line `n` (from 1) replaced by what `edit` makes of its JSON.
fn edit_line(text: &str, n: usize, edit: impl FnOnce(&mut Value)) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let mut value: Value = serde_json::from_str(&lines[n - 1]).unwrap();
    edit(&mut value);
    lines[n - 1] = value.to_string();
    lines.join("\n") + "\n"
}

#[test]
fn the_spelling_is_pinned() {
    let (header, events) = session();
    let text = session_to_json_lines(&header, &events);
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let digests = running_digests(&events)[1..].to_vec();
    assert_eq!(
        lines[0],
        json!({
            "type": "lineage/session", "json_form": 1, "format_version": 1,
            "id": "019b76da-a800-7000-8000-000000000001", "created_at_ms": 1_750_000_000_000u64,
            "cwd": "/work/project", "parent": null, "seed_len": 0, "origin": null,
            "delegation_depth": 0, "agent_preset": null, "seed_digest": null,
            "events": 8, "digest": digests[7].to_string(),
        })
    );
    assert_eq!(
        lines[1],
        json!({"seq": 0, "time_ms": 1_750_000_000_000i64, "type": "turn/start",
               "data": {"turn": 1}, "digest": digests[0].to_string()})
    );
    assert_eq!(
        lines[3]["data"],
        json!({"id": mid(1).to_string(), "role": "user",
               "content": [{"type": "text", "text": "List the files"}],
               "source": {"kind": "user"}})
    );
    assert_eq!(
        lines[4]["data"]["message"]["content"],
        json!([{"type": "tool-call", "id": "c1", "name": "ls", "arguments": "{\"path\":\".\"}"}])
    );
    assert_eq!(
        lines[4]["data"]["message"]["source"],
        json!({"kind": "model", "endpoint": "example", "model": "example-model-1"})
    );
    assert_eq!(
        lines[6]["data"],
        json!({"turn": 1, "step": 1, "error": null, "message": {
            "id": mid(3).to_string(), "role": "user",
            "content": [{"type": "tool-result", "tool_call_id": "c1", "is_error": false,
                         "content": [{"type": "text", "text": "README.md"}]}],
            "source": {"kind": "tool", "call_id": "c1"}}})
    );
    assert_eq!(
        lines[8]["data"],
        json!({"turn": 1, "reason": {"kind": "completed"}})
    );
}

#[test]
fn reasons_sources_and_opaque_records_are_spelled_as_documented() {
    let budget = TurnEndReason::Budget(Box::new(lineage_log::BudgetReached {
        limit: lineage_log::BudgetLimit::OutputTokens,
        max: 500,
        owner: SessionId::from_u128(1),
    }));
    let value = event_to_json(&Event::new(0, 0, ev::turn_end(1, budget)));
    assert_eq!(
        value["data"]["reason"],
        json!({"kind": "budget", "limit": "output-tokens", "max": 500,
               "owner": "00000000-0000-0000-0000-000000000001"})
    );
    let hook = TurnEndReason::Aborted {
        cause: lineage_log::AbortCause::Hook {
            reason: "no".into(),
        },
    };
    let value = event_to_json(&Event::new(0, 0, ev::turn_end(1, hook)));
    assert_eq!(
        value["data"]["reason"],
        json!({"kind": "aborted", "cause": {"kind": "hook", "reason": "no"}})
    );
    let settled = Message {
        id: MessageId::from_u128(2),
        role: Role::User,
        content: vec![ContentBlock::Image {
            media_type: "image/png".into(),
            attachment: "att-1".into(),
        }],
        source: MessageSource::SubagentSettled {
            sender: SessionId::from_u128(3),
            summary: "done".into(),
        },
    };
    let value = event_to_json(&Event::new(0, 0, EventBody::from(settled)));
    assert_eq!(
        value["data"]["content"][0],
        json!({"type": "image", "media_type": "image/png", "attachment": "att-1"})
    );
    assert_eq!(
        value["data"]["source"],
        json!({"kind": "subagent-settled", "sender": "00000000-0000-0000-0000-000000000003",
               "summary": "done"})
    );
    let opaque = lineage_log::Opaque {
        tag: 1 << 20,
        payload: vec![0x00, 0xab, 0xff].into(),
    };
    let value = event_to_json(&Event::new(0, 0, EventBody::from(opaque)));
    assert_eq!(
        value,
        json!({"seq": 0, "time_ms": 0, "type": "opaque",
               "data": {"tag": 1_048_576, "payload": "00abff"}})
    );
}

#[test]
fn optional_fields_may_be_left_out_but_unknown_fields_are_refused() {
    let (header, events) = session();
    let text = session_to_json_lines(&header, &events);
    // `error: null` left out of the tool result: the same event.
    let lenient = edit_line(&text, 7, |v| {
        v["data"].as_object_mut().unwrap().remove("error");
    });
    assert_eq!(session_from_json_lines(&lenient).unwrap().events, events);
    let extra = edit_line(&text, 7, |v| v["data"]["meta"] = json!({}));
    let e = refused(&extra);
    assert_eq!((e.line, e.seq), (7, Some(5)));
    assert!(e.reason.contains("meta"), "{e}");
}

#[test]
fn a_changed_event_is_refused_naming_its_line_and_seq() {
    let (header, events) = session();
    let text = session_to_json_lines(&header, &events);
    let tampered = edit_line(&text, 4, |v| {
        v["data"]["content"][0]["text"] = "List every file".into();
    });
    let e = refused(&tampered);
    assert_eq!((e.line, e.seq), (4, Some(2)), "{e}");
    assert!(
        e.to_string()
            .starts_with("line 4 (seq 2): the digest differs"),
        "{e}"
    );
}

#[test]
fn seqs_must_be_contiguous_from_zero() {
    let (header, events) = session();
    let text = session_to_json_lines(&header, &events);
    let mut lines: Vec<&str> = text.lines().collect();
    lines.remove(3); // seq 2
    let e = refused(&(lines.join("\n") + "\n"));
    assert_eq!((e.line, e.seq), (4, Some(3)), "{e}");
    assert!(e.reason.contains("seq 2 was expected"), "{e}");
}

#[test]
fn a_file_cut_short_is_refused() {
    let (header, events) = session();
    let text = session_to_json_lines(&header, &events);
    let lines: Vec<&str> = text.lines().collect();
    let e = refused(&(lines[..lines.len() - 1].join("\n") + "\n"));
    assert_eq!(e.line, 1);
    assert!(
        e.reason.contains("states 8 events, the file holds 7"),
        "{e}"
    );
    let e = refused("");
    assert!(e.reason.contains("no session line"), "{e}");
}

#[test]
fn events_that_break_the_rules_are_refused_where_they_stand() {
    let (header, events) = session();
    // A step/end of a step that is not open: re-digested so only the rule can refuse it.
    let mut broken = events.clone();
    broken[6] = Event::new(6, broken[6].time_ms, ev::step_end(1, 2));
    let text = session_to_json_lines(&header, &broken);
    let e = refused(&text);
    assert_eq!((e.line, e.seq), (8, Some(6)), "{e}");
}

#[test]
fn malformed_lines_are_refused_naming_them() {
    let (header, events) = session();
    let text = session_to_json_lines(&header, &events);
    let e = refused(&text.replacen("\"turn/start\"", "\"turn/begin\"", 1));
    assert_eq!((e.line, e.seq), (2, Some(0)));
    assert!(
        e.reason.contains("unknown event type \"turn/begin\""),
        "{e}"
    );
    let e = refused(&edit_line(&text, 2, |v| v["digest"] = "ABC".into()));
    assert_eq!(e.line, 2);
    let e = refused(&edit_line(&text, 1, |v| v["json_form"] = 2.into()));
    assert!(e.reason.contains("JSON form 2"), "{e}");
    let e = refused(&edit_line(&text, 1, |v| {
        v["parent"] = SessionId::from_u128(9).to_string().into()
    }));
    assert_eq!(e.line, 1);
    assert!(e.reason.contains("contradict"), "{e}");
    let mut reader = SessionReader::new();
    let e = reader.read_line("{\"seq\": 0").unwrap_err();
    assert_eq!(e.line, 1);
    assert!(e.reason.starts_with("not JSON"), "{e}");
}

#[test]
fn an_event_line_carries_its_digest() {
    let (_, events) = session();
    let digests = running_digests(&events)[1..].to_vec();
    let line = event_line(&events[0], &digests[0]);
    assert_eq!(
        line,
        format!(
            r#"{{"seq":0,"time_ms":1750000000000,"type":"turn/start","data":{{"turn":1}},"digest":"{}"}}"#,
            digests[0]
        )
    );
}
