//! Random event bodies of every variant, with awkward field values, for codec tests.
//!
//! These bodies are not meant to sit in a valid log (a random `tool/result` need not answer
//! anything); they are meant to reach every variant and every optional field of the wire format.

use lineage_log::{
    AbortCause, ApprovalPolicy, AssistantChunk, AssistantMessage, BlockType, BudgetLimit,
    BudgetReached, CallId, ContentBlock, Custom, DescriptorMode, Digest, EventBody, FinishReason,
    InboxSpliced, InboxTarget, Message, MessageId, MessageSource, ModelFailure, Opaque,
    PolicySource, Role, SandboxMode, SessionId, SessionLineage, StepEnd, StepStart, StreamChunk,
    SubagentDescriptor, Text, ToolCall, ToolCallDelta, ToolError, ToolFilter, ToolResult, TurnEnd,
    TurnEndReason, TurnError, TurnStart, Usage,
};

use crate::SplitMix64;

/// The smallest tag [`random_event_body`] gives an [`Opaque`] record. Far above every tag this
/// build knows, so such a record stays unknown (and so opaque) when later builds add variants.
pub const OPAQUE_TAG_BASE: u32 = 1 << 20;

/// Strings that stress the codec: empty, non-ASCII, exactly at and just past the 24-byte inline
/// limit of [`Text`], quotes and control characters.
const AWKWARD: &[&str] = &[
    "",
    "a",
    "hello world",
    "héllo wörld",
    "日本語のテキスト",
    "crab 🦀 rocket 🚀",
    "exactly twenty-four byte",
    "twenty-five bytes exactly",
    "quote \" backslash \\ newline \n tab \t nul \0 end",
    "{\"path\":\"src/lib.rs\",\"line\":1}",
];

pub(crate) fn random_string(rng: &mut SplitMix64) -> String {
    match rng.below(4) {
        0 => {
            // A long string, well past any inline storage.
            let unit = rng.pick(AWKWARD).copied().unwrap_or("x");
            let unit = if unit.is_empty() { "x" } else { unit };
            unit.repeat(rng.between(10, 60) as usize)
        }
        _ => rng.pick(AWKWARD).copied().unwrap_or("").to_owned(),
    }
}

pub(crate) fn random_text(rng: &mut SplitMix64) -> Text {
    Text::from(random_string(rng))
}

fn random_u64(rng: &mut SplitMix64) -> u64 {
    match rng.below(6) {
        0 => 0,
        1 => 127,
        2 => 128,
        3 => u64::MAX,
        4 => u64::from(u32::MAX),
        _ => rng.next_u64(),
    }
}

fn random_u32(rng: &mut SplitMix64) -> u32 {
    match rng.below(4) {
        0 => 0,
        1 => u32::MAX,
        _ => rng.below(1000) as u32,
    }
}

fn maybe<T>(rng: &mut SplitMix64, f: impl FnOnce(&mut SplitMix64) -> T) -> Option<T> {
    if rng.percent(50) { Some(f(rng)) } else { None }
}

fn session_id(rng: &mut SplitMix64) -> SessionId {
    SessionId::from_u128(rng.next_u128())
}

fn call_id(rng: &mut SplitMix64) -> CallId {
    CallId::new(random_text(rng))
}

pub(crate) fn random_usage(rng: &mut SplitMix64) -> Usage {
    Usage {
        input_tokens: random_u64(rng),
        output_tokens: random_u64(rng),
        cache_read_tokens: maybe(rng, random_u64),
    }
}

pub(crate) fn random_source(rng: &mut SplitMix64) -> MessageSource {
    match rng.below(7) {
        0 => MessageSource::User,
        1 => MessageSource::Model {
            endpoint: random_text(rng),
            model: random_text(rng),
        },
        2 => MessageSource::Tool {
            call_id: call_id(rng),
        },
        3 => MessageSource::Coordinator {
            sender: session_id(rng),
        },
        4 => MessageSource::SubagentReport {
            sender: session_id(rng),
        },
        5 => MessageSource::SubagentSettled {
            sender: session_id(rng),
            summary: random_text(rng),
        },
        _ => MessageSource::Plugin {
            name: random_text(rng),
        },
    }
}

pub(crate) fn random_block(rng: &mut SplitMix64, depth: u32) -> ContentBlock {
    let kinds = if depth == 0 { 4 } else { 5 };
    match rng.below(kinds) {
        0 => ContentBlock::Text {
            text: random_text(rng),
        },
        1 => ContentBlock::Reasoning {
            text: random_text(rng),
        },
        2 => ContentBlock::Image {
            media_type: Text::from("image/png"),
            attachment: random_text(rng),
        },
        3 => ContentBlock::ToolCall {
            id: call_id(rng),
            name: random_text(rng),
            arguments: random_text(rng),
        },
        _ => ContentBlock::ToolResult {
            tool_call_id: call_id(rng),
            content: (0..rng.below(3))
                .map(|_| random_block(rng, depth - 1))
                .collect(),
            is_error: rng.percent(50),
        },
    }
}

fn random_message(rng: &mut SplitMix64) -> Message {
    Message {
        id: MessageId::from_u128(rng.next_u128()),
        role: if rng.percent(50) {
            Role::User
        } else {
            Role::Assistant
        },
        content: (0..rng.below(4)).map(|_| random_block(rng, 2)).collect(),
        source: random_source(rng),
    }
}

pub(crate) fn random_reason(rng: &mut SplitMix64) -> TurnEndReason {
    match rng.below(10) {
        0 => TurnEndReason::Completed,
        1 => TurnEndReason::Aborted {
            cause: AbortCause::User,
        },
        2 => TurnEndReason::Aborted {
            cause: AbortCause::Parent,
        },
        3 => TurnEndReason::Aborted {
            cause: AbortCause::Hook {
                reason: random_text(rng),
            },
        },
        4 => TurnEndReason::Aborted {
            cause: AbortCause::Disposed,
        },
        5 => TurnEndReason::Blocked,
        6 => TurnEndReason::Error(Box::new(TurnError {
            message: random_text(rng),
            code: random_text(rng),
            status: maybe(rng, random_u32),
            retry_after_ms: maybe(rng, random_u64),
            request_id: maybe(rng, random_text),
        })),
        7 => TurnEndReason::MaxTokens,
        8 => TurnEndReason::Budget(Box::new(BudgetReached {
            limit: [
                BudgetLimit::Turns,
                BudgetLimit::Requests,
                BudgetLimit::OutputTokens,
                BudgetLimit::WallClock,
            ][rng.below(4) as usize],
            max: random_u64(rng),
            owner: SessionId::from_u128(rng.next_u128()),
        })),
        _ => TurnEndReason::Interrupted,
    }
}

fn failure(rng: &mut SplitMix64) -> ModelFailure {
    ModelFailure {
        message: random_text(rng),
        code: random_text(rng),
    }
}

pub(crate) fn random_chunk(rng: &mut SplitMix64) -> StreamChunk {
    let index = random_u32(rng);
    match rng.below(7) {
        0 => StreamChunk::BlockStart {
            index,
            block_type: match rng.below(3) {
                0 => BlockType::Text,
                1 => BlockType::Reasoning,
                _ => BlockType::ToolCall,
            },
        },
        1 => StreamChunk::TextDelta {
            index,
            text: random_text(rng),
        },
        2 => StreamChunk::ReasoningDelta {
            index,
            text: random_text(rng),
        },
        3 => StreamChunk::ToolCallDelta(Box::new(ToolCallDelta {
            index,
            id: call_id(rng),
            name: maybe(rng, random_text),
            arguments_delta: random_text(rng),
        })),
        4 => StreamChunk::BlockEnd {
            index,
            block: Box::new(random_block(rng, 2)),
        },
        5 => StreamChunk::Usage(Box::new(random_usage(rng))),
        _ => StreamChunk::Finish {
            reason: match rng.below(5) {
                0 => FinishReason::Stop,
                1 => FinishReason::ToolCalls,
                2 => FinishReason::MaxTokens,
                3 => FinishReason::Error(Box::new(failure(rng))),
                _ => FinishReason::Aborted(Box::new(failure(rng))),
            },
        },
    }
}

fn policy_source(rng: &mut SplitMix64) -> PolicySource {
    if rng.percent(50) {
        PolicySource::Own
    } else {
        PolicySource::Delegation
    }
}

fn texts(rng: &mut SplitMix64) -> Vec<Text> {
    (0..rng.below(3)).map(|_| random_text(rng)).collect()
}

/// A random body of any variant (each of the sixteen about equally likely), with awkward strings
/// and extreme numbers in its fields. An [`Opaque`] body has a tag at or above
/// [`OPAQUE_TAG_BASE`] and arbitrary payload bytes; a [`Custom`] body may be ignorable.
pub fn random_event_body(rng: &mut SplitMix64) -> EventBody {
    let turn = random_u32(rng);
    let step = random_u32(rng);
    match rng.below(16) {
        0 => TurnStart { turn }.into(),
        1 => TurnEnd {
            turn,
            reason: random_reason(rng),
        }
        .into(),
        2 => StepStart { turn, step }.into(),
        3 => StepEnd { turn, step }.into(),
        4 => EventBody::from(random_message(rng)),
        5 => AssistantChunk {
            turn,
            step,
            chunk: random_chunk(rng),
        }
        .into(),
        6 => AssistantMessage {
            turn,
            step,
            message: random_message(rng),
            usage: maybe(rng, random_usage),
            interrupted: rng.percent(50),
        }
        .into(),
        7 => ToolCall {
            turn,
            step,
            call_id: call_id(rng),
            name: random_text(rng),
            arguments: random_text(rng),
        }
        .into(),
        8 => ToolResult {
            turn,
            step,
            message: random_message(rng),
            error: maybe(rng, |rng| ToolError {
                name: random_text(rng),
                code: random_text(rng),
            }),
        }
        .into(),
        9 => InboxSpliced {
            target: if rng.percent(50) {
                InboxTarget::NextTurn
            } else {
                InboxTarget::NextStep
            },
            start: random_u32(rng),
            removed: random_u32(rng),
            inserted: (0..rng.below(3)).map(|_| random_message(rng)).collect(),
            canceled: rng.percent(50),
        }
        .into(),
        10 => {
            let mut digest = [0u8; 32];
            for chunk in digest.chunks_mut(8) {
                chunk.copy_from_slice(&rng.next_u64().to_le_bytes());
            }
            SessionLineage {
                parent: session_id(rng),
                seed_len: random_u64(rng),
                seed_digest: Digest(digest),
                delegation_depth: random_u32(rng),
            }
            .into()
        }
        11 => SubagentDescriptor {
            version: random_u32(rng),
            mode: if rng.percent(50) {
                DescriptorMode::OneShot
            } else {
                DescriptorMode::Continuable
            },
            provider: random_text(rng),
            label: maybe(rng, random_text),
            endpoint: maybe(rng, random_text),
            model: maybe(rng, random_text),
            persona: maybe(rng, random_text),
            tool_filter: maybe(rng, |rng| ToolFilter {
                allow: maybe(rng, texts),
                deny: maybe(rng, texts),
            }),
        }
        .into(),
        12 => ApprovalPolicy {
            policy: random_text(rng),
            source: policy_source(rng),
        }
        .into(),
        13 => SandboxMode {
            mode: random_text(rng),
            source: policy_source(rng),
        }
        .into(),
        14 => Custom {
            type_name: random_text(rng),
            payload: random_text(rng),
            ignorable: rng.percent(50),
        }
        .into(),
        _ => {
            let span = u64::from(u32::MAX - OPAQUE_TAG_BASE);
            Opaque {
                tag: OPAQUE_TAG_BASE + rng.between(0, span) as u32,
                payload: (0..rng.below(40)).map(|_| rng.next_u64() as u8).collect(),
            }
            .into()
        }
    }
}
