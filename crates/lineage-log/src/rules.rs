//! The log's rules as pure functions: event shape, turn structure, the append and seed contracts,
//! balance, and the closers that crash repair appends.

use crate::json::check_strict_json;
use crate::message::MAX_NESTING;
use crate::{
    CallId, ContentBlock, DescriptorMode, Event, EventBody, EventKind, LogError, Message,
    MessageId, MessageSource, Role, StepEnd, StepNo, SubagentDescriptor, Text, ToolError,
    ToolResult, TurnEnd, TurnEndReason, TurnNo,
};

/// The error code of a synthetic result for a call the model asked for but that never started.
pub const TOOL_NOT_STARTED: &str = "TOOL_NOT_STARTED";
/// The error code of a synthetic result for a call that started but whose result was lost.
pub const TOOL_OUTCOME_UNKNOWN: &str = "TOOL_OUTCOME_UNKNOWN";

const NOT_STARTED_TEXT: &str = "This tool call was cut off before it was recorded as started, so it never ran. \
     Call it again if it is still needed.";
const OUTCOME_UNKNOWN_TEXT: &str = "This tool call was recorded as started, but the process stopped before its result \
     was saved, so whether it took effect is unknown. Retry it only if the tool is read-only or \
     idempotent; if it may have side effects, check the external state or ask the user first. \
     Never retry it blindly.";

/// Checks the rules one event must satisfy on its own: message roles and sources, the single
/// tool-result block of a `tool/result`, that `session/lineage` sits at `seq == seed_len`, that a
/// `subagent/descriptor` keeps the descriptor contract ([`check_descriptor`]), and that a `custom`
/// event names its type and carries strict JSON.
pub fn check_shape(event: &Event) -> Result<(), String> {
    fn user(message: &Message, what: &str) -> Result<(), String> {
        if message.role != Role::User {
            return Err(format!("{what} must have role user"));
        }
        Ok(())
    }
    for message in messages_of(&event.body) {
        if let Some(depth) = message.content.iter().map(ContentBlock::nesting).max()
            && depth > MAX_NESTING
        {
            return Err(format!(
                "tool results nest {depth} levels deep, more than the {MAX_NESTING} allowed"
            ));
        }
    }
    match &event.body {
        EventBody::UserMessage(message) => user(message, "message"),
        EventBody::AssistantMessage(m) => {
            if m.message.role != Role::Assistant {
                return Err("message must have role assistant".into());
            }
            match &m.message.source {
                MessageSource::Model { endpoint, model }
                    if !endpoint.is_empty() && !model.is_empty() =>
                {
                    Ok(())
                }
                _ => Err("message must have a model source naming endpoint and model".into()),
            }
        }
        EventBody::ToolResult(r) => {
            user(&r.message, "tool result")?;
            let MessageSource::Tool { call_id } = &r.message.source else {
                return Err("tool result must have a tool source".into());
            };
            match r.message.content.as_slice() {
                [ContentBlock::ToolResult { tool_call_id, .. }] if tool_call_id == call_id => {
                    Ok(())
                }
                [ContentBlock::ToolResult { tool_call_id, .. }] => Err(format!(
                    "tool result block answers call {tool_call_id} but its source names call {call_id}"
                )),
                _ => Err("tool result must contain exactly one tool-result block".into()),
            }
        }
        EventBody::InboxSpliced(splice) => splice
            .inserted
            .iter()
            .try_for_each(|m| user(m, "an inserted inbox message")),
        EventBody::SessionLineage(lineage) if lineage.seed_len != event.seq => Err(format!(
            "session/lineage must sit at seq == seed_len, but seed_len is {}",
            lineage.seed_len
        )),
        EventBody::SubagentDescriptor(descriptor) => check_descriptor(descriptor),
        EventBody::Custom(custom) if custom.type_name.is_empty() => {
            Err("custom event must name its type".into())
        }
        EventBody::Custom(custom) => check_strict_json(&custom.payload).map_err(|problem| {
            format!(
                "the payload of custom event {:?} is not strict JSON: {problem}",
                custom.type_name.as_str()
            )
        }),
        EventBody::Opaque(opaque)
            if opaque.tag == 0 || EventKind::from_tag(opaque.tag).is_some() =>
        {
            Err(format!(
                "an opaque record cannot carry tag {}, which is reserved or known",
                opaque.tag
            ))
        }
        _ => Ok(()),
    }
}

/// Checks the descriptor contract: the version is the one this build supports
/// ([`SubagentDescriptor::VERSION`]); a continuable descriptor has a label; a one-shot descriptor
/// carries none of the continuable-only fields (endpoint, model, persona, tool
/// filter); a tool filter declares `allow`, `deny` or both. The error names the offending field.
pub fn check_descriptor(descriptor: &SubagentDescriptor) -> Result<(), String> {
    if descriptor.version != SubagentDescriptor::VERSION {
        return Err(format!(
            "subagent descriptor field version is {}, but only version {} is supported",
            descriptor.version,
            SubagentDescriptor::VERSION
        ));
    }
    match descriptor.mode {
        DescriptorMode::Continuable if descriptor.label.is_none() => {
            return Err("a continuable subagent descriptor must have a label".into());
        }
        DescriptorMode::Continuable => {}
        DescriptorMode::OneShot => {
            let continuable_only = [
                ("endpoint", descriptor.endpoint.is_some()),
                ("model", descriptor.model.is_some()),
                ("persona", descriptor.persona.is_some()),
                ("tool_filter", descriptor.tool_filter.is_some()),
            ];
            if let Some((field, _)) = continuable_only.iter().find(|(_, present)| *present) {
                return Err(format!(
                    "a one-shot subagent descriptor cannot carry {field}, which only a \
                     continuable one has"
                ));
            }
        }
    }
    match &descriptor.tool_filter {
        Some(filter) if filter.allow.is_none() && filter.deny.is_none() => {
            Err("the tool_filter of a subagent descriptor must declare allow, deny or both".into())
        }
        _ => Ok(()),
    }
}

/// The messages an event carries.
fn messages_of(body: &EventBody) -> impl Iterator<Item = &Message> {
    let (one, many): (Option<&Message>, &[Message]) = match body {
        EventBody::UserMessage(m) => (Some(m), &[]),
        EventBody::AssistantMessage(m) => (Some(&m.message), &[]),
        EventBody::ToolResult(r) => (Some(&r.message), &[]),
        EventBody::InboxSpliced(s) => (None, &s.inserted),
        _ => (None, &[]),
    };
    one.into_iter().chain(many)
}

/// The turn and step structure of a log, folded event by event.
///
/// Turns are numbered 1, 2, … and never nest; steps are numbered from 1 within their turn and never
/// nest; chunks, assistant messages, tool calls and tool results name the open turn and step; a
/// tool result answers a `tool/call` of the same step, except the synthetic `TOOL_NOT_STARTED`
/// results of crash repair; a turn closes only after its step. User messages, inbox splices,
/// lineage, descriptor, policy, custom and opaque events may appear anywhere.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Structure {
    next_seq: u64,
    last_turn: TurnNo,
    open_turn: Option<TurnNo>,
    last_step: StepNo,
    open_step: Option<StepNo>,
    /// Calls with a `tool/call` and no result yet, in the open step.
    pending: Vec<CallId>,
}

impl Structure {
    /// The structure of an empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// The structure of a balanced log of `len` events whose last turn was `last_turn` (0 when it
    /// has none): what a log is at a completed-turn boundary, without replaying it.
    pub fn balanced_at(len: u64, last_turn: TurnNo) -> Self {
        Structure {
            next_seq: len,
            last_turn,
            ..Structure::default()
        }
    }

    /// The structure at the end of `events`, a log already known to be valid (for example one
    /// whose digests were checked): only its open tail turn, if any, is replayed. A replay error
    /// means the log was not valid after all.
    pub fn of_valid_log(events: &[Event]) -> Result<Self, LogError> {
        let last_marker = events
            .iter()
            .rposition(|e| matches!(e.kind(), EventKind::TurnStart | EventKind::TurnEnd));
        let Some(at) = last_marker else {
            return Ok(Structure::balanced_at(events.len() as u64, 0));
        };
        match &events[at].body {
            EventBody::TurnEnd(end) => Ok(Structure::balanced_at(events.len() as u64, end.turn)),
            EventBody::TurnStart(start) => {
                let mut structure = Structure::balanced_at(at as u64, start.turn.saturating_sub(1));
                for event in &events[at..] {
                    structure.admit(event)?;
                }
                Ok(structure)
            }
            _ => unreachable!("the marker is a turn boundary"),
        }
    }

    /// The seq the next event must carry.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The open turn, if any.
    pub fn open_turn(&self) -> Option<TurnNo> {
        self.open_turn
    }

    /// The open step, if any.
    pub fn open_step(&self) -> Option<StepNo> {
        self.open_step
    }

    /// The number of the last turn opened (0 when none).
    pub fn last_turn(&self) -> TurnNo {
        self.last_turn
    }

    /// Whether no turn is open.
    pub fn is_balanced(&self) -> bool {
        self.open_turn.is_none()
    }

    /// Admits `event`: checks its seq, its shape and its place in the structure, then folds it in.
    /// On error nothing changes.
    pub fn admit(&mut self, event: &Event) -> Result<(), LogError> {
        self.admit_with(event, Contract::Current)
    }

    fn admit_with(&mut self, event: &Event, contract: Contract) -> Result<(), LogError> {
        let invalid = |reason: String| LogError::InvalidEvent {
            seq: event.seq,
            kind: event.kind(),
            reason,
        };
        match (&event.body, contract) {
            (EventBody::SubagentDescriptor(_), Contract::BeforeDescriptors) => Ok(()),
            _ => check_shape(event),
        }
        .map_err(invalid)?;
        self.check_place(event).map_err(invalid)?;
        self.apply(event);
        Ok(())
    }

    fn in_step(&self, turn: TurnNo, step: StepNo) -> Result<(), String> {
        match (self.open_turn, self.open_step) {
            (Some(t), Some(s)) if t == turn && s == step => Ok(()),
            (Some(t), Some(s)) => Err(format!(
                "names turn {turn} step {step}, but the open step is turn {t} step {s}"
            )),
            (Some(t), None) => Err(format!(
                "names turn {turn} step {step}, but turn {t} has no open step"
            )),
            (None, _) => Err(format!(
                "names turn {turn} step {step}, but no turn is open"
            )),
        }
    }

    fn check_place(&self, event: &Event) -> Result<(), String> {
        if event.seq != self.next_seq {
            return Err(format!("expected seq {}", self.next_seq));
        }
        match &event.body {
            EventBody::TurnStart(t) => {
                if let Some(open) = self.open_turn {
                    return Err(format!("turn {open} is still open"));
                }
                let expected = self.last_turn + 1;
                if t.turn != expected {
                    return Err(format!("expected turn {expected}, got {}", t.turn));
                }
            }
            EventBody::TurnEnd(t) => {
                if self.open_turn != Some(t.turn) {
                    return Err(match self.open_turn {
                        Some(open) => format!("closes turn {}, but turn {open} is open", t.turn),
                        None => format!("closes turn {}, but no turn is open", t.turn),
                    });
                }
                if let Some(step) = self.open_step {
                    return Err(format!("step {step} is still open"));
                }
            }
            EventBody::StepStart(s) => {
                if self.open_turn != Some(s.turn) {
                    return Err(format!(
                        "opens a step in turn {}, which is not open",
                        s.turn
                    ));
                }
                if let Some(step) = self.open_step {
                    return Err(format!("step {step} is still open"));
                }
                let expected = self.last_step + 1;
                if s.step != expected {
                    return Err(format!(
                        "expected step {expected} in turn {}, got {}",
                        s.turn, s.step
                    ));
                }
            }
            EventBody::StepEnd(s) => self.in_step(s.turn, s.step)?,
            EventBody::AssistantChunk(c) => self.in_step(c.turn, c.step)?,
            EventBody::AssistantMessage(m) => self.in_step(m.turn, m.step)?,
            EventBody::ToolCall(c) => self.in_step(c.turn, c.step)?,
            EventBody::ToolResult(r) => {
                self.in_step(r.turn, r.step)?;
                let call_id = tool_result_call_id(r);
                let synthetic_not_started =
                    r.error.as_ref().is_some_and(|e| e.code == TOOL_NOT_STARTED);
                if !synthetic_not_started && !self.pending.contains(call_id) {
                    return Err(format!(
                        "answers call {call_id}, which has no tool/call pending in this step"
                    ));
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn apply(&mut self, event: &Event) {
        self.next_seq = event.seq + 1;
        match &event.body {
            EventBody::TurnStart(t) => {
                self.open_turn = Some(t.turn);
                self.last_turn = t.turn;
                self.last_step = 0;
                self.open_step = None;
                self.pending.clear();
            }
            EventBody::TurnEnd(_) => {
                self.open_turn = None;
                self.open_step = None;
                self.last_step = 0;
                self.pending.clear();
            }
            EventBody::StepStart(s) => {
                self.open_step = Some(s.step);
                self.last_step = s.step;
            }
            EventBody::StepEnd(_) => {
                self.open_step = None;
                self.pending.clear();
            }
            EventBody::ToolCall(c) => self.pending.push(c.call_id.clone()),
            EventBody::ToolResult(r) => {
                let call_id = tool_result_call_id(r);
                if let Some(i) = self.pending.iter().position(|c| c == call_id) {
                    self.pending.remove(i);
                }
            }
            _ => {}
        }
    }
}

fn tool_result_call_id(result: &ToolResult) -> &CallId {
    match &result.message.source {
        MessageSource::Tool { call_id } => call_id,
        // check_shape guarantees a tool source before this is reached.
        _ => unreachable!("tool results are shape-checked before their structure"),
    }
}

/// Checks the append contract for `batch` against a log whose structure is `structure`: the batch
/// continues at the next seq, contiguously, and every event is valid where it lands. Returns the
/// structure after the batch; on error `structure` is unchanged.
pub fn check_append(structure: &Structure, batch: &[Event]) -> Result<Structure, LogError> {
    check_append_with(structure, batch, Contract::Current)
}

/// Which rules an append keeps.
#[derive(Clone, Copy)]
enum Contract {
    /// Every rule of this build.
    Current,
    /// Every rule but the descriptor contract, as builds before it had.
    BeforeDescriptors,
}

/// [`check_append`] as a build before the descriptor contract ran it: a `subagent/descriptor`
/// of any version and shape is admitted. It exists so tests can write the logs such builds left
/// behind; it is not part of the stable API.
#[doc(hidden)]
pub fn check_append_before_descriptor_contract(
    structure: &Structure,
    batch: &[Event],
) -> Result<Structure, LogError> {
    check_append_with(structure, batch, Contract::BeforeDescriptors)
}

fn check_append_with(
    structure: &Structure,
    batch: &[Event],
    contract: Contract,
) -> Result<Structure, LogError> {
    let mut next = structure.clone();
    for (index, event) in batch.iter().enumerate() {
        if event.seq != next.next_seq {
            return Err(LogError::SeqMismatch {
                index,
                expected: next.next_seq,
                got: event.seq,
            });
        }
        next.admit_with(event, contract)?;
    }
    Ok(next)
}

/// Checks the seed contract: seqs equal indexes from 0 and every event is valid where it stands.
/// A seed need not be balanced. Returns the seed's structure.
pub fn check_seed(seed: &[Event]) -> Result<Structure, LogError> {
    let mut structure = Structure::new();
    for (index, event) in seed.iter().enumerate() {
        if event.seq != index as u64 {
            return Err(LogError::InvalidSeed {
                index,
                reason: format!(
                    "has seq {} (expected {index}): a seed is contiguous from 0",
                    event.seq
                ),
            });
        }
        structure.admit(event).map_err(|e| LogError::InvalidSeed {
            index,
            reason: e.to_string(),
        })?;
    }
    Ok(structure)
}

/// An in-memory log that enforces the append contract.
#[derive(Clone, Debug, Default)]
pub struct Log {
    events: Vec<Event>,
    structure: Structure,
}

impl Log {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// A log holding `seed`, which must satisfy the seed contract.
    pub fn from_seed(seed: Vec<Event>) -> Result<Self, LogError> {
        let structure = check_seed(&seed)?;
        Ok(Log {
            events: seed,
            structure,
        })
    }

    /// Appends `batch` whole, or refuses it and changes nothing.
    pub fn append(&mut self, batch: Vec<Event>) -> Result<(), LogError> {
        self.structure = check_append(&self.structure, &batch)?;
        self.events.extend(batch);
        Ok(())
    }

    /// The events, in seq order.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// The log's structure so far.
    pub fn structure(&self) -> &Structure {
        &self.structure
    }

    /// The seq the next event must carry.
    pub fn next_seq(&self) -> u64 {
        self.events.len() as u64
    }

    /// Whether no turn is open.
    pub fn is_balanced(&self) -> bool {
        self.structure.is_balanced()
    }

    /// The events, taken out.
    pub fn into_events(self) -> Vec<Event> {
        self.events
    }
}

/// Whether `events` is balanced: every turn is closed, and with it every step and every call that
/// crash repair would answer.
pub fn is_balanced(events: &[Event]) -> bool {
    last_turn_marker(events).is_none_or(|m| matches!(m, TurnMarker::End))
}

/// The last turn boundary of a log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnMarker {
    /// The last boundary is a `turn/start` of this turn: the turn is open.
    Start(TurnNo),
    /// The last boundary is a `turn/end`.
    End,
}

/// The last `turn/start` or `turn/end` of `events`, if any.
pub fn last_turn_marker(events: &[Event]) -> Option<TurnMarker> {
    events.iter().rev().find_map(|e| match &e.body {
        EventBody::TurnStart(t) => Some(TurnMarker::Start(t.turn)),
        EventBody::TurnEnd(_) => Some(TurnMarker::End),
        _ => None,
    })
}

/// The events up to and including the last `turn/end`: what a fork inherits. Empty when no turn
/// has completed.
pub fn completed_turn_prefix(events: &[Event]) -> &[Event] {
    let end = events
        .iter()
        .rposition(|e| e.kind() == EventKind::TurnEnd)
        .map_or(0, |i| i + 1);
    &events[..end]
}

/// Resolves a fork boundary (an inclusive seq; `None` means the last event) to the seed length,
/// refusing a boundary past the log or inside an open turn. `last_marker_through(b)` gives the last
/// turn boundary among the events `0..=b`.
pub fn resolve_fork_boundary(
    len: u64,
    boundary: Option<u64>,
    last_marker_through: impl FnOnce(u64) -> Option<TurnMarker>,
) -> Result<u64, LogError> {
    let boundary = match boundary {
        None if len == 0 => return Ok(0),
        None => len - 1,
        Some(b) if b >= len => return Err(LogError::InvalidBoundary { boundary: b, len }),
        Some(b) => b,
    };
    if let Some(TurnMarker::Start(turn)) = last_marker_through(boundary) {
        return Err(LogError::OpenTurn { boundary, turn });
    }
    Ok(boundary + 1)
}

struct PendingCall {
    call_id: CallId,
    step: StepNo,
    call_seq: Option<u64>,
}

/// The events that close a log torn mid-turn, in order: one error `tool/result` per call the model
/// asked for in the open step and never got an answer to (in transcript order; `TOOL_OUTCOME_UNKNOWN`
/// when a `tool/call` was logged, `TOOL_NOT_STARTED` otherwise), then `step/end` if a step is open,
/// then `turn/end` with reason `Interrupted`. Their seqs continue the log and their time is the
/// last event's, so repair is deterministic. Empty for an empty or balanced log.
pub fn interrupted_turn_closers(events: &[Event]) -> Vec<Event> {
    let Some(last) = events.last() else {
        return Vec::new();
    };
    // Only the tail turn can need closing, and a `turn/start` resets everything the scan below
    // tracks: start at the last turn boundary instead of replaying the whole log.
    let boundary = events
        .iter()
        .rposition(|e| matches!(e.kind(), EventKind::TurnStart | EventKind::TurnEnd));
    let events = match boundary {
        Some(at) if events[at].kind() == EventKind::TurnStart => &events[at..],
        _ => return Vec::new(),
    };
    let mut open_turn: Option<TurnNo> = None;
    let mut open_step: Option<StepNo> = None;
    let mut pending: Vec<PendingCall> = Vec::new();
    for event in events {
        match &event.body {
            EventBody::TurnStart(t) => {
                open_turn = Some(t.turn);
                open_step = None;
                pending.clear();
            }
            EventBody::TurnEnd(_) => {
                open_turn = None;
                open_step = None;
                pending.clear();
            }
            EventBody::StepStart(s) => open_step = Some(s.step),
            EventBody::StepEnd(_) => {
                pending.clear();
                open_step = None;
            }
            EventBody::AssistantMessage(m) => {
                for (call_id, _, _) in m.message.tool_calls() {
                    match pending.iter_mut().find(|p| &p.call_id == call_id) {
                        Some(p) => p.step = m.step,
                        None => pending.push(PendingCall {
                            call_id: call_id.clone(),
                            step: m.step,
                            call_seq: None,
                        }),
                    }
                }
            }
            EventBody::ToolCall(c) => {
                if let Some(p) = pending.iter_mut().find(|p| p.call_id == c.call_id) {
                    p.call_seq = Some(event.seq);
                }
            }
            EventBody::ToolResult(r) => {
                let call_id = tool_result_call_id(r);
                pending.retain(|p| &p.call_id != call_id);
            }
            _ => {}
        }
    }
    let Some(turn) = open_turn else {
        return Vec::new();
    };
    let time_ms = last.time_ms;
    let mut seq = last.seq + 1;
    let mut closers = Vec::with_capacity(pending.len() + 2);
    for call in pending {
        let (text, name, code) = match call.call_seq {
            Some(_) => (
                OUTCOME_UNKNOWN_TEXT,
                "ToolOutcomeUnknown",
                TOOL_OUTCOME_UNKNOWN,
            ),
            None => (NOT_STARTED_TEXT, "ToolNotStarted", TOOL_NOT_STARTED),
        };
        let message = Message {
            id: MessageId::derived(&[call.call_id.as_str().as_bytes(), &seq.to_le_bytes()]),
            role: Role::User,
            content: vec![ContentBlock::ToolResult {
                tool_call_id: call.call_id.clone(),
                content: vec![ContentBlock::text(Text::from_static(text))],
                is_error: true,
            }],
            source: MessageSource::Tool {
                call_id: call.call_id,
            },
        };
        let result = ToolResult {
            turn,
            step: call.step,
            message,
            error: Some(ToolError {
                name: Text::from_static(name),
                code: Text::from_static(code),
            }),
        };
        closers.push(Event::new(seq, time_ms, result));
        seq += 1;
    }
    if let Some(step) = open_step {
        closers.push(Event::new(seq, time_ms, StepEnd { turn, step }));
        seq += 1;
    }
    closers.push(Event::new(
        seq,
        time_ms,
        TurnEnd {
            turn,
            reason: TurnEndReason::Interrupted,
        },
    ));
    closers
}
