//! Scripts of the Anthropic Messages format: answers built event by event, framed as the format
//! frames them (named events, JSON data whose `type` repeats the name).
//!
//! A [`Script`] opens with `message_start` and a `ping`. Deltas of one kind in a row share a
//! block; any other event closes the open block first (a thinking block closes with a
//! `signature_delta`, as the format's do), and each block takes the next index. Usage goes where
//! the format puts it: the input counts in `message_start`, the output count in the closing
//! `message_delta` as well.

use serde_json::{Value, json};

use super::{script_body, sse_named_body};

/// The signature a scripted thinking block closes with.
pub const SIGNATURE: &str = "c2NyaXB0ZWQtc2lnbmF0dXJl";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Open {
    Text(u32),
    Thinking(u32),
}

/// An answer in the Anthropic Messages format, built event by event.
#[derive(Clone, Debug)]
pub struct Script {
    /// The events after `message_start` (which is written out when the body is, with the usage
    /// known by then): name (`None` for a data-only event) and data.
    events: Vec<(Option<String>, String)>,
    /// Input, output and cached tokens, once [`Script::usage`] has set them.
    usage: Option<(u64, u64, Option<u64>)>,
    /// The block deltas of its kind go on.
    open: Option<Open>,
    next_index: u32,
}

impl Default for Script {
    fn default() -> Self {
        Script::new()
    }
}

impl Script {
    /// An answer that has only begun: `message_start` and a `ping`.
    pub fn new() -> Script {
        Script {
            events: Vec::new(),
            usage: None,
            open: None,
            next_index: 0,
        }
        .event("ping", json!({"type": "ping"}))
    }

    /// One text delta; consecutive text deltas share a block.
    pub fn text(self, delta: &str) -> Script {
        let (script, index) = self.into_block(Open::Text);
        script.delta(index, json!({"type": "text_delta", "text": delta}))
    }

    /// One thinking delta; consecutive thinking deltas share a block.
    pub fn reasoning(self, delta: &str) -> Script {
        let (script, index) = self.into_block(Open::Thinking);
        script.delta(index, json!({"type": "thinking_delta", "thinking": delta}))
    }

    /// Several `tool_use` blocks at once: every start, then the parts round-robin across the
    /// calls (the first part of each, then the second of each, ...), then every stop. Each block
    /// is its start, one `input_json_delta` per part and its stop.
    pub fn parallel_tool_calls(self, calls: &[(&str, &str, &[&str])]) -> Script {
        let mut script = self.close();
        let first = script.next_index;
        for (id, name, _) in calls {
            let index = script.take_index();
            script = script.event(
                "content_block_start",
                json!({"type": "content_block_start", "index": index,
                       "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
            );
        }
        let rounds = calls.iter().map(|(_, _, parts)| parts.len()).max();
        for round in 0..rounds.unwrap_or(0) {
            for (at, (_, _, parts)) in calls.iter().enumerate() {
                if let Some(part) = parts.get(round) {
                    script = script.delta(
                        first + at as u32,
                        json!({"type": "input_json_delta", "partial_json": part}),
                    );
                }
            }
        }
        for at in 0..calls.len() {
            script = script.stop_block(first + at as u32);
        }
        script
    }

    /// The answer's usage: `input` is every token sent, `cached` of them read from the cache.
    /// The format counts its `input_tokens` without the cached ones, so `message_start` says
    /// `input - cached`; a closing `message_delta` written after this says `output`.
    pub fn usage(mut self, input: u64, output: u64, cached: Option<u64>) -> Script {
        self.usage = Some((input, output, cached));
        self
    }

    /// Closes the open block, then `message_delta` with stop reason `reason` (and the output
    /// count, when usage is set) and `message_stop`.
    pub fn finish(self, reason: &str) -> Script {
        let script = self.close();
        let mut data = json!({"type": "message_delta",
                              "delta": {"stop_reason": reason, "stop_sequence": null}});
        if let Some((_, output, _)) = script.usage {
            data["usage"] = json!({"output_tokens": output});
        }
        script
            .event("message_delta", data)
            .event("message_stop", json!({"type": "message_stop"}))
    }

    /// [`Script::finish`] with `end_turn`.
    pub fn stop(self) -> Script {
        self.finish("end_turn")
    }

    /// [`Script::finish`] with `tool_use`.
    pub fn tool_stop(self) -> Script {
        self.finish("tool_use")
    }

    /// A mid-stream `error` event of error type `kind` (`overloaded` is `overloaded_error`; see
    /// [`error_type`]) saying `message`. The open block stays open: an error interrupts.
    pub fn error(self, kind: &str, message: &str) -> Script {
        self.event(
            "error",
            json!({"type": "error", "error": {"type": error_type(kind), "message": message}}),
        )
    }

    /// The events written so far, framed (an open block is left open).
    pub fn body(&self) -> Vec<u8> {
        let mut body = sse_named_body([("message_start", self.start().to_string())]);
        body.extend(script_body(&self.events));
        body
    }

    /// The `message_start` data, with the usage known now (none before [`Script::usage`]).
    fn start(&self) -> Value {
        let mut message = json!({
            "id": "msg_loopback", "type": "message", "role": "assistant",
            "model": "loopback", "content": [], "stop_reason": null, "stop_sequence": null,
        });
        if let Some((input, output, cached)) = self.usage {
            let mut usage = json!({
                "input_tokens": input.saturating_sub(cached.unwrap_or(0)),
                "output_tokens": output,
            });
            if let Some(cached) = cached {
                usage["cache_read_input_tokens"] = json!(cached);
            }
            message["usage"] = usage;
        }
        json!({"type": "message_start", "message": message})
    }

    fn event(mut self, name: &str, data: Value) -> Script {
        self.events.push((Some(name.to_owned()), data.to_string()));
        self
    }

    /// A `content_block_delta` of block `index`.
    fn delta(self, index: u32, delta: Value) -> Script {
        self.event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        )
    }

    fn take_index(&mut self) -> u32 {
        let index = self.next_index;
        self.next_index += 1;
        index
    }

    /// The open block of `kind`, starting one (and closing another) if need be.
    fn into_block(self, kind: fn(u32) -> Open) -> (Script, u32) {
        if let Some(open) = self.open {
            let index = match open {
                Open::Text(i) | Open::Thinking(i) => i,
            };
            if open == kind(index) {
                return (self, index);
            }
        }
        let mut script = self.close();
        let index = script.take_index();
        let open = kind(index);
        let block = match open {
            Open::Text(_) => json!({"type": "text", "text": ""}),
            Open::Thinking(_) => json!({"type": "thinking", "thinking": ""}),
        };
        script = script.event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": block}),
        );
        script.open = Some(open);
        (script, index)
    }

    /// Closes the open block, if any.
    fn close(mut self) -> Script {
        match self.open.take() {
            None => self,
            Some(Open::Text(index)) => self.stop_block(index),
            Some(Open::Thinking(index)) => self
                .delta(
                    index,
                    json!({"type": "signature_delta", "signature": SIGNATURE}),
                )
                .stop_block(index),
        }
    }

    fn stop_block(self, index: u32) -> Script {
        self.event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        )
    }
}

script_calls!();

/// The format's error type for `kind`: the short names `overloaded`, `rate_limit`,
/// `authentication` (or `auth`), `permission`, `billing` (or `quota`), `invalid_request`,
/// `not_found` and `api` (or `server`) take their `_error` suffix; anything else is used as it
/// is.
pub fn error_type(kind: &str) -> String {
    match kind {
        "overloaded" | "rate_limit" | "authentication" | "permission" | "billing"
        | "invalid_request" | "not_found" | "api" => format!("{kind}_error"),
        "auth" => "authentication_error".to_owned(),
        "quota" => "billing_error".to_owned(),
        "server" => "api_error".to_owned(),
        other => other.to_owned(),
    }
}

/// The format's error body, `{"type": "error", "error": {"type", "message"}}`, for a
/// [`Reply::Status`](super::Reply::Status) (`kind` as in [`error_type`]).
pub fn error_body(kind: &str, message: &str) -> String {
    json!({"type": "error", "error": {"type": error_type(kind), "message": message}}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(script: &Script) -> Vec<(String, Value)> {
        let body = String::from_utf8(script.body()).expect("UTF-8");
        body.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let (name, data) = e.split_once('\n').expect("a name and data");
                let name = name.strip_prefix("event: ").expect("a name").to_owned();
                let data = data.strip_prefix("data: ").expect("data");
                (name, serde_json::from_str(data).expect("JSON data"))
            })
            .collect()
    }

    #[test]
    fn blocks_open_close_and_take_the_next_index() {
        let script = Script::new()
            .reasoning("a")
            .reasoning("b")
            .text("c")
            .tool_call("t", "n", &[])
            .usage(10, 4, Some(3))
            .stop();
        let names: Vec<String> = events(&script).into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        let all = events(&script);
        assert_eq!(all[0].1["message"]["usage"]["input_tokens"], 7);
        assert_eq!(all[0].1["message"]["usage"]["cache_read_input_tokens"], 3);
        assert_eq!(all[5].1["delta"]["signature"], SIGNATURE);
        assert_eq!(all[10].1["index"], 2);
        assert_eq!(all[12].1["usage"]["output_tokens"], 4);
        for (name, data) in &all {
            assert_eq!(data["type"], name.as_str());
        }
    }

    #[test]
    fn error_kinds_take_the_formats_names() {
        assert_eq!(error_type("overloaded"), "overloaded_error");
        assert_eq!(error_type("auth"), "authentication_error");
        assert_eq!(error_type("rate_limit_error"), "rate_limit_error");
        let body: Value =
            serde_json::from_str(&error_body("rate_limit", "slow down")).expect("JSON");
        assert_eq!(
            body,
            json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}})
        );
    }
}
