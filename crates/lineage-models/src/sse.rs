//! Server-sent events, decoded incrementally.
//!
//! The model endpoints stream their answers as `text/event-stream`: lines of `field: value`,
//! an event ending at a blank line, comments starting with `:`. A connection delivers bytes in
//! chunks that ignore all of that structure, so [`Decoder::push`] keeps what it has not yet
//! seen the end of and yields whole frames only. The rules are the WHATWG event-stream
//! interpretation: a line ends at LF, CR or CRLF (a CRLF split across two chunks is one line
//! end); one space after the colon is dropped; `data` lines join with LF; an event with no data
//! is not dispatched; a byte-order mark at the very start is skipped; fields other than `event`,
//! `data`, `id` and `retry` are ignored.

use std::fmt;

/// The most bytes one line may hold before the stream is refused: a server that never ends a
/// line must not grow the buffer without bound.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// A dispatched event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// The `event` field: empty when the event named no type (the default, `message`).
    pub event: String,
    /// The `data` lines, joined with LF.
    pub data: String,
    /// The last `id` field seen so far in the stream, if any.
    pub id: Option<String>,
    /// The `retry` field, in milliseconds, when this event carried a valid one.
    pub retry_ms: Option<u64>,
}

/// What a chunk of the stream decoded to, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// A whole event.
    Event(Event),
    /// A comment line (`: keep-alive`): no event, but proof the server is still sending.
    Comment(String),
}

/// Why a stream cannot be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// A line is not UTF-8; `line` counts from 1.
    InvalidUtf8 {
        /// The line's number in the stream.
        line: u64,
    },
    /// A line grew past [`MAX_LINE_BYTES`] without ending; `line` counts from 1.
    LineTooLong {
        /// The line's number in the stream.
        line: u64,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidUtf8 { line } => {
                write!(f, "event stream line {line} is not valid UTF-8")
            }
            Error::LineTooLong { line } => write!(
                f,
                "event stream line {line} is longer than {MAX_LINE_BYTES} bytes without ending"
            ),
        }
    }
}

impl std::error::Error for Error {}

/// An incremental event-stream decoder. Feed it chunks with [`Decoder::push`]; at the end of
/// the stream, [`Decoder::finish`] says whether an event was left unterminated.
#[derive(Debug, Default)]
pub struct Decoder {
    /// The bytes of the line not yet ended.
    line: Vec<u8>,
    /// The last byte seen was a CR: an LF right after it ends nothing more.
    after_cr: bool,
    /// Whether the first bytes of the stream have been looked at (for the byte-order mark).
    started: bool,
    /// Lines ended so far.
    lines: u64,
    /// The event being built.
    event: String,
    data: String,
    has_data: bool,
    last_id: Option<String>,
    retry_ms: Option<u64>,
    /// Whether any field line of the event being built was seen.
    pending: bool,
    /// A failure is final: every later push repeats it.
    failed: Option<Error>,
}

impl Decoder {
    /// A decoder at the start of a stream.
    pub fn new() -> Self {
        Decoder::default()
    }

    /// Decodes `bytes`, the next chunk of the stream, and returns the frames it completed.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<Frame>, Error> {
        let mut frames = Vec::new();
        self.push_into(bytes, &mut frames)?;
        Ok(frames)
    }

    /// Decodes `bytes` and appends the frames it completed to `frames`. On an error, the frames
    /// completed before the offending line are appended all the same, so what a stream decodes
    /// to before its first bad line does not depend on how it was chunked.
    pub fn push_into(&mut self, mut bytes: &[u8], frames: &mut Vec<Frame>) -> Result<(), Error> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        if bytes.is_empty() {
            return Ok(());
        }
        if !self.started {
            // The mark may itself be split: wait until three bytes (or a mismatch) are known.
            const BOM: &[u8] = b"\xEF\xBB\xBF";
            let mut head = std::mem::take(&mut self.line);
            head.extend_from_slice(bytes);
            if head.len() < BOM.len() && BOM.starts_with(&head) {
                self.line = head;
                return Ok(());
            }
            self.started = true;
            return self.lines_of(head.strip_prefix(BOM).unwrap_or(&head), frames);
        }
        if std::mem::take(&mut self.after_cr) && bytes[0] == b'\n' {
            bytes = &bytes[1..];
        }
        self.lines_of(bytes, frames)
    }

    /// Ends every line `bytes` completes and keeps the rest for the next chunk.
    fn lines_of(&mut self, mut rest: &[u8], frames: &mut Vec<Frame>) -> Result<(), Error> {
        while let Some(end) = rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            let (line, tail) = rest.split_at(end);
            self.line.extend_from_slice(line);
            let line = std::mem::take(&mut self.line);
            let ended_by_cr = tail[0] == b'\r';
            rest = &tail[1..];
            if ended_by_cr {
                if rest.first() == Some(&b'\n') {
                    rest = &rest[1..];
                } else if rest.is_empty() {
                    self.after_cr = true;
                }
            }
            self.lines += 1;
            if let Err(error) = self.take_line(&line, frames) {
                self.failed = Some(error.clone());
                return Err(error);
            }
        }
        if self.line.len() + rest.len() > MAX_LINE_BYTES {
            let error = Error::LineTooLong {
                line: self.lines + 1,
            };
            self.failed = Some(error.clone());
            return Err(error);
        }
        self.line.extend_from_slice(rest);
        Ok(())
    }

    fn take_line(&mut self, line: &[u8], frames: &mut Vec<Frame>) -> Result<(), Error> {
        let line =
            std::str::from_utf8(line).map_err(|_| Error::InvalidUtf8 { line: self.lines })?;
        if line.is_empty() {
            self.dispatch(frames);
            return Ok(());
        }
        if let Some(comment) = line.strip_prefix(':') {
            frames.push(Frame::Comment(
                comment.strip_prefix(' ').unwrap_or(comment).to_owned(),
            ));
            return Ok(());
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        self.pending = true;
        match field {
            "event" => self.event = value.to_owned(),
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            // An id holding NUL is ignored, as the interpretation rules say.
            "id" if !value.contains('\0') => self.last_id = Some(value.to_owned()),
            "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                self.retry_ms = value.parse().ok();
            }
            _ => {}
        }
        Ok(())
    }

    fn dispatch(&mut self, frames: &mut Vec<Frame>) {
        let event = std::mem::take(&mut self.event);
        let data = std::mem::take(&mut self.data);
        let retry_ms = self.retry_ms.take();
        let has_data = std::mem::replace(&mut self.has_data, false);
        self.pending = false;
        if has_data {
            frames.push(Frame::Event(Event {
                event,
                data,
                id: self.last_id.clone(),
                retry_ms,
            }));
        }
    }

    /// Ends the stream. Returns whether anything was left unterminated: a partial line or an
    /// event whose closing blank line never came (it is discarded, as the rules say).
    pub fn finish(self) -> bool {
        !self.line.is_empty() || self.pending
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn decode(chunks: &[&[u8]]) -> Vec<Frame> {
        let mut decoder = Decoder::new();
        chunks
            .iter()
            .flat_map(|c| decoder.push(c).expect("a valid stream"))
            .collect()
    }

    fn data(event: &str, data: &str) -> Frame {
        Frame::Event(Event {
            event: event.into(),
            data: data.into(),
            ..Event::default()
        })
    }

    #[test]
    fn events_end_at_a_blank_line_and_data_lines_join_with_lf() {
        let frames = decode(&[b"data: one\ndata:two\n\nevent: done\ndata\n\n"]);
        assert_eq!(frames, [data("", "one\ntwo"), data("done", "")]);
    }

    #[test]
    fn lf_cr_and_crlf_all_end_lines_even_when_a_crlf_is_split_across_chunks() {
        let frames = decode(&[b"data: a\r", b"\n\r", b"\ndata: b\r\r", b"data: c\n\n"]);
        assert_eq!(frames, [data("", "a"), data("", "b"), data("", "c")]);
    }

    #[test]
    fn comments_are_frames_of_their_own_and_events_without_data_are_not_dispatched() {
        let frames = decode(&[b": keep-alive\n\nevent: ping\n\nid: 7\ndata: x\n\n"]);
        assert_eq!(
            frames,
            [
                Frame::Comment("keep-alive".into()),
                Frame::Event(Event {
                    data: "x".into(),
                    id: Some("7".into()),
                    ..Event::default()
                })
            ]
        );
    }

    #[test]
    fn a_byte_order_mark_is_skipped_only_at_the_start_even_split() {
        let frames = decode(&[b"\xEF", b"\xBB\xBFdata: a\n\n"]);
        assert_eq!(frames, [data("", "a")]);
        // Past the start it is content (as part of a field name, so the line is ignored).
        let frames = decode(&[b"data: a\n\n\xEF\xBB\xBFdata: b\n\n"]);
        assert_eq!(frames, [data("", "a")]);
    }

    #[test]
    fn a_valid_retry_is_kept_with_its_event_and_an_invalid_one_is_ignored() {
        let frames = decode(&[b"retry: 1500\ndata: a\n\nretry: soon\ndata: b\n\n"]);
        let Frame::Event(first) = &frames[0] else {
            panic!("{frames:?}")
        };
        assert_eq!(first.retry_ms, Some(1500));
        let Frame::Event(second) = &frames[1] else {
            panic!("{frames:?}")
        };
        assert_eq!(second.retry_ms, None);
    }

    #[test]
    fn invalid_utf8_is_refused_naming_its_line_and_the_failure_is_final() {
        let mut decoder = Decoder::new();
        assert_eq!(decoder.push(b"data: ok\n\n").unwrap().len(), 1);
        let error = decoder.push(b"data: \xFF\n").unwrap_err();
        assert_eq!(error, Error::InvalidUtf8 { line: 3 });
        assert_eq!(decoder.push(b"data: fine\n\n"), Err(error));
    }

    #[test]
    fn the_frames_before_a_bad_line_are_kept_however_the_stream_was_chunked() {
        let mut decoder = Decoder::new();
        let mut frames = Vec::new();
        let error = decoder
            .push_into(b"data: one\n\n: alive\ndata: \xFF\n\n", &mut frames)
            .unwrap_err();
        assert_eq!(error, Error::InvalidUtf8 { line: 4 });
        assert_eq!(frames.len(), 2, "{frames:?}");
    }

    #[test]
    fn a_line_that_never_ends_is_refused_before_it_outgrows_the_bound() {
        let mut decoder = Decoder::new();
        decoder.push(b"data: ").unwrap();
        let big = vec![b'x'; MAX_LINE_BYTES];
        assert_eq!(decoder.push(&big), Err(Error::LineTooLong { line: 1 }));
    }

    #[test]
    fn finish_tells_a_stream_cut_mid_event_from_one_that_ended_cleanly() {
        let mut clean = Decoder::new();
        clean.push(b"data: a\n\n").unwrap();
        assert!(!clean.finish());
        let mut cut_line = Decoder::new();
        cut_line.push(b"data: a\n\ndata: {\"par").unwrap();
        assert!(cut_line.finish());
        let mut cut_event = Decoder::new();
        cut_event.push(b"data: a\n").unwrap();
        assert!(cut_event.finish());
    }

    const STREAM: &[u8] =
        "\u{FEFF}: hello\r\nevent: message_start\r\ndata: {\"a\":\"é😀\"}\r\n\r\n\
data: one\ndata: two\n\n:ka\r\rid: 9\rdata: [DONE]\r\r"
            .as_bytes();

    proptest! {
        /// However the connection cuts the bytes, the frames are the same.
        #[test]
        fn any_chunking_of_a_stream_decodes_to_the_same_frames(
            cuts in proptest::collection::vec(0..=STREAM.len(), 0..12)
        ) {
            let whole = decode(&[STREAM]);
            let mut cuts = cuts;
            cuts.sort_unstable();
            let mut chunks = Vec::new();
            let mut at = 0;
            for cut in cuts {
                chunks.push(&STREAM[at..cut]);
                at = cut;
            }
            chunks.push(&STREAM[at..]);
            prop_assert_eq!(decode(&chunks), whole);
        }
    }

    #[test]
    fn the_reference_stream_decodes_as_written() {
        let frames = decode(&[STREAM]);
        assert_eq!(
            frames,
            [
                Frame::Comment("hello".into()),
                data("message_start", "{\"a\":\"é😀\"}"),
                data("", "one\ntwo"),
                Frame::Comment("ka".into()),
                Frame::Event(Event {
                    data: "[DONE]".into(),
                    id: Some("9".into()),
                    ..Event::default()
                }),
            ]
        );
    }
}
