//! Short constructors for event bodies, so hand-written logs in tests read like transcripts.
//!
//! Every message built here has the shape `check_shape` demands for its event: user role for user
//! messages and tool results, assistant role and a model source for assistant messages, and exactly
//! one tool-result block whose call id matches the tool source.

use lineage_log::{
    ApprovalPolicy, CallId, ContentBlock, Digest, Event, EventBody, ForkSpec, Header, Message,
    MessageId, MessageSource, Origin, PolicySource, Role, SandboxMode, SessionId, SessionLineage,
    StepEnd, StepNo, StepStart, StreamChunk, Text, ToolCall, ToolError, ToolResult, TurnEnd,
    TurnEndReason, TurnNo, TurnStart,
};

/// The time of the first event of [`log`].
pub const START_MS: i64 = 1_000;

/// `bodies` as a log: event `i` has seq `i` and time `START_MS + 10 * i`.
pub fn log(bodies: impl IntoIterator<Item = EventBody>) -> Vec<Event> {
    bodies
        .into_iter()
        .enumerate()
        .map(|(i, body)| Event::new(i as u64, START_MS + 10 * i as i64, body))
        .collect()
}

/// A fork of a child `child` at `boundary`, made at `time_ms`, `delegation_depth` deep, with no
/// agent preset.
pub fn fork_spec(
    child: SessionId,
    boundary: Option<u64>,
    time_ms: u64,
    delegation_depth: u32,
) -> ForkSpec {
    ForkSpec {
        child,
        boundary,
        time_ms,
        delegation_depth,
        agent_preset: None,
    }
}

/// The lineage of a child of `parent` at delegation depth `depth` that inherited nothing (a
/// spawn child's), for tests that store a child's log themselves.
pub fn fresh_lineage(parent: SessionId, depth: u32) -> SessionLineage {
    SessionLineage {
        parent,
        seed_len: 0,
        seed_digest: Digest::of_empty(),
        delegation_depth: depth,
    }
}

/// A spawned child of `parent`, one level down and seeded with nothing: `header` made its
/// child's, and the `session/lineage` event its log starts with.
pub fn spawned_child(header: Header, parent: SessionId) -> (Header, EventBody) {
    let lineage = fresh_lineage(parent, 1);
    let header = Header {
        parent: Some(parent),
        seed_len: lineage.seed_len,
        seed_digest: Some(lineage.seed_digest),
        delegation_depth: lineage.delegation_depth,
        origin: Some(Origin::Subagent),
        ..header
    };
    (header, lineage.into())
}

/// `bodies` as consecutive events from `first_seq`: the event at seq `n` has time
/// `start_ms + ms_per_seq * n`, so seqs are contiguous and times never decrease (for a
/// non-negative `ms_per_seq`), whichever seq the batch starts at.
pub fn numbered(
    first_seq: u64,
    start_ms: i64,
    ms_per_seq: i64,
    bodies: impl IntoIterator<Item = EventBody>,
) -> Vec<Event> {
    bodies
        .into_iter()
        .zip(first_seq..)
        .map(|(body, seq)| Event::new(seq, start_ms + ms_per_seq * seq as i64, body))
        .collect()
}

/// One completed turn `turn` of one step, as six bodies: `turn/start`, `step/start`, the user's
/// `question`, the assistant's text `answer`, `step/end`, `turn/end {Completed}`. Balanced and
/// valid wherever the previous turn was `turn - 1` and closed; the caller picks the message ids
/// (they must be unique in the log) and numbers the events (e.g. with [`numbered`]).
pub fn completed_turn(
    turn: TurnNo,
    question_id: MessageId,
    question: &str,
    answer_id: MessageId,
    answer: &str,
) -> Vec<EventBody> {
    vec![
        turn_start(turn),
        step_start(turn, 1),
        user(question_id, question),
        assistant_text(turn, 1, answer_id, answer),
        step_end(turn, 1),
        turn_completed(turn),
    ]
}

/// The provider every assistant message built here names.
pub const PROVIDER: &str = "example";
/// The model every assistant message built here names.
pub const MODEL: &str = "example-model-1";

/// A deterministic message id: the same `n` always gives the same id, different `n` differ.
pub fn mid(n: u64) -> MessageId {
    MessageId::derived(&[b"lineage-testkit/mid", &n.to_le_bytes()])
}

/// The model source of [`PROVIDER`] and [`MODEL`].
pub fn model_source() -> MessageSource {
    MessageSource::Model {
        endpoint: Text::from(PROVIDER),
        model: Text::from(MODEL),
    }
}

/// `turn/start`.
pub fn turn_start(turn: TurnNo) -> EventBody {
    TurnStart { turn }.into()
}

/// `turn/end` with `reason`.
pub fn turn_end(turn: TurnNo, reason: TurnEndReason) -> EventBody {
    TurnEnd { turn, reason }.into()
}

/// `turn/end` with reason `Completed`.
pub fn turn_completed(turn: TurnNo) -> EventBody {
    turn_end(turn, TurnEndReason::Completed)
}

/// `step/start`.
pub fn step_start(turn: TurnNo, step: StepNo) -> EventBody {
    StepStart { turn, step }.into()
}

/// `step/end`.
pub fn step_end(turn: TurnNo, step: StepNo) -> EventBody {
    StepEnd { turn, step }.into()
}

/// A user-typed text message.
pub fn user_text_message(id: MessageId, text: &str) -> Message {
    Message {
        id,
        role: Role::User,
        content: vec![ContentBlock::text(text)],
        source: MessageSource::User,
    }
}

/// `user/message` with a user-typed text.
pub fn user(id: MessageId, text: &str) -> EventBody {
    EventBody::from(user_text_message(id, text))
}

/// `assistant/chunk` carrying a text delta for block 0.
pub fn text_delta(turn: TurnNo, step: StepNo, text: &str) -> EventBody {
    lineage_log::AssistantChunk {
        turn,
        step,
        chunk: StreamChunk::TextDelta {
            index: 0,
            text: Text::from(text),
        },
    }
    .into()
}

/// An assistant message (model source) with `content`.
pub fn assistant_message(id: MessageId, content: Vec<ContentBlock>) -> Message {
    Message {
        id,
        role: Role::Assistant,
        content,
        source: model_source(),
    }
}

/// `assistant/message` with `content`, no usage, not interrupted.
pub fn assistant(
    turn: TurnNo,
    step: StepNo,
    id: MessageId,
    content: Vec<ContentBlock>,
) -> EventBody {
    lineage_log::AssistantMessage {
        turn,
        step,
        message: assistant_message(id, content),
        usage: None,
        interrupted: false,
    }
    .into()
}

/// `assistant/message` with one text block.
pub fn assistant_text(turn: TurnNo, step: StepNo, id: MessageId, text: &str) -> EventBody {
    assistant(turn, step, id, vec![ContentBlock::text(text)])
}

/// A tool-call content block asking for `name` with raw JSON `arguments`.
pub fn call_block(call_id: &str, name: &str, arguments: &str) -> ContentBlock {
    ContentBlock::ToolCall {
        id: CallId::new(call_id),
        name: Text::from(name),
        arguments: Text::from(arguments),
    }
}

/// `assistant/message` asking for the tool calls `calls` (`(call id, tool name)`, arguments `{}`).
pub fn assistant_calls(
    turn: TurnNo,
    step: StepNo,
    id: MessageId,
    calls: &[(&str, &str)],
) -> EventBody {
    let content = calls
        .iter()
        .map(|(call_id, name)| call_block(call_id, name, "{}"))
        .collect();
    assistant(turn, step, id, content)
}

/// `tool/call`: the durable record that the call `call_id` started.
pub fn tool_call(
    turn: TurnNo,
    step: StepNo,
    call_id: &str,
    name: &str,
    arguments: &str,
) -> EventBody {
    ToolCall {
        turn,
        step,
        call_id: CallId::new(call_id),
        name: Text::from(name),
        arguments: Text::from(arguments),
    }
    .into()
}

/// A tool-result message answering `call_id` with `text`.
pub fn tool_result_message(id: MessageId, call_id: &str, text: &str, is_error: bool) -> Message {
    Message {
        id,
        role: Role::User,
        content: vec![ContentBlock::ToolResult {
            tool_call_id: CallId::new(call_id),
            content: vec![ContentBlock::text(text)],
            is_error,
        }],
        source: MessageSource::Tool {
            call_id: CallId::new(call_id),
        },
    }
}

/// `tool/result`: a successful answer to `call_id`.
pub fn tool_result(
    turn: TurnNo,
    step: StepNo,
    id: MessageId,
    call_id: &str,
    text: &str,
) -> EventBody {
    ToolResult {
        turn,
        step,
        message: tool_result_message(id, call_id, text, false),
        error: None,
    }
    .into()
}

/// `tool/result`: a failed answer to `call_id` carrying the error `name` and `code`.
pub fn tool_error(
    turn: TurnNo,
    step: StepNo,
    id: MessageId,
    call_id: &str,
    name: &str,
    code: &str,
) -> EventBody {
    ToolResult {
        turn,
        step,
        message: tool_result_message(id, call_id, "the tool failed", true),
        error: Some(ToolError {
            name: Text::from(name),
            code: Text::from(code),
        }),
    }
    .into()
}

/// `policy/sandbox`: the sandbox `mode`, set by `source`.
pub fn sandbox(mode: &str, source: PolicySource) -> EventBody {
    SandboxMode {
        mode: mode.into(),
        source,
    }
    .into()
}

/// `policy/approval`: the approval `policy` (e.g. `ApprovalPolicy::NEVER`), set by `source`.
pub fn approval(policy: &str, source: PolicySource) -> EventBody {
    ApprovalPolicy {
        policy: policy.into(),
        source,
    }
    .into()
}
