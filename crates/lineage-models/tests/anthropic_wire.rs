//! Every shape of the loopback server's Anthropic Messages scripts, read through
//! `AnswerReader` to the chunks and the assembled message it stands for, and the same answers
//! read in arbitrary pieces.

mod common;

use common::{assemble, assert_reasoning_then_text, call, sse_body, text_deltas};

use std::time::{Duration, UNIX_EPOCH};

use lineage_agent::ModelError;
use lineage_log::{BlockType, ContentBlock, FinishReason, StreamChunk, ToolCallDelta, Usage};
use lineage_models::{AnswerReader, Wire, failure};
use lineage_testkit::loopback::anthropic::{self, Script};
use lineage_testkit::loopback::{LoopbackServer, Reply};
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn read_in_pieces(body: &[u8], cuts: &[usize]) -> Result<Vec<StreamChunk>, ModelError> {
    let (chunks, result) = common::read_in_pieces(Wire::AnthropicMessages, body, cuts);
    result.map(|()| chunks)
}

fn read(script: &Script) -> Result<Vec<StreamChunk>, ModelError> {
    read_in_pieces(&script.body(), &[])
}

fn failure_code(script: &Script) -> String {
    match read(script) {
        Ok(chunks) => panic!("expected a failure, read {chunks:?}"),
        Err(e) => e.code.to_string(),
    }
}

#[test]
fn text_deltas_share_one_block_and_usage_comes_right_before_the_stop() {
    let script = Script::new()
        .text("Hel")
        .text("lo")
        .usage(120, 7, Some(100))
        .stop();
    let mut expected = text_deltas(&["Hel", "lo"]);
    expected.extend([
        StreamChunk::BlockEnd {
            index: 0,
            block: Box::new(ContentBlock::text("Hello")),
        },
        StreamChunk::Usage(Box::new(Usage {
            input_tokens: 120,
            output_tokens: 7,
            cache_read_tokens: Some(100),
        })),
        StreamChunk::Finish {
            reason: FinishReason::Stop,
        },
    ]);
    assert_eq!(read(&script).expect("a valid answer"), expected);
}

#[test]
fn an_answer_without_usage_has_no_usage_chunk() {
    let chunks = read(&Script::new().text("hi").stop()).expect("a valid answer");
    assert!(
        !chunks.iter().any(|c| matches!(c, StreamChunk::Usage(_))),
        "{chunks:?}"
    );
    assert_eq!(assemble(&chunks).usage(), None);
}

#[test]
fn reasoning_then_text_assemble_to_two_blocks() {
    let chunks = read(
        &Script::new()
            .reasoning("Think")
            .reasoning("ing.")
            .text("Done.")
            .stop(),
    )
    .expect("a valid answer");
    assert_eq!(
        chunks[0],
        StreamChunk::BlockStart {
            index: 0,
            block_type: BlockType::Reasoning
        }
    );
    assert_reasoning_then_text(&assemble(&chunks), "Thinking.", "Done.");
}

#[test]
fn a_tool_call_streams_its_id_on_every_delta_and_ends_with_the_whole_call() {
    let chunks = read(
        &Script::new()
            .tool_call("toolu_1", "read", &[r#"{"pa"#, r#"th": "a.txt"}"#])
            .tool_stop(),
    )
    .expect("a valid answer");
    let deltas: Vec<&ToolCallDelta> = chunks
        .iter()
        .filter_map(|c| match c {
            StreamChunk::ToolCallDelta(d) => Some(&**d),
            _ => None,
        })
        .collect();
    assert_eq!(deltas.len(), 3, "the name, then each part: {deltas:?}");
    assert!(deltas.iter().all(|d| d.id.as_str() == "toolu_1"));
    assert_eq!(deltas[0].name.as_deref(), Some("read"));
    assert!(deltas[1..].iter().all(|d| d.name.is_none()));
    let assembler = assemble(&chunks);
    assert_eq!(
        assembler.blocks(),
        vec![call("toolu_1", "read", r#"{"path": "a.txt"}"#)]
    );
    assert_eq!(assembler.finish(), FinishReason::ToolCalls);
}

#[test]
fn parallel_tool_calls_interleave_on_their_own_indices() {
    let script = Script::new()
        .text("Two calls.")
        .parallel_tool_calls(&[
            ("toolu_a", "read", &[r#"{"path":"#, r#""a"}"#]),
            ("toolu_b", "list", &[]),
            ("toolu_c", "grep", &[r#"{"q":"#, r#""x","#, r#""n":1}"#]),
        ])
        .tool_stop();
    let chunks = read(&script).expect("a valid answer");
    for chunk in &chunks {
        if let StreamChunk::ToolCallDelta(d) = chunk {
            let expected = ["", "toolu_a", "toolu_b", "toolu_c"][d.index as usize];
            assert_eq!(d.id.as_str(), expected, "{d:?}");
        }
    }
    assert_eq!(
        assemble(&chunks).blocks(),
        vec![
            ContentBlock::text("Two calls."),
            call("toolu_a", "read", r#"{"path":"a"}"#),
            // A call whose input never streamed has the empty object.
            call("toolu_b", "list", "{}"),
            call("toolu_c", "grep", r#"{"q":"x","n":1}"#),
        ]
    );
}

#[test]
fn a_max_tokens_finish_keeps_the_text_and_drops_the_cut_off_call() {
    let script = Script::new()
        .text("Writing.")
        .tool_call("toolu_1", "write", &[r#"{"body": "unfinis"#])
        .finish("max_tokens");
    let assembler = assemble(&read(&script).expect("a valid answer"));
    assert_eq!(assembler.finish(), FinishReason::MaxTokens);
    assert_eq!(assembler.blocks(), vec![ContentBlock::text("Writing.")]);
}

#[test]
fn refusal_and_unknown_reasons_are_error_finishes() {
    for (reason, code) in [("refusal", "REFUSAL"), ("pause_turn", "FINISH_PAUSE_TURN")] {
        let chunks = read(&Script::new().text("No.").finish(reason)).expect("a valid answer");
        match assemble(&chunks).finish() {
            FinishReason::Error(failure) => assert_eq!(failure.code, code),
            other => panic!("{reason}: {other:?}"),
        }
    }
}

#[test]
fn a_mid_stream_error_fails_with_its_code_after_what_came_before() {
    for (kind, code) in [
        ("overloaded", failure::SERVER),
        ("api", failure::SERVER),
        ("rate_limit", failure::RATE_LIMIT),
        ("auth", failure::AUTH),
        ("billing", failure::QUOTA),
        ("invalid_request", failure::INVALID_REQUEST),
    ] {
        let body = Script::new()
            .text("partial")
            .error(kind, "it went wrong")
            .body();
        let mut reader = AnswerReader::new(Wire::AnthropicMessages);
        let mut out = Vec::new();
        let error = reader
            .push(&body, &mut out)
            .expect_err("the error event fails the stream");
        assert_eq!(error.code, code, "{kind}");
        assert!(error.message.contains("it went wrong"), "{}", error.message);
        assert_eq!(assemble(&out).blocks(), vec![ContentBlock::text("partial")]);
    }
}

#[test]
fn raw_events_pass_verbatim_unknown_ones_are_ignored_and_bad_json_fails() {
    let ignored = Script::new()
        .raw(Some("future_event"), r#"{"type":"future_event"}"#)
        .text("hi")
        .raw(Some("ping"), r#"{"type":"ping"}"#)
        .stop();
    assert_eq!(
        read(&ignored).expect("a valid answer"),
        read(&Script::new().text("hi").stop()).expect("a valid answer")
    );
    let bad = Script::new()
        .text("hi")
        .raw(Some("content_block_delta"), "{not json")
        .stop();
    assert_eq!(failure_code(&bad), failure::BAD_RESPONSE);
    // A bare data event is typed by its data.
    let bare = Script::new()
        .raw(None, r#"{"type":"ping"}"#)
        .text("x")
        .stop();
    assert_eq!(
        assemble(&read(&bare).expect("a valid answer")).blocks(),
        vec![ContentBlock::text("x")]
    );
}

#[test]
fn an_unfinished_script_is_a_closed_stream_and_an_empty_stop_an_empty_response() {
    assert_eq!(
        failure_code(&Script::new().text("cut")),
        failure::STREAM_CLOSED
    );
    assert_eq!(failure_code(&Script::new().stop()), failure::EMPTY_RESPONSE);
}

#[test]
fn the_whole_answers_read_as_they_say() {
    let text = read_in_pieces(sse_body(&anthropic::text("Hi there")), &[]).expect("valid");
    let text = assemble(&text);
    assert_eq!(text.blocks(), vec![ContentBlock::text("Hi there")]);
    assert_eq!(text.finish(), FinishReason::Stop);
    let asked = read_in_pieces(
        sse_body(&anthropic::tool_call("toolu_7", "read", r#"{"path":"x"}"#)),
        &[],
    )
    .expect("valid");
    let asked = assemble(&asked);
    assert_eq!(
        asked.blocks(),
        vec![call("toolu_7", "read", r#"{"path":"x"}"#)]
    );
    assert_eq!(asked.finish(), FinishReason::ToolCalls);
    let Reply::Sse { chunk, delay, .. } = Script::new()
        .text("x")
        .stop()
        .chunked(5, Duration::from_millis(3))
    else {
        panic!("chunked is an event stream");
    };
    assert_eq!((chunk, delay), (Some(5), Duration::from_millis(3)));
}

#[test]
fn error_bodies_classify_as_their_kind() {
    for (status, kind, code) in [
        (529, "overloaded", failure::SERVER),
        (429, "rate_limit", failure::RATE_LIMIT),
        (401, "authentication", failure::AUTH),
        (400, "invalid_request", failure::INVALID_REQUEST),
    ] {
        let body = anthropic::error_body(kind, "as scripted");
        let classified = failure::classify(status, |_| None, &body, UNIX_EPOCH);
        assert_eq!(classified.code, code, "{body}");
        assert_eq!(classified.message, "as scripted");
    }
}

/// Scripts of every shape, each with a few multi-byte characters to cut inside.
fn scripts() -> Vec<Script> {
    vec![
        Script::new()
            .text("Grüße, ")
            .text("wörld ✓")
            .usage(9, 3, None)
            .stop(),
        Script::new()
            .reasoning("Überlegung…")
            .text("Antwort")
            .usage(40, 12, Some(30))
            .stop(),
        Script::new()
            .text("Calling.")
            .parallel_tool_calls(&[
                ("toolu_1", "read", &[r#"{"path":"#, r#""ä.txt"}"#]),
                ("toolu_2", "grep", &[r#"{"q":"#, r#""→","#, r#""n":2}"#]),
            ])
            .tool_stop(),
        Script::new()
            .text("cut ")
            .tool_call("toolu_3", "write", &[r#"{"body":"hal"#])
            .finish("max_tokens"),
        Script::new()
            .text("partial ✓")
            .error("overloaded", "Overloaded"),
        Script::new().text("never ends"),
    ]
}

/// The outcome of a read, comparable: the chunks, or the failure's code.
fn outcome(result: Result<Vec<StreamChunk>, ModelError>) -> Result<Vec<StreamChunk>, String> {
    result.map_err(|e| e.code.to_string())
}

proptest! {
    #[test]
    fn any_cutting_of_a_script_reads_the_same(
        which in 0..6usize,
        cuts in proptest::collection::vec(0..4096usize, 0..64),
    ) {
        let script = &scripts()[which];
        let body = script.body();
        let whole = outcome(read_in_pieces(&body, &[]));
        let cuts: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
        prop_assert_eq!(outcome(read_in_pieces(&body, &cuts)), whole);
    }
}

#[test]
fn byte_by_byte_reads_the_same_as_whole() {
    for script in scripts() {
        let body = script.body();
        let every: Vec<usize> = (0..body.len()).collect();
        assert_eq!(
            outcome(read_in_pieces(&body, &every)),
            outcome(read_in_pieces(&body, &[]))
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_chunked_script_served_over_a_socket_reads_as_it_arrives() {
    let script = Script::new()
        .reasoning("Hmm.")
        .text("Calling.")
        .tool_call("toolu_1", "read", &[r#"{"path":"#, r#""a"}"#])
        .usage(30, 9, Some(20))
        .tool_stop();
    let server = LoopbackServer::start([script.chunked(7, Duration::from_millis(5))])
        .await
        .expect("the server starts");
    let mut stream = tokio::net::TcpStream::connect(server.addr())
        .await
        .expect("connects");
    stream
        .write_all(b"POST /v1/messages HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
        .await
        .expect("sends");
    let mut reader = AnswerReader::new(Wire::AnthropicMessages);
    let mut out = Vec::new();
    let mut head = Vec::new();
    let mut buf = [0u8; 64];
    loop {
        let n = stream.read(&mut buf).await.expect("reads");
        if n == 0 {
            break;
        }
        if head.ends_with(b"\r\n\r\n") {
            reader.push(&buf[..n], &mut out).expect("a valid answer");
        } else {
            // Until the head has ended, bytes go to it; what follows it is the stream.
            head.extend_from_slice(&buf[..n]);
            if let Some(at) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                let rest = head.split_off(at + 4);
                reader.push(&rest, &mut out).expect("a valid answer");
            }
        }
        if reader.is_done() {
            break;
        }
    }
    assert!(reader.is_done(), "message_stop arrived");
    reader.finish(&mut out).expect("ends");
    assert_eq!(out, read(&script).expect("a valid answer"));
    let assembler = assemble(&out);
    assert_eq!(
        assembler.blocks(),
        vec![
            ContentBlock::Reasoning {
                text: "Hmm.".into()
            },
            ContentBlock::text("Calling."),
            call("toolu_1", "read", r#"{"path":"a"}"#),
        ]
    );
    assert_eq!(
        assembler.usage(),
        Some(Usage {
            input_tokens: 30,
            output_tokens: 9,
            cache_read_tokens: Some(20)
        })
    );
}
