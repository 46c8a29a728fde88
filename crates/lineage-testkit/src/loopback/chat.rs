//! Answers in the OpenAI-compatible Chat Completions format: unnamed `data:` events, each a
//! `chat.completion.chunk` with one choice, ended by `data: [DONE]`.
//!
//! A script writes exactly the events its calls name, in order, with one exception that is the
//! format's own: usage written after the finish goes where `stream_options.include_usage`
//! puts it, in a chunk with `choices: []` just before `[DONE]`.
//!
//! ```
//! use lineage_testkit::loopback::chat::Script;
//!
//! let reply = Script::new()
//!     .reasoning("The user wants a file.")
//!     .tool_call("call_1", "read", &["{\"path\":", "\"a.txt\"}"])
//!     .tool_stop()
//!     .usage(40, 12, Some(32))
//!     .reply();
//! # let _ = reply;
//! ```

use serde_json::{Value, json};

use super::script_body;

/// The end of the format's stream.
const DONE: &str = "[DONE]";

/// A Chat Completions answer, event by event.
#[derive(Clone, Debug, Default)]
pub struct Script {
    /// `(event name, data)` in order.
    events: Vec<(Option<String>, String)>,
    /// How many tool calls were written: the next call's wire `index`.
    calls: u64,
}

impl Script {
    /// An answer's opening: the chunk that names the assistant role, with empty content, as
    /// OpenAI's servers open every stream.
    pub fn new() -> Script {
        Script::default().choice(json!({"role": "assistant", "content": ""}), None)
    }

    /// One chunk of `choices[0]` with `delta` and `finish_reason`.
    fn choice(self, delta: Value, finish_reason: Option<&str>) -> Script {
        self.chunk(json!([{
            "index": 0,
            "delta": delta,
            "logprobs": null,
            "finish_reason": finish_reason,
        }]))
    }

    /// One chunk with `choices`, framed as the format's servers frame it.
    fn chunk(self, choices: Value) -> Script {
        let chunk = json!({
            "id": "chatcmpl-loopback",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": "loopback",
            "choices": choices,
        });
        self.raw(None, &chunk.to_string())
    }

    /// One text delta (`delta.content`).
    pub fn text(self, delta: &str) -> Script {
        self.choice(json!({"content": delta}), None)
    }

    /// One reasoning delta (`delta.reasoning_content`, DeepSeek's field).
    pub fn reasoning(self, delta: &str) -> Script {
        self.choice(json!({"content": null, "reasoning_content": delta}), None)
    }

    /// Tool calls in parallel: each call its own wire `index`, their entries written round-robin
    /// (every call's first entry, then every call's second part, ...), one entry per chunk. A
    /// call's first entry carries the id, the name and the first argument part; each further
    /// part is an entry of its own. No parts is one entry with empty arguments.
    pub fn parallel_tool_calls(mut self, calls: &[(&str, &str, &[&str])]) -> Script {
        let first = self.calls;
        self.calls += calls.len() as u64;
        let rounds = calls.iter().map(|c| c.2.len().max(1)).max().unwrap_or(0);
        for round in 0..rounds {
            for (at, (id, name, parts)) in calls.iter().enumerate() {
                let index = first + at as u64;
                let entry = if round == 0 {
                    json!({
                        "index": index,
                        "id": id,
                        "type": "function",
                        "function": {"name": name, "arguments": parts.first().copied().unwrap_or("")},
                    })
                } else if let Some(part) = parts.get(round) {
                    json!({"index": index, "function": {"arguments": part}})
                } else {
                    continue;
                };
                self = self.choice(json!({"tool_calls": [entry]}), None);
            }
        }
        self
    }

    /// Usage, in a chunk with `choices: []`; `cached` as `prompt_tokens_details.cached_tokens`.
    /// Written after the finish, it goes before `[DONE]`, where the format puts it.
    pub fn usage(mut self, input: u64, output: u64, cached: Option<u64>) -> Script {
        let mut usage = json!({
            "prompt_tokens": input,
            "completion_tokens": output,
            "total_tokens": input + output,
        });
        if let Some(cached) = cached {
            usage["prompt_tokens_details"] = json!({"cached_tokens": cached});
        }
        let chunk = json!({
            "id": "chatcmpl-loopback",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": "loopback",
            "choices": [],
            "usage": usage,
        });
        let event = (None, chunk.to_string());
        match self
            .events
            .iter()
            .rposition(|(name, data)| name.is_none() && data == DONE)
        {
            Some(at) => self.events.insert(at, event),
            None => self.events.push(event),
        }
        self
    }

    /// The finish chunk (an empty delta with `finish_reason`, the format's own word: `stop`,
    /// `tool_calls`, `length`, `content_filter`, ...), then `[DONE]`.
    pub fn finish(self, reason: &str) -> Script {
        self.choice(json!({}), Some(reason)).raw(None, DONE)
    }

    /// Finishes with `stop`.
    pub fn stop(self) -> Script {
        self.finish("stop")
    }

    /// Finishes with `tool_calls`.
    pub fn tool_stop(self) -> Script {
        self.finish("tool_calls")
    }

    /// A mid-stream failure: a chunk holding only `error`, with `kind` as its type.
    pub fn error(self, kind: &str, message: &str) -> Script {
        self.raw(None, &error_body(kind, message))
    }

    /// The events written so far, framed as server-sent events.
    pub fn body(&self) -> Vec<u8> {
        script_body(&self.events)
    }
}

script_calls!();

/// The format's JSON error body (for `Reply::Status`, and as the mid-stream error chunk):
/// `{"error": {"message", "type", "param", "code"}}`.
pub fn error_body(kind: &str, message: &str) -> String {
    json!({
        "error": {"message": message, "type": kind, "param": null, "code": null},
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(script: &Script) -> Vec<String> {
        String::from_utf8(script.body())
            .expect("UTF-8")
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn usage_after_the_finish_goes_before_done() {
        let script = Script::new().text("hi").stop().usage(3, 1, None);
        let events = data(&script);
        assert_eq!(events.len(), 5);
        assert!(events[3].contains("\"usage\""), "{}", events[3]);
        assert_eq!(events[4], "data: [DONE]");
    }

    #[test]
    fn parallel_calls_interleave_round_robin_and_only_first_entries_carry_ids() {
        let script = Script::default()
            .parallel_tool_calls(&[("a", "read", &["{", "}"]), ("b", "list", &["{}"])]);
        let events = data(&script);
        assert_eq!(events.len(), 3);
        assert!(events[0].contains("\"id\":\"a\"") && events[0].contains("\"index\":0"));
        assert!(events[1].contains("\"id\":\"b\"") && events[1].contains("\"index\":1"));
        assert!(!events[2].contains("\"id\":\"a\"") && events[2].contains("\"arguments\":\"}\""));
    }

    #[test]
    fn raw_events_keep_their_name() {
        let script = Script::default().raw(Some("ping"), "{}");
        assert_eq!(script.body(), b"event: ping\ndata: {}\n\n".to_vec());
    }
}
