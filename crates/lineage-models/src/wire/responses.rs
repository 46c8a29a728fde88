//! The OpenAI Responses wire format (`POST {base}/responses` with `stream: true`).
//!
//! **The request** is stateless: `store: false`, the system prompt as `instructions`, and the
//! whole history as `input` items. A message's text, images and notes become one `message` item
//! (`input_text` and `input_image` parts for the user, `output_text` parts for the assistant); a
//! tool call is its own `function_call` item and a tool result its own `function_call_output`
//! item, both keyed by the call's id, in the order the history holds them. Reasoning from the
//! history is not sent back (see [`body`]).
//!
//! **The answer** is a stream of named events whose data repeats the name in `type` (the data's
//! `type` is what is read; the `event:` line is only a fallback). The answer is a list of output
//! items, each announced by `response.output_item.added` and closed by
//! `response.output_item.done` with the whole item:
//!
//! - a `message` item holds content parts (`response.content_part.added`), whose text arrives
//!   as `response.output_text.delta`, or a refusal as `response.refusal.delta`;
//! - a `function_call` item carries its `call_id` and `name` when added; its arguments arrive as
//!   `response.function_call_arguments.delta`, which name the item by `output_index` and
//!   `item_id` only;
//! - a `reasoning` item's text arrives as `response.reasoning_summary_text.delta` (a summary
//!   part each) or `response.reasoning_text.delta` (raw reasoning, from servers that show it).
//!
//! Each (item, part) gets its own block index, allocated in the order first seen, so parallel
//! calls and the parts of one message never share a block. The stream ends with one terminal
//! event: `response.completed`, `response.incomplete` (`incomplete_details.reason`) or
//! `response.failed` (`error`); usage rides on the terminal event's response. There is no
//! `[DONE]` marker (one sent anyway, as some compatible servers do, is ignored). An `error`
//! event may interrupt the stream anywhere.

use std::collections::{HashMap, HashSet};

use lineage_agent::{ModelError, ModelRequest};
use lineage_log::{
    BlockType, CallId, ContentBlock, FinishReason, Message, ModelFailure, Role, StreamChunk,
    ToolCallDelta, Usage,
};
use serde_json::{Map, Value, json};

use super::{
    Translate, Wire, Wording, bad_response, empty_response, event_name, finish_code, is_image_url,
    result_text, shown_reason, stream_closed,
};
use crate::failure::{
    AUTH, CONTEXT_WINDOW_EXCEEDED, INVALID_REQUEST, QUOTA, RATE_LIMIT, SERVER, bound,
};
use crate::sse::Event;

const WIRE: Wire = Wire::Responses;

/// The code of a finish whose answer the model refused to give (a `refusal` content part).
const REFUSAL: &str = "REFUSAL";

/// The request body.
///
/// - `store: false`: Lineage's log is the conversation and every request carries all of it, so
///   the endpoint is asked not to keep the response (nothing refers to it later:
///   `previous_response_id` is never sent, and a fork or a resume starts from the log).
/// - Reasoning in the history is dropped. The format takes earlier reasoning back only as
///   `reasoning` items, and the endpoints that use them want the item's `encrypted_content`
///   (asked for with `include: ["reasoning.encrypted_content"]` on a stateless request), which
///   the log does not keep; the visible summary text alone is not a valid stand-in.
/// - Tools are sent with `strict: false`: the format's default is strict mode, which refuses any
///   schema that does not list every property as required and forbid additional ones, and a
///   tool's schema is whatever JSON Schema its author wrote.
pub(crate) fn body(request: &ModelRequest) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(request.model.as_str()));
    body.insert("stream".into(), json!(true));
    body.insert("store".into(), json!(false));
    if !request.system.is_empty() {
        body.insert("instructions".into(), json!(request.system));
    }
    body.insert("input".into(), Value::Array(input(&request.messages)));
    if !request.tools.is_empty() {
        let tools = request
            .tools
            .iter()
            .map(|tool| {
                json!({
                    "type": "function",
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                    "strict": false,
                })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(max) = request.max_tokens {
        body.insert("max_output_tokens".into(), json!(max));
    }
    Value::Object(body)
}

/// The history as `input` items, in order: each message's consecutive text and image blocks as
/// one `message` item, each tool call and each tool result as an item of its own.
fn input(messages: &[Message]) -> Vec<Value> {
    let mut items = Vec::new();
    for message in messages {
        let (role, text_type) = match message.role {
            Role::User => ("user", "input_text"),
            Role::Assistant => ("assistant", "output_text"),
        };
        let mut parts: Vec<Value> = Vec::new();
        for block in &message.content {
            match block {
                ContentBlock::Text { text } => {
                    parts.push(json!({"type": text_type, "text": text.as_str()}));
                }
                // Dropped: see `body`. A user message holds no model reasoning.
                ContentBlock::Reasoning { .. } => {}
                ContentBlock::Image {
                    media_type,
                    attachment,
                } => {
                    // Only the user side takes images; an attachment id the endpoint cannot
                    // fetch is told as a note rather than sent as a URL that would fail.
                    if message.role == Role::User && is_image_url(attachment) {
                        parts.push(json!({
                            "type": "input_image",
                            "image_url": attachment.as_str(),
                            "detail": "auto",
                        }));
                    } else {
                        let note = format!("[image {media_type}: {attachment}]");
                        parts.push(json!({"type": text_type, "text": note}));
                    }
                }
                ContentBlock::ToolCall {
                    id,
                    name,
                    arguments,
                } => {
                    flush(&mut items, role, &mut parts);
                    items.push(json!({
                        "type": "function_call",
                        "call_id": id.as_str(),
                        "name": name.as_str(),
                        "arguments": arguments.as_str(),
                    }));
                }
                // The format has no failure flag on a result: the result's text says it failed.
                ContentBlock::ToolResult {
                    tool_call_id,
                    content,
                    is_error: _,
                } => {
                    flush(&mut items, role, &mut parts);
                    items.push(json!({
                        "type": "function_call_output",
                        "call_id": tool_call_id.as_str(),
                        "output": result_text(content),
                    }));
                }
            }
        }
        flush(&mut items, role, &mut parts);
    }
    items
}

/// Ends the `message` item being gathered, if it has any parts.
fn flush(items: &mut Vec<Value>, role: &str, parts: &mut Vec<Value>) {
    if !parts.is_empty() {
        items.push(json!({
            "type": "message",
            "role": role,
            "content": Value::Array(std::mem::take(parts)),
        }));
    }
}

/// Which part of an output item a block holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Part {
    /// A message's content part, or a reasoning item's raw reasoning part (`content_index`).
    Content(u64),
    /// A reasoning item's summary part (`summary_index`).
    Summary(u64),
    /// A function call: the item itself.
    Call,
}

/// One block of the answer, an (output index, part) pair of `by_part`: what has been read of it.
#[derive(Debug)]
struct Slot {
    /// The block index the chunks use: the slot's position, so indices are allocated in the
    /// order the parts were first seen.
    index: u32,
    kind: BlockType,
    /// A function call's `call_id` and `name` (from its item); `None` for other blocks.
    call: Option<(String, String)>,
    /// What the deltas built.
    text: String,
    /// The whole text a part's `*.done` event gave, when one came.
    done_text: Option<String>,
    /// The `BlockStart` went out.
    started: bool,
    /// A function call's name went out on a delta.
    named: bool,
    /// The `BlockEnd` went out: later deltas are ignored.
    closed: bool,
}

/// How the answer ended, as read from its terminal event.
#[derive(Debug)]
enum Ending {
    Finished {
        usage: Option<Usage>,
        reason: FinishReason,
    },
    /// A normal stop that produced nothing.
    Empty,
}

/// Reads one answer.
#[derive(Debug, Default)]
pub(crate) struct Translator {
    slots: Vec<Slot>,
    /// Where each (output index, part) slot is in `slots`.
    by_part: HashMap<(u64, Part), usize>,
    /// The slots of each output index, in the order made.
    by_item: HashMap<u64, Vec<usize>>,
    /// The output indices whose `response.output_item.done` was read.
    done_items: HashSet<u64>,
    /// The item ids seen, with their output index: argument deltas may name their call by id
    /// alone, and the terminal response lists items by position, where an id tells which of
    /// them the stream already gave.
    item_ids: HashMap<String, u64>,
    /// The output indices of `item_ids`.
    item_positions: HashSet<u64>,
    /// The text of any refusal part; `Some` once one was seen.
    refusal: Option<String>,
    /// A text, reasoning or tool-call block with something in it went out.
    content: bool,
    /// A function call item was seen.
    tool_calls: bool,
    ending: Option<Ending>,
    /// The chunks of `ending` went out.
    ended: bool,
}

impl Translate for Translator {
    fn event(&mut self, event: &Event, out: &mut Vec<StreamChunk>) -> Result<(), ModelError> {
        if self.is_done() {
            return Ok(());
        }
        self.read(event, out)
    }

    fn is_done(&self) -> bool {
        self.ending.is_some()
    }

    fn end(&mut self, out: &mut Vec<StreamChunk>) -> Result<(), ModelError> {
        match &self.ending {
            None => Err(stream_closed(WIRE)),
            Some(Ending::Empty) => Err(empty_response(WIRE)),
            Some(Ending::Finished { usage, reason }) => {
                if !self.ended {
                    self.ended = true;
                    if let Some(usage) = usage {
                        out.push(StreamChunk::Usage(Box::new(*usage)));
                    }
                    out.push(StreamChunk::Finish {
                        reason: reason.clone(),
                    });
                }
                Ok(())
            }
        }
    }
}

impl Translator {
    fn read(&mut self, event: &Event, out: &mut Vec<StreamChunk>) -> Result<(), ModelError> {
        if event.data.trim() == "[DONE]" {
            return Ok(());
        }
        let data = super::json(WIRE, event)?;
        let Some(fields) = data.as_object() else {
            return Err(bad_response(
                WIRE,
                format_args!("a {} event is not a JSON object", event_name(event)),
            ));
        };
        if let (Some(id), Some(output_index)) = (
            fields.get("item_id").and_then(Value::as_str),
            fields.get("output_index").and_then(Value::as_u64),
        ) {
            self.note_item(id, output_index);
        }
        if let (Some(id), Some(output_index)) = (
            data.pointer("/item/id").and_then(Value::as_str),
            fields.get("output_index").and_then(Value::as_u64),
        ) {
            self.note_item(id, output_index);
        }
        let kind = match fields.get("type").and_then(Value::as_str) {
            // An event named `error` is one whatever its data's `type` says: some servers put
            // the error's own type there.
            _ if event.event == "error" => "error",
            Some(kind) => kind,
            None if !event.event.is_empty() => event.event.as_str(),
            // Nothing names it: nothing can be made of it.
            None => return Ok(()),
        };
        match kind {
            "response.output_item.added" => self.item_added(&data, out),
            "response.output_item.done" => {
                let output_index = index(&data, "output_index", kind)?;
                let item = data.get("item").filter(|v| v.is_object()).ok_or_else(|| {
                    bad_response(WIRE, format_args!("a {kind} event has no item"))
                })?;
                self.item_done(output_index, item, out)
            }
            "response.output_text.delta" => {
                let part = Part::Content(index_or_zero(&data, "content_index", kind)?);
                self.text_delta(&data, kind, part, BlockType::Text, out)
            }
            "response.reasoning_summary_text.delta" => {
                let part = Part::Summary(index_or_zero(&data, "summary_index", kind)?);
                self.text_delta(&data, kind, part, BlockType::Reasoning, out)
            }
            "response.reasoning_text.delta" => {
                let part = Part::Content(index_or_zero(&data, "content_index", kind)?);
                self.text_delta(&data, kind, part, BlockType::Reasoning, out)
            }
            "response.output_text.done" => {
                let part = Part::Content(index_or_zero(&data, "content_index", kind)?);
                self.part_done(&data, kind, part, BlockType::Text, "text")
            }
            "response.reasoning_summary_text.done" => {
                let part = Part::Summary(index_or_zero(&data, "summary_index", kind)?);
                self.part_done(&data, kind, part, BlockType::Reasoning, "text")
            }
            "response.reasoning_text.done" => {
                let part = Part::Content(index_or_zero(&data, "content_index", kind)?);
                self.part_done(&data, kind, part, BlockType::Reasoning, "text")
            }
            "response.refusal.delta" => {
                let delta = string(&data, "delta", kind)?;
                self.refusal.get_or_insert_with(String::new).push_str(delta);
                Ok(())
            }
            "response.refusal.done" => {
                let refusal = string(&data, "refusal", kind)?;
                self.refused(refusal);
                Ok(())
            }
            "response.function_call_arguments.delta" => self.arguments_delta(&data, kind, out),
            "response.function_call_arguments.done" => {
                let arguments = string(&data, "arguments", kind)?.to_owned();
                if let Some(at) = self.call_slot(&data) {
                    self.slots[at].done_text = Some(arguments);
                }
                Ok(())
            }
            "response.completed" | "response.incomplete" => self.terminal(&data, kind, out),
            "response.failed" => {
                let error = data.pointer("/response/error").filter(|e| e.is_object());
                Err(mid_stream_failure(error, "failed the response"))
            }
            "error" => {
                // The documented shape has `code` and `message` at the top; some servers nest
                // them under `error`.
                let error = data.get("error").filter(|e| e.is_object()).unwrap_or(&data);
                Err(mid_stream_failure(
                    Some(error),
                    "reported an error mid-stream",
                ))
            }
            // The lifecycle (`response.created`, `response.in_progress`, `response.queued`), the
            // opening and closing of content parts (blocks open at their first delta and close
            // with their item), and everything this reader has no use for or does not know yet.
            _ => Ok(()),
        }
    }

    fn item_added(&mut self, data: &Value, out: &mut Vec<StreamChunk>) -> Result<(), ModelError> {
        let what = "response.output_item.added";
        let output_index = index(data, "output_index", what)?;
        let item = data
            .get("item")
            .filter(|v| v.is_object())
            .ok_or_else(|| bad_response(WIRE, format_args!("a {what} event has no item")))?;
        if item.get("type").and_then(Value::as_str) != Some("function_call") {
            // Message and reasoning parts open at their first delta; other items are not read.
            return Ok(());
        }
        let at = self.call(output_index, item, what)?;
        self.start(at, out);
        // The item's arguments are empty when it is added; any given here are the first delta.
        if let Some(arguments) = item.get("arguments").and_then(Value::as_str) {
            self.call_delta(at, arguments, out);
        }
        Ok(())
    }

    /// The slot of the function call `item` at `output_index`, made from the item's `call_id`
    /// and `name` when it is first seen.
    fn call(&mut self, output_index: u64, item: &Value, what: &str) -> Result<usize, ModelError> {
        if let Some(at) = self.find(output_index, Part::Call) {
            return Ok(at);
        }
        let field = |key: &str| {
            item.get(key)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .ok_or_else(|| {
                    bad_response(
                        WIRE,
                        format_args!("a function call in a {what} event has no {key}"),
                    )
                })
        };
        let call = (field("call_id")?.to_owned(), field("name")?.to_owned());
        let at = self.slot(output_index, Part::Call, BlockType::ToolCall, what)?;
        self.slots[at].call = Some(call);
        self.tool_calls = true;
        Ok(at)
    }

    /// The slot of the call an arguments event names: by `output_index`, else by `item_id`.
    fn call_slot(&self, data: &Value) -> Option<usize> {
        let by_index = data
            .get("output_index")
            .and_then(Value::as_u64)
            .and_then(|i| self.find(i, Part::Call));
        by_index.or_else(|| {
            let id = data.get("item_id").and_then(Value::as_str)?;
            self.find(*self.item_ids.get(id)?, Part::Call)
        })
    }

    fn arguments_delta(
        &mut self,
        data: &Value,
        what: &str,
        out: &mut Vec<StreamChunk>,
    ) -> Result<(), ModelError> {
        let delta = string(data, "delta", what)?;
        // A call's id comes only with its item: arguments of a call never announced cannot be
        // attributed to one.
        let at = self.call_slot(data).ok_or_else(|| {
            bad_response(
                WIRE,
                format_args!("a {what} event names a function call that was never added"),
            )
        })?;
        self.start(at, out);
        self.call_delta(at, delta, out);
        Ok(())
    }

    /// More arguments for the call in slot `at` (which has its call): the delta carries the id,
    /// and the name on the call's first delta.
    fn call_delta(&mut self, at: usize, delta: &str, out: &mut Vec<StreamChunk>) {
        let slot = &mut self.slots[at];
        if delta.is_empty() || slot.closed {
            return;
        }
        let Some((id, name)) = &slot.call else {
            return;
        };
        let name = (!slot.named).then(|| name.as_str().into());
        slot.named = true;
        slot.text.push_str(delta);
        out.push(StreamChunk::ToolCallDelta(Box::new(ToolCallDelta {
            index: slot.index,
            id: CallId::new(id.as_str()),
            name,
            arguments_delta: delta.into(),
        })));
        self.content = true;
    }

    fn text_delta(
        &mut self,
        data: &Value,
        what: &str,
        part: Part,
        kind: BlockType,
        out: &mut Vec<StreamChunk>,
    ) -> Result<(), ModelError> {
        let output_index = index(data, "output_index", what)?;
        let delta = string(data, "delta", what)?;
        if delta.is_empty() {
            return Ok(());
        }
        let at = self.slot(output_index, part, kind, what)?;
        if self.slots[at].closed {
            return Ok(());
        }
        self.start(at, out);
        let slot = &mut self.slots[at];
        slot.text.push_str(delta);
        let (index, text) = (slot.index, delta.into());
        out.push(match kind {
            BlockType::Reasoning => StreamChunk::ReasoningDelta { index, text },
            _ => StreamChunk::TextDelta { index, text },
        });
        self.content = true;
        Ok(())
    }

    /// A part's `*.done` event: its whole text, kept for the part's close.
    fn part_done(
        &mut self,
        data: &Value,
        what: &str,
        part: Part,
        kind: BlockType,
        key: &str,
    ) -> Result<(), ModelError> {
        let output_index = index(data, "output_index", what)?;
        let text = string(data, key, what)?.to_owned();
        let at = self.slot(output_index, part, kind, what)?;
        self.slots[at].done_text = Some(text);
        Ok(())
    }

    fn refused(&mut self, refusal: &str) {
        // The whole refusal, when given, replaces what its deltas built.
        if !refusal.is_empty() || self.refusal.is_none() {
            self.refusal = Some(refusal.to_owned());
        }
    }

    /// An output item is done: each of its parts closes with the item's own text (a `BlockEnd`
    /// with the whole block), and any part of it still open with what was read of it.
    fn item_done(
        &mut self,
        output_index: u64,
        item: &Value,
        out: &mut Vec<StreamChunk>,
    ) -> Result<(), ModelError> {
        let what = "response.output_item.done";
        if !self.done_items.insert(output_index) {
            return Ok(());
        }
        let parts = |key: &str| item.get(key).and_then(Value::as_array).map(Vec::as_slice);
        match item.get("type").and_then(Value::as_str) {
            Some("function_call") => {
                let at = self.call(output_index, item, what)?;
                let arguments = item.get("arguments").and_then(Value::as_str);
                self.close(at, arguments, out);
            }
            Some("message") => {
                for (i, part) in parts("content").unwrap_or_default().iter().enumerate() {
                    match part.get("type").and_then(Value::as_str) {
                        Some("output_text") => {
                            let text = part.get("text").and_then(Value::as_str);
                            let part = Part::Content(i as u64);
                            self.close_part(output_index, part, BlockType::Text, text, out)?;
                        }
                        Some("refusal") => {
                            let refusal = part.get("refusal").and_then(Value::as_str);
                            self.refused(refusal.unwrap_or_default());
                        }
                        _ => {}
                    }
                }
            }
            Some("reasoning") => {
                // Summary parts, then raw reasoning parts (from servers that show it).
                let summary = parts("summary").unwrap_or_default().iter().enumerate();
                let summary = summary.map(|(i, piece)| (Part::Summary(i as u64), piece));
                let content = parts("content").unwrap_or_default().iter().enumerate();
                let content = content.map(|(i, piece)| (Part::Content(i as u64), piece));
                for (part, piece) in summary.chain(content) {
                    let text = piece.get("text").and_then(Value::as_str);
                    self.close_part(output_index, part, BlockType::Reasoning, text, out)?;
                }
            }
            _ => {}
        }
        // Parts the item did not list (or that deltas opened under other indices) close with
        // what was read of them.
        let of_item = self.by_item.get(&output_index).cloned().unwrap_or_default();
        for at in of_item {
            self.close(at, None, out);
        }
        Ok(())
    }

    /// Closes `part` of item `output_index` with the item's `text`, making its slot when no
    /// delta did and the text has something in it.
    fn close_part(
        &mut self,
        output_index: u64,
        part: Part,
        kind: BlockType,
        text: Option<&str>,
        out: &mut Vec<StreamChunk>,
    ) -> Result<(), ModelError> {
        let given = text.is_some_and(|t| !t.is_empty());
        if !given && self.find(output_index, part).is_none() {
            return Ok(());
        }
        let at = self.slot(output_index, part, kind, "response.output_item.done")?;
        self.close(at, text, out);
        Ok(())
    }

    /// Sends the `BlockEnd` of slot `at` (after its `BlockStart`, if none went out), with the
    /// whole text: `given` (the item's) when it has any, else the part's `*.done` text, else
    /// what the deltas built. A text or reasoning slot that never opened and has no text stays
    /// as it is: no empty block is made up.
    fn close(&mut self, at: usize, given: Option<&str>, out: &mut Vec<StreamChunk>) {
        let slot = &self.slots[at];
        if slot.closed {
            return;
        }
        let text = given
            .filter(|t| !t.is_empty())
            .or(slot.done_text.as_deref().filter(|t| !t.is_empty()))
            .unwrap_or(&slot.text)
            .to_owned();
        if !slot.started && slot.call.is_none() && text.is_empty() {
            return;
        }
        let block = match (&slot.call, slot.kind) {
            (Some((id, name)), _) => ContentBlock::ToolCall {
                id: CallId::new(id.as_str()),
                name: name.as_str().into(),
                arguments: text.as_str().into(),
            },
            (None, BlockType::Reasoning) => ContentBlock::Reasoning {
                text: text.as_str().into(),
            },
            (None, _) => ContentBlock::text(text.as_str()),
        };
        if slot.call.is_some() || !text.is_empty() {
            self.content = true;
        }
        self.start(at, out);
        let slot = &mut self.slots[at];
        slot.closed = true;
        out.push(StreamChunk::BlockEnd {
            index: slot.index,
            block: Box::new(block),
        });
    }

    /// `response.completed` or `response.incomplete`: items the stream did not close are closed
    /// from the response's `output` (or with what was read of them), then the finish is decided.
    fn terminal(
        &mut self,
        data: &Value,
        what: &str,
        out: &mut Vec<StreamChunk>,
    ) -> Result<(), ModelError> {
        let response = data
            .get("response")
            .filter(|r| r.is_object())
            .ok_or_else(|| bad_response(WIRE, format_args!("a {what} event has no response")))?;
        let usage = usage(response.get("usage"), what)?;
        if let Some(output) = response.get("output").and_then(Value::as_array) {
            for (position, item) in output.iter().enumerate() {
                if !item.is_object() {
                    continue;
                }
                let output_index = self.output_index_of(item, position as u64);
                if !self.done_items.contains(&output_index) {
                    self.item_done(output_index, item, out)?;
                }
            }
        }
        for at in 0..self.slots.len() {
            self.close(at, None, out);
        }
        let reason = if what == "response.incomplete" {
            let reason = response
                .pointer("/incomplete_details/reason")
                .and_then(Value::as_str);
            match reason {
                Some("max_output_tokens") => FinishReason::MaxTokens,
                Some(reason) => finish_error(
                    finish_code(reason),
                    format!(
                        "the responses endpoint stopped the answer early ({})",
                        shown_reason(reason)
                    ),
                ),
                None => finish_error(
                    "FINISH_INCOMPLETE".to_owned(),
                    "the responses endpoint stopped the answer early and gave no reason".to_owned(),
                ),
            }
        } else if let Some(refusal) = &self.refusal {
            let message = if refusal.trim().is_empty() {
                "the model refused to answer".to_owned()
            } else {
                format!("the model refused to answer: {}", bound(refusal))
            };
            finish_error(REFUSAL.to_owned(), message)
        } else if self.tool_calls {
            FinishReason::ToolCalls
        } else if !self.content {
            self.ending = Some(Ending::Empty);
            return Ok(());
        } else {
            FinishReason::Stop
        };
        self.ending = Some(Ending::Finished { usage, reason });
        Ok(())
    }

    fn note_item(&mut self, id: &str, output_index: u64) {
        if !self.item_ids.contains_key(id) {
            self.item_ids.insert(id.to_owned(), output_index);
            self.item_positions.insert(output_index);
        }
    }

    /// The output index of an item the terminal response lists at `position`: the one its id
    /// was streamed under; else its position, unless an item with another id was streamed
    /// there, when it gets an index of its own past any a server would send.
    fn output_index_of(&self, item: &Value, position: u64) -> u64 {
        let streamed = item
            .get("id")
            .and_then(Value::as_str)
            .and_then(|id| self.item_ids.get(id));
        if let Some(output_index) = streamed {
            return *output_index;
        }
        // (A position whose streamed item had no id is taken to be this item: in the format an
        // item's output index is its position in the output.)
        if self.item_positions.contains(&position) {
            u64::MAX - position
        } else {
            position
        }
    }

    fn find(&self, output_index: u64, part: Part) -> Option<usize> {
        self.by_part.get(&(output_index, part)).copied()
    }

    /// The slot of `part` of item `output_index`, made when first seen; `BAD_RESPONSE` when the
    /// part was seen holding something else.
    fn slot(
        &mut self,
        output_index: u64,
        part: Part,
        kind: BlockType,
        what: &str,
    ) -> Result<usize, ModelError> {
        if let Some(at) = self.find(output_index, part) {
            if self.slots[at].kind != kind {
                return Err(bad_response(
                    WIRE,
                    format_args!(
                        "a {what} event gives {kind:?} to output item {output_index}, which holds {:?}",
                        self.slots[at].kind
                    ),
                ));
            }
            return Ok(at);
        }
        let index = u32::try_from(self.slots.len())
            .map_err(|_| bad_response(WIRE, "the answer has more blocks than can be indexed"))?;
        self.slots.push(Slot {
            index,
            kind,
            call: None,
            text: String::new(),
            done_text: None,
            started: false,
            named: false,
            closed: false,
        });
        let at = self.slots.len() - 1;
        self.by_part.insert((output_index, part), at);
        self.by_item.entry(output_index).or_default().push(at);
        Ok(at)
    }

    /// Sends slot `at`'s `BlockStart`, once.
    fn start(&mut self, at: usize, out: &mut Vec<StreamChunk>) {
        let slot = &mut self.slots[at];
        if !slot.started {
            slot.started = true;
            out.push(StreamChunk::BlockStart {
                index: slot.index,
                block_type: slot.kind,
            });
        }
    }
}

/// A non-negative integer field, or `BAD_RESPONSE` naming the event.
fn index(data: &Value, key: &str, what: &str) -> Result<u64, ModelError> {
    data.get(key).and_then(Value::as_u64).ok_or_else(|| {
        bad_response(
            WIRE,
            format_args!("a {what} event has no {key} (a non-negative integer)"),
        )
    })
}

/// Like [`index`], but 0 when the field is absent (servers that send one part per item may
/// leave it out).
fn index_or_zero(data: &Value, key: &str, what: &str) -> Result<u64, ModelError> {
    match data.get(key) {
        None | Some(Value::Null) => Ok(0),
        Some(_) => index(data, key, what),
    }
}

/// A string field, or `BAD_RESPONSE` naming the event.
fn string<'a>(data: &'a Value, key: &str, what: &str) -> Result<&'a str, ModelError> {
    data.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| bad_response(WIRE, format_args!("a {what} event has no {key} string")))
}

/// The usage of a terminal response: `input_tokens`, `output_tokens` and
/// `input_tokens_details.cached_tokens`. Absent or null usage is `None`; usage that is there
/// but not counts is `BAD_RESPONSE`.
fn usage(usage: Option<&Value>, what: &str) -> Result<Option<Usage>, ModelError> {
    let usage = match usage {
        None | Some(Value::Null) => return Ok(None),
        Some(usage) if usage.is_object() => usage,
        Some(_) => {
            return Err(bad_response(
                WIRE,
                format_args!("the usage of a {what} event is not an object"),
            ));
        }
    };
    let count = |pointer: &str| -> Result<Option<u64>, ModelError> {
        match usage.pointer(pointer) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                bad_response(
                    WIRE,
                    format_args!("the usage {pointer} of a {what} event is not a count"),
                )
            }),
        }
    };
    Ok(Some(Usage {
        input_tokens: count("/input_tokens")?.unwrap_or(0),
        output_tokens: count("/output_tokens")?.unwrap_or(0),
        cache_read_tokens: count("/input_tokens_details/cached_tokens")?,
    }))
}

fn finish_error(code: String, message: String) -> FinishReason {
    FinishReason::Error(Box::new(ModelFailure {
        message: message.into(),
        code: code.into(),
    }))
}

/// The failure a mid-stream `error` event or a failed response reports. The code is decided
/// here from the error's wording (its `code`, `type` and `message`), never taken from it.
fn mid_stream_failure(error: Option<&Value>, what: &str) -> ModelError {
    let field = |key: &str| {
        error
            .and_then(|e| e.get(key))
            .and_then(Value::as_str)
            .filter(|s| !s.trim().is_empty())
    };
    let wording = error
        .map(|error| Wording::of(error, &["code", "type", "message"]))
        .unwrap_or_default();
    let code = if wording.mentions(&["quota", "insufficient", "billing", "credit", "spend limit"]) {
        QUOTA
    } else if wording.mentions(&["rate_limit", "rate limit", "too many requests"]) {
        RATE_LIMIT
    } else if wording.mentions(&[
        "context_length",
        "context length",
        "context window",
        "maximum context",
        "too many tokens",
    ]) {
        CONTEXT_WINDOW_EXCEEDED
    } else if wording.mentions(&["authentication", "unauthorized", "api key", "permission"]) {
        AUTH
    } else if wording.mentions(&[
        "invalid",
        "unsupported",
        "too_large",
        "too large",
        "too_small",
        "not_found",
        "not found",
        "content_policy",
        "failed_to_download",
        "empty_image",
    ]) {
        INVALID_REQUEST
    } else {
        // `server_error`, an overload, a timeout, or wording not seen before: the endpoint
        // failed while answering.
        SERVER
    };
    let message = match (field("message"), field("code").or(field("type"))) {
        (Some(message), Some(kind)) => format!("{} ({kind})", bound(message)),
        (Some(message), None) => bound(message),
        (None, Some(kind)) => kind.to_owned(),
        (None, None) => "no detail given".to_owned(),
    };
    ModelError::new(code, format!("the responses endpoint {what}: {message}"))
}

#[cfg(test)]
mod tests {
    //! Every stream here is written by hand from the format's documented events.

    use lineage_agent::{Assembler, ToolSchema};
    use lineage_log::Text;

    use super::*;
    use crate::failure::{BAD_RESPONSE, EMPTY_RESPONSE, STREAM_CLOSED};
    use crate::wire::testing::{self, call, call_delta, end, finish, message, start, text, usage};

    fn read(wire: &str) -> (Vec<StreamChunk>, Result<(), ModelError>) {
        testing::read(WIRE, wire)
    }

    fn assemble(wire: &str) -> (Vec<StreamChunk>, Assembler) {
        testing::read_whole(WIRE, wire)
    }

    fn failure(wire: &str) -> ModelError {
        testing::failure_of(WIRE, wire)
    }

    fn error_code(reason: &FinishReason) -> Option<&str> {
        match reason {
            FinishReason::Error(failure) => Some(failure.code.as_str()),
            _ => None,
        }
    }

    const OPENING: &str = include_str!("fixtures/responses/opening.sse");

    const HELLO: &str = include_str!("fixtures/responses/hello.sse");

    const HELLO_COMPLETED: &str = r#"event: response.completed
data: {"type":"response.completed","sequence_number":9,"response":{"id":"resp_67c","object":"response","created_at":1741290958,"status":"completed","model":"gpt-4.1-2025-04-14","output":[{"id":"msg_67c","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hello","annotations":[]}]}],"usage":{"input_tokens":37,"input_tokens_details":{"cached_tokens":12},"output_tokens":11,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":48}}}

"#;

    #[test]
    fn a_text_answer_is_one_block_closed_with_its_item_then_usage_then_stop() {
        let wire = format!("{OPENING}{HELLO}{HELLO_COMPLETED}");
        let (chunks, assembler) = assemble(&wire);
        assert_eq!(
            chunks,
            vec![
                start(0, BlockType::Text),
                text(0, "Hel"),
                text(0, "lo"),
                end(0, ContentBlock::text("Hello")),
                usage(37, 11, Some(12)),
                finish(FinishReason::Stop),
            ]
        );
        assert_eq!(assembler.blocks(), vec![ContentBlock::text("Hello")]);
        assert_eq!(assembler.finish(), FinishReason::Stop);
    }

    #[test]
    fn reasoning_then_text_are_two_blocks_in_order() {
        let wire =
            include_str!("fixtures/responses/reasoning_then_text_are_two_blocks_in_order.sse");
        let (chunks, assembler) = assemble(wire);
        assert_eq!(
            chunks,
            vec![
                start(0, BlockType::Reasoning),
                StreamChunk::ReasoningDelta {
                    index: 0,
                    text: "**Adding** two ".into()
                },
                StreamChunk::ReasoningDelta {
                    index: 0,
                    text: "numbers".into()
                },
                end(
                    0,
                    ContentBlock::Reasoning {
                        text: "**Adding** two numbers".into()
                    }
                ),
                start(1, BlockType::Text),
                text(1, "4"),
                end(1, ContentBlock::text("4")),
                usage(20, 90, Some(0)),
                finish(FinishReason::Stop),
            ]
        );
        assert_eq!(
            assembler.blocks(),
            vec![
                ContentBlock::Reasoning {
                    text: "**Adding** two numbers".into()
                },
                ContentBlock::text("4"),
            ]
        );
    }

    #[test]
    fn raw_reasoning_text_from_servers_that_show_it_is_reasoning_too() {
        let wire = include_str!(
            "fixtures/responses/raw_reasoning_text_from_servers_that_show_it_is_reasoning_too.sse"
        );
        let (chunks, assembler) = assemble(wire);
        assert_eq!(
            assembler.blocks(),
            vec![
                ContentBlock::Reasoning {
                    text: "think".into()
                },
                ContentBlock::text("done"),
            ]
        );
        // No item was closed by the stream: the terminal event closes both, and a null usage
        // sends no usage chunk.
        assert!(!chunks.iter().any(|c| matches!(c, StreamChunk::Usage(_))));
        assert_eq!(chunks.last(), Some(&finish(FinishReason::Stop)));
    }

    const PARALLEL_CALLS: &str = include_str!("fixtures/responses/parallel_calls.sse");

    #[test]
    fn parallel_calls_with_interleaved_split_arguments_each_keep_a_block_and_their_call_id() {
        let wire = format!("{OPENING}{PARALLEL_CALLS}");
        let (chunks, assembler) = assemble(&wire);
        assert_eq!(
            chunks,
            vec![
                start(0, BlockType::ToolCall),
                start(1, BlockType::ToolCall),
                call_delta(0, "call_12345xyz", Some("get_weather"), "{\"loca"),
                call_delta(1, "call_67890abc", Some("read_file"), "{\"path\":"),
                call_delta(0, "call_12345xyz", None, "tion\":\"Paris\"}"),
                call_delta(1, "call_67890abc", None, "\"a.txt\"}"),
                end(
                    0,
                    call("call_12345xyz", "get_weather", "{\"location\":\"Paris\"}")
                ),
                end(
                    1,
                    call("call_67890abc", "read_file", "{\"path\":\"a.txt\"}")
                ),
                usage(80, 40, Some(0)),
                finish(FinishReason::ToolCalls),
            ]
        );
        assert_eq!(
            assembler.blocks(),
            vec![
                call("call_12345xyz", "get_weather", "{\"location\":\"Paris\"}"),
                call("call_67890abc", "read_file", "{\"path\":\"a.txt\"}"),
            ]
        );
        assert_eq!(assembler.finish(), FinishReason::ToolCalls);
    }

    #[test]
    fn argument_deltas_naming_their_call_only_by_item_id_find_it() {
        let wire = include_str!(
            "fixtures/responses/argument_deltas_naming_their_call_only_by_item_id_find_it.sse"
        );
        let (chunks, assembler) = assemble(wire);
        assert_eq!(chunks[1], call_delta(0, "call_1", Some("ls"), "{}"));
        assert_eq!(assembler.blocks(), vec![call("call_1", "ls", "{}")]);
        assert_eq!(assembler.finish(), FinishReason::ToolCalls);
    }

    #[test]
    fn usage_is_read_with_or_without_cached_tokens() {
        let completed = |usage: &str| {
            format!(
                "{OPENING}{HELLO}event: response.completed\ndata: {{\"type\":\"response.completed\",\"response\":{{\"status\":\"completed\",\"usage\":{usage}}}}}\n\n"
            )
        };
        let (chunks, assembler) = assemble(&completed(
            r#"{"input_tokens":5,"output_tokens":7,"total_tokens":12}"#,
        ));
        assert_eq!(chunks[chunks.len() - 2], usage(5, 7, None));
        assert_eq!(
            assembler.usage(),
            Some(Usage {
                input_tokens: 5,
                output_tokens: 7,
                cache_read_tokens: None
            })
        );
        let (chunks, _) = assemble(&completed(
            r#"{"input_tokens":2006,"input_tokens_details":{"cached_tokens":1920},"output_tokens":300,"total_tokens":2306}"#,
        ));
        assert_eq!(chunks[chunks.len() - 2], usage(2006, 300, Some(1920)));
        let bad = failure(&completed(r#"{"input_tokens":"many"}"#));
        assert_eq!(bad.code.as_str(), BAD_RESPONSE);
        assert!(bad.message.contains("input_tokens"), "{}", bad.message);
    }

    /// A stream of one partly written message, ending with `terminal` (an event's data).
    fn ending_with(name: &str, response: &str) -> String {
        format!(
            "{OPENING}event: response.output_item.added\n\
data: {{\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":{{\"id\":\"msg_9\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[]}}}}\n\n\
event: response.output_text.delta\n\
data: {{\"type\":\"response.output_text.delta\",\"item_id\":\"msg_9\",\"output_index\":0,\"content_index\":0,\"delta\":\"Once upon\"}}\n\n\
event: {name}\ndata: {{\"type\":\"{name}\",\"response\":{response}}}\n\n"
        )
    }

    #[test]
    fn each_terminal_state_maps_to_its_finish() {
        let incomplete = |reason: &str| {
            ending_with(
                "response.incomplete",
                &format!(
                    r#"{{"status":"incomplete","incomplete_details":{{"reason":"{reason}"}},"usage":{{"input_tokens":9,"output_tokens":16}}}}"#
                ),
            )
        };
        let (chunks, assembler) = assemble(&incomplete("max_output_tokens"));
        assert_eq!(assembler.finish(), FinishReason::MaxTokens);
        assert_eq!(assembler.blocks(), vec![ContentBlock::text("Once upon")]);
        assert_eq!(chunks[chunks.len() - 2], usage(9, 16, None));

        let (_, assembler) = assemble(&incomplete("content_filter"));
        assert_eq!(
            error_code(&assembler.finish()),
            Some("FINISH_CONTENT_FILTER")
        );

        let (_, assembler) = assemble(&ending_with(
            "response.completed",
            r#"{"status":"completed","usage":null}"#,
        ));
        assert_eq!(assembler.finish(), FinishReason::Stop);

        let (_, assembler) = assemble(&format!("{OPENING}{PARALLEL_CALLS}"));
        assert_eq!(assembler.finish(), FinishReason::ToolCalls);

        let (_, assembler) = assemble(&ending_with(
            "response.incomplete",
            r#"{"status":"incomplete","incomplete_details":null}"#,
        ));
        assert_eq!(error_code(&assembler.finish()), Some("FINISH_INCOMPLETE"));
    }

    #[test]
    fn an_unknown_incomplete_reason_is_an_error_finish_naming_it() {
        let wire = ending_with(
            "response.incomplete",
            r#"{"status":"incomplete","incomplete_details":{"reason":"budget.exhausted"}}"#,
        );
        let (_, assembler) = assemble(&wire);
        let FinishReason::Error(failure) = assembler.finish() else {
            panic!("an error finish");
        };
        assert_eq!(failure.code.as_str(), "FINISH_BUDGET_EXHAUSTED");
        assert!(failure.message.contains("budget.exhausted"));
    }

    #[test]
    fn a_long_incomplete_reason_makes_a_bounded_code_and_message() {
        let reason = "x".repeat(10_000);
        let wire = ending_with(
            "response.incomplete",
            &format!(r#"{{"status":"incomplete","incomplete_details":{{"reason":"{reason}"}}}}"#),
        );
        let (_, assembler) = assemble(&wire);
        let FinishReason::Error(failure) = assembler.finish() else {
            panic!("an error finish");
        };
        assert_eq!(failure.code.as_str(), format!("FINISH_{}", "X".repeat(48)));
        assert!(failure.message.len() < 200, "{}", failure.message);
    }

    #[test]
    fn a_refusal_is_an_error_finish_with_the_refusal_as_its_message() {
        let wire = include_str!(
            "fixtures/responses/a_refusal_is_an_error_finish_with_the_refusal_as_its_message.sse"
        );
        let (chunks, assembler) = assemble(wire);
        let FinishReason::Error(failure) = assembler.finish() else {
            panic!("an error finish");
        };
        assert_eq!(failure.code.as_str(), REFUSAL);
        assert!(failure.message.contains("I can't help with that."));
        assert_eq!(assembler.blocks(), vec![]);
        assert_eq!(chunks[0], usage(3, 6, None), "usage still comes first");
    }

    #[test]
    fn a_max_tokens_stop_drops_the_partial_call() {
        let wire = include_str!("fixtures/responses/a_max_tokens_stop_drops_the_partial_call.sse");
        let (chunks, assembler) = assemble(wire);
        assert_eq!(assembler.finish(), FinishReason::MaxTokens);
        assert_eq!(assembler.blocks(), vec![ContentBlock::text("Let me look.")]);
        assert!(chunks.contains(&call_delta(1, "call_m", Some("grep"), "{\"pattern\":\"fo")));
        assert_eq!(chunks.last(), Some(&finish(FinishReason::MaxTokens)));
    }

    #[test]
    fn error_events_and_failed_responses_fail_with_a_code_from_their_wording() {
        let error_event = |data: &str| format!("{OPENING}{HELLO}event: error\ndata: {data}\n\n");
        let cases = [
            (
                r#"{"type":"error","code":"server_error","message":"The server had an error while processing your request.","param":null,"sequence_number":9}"#,
                SERVER,
            ),
            (
                r#"{"type":"error","code":"rate_limit_exceeded","message":"Rate limit reached for gpt-4.1","param":null}"#,
                RATE_LIMIT,
            ),
            (
                r#"{"type":"error","code":"insufficient_quota","message":"You exceeded your current quota","param":null}"#,
                QUOTA,
            ),
            (
                r#"{"type":"error","code":"context_length_exceeded","message":"Your input exceeds the context window of this model.","param":"input"}"#,
                CONTEXT_WINDOW_EXCEEDED,
            ),
            (
                r#"{"type":"error","error":{"type":"invalid_request_error","code":"invalid_prompt","message":"Invalid prompt"}}"#,
                INVALID_REQUEST,
            ),
            (r#"{"type":"error","message":"overloaded"}"#, SERVER),
            (
                r#"{"type":"rate_limit_error","message":"slow down"}"#,
                RATE_LIMIT,
            ),
        ];
        for (data, code) in cases {
            let wire = error_event(data);
            let (chunks, result) = read(&wire);
            let failure = result.expect_err("an error event fails the stream");
            assert_eq!(failure.code.as_str(), code, "{data}");
            // What came before the error came out; nothing closed the stream after it.
            assert_eq!(chunks.first(), Some(&start(0, BlockType::Text)));
            assert!(
                !chunks
                    .iter()
                    .any(|c| matches!(c, StreamChunk::Finish { .. }))
            );
        }
        let failed = failure(&format!(
            "{OPENING}event: response.failed\ndata: {}\n\n",
            r#"{"type":"response.failed","sequence_number":2,"response":{"id":"resp_f","status":"failed","error":{"code":"server_error","message":"The model failed to generate a response."},"output":[],"usage":null}}"#
        ));
        assert_eq!(failed.code.as_str(), SERVER);
        assert!(
            failed
                .message
                .contains("The model failed to generate a response."),
            "{}",
            failed.message
        );
        let failed = failure(&format!(
            "{OPENING}event: response.failed\ndata: {}\n\n",
            r#"{"type":"response.failed","response":{"status":"failed","error":{"code":"rate_limit_exceeded","message":"slow down"}}}"#
        ));
        assert_eq!(failed.code.as_str(), RATE_LIMIT);
    }

    #[test]
    fn malformed_events_are_bad_responses_naming_what_is_wrong() {
        let cases = [
            (
                "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\n\n",
                "not JSON",
            ),
            (
                "event: response.created\ndata: [1,2]\n\n",
                "not a JSON object",
            ),
            (
                "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"m\",\"delta\":\"x\"}\n\n",
                "output_index",
            ),
            (
                "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":7}\n\n",
                "delta",
            ),
            (
                "event: response.function_call_arguments.delta\ndata: {\"type\":\"response.function_call_arguments.delta\",\"item_id\":\"fc_x\",\"output_index\":3,\"delta\":\"{\"}\n\n",
                "never added",
            ),
            (
                "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":{\"id\":\"fc_1\",\"type\":\"function_call\",\"name\":\"ls\"}}\n\n",
                "call_id",
            ),
            (
                "event: response.completed\ndata: {\"type\":\"response.completed\"}\n\n",
                "no response",
            ),
        ];
        for (wire, names) in cases {
            let failure = failure(wire);
            assert_eq!(failure.code.as_str(), BAD_RESPONSE, "{wire}");
            assert!(
                failure.message.contains(names),
                "{wire}: {}",
                failure.message
            );
        }
    }

    #[test]
    fn a_stream_closed_before_its_terminal_event_fails_but_keeps_what_it_read() {
        let (chunks, result) = read(&format!("{OPENING}{HELLO}"));
        assert_eq!(result.map_err(|e| e.code), Err(Text::from(STREAM_CLOSED)));
        assert_eq!(chunks.len(), 4, "the block came out: {chunks:?}");
        let (chunks, result) = read("");
        assert_eq!(result.map_err(|e| e.code), Err(Text::from(STREAM_CLOSED)));
        assert!(chunks.is_empty());
    }

    #[test]
    fn a_completed_response_with_nothing_in_it_is_empty() {
        let wire = format!(
            "{OPENING}event: response.completed\ndata: {}\n\n",
            r#"{"type":"response.completed","sequence_number":2,"response":{"id":"resp_e","status":"completed","output":[],"usage":{"input_tokens":4,"output_tokens":0}}}"#
        );
        assert_eq!(failure(&wire).code.as_str(), EMPTY_RESPONSE);
        // A message whose only part is empty is nothing either.
        let wire = format!(
            "{OPENING}event: response.output_item.done\ndata: {}\n\nevent: response.completed\ndata: {}\n\n",
            r#"{"type":"response.output_item.done","output_index":0,"item":{"id":"m","type":"message","role":"assistant","content":[{"type":"output_text","text":"","annotations":[]}]}}"#,
            r#"{"type":"response.completed","response":{"status":"completed"}}"#
        );
        assert_eq!(failure(&wire).code.as_str(), EMPTY_RESPONSE);
    }

    #[test]
    fn unknown_events_done_markers_comments_and_unlisted_items_are_ignored() {
        let wire = format!(
            "{OPENING}: keep-alive\n\n\
event: response.web_search_call.in_progress\ndata: {{\"type\":\"response.web_search_call.in_progress\",\"output_index\":0,\"item_id\":\"ws_1\"}}\n\n\
event: response.output_item.added\ndata: {{\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":{{\"id\":\"ws_1\",\"type\":\"web_search_call\",\"status\":\"in_progress\"}}}}\n\n\
event: response.something_new\ndata: {{\"type\":\"response.something_new\",\"anything\":[1]}}\n\n\
data: {{\"no\":\"type\"}}\n\n\
{}{HELLO_COMPLETED}data: [DONE]\n\n",
            HELLO.replace("\"output_index\":0", "\"output_index\":1")
        );
        let (chunks, assembler) = assemble(&wire);
        assert_eq!(assembler.blocks(), vec![ContentBlock::text("Hello")]);
        assert_eq!(chunks.len(), 6, "{chunks:?}");
    }

    #[test]
    fn events_named_only_by_their_event_line_are_read_and_output_given_only_at_the_end_is_kept() {
        // A server that sends no deltas: the whole answer in the terminal response, and a
        // data payload without `type` named by its `event:` line.
        let wire = r#"event: response.completed
data: {"response":{"status":"completed","output":[{"id":"rs","type":"reasoning","summary":[{"type":"summary_text","text":"plan"}]},{"id":"m","type":"message","role":"assistant","content":[{"type":"output_text","text":"Hi"}]},{"id":"fc","type":"function_call","call_id":"call_z","name":"run","arguments":"{\"x\":1}"}],"usage":{"input_tokens":1,"output_tokens":2}}}

"#;
        let (chunks, assembler) = assemble(wire);
        assert_eq!(
            chunks,
            vec![
                start(0, BlockType::Reasoning),
                end(
                    0,
                    ContentBlock::Reasoning {
                        text: "plan".into()
                    }
                ),
                start(1, BlockType::Text),
                end(1, ContentBlock::text("Hi")),
                start(2, BlockType::ToolCall),
                end(2, call("call_z", "run", "{\"x\":1}")),
                usage(1, 2, None),
                finish(FinishReason::ToolCalls),
            ]
        );
        assert_eq!(assembler.blocks().len(), 3);
    }

    #[test]
    fn items_only_the_terminal_response_lists_are_kept_and_streamed_ones_are_not_repeated() {
        // `msg_67c` was streamed at output index 0; the response lists another message first,
        // at the position the streamed one had.
        let wire = format!(
            "{OPENING}{HELLO}event: response.completed\ndata: {}\n\n",
            r#"{"type":"response.completed","response":{"status":"completed","output":[{"id":"msg_late","type":"message","role":"assistant","content":[{"type":"output_text","text":"late"}]},{"id":"msg_67c","type":"message","role":"assistant","content":[{"type":"output_text","text":"Hello"}]}]}}"#
        );
        let (_, assembler) = assemble(&wire);
        assert_eq!(
            assembler.blocks(),
            vec![ContentBlock::text("Hello"), ContentBlock::text("late")]
        );
    }

    #[test]
    fn a_message_with_two_text_parts_has_two_blocks() {
        let wire =
            include_str!("fixtures/responses/a_message_with_two_text_parts_has_two_blocks.sse");
        let (chunks, assembler) = assemble(wire);
        assert_eq!(
            assembler.blocks(),
            vec![ContentBlock::text("one"), ContentBlock::text("two")]
        );
        assert_eq!(chunks[2], start(1, BlockType::Text));
    }

    fn request(messages: Vec<Message>) -> ModelRequest {
        testing::request("gpt-4.1", messages)
    }

    #[test]
    fn the_request_carries_the_history_as_items_paired_by_call_id() {
        let mut request = request(vec![
            message(
                Role::User,
                vec![
                    ContentBlock::text("What is in these?"),
                    ContentBlock::Image {
                        media_type: "image/png".into(),
                        attachment: "https://example.com/a.png".into(),
                    },
                    ContentBlock::Image {
                        media_type: "image/jpeg".into(),
                        attachment: "data:image/jpeg;base64,/9j/4AAQ".into(),
                    },
                    ContentBlock::Image {
                        media_type: "image/gif".into(),
                        attachment: "att-7".into(),
                    },
                ],
            ),
            message(
                Role::Assistant,
                vec![
                    ContentBlock::Reasoning {
                        text: "look at both".into(),
                    },
                    ContentBlock::text("Checking."),
                    call("call_1", "read", "{\"path\":\"a\"}"),
                    call("call_2", "read", "{\"path\":\"b\"}"),
                ],
            ),
            message(
                Role::User,
                vec![ContentBlock::ToolResult {
                    tool_call_id: CallId::new("call_1"),
                    content: vec![ContentBlock::text("alpha"), ContentBlock::text("beta")],
                    is_error: false,
                }],
            ),
            message(
                Role::User,
                vec![ContentBlock::ToolResult {
                    tool_call_id: CallId::new("call_2"),
                    content: vec![ContentBlock::text("no such file")],
                    is_error: true,
                }],
            ),
            message(
                Role::Assistant,
                vec![ContentBlock::text("A cat and a dog.")],
            ),
            message(Role::User, vec![ContentBlock::text("Thanks")]),
            message(Role::User, vec![ContentBlock::text("And?")]),
        ]);
        request.system = "You are terse.".into();
        request.max_tokens = Some(2048);
        request.tools = vec![ToolSchema {
            name: "read".into(),
            description: "Reads a file.".into(),
            parameters: json!({"type":"object","properties":{"path":{"type":"string"}}}),
        }];
        assert_eq!(
            body(&request),
            json!({
                "model": "gpt-4.1",
                "stream": true,
                "store": false,
                "instructions": "You are terse.",
                "max_output_tokens": 2048,
                "tools": [{
                    "type": "function",
                    "name": "read",
                    "description": "Reads a file.",
                    "parameters": {"type":"object","properties":{"path":{"type":"string"}}},
                    "strict": false,
                }],
                "input": [
                    {"type": "message", "role": "user", "content": [
                        {"type": "input_text", "text": "What is in these?"},
                        {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "auto"},
                        {"type": "input_image", "image_url": "data:image/jpeg;base64,/9j/4AAQ", "detail": "auto"},
                        {"type": "input_text", "text": "[image image/gif: att-7]"},
                    ]},
                    {"type": "message", "role": "assistant", "content": [
                        {"type": "output_text", "text": "Checking."},
                    ]},
                    {"type": "function_call", "call_id": "call_1", "name": "read", "arguments": "{\"path\":\"a\"}"},
                    {"type": "function_call", "call_id": "call_2", "name": "read", "arguments": "{\"path\":\"b\"}"},
                    {"type": "function_call_output", "call_id": "call_1", "output": "alpha\nbeta"},
                    {"type": "function_call_output", "call_id": "call_2", "output": "no such file"},
                    {"type": "message", "role": "assistant", "content": [
                        {"type": "output_text", "text": "A cat and a dog."},
                    ]},
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Thanks"}]},
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "And?"}]},
                ],
            })
        );
    }

    #[test]
    fn a_bare_request_sends_no_instructions_tools_or_cap() {
        let request = request(vec![message(Role::User, vec![ContentBlock::text("hi")])]);
        assert_eq!(
            body(&request),
            json!({
                "model": "gpt-4.1",
                "stream": true,
                "store": false,
                "input": [
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                ],
            })
        );
        // A message of reasoning alone sends nothing.
        let only_reasoning = input(&[message(
            Role::Assistant,
            vec![ContentBlock::Reasoning { text: "hm".into() }],
        )]);
        assert_eq!(only_reasoning, Vec::<Value>::new());
    }
}
