//! The model boundary: a streaming [`Model`] trait, the request it receives, and the assembler
//! that turns a stream of chunks into an assistant message.

use std::pin::Pin;

use futures_core::Stream;
use lineage_log::{
    BlockType, CallId, ContentBlock, FinishReason, Message, ModelFailure, SessionId, StepNo,
    StreamChunk, Text, TurnError, TurnNo, Usage,
};

use crate::Cancellation;
use crate::contain::{self, Contained};

/// The error code of a stream that stopped because its request was cancelled.
pub const ABORTED: &str = "ABORTED";
/// The error code of a request whose model panicked: in [`Model::stream`], while its stream was
/// polled, or when it was dropped early.
pub const MODEL_PANICKED: &str = "MODEL_PANICKED";

/// A model's answer: raw chunks as they arrive. An `Err` item is the adapter's failure; the turn
/// loop turns it into a terminal `finish` chunk with an error (or aborted) reason, so the loop
/// never sees an adapter error as anything but a finish. Nothing after a `finish` chunk is read.
pub type ChunkStream = Pin<Box<dyn Stream<Item = Result<StreamChunk, ModelError>> + Send>>;

/// An adapter's failure, with what the endpoint said about it.
///
/// The stream's `finish` chunk records the code and message ([`ModelFailure`]); the turn's stored
/// error ([`TurnError`]) keeps all of it, so a host can tell when to retry and which request to
/// quote to the endpoint's operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelError {
    /// A stable code, for programs.
    pub code: Text,
    /// What went wrong, for people.
    pub message: Text,
    /// The endpoint's HTTP status, when the failure was an error response.
    pub status: Option<u32>,
    /// How long the endpoint asked the caller to wait before retrying.
    pub retry_after_ms: Option<u64>,
    /// The endpoint's request id, when it gave one.
    pub request_id: Option<Text>,
}

impl ModelError {
    /// A failure with `code` and `message` and nothing from an endpoint.
    pub fn new(code: impl Into<Text>, message: impl Into<Text>) -> Self {
        ModelError {
            code: code.into(),
            message: message.into(),
            status: None,
            retry_after_ms: None,
            request_id: None,
        }
    }

    /// The code and message, as a stream's `finish` chunk records them.
    pub fn failure(&self) -> ModelFailure {
        ModelFailure {
            message: self.message.clone(),
            code: self.code.clone(),
        }
    }

    /// The turn error this failure becomes when it ends a turn.
    pub fn into_turn_error(self) -> TurnError {
        TurnError {
            message: self.message,
            code: self.code,
            status: self.status,
            retry_after_ms: self.retry_after_ms,
            request_id: self.request_id,
        }
    }
}

impl From<ModelFailure> for ModelError {
    fn from(failure: ModelFailure) -> Self {
        ModelError::new(failure.code, failure.message)
    }
}

impl std::fmt::Display for ModelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)?;
        if let Some(status) = self.status {
            write!(f, " (HTTP {status})")?;
        }
        Ok(())
    }
}

impl std::error::Error for ModelError {}

/// A tool as the model sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSchema {
    /// The name the model calls it by.
    pub name: String,
    /// What it does and when to use it.
    pub description: String,
    /// A JSON Schema of its input.
    pub parameters: serde_json::Value,
}

/// One model request: everything the model needs for one step.
#[derive(Clone, Debug)]
pub struct ModelRequest {
    /// The session asking.
    pub session: SessionId,
    /// The turn and step the request belongs to.
    pub turn: TurnNo,
    /// See `turn`.
    pub step: StepNo,
    /// The model endpoint the request names (the agent's option): which configured model service
    /// answers it.
    pub endpoint: Text,
    /// The model (the agent's option).
    pub model: Text,
    /// The most output tokens, when the agent sets a cap.
    pub max_tokens: Option<u32>,
    /// The assembled system prompt.
    pub system: String,
    /// The tools the model may call, in order.
    pub tools: Vec<ToolSchema>,
    /// The conversation: exactly the session's model history at dispatch.
    pub messages: Vec<Message>,
    /// Fires when the turn is cancelled; a model should stop streaming when it does.
    pub cancel: Cancellation,
}

/// A streaming model. Implementations route on `request.endpoint` and `request.model` as they
/// see fit; [`crate::ScriptedModel`] is a deterministic one for tests and demos.
pub trait Model: Send + Sync + 'static {
    /// Starts a request and returns its chunk stream. Dropping the stream abandons the request.
    fn stream(&self, request: ModelRequest) -> ChunkStream;
}

/// A request's stream as the turn loop reads it. A panic in [`Model::stream`] or in a poll of its
/// stream is the adapter's failure, with code [`MODEL_PANICKED`] and the panic's message, and ends
/// the stream like any adapter error; a panic in the stream's drop is logged.
pub(crate) struct ModelStream {
    stream: Option<Contained<ChunkStream>>,
    /// A failure to yield before anything else (the request panicked before it had a stream).
    failed: Option<ModelError>,
    /// Who panicked, for the failure's message: agent, model, turn and step.
    subject: String,
}

impl ModelStream {
    /// Starts `request` on `model`.
    pub(crate) fn start(model: &dyn Model, request: ModelRequest) -> Self {
        let subject = format!(
            "agent {}: model {}/{} (turn {} step {})",
            request.session, request.endpoint, request.model, request.turn, request.step
        );
        match contain::call(|| model.stream(request)) {
            Ok(stream) => ModelStream {
                stream: Some(Contained::new(stream, "a model stream")),
                failed: None,
                subject,
            },
            Err(message) => ModelStream {
                stream: None,
                failed: Some(panicked(&subject, "when asked", &message)),
                subject,
            },
        }
    }

    /// The next item; `None` once the stream has ended. Cancel-safe: nothing is lost when the
    /// returned future is dropped before it resolves.
    pub(crate) async fn next(&mut self) -> Option<Result<StreamChunk, ModelError>> {
        if let Some(failure) = self.failed.take() {
            return Some(Err(failure));
        }
        match self.stream.as_mut()?.next().await {
            Ok(item) => item,
            Err(message) => {
                self.stream = None;
                Some(Err(panicked(&self.subject, "while streaming", &message)))
            }
        }
    }
}

fn panicked(subject: &str, when: &str, message: &str) -> ModelError {
    ModelError::new(
        MODEL_PANICKED,
        format!("{subject} panicked {when}: {message}"),
    )
}

/// The terminal chunk an adapter failure becomes: aborted when the request was cancelled or the
/// failure says so, an error otherwise.
pub(crate) fn failure_finish(failure: ModelFailure, cancelled: bool) -> StreamChunk {
    let reason = if cancelled || failure.code == ABORTED {
        FinishReason::Aborted(Box::new(failure))
    } else {
        FinishReason::Error(Box::new(failure))
    };
    StreamChunk::Finish { reason }
}

/// Assembles a stream's chunks into content blocks.
///
/// Blocks keep the order in which their index was first seen. A `block-end` carries the
/// authoritative block and the first close of an index wins: later deltas to it are ignored. A
/// missing `block-start` is tolerated. Chunks after `finish` are ignored.
#[derive(Debug, Default)]
pub struct Assembler {
    blocks: Vec<Slot>,
    usage: Option<Usage>,
    finish: Option<FinishReason>,
}

#[derive(Debug)]
struct Slot {
    index: u32,
    kind: BlockType,
    text: String,
    call_id: Option<CallId>,
    name: Option<Text>,
    closed: Option<ContentBlock>,
}

impl Assembler {
    /// An assembler that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    fn slot(&mut self, index: u32, kind: BlockType) -> &mut Slot {
        let at = match self.blocks.iter().position(|s| s.index == index) {
            Some(at) => at,
            None => {
                self.blocks.push(Slot {
                    index,
                    kind,
                    text: String::new(),
                    call_id: None,
                    name: None,
                    closed: None,
                });
                self.blocks.len() - 1
            }
        };
        &mut self.blocks[at]
    }

    /// Takes in one chunk.
    pub fn push(&mut self, chunk: &StreamChunk) {
        if self.finish.is_some() {
            return;
        }
        match chunk {
            StreamChunk::BlockStart { index, block_type } => {
                self.slot(*index, *block_type);
            }
            StreamChunk::TextDelta { index, text } => {
                let slot = self.slot(*index, BlockType::Text);
                if slot.closed.is_none() {
                    slot.text.push_str(text);
                }
            }
            StreamChunk::ReasoningDelta { index, text } => {
                let slot = self.slot(*index, BlockType::Reasoning);
                if slot.closed.is_none() {
                    slot.text.push_str(text);
                }
            }
            StreamChunk::ToolCallDelta(delta) => {
                let slot = self.slot(delta.index, BlockType::ToolCall);
                if slot.closed.is_none() {
                    slot.call_id.get_or_insert_with(|| delta.id.clone());
                    if let Some(name) = &delta.name {
                        slot.name.get_or_insert_with(|| name.clone());
                    }
                    slot.text.push_str(&delta.arguments_delta);
                }
            }
            StreamChunk::BlockEnd { index, block } => {
                let kind = match **block {
                    ContentBlock::Reasoning { .. } => BlockType::Reasoning,
                    ContentBlock::ToolCall { .. } => BlockType::ToolCall,
                    _ => BlockType::Text,
                };
                let slot = self.slot(*index, kind);
                slot.closed.get_or_insert_with(|| (**block).clone());
            }
            StreamChunk::Usage(usage) => self.usage = Some(**usage),
            StreamChunk::Finish { reason } => self.finish = Some(reason.clone()),
        }
    }

    /// Why the stream finished: `Stop` when it ended without a `finish` chunk.
    pub fn finish(&self) -> FinishReason {
        self.finish.clone().unwrap_or(FinishReason::Stop)
    }

    /// The usage the stream reported.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    fn block(slot: &Slot) -> Option<ContentBlock> {
        if let Some(closed) = &slot.closed {
            return Some(closed.clone());
        }
        let text = Text::from(slot.text.as_str());
        Some(match slot.kind {
            BlockType::Text => ContentBlock::Text { text },
            BlockType::Reasoning => ContentBlock::Reasoning { text },
            BlockType::ToolCall => ContentBlock::ToolCall {
                id: slot.call_id.clone()?,
                name: slot.name.clone()?,
                arguments: text,
            },
        })
    }

    /// The assembled blocks of a finished stream. A max-tokens finish drops tool calls: their
    /// arguments may be cut off, and no tool runs after a max-tokens step.
    pub fn blocks(&self) -> Vec<ContentBlock> {
        let max_tokens = matches!(self.finish, Some(FinishReason::MaxTokens));
        self.blocks
            .iter()
            .filter_map(Self::block)
            .filter(|b| !(max_tokens && matches!(b, ContentBlock::ToolCall { .. })))
            .collect()
    }

    /// What is kept of a stream cut off by cancellation: its text and reasoning blocks with
    /// non-blank text. Tool calls are dropped: a cut-off call never runs.
    pub fn interrupted_blocks(&self) -> Vec<ContentBlock> {
        self.blocks
            .iter()
            .filter_map(Self::block)
            .filter(|b| match b {
                ContentBlock::Text { text } | ContentBlock::Reasoning { text } => {
                    !text.trim().is_empty()
                }
                _ => false,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lineage_log::ToolCallDelta;

    fn delta(index: u32, text: &str) -> StreamChunk {
        StreamChunk::TextDelta {
            index,
            text: text.into(),
        }
    }

    #[test]
    fn deltas_assemble_in_first_seen_order_without_block_starts() {
        let mut a = Assembler::new();
        a.push(&delta(1, "b"));
        a.push(&delta(0, "a"));
        a.push(&delta(1, "c"));
        assert_eq!(
            a.blocks(),
            vec![ContentBlock::text("bc"), ContentBlock::text("a")]
        );
        assert_eq!(a.finish(), FinishReason::Stop);
    }

    #[test]
    fn the_first_block_end_is_authoritative() {
        let mut a = Assembler::new();
        a.push(&delta(0, "draft"));
        a.push(&StreamChunk::BlockEnd {
            index: 0,
            block: Box::new(ContentBlock::text("final")),
        });
        a.push(&delta(0, " ignored"));
        a.push(&StreamChunk::BlockEnd {
            index: 0,
            block: Box::new(ContentBlock::text("second close")),
        });
        assert_eq!(a.blocks(), vec![ContentBlock::text("final")]);
    }

    #[test]
    fn max_tokens_drops_tool_calls_and_interruption_keeps_only_non_blank_text() {
        let mut a = Assembler::new();
        a.push(&delta(0, "  "));
        a.push(&StreamChunk::ReasoningDelta {
            index: 1,
            text: "thinking".into(),
        });
        a.push(&StreamChunk::ToolCallDelta(Box::new(ToolCallDelta {
            index: 2,
            id: CallId::new("c1"),
            name: Some("read".into()),
            arguments_delta: "{\"pa".into(),
        })));
        assert_eq!(
            a.interrupted_blocks(),
            vec![ContentBlock::Reasoning {
                text: "thinking".into()
            }]
        );
        assert_eq!(a.blocks().len(), 3);
        a.push(&StreamChunk::Finish {
            reason: FinishReason::MaxTokens,
        });
        a.push(&delta(0, "after finish"));
        assert_eq!(a.blocks().len(), 2);
        assert_eq!(a.blocks()[0], ContentBlock::text("  "));
    }

    #[test]
    fn adapter_failures_become_error_or_aborted_finishes() {
        let failure = |code: &str| ModelFailure {
            message: "boom".into(),
            code: code.into(),
        };
        assert!(matches!(
            failure_finish(failure("RATE_LIMITED"), false),
            StreamChunk::Finish {
                reason: FinishReason::Error(_)
            }
        ));
        assert!(matches!(
            failure_finish(failure("RATE_LIMITED"), true),
            StreamChunk::Finish {
                reason: FinishReason::Aborted(_)
            }
        ));
        assert!(matches!(
            failure_finish(failure(ABORTED), false),
            StreamChunk::Finish {
                reason: FinishReason::Aborted(_)
            }
        ));
    }
}
