//! Sessions written by deepseek-harness's default store (JSON Lines), mapped to Lineage events.
//!
//! The mapping is specified in `schema/JSON.md` ("Importing upstream JSON Lines"). In short:
//!
//! - line 1 is the upstream header `{"type": "session", "version": 0, "id", "createdAt", …}`; a
//!   top-level session maps (a child session's inherited prefix cannot be proven to be its
//!   parent's, so `parentSession`, a `seedLength`, `origin` and a `delegationDepth` above 0 are
//!   refused);
//! - the session id is a UUIDv7 derived from `createdAt` and the upstream id, so importing the
//!   same file twice names the same session; message ids are derived from the session and the
//!   upstream message id the same way;
//! - turns, steps, user and assistant messages, tool calls and results, stream deltas (packed
//!   chunk rows included, expanded into their members), approval policies and sandbox modes map
//!   to their Lineage kinds; every other event keeps its upstream type and data as an ignorable
//!   `custom` event, so nothing is lost;
//! - what has no meaning in Lineage is refused, naming the line: surface replacements, image
//!   blocks, content blocks or message sources of other kinds, the `legacy` abort cause, a type
//!   outside upstream's vocabulary that is not marked ignorable;
//! - seqs must be contiguous from 0, and every event must keep Lineage's rules where it stands;
//!   a log that ends inside an open turn is closed as crash repair would close it.

use std::collections::BTreeMap;

use lineage_log::{
    AbortCause, ApprovalPolicy, AssistantChunk, AssistantMessage, CallId, ContentBlock, Custom,
    Event, EventBody, Header, Message, MessageId, MessageSource, PolicySource, Role, SandboxMode,
    SessionId, StepEnd, StepStart, StreamChunk, Structure, Text, ToolCall, ToolCallDelta,
    ToolError, ToolResult, TurnEnd, TurnEndReason, TurnError, TurnStart, Usage,
    interrupted_turn_closers,
};
use serde_json::{Map, Value};

/// The upstream header line's `type`.
pub const HEADER_TYPE: &str = "session";

/// The upstream log format version this importer reads.
const UPSTREAM_VERSION: u64 = 0;

/// Every event type upstream's readers know; others load only when marked ignorable.
const KNOWN_TYPES: &[&str] = &[
    "agent-preset/selected",
    "agent/inbox/spliced",
    "approval/asked",
    "approval/decided",
    "approval/policy",
    "assistant/chunk",
    "assistant/message",
    "command/done",
    "command/run",
    "compaction/end",
    "compaction/prune",
    "compaction/start",
    "compaction/summary",
    "feedback/record",
    "goal/change",
    "hook/invoked",
    "hook/result",
    "llm/retry",
    "llm/retry-started",
    "permission/preset",
    "plan/mode",
    "request/context",
    "request/header",
    "sandbox/mode",
    "schedule/change",
    "session/end-seed",
    "session/title",
    "session/title-llm-request",
    "step/end",
    "step/start",
    "subagent/descriptor",
    "team/member",
    "team/message/delivered",
    "team/message/queued",
    "team/task",
    "todo/write",
    "tool-workflow/agent-end",
    "tool-workflow/agent-start",
    "tool-workflow/run-end",
    "tool-workflow/run-start",
    "tool/call",
    "tool/code-dispatch",
    "tool/code-dispatch-start",
    "tool/result",
    "turn/end",
    "turn/start",
    "user/message",
    "web/deepseek-search-llm-request",
];

/// The `type`s of packed chunk rows.
const PACKED: &[&str] = &["text-chunks", "reasoning-chunks", "tool-call-chunks"];

/// An upstream session mapped to Lineage.
#[derive(Debug)]
pub struct Mapped {
    /// The header of the Lineage session.
    pub header: Header,
    /// Its events, closers included.
    pub events: Vec<Event>,
    /// The upstream session's id.
    pub upstream_id: String,
    /// How many upstream events were kept as `custom` events, by upstream type.
    pub kept_as_custom: BTreeMap<String, u64>,
    /// Upstream fields that have no Lineage counterpart and were left out, with how often.
    pub left_out: BTreeMap<&'static str, u64>,
    /// How many crash-repair closers were appended to close an open tail turn.
    pub closers: u64,
}

/// Why a line does not map: the line (from 1), the upstream seq when known, and what is wrong.
#[derive(Debug)]
pub struct Refusal {
    /// The line, counting from 1.
    pub line: u64,
    /// The upstream seq of the event on that line, when known.
    pub seq: Option<u64>,
    /// What is wrong.
    pub reason: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}", self.line)?;
        if let Some(seq) = self.seq {
            write!(f, " (seq {seq})")?;
        }
        write!(f, ": {}", self.reason)
    }
}

/// Reads an upstream session line by line (`UpstreamReader::default()` is a reader before the
/// header line).
#[derive(Debug, Default)]
pub struct UpstreamReader {
    line: u64,
    header: Option<(Header, String)>,
    events: Vec<Event>,
    structure: Structure,
    kept_as_custom: BTreeMap<String, u64>,
    left_out: BTreeMap<&'static str, u64>,
}

type Fields<'a> = &'a Map<String, Value>;

/// What went wrong with one value, before the line is known.
type Res<T> = Result<T, String>;

fn field<'a>(object: Fields<'a>, name: &str, what: &str) -> Res<&'a Value> {
    object
        .get(name)
        .ok_or_else(|| format!("{what} has no {name:?}"))
}

fn object<'a>(value: &'a Value, what: &str) -> Res<Fields<'a>> {
    value
        .as_object()
        .ok_or_else(|| format!("{what} is not a JSON object"))
}

fn string(object: Fields<'_>, name: &str, what: &str) -> Res<Text> {
    match field(object, name, what)? {
        Value::String(s) => Ok(Text::from(s.as_str())),
        _ => Err(format!("{what}'s {name:?} is not a string")),
    }
}

fn opt_string(object: Fields<'_>, name: &str, what: &str) -> Res<Option<Text>> {
    match object.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(_) => string(object, name, what).map(Some),
    }
}

fn uint(object: Fields<'_>, name: &str, what: &str) -> Res<u64> {
    field(object, name, what)?
        .as_u64()
        .ok_or_else(|| format!("{what}'s {name:?} is not a non-negative integer"))
}

fn opt_uint(object: Fields<'_>, name: &str, what: &str) -> Res<Option<u64>> {
    match object.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(_) => uint(object, name, what).map(Some),
    }
}

fn u32_of(object: Fields<'_>, name: &str, what: &str) -> Res<u32> {
    let n = uint(object, name, what)?;
    u32::try_from(n).map_err(|_| format!("{what}'s {name:?} ({n}) is too large"))
}

fn int(object: Fields<'_>, name: &str, what: &str) -> Res<i64> {
    field(object, name, what)?
        .as_i64()
        .ok_or_else(|| format!("{what}'s {name:?} is not an integer"))
}

fn turn_step(data: Fields<'_>, what: &str) -> Res<(u32, u32)> {
    Ok((u32_of(data, "turn", what)?, u32_of(data, "step", what)?))
}

impl UpstreamReader {
    fn refuse(&self, seq: Option<u64>, reason: impl Into<String>) -> Refusal {
        Refusal {
            line: self.line,
            seq,
            reason: reason.into(),
        }
    }

    /// The Lineage id of the upstream session, once its header was read.
    fn session_bytes(&self) -> Vec<u8> {
        self.header
            .as_ref()
            .map(|(_, id)| id.as_bytes().to_vec())
            .unwrap_or_default()
    }

    /// Reads the next line (without its newline); lines of only white space are skipped.
    pub fn read_line(&mut self, text: &str) -> Result<(), Refusal> {
        self.line += 1;
        if text.trim().is_empty() {
            return Ok(());
        }
        let value: Value =
            serde_json::from_str(text).map_err(|e| self.refuse(None, format!("not JSON: {e}")))?;
        if self.header.is_none() {
            let header = self.header_line(&value).map_err(|e| self.refuse(None, e))?;
            self.header = Some(header);
            return Ok(());
        }
        let seq_hint = value.get("seq").and_then(Value::as_u64);
        let kind = value.get("type").and_then(Value::as_str);
        if let Some(kind) = kind
            && PACKED.contains(&kind)
        {
            let members = self
                .packed_row(kind, &value)
                .map_err(|e| self.refuse(seq_hint, e))?;
            for (seq, time, body) in members {
                self.push(seq, time, body)?;
            }
            return Ok(());
        }
        let (seq, time, body) = self
            .event_line(&value)
            .map_err(|e| self.refuse(seq_hint, e))?;
        self.push(seq, time, body)
    }

    fn push(&mut self, seq: u64, time: i64, body: EventBody) -> Result<(), Refusal> {
        let expected = self.events.len() as u64;
        if seq != expected {
            return Err(self.refuse(
                Some(seq),
                format!("seq {seq} where seq {expected} was expected: seqs are contiguous from 0"),
            ));
        }
        let event = Event::new(seq, time, body);
        self.structure.admit(&event).map_err(|e| {
            self.refuse(
                Some(seq),
                format!("the mapped event breaks Lineage's rules: {e}"),
            )
        })?;
        self.events.push(event);
        Ok(())
    }

    fn header_line(&self, value: &Value) -> Res<(Header, String)> {
        let what = "the session header";
        let h = object(value, what)?;
        if h.get("type").and_then(Value::as_str) != Some(HEADER_TYPE) {
            return Err("the first line is not an upstream session header".into());
        }
        let version = uint(h, "version", what)?;
        if version != UPSTREAM_VERSION {
            return Err(format!(
                "the session is in upstream format version {version}; this importer reads \
                 version {UPSTREAM_VERSION}"
            ));
        }
        if h.contains_key("sandboxMode") || h.contains_key("approvalPolicy") {
            return Err(
                "the session header uses the retired fields sandboxMode/approvalPolicy".into(),
            );
        }
        let id = string(h, "id", what)?;
        if id.is_empty() {
            return Err("the session header's id is empty".into());
        }
        let created_at = uint(h, "createdAt", what)?;
        let child = h.get("parentSession").is_some_and(|v| !v.is_null())
            || opt_uint(h, "seedLength", what)?.unwrap_or(0) > 0
            || h.get("origin").is_some_and(|v| !v.is_null())
            || opt_uint(h, "delegationDepth", what)?.unwrap_or(0) > 0;
        if child {
            return Err(format!(
                "upstream session {id:?} is a child session (it names a parent, a seed, an \
                 origin or a delegation depth), which does not map: a Lineage child proves its \
                 inherited events are its parent's by digest"
            ));
        }
        let mut header = Header::new(
            SessionId::derived(created_at, &[b"deepseek-harness session", id.as_bytes()]),
            created_at,
        );
        header.cwd = opt_string(h, "cwd", what)?;
        header.agent_preset = opt_string(h, "agentPreset", what)?;
        header.validate().map_err(|e| e.to_string())?;
        Ok((header, id.to_string()))
    }

    fn packed_row(&mut self, kind: &str, value: &Value) -> Res<Vec<(u64, i64, EventBody)>> {
        let what = format!("the {kind} row");
        let row = object(value, &what)?;
        let seq0 = uint(row, "seq0", &what)?;
        let time0 = int(row, "time0", &what)?;
        let data = object(field(row, "data", &what)?, &what)?;
        let (turn, step) = turn_step(data, &what)?;
        let index = u32_of(data, "index", &what)?;
        let pieces_name = if kind == "tool-call-chunks" {
            "args"
        } else {
            "texts"
        };
        let pieces = field(data, pieces_name, &what)?
            .as_array()
            .ok_or_else(|| format!("{what}'s {pieces_name:?} is not an array"))?;
        let gaps = field(data, "dt", &what)?
            .as_array()
            .ok_or_else(|| format!("{what}'s \"dt\" is not an array"))?;
        if pieces.is_empty() || gaps.len() + 1 != pieces.len() {
            return Err(format!(
                "{what} has {} members and {} time gaps (it needs one gap fewer than members)",
                pieces.len(),
                gaps.len()
            ));
        }
        let (id, name) = if kind == "tool-call-chunks" {
            (
                Some(CallId::new(string(data, "id", &what)?)),
                opt_string(data, "name", &what)?,
            )
        } else {
            (None, None)
        };
        let mut time = time0;
        let mut members = Vec::with_capacity(pieces.len());
        for (k, piece) in pieces.iter().enumerate() {
            if k > 0 {
                let gap = gaps[k - 1]
                    .as_i64()
                    .ok_or_else(|| format!("{what}'s time gap {} is not an integer", k - 1))?;
                time = time
                    .checked_add(gap)
                    .ok_or_else(|| format!("{what}'s member {k} has a time out of range"))?;
            }
            let text = Text::from(
                piece
                    .as_str()
                    .ok_or_else(|| format!("{what}'s member {k} is not a string"))?,
            );
            let chunk = match (kind, &id) {
                ("text-chunks", _) => StreamChunk::TextDelta { index, text },
                ("reasoning-chunks", _) => StreamChunk::ReasoningDelta { index, text },
                (_, Some(id)) => StreamChunk::ToolCallDelta(Box::new(ToolCallDelta {
                    index,
                    id: id.clone(),
                    name: name.clone(),
                    arguments_delta: text,
                })),
                (_, None) => unreachable!("tool-call rows read their id above"),
            };
            members.push((
                seq0 + k as u64,
                time,
                AssistantChunk { turn, step, chunk }.into(),
            ));
        }
        Ok(members)
    }

    fn event_line(&mut self, value: &Value) -> Res<(u64, i64, EventBody)> {
        let e = object(value, "the event")?;
        for key in e.keys() {
            if !matches!(
                key.as_str(),
                "type" | "seq" | "time" | "data" | "surfaceOp" | "sourceEventSeqs" | "ignorable"
            ) {
                return Err(format!(
                    "the event has the key {key:?}, which events do not have"
                ));
            }
        }
        let kind = string(e, "type", "the event")?;
        let seq = uint(e, "seq", "the event")?;
        let time = int(e, "time", "the event")?;
        let data = field(e, "data", "the event")?;
        let ignorable = match e.get("ignorable") {
            None => false,
            Some(Value::Bool(true)) => true,
            Some(_) => return Err("the event's \"ignorable\" is present but not true".into()),
        };
        match e.get("surfaceOp") {
            None => {}
            Some(Value::String(op)) if op == "append" => {}
            Some(_) => {
                return Err(format!(
                    "the {kind} event replaces earlier history (a surface replacement), which \
                     Lineage's append-only history cannot express"
                ));
            }
        }
        if e.contains_key("sourceEventSeqs") {
            *self.left_out.entry("sourceEventSeqs").or_default() += 1;
        }
        let body = match kind.as_str() {
            "turn/start" => {
                let d = object(data, "turn/start's data")?;
                TurnStart {
                    turn: u32_of(d, "turn", "turn/start's data")?,
                }
                .into()
            }
            "turn/end" => {
                let what = "turn/end's data";
                let d = object(data, what)?;
                TurnEnd {
                    turn: u32_of(d, "turn", what)?,
                    reason: reason(field(d, "reason", what)?)?,
                }
                .into()
            }
            "step/start" => {
                let (turn, step) = turn_step(object(data, "step/start's data")?, "step/start")?;
                StepStart { turn, step }.into()
            }
            "step/end" => {
                let (turn, step) = turn_step(object(data, "step/end's data")?, "step/end")?;
                StepEnd { turn, step }.into()
            }
            "user/message" => EventBody::from(self.message(data, Role::User)?),
            "assistant/chunk" => match self.delta(data)? {
                Some(chunk) => chunk.into(),
                None => self.custom(&kind, data)?,
            },
            "assistant/message" => {
                let what = "assistant/message's data";
                let d = object(data, what)?;
                let (turn, step) = turn_step(d, what)?;
                let message = self.message(field(d, "message", what)?, Role::Assistant)?;
                let usage = match d.get("usage") {
                    None | Some(Value::Null) => None,
                    Some(u) => {
                        let usage = self.usage(u);
                        if usage.is_none() {
                            *self.left_out.entry("usage").or_default() += 1;
                        }
                        usage
                    }
                };
                let interrupted = match d.get("interrupted") {
                    None | Some(Value::Null) => false,
                    Some(Value::Bool(b)) => *b,
                    Some(_) => return Err(format!("{what}'s \"interrupted\" is not a boolean")),
                };
                AssistantMessage {
                    turn,
                    step,
                    message,
                    usage,
                    interrupted,
                }
                .into()
            }
            "tool/call" => {
                let what = "tool/call's data";
                let d = object(data, what)?;
                let (turn, step) = turn_step(d, what)?;
                ToolCall {
                    turn,
                    step,
                    call_id: CallId::new(string(d, "callId", what)?),
                    name: string(d, "name", what)?,
                    arguments: string(d, "arguments", what)?,
                }
                .into()
            }
            "tool/result" => {
                let what = "tool/result's data";
                let d = object(data, what)?;
                let (turn, step) = turn_step(d, what)?;
                let message = self.message(field(d, "message", what)?, Role::User)?;
                let error = match d.get("error") {
                    None | Some(Value::Null) => None,
                    Some(err) => {
                        let err = object(err, "the tool error")?;
                        Some(ToolError {
                            name: string(err, "name", "the tool error")?,
                            code: string(err, "code", "the tool error")?,
                        })
                    }
                };
                if d.get("meta").is_some_and(|m| !m.is_null()) {
                    *self.left_out.entry("meta").or_default() += 1;
                }
                ToolResult {
                    turn,
                    step,
                    message,
                    error,
                }
                .into()
            }
            "approval/policy" => {
                let what = "approval/policy's data";
                let d = object(data, what)?;
                ApprovalPolicy {
                    policy: string(d, "policy", what)?,
                    source: policy_source(d, what)?,
                }
                .into()
            }
            "sandbox/mode" => {
                let what = "sandbox/mode's data";
                let d = object(data, what)?;
                SandboxMode {
                    mode: string(d, "mode", what)?,
                    source: policy_source(d, what)?,
                }
                .into()
            }
            other if KNOWN_TYPES.contains(&other) || ignorable => self.custom(other, data)?,
            other => {
                return Err(format!(
                    "the event type {other:?} is unknown to upstream's own readers and not \
                     marked ignorable"
                ));
            }
        };
        Ok((seq, time, body))
    }

    /// An event kept whole as an ignorable `custom` event of the same type.
    fn custom(&mut self, kind: &str, data: &Value) -> Res<EventBody> {
        *self.kept_as_custom.entry(kind.to_owned()).or_default() += 1;
        Ok(Custom {
            type_name: Text::from(kind),
            payload: Text::from(data.to_string()),
            ignorable: true,
        }
        .into())
    }

    /// A text, reasoning or tool-call delta, or `None` for a chunk of another kind.
    fn delta(&self, data: &Value) -> Res<Option<AssistantChunk>> {
        let what = "assistant/chunk's data";
        let d = object(data, what)?;
        let (turn, step) = turn_step(d, what)?;
        let chunk = object(field(d, "chunk", what)?, "the chunk")?;
        let what = "the chunk";
        let chunk = match chunk.get("type").and_then(Value::as_str) {
            Some("text-delta") => StreamChunk::TextDelta {
                index: u32_of(chunk, "index", what)?,
                text: string(chunk, "text", what)?,
            },
            Some("reasoning-delta") => StreamChunk::ReasoningDelta {
                index: u32_of(chunk, "index", what)?,
                text: string(chunk, "text", what)?,
            },
            Some("tool-call-delta") => StreamChunk::ToolCallDelta(Box::new(ToolCallDelta {
                index: u32_of(chunk, "index", what)?,
                id: CallId::new(string(chunk, "id", what)?),
                name: opt_string(chunk, "name", what)?,
                arguments_delta: string(chunk, "argumentsDelta", what)?,
            })),
            _ => return Ok(None),
        };
        Ok(Some(AssistantChunk { turn, step, chunk }))
    }

    fn usage(&self, value: &Value) -> Option<Usage> {
        let u = value.as_object()?;
        Some(Usage {
            input_tokens: u.get("inputTokens")?.as_u64()?,
            output_tokens: u.get("outputTokens")?.as_u64()?,
            cache_read_tokens: match u.get("cacheReadTokens") {
                None | Some(Value::Null) => None,
                Some(v) => Some(v.as_u64()?),
            },
        })
    }

    fn message(&self, value: &Value, role: Role) -> Res<Message> {
        let what = "the message";
        let m = object(value, what)?;
        let id = string(m, "id", what)?;
        if id.is_empty() {
            return Err("the message's id is empty".into());
        }
        let stated = string(m, "role", what)?;
        let expected = match role {
            Role::User => "user",
            Role::Assistant => "assistant",
        };
        if stated != expected {
            return Err(format!(
                "the message has role {stated:?} where {expected:?} belongs"
            ));
        }
        let content = field(m, "content", what)?
            .as_array()
            .ok_or("the message's content is not an array")?
            .iter()
            .map(|b| block(b, 0))
            .collect::<Res<Vec<_>>>()?;
        let source = object(field(m, "source", what)?, "the message's source")?;
        let what = "the message's source";
        let source = match source.get("kind").and_then(Value::as_str) {
            Some("user") => MessageSource::User,
            Some("plugin") => MessageSource::Plugin {
                name: string(source, "plugin", what)?,
            },
            Some("model") => MessageSource::Model {
                endpoint: string(source, "provider", what)?,
                model: string(source, "model", what)?,
            },
            Some("tool") => MessageSource::Tool {
                call_id: CallId::new(string(source, "callId", what)?),
            },
            other => {
                return Err(format!(
                    "the message's source kind {} has no Lineage counterpart",
                    other.map_or("(missing)".to_owned(), |k| format!("{k:?}"))
                ));
            }
        };
        let session = self.session_bytes();
        Ok(Message {
            id: MessageId::derived(&[b"deepseek-harness message", &session, id.as_bytes()]),
            role,
            content,
            source,
        })
    }

    /// Ends the reading: the mapped session, its open tail turn closed.
    pub fn finish(mut self) -> Result<Mapped, Refusal> {
        let Some((header, upstream_id)) = self.header.take() else {
            return Err(self.refuse(None, "the file is empty: it has no session header"));
        };
        if self.events.is_empty() {
            return Err(self.refuse(
                None,
                "the session has no events, and a store keeps no empty session",
            ));
        }
        let closers = interrupted_turn_closers(&self.events);
        let closed = closers.len() as u64;
        self.events.extend(closers);
        Ok(Mapped {
            header,
            events: self.events,
            upstream_id,
            kept_as_custom: self.kept_as_custom,
            left_out: self.left_out,
            closers: closed,
        })
    }
}

fn policy_source(d: Fields<'_>, what: &str) -> Res<PolicySource> {
    match d.get("source") {
        None | Some(Value::Null) => Ok(PolicySource::Own),
        Some(Value::String(s)) if s == "delegation" => Ok(PolicySource::Delegation),
        Some(other) => Err(format!(
            "{what}'s source {other} has no Lineage counterpart"
        )),
    }
}

/// A content block; tool results nest, at most as deep as Lineage allows.
fn block(value: &Value, depth: usize) -> Res<ContentBlock> {
    let what = "a content block";
    let b = object(value, what)?;
    Ok(match b.get("type").and_then(Value::as_str) {
        Some("text") => ContentBlock::Text {
            text: string(b, "text", what)?,
        },
        Some("reasoning") => ContentBlock::Reasoning {
            text: string(b, "text", what)?,
        },
        Some("tool-call") => ContentBlock::ToolCall {
            id: CallId::new(string(b, "id", what)?),
            name: string(b, "name", what)?,
            arguments: string(b, "arguments", what)?,
        },
        Some("tool-result") => {
            if depth >= lineage_log::MAX_NESTING {
                return Err(format!(
                    "tool results nest deeper than the {} levels Lineage allows",
                    lineage_log::MAX_NESTING
                ));
            }
            let content = field(b, "content", what)?
                .as_array()
                .ok_or("a tool-result block's content is not an array")?
                .iter()
                .map(|inner| block(inner, depth + 1))
                .collect::<Res<Vec<_>>>()?;
            let is_error = match b.get("isError") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(v)) => *v,
                Some(_) => return Err("a tool-result block's isError is not a boolean".into()),
            };
            ContentBlock::ToolResult {
                tool_call_id: CallId::new(string(b, "toolCallId", what)?),
                content,
                is_error,
            }
        }
        Some("image") => {
            return Err(
                "an image block does not map: upstream keeps the attachment outside the log, \
                 and Lineage needs its media type and location"
                    .into(),
            );
        }
        other => {
            return Err(format!(
                "a content block of type {} has no Lineage counterpart",
                other.map_or("(missing)".to_owned(), |k| format!("{k:?}"))
            ));
        }
    })
}

/// A turn-end reason.
fn reason(value: &Value) -> Res<TurnEndReason> {
    let what = "the turn-end reason";
    let r = object(value, what)?;
    Ok(match r.get("kind").and_then(Value::as_str) {
        Some("completed") => TurnEndReason::Completed,
        Some("blocked") => TurnEndReason::Blocked,
        Some("max-tokens") => TurnEndReason::MaxTokens,
        Some("interrupted") => TurnEndReason::Interrupted,
        Some("aborted") => {
            let cause = object(field(r, "reason", what)?, "the abort cause")?;
            let cause = match cause.get("kind").and_then(Value::as_str) {
                Some("user") => AbortCause::User,
                Some("parent") => AbortCause::Parent,
                Some("disposed") => AbortCause::Disposed,
                Some("hook") => AbortCause::Hook {
                    reason: string(cause, "reason", "the abort cause")?,
                },
                other => {
                    return Err(format!(
                        "the abort cause {} has no Lineage counterpart",
                        other.map_or("(missing)".to_owned(), |k| format!("{k:?}"))
                    ));
                }
            };
            TurnEndReason::Aborted { cause }
        }
        Some("error") => {
            let what = "the turn's error";
            let e = object(field(r, "error", "the turn-end reason")?, what)?;
            let status = opt_uint(e, "status", what)?
                .map(|s| u32::try_from(s).map_err(|_| format!("{what}'s status {s} is too large")))
                .transpose()?;
            TurnEndReason::Error(Box::new(TurnError {
                message: string(e, "message", what)?,
                code: string(e, "code", what)?,
                status,
                retry_after_ms: opt_uint(e, "providerRetryAfterMs", what)?,
                request_id: opt_string(e, "requestId", what)?,
            }))
        }
        other => {
            return Err(format!(
                "the turn-end reason {} has no Lineage counterpart",
                other.map_or("(missing)".to_owned(), |k| format!("{k:?}"))
            ));
        }
    })
}
