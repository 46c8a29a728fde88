//! Logs that `lineage-log` accepts, built from arbitrary bytes.
//!
//! Whatever the source, every candidate event is offered to the log's own rules
//! ([`Structure::admit`]) at the next seq, and only the ones they accept are kept: the rules, not
//! the generator, decide what a valid log is, so the fuzzer reaches every log the rules allow and
//! no other.

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use lineage_log::{
    AbortCause, AssistantChunk, AssistantMessage, CallId, ContentBlock, Digest, Event, EventBody,
    FinishReason, InboxSpliced, InboxTarget, Message, MessageId, MessageSource, Records, Role,
    SessionId, SessionLineage, StepEnd, StepNo, StepStart, StreamChunk, Structure,
    TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN, Text, ToolCall, ToolCallDelta, ToolError, ToolResult,
    TurnEnd, TurnEndReason, TurnError, TurnNo, TurnStart, Usage, decode_record,
};
use lineage_testkit::{SplitMix64, random_event_body, valid_log_from_ops};

/// The most events one input builds, so one execution stays short.
pub const MAX_EVENTS: usize = 600;

/// The session the logs belong to. Every `session/lineage` a builder makes names another parent,
/// so no session is its own parent.
pub const SESSION: SessionId = SessionId::from_u128(0x0197_0000_0000_7000_8000_0000_0000_0001);

/// Where a log's events come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The bytes are back-to-back records, through the record decoder.
    Records,
    /// The bytes drive the test kit's generator of agent-like valid logs.
    Machine,
    /// The bytes choose events one by one, aimed at the open turn and step and at a few call ids.
    Events,
}

/// A log the rules accept, and its structure.
#[derive(Clone, Debug, Default)]
pub struct Accepted {
    /// The events, seqs `0..n`.
    pub events: Vec<Event>,
    /// The structure after them.
    pub structure: Structure,
    /// The last step opened in the open turn (0 when none).
    last_step: StepNo,
    /// The time of the last event.
    time_ms: i64,
    /// How many events were offered and refused.
    pub refused: usize,
}

impl Accepted {
    /// Offers `body` at the next seq and `time_ms`; keeps it if the rules accept it there.
    pub fn offer(&mut self, time_ms: i64, body: EventBody) -> bool {
        let event = Event::new(self.structure.next_seq(), time_ms, body);
        if self.structure.admit(&event).is_err() {
            self.refused += 1;
            return false;
        }
        match &event.body {
            EventBody::TurnStart(_) => self.last_step = 0,
            EventBody::StepStart(s) => self.last_step = s.step,
            _ => {}
        }
        self.time_ms = time_ms;
        self.events.push(event);
        true
    }

    fn full(&self) -> bool {
        self.events.len() >= MAX_EVENTS
    }
}

/// The log `source` builds from what is left of `u`.
pub fn accepted_log(source: Source, u: &mut Unstructured<'_>) -> Result<Accepted> {
    let mut log = Accepted::default();
    match source {
        Source::Records => {
            let bytes = u.bytes(u.len())?;
            for item in Records::new(bytes, 0) {
                let Ok((seq, raw)) = item else { break };
                if log.full() {
                    break;
                }
                // A record the decoder refuses is skipped; the next one is offered at the seq
                // this one would have had.
                if let Ok(event) = decode_record(seq, &raw) {
                    log.offer(event.time_ms, event.body);
                }
            }
        }
        Source::Machine => {
            let start_ms: i64 = u.arbitrary()?;
            let max_turns = u.int_in_range(1..=6)?;
            let close_tail: bool = u.arbitrary()?;
            let ops: Vec<u64> = u
                .bytes(u.len())?
                .chunks(8)
                .take(MAX_EVENTS / 2)
                .map(|c| c.iter().fold(0u64, |v, &b| (v << 8) | u64::from(b)))
                .collect();
            for event in valid_log_from_ops(start_ms, &ops, max_turns, close_tail) {
                if log.full() {
                    break;
                }
                let accepted = log.offer(event.time_ms, event.body);
                assert!(
                    accepted,
                    "the test kit generated an event the rules refuse at seq {}",
                    event.seq
                );
            }
        }
        Source::Events => {
            while !u.is_empty() && !log.full() {
                let time_ms = next_time(u, log.time_ms)?;
                let body = aimed_body(u, &log)?;
                log.offer(time_ms, body);
            }
        }
    }
    Ok(log)
}

fn next_time(u: &mut Unstructured<'_>, last: i64) -> Result<i64> {
    Ok(match u.int_in_range(0..=15u8)? {
        0 => u.arbitrary()?,
        1 => last,
        _ => last.wrapping_add(i64::from(u.int_in_range(1..=100u8)?)),
    })
}

const TEXTS: &[&str] = &[
    "",
    "ok",
    "héllo wörld",
    "exactly twenty-four byte",
    "twenty-five bytes exactly",
    "quote \" nul \0 newline \n",
    "日本語のテキスト 🦀",
];

fn text(u: &mut Unstructured<'_>) -> Result<Text> {
    if u.ratio(1, 8)? {
        let s: &str = u.arbitrary()?;
        return Ok(Text::from(s));
    }
    Ok(Text::from(*u.choose(TEXTS)?))
}

/// A call id from a pool of three, so that calls, results and messages name each other; now and
/// then another one.
fn call_id(u: &mut Unstructured<'_>) -> Result<CallId> {
    Ok(match u.int_in_range(0..=7u8)? {
        0..=2 => CallId::new("call-a"),
        3..=4 => CallId::new("call-b"),
        5..=6 => CallId::new("call-c"),
        _ => CallId::new(text(u)?),
    })
}

fn turn(u: &mut Unstructured<'_>, log: &Accepted) -> Result<TurnNo> {
    let s = &log.structure;
    let aim = s.open_turn().unwrap_or(s.last_turn().wrapping_add(1));
    Ok(match u.int_in_range(0..=15u8)? {
        0 => u.arbitrary()?,
        1 => aim.wrapping_add(1),
        2 => aim.wrapping_sub(1),
        3 => s.last_turn(),
        _ => aim,
    })
}

fn step(u: &mut Unstructured<'_>, log: &Accepted) -> Result<StepNo> {
    let aim = log
        .structure
        .open_step()
        .unwrap_or(log.last_step.wrapping_add(1));
    Ok(match u.int_in_range(0..=15u8)? {
        0 => u.arbitrary()?,
        1 => aim.wrapping_add(1),
        2 => aim.wrapping_sub(1),
        _ => aim,
    })
}

fn message_id(u: &mut Unstructured<'_>) -> Result<MessageId> {
    Ok(MessageId::from_u128(u.arbitrary()?))
}

fn block(u: &mut Unstructured<'_>, depth: u32) -> Result<ContentBlock> {
    Ok(match u.int_in_range(0..=5u8)? {
        0 | 1 => ContentBlock::Text { text: text(u)? },
        2 => ContentBlock::Reasoning { text: text(u)? },
        3 | 4 => ContentBlock::ToolCall {
            id: call_id(u)?,
            name: text(u)?,
            arguments: text(u)?,
        },
        _ if depth == 0 => ContentBlock::Image {
            media_type: Text::from_static("image/png"),
            attachment: text(u)?,
        },
        _ => ContentBlock::ToolResult {
            tool_call_id: call_id(u)?,
            content: blocks(u, depth - 1)?,
            is_error: u.arbitrary()?,
        },
    })
}

fn blocks(u: &mut Unstructured<'_>, depth: u32) -> Result<Vec<ContentBlock>> {
    let n = u.int_in_range(0..=3u8)?;
    (0..n).map(|_| block(u, depth)).collect()
}

fn reason(u: &mut Unstructured<'_>) -> Result<TurnEndReason> {
    Ok(match u.int_in_range(0..=8u8)? {
        0..=2 => TurnEndReason::Completed,
        3 => TurnEndReason::Aborted {
            cause: match u.int_in_range(0..=2u8)? {
                0 => AbortCause::User,
                1 => AbortCause::Parent,
                _ => AbortCause::Disposed,
            },
        },
        4 => TurnEndReason::Aborted {
            cause: AbortCause::Hook { reason: text(u)? },
        },
        5 => TurnEndReason::Blocked,
        6 => TurnEndReason::Error(Box::new(TurnError {
            message: text(u)?,
            code: text(u)?,
            status: u.arbitrary()?,
            retry_after_ms: u.arbitrary()?,
            request_id: None,
        })),
        7 => TurnEndReason::MaxTokens,
        _ => TurnEndReason::Interrupted,
    })
}

fn tool_result(u: &mut Unstructured<'_>, log: &Accepted) -> Result<EventBody> {
    let (turn, step) = (turn(u, log)?, step(u, log)?);
    let id = call_id(u)?;
    let answered = if u.ratio(1, 8)? {
        call_id(u)?
    } else {
        id.clone()
    };
    let content = vec![ContentBlock::ToolResult {
        tool_call_id: answered,
        content: blocks(u, 1)?,
        is_error: u.arbitrary()?,
    }];
    let error = match u.int_in_range(0..=5u8)? {
        0 | 1 => None,
        2 => Some(TOOL_NOT_STARTED),
        3 => Some(TOOL_OUTCOME_UNKNOWN),
        _ => Some("TOOL_FAILED"),
    }
    .map(|code| ToolError {
        name: Text::from_static("Failure"),
        code: Text::from_static(code),
    });
    let message = Message {
        id: message_id(u)?,
        role: if u.ratio(1, 16)? {
            Role::Assistant
        } else {
            Role::User
        },
        content,
        source: MessageSource::Tool { call_id: id },
    };
    Ok(ToolResult {
        turn,
        step,
        message,
        error,
    }
    .into())
}

fn chunk(u: &mut Unstructured<'_>) -> Result<StreamChunk> {
    let index = u.int_in_range(0..=3u32)?;
    Ok(match u.int_in_range(0..=4u8)? {
        0 | 1 => StreamChunk::TextDelta {
            index,
            text: text(u)?,
        },
        2 => StreamChunk::ToolCallDelta(Box::new(ToolCallDelta {
            index,
            id: call_id(u)?,
            name: Some(text(u)?),
            arguments_delta: text(u)?,
        })),
        3 => StreamChunk::Usage(Box::new(Usage {
            input_tokens: u.arbitrary()?,
            output_tokens: u.arbitrary()?,
            cache_read_tokens: u.arbitrary()?,
        })),
        _ => StreamChunk::Finish {
            reason: match u.int_in_range(0..=2u8)? {
                0 => FinishReason::Stop,
                1 => FinishReason::ToolCalls,
                _ => FinishReason::MaxTokens,
            },
        },
    })
}

/// One event body chosen by the bytes, its numbers aimed at where the log stands.
fn aimed_body(u: &mut Unstructured<'_>, log: &Accepted) -> Result<EventBody> {
    Ok(match u.int_in_range(0..=14u8)? {
        0 => TurnStart {
            turn: turn(u, log)?,
        }
        .into(),
        1 => TurnEnd {
            turn: turn(u, log)?,
            reason: reason(u)?,
        }
        .into(),
        2 => StepStart {
            turn: turn(u, log)?,
            step: step(u, log)?,
        }
        .into(),
        3 => StepEnd {
            turn: turn(u, log)?,
            step: step(u, log)?,
        }
        .into(),
        4 | 5 => {
            let (turn, step) = (turn(u, log)?, step(u, log)?);
            let source = if u.ratio(1, 16)? {
                MessageSource::Model {
                    endpoint: Text::default(),
                    model: text(u)?,
                }
            } else {
                MessageSource::Model {
                    endpoint: Text::from_static("scripted"),
                    model: text(u)?,
                }
            };
            AssistantMessage {
                turn,
                step,
                message: Message {
                    id: message_id(u)?,
                    role: Role::Assistant,
                    content: blocks(u, 1)?,
                    source,
                },
                usage: None,
                interrupted: u.arbitrary()?,
            }
            .into()
        }
        6 | 7 => ToolCall {
            turn: turn(u, log)?,
            step: step(u, log)?,
            call_id: call_id(u)?,
            name: text(u)?,
            arguments: text(u)?,
        }
        .into(),
        8 | 9 => tool_result(u, log)?,
        10 => AssistantChunk {
            turn: turn(u, log)?,
            step: step(u, log)?,
            chunk: chunk(u)?,
        }
        .into(),
        11 => Message {
            id: message_id(u)?,
            role: Role::User,
            content: blocks(u, 2)?,
            source: MessageSource::User,
        }
        .into(),
        12 => InboxSpliced {
            target: *u.choose(&[InboxTarget::NextTurn, InboxTarget::NextStep])?,
            start: u.int_in_range(0..=2)?,
            removed: u.int_in_range(0..=2)?,
            inserted: Vec::new(),
            canceled: u.arbitrary()?,
        }
        .into(),
        13 => {
            let seq = log.structure.next_seq();
            SessionLineage {
                // Never the session itself.
                parent: SessionId::from_u128(
                    SESSION.as_u128() ^ (1 + u128::from(u.arbitrary::<u8>()?)),
                ),
                seed_len: if u.ratio(1, 8)? { u.arbitrary()? } else { seq },
                seed_digest: Digest(u.arbitrary()?),
                delegation_depth: u.int_in_range(0..=3)?,
            }
            .into()
        }
        // Every variant, with awkward values, from the test kit.
        _ => random_event_body(&mut SplitMix64::new(u.arbitrary()?)),
    })
}
