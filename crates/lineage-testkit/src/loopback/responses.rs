//! Scripts of the OpenAI Responses wire format: answers built event by event, framed as the
//! format frames them (an `event:` line naming the event, whose data repeats the name in
//! `type`, and a `sequence_number` counting from 0).
//!
//! The builder keeps the answer's output items: consecutive text deltas share one `message`
//! item, consecutive reasoning deltas one `reasoning` item (a summary part), and each tool call
//! is a `function_call` item of its own. An item is closed (`*.done` events, then
//! `response.output_item.done` with the whole item) when anything else is added, so
//! [`Script::body`] before [`Script::finish`] is a stream cut short with its last item open. The
//! terminal event carries the whole response: its output items, the usage set by
//! [`Script::usage`], and for an incomplete answer the reason.

use std::time::Duration;

use serde_json::{Value, json};

use super::{Reply, chunked_reply, script_body, whole_reply};

/// The model name the scripted responses report.
const MODEL: &str = "loopback-model";
/// The scripted response's id.
const RESPONSE_ID: &str = "resp_loopback";

/// An answer in the Responses format, built event by event.
#[derive(Clone, Debug)]
pub struct Script {
    /// The events so far: name (`None` for a data-only event) and data.
    events: Vec<(Option<String>, String)>,
    /// The next `sequence_number`.
    sequence: u64,
    /// The output items closed so far, as `response.output_item.done` gave them.
    output: Vec<Value>,
    /// The item still open, if any.
    open: Option<Open>,
    /// The usage the terminal event reports.
    usage: Option<Value>,
}

/// An item being streamed: its output index, item id and the text so far.
#[derive(Clone, Debug)]
enum Open {
    Message {
        output_index: usize,
        id: String,
        text: String,
    },
    Reasoning {
        output_index: usize,
        id: String,
        text: String,
    },
}

impl Default for Script {
    fn default() -> Self {
        Script::new()
    }
}

impl Script {
    /// An answer with its opening events: `response.created` and `response.in_progress`.
    pub fn new() -> Script {
        let mut script = Script {
            events: Vec::new(),
            sequence: 0,
            output: Vec::new(),
            open: None,
            usage: None,
        };
        let response = script.response("in_progress", Value::Null);
        script.push("response.created", json!({ "response": response }));
        let response = script.response("in_progress", Value::Null);
        script.push("response.in_progress", json!({ "response": response }));
        script
    }

    /// One text delta, in the open message item or a new one.
    pub fn text(mut self, delta: &str) -> Script {
        let (output_index, id) = match &mut self.open {
            Some(Open::Message {
                output_index,
                id,
                text,
            }) => {
                text.push_str(delta);
                (*output_index, id.clone())
            }
            _ => {
                self.close();
                let output_index = self.output.len();
                let id = format!("msg_{output_index}");
                self.push(
                    "response.output_item.added",
                    json!({
                        "output_index": output_index,
                        "item": {"id": id, "type": "message", "status": "in_progress",
                                 "role": "assistant", "content": []},
                    }),
                );
                self.push(
                    "response.content_part.added",
                    json!({
                        "item_id": id, "output_index": output_index, "content_index": 0,
                        "part": {"type": "output_text", "text": "", "annotations": []},
                    }),
                );
                self.open = Some(Open::Message {
                    output_index,
                    id: id.clone(),
                    text: delta.to_owned(),
                });
                (output_index, id)
            }
        };
        self.push(
            "response.output_text.delta",
            json!({
                "item_id": id, "output_index": output_index, "content_index": 0,
                "delta": delta, "logprobs": [],
            }),
        );
        self
    }

    /// One reasoning delta (of a reasoning summary), in the open reasoning item or a new one.
    pub fn reasoning(mut self, delta: &str) -> Script {
        let (output_index, id) = match &mut self.open {
            Some(Open::Reasoning {
                output_index,
                id,
                text,
            }) => {
                text.push_str(delta);
                (*output_index, id.clone())
            }
            _ => {
                self.close();
                let output_index = self.output.len();
                let id = format!("rs_{output_index}");
                self.push(
                    "response.output_item.added",
                    json!({
                        "output_index": output_index,
                        "item": {"id": id, "type": "reasoning", "summary": []},
                    }),
                );
                self.push(
                    "response.reasoning_summary_part.added",
                    json!({
                        "item_id": id, "output_index": output_index, "summary_index": 0,
                        "part": {"type": "summary_text", "text": ""},
                    }),
                );
                self.open = Some(Open::Reasoning {
                    output_index,
                    id: id.clone(),
                    text: delta.to_owned(),
                });
                (output_index, id)
            }
        };
        self.push(
            "response.reasoning_summary_text.delta",
            json!({
                "item_id": id, "output_index": output_index, "summary_index": 0, "delta": delta,
            }),
        );
        self
    }

    /// One function call `name` with call id `id`, its arguments in `argument_parts`.
    pub fn tool_call(self, id: &str, name: &str, argument_parts: &[&str]) -> Script {
        self.parallel_tool_calls(&[(id, name, argument_parts)])
    }

    /// Several function calls at once: every item added, then their argument deltas
    /// round-robin (the first part of each call, then the second, ...), then every item done.
    pub fn parallel_tool_calls(mut self, calls: &[(&str, &str, &[&str])]) -> Script {
        self.close();
        let first = self.output.len();
        for (n, (call_id, name, _)) in calls.iter().enumerate() {
            let output_index = first + n;
            self.push(
                "response.output_item.added",
                json!({
                    "output_index": output_index,
                    "item": Self::call_item(output_index, call_id, name, "", "in_progress"),
                }),
            );
        }
        let longest = calls.iter().map(|c| c.2.len()).max().unwrap_or(0);
        for round in 0..longest {
            for (n, (_, _, parts)) in calls.iter().enumerate() {
                if let Some(part) = parts.get(round) {
                    let output_index = first + n;
                    self.push(
                        "response.function_call_arguments.delta",
                        json!({
                            "item_id": format!("fc_{output_index}"),
                            "output_index": output_index,
                            "delta": part,
                        }),
                    );
                }
            }
        }
        for (n, (call_id, name, parts)) in calls.iter().enumerate() {
            let output_index = first + n;
            let arguments = parts.concat();
            self.push(
                "response.function_call_arguments.done",
                json!({
                    "item_id": format!("fc_{output_index}"),
                    "output_index": output_index,
                    "arguments": arguments,
                }),
            );
            let item = Self::call_item(output_index, call_id, name, &arguments, "completed");
            self.push(
                "response.output_item.done",
                json!({"output_index": output_index, "item": item}),
            );
            self.output.push(item);
        }
        self
    }

    /// The usage the terminal event reports (`input_tokens_details.cached_tokens` when
    /// `cached` is given).
    pub fn usage(mut self, input: u64, output: u64, cached: Option<u64>) -> Script {
        let mut usage = json!({
            "input_tokens": input,
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input + output,
        });
        if let Some(cached) = cached {
            usage["input_tokens_details"] = json!({ "cached_tokens": cached });
        }
        self.usage = Some(usage);
        self
    }

    /// Closes the open item and ends the answer. `reason` is the format's own word:
    /// `completed` ends it with `response.completed`; any other word (`max_output_tokens`,
    /// `content_filter`, ...) with `response.incomplete` giving that word as
    /// `incomplete_details.reason`.
    pub fn finish(mut self, reason: &str) -> Script {
        self.close();
        let usage = self.usage.clone().unwrap_or(Value::Null);
        if reason == "completed" {
            let mut response = self.response("completed", usage);
            response["output"] = Value::Array(self.output.clone());
            self.push("response.completed", json!({ "response": response }));
        } else {
            let mut response = self.response("incomplete", usage);
            response["output"] = Value::Array(self.output.clone());
            response["incomplete_details"] = json!({ "reason": reason });
            self.push("response.incomplete", json!({ "response": response }));
        }
        self
    }

    /// Ends the answer normally: `response.completed`.
    pub fn stop(self) -> Script {
        self.finish("completed")
    }

    /// Ends an answer that asks for tool calls. The format has no reason of its own for it (a
    /// completed response holding `function_call` items is one), so this is
    /// `response.completed` too.
    pub fn tool_stop(self) -> Script {
        self.finish("completed")
    }

    /// A mid-stream `error` event with code `kind` (such as `server_error`,
    /// `rate_limit_exceeded`, `insufficient_quota`) and `message`. Any open item stays open:
    /// the error cuts it off.
    pub fn error(mut self, kind: &str, message: &str) -> Script {
        self.push(
            "error",
            json!({"code": kind, "message": message, "param": null}),
        );
        self
    }

    /// An event verbatim: `event` names it (`None` for a data-only event) and `data` is its
    /// data, unchanged. It closes nothing and counts no sequence number.
    pub fn raw(mut self, event: Option<&str>, data: &str) -> Script {
        self.events
            .push((event.map(str::to_owned), data.to_owned()));
        self
    }

    /// Exactly the events written so far, framed as server-sent events.
    pub fn body(&self) -> Vec<u8> {
        script_body(&self.events)
    }

    /// The events so far as one reply, sent at once.
    pub fn reply(&self) -> Reply {
        whole_reply(self.body())
    }

    /// The events so far as one reply, sent `bytes` at a time with `delay` before each write.
    pub fn chunked(&self, bytes: usize, delay: Duration) -> Reply {
        chunked_reply(self.body(), bytes, delay)
    }

    /// Writes event `name` with `fields`, adding its `type` and `sequence_number`.
    fn push(&mut self, name: &str, fields: Value) {
        let mut data = json!({"type": name, "sequence_number": self.sequence});
        if let (Some(data), Value::Object(fields)) = (data.as_object_mut(), fields) {
            data.extend(fields);
        }
        self.sequence += 1;
        self.events.push((Some(name.to_owned()), data.to_string()));
    }

    /// The response object with `status` and `usage`, and no output yet.
    fn response(&self, status: &str, usage: Value) -> Value {
        json!({
            "id": RESPONSE_ID,
            "object": "response",
            "created_at": 1_700_000_000,
            "status": status,
            "model": MODEL,
            "output": [],
            "error": null,
            "incomplete_details": null,
            "usage": usage,
        })
    }

    fn call_item(
        output_index: usize,
        call_id: &str,
        name: &str,
        arguments: &str,
        status: &str,
    ) -> Value {
        json!({
            "id": format!("fc_{output_index}"),
            "type": "function_call",
            "status": status,
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
        })
    }

    /// Closes the open item, if any: its part's done events, then the item's.
    fn close(&mut self) {
        match self.open.take() {
            None => {}
            Some(Open::Message {
                output_index,
                id,
                text,
            }) => {
                let part = json!({"type": "output_text", "text": text, "annotations": []});
                self.push(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": output_index, "content_index": 0,
                           "text": text, "logprobs": []}),
                );
                self.push(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": output_index, "content_index": 0,
                           "part": part}),
                );
                let item = json!({"id": id, "type": "message", "status": "completed",
                                  "role": "assistant", "content": [part]});
                self.push(
                    "response.output_item.done",
                    json!({"output_index": output_index, "item": item}),
                );
                self.output.push(item);
            }
            Some(Open::Reasoning {
                output_index,
                id,
                text,
            }) => {
                let part = json!({"type": "summary_text", "text": text});
                self.push(
                    "response.reasoning_summary_text.done",
                    json!({"item_id": id, "output_index": output_index, "summary_index": 0,
                           "text": text}),
                );
                self.push(
                    "response.reasoning_summary_part.done",
                    json!({"item_id": id, "output_index": output_index, "summary_index": 0,
                           "part": part}),
                );
                let item = json!({"id": id, "type": "reasoning", "summary": [part]});
                self.push(
                    "response.output_item.done",
                    json!({"output_index": output_index, "item": item}),
                );
                self.output.push(item);
            }
        }
    }
}

/// A whole normal answer of one text.
pub fn text(text: &str) -> Reply {
    Script::new().text(text).stop().reply()
}

/// A whole answer asking for one call of `name` with call id `id` and `arguments`.
pub fn tool_call(id: &str, name: &str, arguments: &str) -> Reply {
    Script::new()
        .tool_call(id, name, &[arguments])
        .tool_stop()
        .reply()
}

/// The format's JSON error body, for [`Reply::Status`]: `{"error": {message, type, param,
/// code}}` with `kind` as both type and code.
pub fn error_body(kind: &str, message: &str) -> String {
    json!({"error": {"message": message, "type": kind, "param": null, "code": kind}}).to_string()
}
