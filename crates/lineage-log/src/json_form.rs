//! The stable JSON form of a session: what `lineage export` writes and `lineage import` reads.
//!
//! The form is specified in `schema/JSON.md`. It is a mapping layer of its own: the log types'
//! serde derives are what postcard writes on disk, so they keep their shape for the binary format,
//! and this module writes and reads JSON through private mirror types instead. Changing one never
//! changes the other.
//!
//! A session is JSON Lines:
//!
//! - line 1, the session line: `{"type": "lineage/session", "json_form": 1, …header facts…,
//!   "events": N, "digest": "<hex S(N-1)>"}`;
//! - then one line per event, in seq order: `{"seq", "time_ms", "type", "data", "digest"}`, where
//!   `type` is the event's display name, `data` its payload and `digest` the running digest
//!   `S(seq)` in lowercase hex.
//!
//! Ids are UUID strings, digests and opaque payloads lowercase hex, content blocks and stream
//! chunks objects tagged by `"type"`, sources and reasons objects tagged by `"kind"`.
//! [`SessionReader`] reads a session back line by line, checking that seqs are contiguous from 0,
//! that every event keeps the log's rules where it stands, and that the digests the file states
//! are those of the events it holds.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    AbortCause, ApprovalPolicy, AssistantChunk, AssistantMessage, BlockType, BudgetLimit,
    BudgetReached, CallId, Chain, ContentBlock, Custom, DescriptorMode, Digest, Encoder, Event,
    EventBody, FinishReason, Header, InboxSpliced, InboxTarget, Message, MessageId, MessageSource,
    ModelFailure, Opaque, Origin, PolicySource, Role, SandboxMode, SessionId, SessionLineage,
    StepEnd, StepStart, StreamChunk, Structure, SubagentDescriptor, Text, ToolCall, ToolCallDelta,
    ToolError, ToolFilter, ToolResult, TurnEnd, TurnEndReason, TurnError, TurnStart, Usage,
};

/// The version of the JSON form this build writes and reads, stated on every session line.
pub const JSON_FORM_VERSION: u32 = 1;

/// The `type` of a session line.
pub const SESSION_LINE_TYPE: &str = "lineage/session";

/// Why a JSON session was refused: the line (counting from 1), the seq when the line is an
/// event's, and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}{}: {reason}", seq.map(|s| format!(" (seq {s})")).unwrap_or_default())]
pub struct JsonFormError {
    /// The offending line, counting from 1 (the session line is line 1).
    pub line: u64,
    /// The seq of the event on that line, when known.
    pub seq: Option<u64>,
    /// What is wrong.
    pub reason: String,
}

// -------------------------------------------------------------------------------------------
// Hex.

/// `bytes` as lowercase hex.
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// The bytes of lowercase hex text, or why it is not (uppercase digits are refused, so a value
/// has exactly one spelling).
pub fn from_hex(text: &str) -> Result<Vec<u8>, String> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return Err(format!("hex text of odd length {}", bytes.len()));
    }
    bytes
        .chunks_exact(2)
        .enumerate()
        .map(|(i, pair)| match (nibble(pair[0]), nibble(pair[1])) {
            (Some(hi), Some(lo)) => Ok(hi << 4 | lo),
            _ => Err(format!(
                "not lowercase hex at character {}: {:?}",
                i * 2,
                String::from_utf8_lossy(pair)
            )),
        })
        .collect()
}

/// A digest from its lowercase hex form (64 digits).
pub fn digest_from_hex(text: &str) -> Result<Digest, String> {
    let bytes = from_hex(text)?;
    let array: [u8; 32] = bytes
        .try_into()
        .map_err(|b: Vec<u8>| format!("a digest is 32 bytes (64 hex digits), got {}", b.len()))?;
    Ok(Digest(array))
}

/// A digest written as lowercase hex.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Hex32(Digest);

impl Serialize for Hex32 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&to_hex(&self.0.0))
    }
}

impl<'de> Deserialize<'de> for Hex32 {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        digest_from_hex(&text)
            .map(Hex32)
            .map_err(serde::de::Error::custom)
    }
}

/// Bytes written as lowercase hex.
#[derive(Clone, Debug, PartialEq, Eq)]
struct HexBytes(Box<[u8]>);

impl Serialize for HexBytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&to_hex(&self.0))
    }
}

impl<'de> Deserialize<'de> for HexBytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        from_hex(&text)
            .map(|b| HexBytes(b.into()))
            .map_err(serde::de::Error::custom)
    }
}

// -------------------------------------------------------------------------------------------
// The mirror types. Field names are snake_case, tag values kebab-case; optional fields are
// written as `null` and may be left out when read; unknown fields are refused.

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum JRole {
    User,
    Assistant,
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case", deny_unknown_fields)]
enum JBlock {
    Text {
        text: Text,
    },
    Reasoning {
        text: Text,
    },
    Image {
        media_type: Text,
        attachment: Text,
    },
    ToolCall {
        id: CallId,
        name: Text,
        arguments: Text,
    },
    ToolResult {
        tool_call_id: CallId,
        content: Vec<JBlock>,
        is_error: bool,
    },
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
enum JSource {
    User,
    Model { endpoint: Text, model: Text },
    Tool { call_id: CallId },
    Coordinator { sender: SessionId },
    SubagentReport { sender: SessionId },
    SubagentSettled { sender: SessionId, summary: Text },
    Plugin { name: Text },
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JMessage {
    id: MessageId,
    role: JRole,
    content: Vec<JBlock>,
    source: JSource,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JTurnStart {
    turn: u32,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JTurnEnd {
    turn: u32,
    reason: JReason,
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
enum JReason {
    Completed,
    Aborted {
        cause: JCause,
    },
    Blocked,
    Error {
        message: Text,
        code: Text,
        status: Option<u32>,
        retry_after_ms: Option<u64>,
        request_id: Option<Text>,
    },
    MaxTokens,
    Interrupted,
    Budget {
        limit: JLimit,
        max: u64,
        owner: SessionId,
    },
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
enum JCause {
    User,
    Parent,
    Hook { reason: Text },
    Disposed,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum JLimit {
    Turns,
    Requests,
    OutputTokens,
    WallClock,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JStep {
    turn: u32,
    step: u32,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JUsage {
    input_tokens: u64,
    output_tokens: u64,
    cache_read_tokens: Option<u64>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum JBlockType {
    Text,
    Reasoning,
    ToolCall,
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
enum JFinish {
    Stop,
    ToolCalls,
    MaxTokens,
    Error { message: Text, code: Text },
    Aborted { message: Text, code: Text },
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case", deny_unknown_fields)]
enum JChunk {
    BlockStart {
        index: u32,
        block_type: JBlockType,
    },
    TextDelta {
        index: u32,
        text: Text,
    },
    ReasoningDelta {
        index: u32,
        text: Text,
    },
    ToolCallDelta {
        index: u32,
        id: CallId,
        name: Option<Text>,
        arguments_delta: Text,
    },
    BlockEnd {
        index: u32,
        block: JBlock,
    },
    Usage {
        input_tokens: u64,
        output_tokens: u64,
        cache_read_tokens: Option<u64>,
    },
    Finish {
        reason: JFinish,
    },
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JAssistantChunk {
    turn: u32,
    step: u32,
    chunk: JChunk,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JAssistantMessage {
    turn: u32,
    step: u32,
    message: JMessage,
    usage: Option<JUsage>,
    interrupted: bool,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JToolCall {
    turn: u32,
    step: u32,
    call_id: CallId,
    name: Text,
    arguments: Text,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JToolError {
    name: Text,
    code: Text,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JToolResult {
    turn: u32,
    step: u32,
    message: JMessage,
    error: Option<JToolError>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum JTarget {
    NextTurn,
    NextStep,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JInboxSpliced {
    target: JTarget,
    start: u32,
    removed: u32,
    inserted: Vec<JMessage>,
    canceled: bool,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JSessionLineage {
    parent: SessionId,
    seed_len: u64,
    seed_digest: Hex32,
    delegation_depth: u32,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum JMode {
    OneShot,
    Continuable,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JToolFilter {
    allow: Option<Vec<Text>>,
    deny: Option<Vec<Text>>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JDescriptor {
    version: u32,
    mode: JMode,
    provider: Text,
    label: Option<Text>,
    endpoint: Option<Text>,
    model: Option<Text>,
    persona: Option<Text>,
    tool_filter: Option<JToolFilter>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum JPolicySource {
    Own,
    Delegation,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JApprovalPolicy {
    policy: Text,
    source: JPolicySource,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JSandboxMode {
    mode: Text,
    source: JPolicySource,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JCustom {
    type_name: Text,
    payload: Text,
    ignorable: bool,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JOpaque {
    tag: u32,
    payload: HexBytes,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum JOrigin {
    Subagent,
}

/// The session line, as written and read.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JSessionLine {
    #[serde(rename = "type")]
    line_type: String,
    json_form: u32,
    format_version: u32,
    id: SessionId,
    created_at_ms: u64,
    cwd: Option<Text>,
    parent: Option<SessionId>,
    seed_len: u64,
    origin: Option<JOrigin>,
    delegation_depth: u32,
    agent_preset: Option<Text>,
    seed_digest: Option<Hex32>,
    events: u64,
    digest: Hex32,
}

/// An event line, as read: the data is mapped once its type is known.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JEventLineIn {
    seq: u64,
    time_ms: i64,
    #[serde(rename = "type")]
    kind: String,
    data: Value,
    digest: Option<Hex32>,
}

// -------------------------------------------------------------------------------------------
// From the log types.

fn j_block(block: &ContentBlock) -> JBlock {
    match block {
        ContentBlock::Text { text } => JBlock::Text { text: text.clone() },
        ContentBlock::Reasoning { text } => JBlock::Reasoning { text: text.clone() },
        ContentBlock::Image {
            media_type,
            attachment,
        } => JBlock::Image {
            media_type: media_type.clone(),
            attachment: attachment.clone(),
        },
        ContentBlock::ToolCall {
            id,
            name,
            arguments,
        } => JBlock::ToolCall {
            id: id.clone(),
            name: name.clone(),
            arguments: arguments.clone(),
        },
        ContentBlock::ToolResult {
            tool_call_id,
            content,
            is_error,
        } => JBlock::ToolResult {
            tool_call_id: tool_call_id.clone(),
            content: content.iter().map(j_block).collect(),
            is_error: *is_error,
        },
    }
}

fn j_source(source: &MessageSource) -> JSource {
    match source {
        MessageSource::User => JSource::User,
        MessageSource::Model { endpoint, model } => JSource::Model {
            endpoint: endpoint.clone(),
            model: model.clone(),
        },
        MessageSource::Tool { call_id } => JSource::Tool {
            call_id: call_id.clone(),
        },
        MessageSource::Coordinator { sender } => JSource::Coordinator { sender: *sender },
        MessageSource::SubagentReport { sender } => JSource::SubagentReport { sender: *sender },
        MessageSource::SubagentSettled { sender, summary } => JSource::SubagentSettled {
            sender: *sender,
            summary: summary.clone(),
        },
        MessageSource::Plugin { name } => JSource::Plugin { name: name.clone() },
    }
}

fn j_message(message: &Message) -> JMessage {
    JMessage {
        id: message.id,
        role: match message.role {
            Role::User => JRole::User,
            Role::Assistant => JRole::Assistant,
        },
        content: message.content.iter().map(j_block).collect(),
        source: j_source(&message.source),
    }
}

fn j_reason(reason: &TurnEndReason) -> JReason {
    match reason {
        TurnEndReason::Completed => JReason::Completed,
        TurnEndReason::Aborted { cause } => JReason::Aborted {
            cause: match cause {
                AbortCause::User => JCause::User,
                AbortCause::Parent => JCause::Parent,
                AbortCause::Hook { reason } => JCause::Hook {
                    reason: reason.clone(),
                },
                AbortCause::Disposed => JCause::Disposed,
            },
        },
        TurnEndReason::Blocked => JReason::Blocked,
        TurnEndReason::Error(e) => JReason::Error {
            message: e.message.clone(),
            code: e.code.clone(),
            status: e.status,
            retry_after_ms: e.retry_after_ms,
            request_id: e.request_id.clone(),
        },
        TurnEndReason::MaxTokens => JReason::MaxTokens,
        TurnEndReason::Interrupted => JReason::Interrupted,
        TurnEndReason::Budget(b) => JReason::Budget {
            limit: match b.limit {
                BudgetLimit::Turns => JLimit::Turns,
                BudgetLimit::Requests => JLimit::Requests,
                BudgetLimit::OutputTokens => JLimit::OutputTokens,
                BudgetLimit::WallClock => JLimit::WallClock,
            },
            max: b.max,
            owner: b.owner,
        },
    }
}

fn j_usage(u: &Usage) -> JUsage {
    JUsage {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        cache_read_tokens: u.cache_read_tokens,
    }
}

fn j_chunk(chunk: &StreamChunk) -> JChunk {
    let failure = |f: &ModelFailure| (f.message.clone(), f.code.clone());
    match chunk {
        StreamChunk::BlockStart { index, block_type } => JChunk::BlockStart {
            index: *index,
            block_type: match block_type {
                BlockType::Text => JBlockType::Text,
                BlockType::Reasoning => JBlockType::Reasoning,
                BlockType::ToolCall => JBlockType::ToolCall,
            },
        },
        StreamChunk::TextDelta { index, text } => JChunk::TextDelta {
            index: *index,
            text: text.clone(),
        },
        StreamChunk::ReasoningDelta { index, text } => JChunk::ReasoningDelta {
            index: *index,
            text: text.clone(),
        },
        StreamChunk::ToolCallDelta(d) => JChunk::ToolCallDelta {
            index: d.index,
            id: d.id.clone(),
            name: d.name.clone(),
            arguments_delta: d.arguments_delta.clone(),
        },
        StreamChunk::BlockEnd { index, block } => JChunk::BlockEnd {
            index: *index,
            block: j_block(block),
        },
        StreamChunk::Usage(u) => JChunk::Usage {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cache_read_tokens: u.cache_read_tokens,
        },
        StreamChunk::Finish { reason } => JChunk::Finish {
            reason: match reason {
                FinishReason::Stop => JFinish::Stop,
                FinishReason::ToolCalls => JFinish::ToolCalls,
                FinishReason::MaxTokens => JFinish::MaxTokens,
                FinishReason::Error(f) => {
                    let (message, code) = failure(f);
                    JFinish::Error { message, code }
                }
                FinishReason::Aborted(f) => {
                    let (message, code) = failure(f);
                    JFinish::Aborted { message, code }
                }
            },
        },
    }
}

fn j_policy_source(source: PolicySource) -> JPolicySource {
    match source {
        PolicySource::Own => JPolicySource::Own,
        PolicySource::Delegation => JPolicySource::Delegation,
    }
}

/// The `data` of an event, as written: one of the mirror types, serialized as itself.
#[derive(Serialize)]
#[serde(untagged)]
enum JData {
    TurnStart(JTurnStart),
    TurnEnd(JTurnEnd),
    Step(JStep),
    Message(JMessage),
    AssistantChunk(JAssistantChunk),
    AssistantMessage(JAssistantMessage),
    ToolCall(JToolCall),
    ToolResult(JToolResult),
    InboxSpliced(JInboxSpliced),
    SessionLineage(JSessionLineage),
    Descriptor(JDescriptor),
    ApprovalPolicy(JApprovalPolicy),
    SandboxMode(JSandboxMode),
    Custom(JCustom),
    Opaque(JOpaque),
}

/// An event line, as written: its members in the documented order.
#[derive(Serialize)]
struct JEventLineOut {
    seq: u64,
    time_ms: i64,
    #[serde(rename = "type")]
    kind: &'static str,
    data: JData,
    #[serde(skip_serializing_if = "Option::is_none")]
    digest: Option<Hex32>,
}

/// The `data` of `body` in the JSON form.
fn data_of(body: &EventBody) -> JData {
    match body {
        EventBody::TurnStart(p) => JData::TurnStart(JTurnStart { turn: p.turn }),
        EventBody::TurnEnd(p) => JData::TurnEnd(JTurnEnd {
            turn: p.turn,
            reason: j_reason(&p.reason),
        }),
        EventBody::StepStart(p) => JData::Step(JStep {
            turn: p.turn,
            step: p.step,
        }),
        EventBody::StepEnd(p) => JData::Step(JStep {
            turn: p.turn,
            step: p.step,
        }),
        EventBody::UserMessage(m) => JData::Message(j_message(m)),
        EventBody::AssistantChunk(p) => JData::AssistantChunk(JAssistantChunk {
            turn: p.turn,
            step: p.step,
            chunk: j_chunk(&p.chunk),
        }),
        EventBody::AssistantMessage(p) => JData::AssistantMessage(JAssistantMessage {
            turn: p.turn,
            step: p.step,
            message: j_message(&p.message),
            usage: p.usage.as_ref().map(j_usage),
            interrupted: p.interrupted,
        }),
        EventBody::ToolCall(p) => JData::ToolCall(JToolCall {
            turn: p.turn,
            step: p.step,
            call_id: p.call_id.clone(),
            name: p.name.clone(),
            arguments: p.arguments.clone(),
        }),
        EventBody::ToolResult(p) => JData::ToolResult(JToolResult {
            turn: p.turn,
            step: p.step,
            message: j_message(&p.message),
            error: p.error.as_ref().map(|e| JToolError {
                name: e.name.clone(),
                code: e.code.clone(),
            }),
        }),
        EventBody::InboxSpliced(p) => JData::InboxSpliced(JInboxSpliced {
            target: match p.target {
                InboxTarget::NextTurn => JTarget::NextTurn,
                InboxTarget::NextStep => JTarget::NextStep,
            },
            start: p.start,
            removed: p.removed,
            inserted: p.inserted.iter().map(j_message).collect(),
            canceled: p.canceled,
        }),
        EventBody::SessionLineage(p) => JData::SessionLineage(JSessionLineage {
            parent: p.parent,
            seed_len: p.seed_len,
            seed_digest: Hex32(p.seed_digest),
            delegation_depth: p.delegation_depth,
        }),
        EventBody::SubagentDescriptor(p) => JData::Descriptor(JDescriptor {
            version: p.version,
            mode: match p.mode {
                DescriptorMode::OneShot => JMode::OneShot,
                DescriptorMode::Continuable => JMode::Continuable,
            },
            provider: p.provider.clone(),
            label: p.label.clone(),
            endpoint: p.endpoint.clone(),
            model: p.model.clone(),
            persona: p.persona.clone(),
            tool_filter: p.tool_filter.as_ref().map(|f| JToolFilter {
                allow: f.allow.clone(),
                deny: f.deny.clone(),
            }),
        }),
        EventBody::ApprovalPolicy(p) => JData::ApprovalPolicy(JApprovalPolicy {
            policy: p.policy.clone(),
            source: j_policy_source(p.source),
        }),
        EventBody::SandboxMode(p) => JData::SandboxMode(JSandboxMode {
            mode: p.mode.clone(),
            source: j_policy_source(p.source),
        }),
        EventBody::Custom(p) => JData::Custom(JCustom {
            type_name: p.type_name.clone(),
            payload: p.payload.clone(),
            ignorable: p.ignorable,
        }),
        EventBody::Opaque(p) => JData::Opaque(JOpaque {
            tag: p.tag,
            payload: HexBytes(p.payload.clone()),
        }),
    }
}

fn line_out(event: &Event, digest: Option<&Digest>) -> JEventLineOut {
    JEventLineOut {
        seq: event.seq,
        time_ms: event.time_ms,
        kind: event.kind().name(),
        data: data_of(&event.body),
        digest: digest.copied().map(Hex32),
    }
}

/// `event` in the JSON form, as a value: `{"seq", "time_ms", "type", "data"}` (no digest).
pub fn event_to_json(event: &Event) -> Value {
    // The mirror types hold strings, numbers, booleans, sequences and string-keyed maps only, so
    // serializing them cannot fail; `null` would stand for a failure that cannot happen.
    serde_json::to_value(line_out(event, None)).unwrap_or(Value::Null)
}

/// The event line of `event`, whose running digest is `digest` (`S(event.seq)`), without a
/// newline: `{"seq", "time_ms", "type", "data", "digest"}`, in that order.
pub fn event_line(event: &Event, digest: &Digest) -> String {
    // Plain data, as above: serializing it to a string cannot fail.
    serde_json::to_string(&line_out(event, Some(digest))).unwrap_or_default()
}

/// The session line of a session with `header`, `events` events and running digest `digest` at
/// its last event, without a newline.
pub fn session_line(header: &Header, events: u64, digest: &Digest) -> String {
    let line = JSessionLine {
        line_type: SESSION_LINE_TYPE.to_owned(),
        json_form: JSON_FORM_VERSION,
        format_version: header.format_version,
        id: header.id,
        created_at_ms: header.created_at_ms,
        cwd: header.cwd.clone(),
        parent: header.parent,
        seed_len: header.seed_len,
        origin: header.origin.map(|Origin::Subagent| JOrigin::Subagent),
        delegation_depth: header.delegation_depth,
        agent_preset: header.agent_preset.clone(),
        seed_digest: header.seed_digest.map(Hex32),
        events,
        digest: Hex32(*digest),
    };
    // Plain data: serializing it to a string cannot fail.
    serde_json::to_string(&line).unwrap_or_default()
}

// -------------------------------------------------------------------------------------------
// To the log types.

fn block_of(block: JBlock) -> ContentBlock {
    match block {
        JBlock::Text { text } => ContentBlock::Text { text },
        JBlock::Reasoning { text } => ContentBlock::Reasoning { text },
        JBlock::Image {
            media_type,
            attachment,
        } => ContentBlock::Image {
            media_type,
            attachment,
        },
        JBlock::ToolCall {
            id,
            name,
            arguments,
        } => ContentBlock::ToolCall {
            id,
            name,
            arguments,
        },
        JBlock::ToolResult {
            tool_call_id,
            content,
            is_error,
        } => ContentBlock::ToolResult {
            tool_call_id,
            content: content.into_iter().map(block_of).collect(),
            is_error,
        },
    }
}

fn source_of(source: JSource) -> MessageSource {
    match source {
        JSource::User => MessageSource::User,
        JSource::Model { endpoint, model } => MessageSource::Model { endpoint, model },
        JSource::Tool { call_id } => MessageSource::Tool { call_id },
        JSource::Coordinator { sender } => MessageSource::Coordinator { sender },
        JSource::SubagentReport { sender } => MessageSource::SubagentReport { sender },
        JSource::SubagentSettled { sender, summary } => {
            MessageSource::SubagentSettled { sender, summary }
        }
        JSource::Plugin { name } => MessageSource::Plugin { name },
    }
}

fn message_of(m: JMessage) -> Message {
    Message {
        id: m.id,
        role: match m.role {
            JRole::User => Role::User,
            JRole::Assistant => Role::Assistant,
        },
        content: m.content.into_iter().map(block_of).collect(),
        source: source_of(m.source),
    }
}

fn usage_of(u: JUsage) -> Usage {
    Usage {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        cache_read_tokens: u.cache_read_tokens,
    }
}

fn reason_of(reason: JReason) -> TurnEndReason {
    match reason {
        JReason::Completed => TurnEndReason::Completed,
        JReason::Aborted { cause } => TurnEndReason::Aborted {
            cause: match cause {
                JCause::User => AbortCause::User,
                JCause::Parent => AbortCause::Parent,
                JCause::Hook { reason } => AbortCause::Hook { reason },
                JCause::Disposed => AbortCause::Disposed,
            },
        },
        JReason::Blocked => TurnEndReason::Blocked,
        JReason::Error {
            message,
            code,
            status,
            retry_after_ms,
            request_id,
        } => TurnEndReason::Error(Box::new(TurnError {
            message,
            code,
            status,
            retry_after_ms,
            request_id,
        })),
        JReason::MaxTokens => TurnEndReason::MaxTokens,
        JReason::Interrupted => TurnEndReason::Interrupted,
        JReason::Budget { limit, max, owner } => TurnEndReason::Budget(Box::new(BudgetReached {
            limit: match limit {
                JLimit::Turns => BudgetLimit::Turns,
                JLimit::Requests => BudgetLimit::Requests,
                JLimit::OutputTokens => BudgetLimit::OutputTokens,
                JLimit::WallClock => BudgetLimit::WallClock,
            },
            max,
            owner,
        })),
    }
}

fn chunk_of(chunk: JChunk) -> StreamChunk {
    match chunk {
        JChunk::BlockStart { index, block_type } => StreamChunk::BlockStart {
            index,
            block_type: match block_type {
                JBlockType::Text => BlockType::Text,
                JBlockType::Reasoning => BlockType::Reasoning,
                JBlockType::ToolCall => BlockType::ToolCall,
            },
        },
        JChunk::TextDelta { index, text } => StreamChunk::TextDelta { index, text },
        JChunk::ReasoningDelta { index, text } => StreamChunk::ReasoningDelta { index, text },
        JChunk::ToolCallDelta {
            index,
            id,
            name,
            arguments_delta,
        } => StreamChunk::ToolCallDelta(Box::new(ToolCallDelta {
            index,
            id,
            name,
            arguments_delta,
        })),
        JChunk::BlockEnd { index, block } => StreamChunk::BlockEnd {
            index,
            block: Box::new(block_of(block)),
        },
        JChunk::Usage {
            input_tokens,
            output_tokens,
            cache_read_tokens,
        } => StreamChunk::Usage(Box::new(Usage {
            input_tokens,
            output_tokens,
            cache_read_tokens,
        })),
        JChunk::Finish { reason } => StreamChunk::Finish {
            reason: match reason {
                JFinish::Stop => FinishReason::Stop,
                JFinish::ToolCalls => FinishReason::ToolCalls,
                JFinish::MaxTokens => FinishReason::MaxTokens,
                JFinish::Error { message, code } => {
                    FinishReason::Error(Box::new(ModelFailure { message, code }))
                }
                JFinish::Aborted { message, code } => {
                    FinishReason::Aborted(Box::new(ModelFailure { message, code }))
                }
            },
        },
    }
}

fn policy_source_of(source: JPolicySource) -> PolicySource {
    match source {
        JPolicySource::Own => PolicySource::Own,
        JPolicySource::Delegation => PolicySource::Delegation,
    }
}

/// The body of type `kind` (a display name) whose JSON `data` is `data`, or why it is not one.
pub fn body_from_json(kind: &str, data: Value) -> Result<EventBody, String> {
    fn parse<T: serde::de::DeserializeOwned>(kind: &str, value: Value) -> Result<T, String> {
        serde_json::from_value(value).map_err(|e| format!("the data of {kind} is not valid: {e}"))
    }
    Ok(match kind {
        "turn/start" => {
            let p: JTurnStart = parse(kind, data)?;
            TurnStart { turn: p.turn }.into()
        }
        "turn/end" => {
            let p: JTurnEnd = parse(kind, data)?;
            TurnEnd {
                turn: p.turn,
                reason: reason_of(p.reason),
            }
            .into()
        }
        "step/start" => {
            let p: JStep = parse(kind, data)?;
            StepStart {
                turn: p.turn,
                step: p.step,
            }
            .into()
        }
        "step/end" => {
            let p: JStep = parse(kind, data)?;
            StepEnd {
                turn: p.turn,
                step: p.step,
            }
            .into()
        }
        "user/message" => {
            let p: JMessage = parse(kind, data)?;
            EventBody::from(message_of(p))
        }
        "assistant/chunk" => {
            let p: JAssistantChunk = parse(kind, data)?;
            AssistantChunk {
                turn: p.turn,
                step: p.step,
                chunk: chunk_of(p.chunk),
            }
            .into()
        }
        "assistant/message" => {
            let p: JAssistantMessage = parse(kind, data)?;
            AssistantMessage {
                turn: p.turn,
                step: p.step,
                message: message_of(p.message),
                usage: p.usage.map(usage_of),
                interrupted: p.interrupted,
            }
            .into()
        }
        "tool/call" => {
            let p: JToolCall = parse(kind, data)?;
            ToolCall {
                turn: p.turn,
                step: p.step,
                call_id: p.call_id,
                name: p.name,
                arguments: p.arguments,
            }
            .into()
        }
        "tool/result" => {
            let p: JToolResult = parse(kind, data)?;
            ToolResult {
                turn: p.turn,
                step: p.step,
                message: message_of(p.message),
                error: p.error.map(|e| ToolError {
                    name: e.name,
                    code: e.code,
                }),
            }
            .into()
        }
        "inbox/spliced" => {
            let p: JInboxSpliced = parse(kind, data)?;
            InboxSpliced {
                target: match p.target {
                    JTarget::NextTurn => InboxTarget::NextTurn,
                    JTarget::NextStep => InboxTarget::NextStep,
                },
                start: p.start,
                removed: p.removed,
                inserted: p.inserted.into_iter().map(message_of).collect(),
                canceled: p.canceled,
            }
            .into()
        }
        "session/lineage" => {
            let p: JSessionLineage = parse(kind, data)?;
            SessionLineage {
                parent: p.parent,
                seed_len: p.seed_len,
                seed_digest: p.seed_digest.0,
                delegation_depth: p.delegation_depth,
            }
            .into()
        }
        "subagent/descriptor" => {
            let p: JDescriptor = parse(kind, data)?;
            SubagentDescriptor {
                version: p.version,
                mode: match p.mode {
                    JMode::OneShot => DescriptorMode::OneShot,
                    JMode::Continuable => DescriptorMode::Continuable,
                },
                provider: p.provider,
                label: p.label,
                endpoint: p.endpoint,
                model: p.model,
                persona: p.persona,
                tool_filter: p.tool_filter.map(|f| ToolFilter {
                    allow: f.allow,
                    deny: f.deny,
                }),
            }
            .into()
        }
        "approval/policy" => {
            let p: JApprovalPolicy = parse(kind, data)?;
            ApprovalPolicy {
                policy: p.policy,
                source: policy_source_of(p.source),
            }
            .into()
        }
        "sandbox/mode" => {
            let p: JSandboxMode = parse(kind, data)?;
            SandboxMode {
                mode: p.mode,
                source: policy_source_of(p.source),
            }
            .into()
        }
        "custom" => {
            let p: JCustom = parse(kind, data)?;
            Custom {
                type_name: p.type_name,
                payload: p.payload,
                ignorable: p.ignorable,
            }
            .into()
        }
        "opaque" => {
            let p: JOpaque = parse(kind, data)?;
            Opaque {
                tag: p.tag,
                payload: p.payload.0,
            }
            .into()
        }
        other => return Err(format!("unknown event type {other:?}")),
    })
}

/// The event a JSON object `{"seq", "time_ms", "type", "data"}` describes (a `digest` member is
/// allowed and ignored), or why it does not describe one. The event's own rules are not checked
/// here: [`SessionReader`] checks them where the event stands.
pub fn event_from_json(value: Value) -> Result<Event, String> {
    let line: JEventLineIn =
        serde_json::from_value(value).map_err(|e| format!("not an event line: {e}"))?;
    let body = body_from_json(&line.kind, line.data)?;
    Ok(Event::new(line.seq, line.time_ms, body))
}

// -------------------------------------------------------------------------------------------
// Reading a session.

/// A session read back from its JSON form and checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsonSession {
    /// The session's header, as its session line states it.
    pub header: Header,
    /// Its events, seq 0 first.
    pub events: Vec<Event>,
    /// The running digest at its last event, which the file states and the events reproduce.
    pub digest: Digest,
}

/// Reads a session's JSON form line by line, checking as it goes.
///
/// The first line must be the session line; every later line one event, its seq the next one
/// (contiguous from 0), valid where it stands (the log's append rules), and its `digest` the
/// running digest of the events up to it once encoded. [`SessionReader::finish`] checks that the
/// file held as many events as the session line says, ending at its digest, and that the header
/// agrees with the log (parent, seed, depth, origin). Every error names the line and, on an event
/// line, the seq.
#[derive(Debug)]
pub struct SessionReader {
    line: u64,
    session: Option<(Header, u64, Digest)>,
    events: Vec<Event>,
    structure: Structure,
    chain: Chain,
    encoder: Encoder,
    scratch: Vec<u8>,
}

impl Default for SessionReader {
    fn default() -> Self {
        Self::new()
    }
}

impl SessionReader {
    /// A reader before the session line.
    pub fn new() -> Self {
        SessionReader {
            line: 0,
            session: None,
            events: Vec::new(),
            structure: Structure::new(),
            chain: Chain::new(),
            encoder: Encoder::new(),
            scratch: Vec::new(),
        }
    }

    /// How many lines have been read.
    pub fn lines(&self) -> u64 {
        self.line
    }

    /// The session's header, once the session line has been read.
    pub fn header(&self) -> Option<&Header> {
        self.session.as_ref().map(|(header, _, _)| header)
    }

    fn error(&self, seq: Option<u64>, reason: impl Into<String>) -> JsonFormError {
        JsonFormError {
            line: self.line,
            seq,
            reason: reason.into(),
        }
    }

    /// Reads the next line (without its newline). A line of only white space is skipped (it is
    /// still counted, so later errors name the right line).
    pub fn read_line(&mut self, text: &str) -> Result<(), JsonFormError> {
        self.line += 1;
        if text.trim().is_empty() {
            return Ok(());
        }
        let value: Value =
            serde_json::from_str(text).map_err(|e| self.error(None, format!("not JSON: {e}")))?;
        if self.session.is_none() {
            let header = self.session_line(value)?;
            self.session = Some(header);
            return Ok(());
        }
        self.event_line(value)
    }

    fn session_line(&self, value: Value) -> Result<(Header, u64, Digest), JsonFormError> {
        let stated = value.get("type").and_then(Value::as_str);
        if stated != Some(SESSION_LINE_TYPE) {
            return Err(self.error(
                None,
                format!(
                    "the first line must be the session line, of type {SESSION_LINE_TYPE:?}; \
                     its type is {}",
                    stated.map_or("missing".to_owned(), |t| format!("{t:?}"))
                ),
            ));
        }
        if let Some(form) = value.get("json_form").and_then(Value::as_u64)
            && form != u64::from(JSON_FORM_VERSION)
        {
            return Err(self.error(
                None,
                format!(
                    "the file is in JSON form {form}; this build reads form {JSON_FORM_VERSION}"
                ),
            ));
        }
        let line: JSessionLine = serde_json::from_value(value)
            .map_err(|e| self.error(None, format!("not a valid session line: {e}")))?;
        let header = Header {
            format_version: line.format_version,
            id: line.id,
            created_at_ms: line.created_at_ms,
            cwd: line.cwd,
            parent: line.parent,
            seed_len: line.seed_len,
            origin: line.origin.map(|JOrigin::Subagent| Origin::Subagent),
            delegation_depth: line.delegation_depth,
            agent_preset: line.agent_preset,
            seed_digest: line.seed_digest.map(|d| d.0),
        };
        header
            .validate()
            .map_err(|e| self.error(None, e.to_string()))?;
        Ok((header, line.events, line.digest.0))
    }

    fn event_line(&mut self, value: Value) -> Result<(), JsonFormError> {
        let seq_hint = value.get("seq").and_then(Value::as_u64);
        let line: JEventLineIn = serde_json::from_value(value)
            .map_err(|e| self.error(seq_hint, format!("not a valid event line: {e}")))?;
        let seq = line.seq;
        let expected = self.events.len() as u64;
        if seq != expected {
            return Err(self.error(
                Some(seq),
                format!("seq {seq} where seq {expected} was expected: seqs are contiguous from 0"),
            ));
        }
        let Some(stated) = line.digest else {
            return Err(self.error(Some(seq), "the event line has no digest"));
        };
        let body = body_from_json(&line.kind, line.data).map_err(|e| self.error(Some(seq), e))?;
        let event = Event::new(seq, line.time_ms, body);
        self.structure
            .admit(&event)
            .map_err(|e| self.error(Some(seq), e.to_string()))?;
        self.scratch.clear();
        self.encoder.encode(&event, &mut self.scratch);
        self.chain.update(&self.scratch);
        let digest = self.chain.digest();
        if digest != stated.0 {
            return Err(self.error(
                Some(seq),
                format!(
                    "the digest differs: the line states {}, the events up to it give {digest} \
                     (the event or an earlier one was changed)",
                    stated.0
                ),
            ));
        }
        self.events.push(event);
        Ok(())
    }

    /// Ends the reading: the session line was read, the file held the number of events it
    /// states, and their digest is the one it states; the header agrees with the log.
    pub fn finish(self) -> Result<JsonSession, JsonFormError> {
        let Some((header, stated_len, stated_digest)) = self.session else {
            return Err(self.error(None, "the file is empty: it has no session line"));
        };
        let len = self.events.len() as u64;
        let error = |reason: String| JsonFormError {
            line: 1,
            seq: None,
            reason,
        };
        if len != stated_len {
            return Err(error(format!(
                "the session line states {stated_len} events, the file holds {len} (it was cut \
                 short or lines were added)"
            )));
        }
        let digest = self.chain.digest();
        if digest != stated_digest {
            return Err(error(format!(
                "the session line states digest {stated_digest}, the events give {digest}"
            )));
        }
        let folded = crate::fold_header(&header, &self.events);
        if folded != header {
            return Err(error(format!(
                "the session's header facts contradict its log: the line says parent {:?}, \
                 seed_len {}, seed_digest {:?}, delegation_depth {}, origin {:?}; the log says \
                 parent {:?}, seed_len {}, seed_digest {:?}, delegation_depth {}, origin {:?}",
                header.parent.map(|p| p.to_string()),
                header.seed_len,
                header.seed_digest.map(|d| d.to_string()),
                header.delegation_depth,
                header.origin,
                folded.parent.map(|p| p.to_string()),
                folded.seed_len,
                folded.seed_digest.map(|d| d.to_string()),
                folded.delegation_depth,
                folded.origin,
            )));
        }
        Ok(JsonSession {
            header,
            events: self.events,
            digest,
        })
    }
}

/// Writes a whole session in the JSON form: the session line, then one line per event, each
/// ending in a newline. `events` must be the session's whole log from seq 0.
pub fn session_to_json_lines(header: &Header, events: &[Event]) -> String {
    let mut encoder = Encoder::new();
    let mut chain = Chain::new();
    let mut records = Vec::new();
    let mut digests = Vec::with_capacity(events.len());
    for event in events {
        records.clear();
        encoder.encode(event, &mut records);
        chain.update(&records);
        digests.push(chain.digest());
    }
    let mut out = session_line(header, events.len() as u64, &chain.digest());
    out.push('\n');
    for (event, digest) in events.iter().zip(&digests) {
        out.push_str(&event_line(event, digest));
        out.push('\n');
    }
    out
}

/// Reads a whole session from its JSON form (see [`SessionReader`]).
pub fn session_from_json_lines(text: &str) -> Result<JsonSession, JsonFormError> {
    let mut reader = SessionReader::new();
    for line in text.lines() {
        reader.read_line(line)?;
    }
    reader.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_uppercase_and_odd_lengths() {
        let bytes = [0u8, 1, 0xab, 0xff];
        assert_eq!(to_hex(&bytes), "0001abff");
        assert_eq!(from_hex("0001abff").unwrap(), bytes);
        assert!(from_hex("0001ABFF").is_err());
        assert!(from_hex("abc").is_err());
        assert!(digest_from_hex("00").is_err());
        let d = Digest::of_empty();
        assert_eq!(digest_from_hex(&d.to_string()).unwrap(), d);
    }

    #[test]
    fn the_error_names_line_and_seq() {
        let e = JsonFormError {
            line: 4,
            seq: Some(2),
            reason: "bad".into(),
        };
        assert_eq!(e.to_string(), "line 4 (seq 2): bad");
        let e = JsonFormError {
            line: 1,
            seq: None,
            reason: "bad".into(),
        };
        assert_eq!(e.to_string(), "line 1: bad");
    }
}
