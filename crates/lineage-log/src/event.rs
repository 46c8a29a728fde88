//! The event vocabulary.
//!
//! Every variant has a fixed wire tag (see [`EventKind`]). Tags are only ever appended: a tag is never
//! reused, renumbered or removed, and a variant's payload never changes shape. A new shape is a new
//! variant with a new tag.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{CallId, Digest, Message, SessionId, Text};

/// One entry of a session log.
///
/// The stored form is the record codec, not serde. The stable JSON form, which `lineage export`
/// writes and `lineage import` reads, is [`crate::event_to_json`] (specified in `schema/JSON.md`);
/// the derived serde form, `{seq, time_ms, body: {type, data}}` with `type` the display name, is
/// what the inspection commands' `--json` prints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Position in the log: the first event has seq 0 and every event's seq is its index.
    pub seq: u64,
    /// Wall-clock time in milliseconds since the Unix epoch (negative values are allowed).
    pub time_ms: i64,
    /// What happened.
    pub body: EventBody,
}

impl Event {
    /// An event at `seq` and `time_ms`.
    pub fn new(seq: u64, time_ms: i64, body: impl Into<EventBody>) -> Self {
        Event {
            seq,
            time_ms,
            body: body.into(),
        }
    }

    /// The variant's kind.
    pub fn kind(&self) -> EventKind {
        self.body.kind()
    }
}

/// A turn's number: the first turn of a log is turn 1 and turns are consecutive.
pub type TurnNo = u32;
/// A step's number within its turn: the first step is 1 and steps are consecutive.
pub type StepNo = u32;

/// The kind of an event, with its wire tag and display name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum EventKind {
    /// `turn/start`
    TurnStart,
    /// `turn/end`
    TurnEnd,
    /// `step/start`
    StepStart,
    /// `step/end`
    StepEnd,
    /// `user/message`
    UserMessage,
    /// `assistant/chunk`
    AssistantChunk,
    /// `assistant/message`
    AssistantMessage,
    /// `tool/call`
    ToolCall,
    /// `tool/result`
    ToolResult,
    /// `inbox/spliced`
    InboxSpliced,
    /// `session/lineage`
    SessionLineage,
    /// `subagent/descriptor`
    SubagentDescriptor,
    /// `approval/policy`
    ApprovalPolicy,
    /// `sandbox/mode`
    SandboxMode,
    /// `custom`
    Custom,
    /// A record with a tag this build does not know, marked ignorable by its writer.
    Opaque,
}

impl EventKind {
    /// Every kind this build can decode, in tag order.
    pub const KNOWN: [EventKind; 15] = [
        EventKind::TurnStart,
        EventKind::TurnEnd,
        EventKind::StepStart,
        EventKind::StepEnd,
        EventKind::UserMessage,
        EventKind::AssistantChunk,
        EventKind::AssistantMessage,
        EventKind::ToolCall,
        EventKind::ToolResult,
        EventKind::InboxSpliced,
        EventKind::SessionLineage,
        EventKind::SubagentDescriptor,
        EventKind::ApprovalPolicy,
        EventKind::SandboxMode,
        EventKind::Custom,
    ];

    /// The wire tag. `None` for [`EventKind::Opaque`], whose tag is the record's own.
    pub const fn tag(self) -> Option<u32> {
        Some(match self {
            EventKind::TurnStart => 1,
            EventKind::TurnEnd => 2,
            EventKind::StepStart => 3,
            EventKind::StepEnd => 4,
            EventKind::UserMessage => 5,
            EventKind::AssistantChunk => 6,
            EventKind::AssistantMessage => 7,
            EventKind::ToolCall => 8,
            EventKind::ToolResult => 9,
            EventKind::InboxSpliced => 10,
            EventKind::SessionLineage => 11,
            EventKind::SubagentDescriptor => 12,
            EventKind::ApprovalPolicy => 13,
            EventKind::SandboxMode => 14,
            EventKind::Custom => 15,
            EventKind::Opaque => return None,
        })
    }

    /// The kind with wire tag `tag`, if this build knows it.
    pub fn from_tag(tag: u32) -> Option<EventKind> {
        let index = usize::try_from(tag.checked_sub(1)?).ok()?;
        EventKind::KNOWN.get(index).copied()
    }

    /// The display name, for example `turn/start`.
    pub const fn name(self) -> &'static str {
        match self {
            EventKind::TurnStart => "turn/start",
            EventKind::TurnEnd => "turn/end",
            EventKind::StepStart => "step/start",
            EventKind::StepEnd => "step/end",
            EventKind::UserMessage => "user/message",
            EventKind::AssistantChunk => "assistant/chunk",
            EventKind::AssistantMessage => "assistant/message",
            EventKind::ToolCall => "tool/call",
            EventKind::ToolResult => "tool/result",
            EventKind::InboxSpliced => "inbox/spliced",
            EventKind::SessionLineage => "session/lineage",
            EventKind::SubagentDescriptor => "subagent/descriptor",
            EventKind::ApprovalPolicy => "approval/policy",
            EventKind::SandboxMode => "sandbox/mode",
            EventKind::Custom => "custom",
            EventKind::Opaque => "opaque",
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What an event says.
///
/// Large, rare payloads are boxed so that an `Event` stays small: a replayed log is mostly stream
/// chunks, and its size in memory is dominated by `size_of::<Event>()`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
#[non_exhaustive]
pub enum EventBody {
    /// A turn opens.
    #[serde(rename = "turn/start")]
    TurnStart(TurnStart),
    /// The open turn closes.
    #[serde(rename = "turn/end")]
    TurnEnd(TurnEnd),
    /// A step (one model call and its tools) opens.
    #[serde(rename = "step/start")]
    StepStart(StepStart),
    /// The open step closes.
    #[serde(rename = "step/end")]
    StepEnd(StepEnd),
    /// A user-role message enters the history.
    #[serde(rename = "user/message")]
    UserMessage(Box<Message>),
    /// One raw chunk of the model's stream.
    #[serde(rename = "assistant/chunk")]
    AssistantChunk(AssistantChunk),
    /// The model's assembled message for a step.
    #[serde(rename = "assistant/message")]
    AssistantMessage(Box<AssistantMessage>),
    /// A tool call starts.
    #[serde(rename = "tool/call")]
    ToolCall(Box<ToolCall>),
    /// A tool call's result.
    #[serde(rename = "tool/result")]
    ToolResult(Box<ToolResult>),
    /// The agent's inbox changed.
    #[serde(rename = "inbox/spliced")]
    InboxSpliced(InboxSpliced),
    /// Where this session's own suffix starts and whose history it inherited.
    #[serde(rename = "session/lineage")]
    SessionLineage(Box<SessionLineage>),
    /// What kind of delegated child this session is.
    #[serde(rename = "subagent/descriptor")]
    SubagentDescriptor(Box<SubagentDescriptor>),
    /// An approval policy override.
    #[serde(rename = "approval/policy")]
    ApprovalPolicy(ApprovalPolicy),
    /// A sandbox mode override.
    #[serde(rename = "sandbox/mode")]
    SandboxMode(SandboxMode),
    /// A host extension's event.
    #[serde(rename = "custom")]
    Custom(Box<Custom>),
    /// A record this build cannot interpret, kept intact because its writer marked it ignorable.
    #[serde(rename = "opaque")]
    Opaque(Opaque),
}

impl EventBody {
    /// The variant's kind.
    pub fn kind(&self) -> EventKind {
        match self {
            EventBody::TurnStart(_) => EventKind::TurnStart,
            EventBody::TurnEnd(_) => EventKind::TurnEnd,
            EventBody::StepStart(_) => EventKind::StepStart,
            EventBody::StepEnd(_) => EventKind::StepEnd,
            EventBody::UserMessage(_) => EventKind::UserMessage,
            EventBody::AssistantChunk(_) => EventKind::AssistantChunk,
            EventBody::AssistantMessage(_) => EventKind::AssistantMessage,
            EventBody::ToolCall(_) => EventKind::ToolCall,
            EventBody::ToolResult(_) => EventKind::ToolResult,
            EventBody::InboxSpliced(_) => EventKind::InboxSpliced,
            EventBody::SessionLineage(_) => EventKind::SessionLineage,
            EventBody::SubagentDescriptor(_) => EventKind::SubagentDescriptor,
            EventBody::ApprovalPolicy(_) => EventKind::ApprovalPolicy,
            EventBody::SandboxMode(_) => EventKind::SandboxMode,
            EventBody::Custom(_) => EventKind::Custom,
            EventBody::Opaque(_) => EventKind::Opaque,
        }
    }

    /// The message this event contributes to the model's history, if any: user messages, tool
    /// results, and assistant messages with content.
    pub fn history_message(&self) -> Option<&Message> {
        match self {
            EventBody::UserMessage(message) => Some(message),
            EventBody::AssistantMessage(m) if !m.message.content.is_empty() => Some(&m.message),
            EventBody::ToolResult(r) => Some(&r.message),
            _ => None,
        }
    }
}

macro_rules! into_body {
    ($($variant:ident($ty:ty)),* $(,)?) => {
        $(impl From<$ty> for EventBody {
            fn from(payload: $ty) -> Self {
                EventBody::$variant(payload)
            }
        })*
    };
}

macro_rules! into_boxed_body {
    ($($variant:ident($ty:ty)),* $(,)?) => {
        $(impl From<$ty> for EventBody {
            fn from(payload: $ty) -> Self {
                EventBody::$variant(Box::new(payload))
            }
        })*
    };
}

into_body!(
    TurnStart(TurnStart),
    TurnEnd(TurnEnd),
    StepStart(StepStart),
    StepEnd(StepEnd),
    AssistantChunk(AssistantChunk),
    InboxSpliced(InboxSpliced),
    ApprovalPolicy(ApprovalPolicy),
    SandboxMode(SandboxMode),
    Opaque(Opaque),
);

into_boxed_body!(
    UserMessage(Message),
    AssistantMessage(AssistantMessage),
    ToolCall(ToolCall),
    ToolResult(ToolResult),
    SessionLineage(SessionLineage),
    SubagentDescriptor(SubagentDescriptor),
    Custom(Custom),
);

/// `turn/start`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnStart {
    /// The turn that opens.
    pub turn: TurnNo,
}

/// `turn/end`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnEnd {
    /// The turn that closes.
    pub turn: TurnNo,
    /// Why it closed.
    pub reason: TurnEndReason,
}

/// Why a turn ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum TurnEndReason {
    /// The model finished.
    Completed,
    /// The turn was cancelled.
    Aborted {
        /// Who cancelled it.
        cause: AbortCause,
    },
    /// A hook or policy blocked the turn.
    Blocked,
    /// The turn failed.
    Error(Box<TurnError>),
    /// The model ran out of output tokens.
    MaxTokens,
    /// The process stopped mid-turn; written only by crash repair.
    Interrupted,
    /// A budget in force reached one of its limits before the next model request.
    Budget(Box<BudgetReached>),
}

/// Which budget a turn reached, and which of its limits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetReached {
    /// The limit reached.
    pub limit: BudgetLimit,
    /// The limit's value: turns, model requests, output tokens or milliseconds.
    pub max: u64,
    /// The session whose budget it is: the agent's own, or the ancestor whose budget binds
    /// its whole delegation tree.
    pub owner: SessionId,
}

/// One limit of a budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum BudgetLimit {
    /// Turns started.
    Turns,
    /// Model requests (steps).
    Requests,
    /// Output tokens the model reported.
    OutputTokens,
    /// Time since the budget was set.
    WallClock,
}

impl BudgetLimit {
    /// The stable code of a turn that reached this limit.
    pub fn code(self) -> &'static str {
        match self {
            BudgetLimit::Turns => "BUDGET_TURNS",
            BudgetLimit::Requests => "BUDGET_REQUESTS",
            BudgetLimit::OutputTokens => "BUDGET_OUTPUT_TOKENS",
            BudgetLimit::WallClock => "BUDGET_WALL_CLOCK",
        }
    }

    /// What the limit counts, for people: `turns`, `model requests`, `output tokens`, `ms`.
    pub fn unit(self) -> &'static str {
        match self {
            BudgetLimit::Turns => "turns",
            BudgetLimit::Requests => "model requests",
            BudgetLimit::OutputTokens => "output tokens",
            BudgetLimit::WallClock => "ms",
        }
    }
}

impl std::fmt::Display for BudgetReached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: the budget of session {} allows {} {}",
            self.limit.code(),
            self.owner,
            self.max,
            self.limit.unit()
        )
    }
}

/// Who cancelled a turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum AbortCause {
    /// The user.
    User,
    /// The delegating parent.
    Parent,
    /// A hook, for the reason it gave.
    Hook {
        /// The hook's reason.
        reason: Text,
    },
    /// The agent was disposed.
    Disposed,
}

/// A turn's failure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnError {
    /// What went wrong, for people.
    pub message: Text,
    /// A stable code, for programs.
    pub code: Text,
    /// The endpoint's status code, if the failure came from one.
    pub status: Option<u32>,
    /// How long the endpoint asked the caller to wait before retrying.
    pub retry_after_ms: Option<u64>,
    /// The endpoint's request id.
    pub request_id: Option<Text>,
}

/// `step/start`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepStart {
    /// The open turn.
    pub turn: TurnNo,
    /// The step that opens.
    pub step: StepNo,
}

/// `step/end`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepEnd {
    /// The open turn.
    pub turn: TurnNo,
    /// The step that closes.
    pub step: StepNo,
}

/// `assistant/chunk`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssistantChunk {
    /// The open turn.
    pub turn: TurnNo,
    /// The open step.
    pub step: StepNo,
    /// The raw chunk.
    pub chunk: StreamChunk,
}

/// One chunk of a model's stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StreamChunk {
    /// A content block opens.
    BlockStart {
        /// The block's index in the message.
        index: u32,
        /// What the block holds.
        block_type: BlockType,
    },
    /// More text for a text block.
    TextDelta {
        /// The block's index.
        index: u32,
        /// The delta.
        text: Text,
    },
    /// More reasoning for a reasoning block.
    ReasoningDelta {
        /// The block's index.
        index: u32,
        /// The delta.
        text: Text,
    },
    /// More arguments for a tool-call block.
    ToolCallDelta(Box<ToolCallDelta>),
    /// A content block closes; the block given here is authoritative.
    BlockEnd {
        /// The block's index.
        index: u32,
        /// The assembled block.
        block: Box<crate::ContentBlock>,
    },
    /// Token usage for the call.
    Usage(Box<Usage>),
    /// The stream ends.
    Finish {
        /// Why.
        reason: FinishReason,
    },
}

/// A delta of a tool call's arguments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallDelta {
    /// The block's index.
    pub index: u32,
    /// The call's id.
    pub id: CallId,
    /// The tool's name, on the first delta.
    pub name: Option<Text>,
    /// More of the raw JSON arguments.
    pub arguments_delta: Text,
}

/// What a content block holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BlockType {
    /// Text.
    Text,
    /// Reasoning.
    Reasoning,
    /// A tool call.
    ToolCall,
}

/// Why a model stream finished.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum FinishReason {
    /// The model stopped by itself.
    Stop,
    /// The model asked for tool calls.
    ToolCalls,
    /// The model ran out of output tokens.
    MaxTokens,
    /// The call failed.
    Error(Box<ModelFailure>),
    /// The call was cancelled.
    Aborted(Box<ModelFailure>),
}

/// A model call's failure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelFailure {
    /// What went wrong.
    pub message: Text,
    /// A stable code.
    pub code: Text,
}

/// Token usage of one model call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens sent.
    pub input_tokens: u64,
    /// Tokens produced.
    pub output_tokens: u64,
    /// Tokens served from the endpoint's prompt cache, when it says.
    pub cache_read_tokens: Option<u64>,
}

/// `assistant/message`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssistantMessage {
    /// The open turn.
    pub turn: TurnNo,
    /// The open step.
    pub step: StepNo,
    /// The message (role assistant, model source). Empty content is allowed and contributes
    /// nothing to the history.
    pub message: Message,
    /// Token usage, when the stream reported it.
    pub usage: Option<Usage>,
    /// Whether this is the prefix of a stream that was cut off.
    pub interrupted: bool,
}

/// `tool/call`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The open turn.
    pub turn: TurnNo,
    /// The open step.
    pub step: StepNo,
    /// The call's id.
    pub call_id: CallId,
    /// The tool's name.
    pub name: Text,
    /// The raw JSON arguments string, exactly as the model wrote it.
    pub arguments: Text,
}

/// `tool/result`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The open turn.
    pub turn: TurnNo,
    /// The open step.
    pub step: StepNo,
    /// The result message: role user, tool source, exactly one tool-result block.
    pub message: Message,
    /// A failure's name and code, when the call failed in a way programs should tell apart.
    pub error: Option<ToolError>,
}

/// A tool failure's name and code.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolError {
    /// The failure's name, for example `ToolOutcomeUnknown`.
    pub name: Text,
    /// A stable code, for example `TOOL_OUTCOME_UNKNOWN`.
    pub code: Text,
}

/// Which inbox list a splice changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum InboxTarget {
    /// Prompts that each start a turn.
    NextTurn,
    /// Input that joins the next step.
    NextStep,
}

/// `inbox/spliced`: one change to one inbox list, like `Vec::splice`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxSpliced {
    /// The list.
    pub target: InboxTarget,
    /// Where the change starts.
    pub start: u32,
    /// How many items were removed from `start`.
    pub removed: u32,
    /// The messages inserted at `start`.
    pub inserted: Vec<Message>,
    /// Whether the removed items were cancelled (rather than claimed by a turn).
    pub canceled: bool,
}

/// `session/lineage`: the first event of a child's own suffix.
///
/// It sits at `seq == seed_len`; the `seed_len` events before it are the parent's, copied verbatim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionLineage {
    /// The parent session.
    pub parent: SessionId,
    /// How many leading events were inherited from the parent.
    pub seed_len: u64,
    /// The parent's running digest at `seed_len - 1` ([`Digest::of_empty`] for an empty seed).
    pub seed_digest: Digest,
    /// The child's delegation depth (a top-level session has depth 0).
    pub delegation_depth: u32,
}

/// Whether a delegated child answers once or keeps its conversation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DescriptorMode {
    /// Runs once and returns a result.
    OneShot,
    /// Keeps its conversation; can be messaged, interrupted and resumed.
    Continuable,
}

/// Which tools a child may use.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolFilter {
    /// Only these tools, when present.
    pub allow: Option<Vec<Text>>,
    /// Never these tools.
    pub deny: Option<Vec<Text>>,
}

/// `subagent/descriptor`: what a delegated child is, so it can be resumed without its provider.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubagentDescriptor {
    /// The descriptor's semantic version, as the delegation layer defines it (what its fields
    /// mean, not how they are encoded: the encoding of a variant never changes).
    pub version: u32,
    /// One-shot or continuable.
    pub mode: DescriptorMode,
    /// The delegation provider that created the child.
    pub provider: Text,
    /// A label for people.
    pub label: Option<Text>,
    /// The child's model endpoint.
    pub endpoint: Option<Text>,
    /// The child's model.
    pub model: Option<Text>,
    /// A persona that replaces the host's for this child.
    pub persona: Option<Text>,
    /// The child's tool filter.
    pub tool_filter: Option<ToolFilter>,
}

impl SubagentDescriptor {
    /// The descriptor version the delegation layer writes today.
    pub const VERSION: u32 = 2;

    /// A descriptor of the current version for `mode` and `provider`, every optional field empty.
    pub fn new(mode: DescriptorMode, provider: impl Into<Text>) -> Self {
        SubagentDescriptor {
            version: Self::VERSION,
            mode,
            provider: provider.into(),
            label: None,
            endpoint: None,
            model: None,
            persona: None,
            tool_filter: None,
        }
    }
}

/// Whether a policy event was the session's own choice or fixed by its delegating parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PolicySource {
    /// The session chose it.
    Own,
    /// The delegating parent fixed it when the child was created.
    Delegation,
}

/// `approval/policy`. The last one in a session's own suffix is in force.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalPolicy {
    /// The policy, for example `never`.
    pub policy: Text,
    /// Who set it.
    pub source: PolicySource,
}

impl ApprovalPolicy {
    /// The policy a delegating parent pins on its children: approvals are never asked for.
    pub const NEVER: &'static str = "never";
}

/// `sandbox/mode`. The last one in a session's own suffix is in force.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxMode {
    /// The mode, for example `read-only`.
    pub mode: Text,
    /// Who set it.
    pub source: PolicySource,
}

/// `custom`: a host extension's event, opaque to Lineage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Custom {
    /// The extension's event type, for example `todo/write`.
    pub type_name: Text,
    /// The payload: a JSON document, kept as text.
    pub payload: Text,
    /// Whether readers that do not know `type_name` may skip it. Stored in the record's flags.
    pub ignorable: bool,
}

/// The payload part of [`Custom`] on the wire (the ignorable flag lives in the record's flags).
#[derive(Serialize, Deserialize)]
pub(crate) struct CustomWire {
    pub type_name: Text,
    pub payload: Text,
}

/// [`CustomWire`], borrowed, for encoding without copying.
#[derive(Serialize)]
pub(crate) struct CustomWireRef<'a> {
    pub type_name: &'a str,
    pub payload: &'a str,
}

/// A record with a tag this build does not know, which its writer marked ignorable. It is kept
/// byte for byte, so re-encoding it reproduces the record exactly.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Opaque {
    /// The record's tag.
    pub tag: u32,
    /// The record's payload, undecoded.
    pub payload: Box<[u8]>,
}
