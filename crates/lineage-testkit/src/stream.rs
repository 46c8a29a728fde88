//! What a writer process appends in the crash tests and the crash harness: an endless, seeded
//! stream of valid turns continuing a balanced log, which a checker can regenerate exactly.

use std::collections::VecDeque;

use lineage_log::{AbortCause, Event, EventBody, MessageId, TurnEndReason, TurnNo};

use crate::{SplitMix64, ev, realistic_session};

/// The time of the event at seq 0 of a [`TurnStream`]; later events are 3 ms apart.
pub const STREAM_T0: i64 = 1_750_000_000_000;

/// Continues a balanced log of `next_seq` events whose last turn was `next_turn - 1`. Most turns
/// are a coding agent's (steps, dozens of stream chunks, tool calls with ~1 KiB results, from
/// [`realistic_session`]); some are short, and some of those end aborted. The same arguments always
/// give the same events, so another process can regenerate what a writer wrote. Every event it
/// yields is valid where it stands in the continued log, and every turn it starts it closes.
pub struct TurnStream {
    rng: SplitMix64,
    next_seq: u64,
    next_turn: TurnNo,
    ready: VecDeque<Event>,
}

impl TurnStream {
    /// A stream continuing at `next_seq` with turn `next_turn`.
    pub fn new(seed: u64, next_seq: u64, next_turn: TurnNo) -> TurnStream {
        TurnStream {
            rng: SplitMix64::new(seed),
            next_seq,
            next_turn,
            ready: VecDeque::new(),
        }
    }

    /// The next `n` events (a batch may end inside a turn).
    pub fn take(&mut self, n: usize) -> Vec<Event> {
        while self.ready.len() < n {
            self.turn();
        }
        self.ready.drain(..n).collect()
    }

    /// The rest of the turn under way, or a whole turn when none is: a batch that ends balanced.
    pub fn rest_of_turn(&mut self) -> Vec<Event> {
        if self.ready.is_empty() {
            self.turn();
        }
        self.ready.drain(..).collect()
    }

    fn turn(&mut self) {
        let turn = self.next_turn;
        self.next_turn += 1;
        let seq = self.next_seq;
        let events = if self.rng.percent(30) {
            let id = |salt: u64| {
                MessageId::derived(&[
                    b"lineage-testkit/turn-stream",
                    &seq.to_le_bytes(),
                    &salt.to_le_bytes(),
                ])
            };
            let mut bodies = vec![
                ev::turn_start(turn),
                ev::step_start(turn, 1),
                ev::user(id(1), &format!("short question {turn}")),
            ];
            for k in 0..self.rng.below(8) {
                bodies.push(ev::text_delta(turn, 1, &format!("piece {k} ")));
            }
            bodies.push(ev::assistant_text(turn, 1, id(2), "short answer"));
            bodies.push(ev::step_end(turn, 1));
            bodies.push(if self.rng.percent(25) {
                ev::turn_end(
                    turn,
                    TurnEndReason::Aborted {
                        cause: AbortCause::User,
                    },
                )
            } else {
                ev::turn_completed(turn)
            });
            bodies
                .into_iter()
                .enumerate()
                .map(|(i, body)| at(seq + i as u64, body))
                .collect()
        } else {
            // One realistic turn (numbered 1, seqs from 0), renumbered to continue this log.
            realistic_session(self.rng.next_u64(), 1)
                .into_iter()
                .enumerate()
                .map(|(i, event)| at(seq + i as u64, renumbered(event.body, turn)))
                .collect::<Vec<_>>()
        };
        self.next_seq += events.len() as u64;
        self.ready.extend(events);
    }
}

/// `body` as the event at `seq`, at the stream's time for that seq.
fn at(seq: u64, body: EventBody) -> Event {
    Event::new(seq, STREAM_T0 + 3 * seq as i64, body)
}

/// `body` of turn 1 moved to turn `turn`.
fn renumbered(mut body: EventBody, turn: TurnNo) -> EventBody {
    match &mut body {
        EventBody::TurnStart(t) => t.turn = turn,
        EventBody::TurnEnd(t) => t.turn = turn,
        EventBody::StepStart(s) => s.turn = turn,
        EventBody::StepEnd(s) => s.turn = turn,
        EventBody::AssistantChunk(c) => c.turn = turn,
        EventBody::AssistantMessage(m) => m.turn = turn,
        EventBody::ToolCall(c) => c.turn = turn,
        EventBody::ToolResult(r) => r.turn = turn,
        _ => {}
    }
    body
}

/// The last turn opened in `events` (0 when none), so a [`TurnStream`] can continue after it.
pub fn last_turn(events: &[Event]) -> TurnNo {
    events
        .iter()
        .rev()
        .find_map(|e| match &e.body {
            EventBody::TurnStart(t) => Some(t.turn),
            _ => None,
        })
        .unwrap_or(0)
}
