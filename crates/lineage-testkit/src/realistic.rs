//! A deterministic, realistic session log.

use lineage_log::{
    AssistantChunk, AssistantMessage, BlockType, CallId, ContentBlock, Event, EventBody,
    FinishReason, InboxSpliced, InboxTarget, Message, MessageId, MessageSource, Role, StepEnd,
    StepNo, StepStart, StreamChunk, Text, ToolCall, ToolCallDelta, ToolResult, TurnEnd,
    TurnEndReason, TurnNo, TurnStart, Usage,
};

use crate::words::{delta, sentence, word};
use crate::{LogBuilder, SplitMix64, ev};

const TOOLS: &[&str] = &["read_file", "grep", "list_dir", "run_shell"];

/// Hands out message ids derived from the seed and a counter: deterministic, distinct in a log.
struct Ids {
    seed: u64,
    next: u64,
}

impl Ids {
    fn next(&mut self) -> MessageId {
        self.next += 1;
        MessageId::derived(&[
            b"lineage-testkit/realistic",
            &self.seed.to_le_bytes(),
            &self.next.to_le_bytes(),
        ])
    }
}

/// A valid, balanced session log of whole turns that look like a coding agent's: at least
/// `target_events` events (and fewer than one turn more), seqs `0..n`, deterministic in `seed`.
///
/// Each turn is: the prompt queued (`inbox/spliced`, next-turn insert), `turn/start`, the prompt
/// claimed (`inbox/spliced`, one removed, not cancelled), then two or three steps, then
/// `turn/end {Completed}`. A step is `step/start`, (in the first step) the prompt as `user/message`
/// of a few hundred bytes, dozens of `assistant/chunk` text deltas of a few to twenty bytes, the
/// assembled `assistant/message` from a model source, and in all but the last step one or two
/// `tool/call`s each answered by a `tool/result` of about 1 KiB, then `step/end`. Times grow by a few
/// milliseconds per event. Message ids are derived from the seed, never from the clock, so the same
/// seed gives the same log byte for byte. `target_events == 0` gives the empty log.
pub fn realistic_session(seed: u64, target_events: usize) -> Vec<Event> {
    let mut rng = SplitMix64::new(seed);
    let start_ms = 1_750_000_000_000 + rng.below(86_400_000 * 365) as i64;
    let mut session = Realistic {
        b: LogBuilder::new(start_ms),
        rng,
        ids: Ids { seed, next: 0 },
    };
    let mut turn: TurnNo = 0;
    while session.b.len() < target_events {
        turn += 1;
        session.turn(turn);
    }
    session.b.into_events()
}

struct Realistic {
    b: LogBuilder,
    rng: SplitMix64,
    ids: Ids,
}

impl Realistic {
    fn push(&mut self, body: impl Into<EventBody>) {
        let dt = self.rng.between(1, 6) as i64;
        self.b.advance(dt);
        self.b.push(body);
    }

    fn chunk(&mut self, turn: TurnNo, step: StepNo, chunk: StreamChunk) {
        self.push(AssistantChunk { turn, step, chunk });
    }

    fn turn(&mut self, turn: TurnNo) {
        let prompt_len = 200 + self.rng_below(300);
        let prompt = Message {
            id: self.ids.next(),
            role: Role::User,
            content: vec![ContentBlock::text(sentence(&mut self.rng, prompt_len))],
            source: MessageSource::User,
        };
        self.push(InboxSpliced {
            target: InboxTarget::NextTurn,
            start: 0,
            removed: 0,
            inserted: vec![prompt.clone()],
            canceled: false,
        });
        self.push(TurnStart { turn });
        self.push(InboxSpliced {
            target: InboxTarget::NextTurn,
            start: 0,
            removed: 1,
            inserted: Vec::new(),
            canceled: false,
        });
        let steps: StepNo = 2 + self.rng.below(2) as StepNo;
        let mut prompt = Some(prompt);
        for step in 1..=steps {
            self.push(StepStart { turn, step });
            if let Some(prompt) = prompt.take() {
                self.push(EventBody::from(prompt));
            }
            self.step_body(turn, step, step == steps);
            self.push(StepEnd { turn, step });
        }
        self.push(TurnEnd {
            turn,
            reason: TurnEndReason::Completed,
        });
    }

    fn rng_below(&mut self, n: u64) -> usize {
        self.rng.below(n) as usize
    }

    /// The model's stream, its assembled message, and (unless `last`) its tool calls and results.
    fn step_body(&mut self, turn: TurnNo, step: StepNo, last: bool) {
        self.chunk(
            turn,
            step,
            StreamChunk::BlockStart {
                index: 0,
                block_type: BlockType::Text,
            },
        );
        let mut text = String::new();
        for _ in 0..self.rng.between(20, 60) {
            let piece = delta(&mut self.rng, 3, 20);
            text.push_str(&piece);
            self.chunk(
                turn,
                step,
                StreamChunk::TextDelta {
                    index: 0,
                    text: Text::from(piece),
                },
            );
        }
        let text_block = ContentBlock::text(text);
        self.chunk(
            turn,
            step,
            StreamChunk::BlockEnd {
                index: 0,
                block: Box::new(text_block.clone()),
            },
        );
        let mut content = vec![text_block];
        let calls = if last {
            0
        } else {
            1 + self.rng.below(2) as u32
        };
        let mut requested = Vec::new();
        for k in 0..calls {
            let index = k + 1;
            let call_id = format!("call_{turn}_{step}_{k}");
            let name = self.rng.pick(TOOLS).copied().unwrap_or("read_file");
            let arguments = self.arguments(name);
            self.chunk(
                turn,
                step,
                StreamChunk::BlockStart {
                    index,
                    block_type: BlockType::ToolCall,
                },
            );
            self.chunk(
                turn,
                step,
                StreamChunk::ToolCallDelta(Box::new(ToolCallDelta {
                    index,
                    id: CallId::new(call_id.as_str()),
                    name: Some(Text::from(name)),
                    arguments_delta: Text::from(arguments.as_str()),
                })),
            );
            let block = ev::call_block(&call_id, name, &arguments);
            self.chunk(
                turn,
                step,
                StreamChunk::BlockEnd {
                    index,
                    block: Box::new(block.clone()),
                },
            );
            content.push(block);
            requested.push((call_id, name, arguments));
        }
        let usage = Usage {
            input_tokens: 2_000 + self.rng.below(30_000),
            output_tokens: 50 + self.rng.below(800),
            cache_read_tokens: Some(self.rng.below(20_000)),
        };
        self.chunk(turn, step, StreamChunk::Usage(Box::new(usage)));
        let reason = if last {
            FinishReason::Stop
        } else {
            FinishReason::ToolCalls
        };
        self.chunk(turn, step, StreamChunk::Finish { reason });
        let message = Message {
            id: self.ids.next(),
            role: Role::Assistant,
            content,
            source: ev::model_source(),
        };
        self.push(AssistantMessage {
            turn,
            step,
            message,
            usage: Some(usage),
            interrupted: false,
        });
        for (call_id, name, arguments) in requested {
            self.push(ToolCall {
                turn,
                step,
                call_id: CallId::new(call_id.as_str()),
                name: Text::from(name),
                arguments: Text::from(arguments),
            });
            let output = self.tool_output();
            let id = self.ids.next();
            self.push(ToolResult {
                turn,
                step,
                message: ev::tool_result_message(id, &call_id, &output, false),
                error: None,
            });
        }
    }

    /// Raw JSON arguments for `tool` (ASCII words only, so nothing needs escaping).
    fn arguments(&mut self, tool: &str) -> String {
        let a = word(&mut self.rng);
        let b = word(&mut self.rng);
        let n = self.rng.below(90) + 1;
        match tool {
            "grep" => format!(r#"{{"pattern":"{a}_{b}","path":"src","max_results":{n}}}"#),
            "list_dir" => format!(r#"{{"path":"crates/{a}/src","depth":{}}}"#, n % 3 + 1),
            "run_shell" => format!(r#"{{"command":"cargo test -p {a}-{b}","timeout_s":{n}}}"#),
            _ => format!(
                r#"{{"path":"src/{a}/{b}_{n}.rs","start_line":{n},"end_line":{}}}"#,
                n + 40
            ),
        }
    }

    /// About 1 KiB of tool output: lines that look like search hits.
    fn tool_output(&mut self) -> String {
        let target = self.rng.between(900, 1200) as usize;
        let mut out = String::with_capacity(target + 80);
        while out.len() < target {
            let file = word(&mut self.rng);
            let line = self.rng.below(500) + 1;
            let len = 30 + self.rng_below(30);
            let text = sentence(&mut self.rng, len);
            out.push_str(&format!("src/{file}.rs:{line}: {text}\n"));
        }
        out
    }
}
