//! [`ScriptedModel`]: a deterministic model that plays a script of responses, one per request.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures_core::Stream;
use lineage_log::{
    BlockType, CallId, ContentBlock, FinishReason, StreamChunk, Text, ToolCallDelta, Usage,
};
use tokio::sync::watch;

use crate::model::{ABORTED, ChunkStream, Model, ModelError, ModelRequest};

/// The code of the failure a [`ScriptedModel`] streams when its script has run out.
pub const SCRIPT_EXHAUSTED: &str = "SCRIPT_EXHAUSTED";

/// A gate a test opens: a gated response streams nothing until then.
#[derive(Clone, Debug)]
pub struct Gate {
    open: Arc<watch::Sender<bool>>,
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        Gate {
            open: Arc::new(watch::Sender::new(false)),
        }
    }

    /// Opens the gate for good.
    pub fn open(&self) {
        self.open.send_replace(true);
    }

    /// Resolves once the gate is open.
    pub async fn wait(&self) {
        let mut rx = self.open.subscribe();
        // The sender lives in `self`, so the channel cannot close while this waits.
        let _ = rx.wait_for(|open| *open).await;
    }
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

type Compute = Box<dyn Fn(&ModelRequest) -> Response + Send + Sync>;

/// One scripted answer.
pub enum Response {
    /// Streams these chunks, then ends.
    Chunks(Vec<StreamChunk>),
    /// Streams these chunks, then waits until the request is cancelled and fails with `ABORTED`.
    Hang(Vec<StreamChunk>),
    /// Fails at once with this failure, as an adapter error would.
    Fail(ModelError),
    /// Waits for the gate, then plays the inner response.
    Gated(Gate, Box<Response>),
    /// Decides from the request (for example from the tool results it carries).
    Compute(Compute),
}

impl std::fmt::Debug for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Response::Chunks(c) => f.debug_tuple("Chunks").field(c).finish(),
            Response::Hang(c) => f.debug_tuple("Hang").field(c).finish(),
            Response::Fail(e) => f.debug_tuple("Fail").field(e).finish(),
            Response::Gated(_, r) => f.debug_tuple("Gated").field(r).finish(),
            Response::Compute(_) => f.write_str("Compute(..)"),
        }
    }
}

fn text_chunks(text: &str, finish: FinishReason) -> Vec<StreamChunk> {
    let mut chunks = vec![StreamChunk::BlockStart {
        index: 0,
        block_type: BlockType::Text,
    }];
    chunks.extend(text.chars().map(|c| StreamChunk::TextDelta {
        index: 0,
        text: Text::from(c.to_string()),
    }));
    chunks.push(StreamChunk::BlockEnd {
        index: 0,
        block: Box::new(ContentBlock::text(text)),
    });
    chunks.push(usage(10, text.chars().count() as u64));
    chunks.push(StreamChunk::Finish { reason: finish });
    chunks
}

fn usage(input_tokens: u64, output_tokens: u64) -> StreamChunk {
    StreamChunk::Usage(Box::new(Usage {
        input_tokens,
        output_tokens,
        cache_read_tokens: None,
    }))
}

/// One tool call the model asks for: `(call id, tool name, JSON arguments)`.
pub type ScriptedCall<'a> = (&'a str, &'a str, &'a str);

impl Response {
    /// A text answer, one delta per character, finishing with `stop`.
    pub fn text(text: &str) -> Self {
        Response::Chunks(text_chunks(text, FinishReason::Stop))
    }

    /// A text answer that runs out of output tokens.
    pub fn max_tokens(text: &str) -> Self {
        Response::Chunks(text_chunks(text, FinishReason::MaxTokens))
    }

    /// One tool call (see [`Response::tool_calls`]).
    pub fn tool_call(id: &str, name: &str, arguments: &str) -> Self {
        Self::tool_calls(None, &[(id, name, arguments)])
    }

    /// An optional text block, then tool calls in order, each with its arguments sent as two
    /// deltas, finishing with `tool-calls`.
    pub fn tool_calls(text: Option<&str>, calls: &[ScriptedCall<'_>]) -> Self {
        let mut chunks = Vec::new();
        let mut index = 0;
        if let Some(text) = text {
            chunks.push(StreamChunk::TextDelta {
                index,
                text: text.into(),
            });
            chunks.push(StreamChunk::BlockEnd {
                index,
                block: Box::new(ContentBlock::text(text)),
            });
            index += 1;
        }
        for (id, name, arguments) in calls {
            chunks.push(StreamChunk::BlockStart {
                index,
                block_type: BlockType::ToolCall,
            });
            let split = arguments
                .char_indices()
                .nth(5)
                .map_or(arguments.len(), |(at, _)| at);
            for (i, part) in [&arguments[..split], &arguments[split..]]
                .iter()
                .enumerate()
            {
                chunks.push(StreamChunk::ToolCallDelta(Box::new(ToolCallDelta {
                    index,
                    id: CallId::new(*id),
                    name: (i == 0).then(|| Text::from(*name)),
                    arguments_delta: Text::from(*part),
                })));
            }
            chunks.push(StreamChunk::BlockEnd {
                index,
                block: Box::new(ContentBlock::ToolCall {
                    id: CallId::new(*id),
                    name: Text::from(*name),
                    arguments: Text::from(*arguments),
                }),
            });
            index += 1;
        }
        chunks.push(usage(10, 5));
        chunks.push(StreamChunk::Finish {
            reason: FinishReason::ToolCalls,
        });
        Response::Chunks(chunks)
    }

    /// A failing request, as a provider error.
    pub fn error(code: &str, message: &str) -> Self {
        Response::Fail(ModelError::new(code, message))
    }

    /// A request that streams a partial text and then hangs until cancelled.
    pub fn hang() -> Self {
        Response::Hang(vec![
            StreamChunk::BlockStart {
                index: 0,
                block_type: BlockType::Text,
            },
            StreamChunk::TextDelta {
                index: 0,
                text: "partial".into(),
            },
        ])
    }

    /// This response, held until `gate` opens.
    pub fn gated(self, gate: &Gate) -> Self {
        Response::Gated(gate.clone(), Box::new(self))
    }

    /// A response computed from the request.
    pub fn compute(f: impl Fn(&ModelRequest) -> Response + Send + Sync + 'static) -> Self {
        Response::Compute(Box::new(f))
    }
}

/// A deterministic [`Model`]: each request takes the next scripted [`Response`] and is recorded.
/// When the script has run out, a request fails with [`SCRIPT_EXHAUSTED`].
#[derive(Default)]
pub struct ScriptedModel {
    script: Mutex<VecDeque<Response>>,
    requests: Mutex<Vec<ModelRequest>>,
    count: watch::Sender<usize>,
}

impl std::fmt::Debug for ScriptedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedModel")
            .field("remaining", &lock(&self.script).len())
            .field("requests", &lock(&self.requests).len())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The guarded data stays consistent even if a holder panicked: every critical section here
    // is a single push or pop.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl ScriptedModel {
    /// A model that plays `script` in order.
    pub fn new(script: impl IntoIterator<Item = Response>) -> Arc<Self> {
        Arc::new(ScriptedModel {
            script: Mutex::new(script.into_iter().collect()),
            ..ScriptedModel::default()
        })
    }

    /// Adds responses to the end of the script.
    pub fn push(&self, responses: impl IntoIterator<Item = Response>) {
        lock(&self.script).extend(responses);
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<ModelRequest> {
        lock(&self.requests).clone()
    }

    /// How many responses are left.
    pub fn remaining(&self) -> usize {
        lock(&self.script).len()
    }

    /// Resolves once at least `n` requests have been made.
    pub async fn wait_for_requests(&self, n: usize) {
        let mut rx = self.count.subscribe();
        let _ = rx.wait_for(|count| *count >= n).await;
    }
}

impl Model for ScriptedModel {
    fn stream(&self, request: ModelRequest) -> ChunkStream {
        let response = lock(&self.script).pop_front();
        let cancel = request.cancel.clone();
        let plan = match response {
            Some(response) => resolve(response, &request),
            None => Plan::now(Response::error(
                SCRIPT_EXHAUSTED,
                "the scripted model has no response left",
            )),
        };
        lock(&self.requests).push(request);
        self.count.send_modify(|n| *n += 1);
        Box::pin(ScriptStream::new(plan, cancel))
    }
}

/// A response with its gates collected and computations resolved.
struct Plan {
    gates: Vec<Gate>,
    response: Response,
}

impl Plan {
    fn now(response: Response) -> Self {
        Plan {
            gates: Vec::new(),
            response,
        }
    }
}

fn resolve(mut response: Response, request: &ModelRequest) -> Plan {
    let mut gates = Vec::new();
    loop {
        response = match response {
            Response::Gated(gate, inner) => {
                gates.push(gate);
                *inner
            }
            Response::Compute(f) => f(request),
            other => {
                return Plan {
                    gates,
                    response: other,
                };
            }
        };
    }
}

type Waiting = Pin<Box<dyn Future<Output = Option<ModelError>> + Send>>;

/// Plays a [`Plan`]: waits at its gates, yields its chunks, then ends, fails or hangs.
struct ScriptStream {
    before: Option<Waiting>,
    chunks: VecDeque<Result<StreamChunk, ModelError>>,
    after: Option<Waiting>,
}

impl ScriptStream {
    fn new(plan: Plan, cancel: crate::Cancellation) -> Self {
        let gates = plan.gates;
        let before: Option<Waiting> = (!gates.is_empty()).then(|| {
            Box::pin(async move {
                for gate in gates {
                    gate.wait().await;
                }
                None
            }) as Waiting
        });
        let (chunks, after): (Vec<_>, Option<Waiting>) = match plan.response {
            Response::Chunks(chunks) => (chunks.into_iter().map(Ok).collect(), None),
            Response::Fail(failure) => (vec![Err(failure)], None),
            Response::Hang(chunks) => (
                chunks.into_iter().map(Ok).collect(),
                Some(Box::pin(async move {
                    cancel.cancelled().await;
                    Some(ModelError::new(ABORTED, "the request was cancelled"))
                })),
            ),
            Response::Gated(..) | Response::Compute(_) => {
                unreachable!("resolve() unwraps gates and computations")
            }
        };
        ScriptStream {
            before,
            chunks: chunks.into(),
            after,
        }
    }
}

impl Stream for ScriptStream {
    type Item = Result<StreamChunk, ModelError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(before) = self.before.as_mut() {
            match before.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(_) => self.before = None,
            }
        }
        if let Some(chunk) = self.chunks.pop_front() {
            return Poll::Ready(Some(chunk));
        }
        if let Some(after) = self.after.as_mut() {
            return match after.as_mut().poll(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(failure) => {
                    self.after = None;
                    Poll::Ready(failure.map(Err))
                }
            };
        }
        Poll::Ready(None)
    }
}
