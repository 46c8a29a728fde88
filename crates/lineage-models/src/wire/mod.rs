//! The three wire formats: how a [`ModelRequest`] is written as a request body, and how the
//! events of the answer's stream become [`StreamChunk`]s.
//!
//! Everything here is pure: no sockets, no clocks. The HTTP layer ([`crate::http`]) sends the
//! body and pushes the answer's bytes into an [`AnswerReader`], which decodes the server-sent
//! events, feeds each to the format's `Translate` and yields what it emits. The translators'
//! tests read whole answers, as their servers stream them, from `fixtures/<format>/`.
//!
//! Every translator keeps the same promises, whatever its server sends:
//!
//! - every `ToolCallDelta` carries its call's id (servers send it on the first delta only);
//! - usage comes before the `finish` chunk, and nothing comes after it;
//! - a stream that stops normally having produced no content block fails with
//!   `EMPTY_RESPONSE`; one that closes before the format's end fails with `STREAM_CLOSED`;
//! - an event that does not follow the format fails with `BAD_RESPONSE`, never a panic;
//! - the first failure ends the answer: nothing is read or emitted after it.

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
    /// The failure that ended the answer: every later call gives it again and reads nothing,
    /// so the promise holds whichever translator failed and however the caller goes on. (Boxed:
    /// a failure is large and rare.)
    failed: Option<Box<ModelError>>,
}

impl AnswerReader {
    /// A reader of one `wire` answer.
    pub fn new(wire: Wire) -> Self {
        AnswerReader {
            wire,
            sse: crate::sse::Decoder::new(),
            frames: Vec::new(),
            translator: wire.translator(),
            failed: None,
        }
    }

    /// Takes in the next bytes of the stream, appending their chunks to `out`. Bytes after the
    /// format's end are ignored. On a failure, the chunks of the events before it are appended
    /// all the same: what an answer reads to does not depend on how its bytes were split.
    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<StreamChunk>) -> Result<(), ModelError> {
        if let Some(failure) = &self.failed {
            return Err(ModelError::clone(failure));
        }
        if self.translator.is_done() {
            return Ok(());
        }
        let read = self.read(bytes, out);
        if let Err(failure) = &read {
            self.failed = Some(Box::new(failure.clone()));
        }
        read
    }

    fn read(&mut self, bytes: &[u8], out: &mut Vec<StreamChunk>) -> Result<(), ModelError> {
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
        match self.failed {
            Some(failure) => Err(*failure),
            None => self.translator.end(out),
        }
    }
}

impl fmt::Debug for AnswerReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnswerReader")
            .field("wire", &self.wire)
            .field("done", &self.is_done())
            .field("failed", &self.failed.is_some())
            .finish_non_exhaustive()
    }
}

/// Reads one answer's event stream, event by event.
///
/// [`AnswerReader`] is the only caller, and it stops at the first failure: after an `Err` from
/// [`Translate::event`] nothing more is called, so a translator keeps no failure of its own.
pub(crate) trait Translate: Send {
    /// Takes in one event and appends what it means to `out`. An `Err` ends the stream: the
    /// event is malformed (`BAD_RESPONSE`) or the server reported a failure mid-stream.
    fn event(&mut self, event: &Event, out: &mut Vec<StreamChunk>) -> Result<(), ModelError>;

    /// Whether the format's end has been read; the reader then reads nothing more, and calls
    /// [`Translate::end`] when the stream is finished.
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

/// An event's name as errors tell it: its `event:` field, or `message` (the event-stream
/// default) when it has none.
pub(crate) fn event_name(event: &Event) -> &str {
    if event.event.is_empty() {
        "message"
    } else {
        &event.event
    }
}

/// An event's `data` as JSON, or `BAD_RESPONSE` naming the event. (The parser's nesting limit
/// turns data nested too deep into an error, so no reader recurses without bound.)
pub(crate) fn json(wire: Wire, event: &Event) -> Result<serde_json::Value, ModelError> {
    serde_json::from_str(&event.data).map_err(|e| {
        bad_response(
            wire,
            format_args!("a {} event is not JSON ({e})", event_name(event)),
        )
    })
}

/// The wording of a mid-stream error, lower-cased, for telling its kind: the string values of
/// its `fields` (and the error itself, when it is a bare string), joined by spaces. The code a
/// format gives the failure is decided from these words, never taken from the server.
#[derive(Default)]
pub(crate) struct Wording(String);

impl Wording {
    pub(crate) fn of(error: &serde_json::Value, fields: &[&str]) -> Wording {
        let words = fields
            .iter()
            .filter_map(|field| error.get(*field).and_then(serde_json::Value::as_str))
            .chain(error.as_str())
            .collect::<Vec<_>>()
            .join(" ")
            .to_lowercase();
        Wording(words)
    }

    /// Whether the wording holds any of `words`.
    pub(crate) fn mentions(&self, words: &[&str]) -> bool {
        words.iter().any(|word| self.0.contains(word))
    }
}

/// How many characters of a server's stop reason go into a finish code or its message.
const REASON_BOUND: usize = 48;

/// The error-finish code of a stop reason a format does not take as a normal end:
/// `FINISH_<REASON>` (`FINISH_CONTENT_FILTER`), the reason upper-cased with anything but ASCII
/// letters and digits as `_`, and at most [`REASON_BOUND`] characters of it, so that a server's
/// word can make neither an unreadable code nor a long one.
pub(crate) fn finish_code(reason: &str) -> String {
    let word: String = reason
        .chars()
        .take(REASON_BOUND)
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("FINISH_{word}")
}

/// A server's stop reason as an error finish's message shows it: at most [`REASON_BOUND`]
/// characters.
pub(crate) fn shown_reason(reason: &str) -> String {
    reason.chars().take(REASON_BOUND).collect()
}

/// Whether an image attachment is one the endpoint can fetch or decode itself: an `http(s)` URL
/// or a `data:` URI (scheme case ignored). Anything else is an id only the host can resolve.
pub(crate) fn is_image_url(attachment: &str) -> bool {
    let head: String = attachment
        .chars()
        .take(8)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    head.starts_with("https://") || head.starts_with("http://") || head.starts_with("data:")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_a_failure_every_format_reads_nothing_more_and_fails_the_same_way() {
        // A well-formed piece of each format, then an event that is not JSON.
        let openings = [
            (
                Wire::ChatCompletions,
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
            ),
            (
                Wire::Responses,
                "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"a\"}\n\n",
            ),
            (
                Wire::AnthropicMessages,
                "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"a\"}}\n\n",
            ),
        ];
        for (wire, opening) in openings {
            let mut reader = AnswerReader::new(wire);
            let mut out = Vec::new();
            reader
                .push(opening.as_bytes(), &mut out)
                .expect("the opening reads");
            let read = out.len();
            let failure = reader
                .push(b"data: {not json\n\n", &mut out)
                .expect_err("not JSON");
            assert_eq!(failure.code, BAD_RESPONSE, "{wire}");
            // The same opening again would add chunks, were anything still read.
            assert_eq!(
                reader.push(opening.as_bytes(), &mut out),
                Err(failure.clone())
            );
            assert_eq!(reader.finish(&mut out), Err(failure), "{wire}");
            assert_eq!(
                out.len(),
                read,
                "{wire}: nothing after the failure: {out:?}"
            );
        }
    }

    #[test]
    fn a_finish_code_is_the_reason_upper_cased_reduced_and_bounded() {
        assert_eq!(finish_code("content_filter"), "FINISH_CONTENT_FILTER");
        assert_eq!(finish_code("odd reason!"), "FINISH_ODD_REASON_");
        assert_eq!(finish_code("pause_turn"), "FINISH_PAUSE_TURN");
        assert_eq!(finish_code("é"), "FINISH__");
        let long = finish_code(&"a".repeat(1000));
        assert_eq!(long, format!("FINISH_{}", "A".repeat(REASON_BOUND)));
        assert_eq!(
            shown_reason(&"é".repeat(1000)).chars().count(),
            REASON_BOUND
        );
    }

    #[test]
    fn an_image_url_is_http_https_or_data_in_any_case() {
        for url in [
            "https://x/a.png",
            "HTTP://x",
            "data:image/png;base64,AA",
            "Data:x",
        ] {
            assert!(is_image_url(url), "{url}");
        }
        for not in ["att-17", "", "ftp://x", "ééééé://", "https:/x"] {
            assert!(!is_image_url(not), "{not}");
        }
    }
}

/// What the formats' unit tests share: reading a literal answer through [`AnswerReader`], the
/// chunk invariants of this module's front comment, and the history a request is built from.
#[cfg(test)]
pub(crate) mod testing {
    use std::collections::HashSet;

    use lineage_agent::{Assembler, Cancellation, ModelError, ModelRequest};
    use lineage_log::StreamChunk;
    use lineage_log::{
        BlockType, CallId, ContentBlock, FinishReason, Message, MessageId, MessageSource, Role,
        SessionId, Text, ToolCallDelta, Usage,
    };

    use super::{AnswerReader, Wire};

    /// What a literal `wire` answer reads to, pushed whole and then finished: its chunks, and
    /// how it ended.
    pub(crate) fn read(wire: Wire, text: &str) -> (Vec<StreamChunk>, Result<(), ModelError>) {
        let mut reader = AnswerReader::new(wire);
        let mut out = Vec::new();
        if let Err(failure) = reader.push(text.as_bytes(), &mut out) {
            return (out, Err(failure));
        }
        let result = reader.finish(&mut out);
        (out, result)
    }

    /// A literal answer that must read without failure: its chunks, and the message they make.
    pub(crate) fn read_whole(wire: Wire, text: &str) -> (Vec<StreamChunk>, Assembler) {
        let (chunks, result) = read(wire, text);
        assert_eq!(result, Ok(()), "the answer reads: {chunks:?}");
        let assembled = assemble(&chunks);
        (chunks, assembled)
    }

    /// The failure a literal answer must end with.
    pub(crate) fn failure_of(wire: Wire, text: &str) -> ModelError {
        match read(wire, text) {
            (_, Err(failure)) => failure,
            (chunks, Ok(())) => panic!("expected a failure, read {chunks:?}"),
        }
    }

    /// The message `chunks` make.
    pub(crate) fn assemble(chunks: &[StreamChunk]) -> Assembler {
        let mut assembler = Assembler::new();
        for chunk in chunks {
            assembler.push(chunk);
        }
        assembler
    }

    /// The promises an answer that read to its end keeps: one finish, last; usage, if any,
    /// right before it; each block started once, before any of its deltas.
    pub(crate) fn check_promises(chunks: &[StreamChunk]) {
        let finishes = chunks
            .iter()
            .filter(|c| matches!(c, StreamChunk::Finish { .. }))
            .count();
        assert_eq!(finishes, 1, "one finish: {chunks:?}");
        assert!(
            matches!(chunks.last(), Some(StreamChunk::Finish { .. })),
            "the finish is last: {chunks:?}"
        );
        let usages: Vec<usize> = (0..chunks.len())
            .filter(|&at| matches!(chunks[at], StreamChunk::Usage(_)))
            .collect();
        assert!(
            usages.is_empty() || usages == [chunks.len() - 2],
            "usage is the chunk right before the finish: {chunks:?}"
        );
        let mut started = HashSet::new();
        for (at, chunk) in chunks.iter().enumerate() {
            let index = match chunk {
                StreamChunk::BlockStart { index, .. } => {
                    assert!(started.insert(*index), "block {index} started twice");
                    continue;
                }
                StreamChunk::TextDelta { index, .. }
                | StreamChunk::ReasoningDelta { index, .. } => index,
                StreamChunk::ToolCallDelta(delta) => &delta.index,
                _ => continue,
            };
            assert!(started.contains(index), "a delta before its start at {at}");
        }
    }

    // The chunks a translator emits, written short.

    pub(crate) fn start(index: u32, block_type: BlockType) -> StreamChunk {
        StreamChunk::BlockStart { index, block_type }
    }

    pub(crate) fn text(index: u32, text: &str) -> StreamChunk {
        StreamChunk::TextDelta {
            index,
            text: text.into(),
        }
    }

    pub(crate) fn end(index: u32, block: ContentBlock) -> StreamChunk {
        StreamChunk::BlockEnd {
            index,
            block: Box::new(block),
        }
    }

    pub(crate) fn call_delta(
        index: u32,
        id: &str,
        name: Option<&str>,
        arguments: &str,
    ) -> StreamChunk {
        StreamChunk::ToolCallDelta(Box::new(ToolCallDelta {
            index,
            id: CallId::new(id),
            name: name.map(Text::from),
            arguments_delta: arguments.into(),
        }))
    }

    pub(crate) fn usage(input: u64, output: u64, cached: Option<u64>) -> StreamChunk {
        StreamChunk::Usage(Box::new(Usage {
            input_tokens: input,
            output_tokens: output,
            cache_read_tokens: cached,
        }))
    }

    pub(crate) fn finish(reason: FinishReason) -> StreamChunk {
        StreamChunk::Finish { reason }
    }

    pub(crate) fn call(id: &str, name: &str, arguments: &str) -> ContentBlock {
        ContentBlock::ToolCall {
            id: CallId::new(id),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    pub(crate) fn reasoning(text: &str) -> ContentBlock {
        ContentBlock::Reasoning { text: text.into() }
    }

    /// A request for `model` with `messages` only: no system prompt, tools or cap.
    pub(crate) fn request(model: &str, messages: Vec<Message>) -> ModelRequest {
        ModelRequest {
            session: SessionId::new(),
            turn: 1,
            step: 1,
            endpoint: "test".into(),
            model: model.into(),
            max_tokens: None,
            system: String::new(),
            tools: Vec::new(),
            messages,
            cancel: Cancellation::new(),
        }
    }

    pub(crate) fn message(role: Role, content: Vec<ContentBlock>) -> Message {
        Message {
            id: MessageId::new(),
            role,
            content,
            source: MessageSource::User,
        }
    }

    /// A user message holding one tool result of `text`.
    pub(crate) fn result(id: &str, text: &str, is_error: bool) -> Message {
        message(
            Role::User,
            vec![ContentBlock::ToolResult {
                tool_call_id: CallId::new(id),
                content: vec![ContentBlock::text(text)],
                is_error,
            }],
        )
    }
}
