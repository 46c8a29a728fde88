//! Line frames: one JSON value a line, as the Agent Client Protocol, Codex's app-server and Claude
//! Code's stream-json all put them on a child's stdout.

use std::io;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

/// The longest frame read: a peer that sends more on one line is cut off, not buffered.
pub const MAX_FRAME_BYTES: u64 = 64 << 20;

/// The most characters of a malformed line kept for a diagnostic.
const MALFORMED_SHOWN_CHARS: usize = 200;

/// The first line a peer sent that was not JSON (its first 200 characters), kept for a
/// diagnostic.
pub type Malformed = Arc<Mutex<Option<String>>>;

/// A writer shared between the frames written to it and its owner, who may take it to close the
/// pipe (as [`crate::AgentProcess::stdin`] is).
pub type SharedWriter<W> = tokio::sync::Mutex<Option<W>>;

/// Writes `frame` and a newline to `writer`, flushed. Once the owner took the writer, this fails
/// with [`io::ErrorKind::BrokenPipe`].
pub async fn write_frame<W: AsyncWrite + Unpin>(
    writer: &SharedWriter<W>,
    frame: &str,
) -> io::Result<()> {
    let mut pipe = writer.lock().await;
    let Some(pipe) = pipe.as_mut() else {
        return Err(io::Error::new(
            io::ErrorKind::BrokenPipe,
            "the pipe is closed",
        ));
    };
    pipe.write_all(frame.as_bytes()).await?;
    pipe.write_all(b"\n").await?;
    pipe.flush().await
}

/// Reads frames from a peer's output, one line each, blank lines skipped.
///
/// In strict mode a line that is not JSON is an error, and is kept in the reader's [`Malformed`]:
/// a child that writes anything but frames to its stdout is broken, and is treated so at once
/// rather than waited on for an answer that will not come.
pub struct FrameReader<R> {
    reader: Option<BufReader<R>>,
    malformed: Option<Malformed>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader of `reader` that passes every non-blank line on.
    pub fn new(reader: R) -> Self {
        FrameReader {
            reader: Some(BufReader::new(reader)),
            malformed: None,
        }
    }

    /// A reader of `reader` that ends at the first line that is not JSON, kept in `malformed`.
    pub fn strict(reader: R, malformed: Malformed) -> Self {
        FrameReader {
            reader: Some(BufReader::new(reader)),
            malformed: Some(malformed),
        }
    }

    /// The next frame, without its line ending; `None` at the end of the output. After an
    /// error (a read error, an overlong line, a malformed line in strict mode) the reader is
    /// finished and returns `None`.
    pub async fn next(&mut self) -> Option<io::Result<String>> {
        let reader = self.reader.as_mut()?;
        loop {
            let mut line = String::new();
            let read = AsyncReadExt::take(&mut *reader, MAX_FRAME_BYTES)
                .read_line(&mut line)
                .await;
            let failure = match read {
                Ok(0) => {
                    self.reader = None;
                    return None;
                }
                Err(error) => Some(error),
                Ok(_) if !line.ends_with('\n') && line.len() as u64 >= MAX_FRAME_BYTES => {
                    let error = format!("a frame longer than {MAX_FRAME_BYTES} bytes");
                    Some(io::Error::new(io::ErrorKind::InvalidData, error))
                }
                Ok(_) => None,
            };
            if let Some(error) = failure {
                self.reader = None;
                return Some(Err(error));
            }
            let frame = line.trim_end_matches(['\n', '\r']);
            if frame.trim().is_empty() {
                continue;
            }
            if let Some(kept) = &self.malformed
                && serde_json::from_str::<serde::de::IgnoredAny>(frame).is_err()
            {
                let shown: String = frame.chars().take(MALFORMED_SHOWN_CHARS).collect();
                *kept.lock().unwrap_or_else(|p| p.into_inner()) = Some(shown.clone());
                self.reader = None;
                let error = format!("a malformed frame (not JSON): {shown:?}");
                return Some(Err(io::Error::new(io::ErrorKind::InvalidData, error)));
            }
            return Some(Ok(frame.to_owned()));
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    #[tokio::test]
    async fn frames_are_lines_and_a_line_that_is_not_json_ends_a_strict_reader() {
        let (ours, mut theirs) = tokio::io::duplex(1024);
        let malformed = Malformed::default();
        let mut frames = FrameReader::strict(ours, malformed.clone());
        theirs
            .write_all(b"{\"id\":2}\r\n\n  \nStarting up\n{\"id\":3}\n")
            .await
            .unwrap();
        assert_eq!(frames.next().await.unwrap().unwrap(), r#"{"id":2}"#);
        let error = frames.next().await.unwrap().unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert!(
            frames.next().await.is_none(),
            "nothing after a malformed line"
        );
        assert_eq!(malformed.lock().unwrap().as_deref(), Some("Starting up"));
    }

    #[tokio::test]
    async fn a_frame_is_a_line_and_a_taken_writer_is_a_broken_pipe() {
        let (ours, mut theirs) = tokio::io::duplex(1024);
        let writer = SharedWriter::new(Some(ours));
        write_frame(&writer, r#"{"id":1}"#).await.unwrap();
        let mut sent = [0u8; 9];
        tokio::io::AsyncReadExt::read_exact(&mut theirs, &mut sent)
            .await
            .unwrap();
        assert_eq!(&sent, b"{\"id\":1}\n");
        writer.lock().await.take();
        let error = write_frame(&writer, "{}").await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::BrokenPipe);
    }

    #[tokio::test]
    async fn a_lenient_reader_passes_every_line_and_ends_at_eof() {
        let (ours, mut theirs) = tokio::io::duplex(1024);
        let mut frames = FrameReader::new(ours);
        theirs.write_all(b"not json\n{\"a\":1}").await.unwrap();
        drop(theirs);
        assert_eq!(frames.next().await.unwrap().unwrap(), "not json");
        assert_eq!(frames.next().await.unwrap().unwrap(), r#"{"a":1}"#);
        assert!(frames.next().await.is_none());
    }
}
