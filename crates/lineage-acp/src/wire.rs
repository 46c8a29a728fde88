//! Frames over byte pipes: newline-delimited JSON-RPC, one message a line, as the protocol
//! crate's connections read and write them.

use std::io;
use std::sync::Arc;

use agent_client_protocol::Lines;
use futures::{Sink, Stream};
use lineage_process::{FrameReader, Malformed, SharedWriter, write_frame};
use tokio::io::{AsyncRead, AsyncWrite};

/// The transport over `reader` and `writer` (see [`incoming`] for `malformed`).
pub(crate) fn lines<R, W>(
    reader: R,
    writer: Arc<SharedWriter<W>>,
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

/// Frames written to `writer`, one a line, each flushed (see [`write_frame`]).
fn outgoing<W>(
    writer: Arc<SharedWriter<W>>,
) -> impl Sink<String, Error = io::Error> + Send + 'static
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    Box::pin(futures::sink::unfold(
        writer,
        |writer, line: String| async move {
            write_frame(&writer, &line).await?;
            Ok(writer)
        },
    ))
}

/// Frames read from `reader` (strictly, with `malformed`: see [`FrameReader::strict`]).
fn incoming<R>(
    reader: R,
    malformed: Option<Malformed>,
) -> impl Stream<Item = io::Result<String>> + Send + 'static
where
    R: AsyncRead + Unpin + Send + 'static,
{
    let frames = match malformed {
        Some(malformed) => FrameReader::strict(reader, malformed),
        None => FrameReader::new(reader),
    };
    Box::pin(futures::stream::unfold(frames, |mut frames| async move {
        Some((frames.next().await?, frames))
    }))
}
