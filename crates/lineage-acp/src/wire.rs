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

/// The transport over `reader` and `writer`. With `strict`, a line that is not JSON ends the
/// incoming stream with an error (and is kept in `malformed`): a child agent that writes
/// anything but frames to stdout is broken, and is treated so at once instead of waiting for
/// an answer that will not come.
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
    let outgoing = futures::sink::unfold(writer, |writer, line: String| async move {
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
    });
    let incoming = futures::stream::unfold(
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
    Lines::new(Box::pin(outgoing), Box::pin(incoming))
}
