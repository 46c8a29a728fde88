//! The Anthropic Messages wire format (`POST {base}/messages` with `stream: true`).
//!
//! # The request
//!
//! The system prompt is the top-level `system` string, tools are `{name, description,
//! input_schema}`, and `max_tokens` is always sent (the format requires it: the request's cap,
//! else the endpoint's default). The format wants the roles to alternate, so consecutive history
//! messages of one role are merged into one message; in a merged user message the
//! `tool_result` blocks come first, because the format requires the results of an assistant's
//! `tool_use` blocks at the head of the user message right after it. Blocks the format refuses
//! are left out: text that is empty or only whitespace, and a message left with no block at
//! all.
//!
//! A tool call's `input` must be a JSON object, but the log keeps the arguments exactly as the
//! model wrote them. Arguments that are not a JSON object (empty, cut off, or some other value)
//! are sent as `{}`: the history stays acceptable to the endpoint, and the tool result that
//! follows the call already tells the model what became of it.
//!
//! Images whose attachment is a `data:` URI in base64 become `base64` image sources, and those
//! at an `http(s)` URL become `url` sources; any other attachment (an id only the host can
//! resolve) is sent as a text note naming it.
//!
//! # Thinking: never requested, never sent back
//!
//! The format requires thinking blocks to be passed back with their `signature` (and
//! `redacted_thinking` blocks whole) in tool-use loops, and the log's `Reasoning` block cannot
//! carry a signature yet. So the request never asks for thinking. If a server streams thinking
//! anyway, its text is passed on as reasoning (the log keeps it), but reasoning is never written
//! back into a request, and `signature_delta`s and `redacted_thinking` blocks are dropped.
//!
//! # The answer
//!
//! Named events: `message_start` (input usage), then per content block `content_block_start`,
//! `content_block_delta`s and `content_block_stop`, then `message_delta`s (the stop reason, and
//! cumulative usage), then `message_stop`, the format's end. `ping` may come anywhere and is
//! ignored, as are event types, block types and delta types this module does not know. An
//! `error` event may interrupt a stream that has already started.
//!
//! The format's block indices are used as they are: each block already has its own. A
//! `tool_use` block's start emits, after its `BlockStart`, a `ToolCallDelta` with the call's id
//! and name and no arguments, so the call is known before its input streams. A block's close
//! emits `BlockEnd` with the assembled block, and a tool call whose input never arrived (no
//! `input_json_delta`) is `{}`, which is what the format means by it. A message that ends with a
//! block still open closes it. Usage is emitted only when the server reported some.

use std::collections::BTreeMap;
use std::time::UNIX_EPOCH;

use lineage_agent::{ModelError, ModelRequest};
use lineage_log::{
    BlockType, CallId, ContentBlock, FinishReason, Message, ModelFailure, Role, StreamChunk, Text,
    ToolCallDelta, Usage,
};
use serde_json::{Map, Value, json};

use super::{
    Translate, Wire, bad_response, empty_response, finish_code, json, result_text, shown_reason,
    stream_closed,
};
use crate::failure::{self, INVALID_REQUEST, SERVER};
use crate::sse::Event;

const WIRE: Wire = Wire::AnthropicMessages;

/// The error-finish code of a `refusal` stop.
pub(crate) const REFUSAL: &str = "REFUSAL";

/// The request body.
pub(crate) fn body(request: &ModelRequest, default_max_tokens: u32) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(request.model.as_str()));
    body.insert(
        "max_tokens".into(),
        json!(request.max_tokens.unwrap_or(default_max_tokens)),
    );
    body.insert("stream".into(), json!(true));
    if !request.system.is_empty() {
        body.insert("system".into(), json!(request.system));
    }
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| {
                json!({
                    "name": t.name,
                    "description": t.description,
                    "input_schema": t.parameters,
                })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    body.insert("messages".into(), Value::Array(messages(&request.messages)));
    Value::Object(body)
}

/// The history as the format's alternating messages.
fn messages(history: &[Message]) -> Vec<Value> {
    let mut merged: Vec<(Role, Vec<Value>)> = Vec::new();
    for message in history {
        let blocks: Vec<Value> = message.content.iter().filter_map(block).collect();
        if blocks.is_empty() {
            continue;
        }
        match merged.last_mut() {
            Some((role, content)) if *role == message.role => content.extend(blocks),
            _ => merged.push((message.role, blocks)),
        }
    }
    merged
        .into_iter()
        .map(|(role, mut content)| {
            let role = match role {
                Role::User => "user",
                Role::Assistant => "assistant",
            };
            // Tool results first, each group in its own order (the sort is stable).
            content.sort_by_key(|b| b.get("type") != Some(&json!("tool_result")));
            json!({"role": role, "content": content})
        })
        .collect()
}

/// One content block in the format, or `None` for a block it does not take back.
fn block(block: &ContentBlock) -> Option<Value> {
    match block {
        ContentBlock::Text { text } => text_block(text),
        // Thinking cannot be passed back without its signature (see the module's front comment).
        ContentBlock::Reasoning { .. } => None,
        ContentBlock::Image {
            media_type,
            attachment,
        } => Some(image_block(media_type, attachment).unwrap_or_else(
            || json!({"type": "text", "text": format!("[image {media_type}: {attachment}]")}),
        )),
        ContentBlock::ToolCall {
            id,
            name,
            arguments,
        } => {
            let input = match serde_json::from_str::<Value>(arguments) {
                Ok(Value::Object(input)) => Value::Object(input),
                _ => json!({}),
            };
            Some(
                json!({"type": "tool_use", "id": id.as_str(), "name": name.as_str(), "input": input}),
            )
        }
        ContentBlock::ToolResult {
            tool_call_id,
            content,
            is_error,
        } => Some(json!({
            "type": "tool_result",
            "tool_use_id": tool_call_id.as_str(),
            "content": result_content(content),
            "is_error": is_error,
        })),
    }
}

/// A text block, unless the text is blank (the format refuses blank text blocks).
fn text_block(text: &str) -> Option<Value> {
    (!text.trim().is_empty()).then(|| json!({"type": "text", "text": text}))
}

/// An image block for an attachment the format can reach: a base64 `data:` URI or an
/// `http(s)` URL.
fn image_block(media_type: &str, attachment: &str) -> Option<Value> {
    if let Some(rest) = attachment.strip_prefix("data:") {
        let (meta, data) = rest.split_once(',')?;
        let meta = meta.strip_suffix(";base64")?;
        // The URI's own media type describes its bytes; the block's is the fallback.
        let uri_type = meta.split(';').next().unwrap_or_default();
        let media_type = if uri_type.is_empty() {
            media_type
        } else {
            uri_type
        };
        return Some(json!({
            "type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data},
        }));
    }
    let lower = attachment
        .get(..8)
        .unwrap_or(attachment)
        .to_ascii_lowercase();
    if lower.starts_with("https://") || lower.starts_with("http://") {
        return Some(json!({"type": "image", "source": {"type": "url", "url": attachment}}));
    }
    None
}

/// A tool result's content: a string, or (when it holds an image the format can reach) a list of
/// text and image blocks.
fn result_content(content: &[ContentBlock]) -> Value {
    let has_image = content.iter().any(|b| {
        matches!(b, ContentBlock::Image { media_type, attachment }
            if image_block(media_type, attachment).is_some())
    });
    if !has_image {
        return json!(result_text(content));
    }
    let blocks: Vec<Value> = content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Image {
                media_type,
                attachment,
            } => image_block(media_type, attachment)
                .or_else(|| text_block(&format!("[image {media_type}: {attachment}]"))),
            other => text_block(&result_text(std::slice::from_ref(other))),
        })
        .collect();
    Value::Array(blocks)
}

/// What one content block of the answer is.
#[derive(Debug)]
enum Kind {
    Text,
    Thinking,
    Tool {
        id: CallId,
        name: Text,
        /// The `input` the block opened with, as JSON text, when it was a non-empty object: the
        /// call's arguments if no `input_json_delta` follows.
        opening_input: Option<String>,
    },
    /// A block this module does not read (`redacted_thinking`, server tools, types to come).
    Other,
}

#[derive(Debug)]
struct Block {
    kind: Kind,
    /// The text, reasoning or input JSON so far.
    text: String,
    open: bool,
}

impl Block {
    /// The assembled block, or `None` for a block that is not read.
    fn assembled(&self) -> Option<ContentBlock> {
        let text = Text::from(self.text.as_str());
        Some(match &self.kind {
            Kind::Text => ContentBlock::Text { text },
            Kind::Thinking => ContentBlock::Reasoning { text },
            Kind::Tool {
                id,
                name,
                opening_input,
            } => {
                let arguments = if !self.text.trim().is_empty() {
                    text
                } else if let Some(input) = opening_input {
                    Text::from(input.as_str())
                } else {
                    // No input at all: the format's way of saying an empty object.
                    Text::from("{}")
                };
                ContentBlock::ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments,
                }
            }
            Kind::Other => return None,
        })
    }

    /// Whether this block is content a normal stop may end with.
    fn is_content(&self) -> bool {
        match self.kind {
            Kind::Text | Kind::Thinking => !self.text.is_empty(),
            Kind::Tool { .. } => true,
            Kind::Other => false,
        }
    }
}

/// Token counts as the format reports them, the latest report of each field winning (the
/// `message_delta` counts are cumulative).
#[derive(Debug, Default)]
struct Counts {
    seen: bool,
    /// Input tokens neither read from nor written to the cache.
    input: u64,
    cache_creation: u64,
    cache_read: Option<u64>,
    output: u64,
}

impl Counts {
    fn read(&mut self, usage: &Value) -> Result<(), ModelError> {
        let Some(usage) = usage.as_object() else {
            if usage.is_null() {
                return Ok(());
            }
            return Err(bad_response(WIRE, "a usage that is not an object"));
        };
        let count = |field: &str| -> Result<Option<u64>, ModelError> {
            match usage.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                    bad_response(WIRE, format_args!("usage {field} is not a count: {v}"))
                }),
            }
        };
        self.seen = true;
        if let Some(n) = count("input_tokens")? {
            self.input = n;
        }
        if let Some(n) = count("cache_creation_input_tokens")? {
            self.cache_creation = n;
        }
        if let Some(n) = count("cache_read_input_tokens")? {
            self.cache_read = Some(n);
        }
        if let Some(n) = count("output_tokens")? {
            self.output = n;
        }
        Ok(())
    }

    /// The usage chunk's counts. The format's `input_tokens` leaves out the tokens read from or
    /// written to the cache; Lineage counts every token sent, so they are added back.
    fn usage(&self) -> Usage {
        Usage {
            input_tokens: self
                .input
                .saturating_add(self.cache_creation)
                .saturating_add(self.cache_read.unwrap_or(0)),
            output_tokens: self.output,
            cache_read_tokens: self.cache_read,
        }
    }
}

/// Reads one answer.
#[derive(Debug, Default)]
pub(crate) struct Translator {
    /// `message_start` was read.
    started: bool,
    /// The blocks by the format's index.
    blocks: BTreeMap<u32, Block>,
    counts: Counts,
    /// The latest `message_delta`'s stop reason.
    stop_reason: Option<String>,
    /// `message_stop` was read.
    done: bool,
    /// `end` has run: nothing more is emitted.
    ended: bool,
}

impl Translate for Translator {
    fn event(&mut self, event: &Event, out: &mut Vec<StreamChunk>) -> Result<(), ModelError> {
        if self.done || self.ended {
            return Ok(());
        }
        self.read(event, out)
    }

    fn is_done(&self) -> bool {
        self.done
    }

    fn end(&mut self, out: &mut Vec<StreamChunk>) -> Result<(), ModelError> {
        if std::mem::replace(&mut self.ended, true) {
            return Ok(());
        }
        if !self.done {
            return Err(stream_closed(WIRE));
        }
        let reason = self
            .stop_reason
            .take()
            .ok_or_else(|| bad_response(WIRE, "the message stopped without a stop reason"))?;
        let finish = finish_reason(&reason);
        let normal = matches!(finish, FinishReason::Stop | FinishReason::ToolCalls);
        if normal && !self.blocks.values().any(Block::is_content) {
            return Err(empty_response(WIRE));
        }
        // The message is over, and so is any block the server left open.
        for (index, block) in &mut self.blocks {
            if block.open {
                block.open = false;
                if let Some(assembled) = block.assembled() {
                    out.push(StreamChunk::BlockEnd {
                        index: *index,
                        block: Box::new(assembled),
                    });
                }
            }
        }
        if self.counts.seen {
            out.push(StreamChunk::Usage(Box::new(self.counts.usage())));
        }
        out.push(StreamChunk::Finish { reason: finish });
        Ok(())
    }
}

impl Translator {
    fn read(&mut self, event: &Event, out: &mut Vec<StreamChunk>) -> Result<(), ModelError> {
        let data = json(WIRE, event)?;
        // The data's `type` is the event's type; the event's name is the fallback.
        let kind = match data.get("type").and_then(Value::as_str) {
            Some(kind) => kind,
            None if !event.event.is_empty() => event.event.as_str(),
            None => return Err(bad_response(WIRE, "an event has no type")),
        };
        match kind {
            "message_start" => {
                if self.started {
                    return Err(bad_response(WIRE, "a second message_start"));
                }
                let message = data
                    .get("message")
                    .filter(|m| m.is_object())
                    .ok_or_else(|| bad_response(WIRE, "a message_start without its message"))?;
                if let Some(usage) = message.get("usage") {
                    self.counts.read(usage)?;
                }
                self.started = true;
            }
            "content_block_start" => {
                self.expect_started(kind)?;
                self.block_start(&data, out)?;
            }
            "content_block_delta" => {
                self.expect_started(kind)?;
                self.block_delta(&data, out)?;
            }
            "content_block_stop" => {
                self.expect_started(kind)?;
                let index = index(&data, kind)?;
                let block = self.open_block(index, kind)?;
                block.open = false;
                if let Some(assembled) = block.assembled() {
                    out.push(StreamChunk::BlockEnd {
                        index,
                        block: Box::new(assembled),
                    });
                }
            }
            "message_delta" => {
                self.expect_started(kind)?;
                match data.pointer("/delta/stop_reason") {
                    None | Some(Value::Null) => {}
                    Some(Value::String(reason)) => self.stop_reason = Some(reason.clone()),
                    Some(other) => {
                        return Err(bad_response(
                            WIRE,
                            format_args!("a stop reason that is not a string: {other}"),
                        ));
                    }
                }
                if let Some(usage) = data.get("usage") {
                    self.counts.read(usage)?;
                }
            }
            "message_stop" => {
                self.expect_started(kind)?;
                self.done = true;
            }
            "error" => return Err(server_error(&data)),
            // `ping` is a keep-alive; unknown types are for later versions of the format.
            _ => {}
        }
        Ok(())
    }

    fn expect_started(&self, kind: &str) -> Result<(), ModelError> {
        if self.started {
            Ok(())
        } else {
            Err(bad_response(
                WIRE,
                format_args!("a {kind} before message_start"),
            ))
        }
    }

    fn open_block(&mut self, index: u32, kind: &str) -> Result<&mut Block, ModelError> {
        match self.blocks.get_mut(&index) {
            Some(block) if block.open => Ok(block),
            Some(_) => Err(bad_response(
                WIRE,
                format_args!("a {kind} for block {index} after it stopped"),
            )),
            None => Err(bad_response(
                WIRE,
                format_args!("a {kind} for block {index}, which never started"),
            )),
        }
    }

    fn block_start(&mut self, data: &Value, out: &mut Vec<StreamChunk>) -> Result<(), ModelError> {
        let index = index(data, "content_block_start")?;
        if self.blocks.contains_key(&index) {
            return Err(bad_response(
                WIRE,
                format_args!("block {index} started twice"),
            ));
        }
        let content = data
            .get("content_block")
            .filter(|c| c.is_object())
            .ok_or_else(|| bad_response(WIRE, "a content_block_start without its block"))?;
        let field = |name: &str| content.get(name).and_then(Value::as_str);
        let block_type = field("type")
            .ok_or_else(|| bad_response(WIRE, format_args!("block {index} has no type")))?;
        let mut block = Block {
            kind: Kind::Other,
            text: String::new(),
            open: true,
        };
        match block_type {
            "text" | "thinking" => {
                let (kind, block_type, opening) = if block_type == "text" {
                    (Kind::Text, BlockType::Text, field("text"))
                } else {
                    (Kind::Thinking, BlockType::Reasoning, field("thinking"))
                };
                block.kind = kind;
                out.push(StreamChunk::BlockStart { index, block_type });
                if let Some(text) = opening.filter(|t| !t.is_empty()) {
                    block.text.push_str(text);
                    out.push(text_chunk(&block.kind, index, text));
                }
            }
            "tool_use" => {
                let id = field("id").filter(|id| !id.is_empty()).ok_or_else(|| {
                    bad_response(WIRE, format_args!("tool_use block {index} has no id"))
                })?;
                let name = field("name").filter(|n| !n.is_empty()).ok_or_else(|| {
                    bad_response(WIRE, format_args!("tool_use block {index} has no name"))
                })?;
                let opening_input = match content.get("input") {
                    Some(Value::Object(input)) if !input.is_empty() => {
                        Some(Value::Object(input.clone()).to_string())
                    }
                    _ => None,
                };
                let (id, name) = (CallId::new(id), Text::from(name));
                out.push(StreamChunk::BlockStart {
                    index,
                    block_type: BlockType::ToolCall,
                });
                // The call's name is known now; its arguments follow.
                out.push(StreamChunk::ToolCallDelta(Box::new(ToolCallDelta {
                    index,
                    id: id.clone(),
                    name: Some(name.clone()),
                    arguments_delta: Text::default(),
                })));
                block.kind = Kind::Tool {
                    id,
                    name,
                    opening_input,
                };
            }
            // `redacted_thinking` is only of use passed back, which the log cannot do; other
            // types (server tools, types to come) are not content Lineage reads.
            _ => {}
        }
        self.blocks.insert(index, block);
        Ok(())
    }

    fn block_delta(&mut self, data: &Value, out: &mut Vec<StreamChunk>) -> Result<(), ModelError> {
        const KIND: &str = "content_block_delta";
        let index = index(data, KIND)?;
        let delta = data
            .get("delta")
            .filter(|d| d.is_object())
            .ok_or_else(|| bad_response(WIRE, "a content_block_delta without its delta"))?;
        let delta_type = delta.get("type").and_then(Value::as_str).ok_or_else(|| {
            bad_response(WIRE, format_args!("a delta for block {index} has no type"))
        })?;
        let block = self.open_block(index, KIND)?;
        let field = match (&block.kind, delta_type) {
            (Kind::Other, _) => return Ok(()),
            (Kind::Text, "text_delta") => "text",
            (Kind::Thinking, "thinking_delta") => "thinking",
            (Kind::Tool { .. }, "input_json_delta") => "partial_json",
            (_, "text_delta" | "thinking_delta" | "input_json_delta") => {
                return Err(bad_response(
                    WIRE,
                    format_args!("a {delta_type} for block {index}, which is not of its kind"),
                ));
            }
            // A signature can only be passed back with its thinking, which the log cannot do;
            // other delta types (citations among them) are not content Lineage reads.
            _ => return Ok(()),
        };
        let text = delta.get(field).and_then(Value::as_str).ok_or_else(|| {
            bad_response(
                WIRE,
                format_args!("a {delta_type} for block {index} has no {field} string"),
            )
        })?;
        if text.is_empty() {
            return Ok(());
        }
        block.text.push_str(text);
        out.push(text_chunk(&block.kind, index, text));
        Ok(())
    }
}

/// The delta chunk of `text` for a block of `kind` (never [`Kind::Other`]).
fn text_chunk(kind: &Kind, index: u32, text: &str) -> StreamChunk {
    match kind {
        Kind::Thinking => StreamChunk::ReasoningDelta {
            index,
            text: text.into(),
        },
        Kind::Tool { id, .. } => StreamChunk::ToolCallDelta(Box::new(ToolCallDelta {
            index,
            id: id.clone(),
            name: None,
            arguments_delta: text.into(),
        })),
        Kind::Text | Kind::Other => StreamChunk::TextDelta {
            index,
            text: text.into(),
        },
    }
}

/// An event's block index.
fn index(data: &Value, kind: &str) -> Result<u32, ModelError> {
    data.get("index")
        .and_then(Value::as_u64)
        .and_then(|i| u32::try_from(i).ok())
        .ok_or_else(|| bad_response(WIRE, format_args!("a {kind} without a valid index")))
}

/// The finish a stop reason means.
fn finish_reason(reason: &str) -> FinishReason {
    let error = |code: String, message: String| {
        FinishReason::Error(Box::new(ModelFailure {
            message: message.into(),
            code: code.into(),
        }))
    };
    match reason {
        "end_turn" | "stop_sequence" => FinishReason::Stop,
        "tool_use" => FinishReason::ToolCalls,
        // Both cut the answer off at a token limit (the output cap, or the context window).
        "max_tokens" | "model_context_window_exceeded" => FinishReason::MaxTokens,
        "refusal" => error(
            REFUSAL.to_owned(),
            "the model declined to answer (stop reason refusal)".to_owned(),
        ),
        // `pause_turn` asks the client to send the paused answer back so the server can carry
        // on. The turn loop cannot continue a step, so the answer is incomplete: a failure, not
        // a stop that would pass half an answer off as whole. Any other reason is one this
        // module does not know, and it cannot tell whether the answer is whole either.
        other => error(
            finish_code(other),
            format!(
                "the {WIRE} endpoint stopped with stop reason {:?}, which Lineage cannot act on",
                shown_reason(other)
            ),
        ),
    }
}

/// The failure an `error` event reports. Its error type names the HTTP status the same failure
/// has as an error response; the code is then decided as [`failure::classify`] decides it for
/// that status and the event's wording, so a mid-stream error and an error response get the same
/// code (a spend limit reached is `QUOTA`, a prompt too long `CONTEXT_WINDOW_EXCEEDED`).
fn server_error(data: &Value) -> ModelError {
    let error_type = data
        .pointer("/error/type")
        .and_then(Value::as_str)
        .unwrap_or("");
    let status = match error_type {
        "invalid_request_error" | "not_found_error" => Some(400),
        "authentication_error" => Some(401),
        "billing_error" => Some(402),
        "permission_error" => Some(403),
        "request_too_large" => Some(413),
        "rate_limit_error" => Some(429),
        "api_error" | "timeout_error" => Some(500),
        "overloaded_error" => Some(529),
        _ => None,
    };
    let (code, request_id) = match status {
        Some(status) => {
            let classified = failure::classify(status, |_| None, &data.to_string(), UNIX_EPOCH);
            (classified.code, classified.request_id)
        }
        // An error the format does not document yet: the endpoint failed.
        None => (SERVER.to_owned(), None),
    };
    // Every status in the table above has a code of its own; this keeps it so should the
    // classification ever fall back to `HTTP_<status>` for one of them.
    let code = if code.starts_with("HTTP_") {
        INVALID_REQUEST.to_owned()
    } else {
        code
    };
    let message = data
        .pointer("/error/message")
        .and_then(Value::as_str)
        .filter(|m| !m.trim().is_empty())
        .map(failure::bound);
    // The type is the server's word too: an undocumented one is shown bounded.
    let kind = if error_type.is_empty() {
        "an error".to_owned()
    } else {
        shown_reason(error_type)
    };
    let message = match message {
        Some(m) => format!("the {WIRE} stream reported {kind}: {m}"),
        None => format!("the {WIRE} stream reported {kind}"),
    };
    let mut error = ModelError::new(code, message);
    error.request_id = request_id.map(Text::from);
    error
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AnswerReader;
    use crate::failure::{
        AUTH, BAD_RESPONSE, CONTEXT_WINDOW_EXCEEDED, EMPTY_RESPONSE, QUOTA, RATE_LIMIT,
        STREAM_CLOSED,
    };
    use crate::wire::testing::{
        self, assemble, call, check_promises, end, finish, message, result, start, text, usage,
    };
    use lineage_agent::ToolSchema;

    /// Reads `wire` (event-stream text) whole, then ends the stream.
    fn read(wire: &str) -> Result<Vec<StreamChunk>, ModelError> {
        let (chunks, result) = testing::read(WIRE, wire);
        result.map(|()| chunks)
    }

    fn code(wire: &str) -> String {
        testing::failure_of(WIRE, wire).code.to_string()
    }

    const TEXT: &str = include_str!("fixtures/anthropic/text.sse");

    #[test]
    fn a_text_answer_reads_to_its_chunks_usage_and_stop() {
        let chunks = read(TEXT).expect("a valid answer");
        check_promises(&chunks);
        assert_eq!(
            chunks,
            vec![
                start(0, BlockType::Text),
                text(0, "Hello"),
                text(0, "!"),
                end(0, ContentBlock::text("Hello!")),
                usage(25, 15, None),
                finish(FinishReason::Stop),
            ]
        );
    }

    /// `text` with `end_turn` replaced by `reason`.
    fn stopping(reason: &str) -> String {
        TEXT.replace(
            r#""stop_reason":"end_turn""#,
            &format!(r#""stop_reason":"{reason}""#),
        )
    }

    #[test]
    fn each_stop_reason_has_its_finish() {
        for (reason, finish) in [
            ("end_turn", FinishReason::Stop),
            ("stop_sequence", FinishReason::Stop),
            ("max_tokens", FinishReason::MaxTokens),
            ("model_context_window_exceeded", FinishReason::MaxTokens),
        ] {
            let chunks = read(&stopping(reason)).expect("a valid answer");
            assert_eq!(assemble(&chunks).finish(), finish, "{reason}");
        }
        for (reason, code) in [
            ("refusal", REFUSAL),
            ("pause_turn", "FINISH_PAUSE_TURN"),
            ("a-new reason", "FINISH_A_NEW_REASON"),
        ] {
            let chunks = read(&stopping(reason)).expect("a valid answer");
            check_promises(&chunks);
            let assembler = assemble(&chunks);
            let FinishReason::Error(failure) = assembler.finish() else {
                panic!(
                    "{reason} should be an error finish: {:?}",
                    assembler.finish()
                );
            };
            assert_eq!(failure.code, code, "{reason}");
            assert!(failure.message.contains(reason), "{}", failure.message);
            // The text streamed before the stop is kept.
            assert_eq!(assembler.blocks(), vec![ContentBlock::text("Hello!")]);
        }
    }

    #[test]
    fn reasoning_then_text_are_separate_blocks_and_the_signature_is_dropped() {
        let wire = include_str!(
            "fixtures/anthropic/reasoning_then_text_are_separate_blocks_and_the_signature_is_dropped.sse"
        );
        let chunks = read(wire).expect("a valid answer");
        check_promises(&chunks);
        assert_eq!(chunks[0], start(0, BlockType::Reasoning));
        let assembler = assemble(&chunks);
        assert_eq!(
            assembler.blocks(),
            vec![
                ContentBlock::Reasoning {
                    text: "Let me solve this step by step:\n\n1. First break down 27 * 453\n2. 453 = 400 + 50 + 3"
                        .into()
                },
                ContentBlock::text("27 * 453 = 12,231"),
            ]
        );
        // Input counts every token sent: uncached, written to the cache and read from it.
        assert_eq!(
            assembler.usage(),
            Some(Usage {
                input_tokens: 105,
                output_tokens: 100,
                cache_read_tokens: Some(90)
            })
        );
        assert_eq!(assembler.finish(), FinishReason::Stop);
    }

    const PARALLEL: &str = include_str!("fixtures/anthropic/parallel.sse");

    #[test]
    fn parallel_tool_calls_with_interleaved_split_arguments_keep_their_ids() {
        let chunks = read(PARALLEL).expect("a valid answer");
        check_promises(&chunks);
        for chunk in &chunks {
            if let StreamChunk::ToolCallDelta(d) = chunk {
                let expected = if d.index == 1 {
                    "toolu_01T1x1fJ34qAmk2tNTrN7Up6"
                } else {
                    "toolu_02Ab"
                };
                assert_eq!(d.id.as_str(), expected, "{d:?}");
            }
        }
        let assembler = assemble(&chunks);
        assert_eq!(
            assembler.blocks(),
            vec![
                ContentBlock::text("Checking both."),
                call(
                    "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
                    "get_weather",
                    r#"{"location": "San Francisco, CA"}"#
                ),
                call("toolu_02Ab", "get_time", r#"{"zone": "Europe/Paris"}"#),
            ]
        );
        assert_eq!(assembler.finish(), FinishReason::ToolCalls);
        assert_eq!(
            assembler.usage(),
            Some(Usage {
                input_tokens: 472,
                output_tokens: 89,
                cache_read_tokens: None
            })
        );
    }

    #[test]
    fn a_tool_call_without_input_deltas_has_an_empty_object() {
        let wire = include_str!(
            "fixtures/anthropic/a_tool_call_without_input_deltas_has_an_empty_object.sse"
        );
        let chunks = read(wire).expect("a valid answer");
        assert_eq!(
            assemble(&chunks).blocks(),
            vec![call("toolu_9", "list_files", "{}")]
        );
    }

    #[test]
    fn a_max_tokens_stop_drops_the_partial_tool_call() {
        let wire =
            include_str!("fixtures/anthropic/a_max_tokens_stop_drops_the_partial_tool_call.sse");
        let chunks = read(wire).expect("a valid answer");
        check_promises(&chunks);
        let assembler = assemble(&chunks);
        assert_eq!(assembler.finish(), FinishReason::MaxTokens);
        assert_eq!(
            assembler.blocks(),
            vec![ContentBlock::text("Writing the file.")]
        );
    }

    /// `TEXT` cut after its first delta, followed by `tail`.
    fn after_first_delta(tail: &str) -> String {
        let cut = TEXT.find("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"!\"").expect("the second delta");
        format!("{}{tail}", &TEXT[..cut])
    }

    #[test]
    fn a_mid_stream_error_of_long_words_is_told_in_bounded_words() {
        let (kind, said) = ("x".repeat(5000), "y".repeat(5000));
        let wire = after_first_delta(&format!(
            "event: error\ndata: {{\"type\":\"error\",\"error\":{{\"type\":\"{kind}\",\"message\":\"{said}\"}}}}\n\n"
        ));
        let failure = testing::failure_of(WIRE, &wire);
        assert_eq!(failure.code, SERVER, "an undocumented type");
        assert!(
            failure.message.chars().count() <= 48 + failure::MESSAGE_BOUND + 64,
            "{} characters",
            failure.message.chars().count()
        );
    }

    #[test]
    fn a_mid_stream_error_event_fails_with_a_code_of_its_kind() {
        for (error, expected) in [
            (
                r#"{"type":"overloaded_error","message":"Overloaded"}"#,
                SERVER,
            ),
            (
                r#"{"type":"api_error","message":"Internal server error"}"#,
                SERVER,
            ),
            (
                r#"{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}"#,
                RATE_LIMIT,
            ),
            (
                r#"{"type":"rate_limit_error","message":"spend limit reached","details":{"error_code":"enforced_spend_limit_reached"}}"#,
                QUOTA,
            ),
            (
                r#"{"type":"authentication_error","message":"invalid x-api-key"}"#,
                AUTH,
            ),
            (
                r#"{"type":"permission_error","message":"Your API key does not have permission to use the specified resource."}"#,
                AUTH,
            ),
            (
                r#"{"type":"billing_error","message":"Your credit balance is too low"}"#,
                QUOTA,
            ),
            (
                r#"{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}"#,
                CONTEXT_WINDOW_EXCEEDED,
            ),
            (
                r#"{"type":"invalid_request_error","message":"messages.1.content: Field required"}"#,
                INVALID_REQUEST,
            ),
            (
                r#"{"type":"not_found_error","message":"model: claude-x"}"#,
                INVALID_REQUEST,
            ),
            (r#"{"type":"some_future_error","message":"?"}"#, SERVER),
        ] {
            let wire = after_first_delta(&format!(
                "event: error\ndata: {{\"type\":\"error\",\"error\":{error}}}\n\n"
            ));
            let mut reader = AnswerReader::new(Wire::AnthropicMessages);
            let mut out = Vec::new();
            let failure = reader
                .push(wire.as_bytes(), &mut out)
                .expect_err("the error event fails the stream");
            assert_eq!(failure.code, expected, "{error}");
            assert!(
                failure.message.contains("stream reported"),
                "{}",
                failure.message
            );
            assert_eq!(failure.status, None);
            // What came before the error was read, and nothing after it.
            assert!(
                matches!(out.last(), Some(StreamChunk::TextDelta { text, .. }) if text == "Hello")
            );
        }
        let with_id = after_first_delta(
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"},\"request_id\":\"req_011\"}\n\n",
        );
        let failure = read(&with_id).expect_err("fails");
        assert_eq!(failure.request_id.as_deref(), Some("req_011"));
        assert_eq!(
            failure.message,
            "the anthropic stream reported overloaded_error: Overloaded"
        );
    }

    #[test]
    fn malformed_events_fail_with_bad_response() {
        let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":1}}}\n\n";
        for bad in [
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hel",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":7,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\"}}",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":7}}",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":-1,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":3}}",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"output_tokens\":\"many\"}}",
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}",
            "data: {\"index\":0}",
        ] {
            let wire = format!(
                "{start}event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"text\",\"text\":\"\"}}}}\n\n{bad}\n\n"
            );
            assert_eq!(code(&wire), BAD_RESPONSE, "{bad}");
        }
        let before_start = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n";
        assert_eq!(code(before_start), BAD_RESPONSE);
        let no_id = format!(
            "{start}event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{{\"type\":\"tool_use\",\"name\":\"x\",\"input\":{{}}}}}}\n\n"
        );
        assert_eq!(code(&no_id), BAD_RESPONSE);
        let no_reason = TEXT.replace(r#""stop_reason":"end_turn""#, r#""stop_reason":null"#);
        let failure = read(&no_reason).expect_err("fails");
        assert_eq!(failure.code, BAD_RESPONSE);
        assert!(
            failure.message.contains("without a stop reason"),
            "{}",
            failure.message
        );
    }

    #[test]
    fn unknown_events_blocks_and_deltas_are_ignored() {
        let wire = TEXT
            .replace(
                "event: ping\n",
                "event: future_event\ndata: {\"type\":\"future_event\",\"x\":1}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":5,\"content_block\":{\"type\":\"server_tool_use\",\"id\":\"srvtoolu_1\",\"name\":\"web_search\",\"input\":{}}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":5,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"citations_delta\",\"citation\":{}}}\n\nevent: ping\n",
            );
        let chunks = read(&wire).expect("a valid answer");
        assert_eq!(chunks, read(TEXT).expect("a valid answer"));
    }

    #[test]
    fn nothing_is_read_after_message_stop() {
        let more = format!(
            "{TEXT}event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":1,\"content_block\":{{\"type\":\"text\",\"text\":\"late\"}}}}\n\nevent: error\ndata: {{\"type\":\"error\",\"error\":{{\"type\":\"api_error\"}}}}\n\n"
        );
        assert_eq!(
            read(&more).expect("a valid answer"),
            read(TEXT).expect("a valid answer")
        );
        let mut translator = Translator::default();
        let mut out = Vec::new();
        for event in crate::sse::Decoder::new()
            .push(TEXT.as_bytes())
            .expect("valid")
        {
            if let crate::sse::Frame::Event(event) = event {
                translator.event(&event, &mut out).expect("valid");
            }
        }
        translator.end(&mut out).expect("ends");
        let ended = out.len();
        translator.end(&mut out).expect("a second end adds nothing");
        assert_eq!(out.len(), ended);
    }

    #[test]
    fn a_stream_closed_before_message_stop_fails_with_stream_closed() {
        let cut = TEXT.find("event: message_stop").expect("the end");
        assert_eq!(code(&TEXT[..cut]), STREAM_CLOSED);
        assert_eq!(code(&after_first_delta("")), STREAM_CLOSED);
        assert_eq!(code(""), STREAM_CLOSED);
    }

    #[test]
    fn a_normal_stop_with_no_content_fails_with_empty_response() {
        let empty = include_str!(
            "fixtures/anthropic/a_normal_stop_with_no_content_fails_with_empty_response_empty.sse"
        );
        assert_eq!(code(empty), EMPTY_RESPONSE);
        // An empty text block is no content either.
        let empty_text = TEXT
            .replace(r#""text":"Hello""#, r#""text":"""#)
            .replace(r#""text":"!""#, r#""text":"""#);
        assert_eq!(code(&empty_text), EMPTY_RESPONSE);
        // A max-tokens stop with nothing is not a normal stop: it finishes as such.
        let cut_off = empty.replace("end_turn", "max_tokens");
        let chunks = read(&cut_off).expect("a valid answer");
        assert_eq!(assemble(&chunks).finish(), FinishReason::MaxTokens);
    }

    fn request(messages: Vec<Message>, tools: Vec<ToolSchema>, system: &str) -> ModelRequest {
        let mut request = testing::request("claude-sonnet-4-5", messages);
        request.system = system.into();
        request.tools = tools;
        request
    }

    #[test]
    fn a_history_with_tool_calls_and_results_is_written_as_alternating_messages() {
        let history = vec![
            message(Role::User, vec![ContentBlock::text("What is the weather?")]),
            message(
                Role::Assistant,
                vec![
                    ContentBlock::Reasoning {
                        text: "two lookups".into(),
                    },
                    ContentBlock::text("Looking."),
                    call("toolu_1", "get_weather", r#"{"city":"Paris"}"#),
                    call("toolu_2", "get_time", ""),
                    call("toolu_3", "broken", r#"{"city":"Par"#),
                ],
            ),
            result("toolu_1", "rain", false),
            message(Role::User, vec![ContentBlock::text("  ")]),
            result("toolu_2", "noon", false),
            result("toolu_3", "the arguments are not JSON", true),
            message(Role::User, vec![ContentBlock::text("Be brief.")]),
        ];
        let tools = vec![ToolSchema {
            name: "get_weather".into(),
            description: "The weather in a city.".into(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        }];
        let body = body(&request(history, tools, "You are terse."), 4096);
        assert_eq!(
            body,
            json!({
                "model": "claude-sonnet-4-5",
                "max_tokens": 4096,
                "stream": true,
                "system": "You are terse.",
                "tools": [{
                    "name": "get_weather",
                    "description": "The weather in a city.",
                    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                }],
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "What is the weather?"}]},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "Looking."},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                        {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {}},
                        {"type": "tool_use", "id": "toolu_3", "name": "broken", "input": {}},
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "rain", "is_error": false},
                        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "noon", "is_error": false},
                        {"type": "tool_result", "tool_use_id": "toolu_3", "content": "the arguments are not JSON", "is_error": true},
                        {"type": "text", "text": "Be brief."},
                    ]},
                ],
            })
        );
    }

    #[test]
    fn text_sent_before_the_results_still_follows_them() {
        let history = vec![
            message(Role::User, vec![ContentBlock::text("go")]),
            message(Role::Assistant, vec![call("toolu_1", "run", "{}")]),
            message(Role::User, vec![ContentBlock::text("(also: hurry)")]),
            result("toolu_1", "done", false),
        ];
        let mut request = request(history, Vec::new(), "");
        request.max_tokens = Some(64);
        let body = body(&request, 4096);
        assert_eq!(body["max_tokens"], 64);
        assert!(
            body.get("system").is_none(),
            "an empty system prompt is not sent"
        );
        assert!(
            body.get("tools").is_none(),
            "an empty tool list is not sent"
        );
        assert_eq!(
            body["messages"][2],
            json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "done", "is_error": false},
                {"type": "text", "text": "(also: hurry)"},
            ]})
        );
    }

    #[test]
    fn images_are_sent_by_url_or_base64_and_anything_else_as_a_note() {
        let image = |media_type: &str, attachment: &str| ContentBlock::Image {
            media_type: media_type.into(),
            attachment: attachment.into(),
        };
        let history = vec![
            message(
                Role::User,
                vec![
                    ContentBlock::text("What are these?"),
                    image("image/png", "data:image/png;base64,iVBORw0KGgo="),
                    image("image/jpeg", "https://example.com/cat.jpg"),
                    image("image/gif", "attachment-42"),
                    image("image/png", "data:image/png,rawbytes"),
                ],
            ),
            message(Role::Assistant, vec![call("toolu_1", "screenshot", "{}")]),
            message(
                Role::User,
                vec![ContentBlock::ToolResult {
                    tool_call_id: CallId::new("toolu_1"),
                    content: vec![
                        ContentBlock::text("the screen:"),
                        image("image/webp", "data:image/webp;base64,UklGRg=="),
                    ],
                    is_error: false,
                }],
            ),
        ];
        let body = body(&request(history, Vec::new(), ""), 1024);
        assert_eq!(
            body["messages"],
            json!([
                {"role": "user", "content": [
                    {"type": "text", "text": "What are these?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                    {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
                    {"type": "text", "text": "[image image/gif: attachment-42]"},
                    {"type": "text", "text": "[image image/png: data:image/png,rawbytes]"},
                ]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": false, "content": [
                        {"type": "text", "text": "the screen:"},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/webp", "data": "UklGRg=="}},
                    ]},
                ]},
            ])
        );
    }

    #[test]
    fn a_reasoning_only_message_is_left_out_and_its_neighbours_merge() {
        let history = vec![
            message(Role::User, vec![ContentBlock::text("a")]),
            message(
                Role::Assistant,
                vec![ContentBlock::Reasoning { text: "hmm".into() }],
            ),
            message(Role::User, vec![ContentBlock::text("b")]),
        ];
        let body = body(&request(history, Vec::new(), ""), 1024);
        assert_eq!(
            body["messages"],
            json!([{"role": "user", "content": [
                {"type": "text", "text": "a"},
                {"type": "text", "text": "b"},
            ]}])
        );
    }
}
