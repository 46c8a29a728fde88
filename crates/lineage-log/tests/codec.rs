//! The record codec and the running digest.
//!
//! A record is `len ‖ tag ‖ flags ‖ time ‖ payload`; the seq is the record's position, not stored.
//! Every variant decodes to what was encoded and re-encodes to the same bytes. A tag this build
//! does not know is a format error unless the record is marked ignorable, in which case it is kept
//! byte for byte. `S(n)` is one blake3 over records `0..=n`, however they are grouped.

use lineage_log::{
    AbortCause, ApprovalPolicy, AssistantChunk, AssistantMessage, BlockType, CallId, Chain,
    ContentBlock, Custom, DescriptorMode, Digest, Encoder, Event, EventBody, EventKind,
    FLAG_IGNORABLE, FinishReason, InboxSpliced, InboxTarget, LogError, MessageSource, ModelFailure,
    Opaque, PolicySource, Records, SandboxMode, SessionId, SessionLineage, StreamChunk,
    SubagentDescriptor, Text, ToolCallDelta, ToolError, ToolFilter, ToolResult, TurnEndReason,
    TurnError, Usage, decode_record, decode_records, encode_record, put_varint, split_record,
};
use lineage_testkit::ev::{self, mid};
use lineage_testkit::realistic_session;

/// `events` encoded back to back, as a log stores them.
fn encoded(events: &[Event]) -> Vec<u8> {
    let mut buf = Vec::new();
    Encoder::new().encode_all(events, &mut buf);
    buf
}

fn round_trip(event: &Event) -> Event {
    let bytes = encode_record(event);
    let (raw, rest) = split_record(&bytes, event.seq).unwrap();
    assert!(rest.is_empty());
    assert_eq!(
        raw.bytes,
        &bytes[..],
        "the record spans its length prefix and body"
    );
    let back = decode_record(event.seq, &raw).unwrap();
    assert_eq!(
        encode_record(&back),
        bytes,
        "re-encoding reproduces the record"
    );
    back
}

/// One event of every variant, with every optional field set, plus variants with them unset.
fn one_of_each() -> Vec<EventBody> {
    let usage = Usage {
        input_tokens: 1,
        output_tokens: u64::MAX,
        cache_read_tokens: Some(7),
    };
    let failure = ModelFailure {
        message: "overloaded".into(),
        code: "529".into(),
    };
    let chunks = vec![
        StreamChunk::BlockStart {
            index: 0,
            block_type: BlockType::Reasoning,
        },
        StreamChunk::TextDelta {
            index: 1,
            text: "delta".into(),
        },
        StreamChunk::ReasoningDelta {
            index: 2,
            text: "hmm".into(),
        },
        StreamChunk::ToolCallDelta(Box::new(ToolCallDelta {
            index: 3,
            id: CallId::new("c1"),
            name: Some("grep".into()),
            arguments_delta: "{\"pat".into(),
        })),
        StreamChunk::ToolCallDelta(Box::new(ToolCallDelta {
            index: 3,
            id: CallId::new("c1"),
            name: None,
            arguments_delta: "tern\":1}".into(),
        })),
        StreamChunk::BlockEnd {
            index: 4,
            block: Box::new(ContentBlock::Image {
                media_type: "image/png".into(),
                attachment: "att-1".into(),
            }),
        },
        StreamChunk::Usage(Box::new(usage)),
        StreamChunk::Finish {
            reason: FinishReason::Stop,
        },
        StreamChunk::Finish {
            reason: FinishReason::ToolCalls,
        },
        StreamChunk::Finish {
            reason: FinishReason::MaxTokens,
        },
        StreamChunk::Finish {
            reason: FinishReason::Error(Box::new(failure.clone())),
        },
        StreamChunk::Finish {
            reason: FinishReason::Aborted(Box::new(failure)),
        },
    ];
    let reasons = vec![
        TurnEndReason::Completed,
        TurnEndReason::Aborted {
            cause: AbortCause::User,
        },
        TurnEndReason::Aborted {
            cause: AbortCause::Parent,
        },
        TurnEndReason::Aborted {
            cause: AbortCause::Hook {
                reason: "blocked by hook".into(),
            },
        },
        TurnEndReason::Aborted {
            cause: AbortCause::Disposed,
        },
        TurnEndReason::Blocked,
        TurnEndReason::Error(Box::new(TurnError {
            message: "rate limited".into(),
            code: "RATE_LIMIT".into(),
            status: Some(429),
            retry_after_ms: Some(1_500),
            request_id: Some("req-1".into()),
        })),
        TurnEndReason::Error(Box::new(TurnError {
            message: "x".into(),
            code: "y".into(),
            status: None,
            retry_after_ms: None,
            request_id: None,
        })),
        TurnEndReason::MaxTokens,
        TurnEndReason::Interrupted,
    ];
    let sources = vec![
        MessageSource::User,
        MessageSource::Coordinator {
            sender: SessionId::from_u128(1),
        },
        MessageSource::SubagentReport {
            sender: SessionId::from_u128(2),
        },
        MessageSource::SubagentSettled {
            sender: SessionId::from_u128(3),
            summary: "settled".into(),
        },
        MessageSource::Plugin {
            name: "goal".into(),
        },
    ];
    let mut bodies = vec![ev::turn_start(1), ev::step_start(1, 2), ev::step_end(1, 2)];
    bodies.extend(reasons.into_iter().map(|r| ev::turn_end(3, r)));
    bodies.extend(sources.into_iter().map(|source| {
        EventBody::from(lineage_log::Message {
            source,
            ..ev::user_text_message(mid(1), "hello")
        })
    }));
    bodies.extend(chunks.into_iter().map(|chunk| {
        EventBody::from(AssistantChunk {
            turn: 1,
            step: 1,
            chunk,
        })
    }));
    bodies.push(
        AssistantMessage {
            turn: 1,
            step: 1,
            message: ev::assistant_message(
                mid(2),
                vec![
                    ContentBlock::Reasoning {
                        text: "think".into(),
                    },
                    ContentBlock::text("answer"),
                    ev::call_block("c1", "grep", r#"{"pattern":"x"}"#),
                ],
            ),
            usage: Some(usage),
            interrupted: true,
        }
        .into(),
    );
    bodies.push(ev::assistant(1, 1, mid(3), Vec::new()));
    bodies.push(ev::tool_call(1, 1, "c1", "grep", r#"{"pattern":"x"}"#));
    bodies.push(ev::tool_result(1, 1, mid(4), "c1", "found"));
    bodies.push(
        ToolResult {
            turn: 1,
            step: 1,
            message: ev::tool_result_message(mid(5), "c2", "failed", true),
            error: Some(ToolError {
                name: "ToolFailed".into(),
                code: "TOOL_FAILED".into(),
            }),
        }
        .into(),
    );
    for target in [InboxTarget::NextTurn, InboxTarget::NextStep] {
        bodies.push(
            InboxSpliced {
                target,
                start: 2,
                removed: 1,
                inserted: vec![ev::user_text_message(mid(6), "queued")],
                canceled: true,
            }
            .into(),
        );
    }
    bodies.push(
        SessionLineage {
            parent: SessionId::from_u128(u128::MAX),
            seed_len: 0,
            seed_digest: Digest([0xAB; 32]),
            delegation_depth: u32::MAX,
        }
        .into(),
    );
    for mode in [DescriptorMode::OneShot, DescriptorMode::Continuable] {
        bodies.push(
            SubagentDescriptor {
                version: 2,
                mode,
                provider: "fork".into(),
                label: Some("reviewer".into()),
                endpoint: Some("p".into()),
                model: Some("m".into()),
                persona: Some("terse".into()),
                tool_filter: Some(ToolFilter {
                    allow: Some(vec!["grep".into()]),
                    deny: Some(Vec::new()),
                }),
            }
            .into(),
        );
    }
    bodies.push(
        SubagentDescriptor {
            version: 1,
            mode: DescriptorMode::OneShot,
            provider: "spawn".into(),
            label: None,
            endpoint: None,
            model: None,
            persona: None,
            tool_filter: None,
        }
        .into(),
    );
    for source in [PolicySource::Own, PolicySource::Delegation] {
        bodies.push(
            ApprovalPolicy {
                policy: "never".into(),
                source,
            }
            .into(),
        );
        bodies.push(
            SandboxMode {
                mode: "read-only".into(),
                source,
            }
            .into(),
        );
    }
    for ignorable in [false, true] {
        bodies.push(
            Custom {
                type_name: "todo/write".into(),
                payload: r#"{"todos":[]}"#.into(),
                ignorable,
            }
            .into(),
        );
    }
    bodies.push(
        Opaque {
            tag: 5_000_000,
            payload: vec![0, 1, 2, 255].into(),
        }
        .into(),
    );
    bodies
}

#[test]
fn every_variant_round_trips() {
    let bodies = one_of_each();
    let mut kinds: Vec<EventKind> = bodies.iter().map(EventBody::kind).collect();
    kinds.sort();
    kinds.dedup();
    assert_eq!(
        kinds.len(),
        EventKind::KNOWN.len() + 1,
        "the fixture covers every kind"
    );
    for (i, body) in bodies.into_iter().enumerate() {
        let event = Event::new(i as u64, 1_750_000_000_000 + i as i64, body);
        assert_eq!(round_trip(&event), event);
    }
}

#[test]
fn a_log_of_back_to_back_records_decodes_to_itself() {
    let events = realistic_session(31, 500);
    let buf = encoded(&events);
    let mut decoded = Vec::new();
    decode_records(&buf, 0, &mut decoded).unwrap();
    assert_eq!(decoded, events);
    // Decoding from the middle numbers records from the given seq.
    let (first, _) = split_record(&buf, 0).unwrap();
    let mut tail = Vec::new();
    decode_records(&buf[first.bytes.len()..], 1, &mut tail).unwrap();
    assert_eq!(tail, events[1..]);
}

#[test]
fn the_seq_is_not_stored_but_given_by_position() {
    let a = Event::new(0, 5, ev::turn_start(1));
    let b = Event::new(41, 5, ev::turn_start(1));
    assert_eq!(encode_record(&a), encode_record(&b));
    let bytes = encode_record(&a);
    let (raw, _) = split_record(&bytes, 41).unwrap();
    assert_eq!(decode_record(41, &raw).unwrap(), b);
    let seqs: Vec<u64> = Records::new(&[bytes.clone(), bytes].concat(), 10)
        .map(|r| r.unwrap().0)
        .collect();
    assert_eq!(seqs, [10, 11]);
}

#[test]
fn negative_and_extreme_times_round_trip() {
    for time_ms in [0, -1, 1, i64::MIN, i64::MAX, -1_750_000_000_000] {
        let event = Event::new(0, time_ms, ev::turn_start(1));
        assert_eq!(round_trip(&event).time_ms, time_ms);
    }
}

/// A record with tag `tag`, flags `flags` and payload `payload`, framed by hand.
fn framed(tag: u64, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    put_varint(&mut body, tag);
    body.push(flags);
    put_varint(&mut body, 8); // time 4, zigzag
    body.extend_from_slice(payload);
    let mut record = Vec::new();
    put_varint(&mut record, body.len() as u64);
    record.extend(body);
    record
}

#[test]
fn tag_zero_is_reserved_and_refused_as_corrupt_even_when_ignorable() {
    for flags in [0, lineage_log::FLAG_IGNORABLE] {
        let record = framed(0, flags, b"whatever");
        let (raw, _) = split_record(&record, 3).unwrap();
        let err = decode_record(3, &raw).unwrap_err();
        assert!(matches!(err, LogError::Corrupt { seq: 3, .. }), "{err}");
    }
}

#[test]
fn a_known_kind_marked_ignorable_is_refused_as_corrupt() {
    let record = framed(1, lineage_log::FLAG_IGNORABLE, &[1]); // turn/start {turn: 1}
    let (raw, _) = split_record(&record, 3).unwrap();
    let err = decode_record(3, &raw).unwrap_err();
    assert!(matches!(err, LogError::Corrupt { seq: 3, .. }), "{err}");
}

#[test]
fn an_unknown_tag_that_is_not_ignorable_is_a_format_error() {
    for tag in [16u64, 300, u64::from(u32::MAX)] {
        let record = framed(tag, 0, b"whatever");
        let (raw, _) = split_record(&record, 3).unwrap();
        let err = decode_record(3, &raw).unwrap_err();
        assert_eq!(
            err,
            LogError::UnknownKind {
                seq: 3,
                tag: tag as u32
            }
        );
        assert!(err.is_format());
    }
}

#[test]
fn an_unknown_ignorable_record_is_kept_byte_for_byte() {
    let record = framed(70_000, FLAG_IGNORABLE, &[9, 8, 7, 0, 0xFF]);
    let (raw, _) = split_record(&record, 2).unwrap();
    let event = decode_record(2, &raw).unwrap();
    assert_eq!(event.time_ms, 4);
    assert_eq!(
        event.body,
        EventBody::Opaque(Opaque {
            tag: 70_000,
            payload: vec![9, 8, 7, 0, 0xFF].into(),
        })
    );
    assert_eq!(encode_record(&event), record);

    // Kept in place among known records, the log re-encodes to the same bytes.
    let known = encode_record(&Event::new(0, 1, ev::user(mid(1), "before")));
    let after = encode_record(&Event::new(0, 1, ev::user(mid(2), "after")));
    let buf = [known, record, after].concat();
    let mut events = Vec::new();
    decode_records(&buf, 0, &mut events).unwrap();
    assert_eq!(events[1].kind(), EventKind::Opaque);
    assert_eq!(encoded(&events), buf);
}

#[test]
fn unknown_flag_bits_are_a_format_error_even_on_known_tags() {
    let good = encode_record(&Event::new(0, 4, ev::turn_start(1)));
    let (raw, _) = split_record(&good, 0).unwrap();
    for flags in [0b10u8, 0b1000_0000, 0b11] {
        let record = framed(u64::from(raw.tag), flags, raw.payload);
        let (raw, _) = split_record(&record, 6).unwrap();
        let err = decode_record(6, &raw).unwrap_err();
        assert_eq!(err, LogError::UnknownFlags { seq: 6, flags });
        assert!(err.is_format());
    }
}

#[test]
fn a_damaged_payload_is_corrupt_not_a_format_error() {
    let good = encode_record(&Event::new(0, 4, ev::turn_start(1)));
    let (raw, _) = split_record(&good, 0).unwrap();
    let mut padded = raw.payload.to_vec();
    padded.push(0);
    for payload in [&[][..], &padded[..]] {
        let record = framed(u64::from(raw.tag), 0, payload);
        let (raw, _) = split_record(&record, 1).unwrap();
        let err = decode_record(1, &raw).unwrap_err();
        assert!(matches!(err, LogError::Corrupt { seq: 1, .. }), "{err:?}");
        assert!(!err.is_format());
    }
    assert!(matches!(
        split_record(&good[..good.len() - 1], 4),
        Err(LogError::Corrupt { seq: 4, .. })
    ));
    assert!(split_record(&[], 0).is_err());
}

#[test]
fn the_ignorable_flag_of_a_custom_event_lives_in_the_flags_byte() {
    for ignorable in [false, true] {
        let event = Event::new(
            0,
            0,
            Custom {
                type_name: "plan/mode".into(),
                payload: "{}".into(),
                ignorable,
            },
        );
        let bytes = encode_record(&event);
        let (raw, _) = split_record(&bytes, 0).unwrap();
        assert_eq!(raw.ignorable(), ignorable);
        assert_eq!(raw.flags, if ignorable { FLAG_IGNORABLE } else { 0 });
        assert_eq!(raw.kind(), Some(EventKind::Custom));
        assert_eq!(round_trip(&event), event);
    }
}

#[test]
fn wire_tags_and_names_are_fixed() {
    let table = [
        (EventKind::TurnStart, 1, "turn/start"),
        (EventKind::TurnEnd, 2, "turn/end"),
        (EventKind::StepStart, 3, "step/start"),
        (EventKind::StepEnd, 4, "step/end"),
        (EventKind::UserMessage, 5, "user/message"),
        (EventKind::AssistantChunk, 6, "assistant/chunk"),
        (EventKind::AssistantMessage, 7, "assistant/message"),
        (EventKind::ToolCall, 8, "tool/call"),
        (EventKind::ToolResult, 9, "tool/result"),
        (EventKind::InboxSpliced, 10, "inbox/spliced"),
        (EventKind::SessionLineage, 11, "session/lineage"),
        (EventKind::SubagentDescriptor, 12, "subagent/descriptor"),
        (EventKind::ApprovalPolicy, 13, "approval/policy"),
        (EventKind::SandboxMode, 14, "sandbox/mode"),
        (EventKind::Custom, 15, "custom"),
    ];
    assert_eq!(table.len(), EventKind::KNOWN.len());
    for (kind, tag, name) in table {
        assert_eq!(kind.tag(), Some(tag));
        assert_eq!(EventKind::from_tag(tag), Some(kind));
        assert_eq!(kind.name(), name);
        assert_eq!(kind.to_string(), name);
    }
    assert_eq!(EventKind::Opaque.tag(), None);
    assert_eq!(EventKind::from_tag(0), None);
    assert_eq!(EventKind::from_tag(16), None);
}

#[test]
fn the_running_digest_does_not_depend_on_how_records_are_grouped() {
    let events = realistic_session(32, 300);
    let buf = encoded(&events);
    let mut whole = Chain::new();
    whole.update(&buf);
    let mut per_record = Chain::new();
    for event in &events {
        per_record.update(&encode_record(event));
    }
    let mut odd_pieces = Chain::new();
    for piece in buf.chunks(777) {
        odd_pieces.update(piece);
    }
    assert_eq!(whole.digest(), per_record.digest());
    assert_eq!(whole.digest(), odd_pieces.digest());
    assert_ne!(whole.digest(), Digest::of_empty());
}

#[test]
fn the_digest_of_no_records_is_the_empty_digest() {
    assert_eq!(Chain::new().digest(), Digest::of_empty());
    let mut chain = Chain::new();
    chain.update(&[]);
    assert_eq!(chain.digest(), Digest::of_empty());
    let shown = Digest::of_empty().to_string();
    assert_eq!(shown.len(), 64);
    assert!(shown.chars().all(|c| c.is_ascii_hexdigit()));
}

#[test]
fn the_digest_changes_when_any_record_changes() {
    let events = realistic_session(33, 60);
    let digest = |events: &[Event]| {
        let mut chain = Chain::new();
        for event in events {
            chain.update(&encode_record(event));
        }
        chain.digest()
    };
    let base = digest(&events);
    let mut retimed = events.clone();
    retimed[10].time_ms += 1;
    assert_ne!(digest(&retimed), base);
    let mut swapped = events.clone();
    swapped.swap(3, 4);
    assert_ne!(digest(&swapped), base);
    assert_ne!(digest(&events[..events.len() - 1]), base);
}

#[test]
fn text_holds_short_and_long_strings_alike() {
    let cases = [
        String::new(),
        "a".to_owned(),
        "x".repeat(23),
        "y".repeat(24),
        "z".repeat(25),
        "é".repeat(12),   // 24 bytes of two-byte characters
        "日本".repeat(5), // 30 bytes
        "🦀".repeat(100),
    ];
    for s in cases {
        let text = Text::from(s.as_str());
        assert_eq!(text.as_str(), s);
        assert_eq!(&*text, s.as_str());
        assert_eq!(text, s.as_str());
        assert_eq!(String::from(text.clone()), s);
        assert_eq!(Text::from(s.clone()), text);
        let event = Event::new(0, 0, ev::text_delta(1, 1, &s));
        assert_eq!(round_trip(&event), event);
    }
    assert_eq!(Text::empty(), "");
    assert_eq!(Text::from_static("static"), Text::from("static"));
    assert_eq!(format!("{:?}", Text::from("q\"")), format!("{:?}", "q\""));
}
