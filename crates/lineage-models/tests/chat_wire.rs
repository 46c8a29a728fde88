//! The Chat Completions scripts of the loopback server read through the answer reader: every
//! shape a script writes becomes the chunks and the message it means, and any chunking of the
//! bytes reads the same.

mod common;

use common::{assert_reasoning_then_text, call, sse_body, text_deltas};

use lineage_agent::{Assembler, ModelError};
use lineage_log::{BlockType, ContentBlock, FinishReason, StreamChunk, Usage};
use lineage_models::Wire;
use lineage_models::failure::{EMPTY_RESPONSE, SERVER, STREAM_CLOSED};
use lineage_testkit::loopback::chat::{self, Script};
use proptest::prelude::*;

fn read(body: &[u8]) -> (Vec<StreamChunk>, Result<(), ModelError>) {
    common::read(Wire::ChatCompletions, body)
}

fn assemble(script: &Script) -> (Vec<StreamChunk>, Assembler) {
    let (chunks, result) = read(&script.body());
    assert_eq!(result, Ok(()), "the script reads: {chunks:?}");
    let assembled = common::assemble(&chunks);
    (chunks, assembled)
}

#[test]
fn a_text_script_reads_to_one_text_block_and_a_stop() {
    let script = Script::new().text("Hel").text("lo").stop();
    let (chunks, assembled) = assemble(&script);
    let mut expected = text_deltas(&["Hel", "lo"]);
    expected.push(StreamChunk::Finish {
        reason: FinishReason::Stop,
    });
    assert_eq!(chunks, expected);
    assert_eq!(assembled.blocks(), vec![ContentBlock::text("Hello")]);
    assert_eq!(
        sse_body(&chat::text("Hello")),
        Script::new().text("Hello").stop().body()
    );
}

#[test]
fn reasoning_then_text_are_two_blocks() {
    let (_, assembled) = assemble(
        &Script::new()
            .reasoning("Think")
            .reasoning("ing.")
            .text("Answer.")
            .stop(),
    );
    assert_reasoning_then_text(&assembled, "Thinking.", "Answer.");
}

#[test]
fn a_tool_call_script_reads_to_the_call_with_its_id_on_every_delta() {
    let script = Script::new()
        .tool_call("call_1", "read", &["{\"pa", "th\":\"a", ".txt\"}"])
        .tool_stop();
    let (chunks, assembled) = assemble(&script);
    let deltas: Vec<_> = chunks
        .iter()
        .filter_map(|c| match c {
            StreamChunk::ToolCallDelta(d) => Some(d),
            _ => None,
        })
        .collect();
    assert_eq!(deltas.len(), 3);
    assert!(deltas.iter().all(|d| d.id.as_str() == "call_1"));
    assert_eq!(deltas[0].name.as_deref(), Some("read"));
    assert!(deltas[1..].iter().all(|d| d.name.is_none()));
    assert_eq!(
        assembled.blocks(),
        vec![call("call_1", "read", "{\"path\":\"a.txt\"}")]
    );
    assert_eq!(assembled.finish(), FinishReason::ToolCalls);
    let (_, whole) = assemble(&Script::new().tool_call("c", "list", &["{}"]).tool_stop());
    assert_eq!(
        sse_body(&chat::tool_call("c", "list", "{}")),
        Script::new()
            .tool_call("c", "list", &["{}"])
            .tool_stop()
            .body()
    );
    assert_eq!(whole.blocks(), vec![call("c", "list", "{}")]);
}

#[test]
fn parallel_tool_calls_each_get_their_own_block() {
    let script = Script::new()
        .text("Two at once.")
        .parallel_tool_calls(&[
            ("a", "read", &["{\"path\"", ":\"x\"}"]),
            ("b", "grep", &["{\"q\":", "\"y\"", "}"]),
        ])
        .tool_stop();
    let (chunks, assembled) = assemble(&script);
    let starts: Vec<_> = chunks
        .iter()
        .filter_map(|c| match c {
            StreamChunk::BlockStart { index, block_type } => Some((*index, *block_type)),
            _ => None,
        })
        .collect();
    assert_eq!(
        starts,
        vec![
            (0, BlockType::Text),
            (1, BlockType::ToolCall),
            (2, BlockType::ToolCall)
        ]
    );
    assert_eq!(
        assembled.blocks(),
        vec![
            ContentBlock::text("Two at once."),
            call("a", "read", "{\"path\":\"x\"}"),
            call("b", "grep", "{\"q\":\"y\"}"),
        ]
    );
}

#[test]
fn usage_precedes_the_finish_wherever_the_script_put_it() {
    let expected = Usage {
        input_tokens: 30,
        output_tokens: 4,
        cache_read_tokens: Some(16),
    };
    for script in [
        Script::new().text("ok").usage(30, 4, Some(16)).stop(),
        Script::new().text("ok").stop().usage(30, 4, Some(16)),
    ] {
        let (chunks, assembled) = assemble(&script);
        assert_eq!(
            &chunks[chunks.len() - 2..],
            &[
                StreamChunk::Usage(Box::new(expected)),
                StreamChunk::Finish {
                    reason: FinishReason::Stop
                }
            ]
        );
        assert_eq!(assembled.usage(), Some(expected));
    }
}

#[test]
fn finish_words_map_to_their_reasons() {
    let (_, length) = assemble(
        &Script::new()
            .text("cut")
            .tool_call("c", "read", &["{\"pa"])
            .finish("length"),
    );
    assert_eq!(length.finish(), FinishReason::MaxTokens);
    assert_eq!(
        length.blocks(),
        vec![ContentBlock::text("cut")],
        "the partial call is dropped"
    );
    let (_, filtered) = assemble(&Script::new().text("no").finish("content_filter"));
    match filtered.finish() {
        FinishReason::Error(failure) => assert_eq!(failure.code, "FINISH_CONTENT_FILTER"),
        other => panic!("expected an error finish, got {other:?}"),
    }
}

#[test]
fn error_empty_and_cut_scripts_fail_with_their_codes() {
    let (chunks, result) = read(
        &Script::new()
            .text("par")
            .error("server_error", "boom")
            .body(),
    );
    let error = result.expect_err("a mid-stream failure");
    assert_eq!(error.code, SERVER);
    assert!(error.message.ends_with("boom"), "{}", error.message);
    assert!(
        !chunks
            .iter()
            .any(|c| matches!(c, StreamChunk::Finish { .. }))
    );

    let (_, result) = read(&Script::new().stop().body());
    assert_eq!(result.expect_err("empty").code, EMPTY_RESPONSE);

    let (_, result) = read(&Script::new().text("half").body());
    assert_eq!(result.expect_err("cut").code, STREAM_CLOSED);
}

#[test]
fn raw_events_after_done_are_not_read() {
    let script = Script::new().text("kept").stop().raw(None, "{not json");
    let (_, assembled) = assemble(&script);
    assert_eq!(assembled.blocks(), vec![ContentBlock::text("kept")]);
}

/// A script with every kind of event: reasoning, text with multi-byte characters, parallel
/// calls with split arguments, usage and the end.
fn rich_script() -> Script {
    Script::new()
        .reasoning("Plan: read ")
        .reasoning("both — ünïcode.")
        .text("Reading «a» and ")
        .text("«b».")
        .parallel_tool_calls(&[
            ("call_a", "read", &["{\"path\":", "\"a\"}"]),
            ("call_b", "read", &["{\"pa", "th\":\"b\"", "}"]),
        ])
        .raw(None, "")
        .tool_stop()
        .usage(120, 48, Some(64))
}

proptest! {
    #[test]
    fn any_cutting_of_a_body_reads_to_the_same_chunks(
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..40),
    ) {
        let body = rich_script().body();
        let (whole, result) = read(&body);
        prop_assert_eq!(&result, &Ok(()));
        let offsets: Vec<usize> = cuts.iter().map(|i| i.index(body.len() + 1)).collect();
        let (cut, cut_result) = common::read_in_pieces(Wire::ChatCompletions, &body, &offsets);
        prop_assert_eq!(cut_result, result);
        prop_assert_eq!(cut, whole);
    }
}
