//! Golden vectors: the on-disk format, pinned byte for byte.
//!
//! Every vector in `schema/golden/` is built here as a value, encoded, and compared with the stored
//! bytes; the stored bytes are then decoded and compared with the value. Any change to an encoding
//! (a field added, removed or reordered, a tag renumbered, a varint widened, an enum variant moved)
//! fails the test with the name of the vector that changed. `schema/FORMAT.md` describes the format
//! the vectors illustrate.
//!
//! Blessing: with `LINEAGE_BLESS=1` the tests write the vector files instead of comparing. That is
//! allowed only together with a format version bump, or to add the vector of a new variant; see
//! `schema/FORMAT.md`, "Golden vectors".

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use lineage_log::{
    AbortCause, ApprovalPolicy, AssistantChunk, AssistantMessage, BlockType, BudgetLimit,
    BudgetReached, CallId, Chain, ContentBlock, Custom, DescriptorMode, Digest, Event, EventBody,
    EventKind, FORMAT_VERSION, FinishReason, Header, InboxSpliced, InboxTarget, LogError, Message,
    MessageId, MessageSource, ModelFailure, Opaque, Origin, PolicySource, Records, Role,
    SandboxMode, SessionId, SessionLineage, StepEnd, StepStart, StreamChunk, SubagentDescriptor,
    Text, ToolCall, ToolCallDelta, ToolError, ToolFilter, ToolResult, TurnEnd, TurnEndReason,
    TurnError, TurnStart, Usage, decode_record, encode_record,
};
use lineage_testkit::golden::{blessing, hex, unhex};
use serde::{Deserialize, Serialize};

const RECORDS_FILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../schema/golden/records.txt"
);
const BLOCK_FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../schema/golden/block.txt");
const SESSION_FILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../schema/golden/session.txt"
);
const INVALID_FILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../schema/golden/invalid.txt"
);

/// 2026-01-01T00:00:00Z in milliseconds since the Unix epoch: the base time of most vectors.
const BASE_MS: i64 = 1_767_225_600_000;

const HINT: &str = "An encoding changed. If the change is deliberate, bump the format version and \
     re-bless with LINEAGE_BLESS=1 (schema/FORMAT.md, \"Golden vectors\"); otherwise the change \
     breaks every stored log.";

// ---------------------------------------------------------------------------------------------
// Fixed values. Ids are UUIDv7-shaped constants (timestamp 2026-01-01, version 7, variant 10), never
// fresh ones, so the vectors never change by themselves.

fn sid(n: u128) -> SessionId {
    SessionId::from_u128(0x019b76da_a800_7000_8000_000000000000 | n)
}

fn mid(n: u128) -> MessageId {
    MessageId::from_u128(0x019b76da_a801_7000_8000_000000000000 | n)
}

fn t(s: &str) -> Text {
    Text::from(s)
}

fn call(id: &str) -> CallId {
    CallId::new(id)
}

/// A digest whose bytes are `start, start + 1, ...`, so that byte order is visible in the hex.
fn pattern_digest(start: u8) -> Digest {
    Digest(std::array::from_fn(|i| start.wrapping_add(i as u8)))
}

fn user_message(n: u128, content: Vec<ContentBlock>, source: MessageSource) -> Message {
    Message {
        id: mid(n),
        role: Role::User,
        content,
        source,
    }
}

fn model_source() -> MessageSource {
    MessageSource::Model {
        endpoint: t("acme"),
        model: t("acme-large-2"),
    }
}

fn tool_result_message(
    n: u128,
    call_id: &str,
    content: Vec<ContentBlock>,
    is_error: bool,
) -> Message {
    Message {
        id: mid(n),
        role: Role::User,
        content: vec![ContentBlock::ToolResult {
            tool_call_id: call(call_id),
            content,
            is_error,
        }],
        source: MessageSource::Tool {
            call_id: call(call_id),
        },
    }
}

fn chunk(chunk: StreamChunk) -> AssistantChunk {
    AssistantChunk {
        turn: 1,
        step: 1,
        chunk,
    }
}

fn turn_end(reason: TurnEndReason) -> TurnEnd {
    TurnEnd { turn: 1, reason }
}

/// A one-shot `spawn` descriptor of version 1 that names nothing but its `tool_filter`.
fn spawned(tool_filter: Option<ToolFilter>) -> SubagentDescriptor {
    SubagentDescriptor {
        version: 1,
        mode: DescriptorMode::OneShot,
        provider: t("spawn"),
        label: None,
        endpoint: None,
        model: None,
        persona: None,
        tool_filter,
    }
}

// ---------------------------------------------------------------------------------------------
// The vectors.

/// One named record vector: the event it encodes (its seq is the record's position).
struct RecordVector {
    name: &'static str,
    event: Event,
}

fn v(name: &'static str, seq: u64, time_ms: i64, body: impl Into<EventBody>) -> RecordVector {
    RecordVector {
        name,
        event: Event::new(seq, time_ms, body),
    }
}

fn record_vectors() -> Vec<RecordVector> {
    let b = BASE_MS;
    let long_text = "Lineage keeps every session as an append-only log of events. ".repeat(4);
    vec![
        // turn/start, turn/end and every TurnEndReason and AbortCause.
        v("turn/start", 0, b, TurnStart { turn: 1 }),
        v("turn/start/turn-300", 0, b, TurnStart { turn: 300 }),
        v(
            "turn/end/completed",
            9,
            b + 900,
            turn_end(TurnEndReason::Completed),
        ),
        v(
            "turn/end/aborted-user",
            9,
            b + 900,
            turn_end(TurnEndReason::Aborted {
                cause: AbortCause::User,
            }),
        ),
        v(
            "turn/end/aborted-parent",
            9,
            b + 900,
            turn_end(TurnEndReason::Aborted {
                cause: AbortCause::Parent,
            }),
        ),
        v(
            "turn/end/aborted-hook",
            9,
            b + 900,
            turn_end(TurnEndReason::Aborted {
                cause: AbortCause::Hook {
                    reason: t("budget exhausted"),
                },
            }),
        ),
        v(
            "turn/end/aborted-disposed",
            9,
            b + 900,
            turn_end(TurnEndReason::Aborted {
                cause: AbortCause::Disposed,
            }),
        ),
        v(
            "turn/end/blocked",
            9,
            b + 900,
            turn_end(TurnEndReason::Blocked),
        ),
        v(
            "turn/end/error-full",
            9,
            b + 900,
            turn_end(TurnEndReason::Error(
                TurnError {
                    message: t("the provider is overloaded"),
                    code: t("PROVIDER_OVERLOADED"),
                    status: Some(529),
                    retry_after_ms: Some(30_000),
                    request_id: Some(t("req_01J9Z")),
                }
                .into(),
            )),
        ),
        v(
            "turn/end/error-bare",
            9,
            b + 900,
            turn_end(TurnEndReason::Error(
                TurnError {
                    message: t("stream ended early"),
                    code: t("STREAM_ERROR"),
                    status: None,
                    retry_after_ms: None,
                    request_id: None,
                }
                .into(),
            )),
        ),
        v(
            "turn/end/error-extremes",
            9,
            b + 900,
            turn_end(TurnEndReason::Error(
                TurnError {
                    message: t(""),
                    code: t("X"),
                    status: Some(u32::MAX),
                    retry_after_ms: Some(u64::MAX),
                    request_id: Some(t("")),
                }
                .into(),
            )),
        ),
        v(
            "turn/end/max-tokens",
            9,
            b + 900,
            turn_end(TurnEndReason::MaxTokens),
        ),
        v(
            "turn/end/interrupted",
            9,
            b + 900,
            turn_end(TurnEndReason::Interrupted),
        ),
        v(
            "turn/end/budget-requests",
            9,
            b + 900,
            turn_end(TurnEndReason::Budget(Box::new(BudgetReached {
                limit: BudgetLimit::Requests,
                max: 300,
                owner: sid(1),
            }))),
        ),
        v(
            "turn/end/budget-turns",
            9,
            b + 900,
            turn_end(TurnEndReason::Budget(Box::new(BudgetReached {
                limit: BudgetLimit::Turns,
                max: 0,
                owner: sid(1),
            }))),
        ),
        v(
            "turn/end/budget-output-tokens",
            9,
            b + 900,
            turn_end(TurnEndReason::Budget(Box::new(BudgetReached {
                limit: BudgetLimit::OutputTokens,
                max: u64::MAX,
                owner: sid(1),
            }))),
        ),
        v(
            "turn/end/budget-wall-clock",
            9,
            b + 900,
            turn_end(TurnEndReason::Budget(Box::new(BudgetReached {
                limit: BudgetLimit::WallClock,
                max: 600_000,
                owner: sid(2),
            }))),
        ),
        // step/start, step/end.
        v("step/start", 2, b + 2, StepStart { turn: 1, step: 1 }),
        v("step/end", 8, b + 800, StepEnd { turn: 1, step: 1 }),
        // user/message: every MessageSource on a user-role message, every plain ContentBlock.
        v(
            "user/message/user-text",
            1,
            b + 1,
            user_message(
                1,
                vec![ContentBlock::text("Summarize the README.")],
                MessageSource::User,
            ),
        ),
        v(
            "user/message/user-image",
            1,
            b + 1,
            user_message(
                2,
                vec![
                    ContentBlock::text("What is in this picture?"),
                    ContentBlock::Image {
                        media_type: t("image/png"),
                        attachment: t("attachment:7f3a"),
                    },
                ],
                MessageSource::User,
            ),
        ),
        v(
            "user/message/empty-content",
            1,
            b + 1,
            user_message(3, vec![], MessageSource::User),
        ),
        v(
            "user/message/coordinator",
            1,
            b + 1,
            user_message(
                4,
                vec![ContentBlock::text("Also check the tests.")],
                MessageSource::Coordinator { sender: sid(1) },
            ),
        ),
        v(
            "user/message/subagent-report",
            1,
            b + 1,
            user_message(
                5,
                vec![ContentBlock::text("Half of the files are done.")],
                MessageSource::SubagentReport { sender: sid(2) },
            ),
        ),
        v(
            "user/message/subagent-settled",
            1,
            b + 1,
            user_message(
                6,
                vec![ContentBlock::text("The child finished.")],
                MessageSource::SubagentSettled {
                    sender: sid(2),
                    summary: t("completed"),
                },
            ),
        ),
        v(
            "user/message/plugin",
            1,
            b + 1,
            user_message(
                7,
                vec![ContentBlock::text("Reminder: the build is red.")],
                MessageSource::Plugin {
                    name: t("ci-watch"),
                },
            ),
        ),
        v(
            "user/message/non-ascii",
            1,
            b + 1,
            user_message(
                8,
                vec![ContentBlock::text("Grüße, 世界 🦀")],
                MessageSource::User,
            ),
        ),
        v(
            "user/message/long-record",
            1,
            b + 1,
            user_message(
                9,
                vec![ContentBlock::text(long_text.as_str())],
                MessageSource::User,
            ),
        ),
        // assistant/chunk: every StreamChunk, BlockType and FinishReason.
        v(
            "assistant/chunk/block-start-text",
            3,
            b + 10,
            chunk(StreamChunk::BlockStart {
                index: 0,
                block_type: BlockType::Text,
            }),
        ),
        v(
            "assistant/chunk/block-start-reasoning",
            3,
            b + 10,
            chunk(StreamChunk::BlockStart {
                index: 0,
                block_type: BlockType::Reasoning,
            }),
        ),
        v(
            "assistant/chunk/block-start-tool-call",
            3,
            b + 10,
            chunk(StreamChunk::BlockStart {
                index: 2,
                block_type: BlockType::ToolCall,
            }),
        ),
        v(
            "assistant/chunk/text-delta",
            4,
            b + 11,
            chunk(StreamChunk::TextDelta {
                index: 1,
                text: t("The README describes"),
            }),
        ),
        v(
            "assistant/chunk/reasoning-delta",
            4,
            b + 11,
            chunk(StreamChunk::ReasoningDelta {
                index: 0,
                text: t("The user wants a summary."),
            }),
        ),
        v(
            "assistant/chunk/tool-call-delta-named",
            4,
            b + 11,
            chunk(StreamChunk::ToolCallDelta(
                ToolCallDelta {
                    index: 2,
                    id: call("call_1"),
                    name: Some(t("read_file")),
                    arguments_delta: t("{\"path\":"),
                }
                .into(),
            )),
        ),
        v(
            "assistant/chunk/tool-call-delta-unnamed",
            4,
            b + 11,
            chunk(StreamChunk::ToolCallDelta(
                ToolCallDelta {
                    index: 2,
                    id: call("call_1"),
                    name: None,
                    arguments_delta: t("\"README.md\"}"),
                }
                .into(),
            )),
        ),
        v(
            "assistant/chunk/block-end-text",
            5,
            b + 12,
            chunk(StreamChunk::BlockEnd {
                index: 1,
                block: ContentBlock::text("The README describes Lineage.").into(),
            }),
        ),
        v(
            "assistant/chunk/block-end-reasoning",
            5,
            b + 12,
            chunk(StreamChunk::BlockEnd {
                index: 0,
                block: ContentBlock::Reasoning {
                    text: t("The user wants a summary."),
                }
                .into(),
            }),
        ),
        v(
            "assistant/chunk/block-end-tool-call",
            5,
            b + 12,
            chunk(StreamChunk::BlockEnd {
                index: 2,
                block: ContentBlock::ToolCall {
                    id: call("call_1"),
                    name: t("read_file"),
                    arguments: t("{\"path\":\"README.md\"}"),
                }
                .into(),
            }),
        ),
        v(
            "assistant/chunk/usage-cached",
            5,
            b + 12,
            chunk(StreamChunk::Usage(
                Usage {
                    input_tokens: 12_345,
                    output_tokens: 678,
                    cache_read_tokens: Some(10_000),
                }
                .into(),
            )),
        ),
        v(
            "assistant/chunk/usage-uncached",
            5,
            b + 12,
            chunk(StreamChunk::Usage(
                Usage {
                    input_tokens: 1 << 40,
                    output_tokens: 0,
                    cache_read_tokens: None,
                }
                .into(),
            )),
        ),
        v(
            "assistant/chunk/finish-stop",
            6,
            b + 13,
            chunk(StreamChunk::Finish {
                reason: FinishReason::Stop,
            }),
        ),
        v(
            "assistant/chunk/finish-tool-calls",
            6,
            b + 13,
            chunk(StreamChunk::Finish {
                reason: FinishReason::ToolCalls,
            }),
        ),
        v(
            "assistant/chunk/finish-max-tokens",
            6,
            b + 13,
            chunk(StreamChunk::Finish {
                reason: FinishReason::MaxTokens,
            }),
        ),
        v(
            "assistant/chunk/finish-error",
            6,
            b + 13,
            chunk(StreamChunk::Finish {
                reason: FinishReason::Error(
                    ModelFailure {
                        message: t("connection reset"),
                        code: t("NETWORK"),
                    }
                    .into(),
                ),
            }),
        ),
        v(
            "assistant/chunk/finish-aborted",
            6,
            b + 13,
            chunk(StreamChunk::Finish {
                reason: FinishReason::Aborted(
                    ModelFailure {
                        message: t("cancelled by the user"),
                        code: t("ABORTED"),
                    }
                    .into(),
                ),
            }),
        ),
        // assistant/message.
        v(
            "assistant/message/full",
            6,
            b + 14,
            AssistantMessage {
                turn: 1,
                step: 1,
                message: Message {
                    id: mid(20),
                    role: Role::Assistant,
                    content: vec![
                        ContentBlock::Reasoning {
                            text: t("The user wants a summary."),
                        },
                        ContentBlock::text("Let me read it."),
                        ContentBlock::ToolCall {
                            id: call("call_1"),
                            name: t("read_file"),
                            arguments: t("{\"path\":\"README.md\"}"),
                        },
                    ],
                    source: model_source(),
                },
                usage: Some(Usage {
                    input_tokens: 12_345,
                    output_tokens: 678,
                    cache_read_tokens: Some(10_000),
                }),
                interrupted: false,
            },
        ),
        v(
            "assistant/message/interrupted-empty",
            6,
            b + 14,
            AssistantMessage {
                turn: 1,
                step: 1,
                message: Message {
                    id: mid(21),
                    role: Role::Assistant,
                    content: vec![],
                    source: model_source(),
                },
                usage: None,
                interrupted: true,
            },
        ),
        // tool/call, tool/result.
        v(
            "tool/call",
            7,
            b + 15,
            ToolCall {
                turn: 1,
                step: 1,
                call_id: call("call_1"),
                name: t("read_file"),
                arguments: t("{\"path\":\"README.md\"}"),
            },
        ),
        v(
            "tool/result/ok",
            8,
            b + 16,
            ToolResult {
                turn: 1,
                step: 1,
                message: tool_result_message(
                    22,
                    "call_1",
                    vec![ContentBlock::text("# Lineage\n")],
                    false,
                ),
                error: None,
            },
        ),
        v(
            "tool/result/error",
            8,
            b + 16,
            ToolResult {
                turn: 1,
                step: 1,
                message: tool_result_message(
                    23,
                    "call_2",
                    vec![
                        ContentBlock::text("the call's outcome is unknown"),
                        ContentBlock::Image {
                            media_type: t("image/png"),
                            attachment: t("attachment:screen"),
                        },
                    ],
                    true,
                ),
                error: Some(ToolError {
                    name: t("ToolOutcomeUnknown"),
                    code: t("TOOL_OUTCOME_UNKNOWN"),
                }),
            },
        ),
        // inbox/spliced.
        v(
            "inbox/spliced/next-turn-insert",
            3,
            b + 20,
            InboxSpliced {
                target: InboxTarget::NextTurn,
                start: 0,
                removed: 0,
                inserted: vec![
                    user_message(30, vec![ContentBlock::text("first")], MessageSource::User),
                    user_message(
                        31,
                        vec![ContentBlock::text("second")],
                        MessageSource::Coordinator { sender: sid(1) },
                    ),
                ],
                canceled: false,
            },
        ),
        v(
            "inbox/spliced/next-step-cancel",
            3,
            b + 20,
            InboxSpliced {
                target: InboxTarget::NextStep,
                start: 1,
                removed: 200,
                inserted: vec![],
                canceled: true,
            },
        ),
        // session/lineage: a fork with a seed, and a spawn without one.
        v(
            "session/lineage/forked",
            12,
            b + 1000,
            SessionLineage {
                parent: sid(1),
                seed_len: 12,
                seed_digest: pattern_digest(0xa0),
                delegation_depth: 1,
            },
        ),
        v(
            "session/lineage/spawned",
            0,
            b + 1000,
            SessionLineage {
                parent: sid(1),
                seed_len: 0,
                seed_digest: Digest::of_empty(),
                delegation_depth: 3,
            },
        ),
        // subagent/descriptor: every DescriptorMode, every Option present and absent.
        v(
            "subagent/descriptor/full",
            13,
            b + 1001,
            SubagentDescriptor {
                version: 1,
                mode: DescriptorMode::Continuable,
                provider: t("fork"),
                label: Some(t("test writer")),
                endpoint: Some(t("acme")),
                model: Some(t("acme-large-2")),
                persona: Some(t("You write tests.")),
                tool_filter: Some(ToolFilter {
                    allow: Some(vec![t("read_file"), t("write_file")]),
                    deny: Some(vec![t("shell")]),
                }),
            },
        ),
        v("subagent/descriptor/bare", 1, b + 1001, spawned(None)),
        v(
            "subagent/descriptor/deny-only",
            1,
            b + 1001,
            spawned(Some(ToolFilter {
                allow: None,
                deny: Some(vec![]),
            })),
        ),
        v(
            "subagent/descriptor/allow-only",
            1,
            b + 1001,
            SubagentDescriptor {
                version: 2,
                mode: DescriptorMode::Continuable,
                label: Some(t("researcher")),
                ..spawned(Some(ToolFilter {
                    allow: Some(vec![t("search")]),
                    deny: None,
                }))
            },
        ),
        // approval/policy, sandbox/mode: every PolicySource.
        v(
            "approval/policy/delegation",
            2,
            b + 1002,
            ApprovalPolicy {
                policy: t(ApprovalPolicy::NEVER),
                source: PolicySource::Delegation,
            },
        ),
        v(
            "approval/policy/own",
            2,
            b + 1002,
            ApprovalPolicy {
                policy: t("on-request"),
                source: PolicySource::Own,
            },
        ),
        v(
            "sandbox/mode/delegation",
            3,
            b + 1003,
            SandboxMode {
                mode: t("read-only"),
                source: PolicySource::Delegation,
            },
        ),
        v(
            "sandbox/mode/own",
            3,
            b + 1003,
            SandboxMode {
                mode: t("workspace-write"),
                source: PolicySource::Own,
            },
        ),
        // custom: ignorable and required.
        v(
            "custom/ignorable",
            4,
            b + 30,
            Custom {
                type_name: t("todo/write"),
                payload: t("{\"items\":[\"write docs\"]}"),
                ignorable: true,
            },
        ),
        v(
            "custom/required",
            4,
            b + 30,
            Custom {
                type_name: t("billing/charge"),
                payload: t("{\"cents\":12}"),
                ignorable: false,
            },
        ),
        // Records of tags this build does not know, kept because they are ignorable.
        v(
            "opaque/tag-9000",
            5,
            b + 31,
            Opaque {
                tag: 9000,
                payload: vec![0x02, 0x68, 0x69, 0x00, 0xff].into(),
            },
        ),
        v(
            "opaque/tag-max-empty",
            5,
            b + 31,
            Opaque {
                tag: u32::MAX,
                payload: Vec::new().into(),
            },
        ),
        // Times: the frame's zigzag varint at its edges.
        v("time/zero", 0, 0, TurnStart { turn: 1 }),
        v("time/minus-one", 0, -1, TurnStart { turn: 1 }),
        v("time/before-epoch", 0, -86_400_000, TurnStart { turn: 1 }),
        v(
            "time/year-9999",
            0,
            253_402_300_799_999,
            TurnStart { turn: 1 },
        ),
        v("time/max", 0, i64::MAX, TurnStart { turn: 1 }),
        v("time/min", 0, i64::MIN, TurnStart { turn: 1 }),
        // A large seq: seqs are positions, not stored, so this record equals `turn/start`'s.
        v("seq/large", u64::MAX - 1, BASE_MS, TurnStart { turn: 1 }),
    ]
}

// ---------------------------------------------------------------------------------------------
// Coverage: every variant and every optional field, present and absent, has a vector. The matches
// below have no wildcard arm, so a new variant does not compile until it has a label here and a
// vector above.

const REQUIRED_COVERAGE: &[&str] = &[
    "EventKind::TurnStart",
    "EventKind::TurnEnd",
    "EventKind::StepStart",
    "EventKind::StepEnd",
    "EventKind::UserMessage",
    "EventKind::AssistantChunk",
    "EventKind::AssistantMessage",
    "EventKind::ToolCall",
    "EventKind::ToolResult",
    "EventKind::InboxSpliced",
    "EventKind::SessionLineage",
    "EventKind::SubagentDescriptor",
    "EventKind::ApprovalPolicy",
    "EventKind::SandboxMode",
    "EventKind::Custom",
    "EventKind::Opaque",
    "Custom::ignorable=true",
    "Custom::ignorable=false",
    "TurnEndReason::Completed",
    "TurnEndReason::Aborted",
    "TurnEndReason::Blocked",
    "TurnEndReason::Error",
    "TurnEndReason::MaxTokens",
    "TurnEndReason::Interrupted",
    "TurnEndReason::Budget",
    "BudgetLimit::Turns",
    "BudgetLimit::Requests",
    "BudgetLimit::OutputTokens",
    "BudgetLimit::WallClock",
    "AbortCause::User",
    "AbortCause::Parent",
    "AbortCause::Hook",
    "AbortCause::Disposed",
    "TurnError::status=Some",
    "TurnError::status=None",
    "TurnError::retry_after_ms=Some",
    "TurnError::retry_after_ms=None",
    "TurnError::request_id=Some",
    "TurnError::request_id=None",
    "StreamChunk::BlockStart",
    "StreamChunk::TextDelta",
    "StreamChunk::ReasoningDelta",
    "StreamChunk::ToolCallDelta",
    "StreamChunk::BlockEnd",
    "StreamChunk::Usage",
    "StreamChunk::Finish",
    "ToolCallDelta::name=Some",
    "ToolCallDelta::name=None",
    "BlockType::Text",
    "BlockType::Reasoning",
    "BlockType::ToolCall",
    "FinishReason::Stop",
    "FinishReason::ToolCalls",
    "FinishReason::MaxTokens",
    "FinishReason::Error",
    "FinishReason::Aborted",
    "Usage::cache_read_tokens=Some",
    "Usage::cache_read_tokens=None",
    "AssistantMessage::usage=Some",
    "AssistantMessage::usage=None",
    "AssistantMessage::interrupted=true",
    "AssistantMessage::interrupted=false",
    "ToolResult::error=Some",
    "ToolResult::error=None",
    "InboxTarget::NextTurn",
    "InboxTarget::NextStep",
    "InboxSpliced::canceled=true",
    "InboxSpliced::canceled=false",
    "DescriptorMode::OneShot",
    "DescriptorMode::Continuable",
    "SubagentDescriptor::label=Some",
    "SubagentDescriptor::label=None",
    "SubagentDescriptor::endpoint=Some",
    "SubagentDescriptor::endpoint=None",
    "SubagentDescriptor::model=Some",
    "SubagentDescriptor::model=None",
    "SubagentDescriptor::persona=Some",
    "SubagentDescriptor::persona=None",
    "SubagentDescriptor::tool_filter=Some",
    "SubagentDescriptor::tool_filter=None",
    "ToolFilter::allow=Some",
    "ToolFilter::allow=None",
    "ToolFilter::deny=Some",
    "ToolFilter::deny=None",
    "PolicySource::Own",
    "PolicySource::Delegation",
    "Role::User",
    "Role::Assistant",
    "ContentBlock::Text",
    "ContentBlock::Reasoning",
    "ContentBlock::Image",
    "ContentBlock::ToolCall",
    "ContentBlock::ToolResult",
    "ContentBlock::ToolResult::is_error=true",
    "ContentBlock::ToolResult::is_error=false",
    "MessageSource::User",
    "MessageSource::Model",
    "MessageSource::Tool",
    "MessageSource::Coordinator",
    "MessageSource::SubagentReport",
    "MessageSource::SubagentSettled",
    "MessageSource::Plugin",
    "time<0",
    "time>=2^48",
    "record-len>=128",
];

fn opt<T>(seen: &mut BTreeSet<String>, field: &str, value: &Option<T>) {
    let state = if value.is_some() { "Some" } else { "None" };
    seen.insert(format!("{field}={state}"));
}

fn flag(seen: &mut BTreeSet<String>, field: &str, value: bool) {
    seen.insert(format!("{field}={value}"));
}

fn label(seen: &mut BTreeSet<String>, label: &str) {
    seen.insert(label.to_owned());
}

fn cover_event(event: &Event, seen: &mut BTreeSet<String>) {
    label(seen, &format!("EventKind::{:?}", event.kind()));
    if event.time_ms < 0 {
        label(seen, "time<0");
    }
    if event.time_ms >= 1 << 48 {
        label(seen, "time>=2^48");
    }
    if encode_record(event).len() > 129 {
        label(seen, "record-len>=128");
    }
    match &event.body {
        EventBody::TurnStart(_) | EventBody::StepStart(_) | EventBody::StepEnd(_) => {}
        EventBody::TurnEnd(end) => match &end.reason {
            TurnEndReason::Completed => label(seen, "TurnEndReason::Completed"),
            TurnEndReason::Aborted { cause } => {
                label(seen, "TurnEndReason::Aborted");
                label(
                    seen,
                    match cause {
                        AbortCause::User => "AbortCause::User",
                        AbortCause::Parent => "AbortCause::Parent",
                        AbortCause::Hook { .. } => "AbortCause::Hook",
                        AbortCause::Disposed => "AbortCause::Disposed",
                        other => panic!("golden coverage does not know {other:?}: add it"),
                    },
                );
            }
            TurnEndReason::Blocked => label(seen, "TurnEndReason::Blocked"),
            TurnEndReason::Error(error) => {
                label(seen, "TurnEndReason::Error");
                opt(seen, "TurnError::status", &error.status);
                opt(seen, "TurnError::retry_after_ms", &error.retry_after_ms);
                opt(seen, "TurnError::request_id", &error.request_id);
            }
            TurnEndReason::MaxTokens => label(seen, "TurnEndReason::MaxTokens"),
            TurnEndReason::Interrupted => label(seen, "TurnEndReason::Interrupted"),
            TurnEndReason::Budget(reached) => {
                label(seen, "TurnEndReason::Budget");
                label(
                    seen,
                    match reached.limit {
                        BudgetLimit::Turns => "BudgetLimit::Turns",
                        BudgetLimit::Requests => "BudgetLimit::Requests",
                        BudgetLimit::OutputTokens => "BudgetLimit::OutputTokens",
                        BudgetLimit::WallClock => "BudgetLimit::WallClock",
                        other => panic!("golden coverage does not know {other:?}: add it"),
                    },
                );
            }
            other => panic!("golden coverage does not know {other:?}: add it"),
        },
        EventBody::UserMessage(message) => cover_message(message, seen),
        EventBody::AssistantChunk(c) => match &c.chunk {
            StreamChunk::BlockStart { block_type, .. } => {
                label(seen, "StreamChunk::BlockStart");
                label(
                    seen,
                    match block_type {
                        BlockType::Text => "BlockType::Text",
                        BlockType::Reasoning => "BlockType::Reasoning",
                        BlockType::ToolCall => "BlockType::ToolCall",
                    },
                );
            }
            StreamChunk::TextDelta { .. } => label(seen, "StreamChunk::TextDelta"),
            StreamChunk::ReasoningDelta { .. } => label(seen, "StreamChunk::ReasoningDelta"),
            StreamChunk::ToolCallDelta(delta) => {
                label(seen, "StreamChunk::ToolCallDelta");
                opt(seen, "ToolCallDelta::name", &delta.name);
            }
            StreamChunk::BlockEnd { block, .. } => {
                label(seen, "StreamChunk::BlockEnd");
                cover_block(block, seen);
            }
            StreamChunk::Usage(usage) => {
                label(seen, "StreamChunk::Usage");
                opt(seen, "Usage::cache_read_tokens", &usage.cache_read_tokens);
            }
            StreamChunk::Finish { reason } => {
                label(seen, "StreamChunk::Finish");
                label(
                    seen,
                    match reason {
                        FinishReason::Stop => "FinishReason::Stop",
                        FinishReason::ToolCalls => "FinishReason::ToolCalls",
                        FinishReason::MaxTokens => "FinishReason::MaxTokens",
                        FinishReason::Error(_) => "FinishReason::Error",
                        FinishReason::Aborted(_) => "FinishReason::Aborted",
                        other => panic!("golden coverage does not know {other:?}: add it"),
                    },
                );
            }
        },
        EventBody::AssistantMessage(m) => {
            cover_message(&m.message, seen);
            opt(seen, "AssistantMessage::usage", &m.usage);
            if let Some(usage) = &m.usage {
                opt(seen, "Usage::cache_read_tokens", &usage.cache_read_tokens);
            }
            flag(seen, "AssistantMessage::interrupted", m.interrupted);
        }
        EventBody::ToolCall(_) => {}
        EventBody::ToolResult(r) => {
            cover_message(&r.message, seen);
            opt(seen, "ToolResult::error", &r.error);
        }
        EventBody::InboxSpliced(splice) => {
            label(
                seen,
                match splice.target {
                    InboxTarget::NextTurn => "InboxTarget::NextTurn",
                    InboxTarget::NextStep => "InboxTarget::NextStep",
                },
            );
            flag(seen, "InboxSpliced::canceled", splice.canceled);
            for message in &splice.inserted {
                cover_message(message, seen);
            }
        }
        EventBody::SessionLineage(_) => {}
        EventBody::SubagentDescriptor(d) => {
            label(
                seen,
                match d.mode {
                    DescriptorMode::OneShot => "DescriptorMode::OneShot",
                    DescriptorMode::Continuable => "DescriptorMode::Continuable",
                },
            );
            opt(seen, "SubagentDescriptor::label", &d.label);
            opt(seen, "SubagentDescriptor::endpoint", &d.endpoint);
            opt(seen, "SubagentDescriptor::model", &d.model);
            opt(seen, "SubagentDescriptor::persona", &d.persona);
            opt(seen, "SubagentDescriptor::tool_filter", &d.tool_filter);
            if let Some(filter) = &d.tool_filter {
                opt(seen, "ToolFilter::allow", &filter.allow);
                opt(seen, "ToolFilter::deny", &filter.deny);
            }
        }
        EventBody::ApprovalPolicy(ApprovalPolicy { source, .. })
        | EventBody::SandboxMode(SandboxMode { source, .. }) => label(
            seen,
            match source {
                PolicySource::Own => "PolicySource::Own",
                PolicySource::Delegation => "PolicySource::Delegation",
            },
        ),
        EventBody::Custom(custom) => flag(seen, "Custom::ignorable", custom.ignorable),
        EventBody::Opaque(_) => {}
        // A body added to the log after this coverage list: it needs golden samples and labels.
        other => panic!(
            "golden coverage does not know {:?} events: add them",
            other.kind()
        ),
    }
}

fn cover_message(message: &Message, seen: &mut BTreeSet<String>) {
    label(
        seen,
        match message.role {
            Role::User => "Role::User",
            Role::Assistant => "Role::Assistant",
        },
    );
    label(
        seen,
        match &message.source {
            MessageSource::User => "MessageSource::User",
            MessageSource::Model { .. } => "MessageSource::Model",
            MessageSource::Tool { .. } => "MessageSource::Tool",
            MessageSource::Coordinator { .. } => "MessageSource::Coordinator",
            MessageSource::SubagentReport { .. } => "MessageSource::SubagentReport",
            MessageSource::SubagentSettled { .. } => "MessageSource::SubagentSettled",
            MessageSource::Plugin { .. } => "MessageSource::Plugin",
        },
    );
    for block in &message.content {
        cover_block(block, seen);
    }
}

fn cover_block(block: &ContentBlock, seen: &mut BTreeSet<String>) {
    match block {
        ContentBlock::Text { .. } => label(seen, "ContentBlock::Text"),
        ContentBlock::Reasoning { .. } => label(seen, "ContentBlock::Reasoning"),
        ContentBlock::Image { .. } => label(seen, "ContentBlock::Image"),
        ContentBlock::ToolCall { .. } => label(seen, "ContentBlock::ToolCall"),
        ContentBlock::ToolResult {
            content, is_error, ..
        } => {
            label(seen, "ContentBlock::ToolResult");
            flag(seen, "ContentBlock::ToolResult::is_error", *is_error);
            for inner in content {
                cover_block(inner, seen);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Vector files.

/// The lines of a vector file that are not comments or blank, split on whitespace, with their
/// 1-based line numbers.
fn data_lines(path: &str) -> Vec<(usize, Vec<String>)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!("cannot read golden vectors {path}: {e} (generate them with LINEAGE_BLESS=1)")
    });
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(|(i, l)| (i + 1, l.split_whitespace().map(str::to_owned).collect()))
        .collect()
}

/// The [`data_lines`] of `path`, each checked to have the `N` fields that `shape` names.
fn lines_of<const N: usize>(path: &str, shape: &str) -> Vec<(usize, [String; N])> {
    data_lines(path)
        .into_iter()
        .map(|(line, fields)| {
            let fields = <[String; N]>::try_from(fields).unwrap_or_else(|fields| {
                panic!("{path}:{line}: expected `{shape}`, got {fields:?}")
            });
            (line, fields)
        })
        .collect()
}

fn write_file(path: &str, contents: &str) {
    let dir = std::path::Path::new(path)
        .parent()
        .expect("vector files live in a directory");
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    std::fs::write(path, contents).unwrap_or_else(|e| panic!("cannot write {path}: {e}"));
    eprintln!("blessed {path}");
}

/// Where two byte strings first differ, for failure messages.
fn first_difference(a: &[u8], b: &[u8]) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!("first difference at byte {i}"),
        None => format!("lengths differ: {} vs {} bytes", a.len(), b.len()),
    }
}

/// A vector file's path relative to the workspace root, for messages.
fn shown(path: &str) -> &str {
    path.rsplit_once("/../../").map_or(path, |(_, rel)| rel)
}

fn fail_if_any(path: &str, problems: &[String]) {
    assert!(
        problems.is_empty(),
        "golden vectors in {} do not match this build:\n  {}\n{HINT}",
        shown(path),
        problems.join("\n  ")
    );
}

/// The one record in `bytes`, decoded as the event at `seq`.
fn decode_single(seq: u64, bytes: &[u8]) -> Result<Event, LogError> {
    let mut records = Records::new(bytes, seq);
    let (seq, raw) = records.next().ok_or_else(|| LogError::Corrupt {
        seq,
        reason: "no record".into(),
    })??;
    let event = decode_record(seq, &raw)?;
    if !records.remaining().is_empty() {
        return Err(LogError::Corrupt {
            seq,
            reason: format!("{} bytes after the record", records.remaining().len()),
        });
    }
    Ok(event)
}

const RECORDS_PREAMBLE: &str = "\
# Golden record vectors of the Lineage log format (schema/FORMAT.md).
# Generated by crates/lineage-log/tests/golden.rs with LINEAGE_BLESS=1; do not edit by hand.
# Each data line is `name seq hex`: the record (length prefix included) of the event that the test
# builds under `name`, decoded at position `seq`. `format_version` is lineage_log::FORMAT_VERSION.
";

#[test]
fn record_vectors_cover_every_variant() {
    let mut seen = BTreeSet::new();
    for vector in record_vectors() {
        cover_event(&vector.event, &mut seen);
    }
    let missing: Vec<&str> = REQUIRED_COVERAGE
        .iter()
        .copied()
        .filter(|l| !seen.contains(*l))
        .collect();
    assert!(missing.is_empty(), "no golden vector covers {missing:?}");
    let required: BTreeSet<&str> = REQUIRED_COVERAGE.iter().copied().collect();
    let unlisted: Vec<&String> = seen
        .iter()
        .filter(|l| !required.contains(l.as_str()))
        .collect();
    assert!(
        unlisted.is_empty(),
        "labels {unlisted:?} are covered but missing from REQUIRED_COVERAGE"
    );
    for kind in EventKind::KNOWN {
        assert!(
            record_vectors()
                .iter()
                .any(|v| v.event.kind() == kind && v.name.starts_with(kind.name())),
            "no vector named after {kind}"
        );
    }
}

#[test]
fn record_vectors_match() {
    let vectors = record_vectors();
    let mut names = BTreeSet::new();
    for vector in &vectors {
        assert!(
            names.insert(vector.name),
            "duplicate vector name {}",
            vector.name
        );
        // Whatever the files say, a vector must round-trip in this build.
        let bytes = encode_record(&vector.event);
        let back = decode_single(vector.event.seq, &bytes).unwrap_or_else(|e| {
            panic!(
                "vector {}: its own encoding does not decode: {e}",
                vector.name
            )
        });
        assert_eq!(
            back, vector.event,
            "vector {}: does not round-trip",
            vector.name
        );
    }

    if blessing() {
        let mut out = String::from(RECORDS_PREAMBLE);
        writeln!(out, "format_version {FORMAT_VERSION}").expect("String");
        for vector in &vectors {
            let bytes = encode_record(&vector.event);
            writeln!(out, "{} {} {}", vector.name, vector.event.seq, hex(&bytes)).expect("String");
        }
        write_file(RECORDS_FILE, &out);
        return;
    }

    let mut problems = Vec::new();
    let mut stored: BTreeMap<String, (usize, u64, Vec<u8>)> = BTreeMap::new();
    let mut version = None;
    for (line, fields) in data_lines(RECORDS_FILE) {
        match fields.as_slice() {
            [key, value] if key == "format_version" => version = Some(value.clone()),
            [name, seq, bytes] => {
                let seq = seq
                    .parse()
                    .unwrap_or_else(|_| panic!("{RECORDS_FILE}:{line}: bad seq {seq:?}"));
                let bytes = unhex(RECORDS_FILE, line, bytes);
                if stored.insert(name.clone(), (line, seq, bytes)).is_some() {
                    problems.push(format!("vector {name}: listed twice (line {line})"));
                }
            }
            _ => panic!("{RECORDS_FILE}:{line}: expected `name seq hex`, got {fields:?}"),
        }
    }
    if version != Some(FORMAT_VERSION.to_string()) {
        problems.push(format!(
            "format_version: the file says {version:?}, this build writes {FORMAT_VERSION}"
        ));
    }
    for vector in &vectors {
        let name = vector.name;
        let Some((line, seq, bytes)) = stored.remove(name) else {
            problems.push(format!("vector {name}: missing from the file"));
            continue;
        };
        if seq != vector.event.seq {
            problems.push(format!(
                "vector {name} (line {line}): seq {seq} in the file, {} in the test",
                vector.event.seq
            ));
            continue;
        }
        let encoded = encode_record(&vector.event);
        if encoded != bytes {
            problems.push(format!(
                "vector {name} (line {line}): encodes as {} but the file has {} ({})",
                hex(&encoded),
                hex(&bytes),
                first_difference(&encoded, &bytes)
            ));
        }
        match decode_single(seq, &bytes) {
            Ok(event) if event == vector.event => {}
            Ok(event) => problems.push(format!(
                "vector {name} (line {line}): decodes as {event:?}, expected {:?}",
                vector.event
            )),
            Err(e) => problems.push(format!("vector {name} (line {line}): does not decode: {e}")),
        }
    }
    for (name, (line, _, _)) in stored {
        problems.push(format!(
            "vector {name} (line {line}): in the file but not in the test"
        ));
    }
    fail_if_any(RECORDS_FILE, &problems);
}

// ---------------------------------------------------------------------------------------------
// Blocks and the running digest.

/// A small, balanced session: one turn with one step.
fn block_log() -> Vec<Event> {
    let b = BASE_MS;
    vec![
        Event::new(0, b, TurnStart { turn: 1 }),
        Event::new(
            1,
            b + 1,
            user_message(
                40,
                vec![ContentBlock::text("Summarize the README.")],
                MessageSource::User,
            ),
        ),
        Event::new(2, b + 2, StepStart { turn: 1, step: 1 }),
        Event::new(
            3,
            b + 40,
            chunk(StreamChunk::TextDelta {
                index: 0,
                text: t("It describes Lineage."),
            }),
        ),
        Event::new(
            4,
            b + 55,
            AssistantMessage {
                turn: 1,
                step: 1,
                message: Message {
                    id: mid(41),
                    role: Role::Assistant,
                    content: vec![ContentBlock::text("It describes Lineage.")],
                    source: model_source(),
                },
                usage: Some(Usage {
                    input_tokens: 1200,
                    output_tokens: 6,
                    cache_read_tokens: None,
                }),
                interrupted: false,
            },
        ),
        Event::new(5, b + 56, StepEnd { turn: 1, step: 1 }),
        Event::new(6, b + 57, turn_end(TurnEndReason::Completed)),
    ]
}

/// Where the log is cut into blocks: the first seq of each block.
const BLOCK_STARTS: [u64; 2] = [0, 4];

/// A block value: record count (u32 LE), the running digest at its last record, the records.
fn block_value(count: u32, digest: Digest, records: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + 32 + records.len());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&digest.0);
    out.extend_from_slice(records);
    out
}

/// What the block file holds: every record, `S(n)` for every n (and of the empty log), and the
/// block values.
struct BlockVectors {
    records: Vec<Vec<u8>>,
    empty: Digest,
    digests: Vec<Digest>,
    blocks: Vec<(u64, Vec<u8>)>,
}

fn block_vectors() -> BlockVectors {
    let events = block_log();
    let records: Vec<Vec<u8>> = events.iter().map(encode_record).collect();
    let mut all = Vec::new();
    let mut digests = Vec::new();
    for record in &records {
        all.extend_from_slice(record);
        digests.push(Digest(*blake3::hash(&all).as_bytes()));
    }
    let mut blocks = Vec::new();
    for (i, &first) in BLOCK_STARTS.iter().enumerate() {
        let end = BLOCK_STARTS
            .get(i + 1)
            .copied()
            .unwrap_or(events.len() as u64);
        let body: Vec<u8> = records[first as usize..end as usize].concat();
        let value = block_value((end - first) as u32, digests[end as usize - 1], &body);
        blocks.push((first, value));
    }
    BlockVectors {
        records,
        empty: Digest(*blake3::hash(&[]).as_bytes()),
        digests,
        blocks,
    }
}

const BLOCK_PREAMBLE: &str = "\
# Golden block vectors of the Lineage log format (schema/FORMAT.md).
# Generated by crates/lineage-log/tests/golden.rs with LINEAGE_BLESS=1; do not edit by hand.
# One session of seven events stored as two blocks.
#   record <seq> <hex>       the framed record at seq
#   digest empty <hex>       S of the empty log: blake3 of no bytes
#   digest <seq> <hex>       S(seq): blake3 over the records of seqs 0..=seq, back to back
#   block <first_seq> <hex>  a value of the events table under key (session, first_seq):
#                            count (u32 LE), S(last seq), then the records
";

/// Removes `what at` from `map` and records a problem unless it holds `want`.
fn compare_entry(
    problems: &mut Vec<String>,
    map: &mut BTreeMap<String, (usize, Vec<u8>)>,
    what: &str,
    at: String,
    want: &[u8],
) {
    match map.remove(&at) {
        None => problems.push(format!("{what} {at}: missing from the file")),
        Some((line, got)) if got != want => problems.push(format!(
            "{what} {at} (line {line}): this build gives {} but the file has {} ({})",
            hex(want),
            hex(&got),
            first_difference(want, &got)
        )),
        Some(_) => {}
    }
}

#[test]
fn block_and_digest_vectors_match() {
    let expected = block_vectors();
    let events = block_log();

    // The digest is a property of the record sequence, not of its grouping: feeding the records
    // one by one, block by block, all at once, or cut at every possible byte gives the same S.
    let all: Vec<u8> = expected.records.concat();
    let last = *expected.digests.last().expect("the log has events");
    let mut one_by_one = Chain::new();
    for (record, digest) in expected.records.iter().zip(&expected.digests) {
        one_by_one.update(record);
        assert_eq!(one_by_one.digest(), *digest, "S after each record");
    }
    let mut whole = Chain::new();
    whole.update(&all);
    assert_eq!(whole.digest(), last, "S over all records at once");
    for cut in 0..=all.len() {
        let mut split = Chain::new();
        split.update(&all[..cut]);
        split.update(&all[cut..]);
        assert_eq!(split.digest(), last, "S with the bytes cut at {cut}");
    }
    assert_eq!(Chain::new().digest(), expected.empty, "S of the empty log");
    assert_eq!(Digest::of_empty(), expected.empty, "Digest::of_empty");

    if blessing() {
        let mut out = String::from(BLOCK_PREAMBLE);
        for (seq, record) in expected.records.iter().enumerate() {
            writeln!(out, "record {seq} {}", hex(record)).expect("String");
        }
        writeln!(out, "digest empty {}", expected.empty).expect("String");
        for (seq, digest) in expected.digests.iter().enumerate() {
            writeln!(out, "digest {seq} {digest}").expect("String");
        }
        for (first, value) in &expected.blocks {
            writeln!(out, "block {first} {}", hex(value)).expect("String");
        }
        write_file(BLOCK_FILE, &out);
        return;
    }

    let mut problems = Vec::new();
    let mut records = BTreeMap::new();
    let mut digests = BTreeMap::new();
    let mut blocks = BTreeMap::new();
    for (line, [what, at, bytes]) in lines_of(BLOCK_FILE, "what position hex") {
        let bytes = unhex(BLOCK_FILE, line, &bytes);
        let map = match what.as_str() {
            "record" => &mut records,
            "digest" => &mut digests,
            "block" => &mut blocks,
            _ => panic!("{BLOCK_FILE}:{line}: unknown line kind {what:?}"),
        };
        if map.insert(at.clone(), (line, bytes)).is_some() {
            problems.push(format!("{what} {at}: listed twice (line {line})"));
        }
    }

    for (seq, record) in expected.records.iter().enumerate() {
        compare_entry(
            &mut problems,
            &mut records,
            "record",
            seq.to_string(),
            record,
        );
    }
    compare_entry(
        &mut problems,
        &mut digests,
        "digest",
        "empty".into(),
        &expected.empty.0,
    );
    for (seq, digest) in expected.digests.iter().enumerate() {
        compare_entry(
            &mut problems,
            &mut digests,
            "digest",
            seq.to_string(),
            &digest.0,
        );
    }
    // Check the stored blocks on their own terms before comparing them: each one's digest is the
    // running digest over every stored record up to its end, and its records decode to the log.
    let mut chain = Chain::new();
    let mut next_seq = 0u64;
    let mut decoded = Vec::new();
    for (first, _) in &expected.blocks {
        let Some((line, value)) = blocks.get(&first.to_string()) else {
            continue;
        };
        if value.len() < 36 {
            problems.push(format!(
                "block {first} (line {line}): shorter than a block header"
            ));
            continue;
        }
        let count = u32::from_le_bytes(value[..4].try_into().expect("4 bytes"));
        let digest = Digest(value[4..36].try_into().expect("32 bytes"));
        let body = &value[36..];
        if *first != next_seq {
            problems.push(format!(
                "block {first} (line {line}): expected it to start at {next_seq}"
            ));
        }
        chain.update(body);
        if chain.digest() != digest {
            problems.push(format!(
                "block {first} (line {line}): stored digest {digest} but its records give {}",
                chain.digest()
            ));
        }
        if Digest(*blake3::hash(&value[36..]).as_bytes()) == digest && *first != 0 {
            problems.push(format!(
                "block {first} (line {line}): its digest covers only its own records"
            ));
        }
        let before = decoded.len();
        if let Err(e) = lineage_log::decode_records(body, *first, &mut decoded) {
            problems.push(format!("block {first} (line {line}): does not decode: {e}"));
        }
        let held = (decoded.len() - before) as u64;
        if held != u64::from(count) {
            problems.push(format!(
                "block {first} (line {line}): header counts {count} records, it holds {held}"
            ));
        }
        next_seq = *first + held;
    }
    if decoded != events {
        problems.push(format!(
            "the blocks decode to {decoded:?}, expected {events:?}"
        ));
    }
    for (first, value) in &expected.blocks {
        compare_entry(
            &mut problems,
            &mut blocks,
            "block",
            first.to_string(),
            value,
        );
    }
    for (what, map) in [("record", records), ("digest", digests), ("block", blocks)] {
        for (at, (line, _)) in map {
            problems.push(format!(
                "{what} {at} (line {line}): in the file but not in the test"
            ));
        }
    }
    fail_if_any(BLOCK_FILE, &problems);
}

// ---------------------------------------------------------------------------------------------
// Session headers and session records.

/// The layout of a `sessions` row (lineage-store's `SessionRecord`): the header, then the next
/// seq, the head digest and the revision, postcard-encoded in this order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct SessionRow {
    header: Header,
    next_seq: u64,
    head: Digest,
    revision: u64,
}

fn top_level_header() -> Header {
    Header::new(sid(1), BASE_MS as u64)
}

fn child_header() -> Header {
    Header {
        format_version: FORMAT_VERSION,
        id: sid(2),
        created_at_ms: BASE_MS as u64 + 1000,
        cwd: Some(t("/home/dev/project")),
        parent: Some(sid(1)),
        seed_len: 12,
        origin: Some(Origin::Subagent),
        delegation_depth: 1,
        agent_preset: Some(t("reviewer")),
        seed_digest: Some(pattern_digest(0xa0)),
    }
}

enum SessionVector {
    Header(Header),
    Row(SessionRow),
}

impl SessionVector {
    fn encode(&self) -> Vec<u8> {
        match self {
            SessionVector::Header(h) => postcard::to_stdvec(h),
            SessionVector::Row(r) => postcard::to_stdvec(r),
        }
        .expect("postcard serialization into a Vec is infallible")
    }

    fn matches(&self, bytes: &[u8]) -> Result<(), String> {
        fn whole<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, String> {
            match postcard::take_from_bytes(bytes) {
                Ok((value, [])) => Ok(value),
                Ok((_, rest)) => Err(format!("{} trailing bytes", rest.len())),
                Err(e) => Err(format!("does not decode: {e}")),
            }
        }
        let same = match self {
            SessionVector::Header(h) => whole::<Header>(bytes)? == *h,
            SessionVector::Row(r) => whole::<SessionRow>(bytes)? == *r,
        };
        if same {
            Ok(())
        } else {
            Err("decodes to a different value".into())
        }
    }
}

fn session_vectors() -> Vec<(&'static str, SessionVector)> {
    vec![
        (
            "header/top-level",
            SessionVector::Header(top_level_header()),
        ),
        ("header/child", SessionVector::Header(child_header())),
        (
            "session/top-level",
            SessionVector::Row(SessionRow {
                header: top_level_header(),
                next_seq: 7,
                head: pattern_digest(0x40),
                revision: 1,
            }),
        ),
        (
            "session/child",
            SessionVector::Row(SessionRow {
                header: child_header(),
                next_seq: 300,
                head: pattern_digest(0x60),
                revision: 129,
            }),
        ),
    ]
}

const SESSION_PREAMBLE: &str = "\
# Golden session vectors of the Lineage store format (schema/FORMAT.md).
# Generated by crates/lineage-log/tests/golden.rs with LINEAGE_BLESS=1; do not edit by hand.
# Each data line is `name hex`. `header/*` is the postcard encoding of lineage_log::Header;
# `session/*` is a value of the sessions table: the header, next_seq, head digest and revision.
";

#[test]
fn session_vectors_match() {
    let vectors = session_vectors();
    for (name, vector) in &vectors {
        let bytes = vector.encode();
        if let Err(e) = vector.matches(&bytes) {
            panic!("vector {name}: does not round-trip in this build: {e}");
        }
    }
    // A row starts with its header's bytes: the row adds fields after it, never around it.
    let row = SessionRow {
        header: child_header(),
        next_seq: 1,
        head: Digest::of_empty(),
        revision: 1,
    };
    let header_bytes = postcard::to_stdvec(&row.header).expect("infallible");
    assert!(
        postcard::to_stdvec(&row)
            .expect("infallible")
            .starts_with(&header_bytes)
    );

    if blessing() {
        let mut out = String::from(SESSION_PREAMBLE);
        for (name, vector) in &vectors {
            writeln!(out, "{name} {}", hex(&vector.encode())).expect("String");
        }
        write_file(SESSION_FILE, &out);
        return;
    }

    let mut problems = Vec::new();
    let mut stored = BTreeMap::new();
    for (line, [name, bytes]) in lines_of(SESSION_FILE, "name hex") {
        let bytes = unhex(SESSION_FILE, line, &bytes);
        if stored.insert(name.clone(), (line, bytes)).is_some() {
            problems.push(format!("vector {name}: listed twice (line {line})"));
        }
    }
    for (name, vector) in &vectors {
        let Some((line, bytes)) = stored.remove(*name) else {
            problems.push(format!("vector {name}: missing from the file"));
            continue;
        };
        let encoded = vector.encode();
        if encoded != bytes {
            problems.push(format!(
                "vector {name} (line {line}): encodes as {} but the file has {} ({})",
                hex(&encoded),
                hex(&bytes),
                first_difference(&encoded, &bytes)
            ));
        }
        if let Err(e) = vector.matches(&bytes) {
            problems.push(format!("vector {name} (line {line}): {e}"));
        }
    }
    for (name, (line, _)) in stored {
        problems.push(format!(
            "vector {name} (line {line}): in the file but not in the test"
        ));
    }
    fail_if_any(SESSION_FILE, &problems);
}

// ---------------------------------------------------------------------------------------------
// Records every reader must refuse.

/// How a reader must refuse a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    /// A tag it does not know, not marked ignorable.
    UnknownKind,
    /// Flag bits other than bit 0.
    UnknownFlags,
    /// A frame or payload that does not decode.
    Corrupt,
}

impl Refusal {
    fn name(self) -> &'static str {
        match self {
            Refusal::UnknownKind => "unknown-kind",
            Refusal::UnknownFlags => "unknown-flags",
            Refusal::Corrupt => "corrupt",
        }
    }

    fn of(error: &LogError) -> Option<Refusal> {
        match error {
            LogError::UnknownKind { .. } => Some(Refusal::UnknownKind),
            LogError::UnknownFlags { .. } => Some(Refusal::UnknownFlags),
            LogError::Corrupt { .. } => Some(Refusal::Corrupt),
            _ => None,
        }
    }
}

/// A record framed around `body` (tag, flags, time and payload).
fn framed(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    lineage_log::put_varint(&mut out, body.len() as u64);
    out.extend_from_slice(body);
    out
}

/// The body (everything after the length) of a valid vector.
fn body_of(name: &str) -> Vec<u8> {
    let vector = record_vectors()
        .into_iter()
        .find(|v| v.name == name)
        .unwrap_or_else(|| panic!("no record vector {name}"));
    let record = encode_record(&vector.event);
    let (_, rest) = lineage_log::take_varint(&record).expect("a valid length");
    rest.to_vec()
}

fn invalid_vectors() -> Vec<(&'static str, Refusal, Vec<u8>)> {
    use Refusal::*;
    let with_byte = |name: &str, index: usize, byte: u8| {
        let mut body = body_of(name);
        body[index] = byte;
        framed(&body)
    };
    let mut trailing = body_of("turn/start");
    trailing.push(0);
    let mut truncated_payload = body_of("turn/end/completed");
    truncated_payload.pop();
    let mut truncated_frame = encode_record(&Event::new(0, BASE_MS, TurnStart { turn: 1 }));
    truncated_frame.pop();
    // session/lineage with a 15-byte parent id: the body is tag, flags, time (6 bytes), then the
    // id's length prefix.
    let mut short_uuid = body_of("session/lineage/forked");
    let id_at = 2 + 6;
    assert_eq!(short_uuid[id_at], 16, "the id's length prefix");
    short_uuid[id_at] = 15;
    short_uuid.remove(id_at + 1);
    // tool/call whose name has a byte that is not UTF-8: tag, flags, time (6), turn, step,
    // call id (len + 6), then the name's length and first byte.
    let mut bad_utf8 = body_of("tool/call");
    let name_at = 2 + 6 + 2 + 7;
    assert_eq!(bad_utf8[name_at], 9, "the name's length prefix");
    bad_utf8[name_at + 1] = 0xff;
    // assistant/message/interrupted-empty ends with `usage: None` then `interrupted: true`.
    let bad_bool = {
        let mut body = body_of("assistant/message/interrupted-empty");
        let last = body.len() - 1;
        body[last] = 2;
        framed(&body)
    };
    let bad_option = {
        let mut body = body_of("assistant/message/interrupted-empty");
        let at = body.len() - 2;
        body[at] = 2;
        framed(&body)
    };
    vec![
        (
            "unknown-tag-not-ignorable",
            UnknownKind,
            framed(&[0xa8, 0x46, 0x00, 0x00]),
        ),
        (
            "reserved-flag-bit-1",
            UnknownFlags,
            with_byte("turn/start", 1, 0x02),
        ),
        (
            "reserved-flag-bit-7",
            UnknownFlags,
            with_byte("turn/start", 1, 0x80),
        ),
        (
            "reserved-flag-on-ignorable-unknown-tag",
            UnknownFlags,
            framed(&[0xa8, 0x46, 0x03, 0x00]),
        ),
        ("tag-0-is-reserved", Corrupt, framed(&[0x00, 0x01, 0x00])),
        (
            "ignorable-flag-on-a-known-kind",
            Corrupt,
            with_byte("turn/start", 1, 0x01),
        ),
        (
            "overlong-length",
            Corrupt,
            vec![0x84, 0x00, 0x01, 0x00, 0x00, 0x02],
        ),
        (
            "overlong-tag",
            Corrupt,
            framed(&[0x81, 0x00, 0x00, 0x00, 0x02]),
        ),
        (
            "overlong-time",
            Corrupt,
            framed(&[0x01, 0x00, 0x80, 0x00, 0x02]),
        ),
        (
            "time-over-64-bits",
            Corrupt,
            framed(&[
                0x01, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0x02,
            ]),
        ),
        (
            "tag-over-32-bits",
            Corrupt,
            framed(&[0x80, 0x80, 0x80, 0x80, 0x10, 0x01, 0x00]),
        ),
        ("length-past-the-end", Corrupt, truncated_frame),
        ("no-flags", Corrupt, framed(&[0x01])),
        ("no-time", Corrupt, framed(&[0x01, 0x00])),
        ("trailing-payload-byte", Corrupt, framed(&trailing)),
        ("truncated-payload", Corrupt, framed(&truncated_payload)),
        ("enum-index-out-of-range", Corrupt, {
            let mut body = body_of("turn/end/completed");
            let last = body.len() - 1;
            body[last] = 6;
            framed(&body)
        }),
        ("bool-not-0-or-1", Corrupt, bad_bool),
        ("option-tag-not-0-or-1", Corrupt, bad_option),
        ("uuid-of-15-bytes", Corrupt, framed(&short_uuid)),
        ("string-not-utf8", Corrupt, framed(&bad_utf8)),
    ]
}

const INVALID_PREAMBLE: &str = "\
# Records a Lineage reader must refuse (schema/FORMAT.md).
# Generated by crates/lineage-log/tests/golden.rs with LINEAGE_BLESS=1; do not edit by hand.
# Each data line is `name refusal hex`, decoded at seq 0, where refusal is one of
#   unknown-kind   a tag the reader does not know, not marked ignorable
#   unknown-flags  a flag bit other than bit 0 is set
#   corrupt        the frame or the payload does not decode
";

#[test]
fn invalid_vectors_are_refused() {
    let vectors = invalid_vectors();
    for (name, refusal, bytes) in &vectors {
        match decode_single(0, bytes) {
            Ok(event) => panic!("invalid vector {name}: decodes as {event:?}"),
            Err(e) => assert_eq!(
                Refusal::of(&e),
                Some(*refusal),
                "invalid vector {name}: refused with {e}"
            ),
        }
    }

    if blessing() {
        let mut out = String::from(INVALID_PREAMBLE);
        for (name, refusal, bytes) in &vectors {
            writeln!(out, "{name} {} {}", refusal.name(), hex(bytes)).expect("String");
        }
        write_file(INVALID_FILE, &out);
        return;
    }

    let mut problems = Vec::new();
    let mut stored = BTreeMap::new();
    for (line, [name, refusal, bytes]) in lines_of(INVALID_FILE, "name refusal hex") {
        let bytes = unhex(INVALID_FILE, line, &bytes);
        if stored
            .insert(name.clone(), (line, refusal, bytes))
            .is_some()
        {
            problems.push(format!("vector {name}: listed twice (line {line})"));
        }
    }
    for (name, refusal, bytes) in &vectors {
        let Some((line, stored_refusal, stored_bytes)) = stored.remove(*name) else {
            problems.push(format!("vector {name}: missing from the file"));
            continue;
        };
        if stored_refusal != refusal.name() || stored_bytes != *bytes {
            problems.push(format!(
                "vector {name} (line {line}): this build gives {} {} but the file has {} {}",
                refusal.name(),
                hex(bytes),
                stored_refusal,
                hex(&stored_bytes)
            ));
        }
        match decode_single(0, &stored_bytes) {
            Ok(event) => problems.push(format!(
                "vector {name} (line {line}): decodes as {event:?}, must be refused"
            )),
            Err(e) if Refusal::of(&e).map(Refusal::name) != Some(stored_refusal.as_str()) => {
                problems.push(format!(
                    "vector {name} (line {line}): refused with {e}, expected {stored_refusal}"
                ))
            }
            Err(_) => {}
        }
    }
    for (name, (line, _, _)) in stored {
        problems.push(format!(
            "vector {name} (line {line}): in the file but not in the test"
        ));
    }
    fail_if_any(INVALID_FILE, &problems);
}

// ---------------------------------------------------------------------------------------------
// The specification's tag table agrees with the code.

#[test]
fn format_md_lists_every_tag() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../schema/FORMAT.md");
    let spec = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read schema/FORMAT.md: {e}"));
    for kind in EventKind::KNOWN {
        let tag = kind.tag().expect("known kinds have tags");
        let row = format!("| {tag} | `{}` |", kind.name());
        assert!(
            spec.contains(&row),
            "schema/FORMAT.md has no tag table row {row:?} for {kind}"
        );
    }
    assert!(
        spec.contains(&format!(
            "`lineage_log::FORMAT_VERSION` (currently **{FORMAT_VERSION}**)"
        )),
        "schema/FORMAT.md does not state FORMAT_VERSION {FORMAT_VERSION}"
    );
}
