//! Benchmarks of the model adapters (`lineage_models::HttpModel`) over real sockets on 127.0.0.1,
//! each beside the baselines measured in the same run:
//!
//! - **throughput**: an answer of many short text deltas, served in large writes by the loopback
//!   server and consumed through `HttpModel::stream`, against a raw TCP read of the same bytes
//!   from the same server (no HTTP parsing, no decoding: the physical floor), the HTTP client
//!   alone reading the same body (reqwest, as the adapter builds it, no decoding) and the
//!   in-memory decode of the same bytes by an `AnswerReader` (no socket). Each is timed on the
//!   wall clock and on the consuming thread's CPU clock (on a shared machine, the cost that other
//!   processes' time does not inflate), and the decode is split into the event-stream framing and
//!   the JSON parse of each event from outside the adapter crate;
//! - **first-chunk latency**: the time from the server's first body byte to the first chunk
//!   reaching the consumer, against the same time for a raw TCP read, for the HTTP client's
//!   first body piece, and the in-memory decode of the first events. A bench-local server takes
//!   an `Instant` just before it writes the first body byte (same process, so the instants
//!   compare).
//!
//! The servers run on a runtime of their own (one worker thread), as a separate process would.
//! The consumer runs on a current-thread runtime for the main figures: the turn loop polls one
//! model stream from one task, and on one thread the adapter's connection task and its consumer
//! take turns with no cross-thread wake-up, so the figure is the adapter's own cost per chunk
//! (and the thread's CPU clock covers all of the client's work). The same answer is also
//! consumed by a task on a two-worker multi-thread runtime (what a host on `#[tokio::main]`
//! runs), where the connection task and the consumer may sit on different threads.

use std::io;

use crate::report::Row;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lineage_agent::{Cancellation, Model, ModelRequest};
use lineage_log::{FinishReason, Message, MessageSource, SessionId, StreamChunk};
use lineage_models::{AnswerReader, Endpoint, HttpModel, RetryPolicy, Wire};
use lineage_testkit::loopback::{LoopbackServer, Reply};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

/// The deltas' texts, cycled: a few characters each, as real streams carry (a token is three to
/// four characters of English on average), one of them escaped in JSON.
const WORDS: [&str; 8] = ["The", " qu", "ick", " br", "own", " \"fox\"", " jum", "ps."];

/// The size of each write the loopback server makes of a throughput answer.
pub const SERVER_WRITE: usize = 256 * 1024;

/// The size of each piece the in-memory decode is fed: what one socket read of a fast stream
/// delivers, roughly.
pub const DECODE_PIECE: usize = 64 * 1024;

/// One answer's event stream, as its server sends it.
#[derive(Clone, Debug)]
pub struct Answer {
    /// The wire format it is written in.
    pub wire: Wire,
    /// The body: every event, framing included.
    pub bytes: Vec<u8>,
    /// Where the events up to and including the first text delta end: the first write of the
    /// latency server.
    pub first: usize,
    /// How many text deltas it holds.
    pub deltas: usize,
    /// The whole text, the deltas joined.
    pub text: String,
}

/// A realistic answer of `deltas` text deltas in `wire`'s format: the events a real server sends
/// around them (ids, model names, sequence numbers, the closing events repeating the whole
/// text, usage) are there too, so bytes per chunk are as a real stream has them.
pub fn answer(wire: Wire, deltas: usize) -> Answer {
    let text: String = (0..deltas).map(|i| WORDS[i % WORDS.len()]).collect();
    let mut out = Stream::default();
    let mut first = 0;
    match wire {
        Wire::ChatCompletions => {
            let chunk = |choices: Value| {
                json!({
                    "id": "chatcmpl-bench0001",
                    "object": "chat.completion.chunk",
                    "created": 1_780_000_000,
                    "model": "bench-model",
                    "choices": choices,
                })
            };
            out.data(&chunk(json!([{
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "finish_reason": null,
            }])));
            for i in 0..deltas {
                out.data(&chunk(json!([{
                    "index": 0,
                    "delta": {"content": WORDS[i % WORDS.len()]},
                    "finish_reason": null,
                }])));
                if i == 0 {
                    first = out.len();
                }
            }
            out.data(&chunk(
                json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]),
            ));
            let mut usage = chunk(json!([]));
            usage["usage"] = json!({
                "prompt_tokens": 25,
                "completion_tokens": deltas,
                "total_tokens": deltas + 25,
            });
            out.data(&usage);
            out.raw_data("[DONE]");
        }
        Wire::Responses => {
            let mut seq = 0u64;
            let mut event = |out: &mut Stream, name: &str, mut data: Value| {
                data["type"] = json!(name);
                data["sequence_number"] = json!(seq);
                seq += 1;
                out.named(name, &data);
            };
            let response = |status: &str, output: Value| {
                json!({
                    "id": "resp_bench0001",
                    "object": "response",
                    "created_at": 1_780_000_000,
                    "status": status,
                    "model": "bench-model",
                    "output": output,
                })
            };
            let part = json!({"type": "output_text", "text": text, "annotations": []});
            let item = |status: &str, content: Value| {
                json!({
                    "id": "msg_bench0001",
                    "type": "message",
                    "status": status,
                    "role": "assistant",
                    "content": content,
                })
            };
            event(
                &mut out,
                "response.created",
                json!({"response": response("in_progress", json!([]))}),
            );
            event(
                &mut out,
                "response.in_progress",
                json!({"response": response("in_progress", json!([]))}),
            );
            event(
                &mut out,
                "response.output_item.added",
                json!({"output_index": 0, "item": item("in_progress", json!([]))}),
            );
            event(
                &mut out,
                "response.content_part.added",
                json!({
                    "item_id": "msg_bench0001",
                    "output_index": 0,
                    "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": []},
                }),
            );
            for i in 0..deltas {
                event(
                    &mut out,
                    "response.output_text.delta",
                    json!({
                        "item_id": "msg_bench0001",
                        "output_index": 0,
                        "content_index": 0,
                        "delta": WORDS[i % WORDS.len()],
                        "logprobs": [],
                    }),
                );
                if i == 0 {
                    first = out.len();
                }
            }
            event(
                &mut out,
                "response.output_text.done",
                json!({
                    "item_id": "msg_bench0001",
                    "output_index": 0,
                    "content_index": 0,
                    "text": text,
                    "logprobs": [],
                }),
            );
            event(
                &mut out,
                "response.content_part.done",
                json!({
                    "item_id": "msg_bench0001",
                    "output_index": 0,
                    "content_index": 0,
                    "part": part,
                }),
            );
            event(
                &mut out,
                "response.output_item.done",
                json!({"output_index": 0, "item": item("completed", json!([part]))}),
            );
            let mut done = response("completed", json!([item("completed", json!([part]))]));
            done["usage"] = json!({
                "input_tokens": 25,
                "output_tokens": deltas,
                "total_tokens": deltas + 25,
            });
            event(&mut out, "response.completed", json!({"response": done}));
        }
        Wire::AnthropicMessages => {
            out.named(
                "message_start",
                &json!({
                    "type": "message_start",
                    "message": {
                        "id": "msg_bench0001",
                        "type": "message",
                        "role": "assistant",
                        "model": "bench-model",
                        "content": [],
                        "stop_reason": null,
                        "stop_sequence": null,
                        "usage": {"input_tokens": 25, "output_tokens": 1},
                    },
                }),
            );
            out.named(
                "content_block_start",
                &json!({
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                }),
            );
            out.named("ping", &json!({"type": "ping"}));
            for i in 0..deltas {
                out.named(
                    "content_block_delta",
                    &json!({
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "text_delta", "text": WORDS[i % WORDS.len()]},
                    }),
                );
                if i == 0 {
                    first = out.len();
                }
            }
            out.named(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": 0}),
            );
            out.named(
                "message_delta",
                &json!({
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                    "usage": {"output_tokens": deltas},
                }),
            );
            out.named("message_stop", &json!({"type": "message_stop"}));
        }
        // A wire format this benchmark does not know yet: an empty stream, which every check
        // below refuses by name.
        _ => {}
    }
    Answer {
        wire,
        bytes: out.0,
        first,
        deltas,
        text,
    }
}

/// Event-stream bytes being written.
#[derive(Default)]
struct Stream(Vec<u8>);

impl Stream {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn raw_data(&mut self, data: &str) {
        self.0.extend_from_slice(b"data: ");
        self.0.extend_from_slice(data.as_bytes());
        self.0.extend_from_slice(b"\n\n");
    }

    fn data(&mut self, data: &Value) {
        self.raw_data(&data.to_string());
    }

    fn named(&mut self, name: &str, data: &Value) {
        self.0.extend_from_slice(b"event: ");
        self.0.extend_from_slice(name.as_bytes());
        self.0.push(b'\n');
        self.data(data);
    }
}

/// What a consumer saw of one answer.
#[derive(Debug, Default)]
pub struct Tally {
    /// Every chunk.
    pub chunks: usize,
    /// The text deltas among them.
    pub deltas: usize,
    /// Their text, joined (a real consumer, the turn loop's assembler, keeps it too).
    pub text: String,
    /// Whether the last chunk was a `Stop` finish.
    pub stopped: bool,
}

impl Tally {
    fn take(&mut self, chunk: &StreamChunk) {
        self.chunks += 1;
        self.stopped = matches!(
            chunk,
            StreamChunk::Finish {
                reason: FinishReason::Stop
            }
        );
        if let StreamChunk::TextDelta { text, .. } = chunk {
            self.deltas += 1;
            self.text.push_str(text);
        }
    }

    /// The tally's chunks, or why they are not `answer` read whole.
    fn check(self, answer: &Answer, path: &str) -> Result<usize, String> {
        if self.text != answer.text {
            return Err(format!(
                "{path}, {}: the text read ({} bytes in {} deltas) is not the text sent ({} bytes in {} deltas)",
                answer.wire,
                self.text.len(),
                self.deltas,
                answer.text.len(),
                answer.deltas
            ));
        }
        if !self.stopped {
            return Err(format!(
                "{path}, {}: the stream did not end with a stop finish",
                answer.wire
            ));
        }
        Ok(self.chunks)
    }
}

/// One timed read of a whole answer.
#[derive(Clone, Copy, Debug)]
pub struct Read {
    /// The chunks it produced (for the raw read: none).
    pub chunks: usize,
    /// The bytes it read: the body (the raw read also counts the response head).
    pub bytes: usize,
    /// How long it took.
    pub elapsed: Duration,
    /// How long the calling thread was on a CPU meanwhile (zero where the system does not say):
    /// on a shared machine, the cost that does not count the time other processes took.
    pub cpu: Duration,
    /// How long the calling thread was ready to run but waiting for a CPU meanwhile (zero where
    /// the system does not say): the part of the wall time that other processes took.
    pub waiting_for_cpu: Duration,
}

/// The time the calling thread has spent on a CPU, from `/proc/thread-self/schedstat` (in
/// nanoseconds), where the system provides it.
pub fn thread_cpu() -> Option<Duration> {
    thread_sched().map(|(cpu, _)| cpu)
}

/// The calling thread's time on a CPU and its time ready but waiting for one, from
/// `/proc/thread-self/schedstat` (in nanoseconds), where the system provides it.
fn thread_sched() -> Option<(Duration, Duration)> {
    // The running thread's figures are brought up to date when it yields.
    std::thread::yield_now();
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let mut fields = stat.split_whitespace().map(|f| f.parse::<u64>().ok());
    let cpu = fields.next()??;
    let waiting = fields.next()??;
    Some((Duration::from_nanos(cpu), Duration::from_nanos(waiting)))
}

/// Runs `f` and adds the calling thread's CPU time meanwhile to its read.
fn on_cpu(f: impl FnOnce() -> Result<Read, String>) -> Result<Read, String> {
    let before = thread_sched();
    let mut read = f()?;
    if let (Some(before), Some(after)) = (before, thread_sched()) {
        read.cpu = after.0.saturating_sub(before.0);
        read.waiting_for_cpu = after.1.saturating_sub(before.1);
    }
    Ok(read)
}

/// The runtimes of a run: the servers' and the consumers'.
pub struct Runtimes {
    /// The servers' runtime: one worker thread of its own.
    pub server: Runtime,
    /// The main consumer: a current-thread runtime on the calling thread.
    pub current: Runtime,
    /// The second consumer: a two-worker multi-thread runtime.
    pub multi: Runtime,
}

impl Runtimes {
    /// Builds the three runtimes.
    pub fn new() -> io::Result<Runtimes> {
        Ok(Runtimes {
            server: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("bench-server")
                .enable_all()
                .build()?,
            current: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
            multi: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("bench-client")
                .enable_all()
                .build()?,
        })
    }
}

/// The endpoint of a server at `base`: no retries (a failure is the benchmark's failure), a
/// generous idle timeout.
pub fn endpoint(wire: Wire, base: &str) -> Endpoint {
    let mut endpoint = Endpoint::new("bench", wire, format!("{base}/v1"));
    endpoint.retry = RetryPolicy {
        max_retries: 0,
        ..RetryPolicy::default()
    };
    endpoint.idle_timeout = Duration::from_secs(30);
    endpoint
}

/// A one-message request, as a turn's first step sends.
pub fn request() -> ModelRequest {
    ModelRequest {
        session: SessionId::new(),
        turn: 1,
        step: 1,
        endpoint: "bench".into(),
        model: "bench-model".into(),
        max_tokens: Some(1024),
        system: "Be brief.".into(),
        tools: Vec::new(),
        messages: vec![Message::user_text("Tell me a story.", MessageSource::User)],
        cancel: Cancellation::new(),
    }
}

fn failed(path: &str, wire: Wire, error: &lineage_agent::ModelError) -> String {
    format!(
        "{path}, {wire}: the stream failed with {}: {}",
        error.code, error.message
    )
}

/// Reads one answer from `server` through `model`'s chunk stream, from the request to the
/// stream's end. The server must have the answer's reply scripted next.
pub async fn via_adapter(model: HttpModel, answer: Arc<Answer>) -> Result<Read, String> {
    let start = Instant::now();
    let mut stream = model.stream(request());
    let mut tally = Tally::default();
    while let Some(item) = stream.next().await {
        let chunk = item.map_err(|e| failed("HttpModel", answer.wire, &e))?;
        tally.take(&chunk);
    }
    let elapsed = start.elapsed();
    Ok(Read {
        chunks: tally.check(&answer, "HttpModel")?,
        bytes: answer.bytes.len(),
        elapsed,
        cpu: Duration::ZERO,
        waiting_for_cpu: Duration::ZERO,
    })
}

/// A client as the adapter builds one, for the HTTP client alone.
pub fn http_client() -> Result<reqwest::Client, String> {
    // Where reqwest is built with rustls but no provider (lineage-models' `tls` feature, unified
    // into a workspace build), its builder needs a process-wide one. Already installed is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .build()
        .map_err(|e| format!("the HTTP client does not build: {e}"))
}

/// Posts a request to `base`'s `wire` path with `client`.
async fn post(
    client: &reqwest::Client,
    base: &str,
    wire: Wire,
) -> Result<reqwest::Response, String> {
    let response = client
        .post(format!("{base}/v1{}", wire.path()))
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .body("{}")
        .send()
        .await
        .map_err(|e| format!("reqwest alone, {wire}: {e}"))?;
    if !response.status().is_success() {
        return Err(format!("reqwest alone, {wire}: HTTP {}", response.status()));
    }
    Ok(response)
}

/// Reads one answer's body with the HTTP client alone (`Response::chunk` to the end, no
/// decoding): what the adapter's client costs before the adapter does anything.
pub async fn via_reqwest(
    client: reqwest::Client,
    base: String,
    answer: Arc<Answer>,
) -> Result<Read, String> {
    let start = Instant::now();
    let mut response = post(&client, &base, answer.wire).await?;
    let mut bytes = 0;
    while let Some(piece) = response
        .chunk()
        .await
        .map_err(|e| format!("reqwest alone, {}: {e}", answer.wire))?
    {
        bytes += piece.len();
    }
    let elapsed = start.elapsed();
    if bytes != answer.bytes.len() {
        return Err(format!(
            "reqwest alone, {}: {bytes} bytes read of {}",
            answer.wire,
            answer.bytes.len()
        ));
    }
    Ok(Read {
        chunks: 0,
        bytes,
        elapsed,
        cpu: Duration::ZERO,
        waiting_for_cpu: Duration::ZERO,
    })
}

/// A minimal HTTP request for `wire`'s path, whose answer is read raw.
fn raw_request(addr: SocketAddr, wire: Wire) -> Vec<u8> {
    format!(
        "POST /v1{} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
content-length: 2\r\n\r\n{{}}",
        wire.path()
    )
    .into_bytes()
}

/// Reads one answer from the server at `addr` over a bare TCP connection to its end: a request
/// written by hand, the response read whole with no parsing.
pub async fn raw_read(addr: SocketAddr, answer: Arc<Answer>) -> Result<Read, String> {
    let io = |e: io::Error| format!("raw read, {}: {e}", answer.wire);
    let start = Instant::now();
    let mut stream = TcpStream::connect(addr).await.map_err(io)?;
    stream
        .write_all(&raw_request(addr, answer.wire))
        .await
        .map_err(io)?;
    let mut bytes = Vec::with_capacity(answer.bytes.len() + 4096);
    stream.read_to_end(&mut bytes).await.map_err(io)?;
    let elapsed = start.elapsed();
    if !bytes.ends_with(&answer.bytes) {
        return Err(format!(
            "raw read, {}: {} bytes read do not end with the {}-byte answer",
            answer.wire,
            bytes.len(),
            answer.bytes.len()
        ));
    }
    Ok(Read {
        chunks: 0,
        bytes: bytes.len(),
        elapsed,
        cpu: Duration::ZERO,
        waiting_for_cpu: Duration::ZERO,
    })
}

/// Decodes `answer` in memory, fed in pieces of `piece` bytes, consuming every chunk as the
/// adapter's consumer does.
pub fn decode(answer: &Answer, piece: usize) -> Result<Read, String> {
    let bad = |e: lineage_agent::ModelError| failed("in-memory decode", answer.wire, &e);
    let start = Instant::now();
    let mut reader = AnswerReader::new(answer.wire);
    let mut out = Vec::new();
    let mut tally = Tally::default();
    for bytes in answer.bytes.chunks(piece.max(1)) {
        reader.push(bytes, &mut out).map_err(bad)?;
        for chunk in out.drain(..) {
            tally.take(&chunk);
        }
        if reader.is_done() {
            break;
        }
    }
    reader.finish(&mut out).map_err(bad)?;
    for chunk in out.drain(..) {
        tally.take(&chunk);
    }
    let elapsed = start.elapsed();
    Ok(Read {
        chunks: tally.check(answer, "in-memory decode")?,
        bytes: answer.bytes.len(),
        elapsed,
        cpu: Duration::ZERO,
        waiting_for_cpu: Duration::ZERO,
    })
}

/// Where the in-memory decode's time goes, measured from outside the adapter crate: the
/// event-stream framing alone, and the framing with every event's data parsed as a JSON value
/// (what a translator starts from). The rest of the decode is the translation into chunks.
/// Times are the thread's CPU time where the system says it (as [`Read::cpu`]), else wall time.
#[derive(Clone, Copy, Debug)]
pub struct DecodeSplit {
    /// `sse::Decoder` over the answer, fed in [`DECODE_PIECE`] pieces.
    pub framing: Duration,
    /// The same, plus `serde_json::from_str::<Value>` of every event's data.
    pub framing_and_json: Duration,
    /// How many events the framing yields.
    pub events: usize,
}

/// Times the parts of the in-memory decode of `answer`: the median of `runs`.
pub fn decode_split(answer: &Answer, runs: usize) -> Result<DecodeSplit, String> {
    // Each pass is timed on the thread's CPU clock where there is one, as the decode is.
    let pass = |parse: bool| -> Result<(Duration, usize), String> {
        let cpu = thread_cpu();
        let start = Instant::now();
        let mut decoder = lineage_models::sse::Decoder::new();
        let mut events = 0;
        for bytes in answer.bytes.chunks(DECODE_PIECE) {
            let frames = decoder
                .push(bytes)
                .map_err(|e| format!("the {} framing: {e}", answer.wire))?;
            for frame in frames {
                if let lineage_models::sse::Frame::Event(event) = frame {
                    events += 1;
                    if parse && event.data != "[DONE]" {
                        let value: Value = serde_json::from_str(&event.data)
                            .map_err(|e| format!("the {} event data: {e}", answer.wire))?;
                        std::hint::black_box(value);
                    }
                }
            }
        }
        let elapsed = start.elapsed();
        match (cpu, thread_cpu()) {
            (Some(before), Some(after)) => Ok((after.saturating_sub(before), events)),
            _ => Ok((elapsed, events)),
        }
    };
    let timed = |parse: bool| -> Result<(Duration, usize), String> {
        let mut samples = (0..runs.max(1))
            .map(|_| pass(parse))
            .collect::<Result<Vec<_>, _>>()?;
        samples.sort();
        Ok(samples[samples.len() / 2])
    };
    let (framing, events) = timed(false)?;
    let (framing_and_json, _) = timed(true)?;
    Ok(DecodeSplit {
        framing,
        framing_and_json,
        events,
    })
}

/// The throughput of one wire format: the median of `runs` reads by each path (after one
/// unmeasured read each).
#[derive(Clone, Copy, Debug)]
pub struct Throughput {
    /// `HttpModel` on the current-thread runtime.
    pub adapter: Read,
    /// `HttpModel` consumed by a task on the multi-thread runtime.
    pub adapter_multi: Read,
    /// The HTTP client alone, on the current-thread runtime.
    pub client: Read,
    /// The raw TCP read.
    pub raw: Read,
    /// The in-memory decode.
    pub decode: Read,
}

fn median(mut reads: Vec<Read>) -> Read {
    reads.sort_by_key(|r| r.elapsed);
    reads[reads.len() / 2]
}

/// Measures the throughput of `answer` by every path, `runs` times each.
pub fn throughput(rt: &Runtimes, answer: Answer, runs: usize) -> Result<Throughput, String> {
    let answer = Arc::new(answer);
    let wire = answer.wire;
    let server = rt
        .server
        .block_on(LoopbackServer::start([]))
        .map_err(|e| format!("the loopback server does not start: {e}"))?;
    let model = HttpModel::new(endpoint(wire, &server.base_url()))
        .map_err(|e| format!("the {wire} client does not build: {e}"))?;
    let reply = || Reply::Sse {
        body: answer.bytes.clone(),
        chunk: Some(SERVER_WRITE),
        delay: Duration::ZERO,
    };
    let runs = runs.max(1);
    let timed = |f: &mut dyn FnMut() -> Result<Read, String>| -> Result<Read, String> {
        f()?;
        let reads = (0..runs).map(|_| f()).collect::<Result<Vec<_>, _>>()?;
        Ok(median(reads))
    };
    let adapter = timed(&mut || {
        server.push(reply());
        on_cpu(|| {
            rt.current
                .block_on(via_adapter(model.clone(), answer.clone()))
        })
    })?;
    // A client of its own: its connections belong to the runtime that made them.
    let multi_model = HttpModel::new(endpoint(wire, &server.base_url()))
        .map_err(|e| format!("the {wire} client does not build: {e}"))?;
    let adapter_multi = timed(&mut || {
        server.push(reply());
        let task = rt
            .multi
            .spawn(via_adapter(multi_model.clone(), answer.clone()));
        rt.multi
            .block_on(task)
            .map_err(|e| format!("HttpModel on the multi-thread runtime, {wire}: {e}"))?
    })?;
    let client = http_client()?;
    let base = server.base_url();
    let client = timed(&mut || {
        server.push(reply());
        on_cpu(|| {
            rt.current
                .block_on(via_reqwest(client.clone(), base.clone(), answer.clone()))
        })
    })?;
    let raw = timed(&mut || {
        server.push(reply());
        on_cpu(|| rt.current.block_on(raw_read(server.addr(), answer.clone())))
    })?;
    let decode = timed(&mut || on_cpu(|| decode(&answer, DECODE_PIECE)))?;
    Ok(Throughput {
        adapter,
        adapter_multi,
        client,
        raw,
        decode,
    })
}

/// A server for the latency runs: it answers each connection with the response head, waits
/// `pause` (so the head has been read and the client waits for the body), takes an `Instant`
/// and at once writes the events up to the first text delta. It writes the rest once the client
/// says it has the first chunk ([`FirstByteServer::go`]), as a real stream's next tokens come
/// later: otherwise one read could carry the whole answer, and the first chunk would wait for
/// all of it to be decoded. Every instant is sent on `stamps`, one per connection, in order.
pub struct FirstByteServer {
    addr: SocketAddr,
    stamps: mpsc::Receiver<Instant>,
    go: tokio::sync::mpsc::UnboundedSender<()>,
    task: JoinHandle<()>,
}

impl FirstByteServer {
    /// Starts the server on `rt`.
    pub fn start(rt: &Runtime, answer: Arc<Answer>, pause: Duration) -> io::Result<Self> {
        let listener = rt.block_on(TcpListener::bind(("127.0.0.1", 0)))?;
        let addr = listener.local_addr()?;
        let (tx, stamps) = mpsc::channel();
        let (go, mut went) = tokio::sync::mpsc::unbounded_channel();
        let task = rt.spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                // A connection that fails is the client's to report: its read fails.
                let _ = serve_first(stream, &answer, pause, &tx, &mut went).await;
            }
        });
        Ok(FirstByteServer {
            addr,
            stamps,
            go,
            task,
        })
    }

    /// Tells the server the first chunk is in: it writes the rest of the answer.
    pub fn go(&self) {
        // The server task outlives its handle's calls; a send to a stopped one has no reader.
        let _ = self.go.send(());
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The instant the last connection's first body byte was written.
    fn stamp(&self) -> Result<Instant, String> {
        self.stamps
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| "the latency server took no first-byte instant".to_owned())
    }
}

impl Drop for FirstByteServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_first(
    mut stream: TcpStream,
    answer: &Answer,
    pause: Duration,
    stamps: &mpsc::Sender<Instant>,
    went: &mut tokio::sync::mpsc::UnboundedReceiver<()>,
) -> io::Result<()> {
    stream.set_nodelay(true)?;
    // The request: its head, then its content-length body, both discarded.
    let mut buf = Vec::new();
    let mut piece = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = stream.read(&mut piece).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&piece[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = buf.len() - head_end;
    while body < length {
        let n = stream.read(&mut piece).await?;
        if n == 0 {
            return Ok(());
        }
        body += n;
    }
    stream
        .write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
connection: close\r\n\r\n",
        )
        .await?;
    stream.flush().await?;
    if !pause.is_zero() {
        tokio::time::sleep(pause).await;
    }
    // A word meant for an earlier connection (whose client failed before it read) is stale.
    while went.try_recv().is_ok() {}
    let start = Instant::now();
    stream.write_all(&answer.bytes[..answer.first]).await?;
    // The receiver outlives every connection it is told about.
    let _ = stamps.send(start);
    // A client that fails before its first chunk never says so: the rest goes after a while.
    let _ = tokio::time::timeout(Duration::from_secs(5), went.recv()).await;
    stream.write_all(&answer.bytes[answer.first..]).await?;
    stream.shutdown().await
}

/// Times, on the current thread's runtime, from the server's first body byte to the first chunk
/// out of `model`'s stream; the stream is then read to its end, and must be whole.
pub async fn first_chunk_via_adapter(
    model: &HttpModel,
    server: &FirstByteServer,
    answer: &Answer,
) -> Result<Duration, String> {
    let mut stream = model.stream(request());
    let mut tally = Tally::default();
    let first = stream.next().await;
    let at = Instant::now();
    server.go();
    match first {
        Some(Ok(chunk)) => tally.take(&chunk),
        Some(Err(e)) => return Err(failed("HttpModel", answer.wire, &e)),
        None => return Err(format!("HttpModel, {}: the stream was empty", answer.wire)),
    }
    while let Some(item) = stream.next().await {
        tally.take(&item.map_err(|e| failed("HttpModel", answer.wire, &e))?);
    }
    tally.check(answer, "HttpModel")?;
    since(server.stamp()?, at)
}

/// The same time for the HTTP client alone: to the first body piece `Response::chunk` returns.
pub async fn first_piece_via_reqwest(
    client: &reqwest::Client,
    server: &FirstByteServer,
    answer: &Answer,
) -> Result<Duration, String> {
    let bad = |e: reqwest::Error| format!("reqwest alone, {}: {e}", answer.wire);
    let mut response = post(client, &server.base_url(), answer.wire).await?;
    let first = response.chunk().await.map_err(bad)?;
    let at = Instant::now();
    server.go();
    let mut bytes = match first {
        Some(piece) => piece.len(),
        None => return Err(format!("reqwest alone, {}: an empty body", answer.wire)),
    };
    while let Some(piece) = response.chunk().await.map_err(bad)? {
        bytes += piece.len();
    }
    if bytes != answer.bytes.len() {
        return Err(format!(
            "reqwest alone, {}: {bytes} bytes read of {}",
            answer.wire,
            answer.bytes.len()
        ));
    }
    since(server.stamp()?, at)
}

/// The same time for a bare TCP read: from the first body byte's write to the read that returns
/// it (or the head with it, should they come together).
pub async fn first_byte_raw(server: &FirstByteServer, answer: &Answer) -> Result<Duration, String> {
    let io = |e: io::Error| format!("raw first byte, {}: {e}", answer.wire);
    let mut stream = TcpStream::connect(server.addr).await.map_err(io)?;
    stream
        .write_all(&raw_request(server.addr, answer.wire))
        .await
        .map_err(io)?;
    let mut bytes = Vec::new();
    let mut piece = vec![0u8; 64 * 1024];
    let at = loop {
        let n = stream.read(&mut piece).await.map_err(io)?;
        let at = Instant::now();
        if n == 0 {
            return Err(format!(
                "raw first byte, {}: the connection closed before the body",
                answer.wire
            ));
        }
        bytes.extend_from_slice(&piece[..n]);
        if let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n")
            && bytes.len() > end + 4
        {
            break at;
        }
    };
    server.go();
    stream.read_to_end(&mut bytes).await.map_err(io)?;
    if !bytes.ends_with(&answer.bytes) {
        return Err(format!(
            "raw first byte, {}: the bytes read do not end with the answer",
            answer.wire
        ));
    }
    since(server.stamp()?, at)
}

fn since(written: Instant, read: Instant) -> Result<Duration, String> {
    read.checked_duration_since(written).ok_or_else(|| {
        "a first chunk was read before its byte was written: the latency server's instants \
         do not belong to this read"
            .to_owned()
    })
}

/// First-chunk latencies of one wire format.
#[derive(Clone, Debug)]
pub struct Latency {
    /// `HttpModel` on the current-thread runtime, sorted.
    pub adapter: Vec<Duration>,
    /// The HTTP client alone, sorted.
    pub client: Vec<Duration>,
    /// The raw TCP read, sorted.
    pub raw: Vec<Duration>,
    /// The in-memory decode of the first write's bytes to the first chunk: the mean of many.
    pub decode: Duration,
}

/// The `q`-quantile (0 to 1) of sorted `samples`, by the nearest rank.
pub fn quantile(samples: &[Duration], q: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * samples.len() as f64).ceil() as usize;
    samples[rank.clamp(1, samples.len()) - 1]
}

/// Measures the first-chunk latency of `answer`, `runs` times by each path (after a few
/// unmeasured runs).
pub fn latency(
    rt: &Runtimes,
    answer: Answer,
    runs: usize,
    pause: Duration,
) -> Result<Latency, String> {
    let answer = Arc::new(answer);
    let wire = answer.wire;
    let server = FirstByteServer::start(&rt.server, answer.clone(), pause)
        .map_err(|e| format!("the latency server does not start: {e}"))?;
    let model = HttpModel::new(endpoint(wire, &server.base_url()))
        .map_err(|e| format!("the {wire} client does not build: {e}"))?;
    const WARM_UP: usize = 3;
    let mut adapter = Vec::with_capacity(runs);
    let mut client = Vec::with_capacity(runs);
    let mut raw = Vec::with_capacity(runs);
    let http = http_client()?;
    // Interleaved, so that whatever else the machine does falls on every path alike.
    for i in 0..runs.max(1) + WARM_UP {
        let a = rt
            .current
            .block_on(first_chunk_via_adapter(&model, &server, &answer))?;
        let c = rt
            .current
            .block_on(first_piece_via_reqwest(&http, &server, &answer))?;
        let r = rt.current.block_on(first_byte_raw(&server, &answer))?;
        if i >= WARM_UP {
            adapter.push(a);
            client.push(c);
            raw.push(r);
        }
    }
    adapter.sort();
    client.sort();
    raw.sort();
    let first = &answer.bytes[..answer.first];
    let mut out = Vec::new();
    let mut check = Ok(());
    let decode = crate::measure::time_per_call(Duration::from_millis(100), 100, || {
        out.clear();
        let mut reader = AnswerReader::new(wire);
        if let Err(e) = reader.push(first, &mut out) {
            check = Err(failed("in-memory first chunk", wire, &e));
        } else if out.is_empty() {
            check = Err(format!(
                "in-memory first chunk, {wire}: the first write yields no chunk"
            ));
        }
    });
    check?;
    Ok(Latency {
        adapter,
        client,
        raw,
        decode,
    })
}

/// The chunks-per-second target of every adapter.
pub const TARGET_CHUNKS_PER_SEC: f64 = 200_000.0;

fn per_sec(count: usize, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64().max(1e-9)
}

fn mb_per_sec(bytes: usize, elapsed: Duration) -> f64 {
    per_sec(bytes, elapsed) / 1e6
}

/// The throughput rows of one wire format.
pub fn throughput_rows(wire: Wire, deltas: usize, t: &Throughput) -> Vec<Row> {
    let chunks = t.adapter.chunks;
    let adapter = per_sec(chunks, t.adapter.elapsed);
    vec![
        Row {
            figure: format!(
                "{wire}: chunks/s through HttpModel, {deltas} deltas (current-thread runtime)"
            ),
            unit: "chunks/s",
            lineage: adapter,
            others: vec![
                (
                    "raw TCP read of the same bytes (floor)",
                    per_sec(chunks, t.raw.elapsed),
                ),
                (
                    "in-memory decode (AnswerReader)",
                    per_sec(t.decode.chunks, t.decode.elapsed),
                ),
                (
                    "reqwest alone, no decoding",
                    per_sec(chunks, t.client.elapsed),
                ),
                (
                    "HttpModel on a 2-worker runtime",
                    per_sec(t.adapter_multi.chunks, t.adapter_multi.elapsed),
                ),
            ],
            target: Some(("≥ 200k chunks/s".into(), adapter >= TARGET_CHUNKS_PER_SEC)),
            higher_is_better: true,
        },
        Row {
            figure: format!(
                "{wire}: chunks per CPU-second of the consuming thread, {deltas} deltas \
                 (current-thread runtime)"
            ),
            unit: "chunks/s",
            lineage: per_sec(chunks, t.adapter.cpu),
            others: vec![
                (
                    "raw TCP read of the same bytes (floor)",
                    per_sec(chunks, t.raw.cpu),
                ),
                (
                    "in-memory decode (AnswerReader)",
                    per_sec(t.decode.chunks, t.decode.cpu),
                ),
                ("reqwest alone, no decoding", per_sec(chunks, t.client.cpu)),
            ],
            target: None,
            higher_is_better: true,
        },
        Row {
            figure: format!("{wire}: bytes/s through HttpModel, {deltas} deltas"),
            unit: "MB/s",
            lineage: mb_per_sec(t.adapter.bytes, t.adapter.elapsed),
            others: vec![
                (
                    "raw TCP read (floor)",
                    mb_per_sec(t.raw.bytes, t.raw.elapsed),
                ),
                (
                    "reqwest alone, no decoding",
                    mb_per_sec(t.client.bytes, t.client.elapsed),
                ),
                (
                    "in-memory decode (AnswerReader)",
                    mb_per_sec(t.decode.bytes, t.decode.elapsed),
                ),
            ],
            target: None,
            higher_is_better: true,
        },
    ]
}

/// The row of where the in-memory decode's time goes, for one wire format.
pub fn split_row(wire: Wire, deltas: usize, decode: &Read, split: &DecodeSplit) -> Row {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let whole = if decode.cpu.is_zero() {
        decode.elapsed
    } else {
        decode.cpu
    };
    Row {
        figure: format!("{wire}: in-memory decode of {deltas} deltas (CPU time), and its parts"),
        unit: "ms",
        lineage: ms(whole),
        others: vec![
            ("event-stream framing alone", ms(split.framing)),
            (
                "framing + each event's JSON parsed",
                ms(split.framing_and_json),
            ),
        ],
        target: None,
        higher_is_better: false,
    }
}

/// The row of where one chunk's CPU time goes on the current-thread runtime, in nanoseconds per
/// chunk: the whole adapter, the in-memory decode and its framing, the HTTP client alone, and
/// what is left (the adapter's own machinery: the body's copy, the chunk queue, the stream).
pub fn per_chunk_row(wire: Wire, t: &Throughput, split: &DecodeSplit) -> Row {
    let chunks = t.adapter.chunks.max(1) as f64;
    let ns = |d: Duration| d.as_secs_f64() * 1e9 / chunks;
    let rest = ns(t.adapter.cpu) - ns(t.decode.cpu) - ns(t.client.cpu);
    Row {
        figure: format!("{wire}: CPU time per chunk, and its parts"),
        unit: "ns",
        lineage: ns(t.adapter.cpu),
        others: vec![
            ("in-memory decode", ns(t.decode.cpu)),
            ("of which event-stream framing", ns(split.framing)),
            ("reqwest alone", ns(t.client.cpu)),
            ("the rest: the adapter's own machinery", rest.max(0.0)),
        ],
        target: None,
        higher_is_better: false,
    }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The latency rows of one wire format.
pub fn latency_rows(wire: Wire, l: &Latency) -> Vec<Row> {
    let runs = l.adapter.len();
    vec![
        Row {
            figure: format!("{wire}: first body byte → first chunk, median of {runs}"),
            unit: "µs",
            lineage: micros(quantile(&l.adapter, 0.5)),
            others: vec![
                ("raw TCP read of the byte", micros(quantile(&l.raw, 0.5))),
                (
                    "reqwest alone, first body piece",
                    micros(quantile(&l.client, 0.5)),
                ),
                ("in-memory decode (mean)", micros(l.decode)),
            ],
            target: None,
            higher_is_better: false,
        },
        Row {
            figure: format!("{wire}: first body byte → first chunk, p99 of {runs}"),
            unit: "µs",
            lineage: micros(quantile(&l.adapter, 0.99)),
            others: vec![
                ("raw TCP read of the byte", micros(quantile(&l.raw, 0.99))),
                (
                    "reqwest alone, first body piece",
                    micros(quantile(&l.client, 0.99)),
                ),
            ],
            target: None,
            higher_is_better: false,
        },
    ]
}

/// What was measured of one wire format, for the JSON.
pub fn answer_json(answer: &Answer, t: &Throughput, l: &Latency, split: &DecodeSplit) -> Value {
    json!({
        "events": split.events,
        "framing_ms": split.framing.as_secs_f64() * 1e3,
        "framing_and_json_ms": split.framing_and_json.as_secs_f64() * 1e3,
        "wire": answer.wire.name(),
        "text_deltas": answer.deltas,
        "body_bytes": answer.bytes.len(),
        "bytes_per_delta": answer.bytes.len() as f64 / answer.deltas.max(1) as f64,
        "chunks": t.adapter.chunks,
        "adapter_ms": t.adapter.elapsed.as_secs_f64() * 1e3,
        "adapter_cpu_ms": t.adapter.cpu.as_secs_f64() * 1e3,
        "adapter_waiting_for_cpu_ms": t.adapter.waiting_for_cpu.as_secs_f64() * 1e3,
        "raw_read_cpu_ms": t.raw.cpu.as_secs_f64() * 1e3,
        "decode_cpu_ms": t.decode.cpu.as_secs_f64() * 1e3,
        "adapter_multi_thread_ms": t.adapter_multi.elapsed.as_secs_f64() * 1e3,
        "raw_read_ms": t.raw.elapsed.as_secs_f64() * 1e3,
        "reqwest_alone_ms": t.client.elapsed.as_secs_f64() * 1e3,
        "reqwest_alone_cpu_ms": t.client.cpu.as_secs_f64() * 1e3,
        "decode_ms": t.decode.elapsed.as_secs_f64() * 1e3,
        "first_write_bytes": answer.first,
        "first_chunk_us": l.adapter.iter().map(|d| micros(*d)).collect::<Vec<_>>(),
        "first_byte_raw_us": l.raw.iter().map(|d| micros(*d)).collect::<Vec<_>>(),
        "first_piece_reqwest_us": l.client.iter().map(|d| micros(*d)).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_answer_holds_its_deltas_and_its_first_write_ends_after_the_first_delta() {
        for wire in Wire::ALL {
            let answer = answer(wire, 10);
            assert_eq!(
                answer.text, "The quick brown \"fox\" jumps.The qu",
                "{wire}"
            );
            let first = std::str::from_utf8(&answer.bytes[..answer.first]).expect("UTF-8");
            assert!(first.ends_with("\n\n"), "{wire}: {first}");
            assert!(first.contains("\"The\""), "{wire}: {first}");
            assert!(!first.contains("\" qu\""), "{wire}: {first}");
        }
    }

    #[test]
    fn the_raw_reads_get_every_answer_whole_from_both_servers() {
        let rt = Runtimes::new().expect("runtimes");
        for wire in Wire::ALL {
            let answer = Arc::new(answer(wire, 50));
            let server = rt
                .server
                .block_on(LoopbackServer::start([Reply::Sse {
                    body: answer.bytes.clone(),
                    chunk: Some(100),
                    delay: Duration::ZERO,
                }]))
                .expect("loopback server");
            let read = rt
                .current
                .block_on(raw_read(server.addr(), answer.clone()))
                .expect("a raw read");
            assert!(
                read.bytes > answer.bytes.len(),
                "{wire}: the head is counted"
            );
            let first = FirstByteServer::start(&rt.server, answer.clone(), Duration::ZERO)
                .expect("latency server");
            for _ in 0..3 {
                rt.current
                    .block_on(first_byte_raw(&first, &answer))
                    .expect("a raw first byte");
            }
        }
    }

    #[test]
    fn every_path_reads_a_small_answer_whole_in_every_format() {
        let rt = Runtimes::new().expect("runtimes");
        for wire in Wire::ALL {
            let t = throughput(&rt, answer(wire, 300), 1).expect("throughput");
            // 300 deltas, and at least a block start, a block end and a finish around them.
            for read in [t.adapter, t.adapter_multi, t.decode] {
                assert!(read.chunks >= 303, "{wire}: {read:?}");
            }
            assert_eq!(t.adapter.chunks, t.decode.chunks, "{wire}");
            let l = latency(&rt, answer(wire, 300), 3, Duration::ZERO).expect("latency");
            assert_eq!(
                (l.adapter.len(), l.client.len(), l.raw.len()),
                (3, 3, 3),
                "{wire}"
            );
            let rows = [throughput_rows(wire, 300, &t), latency_rows(wire, &l)].concat();
            assert_eq!(rows.len(), 5, "{wire}");
            assert!(
                crate::report::table(&rows, "HttpModel").contains("≥ 200k chunks/s"),
                "{wire}"
            );
        }
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let samples: Vec<Duration> = (1..=200).map(Duration::from_micros).collect();
        assert_eq!(quantile(&samples, 0.5), Duration::from_micros(100));
        assert_eq!(quantile(&samples, 0.99), Duration::from_micros(198));
        assert_eq!(quantile(&samples[..1], 0.99), Duration::from_micros(1));
        assert_eq!(quantile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn a_tally_refuses_a_text_that_is_not_the_one_sent() {
        let answer = answer(Wire::ChatCompletions, 2);
        let mut tally = Tally::default();
        tally.take(&StreamChunk::TextDelta {
            index: 0,
            text: "The".into(),
        });
        tally.take(&StreamChunk::Finish {
            reason: FinishReason::Stop,
        });
        let error = tally
            .check(&answer, "test")
            .expect_err("one delta is missing");
        assert!(error.contains("3 bytes in 1 deltas"), "{error}");
    }
}
