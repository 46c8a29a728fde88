//! Proptest strategies: random valid logs, random batch partitions, random events.

use lineage_log::{
    ApprovalPolicy, AssistantChunk, AssistantMessage, CallId, Chain, ContentBlock, Custom,
    DescriptorMode, Encoder, Event, EventBody, EventKind, InboxSpliced, InboxTarget, Message,
    MessageId, MessageSource, Opaque, PolicySource, Role, SessionId, SessionLineage, StepEnd,
    StepNo, StepStart, StreamChunk, SubagentDescriptor, TOOL_NOT_STARTED, Text, ToolCall,
    ToolError, ToolFilter, ToolResult, TurnEnd, TurnEndReason, TurnNo, TurnStart,
};
use proptest::collection::vec;
use proptest::prelude::*;

use crate::random::{
    OPAQUE_TAG_BASE, random_chunk, random_event_body, random_reason, random_string, random_usage,
};
use crate::words::{delta, sentence, word};
use crate::{LogBuilder, SplitMix64, ev};

/// Random valid logs of at most `max_turns` turns.
///
/// Every generated log, and every prefix of it, passes `lineage_log::check_seed`: the generator is
/// a state machine that only ever emits an event the log's rules admit where it lands (see
/// [`valid_log_from_ops`]). The mix covers turns of steps with stream chunks, assistant messages
/// (some empty, some asking for tool calls), calls with and without a `tool/call` record, results for
/// some of them (ordinary, failed, and synthetic `TOOL_NOT_STARTED`), steps and turns left with
/// unanswered calls, every turn-end reason, user messages and inbox splices inside and between
/// turns, `custom`, `approval/policy`, `sandbox/mode`, `subagent/descriptor`, opaque records, and
/// `session/lineage` events at balanced points whose `seed_digest` is the running digest of the
/// events before them. About half the logs end inside an open turn (unbalanced); the rest close it.
/// Shrinking removes and simplifies operations, so a shrunk log is still valid.
pub fn arb_valid_log(max_turns: u32) -> impl Strategy<Value = Vec<Event>> {
    (start_time(), ops(max_turns), any::<bool>()).prop_map(move |(start_ms, ops, close_tail)| {
        valid_log_from_ops(start_ms, &ops, max_turns, close_tail)
    })
}

/// Like [`arb_valid_log`], but every log is balanced: an open tail turn is closed normally.
pub fn arb_balanced_log(max_turns: u32) -> impl Strategy<Value = Vec<Event>> {
    (start_time(), ops(max_turns))
        .prop_map(move |(start_ms, ops)| valid_log_from_ops(start_ms, &ops, max_turns, true))
}

fn start_time() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => 1_600_000_000_000i64..1_900_000_000_000,
        1 => -10_000i64..10_000,
        1 => any::<i64>(),
    ]
}

fn ops(max_turns: u32) -> impl Strategy<Value = Vec<u64>> {
    // About forty events per turn, so the turn cap is reached in some logs and not in others.
    let max_ops = 8 + 40 * (max_turns as usize).min(1_000);
    vec(any::<u64>(), 0..=max_ops)
}

/// Random batch sizes that add up to exactly `len`: sometimes one batch, sometimes one event per
/// batch, usually a random mix that may include empty batches.
pub fn arb_partition(len: usize) -> impl Strategy<Value = Vec<usize>> {
    let cuts = vec(0..=len, 0..=len.min(32) + 1).prop_map(move |mut cuts| {
        cuts.sort_unstable();
        let mut sizes = Vec::with_capacity(cuts.len() + 1);
        let mut previous = 0;
        for cut in cuts {
            sizes.push(cut - previous);
            previous = cut;
        }
        sizes.push(len - previous);
        sizes
    });
    prop_oneof![
        1 => Just(vec![len]),
        1 => Just(vec![1; len]),
        6 => cuts,
    ]
}

/// `events` cut into consecutive batches of `sizes`. Events left over when `sizes` adds up to less
/// than `events.len()` form one last batch; sizes past the end give empty batches.
pub fn split_batches(events: &[Event], sizes: &[usize]) -> Vec<Vec<Event>> {
    let mut batches = Vec::with_capacity(sizes.len() + 1);
    let mut rest = events;
    for &size in sizes {
        let (batch, tail) = rest.split_at(size.min(rest.len()));
        batches.push(batch.to_vec());
        rest = tail;
    }
    if !rest.is_empty() {
        batches.push(rest.to_vec());
    }
    batches
}

/// Random single events of every variant (see [`random_event_body`]) with any seq and time. They
/// exercise the codec; they are not meant to form a valid log.
pub fn arb_event() -> impl Strategy<Value = Event> {
    (any::<u64>(), any::<u64>(), any::<i64>()).prop_map(|(seed, seq, time_ms)| {
        Event::new(seq, time_ms, random_event_body(&mut SplitMix64::new(seed)))
    })
}

/// Every `k` in `0..=events.len()` such that `events[..k]` is balanced (no turn open at its end):
/// the seed lengths a fork may take.
pub fn balanced_cuts(events: &[Event]) -> Vec<usize> {
    let mut cuts = vec![0];
    let mut open = false;
    for (i, event) in events.iter().enumerate() {
        match event.kind() {
            EventKind::TurnStart => open = true,
            EventKind::TurnEnd => open = false,
            _ => {}
        }
        if !open {
            cuts.push(i + 1);
        }
    }
    cuts
}

/// The valid log that the operations `ops` produce, starting at `start_ms`, with at most
/// `max_turns` turns; when `close_tail` is set an open tail turn is closed normally (every started
/// call answered, the step ended, the turn completed).
///
/// Each operation seeds its own [`SplitMix64`] and picks one event among those the rules admit in
/// the current state, weighted so that turns look like an agent's. The same inputs give the same
/// log byte for byte.
pub fn valid_log_from_ops(
    start_ms: i64,
    ops: &[u64],
    max_turns: u32,
    close_tail: bool,
) -> Vec<Event> {
    let mut machine = Machine::new(start_ms, max_turns);
    for &op in ops {
        machine.step(&mut SplitMix64::new(op));
    }
    if close_tail {
        machine.close(&mut SplitMix64::new(ops.len() as u64));
    }
    machine.b.into_events()
}

#[derive(Clone, Copy, Debug)]
enum Action {
    TurnStart,
    TurnEnd,
    StepStart,
    StepEnd,
    UserMessage,
    InboxQueue,
    InboxTake,
    InboxNextStep,
    Custom,
    Approval,
    Sandbox,
    Descriptor,
    Lineage,
    Opaque,
    Chunk,
    Assistant,
    CallAsked,
    CallUnasked,
    Result,
    NotStarted,
}

/// The generator's view of the log. Invariants, kept by every action:
/// - `open_turn` is the turn the log's structure has open, and `turns` the last turn opened;
/// - `in_step` is whether a step is open, and `step` the last step opened in the open turn;
/// - `asked` holds calls an assistant message of the open step asked for that have neither a
///   `tool/call` nor a result; `started` holds calls with a `tool/call` in the open step and no
///   result (exactly the calls a non-synthetic `tool/result` may answer);
/// - `queued` is the length of the next-turn inbox, so a splice never removes more than it holds.
struct Machine {
    b: LogBuilder,
    max_turns: u32,
    turns: TurnNo,
    open_turn: Option<TurnNo>,
    step: StepNo,
    in_step: bool,
    asked: Vec<CallId>,
    started: Vec<CallId>,
    calls: u64,
    messages: u64,
    queued: u32,
}

impl Machine {
    fn new(start_ms: i64, max_turns: u32) -> Self {
        Machine {
            b: LogBuilder::new(start_ms),
            max_turns,
            turns: 0,
            open_turn: None,
            step: 0,
            in_step: false,
            asked: Vec::new(),
            started: Vec::new(),
            calls: 0,
            messages: 0,
            queued: 0,
        }
    }

    /// The actions the rules admit now, with their weights.
    fn options(&self) -> Vec<(u32, Action)> {
        let mut options = vec![
            (2, Action::UserMessage),
            (1, Action::Custom),
            (1, Action::Approval),
            (1, Action::Sandbox),
            (1, Action::Opaque),
            (2, Action::InboxQueue),
        ];
        if self.queued > 0 {
            options.push((2, Action::InboxTake));
        }
        match (self.open_turn, self.in_step) {
            (None, _) => {
                if self.turns < self.max_turns {
                    options.push((8, Action::TurnStart));
                }
                options.push((1, Action::Descriptor));
                options.push((1, Action::Lineage));
            }
            (Some(_), false) => {
                options.push((10, Action::StepStart));
                options.push((3, Action::TurnEnd));
                options.push((1, Action::InboxNextStep));
            }
            (Some(_), true) => {
                options.push((16, Action::Chunk));
                options.push((6, Action::Assistant));
                options.push((1, Action::CallUnasked));
                options.push((3, Action::StepEnd));
                options.push((1, Action::InboxNextStep));
                if !self.asked.is_empty() {
                    options.push((6, Action::CallAsked));
                    options.push((1, Action::NotStarted));
                }
                if !self.started.is_empty() {
                    options.push((8, Action::Result));
                }
            }
        }
        options
    }

    fn step(&mut self, rng: &mut SplitMix64) {
        let options = self.options();
        let weights: Vec<u32> = options.iter().map(|(w, _)| *w).collect();
        // `options` is never empty and its weights are positive, so a choice always exists.
        let Some(choice) = rng.weighted(&weights) else {
            return;
        };
        self.apply(options[choice].1, rng);
    }

    fn push(&mut self, rng: &mut SplitMix64, body: impl Into<EventBody>) {
        self.b.advance(rng.below(20) as i64);
        self.b.push(body);
    }

    fn message_id(&mut self) -> MessageId {
        self.messages += 1;
        MessageId::derived(&[b"lineage-testkit/arb", &self.messages.to_le_bytes()])
    }

    fn new_call(&mut self) -> CallId {
        self.calls += 1;
        CallId::new(format!("call-{}", self.calls))
    }

    fn turn(&self) -> TurnNo {
        self.open_turn.unwrap_or(self.turns)
    }

    fn some_text(&mut self, rng: &mut SplitMix64) -> String {
        if rng.percent(15) {
            random_string(rng)
        } else {
            let len = rng.between(1, 300) as usize;
            sentence(rng, len)
        }
    }

    fn user_message(&mut self, rng: &mut SplitMix64) -> Message {
        let source = match rng.below(10) {
            0 => MessageSource::Coordinator {
                sender: SessionId::from_u128(rng.next_u128()),
            },
            1 => MessageSource::SubagentReport {
                sender: SessionId::from_u128(rng.next_u128()),
            },
            2 => MessageSource::SubagentSettled {
                sender: SessionId::from_u128(rng.next_u128()),
                summary: Text::from(sentence(rng, 20)),
            },
            3 => MessageSource::Plugin {
                name: Text::from(word(rng)),
            },
            _ => MessageSource::User,
        };
        let text = self.some_text(rng);
        Message {
            id: self.message_id(),
            role: Role::User,
            content: vec![ContentBlock::text(text)],
            source,
        }
    }

    fn answer(&mut self, rng: &mut SplitMix64, call_id: &CallId) {
        let (turn, step) = (self.turn(), self.step);
        let failed = rng.percent(20);
        let text = self.some_text(rng);
        let id = self.message_id();
        let error = failed.then(|| ToolError {
            name: Text::from("ToolFailed"),
            code: Text::from("TOOL_FAILED"),
        });
        let body = EventBody::from(ToolResult {
            turn,
            step,
            message: ev::tool_result_message(id, call_id.as_str(), &text, failed),
            error,
        });
        self.push(rng, body);
    }

    fn apply(&mut self, action: Action, rng: &mut SplitMix64) {
        let (turn, step) = (self.turn(), self.step);
        match action {
            Action::TurnStart => {
                self.turns += 1;
                self.open_turn = Some(self.turns);
                self.step = 0;
                self.in_step = false;
                self.asked.clear();
                self.started.clear();
                let body = EventBody::from(TurnStart { turn: self.turns });
                self.push(rng, body);
            }
            Action::TurnEnd => {
                let reason = if rng.percent(60) {
                    TurnEndReason::Completed
                } else {
                    random_reason(rng)
                };
                self.open_turn = None;
                let body = EventBody::from(TurnEnd { turn, reason });
                self.push(rng, body);
            }
            Action::StepStart => {
                self.step += 1;
                self.in_step = true;
                self.asked.clear();
                self.started.clear();
                let body = EventBody::from(StepStart {
                    turn,
                    step: self.step,
                });
                self.push(rng, body);
            }
            Action::StepEnd => {
                // Unanswered calls stay unanswered: a step may end with calls pending.
                self.in_step = false;
                self.asked.clear();
                self.started.clear();
                let body = EventBody::from(StepEnd { turn, step });
                self.push(rng, body);
            }
            Action::UserMessage => {
                let message = self.user_message(rng);
                let body = EventBody::from(message);
                self.push(rng, body);
            }
            Action::InboxQueue => {
                let start = rng.between(0, u64::from(self.queued)) as u32;
                let inserted: Vec<Message> = (0..rng.between(1, 2))
                    .map(|_| self.user_message(rng))
                    .collect();
                self.queued += inserted.len() as u32;
                let body = EventBody::from(InboxSpliced {
                    target: InboxTarget::NextTurn,
                    start,
                    removed: 0,
                    inserted,
                    canceled: false,
                });
                self.push(rng, body);
            }
            Action::InboxTake => {
                let start = rng.below(u64::from(self.queued)) as u32;
                let removed = rng.between(1, u64::from(self.queued - start)) as u32;
                self.queued -= removed;
                let body = EventBody::from(InboxSpliced {
                    target: InboxTarget::NextTurn,
                    start,
                    removed,
                    inserted: Vec::new(),
                    canceled: rng.percent(30),
                });
                self.push(rng, body);
            }
            Action::InboxNextStep => {
                let inserted = vec![self.user_message(rng)];
                let body = EventBody::from(InboxSpliced {
                    target: InboxTarget::NextStep,
                    start: 0,
                    removed: 0,
                    inserted,
                    canceled: false,
                });
                self.push(rng, body);
            }
            Action::Custom => {
                let type_name = one_of(
                    rng,
                    &["todo/write", "plan/mode", "hook/invoked", "session/title"],
                );
                let payload = format!(r#"{{"{}":{}}}"#, word(rng), rng.below(1000));
                let body = EventBody::from(Custom {
                    type_name: Text::from(type_name),
                    payload: Text::from(payload),
                    ignorable: rng.percent(50),
                });
                self.push(rng, body);
            }
            Action::Approval => {
                let policy = one_of(rng, &[ApprovalPolicy::NEVER, "on-request", "untrusted"]);
                let body = ev::approval(policy, policy_source(rng));
                self.push(rng, body);
            }
            Action::Sandbox => {
                let mode = one_of(rng, &["read-only", "workspace-write", "danger-full-access"]);
                let body = ev::sandbox(mode, policy_source(rng));
                self.push(rng, body);
            }
            Action::Descriptor => {
                let continuable = rng.percent(50);
                let descriptor = SubagentDescriptor {
                    version: 2,
                    mode: if continuable {
                        DescriptorMode::Continuable
                    } else {
                        DescriptorMode::OneShot
                    },
                    provider: Text::from(if rng.percent(50) { "spawn" } else { "fork" }),
                    // A continuable descriptor always has a label; only it has the rest.
                    label: (continuable || rng.percent(70)).then(|| Text::from(word(rng))),
                    endpoint: continuable.then(|| Text::from(ev::PROVIDER)),
                    model: continuable.then(|| Text::from(ev::MODEL)),
                    persona: (continuable && rng.percent(30))
                        .then(|| Text::from(sentence(rng, 40))),
                    tool_filter: (continuable && rng.percent(30)).then(|| ToolFilter {
                        allow: Some(vec![Text::from("read_file"), Text::from("grep")]),
                        deny: None,
                    }),
                };
                let body = EventBody::from(descriptor);
                self.push(rng, body);
            }
            Action::Lineage => {
                // Only offered between turns: the events before it form a balanced prefix, as a
                // fork's seed does, and its digest is the running digest of exactly those records.
                let mut records = Vec::new();
                Encoder::new().encode_all(self.b.events(), &mut records);
                let mut chain = Chain::new();
                chain.update(&records);
                let lineage = SessionLineage {
                    parent: SessionId::from_u128(rng.next_u128()),
                    seed_len: self.b.next_seq(),
                    seed_digest: chain.digest(),
                    delegation_depth: rng.below(4) as u32,
                };
                let body = EventBody::from(lineage);
                self.push(rng, body);
            }
            Action::Opaque => {
                let payload: Box<[u8]> = (0..rng.below(24)).map(|_| rng.next_u64() as u8).collect();
                let tag = OPAQUE_TAG_BASE + rng.below(1_000) as u32;
                let body = EventBody::from(Opaque { tag, payload });
                self.push(rng, body);
            }
            Action::Chunk => {
                let chunk = if rng.percent(75) {
                    StreamChunk::TextDelta {
                        index: 0,
                        text: Text::from(delta(rng, 1, 20)),
                    }
                } else {
                    random_chunk(rng)
                };
                let body = EventBody::from(AssistantChunk { turn, step, chunk });
                self.push(rng, body);
            }
            Action::Assistant => {
                let mut content = Vec::new();
                if rng.percent(85) {
                    if rng.percent(30) {
                        content.push(ContentBlock::Reasoning {
                            text: Text::from(sentence(rng, 60)),
                        });
                    }
                    if rng.percent(80) {
                        let text = self.some_text(rng);
                        content.push(ContentBlock::text(text));
                    }
                    for _ in 0..rng.below(3) {
                        let id = self.new_call();
                        let name = one_of(rng, &["read_file", "grep", "run_shell"]);
                        let arguments = format!(r#"{{"path":"src/{}.rs"}}"#, word(rng));
                        content.push(ev::call_block(id.as_str(), name, &arguments));
                        self.asked.push(id);
                    }
                }
                let id = self.message_id();
                let body = EventBody::from(AssistantMessage {
                    turn,
                    step,
                    message: ev::assistant_message(id, content),
                    usage: rng.percent(60).then(|| random_usage(rng)),
                    interrupted: rng.percent(10),
                });
                self.push(rng, body);
            }
            Action::CallAsked | Action::CallUnasked => {
                let call_id = match action {
                    Action::CallAsked if !self.asked.is_empty() => {
                        let i = rng.below(self.asked.len() as u64) as usize;
                        self.asked.remove(i)
                    }
                    _ => self.new_call(),
                };
                self.started.push(call_id.clone());
                let body = EventBody::from(ToolCall {
                    turn,
                    step,
                    call_id,
                    name: Text::from("grep"),
                    arguments: Text::from(format!(r#"{{"pattern":"{}"}}"#, word(rng))),
                });
                self.push(rng, body);
            }
            Action::Result => {
                if self.started.is_empty() {
                    return;
                }
                let i = rng.below(self.started.len() as u64) as usize;
                let call_id = self.started.remove(i);
                self.answer(rng, &call_id);
            }
            Action::NotStarted => {
                if self.asked.is_empty() {
                    return;
                }
                let i = rng.below(self.asked.len() as u64) as usize;
                let call_id = self.asked.remove(i);
                let id = self.message_id();
                let message = ev::tool_result_message(id, call_id.as_str(), "not started", true);
                let body = EventBody::from(ToolResult {
                    turn,
                    step,
                    message,
                    error: Some(ToolError {
                        name: Text::from("ToolNotStarted"),
                        code: Text::from(TOOL_NOT_STARTED),
                    }),
                });
                self.push(rng, body);
            }
        }
    }

    /// Closes an open turn normally: answers every started call, ends the step, completes the turn.
    fn close(&mut self, rng: &mut SplitMix64) {
        let Some(turn) = self.open_turn else {
            return;
        };
        if self.in_step {
            for call_id in std::mem::take(&mut self.started) {
                self.answer(rng, &call_id);
            }
            self.apply(Action::StepEnd, rng);
        }
        self.open_turn = None;
        let body = EventBody::from(TurnEnd {
            turn,
            reason: TurnEndReason::Completed,
        });
        self.push(rng, body);
    }
}

/// One of `words`, which is never empty.
fn one_of(rng: &mut SplitMix64, words: &[&'static str]) -> &'static str {
    rng.pick(words).copied().expect("a choice among words")
}

fn policy_source(rng: &mut SplitMix64) -> PolicySource {
    if rng.percent(70) {
        PolicySource::Own
    } else {
        PolicySource::Delegation
    }
}
