//! Frames over byte pipes: newline-delimited JSON-RPC, one message a line, as the protocol
//! crate's connections read and write them.

use std::io;
use std::sync::{Arc, Mutex};

use agent_client_protocol::Lines;
use futures::{Sink, Stream};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

/// The longest frame read: a peer that sends more on one line is cut off, not buffered.
pub(crate) const MAX_FRAME_BYTES: u64 = 64 << 20;

/// The first line a peer sent that was not JSON, kept for the diagnostic.
pub(crate) type Malformed = Arc<Mutex<Option<String>>>;

/// A writer the transport shares with its owner, who may take it to close the pipe.
pub(crate) type SharedWriter<W> = Arc<tokio::sync::Mutex<Option<W>>>;

/// The transport over `reader` and `writer` (see [`incoming`] for `malformed`).
pub(crate) fn lines<R, W>(
    reader: R,
    writer: SharedWriter<W>,
    malformed: Option<Malformed>,
) -> Lines<
    impl Sink<String, Error = io::Error> + Send + 'static,
    impl Stream<Item = io::Result<String>> + Send + 'static,
>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    Lines::new(outgoing(writer), incoming(reader, malformed))
}

/// Frames written to `writer`, one a line, each flushed. Once the owner took the writer, a
/// write fails with `BrokenPipe`.
fn outgoing<W>(writer: SharedWriter<W>) -> impl Sink<String, Error = io::Error> + Send + 'static
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    Box::pin(futures::sink::unfold(
        writer,
        |writer, line: String| async move {
            {
                let mut pipe = writer.lock().await;
                let Some(pipe) = pipe.as_mut() else {
                    return Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        "the pipe is closed",
                    ));
                };
                pipe.write_all(line.as_bytes()).await?;
                pipe.write_all(b"\n").await?;
                pipe.flush().await?;
            }
            Ok(writer)
        },
    ))
}

/// Frames read from `reader`, blank lines skipped. With `malformed`, a line that is not JSON
/// ends the stream with an error and is kept there: a child agent that writes anything but
/// frames to stdout is broken, and is treated so at once instead of waiting for an answer that
/// will not come.
fn incoming<R>(
    reader: R,
    malformed: Option<Malformed>,
) -> impl Stream<Item = io::Result<String>> + Send + 'static
where
    R: AsyncRead + Unpin + Send + 'static,
{
    let stream = futures::stream::unfold(
        Some((BufReader::new(reader), malformed)),
        |state| async move {
            let (mut reader, malformed) = state?;
            loop {
                let mut line = String::new();
                let read = AsyncReadExt::take(&mut reader, MAX_FRAME_BYTES)
                    .read_line(&mut line)
                    .await;
                match read {
                    Ok(0) => return None,
                    Err(error) => return Some((Err(error), None)),
                    Ok(_) if !line.ends_with('\n') && line.len() as u64 >= MAX_FRAME_BYTES => {
                        let error = format!("a frame longer than {MAX_FRAME_BYTES} bytes");
                        return Some((
                            Err(io::Error::new(io::ErrorKind::InvalidData, error)),
                            None,
                        ));
                    }
                    Ok(_) => {}
                }
                let frame = line.trim_end_matches(['\n', '\r']);
                if frame.trim().is_empty() {
                    continue;
                }
                if let Some(kept) = &malformed
                    && serde_json::from_str::<serde::de::IgnoredAny>(frame).is_err()
                {
                    let shown: String = frame.chars().take(200).collect();
                    *kept.lock().unwrap_or_else(|p| p.into_inner()) = Some(shown.clone());
                    let error = format!("a malformed frame (not JSON): {shown:?}");
                    return Some((Err(io::Error::new(io::ErrorKind::InvalidData, error)), None));
                }
                return Some((Ok(frame.to_owned()), Some((reader, malformed))));
            }
        },
    );
    Box::pin(stream)
}

#[cfg(test)]
mod tests {
    use futures::{SinkExt, StreamExt};

    use super::*;

    #[tokio::test]
    async fn frames_are_lines_and_a_line_that_is_not_json_ends_the_stream() {
        let (ours, mut theirs) = tokio::io::duplex(1024);
        let (reader, writer) = tokio::io::split(ours);
        let malformed = Malformed::default();
        let mut outgoing = outgoing(Arc::new(tokio::sync::Mutex::new(Some(writer))));
        let mut incoming = incoming(reader, Some(malformed.clone()));
        outgoing.send(r#"{"id":1}"#.to_owned()).await.unwrap();
        let mut sent = [0u8; 9];
        tokio::io::AsyncReadExt::read_exact(&mut theirs, &mut sent)
            .await
            .unwrap();
        assert_eq!(&sent, b"{\"id\":1}\n");
        theirs
            .write_all(b"{\"id\":2}\r\n\n  \nStarting up\n{\"id\":3}\n")
            .await
            .unwrap();
        assert_eq!(incoming.next().await.unwrap().unwrap(), r#"{"id":2}"#);
        let error = incoming.next().await.unwrap().unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert!(
            incoming.next().await.is_none(),
            "nothing after a malformed line"
        );
        assert_eq!(malformed.lock().unwrap().as_deref(), Some("Starting up"));
    }
}
