//! What the integration tests share: reading a body through `AnswerReader` in any cutting,
//! assembling the chunks and the chunks and blocks every wire format streams alike, taking a
//! loopback reply's event stream, and an endpoint on the loopback server.
//!
//! Each test file compiles this module on its own and uses only part of it.
#![allow(dead_code)]

use std::time::Duration;

use lineage_agent::{Assembler, ModelError};
use lineage_log::{BlockType, CallId, ContentBlock, FinishReason, StreamChunk};
use lineage_models::{AnswerReader, ApiKey, Endpoint, RetryPolicy, Wire};
use lineage_testkit::loopback::{LoopbackServer, Reply};

/// Reads a `wire` body pushed in the pieces that end at `cuts` (offsets in any order, any past
/// the end taken as the end), then ends the stream: the chunks, and how it ended. The first
/// failure ends the read.
pub fn read_in_pieces(
    wire: Wire,
    body: &[u8],
    cuts: &[usize],
) -> (Vec<StreamChunk>, Result<(), ModelError>) {
    let mut cuts: Vec<usize> = cuts.iter().map(|&cut| cut.min(body.len())).collect();
    cuts.push(body.len());
    cuts.sort_unstable();
    let mut reader = AnswerReader::new(wire);
    let mut out = Vec::new();
    let mut from = 0;
    for cut in cuts {
        if let Err(failure) = reader.push(&body[from..cut], &mut out) {
            return (out, Err(failure));
        }
        from = cut;
    }
    let result = reader.finish(&mut out);
    (out, result)
}

/// Reads a `wire` body pushed whole.
pub fn read(wire: Wire, body: &[u8]) -> (Vec<StreamChunk>, Result<(), ModelError>) {
    read_in_pieces(wire, body, &[])
}

/// The message `chunks` make.
pub fn assemble(chunks: &[StreamChunk]) -> Assembler {
    let mut assembler = Assembler::new();
    for chunk in chunks {
        assembler.push(chunk);
    }
    assembler
}

pub fn call(id: &str, name: &str, arguments: &str) -> ContentBlock {
    ContentBlock::ToolCall {
        id: CallId::new(id),
        name: name.into(),
        arguments: arguments.into(),
    }
}

/// The body of an event-stream reply.
pub fn sse_body(reply: &Reply) -> &[u8] {
    match reply {
        Reply::Sse { body, .. } => body,
        other => panic!("expected an event-stream reply, got {other:?}"),
    }
}

/// A text block at index 0 opened and streamed in `parts`, one delta each.
pub fn text_deltas(parts: &[&str]) -> Vec<StreamChunk> {
    let start = StreamChunk::BlockStart {
        index: 0,
        block_type: BlockType::Text,
    };
    let deltas = parts.iter().map(|part| StreamChunk::TextDelta {
        index: 0,
        text: (*part).into(),
    });
    std::iter::once(start).chain(deltas).collect()
}

/// Checks that `assembled` holds the reasoning `thought`, then the text `answer`, and stopped.
pub fn assert_reasoning_then_text(assembled: &Assembler, thought: &str, answer: &str) {
    assert_eq!(
        assembled.blocks(),
        vec![
            ContentBlock::Reasoning {
                text: thought.into()
            },
            ContentBlock::text(answer),
        ]
    );
    assert_eq!(assembled.finish(), FinishReason::Stop);
}

/// An endpoint `loop` of `wire` on the loopback `server`, authenticated with `key`.
pub fn loopback_endpoint(
    server: &LoopbackServer,
    wire: Wire,
    key: &str,
    retry: RetryPolicy,
    idle_timeout: Duration,
) -> Endpoint {
    let mut endpoint = Endpoint::new("loop", wire, format!("{}/v1", server.base_url()))
        .with_api_key(ApiKey::new(key));
    endpoint.retry = retry;
    endpoint.idle_timeout = idle_timeout;
    endpoint
}
