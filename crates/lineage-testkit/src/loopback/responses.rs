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

use serde_json::{Value, json};

use super::script_body;

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

/// The kinds of item whose text streams in deltas, into their part 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A `message`: its text in an `output_text` content part.
    Message,
    /// A `reasoning` item: its text in a `summary_text` summary part.
    Reasoning,
}

impl Kind {
    /// The prefix of the item's id.
    fn id_prefix(self) -> &'static str {
        match self {
            Kind::Message => "msg",
            Kind::Reasoning => "rs",
        }
    }

    /// The stem of the names of the part's events (`.added`, `.done`).
    fn part_events(self) -> &'static str {
        match self {
            Kind::Message => "response.content_part",
            Kind::Reasoning => "response.reasoning_summary_part",
        }
    }

    /// The stem of the names of the text's events (`.delta`, `.done`).
    fn text_events(self) -> &'static str {
        match self {
            Kind::Message => "response.output_text",
            Kind::Reasoning => "response.reasoning_summary_text",
        }
    }

    /// The item `id` with `status` (a message's only) and `parts`.
    fn item(self, id: &str, status: &str, parts: Vec<Value>) -> Value {
        match self {
            Kind::Message => json!({"id": id, "type": "message", "status": status,
                                    "role": "assistant", "content": parts}),
            Kind::Reasoning => json!({"id": id, "type": "reasoning", "summary": parts}),
        }
    }

    /// The part holding `text`.
    fn part(self, text: &str) -> Value {
        match self {
            Kind::Message => json!({"type": "output_text", "text": text, "annotations": []}),
            Kind::Reasoning => json!({"type": "summary_text", "text": text}),
        }
    }

    /// The fields of an event of part 0 of item `id` at `output_index`: those, then `more`.
    fn in_part(self, id: &str, output_index: usize, more: Value) -> Value {
        let index = match self {
            Kind::Message => "content_index",
            Kind::Reasoning => "summary_index",
        };
        let mut fields = json!({"item_id": id, "output_index": output_index, index: 0});
        extend(&mut fields, more);
        fields
    }

    /// The fields of an event of the text, `more` among them: a message's text events carry
    /// `logprobs` too.
    fn of_text(self, id: &str, output_index: usize, more: Value) -> Value {
        let mut fields = self.in_part(id, output_index, more);
        if self == Kind::Message {
            fields["logprobs"] = json!([]);
        }
        fields
    }
}

/// The item being streamed: its kind, output index, item id and the text so far.
#[derive(Clone, Debug)]
struct Open {
    kind: Kind,
    output_index: usize,
    id: String,
    text: String,
}

/// Adds the fields of `more` to the object `fields`, after its own.
fn extend(fields: &mut Value, more: Value) {
    if let (Some(fields), Value::Object(more)) = (fields.as_object_mut(), more) {
        fields.extend(more);
    }
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
    pub fn text(self, delta: &str) -> Script {
        self.delta(Kind::Message, delta)
    }

    /// One reasoning delta (of a reasoning summary), in the open reasoning item or a new one.
    pub fn reasoning(self, delta: &str) -> Script {
        self.delta(Kind::Reasoning, delta)
    }

    /// One delta of an item of `kind`: in the open item when it is of that kind, else in a new
    /// one (its `output_item.added` and part `.added` first).
    fn delta(mut self, kind: Kind, delta: &str) -> Script {
        let (output_index, id) = match &mut self.open {
            Some(open) if open.kind == kind => {
                open.text.push_str(delta);
                (open.output_index, open.id.clone())
            }
            _ => {
                self.close();
                let output_index = self.output.len();
                let id = format!("{}_{output_index}", kind.id_prefix());
                self.push(
                    "response.output_item.added",
                    json!({
                        "output_index": output_index,
                        "item": kind.item(&id, "in_progress", Vec::new()),
                    }),
                );
                self.push(
                    &format!("{}.added", kind.part_events()),
                    kind.in_part(&id, output_index, json!({"part": kind.part("")})),
                );
                self.open = Some(Open {
                    kind,
                    output_index,
                    id: id.clone(),
                    text: delta.to_owned(),
                });
                (output_index, id)
            }
        };
        self.push(
            &format!("{}.delta", kind.text_events()),
            kind.of_text(&id, output_index, json!({"delta": delta})),
        );
        self
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

    /// Exactly the events written so far, framed as server-sent events.
    pub fn body(&self) -> Vec<u8> {
        script_body(&self.events)
    }

    /// Writes event `name` with `fields`, adding its `type` and `sequence_number`.
    fn push(&mut self, name: &str, fields: Value) {
        let mut data = json!({"type": name, "sequence_number": self.sequence});
        extend(&mut data, fields);
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

    /// Closes the open item, if any: its text's and its part's done events, then the item's.
    fn close(&mut self) {
        let Some(Open {
            kind,
            output_index,
            id,
            text,
        }) = self.open.take()
        else {
            return;
        };
        let part = kind.part(&text);
        self.push(
            &format!("{}.done", kind.text_events()),
            kind.of_text(&id, output_index, json!({"text": text})),
        );
        self.push(
            &format!("{}.done", kind.part_events()),
            kind.in_part(&id, output_index, json!({"part": part})),
        );
        let item = kind.item(&id, "completed", vec![part]);
        self.push(
            "response.output_item.done",
            json!({"output_index": output_index, "item": item}),
        );
        self.output.push(item);
    }
}

script_calls!();

/// The format's JSON error body, for [`Reply::Status`](super::Reply::Status): `{"error": {message, type, param,
/// code}}` with `kind` as both type and code.
pub fn error_body(kind: &str, message: &str) -> String {
    json!({"error": {"message": message, "type": kind, "param": null, "code": kind}}).to_string()
}
