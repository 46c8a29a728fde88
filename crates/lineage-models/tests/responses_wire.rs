//! The Responses wire format end to end in memory: every shape the loopback script builder
//! writes reads through `AnswerReader` to the chunks and message it means, in any chunking.

mod common;

use common::{assemble, call, sse_body, text_deltas};

use std::time::{Duration, UNIX_EPOCH};

use lineage_agent::ModelError;
use lineage_log::{CallId, ContentBlock, FinishReason, StreamChunk, Text, ToolCallDelta, Usage};
use lineage_models::Wire;
use lineage_models::failure::{
    self, BAD_RESPONSE, EMPTY_RESPONSE, QUOTA, RATE_LIMIT, SERVER, STREAM_CLOSED,
};
use lineage_testkit::loopback::Reply;
use lineage_testkit::loopback::responses::{self, Script};
use proptest::prelude::*;

fn read_cut(body: &[u8], cuts: &[usize]) -> (Vec<StreamChunk>, Result<(), ModelError>) {
    common::read_in_pieces(Wire::Responses, body, cuts)
}

fn read(script: &Script) -> (Vec<StreamChunk>, Result<(), ModelError>) {
    read_cut(&script.body(), &[])
}

/// The chunks of `script`, which must read to its end.
fn chunks(script: &Script) -> Vec<StreamChunk> {
    let (chunks, result) = read(script);
    assert_eq!(result, Ok(()), "the script reads to its end");
    chunks
}

fn failure_of(script: &Script) -> ModelError {
    read(script).1.expect_err("the script was expected to fail")
}

fn call_delta(index: u32, id: &str, name: Option<&str>, arguments: &str) -> StreamChunk {
    StreamChunk::ToolCallDelta(Box::new(ToolCallDelta {
        index,
        id: CallId::new(id),
        name: name.map(Text::from),
        arguments_delta: arguments.into(),
    }))
}

fn code(reason: &FinishReason) -> Option<&str> {
    match reason {
        FinishReason::Error(failure) => Some(failure.code.as_str()),
        _ => None,
    }
}

/// Checks that the chunk before the last is the usage of `(input, output, cache read)` tokens.
fn assert_usage_second_to_last(
    chunks: &[StreamChunk],
    (input, output, cache_read): (u64, u64, Option<u64>),
) {
    assert_eq!(
        chunks[chunks.len() - 2],
        StreamChunk::Usage(Box::new(Usage {
            input_tokens: input,
            output_tokens: output,
            cache_read_tokens: cache_read,
        }))
    );
}

#[test]
fn consecutive_text_deltas_share_one_block() {
    let script = Script::new().text("Hel").text("lo").stop();
    let mut expected = text_deltas(&["Hel", "lo"]);
    expected.extend([
        StreamChunk::BlockEnd {
            index: 0,
            block: Box::new(ContentBlock::text("Hello")),
        },
        StreamChunk::Finish {
            reason: FinishReason::Stop,
        },
    ]);
    assert_eq!(chunks(&script), expected);
    let whole = responses::text("Hello");
    let (from_helper, result) = read_cut(sse_body(&whole), &[]);
    assert_eq!(result, Ok(()));
    let assembler = assemble(&from_helper);
    assert_eq!(assembler.blocks(), vec![ContentBlock::text("Hello")]);
    assert_eq!(assembler.finish(), FinishReason::Stop);
}

#[test]
fn reasoning_then_text_then_a_call_are_three_blocks() {
    let script = Script::new()
        .reasoning("Let me ")
        .reasoning("think.")
        .text("Reading it.")
        .tool_call("call_1", "read", &["{\"path\"", ":\"a\"}"])
        .usage(100, 20, Some(64))
        .tool_stop();
    let chunks = chunks(&script);
    let assembler = assemble(&chunks);
    assert_eq!(
        assembler.blocks(),
        vec![
            ContentBlock::Reasoning {
                text: "Let me think.".into()
            },
            ContentBlock::text("Reading it."),
            call("call_1", "read", "{\"path\":\"a\"}"),
        ]
    );
    assert_eq!(assembler.finish(), FinishReason::ToolCalls);
    assert_usage_second_to_last(&chunks, (100, 20, Some(64)));
    assert!(chunks.contains(&call_delta(2, "call_1", Some("read"), "{\"path\"")));
    assert!(chunks.contains(&call_delta(2, "call_1", None, ":\"a\"}")));
}

#[test]
fn one_call_from_the_helper_asks_for_it() {
    let reply = responses::tool_call("call_9", "ls", "{\"dir\":\".\"}");
    let (chunks, result) = read_cut(sse_body(&reply), &[]);
    assert_eq!(result, Ok(()));
    let assembler = assemble(&chunks);
    assert_eq!(
        assembler.blocks(),
        vec![call("call_9", "ls", "{\"dir\":\".\"}")]
    );
    assert_eq!(assembler.finish(), FinishReason::ToolCalls);
}

#[test]
fn parallel_calls_interleave_but_keep_their_own_blocks_and_ids() {
    let script = Script::new()
        .parallel_tool_calls(&[
            ("call_a", "read", &["{\"p\":", "\"a\"}"]),
            ("call_b", "grep", &["{\"q\":", "\"x\"", "}"]),
        ])
        .tool_stop();
    let chunks = chunks(&script);
    let deltas: Vec<&StreamChunk> = chunks
        .iter()
        .filter(|c| matches!(c, StreamChunk::ToolCallDelta(_)))
        .collect();
    assert_eq!(
        deltas,
        vec![
            &call_delta(0, "call_a", Some("read"), "{\"p\":"),
            &call_delta(1, "call_b", Some("grep"), "{\"q\":"),
            &call_delta(0, "call_a", None, "\"a\"}"),
            &call_delta(1, "call_b", None, "\"x\""),
            &call_delta(1, "call_b", None, "}"),
        ]
    );
    let assembler = assemble(&chunks);
    assert_eq!(
        assembler.blocks(),
        vec![
            call("call_a", "read", "{\"p\":\"a\"}"),
            call("call_b", "grep", "{\"q\":\"x\"}"),
        ]
    );
    assert_eq!(assembler.finish(), FinishReason::ToolCalls);
}

#[test]
fn usage_comes_right_before_the_finish_and_nothing_after_it() {
    let chunks = chunks(&Script::new().usage(7, 3, None).text("ok").stop());
    assert_usage_second_to_last(&chunks, (7, 3, None));
    assert!(matches!(
        chunks[chunks.len() - 1],
        StreamChunk::Finish { .. }
    ));
}

#[test]
fn the_incomplete_reasons_map_to_their_finishes() {
    let chunks_of = |reason: &str| chunks(&Script::new().text("partial").finish(reason));
    let max = assemble(&chunks_of("max_output_tokens"));
    assert_eq!(max.finish(), FinishReason::MaxTokens);
    assert_eq!(max.blocks(), vec![ContentBlock::text("partial")]);
    let filtered = assemble(&chunks_of("content_filter")).finish();
    assert_eq!(code(&filtered), Some("FINISH_CONTENT_FILTER"));
    let unknown = assemble(&chunks_of("tea_break")).finish();
    assert_eq!(code(&unknown), Some("FINISH_TEA_BREAK"));
}

#[test]
fn a_max_tokens_finish_drops_the_call_it_cut() {
    let script = Script::new()
        .text("Looking.")
        .tool_call("call_1", "grep", &["{\"pat"])
        .finish("max_output_tokens");
    let assembler = assemble(&chunks(&script));
    assert_eq!(assembler.finish(), FinishReason::MaxTokens);
    assert_eq!(assembler.blocks(), vec![ContentBlock::text("Looking.")]);
}

#[test]
fn error_events_fail_with_codes_from_their_kind() {
    for (kind, code) in [
        ("server_error", SERVER),
        ("overloaded", SERVER),
        ("rate_limit_exceeded", RATE_LIMIT),
        ("insufficient_quota", QUOTA),
    ] {
        let script = Script::new().text("so far").error(kind, "it went wrong");
        let (chunks, result) = read(&script);
        let failure = result.expect_err("an error event fails the stream");
        assert_eq!(failure.code.as_str(), code, "{kind}");
        assert!(
            failure.message.contains("it went wrong"),
            "{}",
            failure.message
        );
        assert!(
            !chunks
                .iter()
                .any(|c| matches!(c, StreamChunk::Finish { .. })),
            "no finish chunk after a failure"
        );
    }
}

#[test]
fn the_error_body_classifies_by_its_kind() {
    let at = UNIX_EPOCH + Duration::from_secs(0);
    let classify = |status, kind| {
        failure::classify(status, |_| None, &responses::error_body(kind, "no"), at).code
    };
    assert_eq!(classify(429, "rate_limit_exceeded"), RATE_LIMIT);
    assert_eq!(classify(429, "insufficient_quota"), QUOTA);
    assert_eq!(classify(500, "server_error"), SERVER);
    let body: serde_json::Value =
        serde_json::from_str(&responses::error_body("server_error", "boom")).expect("JSON");
    assert_eq!(body["error"]["message"], "boom");
}

#[test]
fn raw_events_are_read_verbatim() {
    let bad = Script::new().raw(Some("response.output_text.delta"), "{not json");
    assert_eq!(failure_of(&bad).code.as_str(), BAD_RESPONSE);
    let ignored = Script::new()
        .raw(
            Some("response.future_event"),
            "{\"type\":\"response.future_event\"}",
        )
        .raw(None, "[DONE]")
        .text("x")
        .stop();
    assert_eq!(
        assemble(&chunks(&ignored)).blocks(),
        vec![ContentBlock::text("x")]
    );
}

#[test]
fn a_script_without_its_end_is_a_closed_stream_and_one_with_nothing_is_empty() {
    let (chunks, result) = read(&Script::new().text("cut"));
    assert_eq!(result.map_err(|e| e.code), Err(Text::from(STREAM_CLOSED)));
    assert_eq!(
        chunks.len(),
        2,
        "the text came out before the close: {chunks:?}"
    );
    assert_eq!(
        failure_of(&Script::new().stop()).code.as_str(),
        EMPTY_RESPONSE
    );
    assert_eq!(
        failure_of(&Script::new().usage(5, 0, None).stop())
            .code
            .as_str(),
        EMPTY_RESPONSE
    );
}

#[test]
fn replies_carry_the_body_whole_or_in_chunks() {
    let script = Script::new().text("hi").stop();
    assert_eq!(
        script.reply(),
        Reply::Sse {
            body: script.body(),
            chunk: None,
            delay: Duration::ZERO,
        }
    );
    assert_eq!(
        script.chunked(5, Duration::from_millis(3)),
        Reply::Sse {
            body: script.body(),
            chunk: Some(5),
            delay: Duration::from_millis(3),
        }
    );
    let text = String::from_utf8(script.body()).expect("UTF-8");
    assert!(
        text.starts_with("event: response.created\ndata: {"),
        "{text}"
    );
}

/// A script with every kind of block, split arguments and usage.
fn everything() -> Script {
    Script::new()
        .reasoning("Plan: ")
        .reasoning("read then answer. é ✓")
        .text("I'll read ")
        .text("both files.")
        .parallel_tool_calls(&[
            ("call_a", "read", &["{\"path\":", "\"a.txt\"}"]),
            ("call_b", "read", &["{\"pa", "th\":\"b.txt\"", "}"]),
        ])
        .usage(1200, 80, Some(1024))
        .tool_stop()
}

proptest! {
    #[test]
    fn any_cutting_of_a_script_reads_to_the_same_chunks(
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..40),
        ends in 0usize..3,
    ) {
        let script = match ends {
            0 => everything(),
            1 => Script::new().text("half").error("server_error", "gone"),
            _ => Script::new().text("no end"),
        };
        let body = script.body();
        let offsets: Vec<usize> = cuts.iter().map(|i| i.index(body.len() + 1)).collect();
        let whole = read_cut(&body, &[]);
        let cut = read_cut(&body, &offsets);
        prop_assert_eq!(whole, cut);
    }
}
