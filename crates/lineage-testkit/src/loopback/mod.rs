//! A loopback model server: a real HTTP/1.1 server on 127.0.0.1 that answers from a script and
//! records every request it receives, so adapters (and the out-of-process agents pointed at it)
//! are tested over real sockets with no network.
//!
//! Each connection carries one request and one reply (`Connection: close`), taken from the
//! script in order. A reply can stream server-sent events in chunks with a delay between them,
//! answer an HTTP error with headers, send some bytes and close (a stream cut mid-event), or send
//! some bytes and then hold the connection open (for idle timeouts). A request that finds the
//! script empty is answered `500` with a body that says so, so a test that asks more than it
//! scripted fails loudly.

/// The calls every format's `Script` has alike, written once for each format module: one tool
/// call, an event verbatim, the body as a reply (whole or chunked), and the module's whole
/// one-text and one-call answers. The module's `Script` has an `events` field of named (`Some`)
/// or data-only events and `new`, `text`, `parallel_tool_calls`, `stop`, `tool_stop` and `body`
/// of its own.
macro_rules! script_calls {
    () => {
        impl Script {
            /// One tool call `name` with call id `id`, its arguments in `argument_parts`: a
            /// [`Script::parallel_tool_calls`] of one.
            pub fn tool_call(self, id: &str, name: &str, argument_parts: &[&str]) -> Script {
                self.parallel_tool_calls(&[(id, name, argument_parts)])
            }

            /// An event verbatim: `event` names it (`None` for a data-only event) and `data` is
            /// its data, unchanged. It opens and closes nothing, and counts nothing.
            pub fn raw(mut self, event: Option<&str>, data: &str) -> Script {
                self.events
                    .push((event.map(str::to_owned), data.to_owned()));
                self
            }

            /// [`Script::body`] as one reply, sent at once.
            pub fn reply(&self) -> $crate::loopback::Reply {
                $crate::loopback::Reply::Sse {
                    body: self.body(),
                    chunk: None,
                    delay: ::std::time::Duration::ZERO,
                }
            }

            /// [`Script::body`] as one reply sent `bytes` at a time (at least one: the server
            /// sends a byte per write for 0), `delay` before each write.
            pub fn chunked(
                &self,
                bytes: usize,
                delay: ::std::time::Duration,
            ) -> $crate::loopback::Reply {
                $crate::loopback::Reply::Sse {
                    body: self.body(),
                    chunk: Some(bytes.max(1)),
                    delay,
                }
            }
        }

        /// A whole normal answer of one text ([`Script::stop`]), with no usage.
        pub fn text(text: &str) -> $crate::loopback::Reply {
            Script::new().text(text).stop().reply()
        }

        /// A whole answer asking for one call of `name` with call id `id` and `arguments` in one
        /// part ([`Script::tool_stop`]), with no usage.
        pub fn tool_call(id: &str, name: &str, arguments: &str) -> $crate::loopback::Reply {
            Script::new()
                .tool_call(id, name, &[arguments])
                .tool_stop()
                .reply()
        }
    };
}

pub mod anthropic;
pub mod chat;
pub mod responses;

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The most bytes a request's head (request line and headers) may have.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// One scripted reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `200` with `text/event-stream`: `body` sent in chunks of `chunk` bytes (all at once when
    /// `None`), `delay` before each chunk, then the connection is closed.
    Sse {
        /// The event-stream bytes, framing included.
        body: Vec<u8>,
        /// How many bytes each write carries.
        chunk: Option<usize>,
        /// The pause before each write.
        delay: Duration,
    },
    /// An HTTP answer with `status`, extra `headers` and `body`.
    Status {
        /// The status code.
        status: u16,
        /// Extra headers, such as `retry-after` or `x-request-id`.
        headers: Vec<(String, String)>,
        /// The body.
        body: String,
    },
    /// `200` with `text/event-stream`, then `body`, then the connection is closed: with a body
    /// that stops mid-event, a stream cut short.
    Cut {
        /// The bytes sent before the close.
        body: Vec<u8>,
    },
    /// `200` with `text/event-stream`, then `body`, then nothing more until the client closes the
    /// connection: a stalled stream.
    Stall {
        /// The bytes sent before the stall.
        body: Vec<u8>,
    },
}

impl Reply {
    /// A whole event stream of `events`, each one `data:` payload, sent at once.
    pub fn sse<I, S>(events: I) -> Reply
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Reply::Sse {
            body: sse_body(events),
            chunk: None,
            delay: Duration::ZERO,
        }
    }

    /// An HTTP error answer with a JSON `body` and no extra headers.
    pub fn status(status: u16, body: impl Into<String>) -> Reply {
        Reply::Status {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }
}

/// The event-stream bytes of `events`, each a `data:` payload (a payload's own newlines become
/// further `data:` lines), each ended by a blank line.
pub fn sse_body<I, S>(events: I) -> Vec<u8>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut body = String::new();
    for event in events {
        for line in event.as_ref().split('\n') {
            body.push_str("data: ");
            body.push_str(line);
            body.push('\n');
        }
        body.push('\n');
    }
    body.into_bytes()
}

/// The event-stream bytes of named `events`, each an `event:` line and a `data:` payload (the
/// framing of the Responses and Anthropic formats).
pub fn sse_named_body<I, N, D>(events: I) -> Vec<u8>
where
    I: IntoIterator<Item = (N, D)>,
    N: AsRef<str>,
    D: AsRef<str>,
{
    let mut body = Vec::new();
    for (name, data) in events {
        body.extend_from_slice(format!("event: {}\n", name.as_ref()).as_bytes());
        body.extend_from_slice(&sse_body([data]));
    }
    body
}

/// The event-stream bytes of a script's `events`, in order: each named one (`Some` name) with
/// its `event:` line, each unnamed one as `data:` alone.
pub(crate) fn script_body(events: &[(Option<String>, String)]) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, data) in events {
        match name {
            Some(name) => body.extend(sse_named_body([(name, data)])),
            None => body.extend(sse_body([data])),
        }
    }
    body
}

/// A request as the server received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// `POST`, `GET`, ...
    pub method: String,
    /// The request target, such as `/v1/chat/completions`.
    pub path: String,
    /// The headers in the order sent, names in lower case.
    pub headers: Vec<(String, String)>,
    /// The body (read by `Content-Length`).
    pub body: Vec<u8>,
}

impl Recorded {
    /// The value of header `name` (any case), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON, when it is JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

struct Shared {
    script: Mutex<VecDeque<Reply>>,
    requests: Mutex<Vec<Recorded>>,
    /// How many stalled replies the client has walked away from.
    released: tokio::sync::watch::Sender<usize>,
}

/// The server. It stops when dropped.
pub struct LoopbackServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl LoopbackServer {
    /// Starts a server on a free port of 127.0.0.1 that answers with `replies`, in order. Must be
    /// called inside a tokio runtime.
    pub async fn start(replies: impl IntoIterator<Item = Reply>) -> io::Result<LoopbackServer> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            script: Mutex::new(replies.into_iter().collect()),
            requests: Mutex::default(),
            released: tokio::sync::watch::Sender::new(0),
        });
        let serving = shared.clone();
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, serving.clone()));
            }
        });
        Ok(LoopbackServer {
            addr,
            shared,
            accept,
        })
    }

    /// `http://127.0.0.1:<port>`, without a trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Appends `reply` to the script.
    pub fn push(&self, reply: Reply) {
        lock(&self.shared.script).push_back(reply);
    }

    /// Every request received so far, in the order their heads and bodies were read.
    pub fn requests(&self) -> Vec<Recorded> {
        lock(&self.shared.requests).clone()
    }

    /// Waits until clients have closed `count` connections that were held by [`Reply::Stall`]
    /// (in total, since the server started): proof that a cancelled client dropped its request.
    pub async fn stalls_released(&self, count: usize) {
        let mut released = self.shared.released.subscribe();
        // The sender lives in `shared`, which this server holds: the wait cannot fail.
        let _ = released.wait_for(|n| *n >= count).await;
    }

    /// How many scripted replies are still unused.
    pub fn remaining(&self) -> usize {
        lock(&self.shared.script).len()
    }
}

impl Drop for LoopbackServer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Serves one connection: reads one request, records it, answers the next scripted reply.
async fn serve(mut stream: TcpStream, shared: Arc<Shared>) {
    let request = match read_request(&mut stream).await {
        Ok(Some(request)) => request,
        Ok(None) => return,
        Err(message) => {
            let _ = write_status(&mut stream, 400, &[], &message).await;
            return;
        }
    };
    lock(&shared.requests).push(request);
    let reply = lock(&shared.script).pop_front();
    let _ = match reply {
        Some(reply) => answer(&mut stream, reply, &shared).await,
        None => {
            write_status(
                &mut stream,
                500,
                &[],
                "{\"error\":{\"message\":\"the loopback script has no reply left\"}}",
            )
            .await
        }
    };
}

async fn answer(stream: &mut TcpStream, reply: Reply, shared: &Shared) -> io::Result<()> {
    const SSE_HEAD: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
cache-control: no-cache\r\nconnection: close\r\n\r\n";
    match reply {
        Reply::Status {
            status,
            headers,
            body,
        } => write_status(stream, status, &headers, &body).await,
        Reply::Sse { body, chunk, delay } => {
            stream.write_all(SSE_HEAD).await?;
            let size = chunk.unwrap_or(body.len()).max(1);
            for piece in body.chunks(size) {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                stream.write_all(piece).await?;
                stream.flush().await?;
            }
            stream.shutdown().await
        }
        Reply::Cut { body } => {
            stream.write_all(SSE_HEAD).await?;
            stream.write_all(&body).await?;
            stream.shutdown().await
        }
        Reply::Stall { body } => {
            stream.write_all(SSE_HEAD).await?;
            stream.write_all(&body).await?;
            stream.flush().await?;
            // Hold the connection until the client goes away.
            let mut sink = [0u8; 256];
            // A reset counts as going away too.
            while stream.read(&mut sink).await.unwrap_or(0) > 0 {}
            shared.released.send_modify(|n| *n += 1);
            Ok(())
        }
    }
}

async fn write_status(
    stream: &mut TcpStream,
    status: u16,
    headers: &[(String, String)],
    body: &str,
) -> io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
connection: close\r\n",
        reason(status),
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        413 => "Payload Too Large",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        529 => "Overloaded",
        _ => "Status",
    }
}

/// Reads one request: its head up to the blank line, then a `Content-Length` body. `None` when
/// the client closed before sending anything; `Err` with a message for a request this server
/// does not take (chunked bodies among them).
async fn read_request(stream: &mut TcpStream) -> Result<Option<Recorded>, String> {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Err("the request head is too large".into());
        }
        let mut chunk = [0u8; 4096];
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| format!("reading the request failed: {e}"))?;
        if n == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err("the connection closed inside the request head".into())
            };
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head =
        std::str::from_utf8(&buf[..head_end]).map_err(|_| "the request head is not UTF-8")?;
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (Some(method), Some(path), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("a malformed request line: {request_line:?}"));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(format!("an unsupported HTTP version: {version:?}"));
    }
    let mut headers = Vec::new();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err(format!("a malformed header line: {line:?}"));
        };
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    let header = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v);
    if header("transfer-encoding").is_some() {
        return Err("chunked request bodies are not supported; send a content-length".into());
    }
    let length: usize = match header("content-length") {
        Some(v) => v
            .parse()
            .map_err(|_| format!("a malformed content-length: {v:?}"))?,
        None => 0,
    };
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < length {
        let mut chunk = vec![0u8; (length - body.len()).min(64 * 1024)];
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| format!("reading the request body failed: {e}"))?;
        if n == 0 {
            return Err("the connection closed inside the request body".into());
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(length);
    Ok(Some(Recorded {
        method: method.to_owned(),
        path: path.to_owned(),
        headers,
        body,
    }))
}
