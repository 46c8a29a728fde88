//! The three wire formats: how a [`ModelRequest`] is written as a request body, and how the
//! events of the answer's stream become [`StreamChunk`]s.
//!
//! Everything here is pure: no sockets, no clocks. The HTTP layer ([`crate::http`]) sends the
//! body, feeds each server-sent event to the format's `Translate` and yields what it emits.
//!
//! Every translator keeps the same promises, whatever its server sends:
//!
//! - every `ToolCallDelta` carries its call's id (servers send it on the first delta only);
//! - usage comes before the `finish` chunk, and nothing comes after it;
//! - a stream that stops normally having produced no content block fails with
//!   `EMPTY_RESPONSE`; one that closes before the format's end fails with `STREAM_CLOSED`;
//! - an event that does not follow the format fails with `BAD_RESPONSE`, never a panic.

pub(crate) mod anthropic;
pub(crate) mod chat;
pub(crate) mod responses;

use std::fmt;

use lineage_agent::{ModelError, ModelRequest};
use lineage_log::{ContentBlock, StreamChunk};

use crate::failure::{BAD_RESPONSE, EMPTY_RESPONSE, STREAM_CLOSED};
use crate::sse::Event;

/// A wire format an endpoint speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Wire {
    /// OpenAI-compatible Chat Completions (`POST {base}/chat/completions`): OpenAI, DeepSeek,
    /// vLLM, llama.cpp, Ollama and the many servers that speak it.
    ChatCompletions,
    /// OpenAI Responses (`POST {base}/responses`).
    Responses,
    /// Anthropic Messages (`POST {base}/messages`).
    AnthropicMessages,
}

impl Wire {
    /// Every wire format.
    pub const ALL: [Wire; 3] = [
        Wire::ChatCompletions,
        Wire::Responses,
        Wire::AnthropicMessages,
    ];

    /// The short name configuration uses: `chat`, `responses` or `anthropic`.
    pub fn name(self) -> &'static str {
        match self {
            Wire::ChatCompletions => "chat",
            Wire::Responses => "responses",
            Wire::AnthropicMessages => "anthropic",
        }
    }

    /// The wire format named `name` (see [`Wire::name`]).
    pub fn from_name(name: &str) -> Option<Wire> {
        Wire::ALL.into_iter().find(|w| w.name() == name)
    }

    /// The path the request is posted to, after the endpoint's base URL (which ends in the API
    /// version, as in `https://api.openai.com/v1`).
    pub fn path(self) -> &'static str {
        match self {
            Wire::ChatCompletions => "/chat/completions",
            Wire::Responses => "/responses",
            Wire::AnthropicMessages => "/messages",
        }
    }

    /// The request body for `request`. `default_max_tokens` is used when the request sets no
    /// cap and the format requires one (Anthropic's does).
    pub(crate) fn body(self, request: &ModelRequest, default_max_tokens: u32) -> serde_json::Value {
        match self {
            Wire::ChatCompletions => chat::body(request),
            Wire::Responses => responses::body(request),
            Wire::AnthropicMessages => anthropic::body(request, default_max_tokens),
        }
    }

    /// A translator for one answer's events.
    pub(crate) fn translator(self) -> Box<dyn Translate> {
        match self {
            Wire::ChatCompletions => Box::new(chat::Translator::default()),
            Wire::Responses => Box::new(responses::Translator::default()),
            Wire::AnthropicMessages => Box::new(anthropic::Translator::default()),
        }
    }
}

impl fmt::Display for Wire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Reads one answer as its bytes arrive: the event-stream framing, then the wire format.
///
/// Feed it what the connection delivers ([`AnswerReader::push`]) and, when the connection ends or
/// [`AnswerReader::is_done`] says the format's end was read, call [`AnswerReader::finish`]. The
/// chunks it appends keep this module's promises; the first failure ends the answer, and
/// nothing is read after it.
pub struct AnswerReader {
    wire: Wire,
    sse: crate::sse::Decoder,
    /// Frames decoded but not yet translated; kept to reuse its allocation.
    frames: Vec<crate::sse::Frame>,
    translator: Box<dyn Translate>,
}

impl AnswerReader {
    /// A reader of one `wire` answer.
    pub fn new(wire: Wire) -> Self {
        AnswerReader {
            wire,
            sse: crate::sse::Decoder::new(),
            frames: Vec::new(),
            translator: wire.translator(),
        }
    }

    /// Takes in the next bytes of the stream, appending their chunks to `out`. Bytes after the
    /// format's end are ignored. On a failure, the chunks of the events before it are appended
    /// all the same: what an answer reads to does not depend on how its bytes were split.
    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<StreamChunk>) -> Result<(), ModelError> {
        if self.translator.is_done() {
            return Ok(());
        }
        let framed = self.sse.push_into(bytes, &mut self.frames);
        let mut translated = Ok(());
        for frame in self.frames.drain(..) {
            if let crate::sse::Frame::Event(event) = frame {
                translated = self.translator.event(&event, out);
                if translated.is_err() || self.translator.is_done() {
                    break;
                }
            }
        }
        self.frames.clear();
        translated?;
        if self.translator.is_done() {
            return Ok(());
        }
        framed.map_err(|e| bad_response(self.wire, e))
    }

    /// Whether the format's end has been read: nothing more needs to be.
    pub fn is_done(&self) -> bool {
        self.translator.is_done()
    }

    /// The stream is over: appends the closing chunks, or fails as `Translate::end` says.
    pub fn finish(mut self, out: &mut Vec<StreamChunk>) -> Result<(), ModelError> {
        self.translator.end(out)
    }
}

impl fmt::Debug for AnswerReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnswerReader")
            .field("wire", &self.wire)
            .field("done", &self.is_done())
            .finish_non_exhaustive()
    }
}

/// Reads one answer's event stream, event by event.
pub(crate) trait Translate: Send {
    /// Takes in one event and appends what it means to `out`. An `Err` ends the stream: the
    /// event is malformed (`BAD_RESPONSE`) or the server reported a failure mid-stream.
    fn event(&mut self, event: &Event, out: &mut Vec<StreamChunk>) -> Result<(), ModelError>;

    /// Whether the format's end has been read; the HTTP layer then stops reading and calls
    /// [`Translate::end`].
    fn is_done(&self) -> bool;

    /// The stream is over (its end was read, or the connection closed): appends the closing
    /// chunks (usage, then `finish`), or fails with `STREAM_CLOSED` when the end never came,
    /// or `EMPTY_RESPONSE` when a normal stop produced no content.
    fn end(&mut self, out: &mut Vec<StreamChunk>) -> Result<(), ModelError>;
}

/// A `BAD_RESPONSE` failure: `what` does not follow the `wire` format.
pub(crate) fn bad_response(wire: Wire, what: impl fmt::Display) -> ModelError {
    ModelError::new(
        BAD_RESPONSE,
        format!("the {wire} stream is malformed: {what}"),
    )
}

/// A `STREAM_CLOSED` failure of `wire`: the connection closed before the format's end.
pub(crate) fn stream_closed(wire: Wire) -> ModelError {
    ModelError::new(
        STREAM_CLOSED,
        format!("the {wire} stream closed before its end"),
    )
}

/// An `EMPTY_RESPONSE` failure of `wire`: a normal stop with no content.
pub(crate) fn empty_response(wire: Wire) -> ModelError {
    ModelError::new(
        EMPTY_RESPONSE,
        format!("the {wire} endpoint stopped without producing anything"),
    )
}

/// An event's `data` as JSON, or `BAD_RESPONSE` naming the event.
pub(crate) fn json(wire: Wire, event: &Event) -> Result<serde_json::Value, ModelError> {
    serde_json::from_str(&event.data).map_err(|e| {
        let name = if event.event.is_empty() {
            "message"
        } else {
            &event.event
        };
        bad_response(wire, format_args!("a {name} event is not JSON ({e})"))
    })
}

/// The text of a tool result's content, for formats whose tool results are plain strings: text
/// blocks joined by newlines, anything else described in brackets.
pub(crate) fn result_text(content: &[ContentBlock]) -> String {
    let mut parts = Vec::with_capacity(content.len());
    for block in content {
        match block {
            ContentBlock::Text { text } | ContentBlock::Reasoning { text } => {
                parts.push(text.to_string())
            }
            ContentBlock::Image {
                media_type,
                attachment,
            } => parts.push(format!("[image {media_type}: {attachment}]")),
            ContentBlock::ToolCall { name, .. } => parts.push(format!("[tool call {name}]")),
            ContentBlock::ToolResult { content, .. } => parts.push(result_text(content)),
        }
    }
    parts.join("\n")
}
