//! The OpenAI-compatible Chat Completions wire format: `POST {base}/chat/completions` with
//! `stream: true`, answered by unnamed server-sent events, each a `chat.completion.chunk` JSON
//! object, ended by `data: [DONE]`.
//!
//! Reading: `choices[0].delta` carries `content`, reasoning (`reasoning_content` from DeepSeek
//! and the servers that copy it, `reasoning` from others) and `tool_calls[]`, whose entries are
//! keyed by `index`; a call's `id` and `function.name` come on its first entry only, its
//! `function.arguments` in string fragments. The `finish_reason` comes on a choice; usage comes
//! on the finish chunk or on a trailing chunk with no choices. Both are held until `[DONE]`, so
//! that usage always precedes `finish` whichever chunk carried it. The format never closes a
//! block, so no `BlockEnd` is emitted: the assembler builds each block from its deltas.
//!
//! Block indices are Lineage's own, given in order of first appearance: consecutive text (or
//! reasoning) deltas share a block, a switch to another kind opens a new one, and every tool
//! call has its own block, found again by its wire `index` however the calls interleave.

use std::collections::HashMap;
use std::time::UNIX_EPOCH;

use lineage_agent::{ModelError, ModelRequest};
use lineage_log::{
    BlockType, CallId, ContentBlock, FinishReason, ModelFailure, Role, StreamChunk, Text,
    ToolCallDelta, Usage,
};
use serde_json::{Map, Value, json};

use super::{
    Translate, Wire, Wording, bad_response, empty_response, finish_code, is_image_url, json,
    result_text, shown_reason, stream_closed,
};
use crate::failure;
use crate::sse::Event;

const WIRE: Wire = Wire::ChatCompletions;

/// The request body.
pub(crate) fn body(request: &ModelRequest) -> Value {
    let mut messages = Vec::with_capacity(request.messages.len() + 1);
    // An empty system prompt says nothing; some servers refuse an empty message.
    if !request.system.is_empty() {
        messages.push(json!({"role": "system", "content": request.system}));
    }
    for message in &request.messages {
        match message.role {
            Role::User => user_messages(&message.content, &mut messages),
            Role::Assistant => assistant_message(&message.content, &mut messages),
        }
    }
    let mut body = json!({
        "model": request.model.as_str(),
        "stream": true,
        // Without it the stream carries no usage at all.
        "stream_options": {"include_usage": true},
        "messages": messages,
    });
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|tool| {
                json!({
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": tool.parameters,
                    },
                })
            })
            .collect();
        body["tools"] = Value::Array(tools);
    }
    // `max_tokens`, not `max_completion_tokens`: every server this format reaches reads
    // `max_tokens` (DeepSeek, vLLM, llama.cpp, Ollama and the gateways), while several do not
    // know the newer field and would ignore it, leaving the cap silently unapplied. OpenAI
    // deprecated `max_tokens` and its reasoning models refuse it, loudly (a 400); OpenAI's own
    // models are better reached over the Responses wire.
    if let Some(max_tokens) = request.max_tokens {
        body["max_tokens"] = json!(max_tokens);
    }
    body
}

/// A user message's blocks: each tool result becomes its own `role: tool` message (the format's
/// only place for one), and every run of other blocks between them one `role: user` message, so
/// the order of the history is kept.
fn user_messages(blocks: &[ContentBlock], messages: &mut Vec<Value>) {
    let mut parts = Vec::new();
    for block in blocks {
        match block {
            ContentBlock::ToolResult {
                tool_call_id,
                content,
                // The format has no error flag: a failed call's result speaks for itself.
                is_error: _,
            } => {
                push_user(&mut parts, messages);
                messages.push(json!({
                    "role": "tool",
                    "tool_call_id": tool_call_id.as_str(),
                    "content": result_text(content),
                }));
            }
            ContentBlock::Text { text } | ContentBlock::Reasoning { text } => {
                parts.push(json!({"type": "text", "text": text.as_str()}));
            }
            ContentBlock::Image { attachment, .. } if is_image_url(attachment) => {
                parts.push(json!({"type": "image_url", "image_url": {"url": attachment.as_str()}}));
            }
            // An image the server cannot fetch (a host's attachment id), or a tool call in a
            // user message: a note in words.
            ContentBlock::Image { .. } | ContentBlock::ToolCall { .. } => {
                parts.push(
                    json!({"type": "text", "text": result_text(std::slice::from_ref(block))}),
                );
            }
        }
    }
    push_user(&mut parts, messages);
}

/// One `role: user` message of `parts`, taken: a single text part as a plain string (what every
/// server reads, some of which refuse part arrays), anything else as the array of parts.
fn push_user(parts: &mut Vec<Value>, messages: &mut Vec<Value>) {
    let content = match parts.as_mut_slice() {
        [] => return,
        [only] if only["type"] == "text" => only["text"].take(),
        _ => Value::Array(std::mem::take(parts)),
    };
    parts.clear();
    messages.push(json!({"role": "user", "content": content}));
}

/// An assistant message: its text blocks as `content`, its reasoning as `reasoning_content`
/// (DeepSeek refuses a tool loop whose assistant messages lost their reasoning; other servers
/// ignore the field) and its calls as `tool_calls`. A message with no content says nothing and
/// is left out.
fn assistant_message(blocks: &[ContentBlock], messages: &mut Vec<Value>) {
    let mut text = Vec::new();
    let mut reasoning = Vec::new();
    let mut calls = Vec::new();
    for block in blocks {
        match block {
            ContentBlock::Text { text: t } => text.push(t.to_string()),
            ContentBlock::Reasoning { text: t } => reasoning.push(t.as_str()),
            ContentBlock::ToolCall {
                id,
                name,
                arguments,
            } => {
                // A call without arguments is sent as an empty object: servers that render the
                // history through a chat template parse the arguments as JSON.
                let arguments = if arguments.trim().is_empty() {
                    "{}"
                } else {
                    arguments.as_str()
                };
                calls.push(json!({
                    "id": id.as_str(),
                    "type": "function",
                    "function": {"name": name.as_str(), "arguments": arguments},
                }));
            }
            // Nothing else has a place in an assistant message: a note in words.
            ContentBlock::Image { .. } | ContentBlock::ToolResult { .. } => {
                text.push(result_text(std::slice::from_ref(block)))
            }
        }
    }
    if text.is_empty() && reasoning.is_empty() && calls.is_empty() {
        return;
    }
    let mut message = json!({"role": "assistant"});
    // A message that only calls tools has no content (`null`), as the format writes it.
    message["content"] = if text.is_empty() && !calls.is_empty() {
        Value::Null
    } else {
        Value::String(text.join("\n"))
    };
    if !reasoning.is_empty() {
        message["reasoning_content"] = Value::String(reasoning.join("\n"));
    }
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    messages.push(message);
}

/// Reads one answer.
#[derive(Debug, Default)]
pub(crate) struct Translator {
    /// The next block index to give.
    next_index: u32,
    /// The block the last delta went to: a text or reasoning delta of the same kind continues it.
    current: Option<Current>,
    /// The tool calls seen so far, in order of first appearance.
    calls: Vec<Call>,
    /// Where in `calls` the latest call of each wire `index` is (a call sent without one is
    /// found by its id, or is the latest call), and the first call of each id: an entry finds
    /// its call in constant time however many calls the answer has.
    latest_by_wire: HashMap<u64, usize>,
    first_by_id: HashMap<String, usize>,
    /// The last usage seen (the finish chunk's, or a trailing chunk's).
    usage: Option<Usage>,
    /// The first `finish_reason` seen.
    finish: Option<String>,
    /// `[DONE]` was read.
    done: bool,
    /// `end` has run.
    ended: bool,
}

/// The block the last delta went to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Current {
    /// A text or reasoning block (never a tool call), by its index.
    Prose(BlockType, u32),
    /// A tool call's block: the next text or reasoning delta opens a new block.
    ToolCall,
}

#[derive(Debug)]
struct Call {
    /// The block index.
    index: u32,
    /// The id from the call's first entry, put on every delta.
    id: CallId,
}

impl Translator {
    fn open(
        &mut self,
        block_type: BlockType,
        out: &mut Vec<StreamChunk>,
    ) -> Result<u32, ModelError> {
        let index = self.next_index;
        self.next_index = index
            .checked_add(1)
            .ok_or_else(|| bad_response(WIRE, "the answer has more blocks than can be counted"))?;
        out.push(StreamChunk::BlockStart { index, block_type });
        Ok(index)
    }

    /// A text or reasoning delta (`block_type` says which): it continues the block the last
    /// delta went to when that block is of its kind, and opens a new block otherwise.
    fn prose(
        &mut self,
        block_type: BlockType,
        text: &str,
        out: &mut Vec<StreamChunk>,
    ) -> Result<(), ModelError> {
        let index = match self.current {
            Some(Current::Prose(kind, index)) if kind == block_type => index,
            _ => self.open(block_type, out)?,
        };
        self.current = Some(Current::Prose(block_type, index));
        let text = text.into();
        out.push(match block_type {
            BlockType::Reasoning => StreamChunk::ReasoningDelta { index, text },
            _ => StreamChunk::TextDelta { index, text },
        });
        Ok(())
    }

    fn choice(&mut self, choice: &Value, out: &mut Vec<StreamChunk>) -> Result<(), ModelError> {
        let Some(choice) = choice.as_object() else {
            return Err(bad_response(WIRE, "a choice is not an object"));
        };
        match present(choice, "index") {
            None => {}
            Some(index) => match index.as_u64() {
                Some(0) => {}
                // The request asks for one choice; another is no part of this answer.
                Some(_) => return Ok(()),
                None => return Err(bad_response(WIRE, "a choice's index is not a number")),
            },
        }
        if let Some(delta) = present(choice, "delta") {
            let Some(delta) = delta.as_object() else {
                return Err(bad_response(WIRE, "a choice's delta is not an object"));
            };
            self.delta(delta, out)?;
        }
        match present(choice, "finish_reason") {
            None => {}
            Some(Value::String(reason)) => {
                self.finish.get_or_insert_with(|| reason.clone());
            }
            Some(_) => return Err(bad_response(WIRE, "a finish_reason is not a string")),
        }
        Ok(())
    }

    fn delta(
        &mut self,
        delta: &Map<String, Value>,
        out: &mut Vec<StreamChunk>,
    ) -> Result<(), ModelError> {
        // One of the two reasoning fields, never both: a server that sends both sends the same
        // text twice. An empty one (DeepSeek opens its reasoning with "") carries nothing.
        let mut reasoning = None;
        for field in ["reasoning_content", "reasoning"] {
            if let Some(text) = string(delta, field)?.filter(|t| !t.is_empty()) {
                reasoning.get_or_insert(text);
            }
        }
        if let Some(text) = reasoning {
            self.prose(BlockType::Reasoning, text, out)?;
        }
        if let Some(text) = string(delta, "content")?.filter(|t| !t.is_empty()) {
            self.prose(BlockType::Text, text, out)?;
        }
        match present(delta, "tool_calls") {
            None => {}
            Some(Value::Array(entries)) => {
                for entry in entries {
                    self.tool_call(entry, out)?;
                }
            }
            Some(_) => return Err(bad_response(WIRE, "a delta's tool_calls is not an array")),
        }
        Ok(())
    }

    fn tool_call(&mut self, entry: &Value, out: &mut Vec<StreamChunk>) -> Result<(), ModelError> {
        let Some(entry) = entry.as_object() else {
            return Err(bad_response(WIRE, "a tool call entry is not an object"));
        };
        let wire =
            match present(entry, "index") {
                None => None,
                Some(index) => Some(index.as_u64().ok_or_else(|| {
                    bad_response(WIRE, "a tool call entry's index is not a number")
                })?),
            };
        let id = string(entry, "id")?.filter(|id| !id.is_empty());
        let function = match present(entry, "function") {
            None => None,
            Some(Value::Object(function)) => Some(function),
            Some(_) => {
                return Err(bad_response(
                    WIRE,
                    "a tool call's function is not an object",
                ));
            }
        };
        let (name, arguments) = match function {
            Some(function) => (
                string(function, "name")?.filter(|n| !n.is_empty()),
                string(function, "arguments")?.unwrap_or(""),
            ),
            None => (None, ""),
        };
        // The call an entry continues: the latest with its wire index, unless the entry names
        // another id (some servers give every parallel call index 0, each with its own id: a new
        // id is a new call); by id, or else the latest call, for a server that sends no index.
        let known = match (wire, id) {
            (Some(wire), id) => self
                .latest_by_wire
                .get(&wire)
                .copied()
                .filter(|&at| id.is_none_or(|id| self.calls[at].id.as_str() == id)),
            (None, Some(id)) => self.first_by_id.get(id).copied(),
            (None, None) => self.calls.len().checked_sub(1),
        };
        let delta = match known {
            Some(at) => {
                // A later entry: its id and name, if a server repeats them, are the first's.
                if arguments.is_empty() {
                    return Ok(());
                }
                let call = &self.calls[at];
                ToolCallDelta {
                    index: call.index,
                    id: call.id.clone(),
                    name: None,
                    arguments_delta: arguments.into(),
                }
            }
            None => {
                let which = wire.map_or_else(|| "without an index".to_owned(), |w| format!("{w}"));
                let (Some(id), Some(name)) = (id, name) else {
                    return Err(bad_response(
                        WIRE,
                        format_args!("tool call {which} began without an id and a name"),
                    ));
                };
                let index = self.open(BlockType::ToolCall, out)?;
                let id = CallId::new(id);
                let at = self.calls.len();
                if let Some(wire) = wire {
                    self.latest_by_wire.insert(wire, at);
                }
                self.first_by_id.entry(id.as_str().to_owned()).or_insert(at);
                self.calls.push(Call {
                    index,
                    id: id.clone(),
                });
                ToolCallDelta {
                    index,
                    id,
                    name: Some(name.into()),
                    arguments_delta: arguments.into(),
                }
            }
        };
        self.current = Some(Current::ToolCall);
        out.push(StreamChunk::ToolCallDelta(Box::new(delta)));
        Ok(())
    }
}

impl Translate for Translator {
    fn event(&mut self, event: &Event, out: &mut Vec<StreamChunk>) -> Result<(), ModelError> {
        if self.done {
            return Ok(());
        }
        // The format's events are unnamed; a server that names its failures calls them
        // `error`. Any other name is something newer than this reader: ignored.
        let named_error = event.event == "error";
        if !(event.event.is_empty() || event.event == "message" || named_error) {
            return Ok(());
        }
        let data = event.data.trim();
        if data.is_empty() {
            return Ok(());
        }
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let chunk = json(WIRE, event)?;
        let Some(fields) = chunk.as_object() else {
            return Err(bad_response(WIRE, "a chunk is not a JSON object"));
        };
        if present(fields, "error").is_some() || named_error {
            return Err(server_failure(&chunk));
        }
        if let Some(usage) = present(fields, "usage") {
            self.usage = Some(read_usage(usage)?);
        }
        match present(fields, "choices") {
            // The trailing usage chunk: `choices: []`, `null`, or none at all.
            None => {}
            Some(Value::Array(choices)) => {
                for choice in choices {
                    self.choice(choice, out)?;
                }
            }
            Some(_) => return Err(bad_response(WIRE, "a chunk's choices is not an array")),
        }
        Ok(())
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
        if let Some(usage) = self.usage {
            out.push(StreamChunk::Usage(Box::new(usage)));
        }
        let Some(word) = self.finish.as_deref() else {
            return Err(bad_response(
                WIRE,
                "the stream ended without a finish_reason",
            ));
        };
        let reason = match word {
            "stop" => FinishReason::Stop,
            "tool_calls" => FinishReason::ToolCalls,
            "length" => FinishReason::MaxTokens,
            other => FinishReason::Error(Box::new(finish_failure(other))),
        };
        let normal = matches!(reason, FinishReason::Stop | FinishReason::ToolCalls);
        if normal && self.next_index == 0 {
            return Err(empty_response(WIRE));
        }
        out.push(StreamChunk::Finish { reason });
        Ok(())
    }
}

/// A field that is present and not `null`.
fn present<'a>(object: &'a Map<String, Value>, field: &str) -> Option<&'a Value> {
    object.get(field).filter(|v| !v.is_null())
}

/// A string field, absent or `null` being `None`; any other type is malformed.
fn string<'a>(object: &'a Map<String, Value>, field: &str) -> Result<Option<&'a str>, ModelError> {
    match present(object, field) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(bad_response(
            WIRE,
            format_args!("a {field} is not a string"),
        )),
    }
}

/// The usage object: `prompt_tokens` (which counts the cached ones too), `completion_tokens`,
/// and the cached tokens where OpenAI (`prompt_tokens_details.cached_tokens`) or DeepSeek
/// (`prompt_cache_hit_tokens`) puts them. A count the server leaves out is 0.
fn read_usage(usage: &Value) -> Result<Usage, ModelError> {
    let Some(fields) = usage.as_object() else {
        return Err(bad_response(WIRE, "the usage is not an object"));
    };
    let count = |value: Option<&Value>, name: &str| match value.filter(|v| !v.is_null()) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| bad_response(WIRE, format_args!("the usage's {name} is not a count"))),
    };
    let cached = match count(
        usage.pointer("/prompt_tokens_details/cached_tokens"),
        "cached_tokens",
    )? {
        Some(cached) => Some(cached),
        None => count(
            fields.get("prompt_cache_hit_tokens"),
            "prompt_cache_hit_tokens",
        )?,
    };
    Ok(Usage {
        input_tokens: count(fields.get("prompt_tokens"), "prompt_tokens")?.unwrap_or(0),
        output_tokens: count(fields.get("completion_tokens"), "completion_tokens")?.unwrap_or(0),
        cache_read_tokens: cached,
    })
}

/// The error finish of a `finish_reason` this reader does not take as a normal end (see
/// [`finish_code`]).
fn finish_failure(reason: &str) -> ModelFailure {
    let message = if reason == "content_filter" {
        "the chat endpoint's content filter withheld the answer (finish_reason content_filter)"
            .to_owned()
    } else {
        format!(
            "the chat endpoint stopped for a reason Lineage does not know (finish_reason {:?})",
            shown_reason(reason)
        )
    };
    ModelFailure {
        code: Text::from(finish_code(reason)),
        message: message.into(),
    }
}

/// A failure the server reported inside the stream (`{"error": {...}}`, or an event named
/// `error`). Its class comes from a status-like number the error carries (`code` or `status`,
/// as vLLM and the gateways write it) or else from the words of its `type`, `code` and
/// `message`; the failure classification then reads the same wording for quota and context
/// overflow, exactly as it reads an HTTP error body. The server's own code is never the code.
fn server_failure(chunk: &Value) -> ModelError {
    let body = if chunk.get("error").is_some_and(|e| !e.is_null()) {
        chunk.clone()
    } else {
        json!({"error": chunk})
    };
    let error = &body["error"];
    let status = error_class(error);
    let classified = failure::classify(status, |_| None, &body.to_string(), UNIX_EPOCH);
    let said = error
        .get("message")
        .and_then(Value::as_str)
        .or_else(|| error.as_str())
        .is_some_and(|m| !m.trim().is_empty());
    let message = if said {
        format!(
            "the chat endpoint failed mid-stream: {}",
            classified.message
        )
    } else {
        "the chat endpoint failed mid-stream and said nothing about why".to_owned()
    };
    let mut failure = ModelError::new(classified.code, message);
    failure.request_id = classified.request_id.map(Text::from);
    failure
}

/// The HTTP status whose class a mid-stream error belongs to.
fn error_class(error: &Value) -> u16 {
    let number = ["status", "code"].iter().find_map(|field| {
        let value = error.get(*field)?;
        value
            .as_u64()
            .or_else(|| value.as_str().and_then(|s| s.trim().parse().ok()))
    });
    match number {
        Some(401 | 403) => return 401,
        Some(402) => return 402,
        Some(429) => return 429,
        Some(400 | 413 | 422) => return 400,
        Some(500..=599) => return 500,
        _ => {}
    }
    let wording = Wording::of(error, &["type", "code", "message"]);
    if wording.mentions(&["auth", "api key", "api_key", "permission"]) {
        401
    } else if wording.mentions(&[
        "rate_limit",
        "rate limit",
        "too many requests",
        "quota",
        "insufficient",
        "billing",
        "spend",
    ]) {
        429
    } else if wording.mentions(&[
        "invalid_request",
        "invalid request",
        "bad_request",
        "badrequest",
        "context",
        "too many tokens",
        "too long",
    ]) {
        400
    } else {
        500
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::{
        BAD_RESPONSE, CONTEXT_WINDOW_EXCEEDED, EMPTY_RESPONSE, QUOTA, RATE_LIMIT, SERVER,
        STREAM_CLOSED,
    };
    use crate::wire::testing::{
        self, call, check_promises, finish, message, reasoning, result, start, usage,
    };
    use lineage_agent::{Assembler, ToolSchema};
    use lineage_log::Message;

    fn read(text: &str) -> (Vec<StreamChunk>, Result<(), ModelError>) {
        testing::read(WIRE, text)
    }

    fn assemble(text: &str) -> (Vec<StreamChunk>, Assembler) {
        testing::read_whole(WIRE, text)
    }

    fn failure_of(text: &str) -> ModelError {
        testing::failure_of(WIRE, text)
    }

    const TEXT: &str = include_str!("fixtures/chat/text.sse");

    #[test]
    fn text_deltas_share_one_block_and_stop_finishes() {
        let (chunks, assembled) = assemble(TEXT);
        check_promises(&chunks);
        assert_eq!(chunks[0], start(0, BlockType::Text));
        assert_eq!(
            assembled.blocks(),
            vec![ContentBlock::text("Hello, world.")]
        );
        assert_eq!(assembled.finish(), FinishReason::Stop);
        assert_eq!(assembled.usage(), None, "no usage was sent");
    }

    #[test]
    fn deepseek_reasoning_then_text_with_usage_on_the_finish_chunk() {
        // DeepSeek: the first thinking delta is empty, content is null while it thinks, and the
        // finish chunk carries the usage with its cache-hit count.
        let wire = include_str!(
            "fixtures/chat/deepseek_reasoning_then_text_with_usage_on_the_finish_chunk.sse"
        );
        let (chunks, assembled) = assemble(wire);
        check_promises(&chunks);
        assert_eq!(
            assembled.blocks(),
            vec![
                reasoning("The user greets; greet back."),
                ContentBlock::text("Hi!")
            ]
        );
        assert_eq!(
            assembled.usage(),
            Some(Usage {
                input_tokens: 12,
                output_tokens: 9,
                cache_read_tokens: Some(0)
            })
        );
        assert_eq!(assembled.finish(), FinishReason::Stop);
    }

    #[test]
    fn a_reasoning_field_is_read_too_and_never_twice() {
        let wire = include_str!("fixtures/chat/a_reasoning_field_is_read_too_and_never_twice.sse");
        let (_, assembled) = assemble(wire);
        assert_eq!(
            assembled.blocks(),
            vec![reasoning("think more"), ContentBlock::text("done")]
        );
    }

    const PARALLEL: &str = include_str!("fixtures/chat/parallel.sse");

    #[test]
    fn parallel_tool_calls_with_interleaved_split_arguments_each_get_a_block_and_their_ids() {
        let (chunks, assembled) = assemble(PARALLEL);
        check_promises(&chunks);
        for chunk in &chunks {
            if let StreamChunk::ToolCallDelta(delta) = chunk {
                let expected = if delta.index == 0 { "call_a" } else { "call_b" };
                assert_eq!(
                    delta.id.as_str(),
                    expected,
                    "every delta carries its call's id"
                );
            }
        }
        assert_eq!(
            assembled.blocks(),
            vec![
                call("call_a", "read", r#"{"path":"a.txt"}"#),
                call("call_b", "list", r#"{"dir":"/"}"#),
            ]
        );
        assert_eq!(assembled.finish(), FinishReason::ToolCalls);
        // The usage came after the finish chunk on the wire, and still precedes the finish.
        assert_eq!(
            &chunks[chunks.len() - 2..],
            &[usage(40, 20, Some(32)), finish(FinishReason::ToolCalls)]
        );
    }

    #[test]
    fn calls_sharing_an_index_or_sending_none_are_told_apart_by_their_ids() {
        // Every call on index 0, each with its own id; then calls with no index at all.
        let wire = include_str!(
            "fixtures/chat/calls_sharing_an_index_or_sending_none_are_told_apart_by_their_ids.sse"
        );
        let (chunks, assembled) = assemble(wire);
        check_promises(&chunks);
        assert_eq!(
            assembled.blocks(),
            vec![
                call("call_1", "read", r#"{"path":"a"}"#),
                call("call_2", "read", r#"{"path":"b"}"#),
                call("call_3", "list", "{}"),
            ]
        );
    }

    #[test]
    fn many_parallel_calls_each_find_their_own_call_again() {
        // Every call opens, then every call gets its arguments, last opened first.
        let calls = 2000;
        let mut wire = String::new();
        for n in 0..calls {
            wire.push_str(&format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"tool_calls\":[{{\"index\":{n},\"id\":\"call_{n}\",\"function\":{{\"name\":\"read\",\"arguments\":\"\"}}}}]}}}}]}}\n\n"
            ));
        }
        for n in (0..calls).rev() {
            wire.push_str(&format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"tool_calls\":[{{\"index\":{n},\"function\":{{\"arguments\":\"{{}}\"}}}}]}}}}]}}\n\n"
            ));
        }
        wire.push_str("data: {\"choices\":[{\"index\":0,\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n");
        let (chunks, assembled) = assemble(&wire);
        check_promises(&chunks);
        let expected: Vec<ContentBlock> = (0..calls)
            .map(|n| call(&format!("call_{n}"), "read", "{}"))
            .collect();
        assert_eq!(assembled.blocks(), expected);
    }

    #[test]
    fn text_then_a_tool_call_are_two_blocks_in_order() {
        let wire = include_str!("fixtures/chat/text_then_a_tool_call_are_two_blocks_in_order.sse");
        let (_, assembled) = assemble(wire);
        assert_eq!(
            assembled.blocks(),
            vec![
                ContentBlock::text("Let me look."),
                call("call_1", "read", "{}"),
                ContentBlock::text(" Done."),
            ]
        );
    }

    #[test]
    fn usage_in_a_trailing_chunk_without_choices_or_with_null_choices() {
        for trailing in [
            r#"{"id":"c","choices":null,"usage":{"prompt_tokens":5,"completion_tokens":2}}"#,
            r#"{"id":"c","usage":{"prompt_tokens":5,"completion_tokens":2,"prompt_cache_hit_tokens":3}}"#,
        ] {
            let wire = format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"ok\"}},\"finish_reason\":\"stop\"}}]}}\n\ndata: {trailing}\n\ndata: [DONE]\n\n"
            );
            let (chunks, assembled) = assemble(&wire);
            check_promises(&chunks);
            let usage = assembled.usage().expect("usage read");
            assert_eq!((usage.input_tokens, usage.output_tokens), (5, 2));
            let cached = trailing.contains("hit").then_some(3);
            assert_eq!(usage.cache_read_tokens, cached);
        }
    }

    #[test]
    fn each_stop_reason_maps_to_its_finish() {
        let cases: [(&str, FinishReason); 3] = [
            ("stop", FinishReason::Stop),
            ("tool_calls", FinishReason::ToolCalls),
            ("length", FinishReason::MaxTokens),
        ];
        for (word, expected) in cases {
            let wire = format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"x\"}},\"finish_reason\":\"{word}\"}}]}}\n\ndata: [DONE]\n\n"
            );
            let (_, assembled) = assemble(&wire);
            assert_eq!(assembled.finish(), expected, "finish_reason {word}");
        }
    }

    #[test]
    fn content_filter_and_unknown_reasons_are_error_finishes() {
        for (word, code) in [
            ("content_filter", "FINISH_CONTENT_FILTER"),
            (
                "insufficient_system_resource",
                "FINISH_INSUFFICIENT_SYSTEM_RESOURCE",
            ),
            ("odd reason!", "FINISH_ODD_REASON_"),
        ] {
            let wire = format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"par\"}},\"finish_reason\":\"{word}\"}}]}}\n\ndata: [DONE]\n\n"
            );
            let (chunks, assembled) = assemble(&wire);
            check_promises(&chunks);
            match assembled.finish() {
                FinishReason::Error(failure) => {
                    assert_eq!(failure.code, code);
                    assert!(failure.message.contains(word), "{}", failure.message);
                }
                other => panic!("{word}: expected an error finish, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_length_stop_drops_the_partial_tool_call_and_keeps_the_text() {
        let wire = include_str!(
            "fixtures/chat/a_length_stop_drops_the_partial_tool_call_and_keeps_the_text.sse"
        );
        let (chunks, assembled) = assemble(wire);
        check_promises(&chunks);
        assert_eq!(assembled.finish(), FinishReason::MaxTokens);
        assert_eq!(assembled.blocks(), vec![ContentBlock::text("Reading")]);
        assert_eq!(assembled.usage().map(|u| u.output_tokens), Some(16));
    }

    #[test]
    fn a_mid_stream_error_chunk_is_a_server_failure_by_its_wording() {
        let cases = [
            (
                r#"{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}"#,
                SERVER,
            ),
            (
                r#"{"id":"gen-1","object":"chat.completion.chunk","error":{"code":"rate_limit_exceeded","message":"Slow down"},"choices":[{"index":0,"delta":{"content":""},"finish_reason":"error"}]}"#,
                RATE_LIMIT,
            ),
            (
                r#"{"error":{"object":"error","message":"This model's maximum context length is 4096 tokens.","type":"BadRequestError","param":null,"code":400}}"#,
                CONTEXT_WINDOW_EXCEEDED,
            ),
            (
                r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota"}}"#,
                QUOTA,
            ),
            (r#"{"error":"overloaded"}"#, SERVER),
        ];
        for (chunk, code) in cases {
            let wire = format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"par\"}}}}]}}\n\ndata: {chunk}\n\n"
            );
            let (chunks, result) = read(&wire);
            let error = result.expect_err("a failure");
            assert_eq!(error.code, code, "{chunk}");
            assert!(
                error
                    .message
                    .starts_with("the chat endpoint failed mid-stream")
            );
            assert!(
                !chunks
                    .iter()
                    .any(|c| matches!(c, StreamChunk::Finish { .. })),
                "no finish before the failure"
            );
        }
        let named =
            failure_of("event: error\ndata: {\"message\":\"busy\",\"type\":\"overloaded\"}\n\n");
        assert_eq!(named.code, SERVER);
        assert!(named.message.ends_with("busy"), "{}", named.message);
    }

    #[test]
    fn malformed_chunks_fail_as_bad_responses() {
        for chunk in [
            "{not json",
            "[1,2]",
            r#"{"choices":{"index":0}}"#,
            r#"{"choices":[{"index":0,"delta":{"content":5}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":"zero"}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":"many"}}"#,
            r#"{"choices":[{"index":0,"finish_reason":7}]}"#,
        ] {
            let error = failure_of(&format!("data: {chunk}\n\ndata: [DONE]\n\n"));
            assert_eq!(error.code, BAD_RESPONSE, "{chunk}");
        }
        let error =
            failure_of("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n");
        assert_eq!(error.code, BAD_RESPONSE, "no finish_reason before [DONE]");
        assert!(error.message.contains("finish_reason"), "{}", error.message);
    }

    #[test]
    fn a_stream_closed_before_done_fails_even_after_its_finish_reason() {
        let cut = TEXT.trim_end().trim_end_matches("data: [DONE]");
        let (chunks, result) = read(cut);
        assert_eq!(
            result.map_err(|e| e.code.to_string()),
            Err(STREAM_CLOSED.to_owned())
        );
        assert!(
            !chunks
                .iter()
                .any(|c| matches!(c, StreamChunk::Finish { .. }))
        );
    }

    #[test]
    fn a_normal_stop_with_no_content_is_an_empty_response() {
        let wire =
            include_str!("fixtures/chat/a_normal_stop_with_no_content_is_an_empty_response.sse");
        let (chunks, result) = read(wire);
        assert_eq!(
            result.map_err(|e| e.code.to_string()),
            Err(EMPTY_RESPONSE.to_owned())
        );
        assert_eq!(chunks.len(), 1, "only the usage: {chunks:?}");
        assert!(matches!(chunks[0], StreamChunk::Usage(_)));
    }

    #[test]
    fn keep_alives_named_events_other_choices_and_everything_after_done_are_ignored() {
        let wire = ": keep-alive\n\nevent: ping\ndata: {}\n\ndata: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"other\"}}]}\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"mine\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"late\"}}]}\n\n";
        let (_, assembled) = assemble(wire);
        assert_eq!(assembled.blocks(), vec![ContentBlock::text("mine")]);
    }

    fn request(messages: Vec<Message>, tools: Vec<ToolSchema>) -> ModelRequest {
        let mut request = testing::request("deepseek-chat", messages);
        request.max_tokens = Some(1024);
        request.system = "You are terse.".into();
        request.tools = tools;
        request
    }

    #[test]
    fn a_tool_loop_history_with_reasoning_and_images_is_written_in_order() {
        let image = |attachment: &str| ContentBlock::Image {
            media_type: "image/png".into(),
            attachment: attachment.into(),
        };
        let history = vec![
            message(
                Role::User,
                vec![
                    ContentBlock::text("What is in these?"),
                    image("https://example.com/a.png"),
                    image("data:image/png;base64,iVBORw0KGgo="),
                    image("att-17"),
                ],
            ),
            message(
                Role::Assistant,
                vec![
                    reasoning("Two files to read."),
                    ContentBlock::text("Reading both."),
                    call("call_a", "read", r#"{"path":"a"}"#),
                    call("call_b", "read", ""),
                ],
            ),
            result("call_a", "alpha", false),
            result("call_b", "no such file", true),
            message(Role::Assistant, vec![call("call_c", "list", "{}")]),
            result("call_c", "a\nb", false),
            message(Role::Assistant, vec![]),
            message(Role::Assistant, vec![ContentBlock::text("Done.")]),
            message(Role::User, vec![ContentBlock::text("Thanks")]),
        ];
        let tools = vec![ToolSchema {
            name: "read".into(),
            description: "Reads a file.".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
        }];
        assert_eq!(
            body(&request(history, tools)),
            json!({
                "model": "deepseek-chat",
                "stream": true,
                "stream_options": {"include_usage": true},
                "max_tokens": 1024,
                "tools": [{
                    "type": "function",
                    "function": {
                        "name": "read",
                        "description": "Reads a file.",
                        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
                    },
                }],
                "messages": [
                    {"role": "system", "content": "You are terse."},
                    {"role": "user", "content": [
                        {"type": "text", "text": "What is in these?"},
                        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                        {"type": "text", "text": "[image image/png: att-17]"},
                    ]},
                    {"role": "assistant", "content": "Reading both.", "reasoning_content": "Two files to read.", "tool_calls": [
                        {"id": "call_a", "type": "function", "function": {"name": "read", "arguments": "{\"path\":\"a\"}"}},
                        {"id": "call_b", "type": "function", "function": {"name": "read", "arguments": "{}"}},
                    ]},
                    {"role": "tool", "tool_call_id": "call_a", "content": "alpha"},
                    {"role": "tool", "tool_call_id": "call_b", "content": "no such file"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "call_c", "type": "function", "function": {"name": "list", "arguments": "{}"}},
                    ]},
                    {"role": "tool", "tool_call_id": "call_c", "content": "a\nb"},
                    {"role": "assistant", "content": "Done."},
                    {"role": "user", "content": "Thanks"},
                ],
            })
        );
    }

    #[test]
    fn no_tools_no_cap_and_no_system_send_none_of_their_fields() {
        let mut req = request(
            vec![message(Role::User, vec![ContentBlock::text("hi")])],
            vec![],
        );
        req.max_tokens = None;
        req.system = String::new();
        assert_eq!(
            body(&req),
            json!({
                "model": "deepseek-chat",
                "stream": true,
                "stream_options": {"include_usage": true},
                "messages": [{"role": "user", "content": "hi"}],
            })
        );
    }

    #[test]
    fn a_user_message_holding_text_and_a_result_keeps_their_order() {
        let mixed = message(
            Role::User,
            vec![
                ContentBlock::ToolResult {
                    tool_call_id: CallId::new("call_1"),
                    content: vec![ContentBlock::text("42")],
                    is_error: false,
                },
                ContentBlock::text("And now?"),
            ],
        );
        let written = body(&request(vec![mixed], vec![]));
        assert_eq!(
            written["messages"],
            json!([
                {"role": "system", "content": "You are terse."},
                {"role": "tool", "tool_call_id": "call_1", "content": "42"},
                {"role": "user", "content": "And now?"},
            ])
        );
    }
}
