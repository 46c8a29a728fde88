//! [`HttpModel`]: one endpoint behind the `Model` trait. It posts the wire format's request,
//! retries attempts that produced nothing, and streams the answer's chunks as they arrive.
//!
//! One answer is a small state machine (`Answer`), polled by the turn loop through the chunk
//! stream:
//!
//! 1. **Connect.** Post the body; wait for the response head. An error status is read (its body
//!    bounded), classified ([`crate::failure::classify`]) and, if retryable, retried after the
//!    policy's backoff or the endpoint's `Retry-After`.
//! 2. **Stream.** Read the body chunk by chunk, each read bounded by the idle timeout, through an
//!    [`AnswerReader`]. A failure before the first chunk is produced is retried like a failed
//!    connect; once a chunk has been produced the answer is committed, and any failure is final.
//!
//! The request's cancellation is raced with every wait (connect, backoff, each read); when it
//! fires the response is dropped, which closes the connection at once, and the stream fails
//! with `ABORTED`. Dropping the stream does the same.

use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use lineage_agent::{ABORTED, Cancellation, ChunkStream, Model, ModelError, ModelRequest};
use lineage_log::StreamChunk;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use crate::endpoint::{ConfigError, Endpoint};
use crate::failure::{self, TIMEOUT, TRANSPORT};
use crate::wire::{AnswerReader, Wire};

/// The most bytes of an error response's body that are read for its classification.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// The Anthropic Messages API version this crate speaks.
const ANTHROPIC_VERSION: &str = "2023-06-01";

/// A model behind an HTTP endpoint.
#[derive(Clone, Debug)]
pub struct HttpModel {
    client: reqwest::Client,
    endpoint: Arc<Endpoint>,
    url: String,
    headers: HeaderMap,
}

impl HttpModel {
    /// A model that sends every request to `endpoint`.
    pub fn new(endpoint: Endpoint) -> Result<HttpModel, ConfigError> {
        let headers = headers(&endpoint)?;
        let client = client(&endpoint)?;
        Ok(HttpModel {
            url: format!("{}{}", endpoint.base_url, endpoint.wire.path()),
            client,
            headers,
            endpoint: Arc::new(endpoint),
        })
    }

    /// The endpoint it sends to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }
}

impl Model for HttpModel {
    fn stream(&self, request: ModelRequest) -> ChunkStream {
        let body = self
            .endpoint
            .wire
            .body(&request, self.endpoint.default_max_tokens);
        let answer = Answer {
            model: self.clone(),
            body: Bytes::from(body.to_string()),
            cancel: request.cancel,
            attempt: 0,
            phase: Phase::Connect,
            queue: VecDeque::new(),
            produced: false,
        };
        // Fused: polling the stream again after its end yields `None` instead of panicking.
        Box::pin(futures_util::StreamExt::fuse(futures_util::stream::unfold(
            answer,
            |mut answer| async move {
                let item = answer.next().await?;
                Some((item, answer))
            },
        )))
    }
}

fn client(endpoint: &Endpoint) -> Result<reqwest::Client, ConfigError> {
    // No redirects: a model endpoint has no reason to send one, and following it would carry
    // the key (reqwest drops `authorization` across hosts, but not `x-api-key`) wherever it
    // points. A 3xx is a failure like any other status.
    let builder = reqwest::Client::builder()
        .connect_timeout(endpoint.connect_timeout)
        .redirect(reqwest::redirect::Policy::none());
    #[cfg(feature = "tls")]
    let builder = builder.tls_backend_preconfigured(tls_config(endpoint)?);
    builder.build().map_err(|e| ConfigError::Client {
        endpoint: endpoint.name.clone(),
        reason: e.to_string(),
    })
}

/// TLS with rustls on the ring provider, verifying certificates as the platform does.
#[cfg(feature = "tls")]
fn tls_config(endpoint: &Endpoint) -> Result<rustls::ClientConfig, ConfigError> {
    use rustls_platform_verifier::BuilderVerifierExt;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_platform_verifier())
        .map(|b| b.with_no_client_auth())
        .map_err(|e| ConfigError::Client {
            endpoint: endpoint.name.clone(),
            reason: e.to_string(),
        })
}

/// Every request's headers: the format's, the key's (marked sensitive, so no debug output of
/// the client shows it) and the endpoint's own.
fn headers(endpoint: &Endpoint) -> Result<HeaderMap, ConfigError> {
    let bad = |name: &str, reason: String| ConfigError::BadHeader {
        endpoint: endpoint.name.clone(),
        name: name.to_owned(),
        reason,
    };
    let mut map = HeaderMap::new();
    map.insert("content-type", HeaderValue::from_static("application/json"));
    map.insert("accept", HeaderValue::from_static("text/event-stream"));
    if endpoint.wire == Wire::AnthropicMessages {
        map.insert(
            "anthropic-version",
            HeaderValue::from_static(ANTHROPIC_VERSION),
        );
    }
    if let Some(key) = &endpoint.api_key {
        let (name, value) = match endpoint.wire {
            Wire::AnthropicMessages => ("x-api-key", key.expose().to_owned()),
            _ => ("authorization", format!("Bearer {}", key.expose())),
        };
        // The value's own error would describe the value: say only that the key is unsendable.
        let mut value = HeaderValue::from_str(&value)
            .map_err(|_| bad(name, "the API key holds characters a header cannot".into()))?;
        value.set_sensitive(true);
        map.insert(name, value);
    }
    for (name, value) in &endpoint.headers {
        let header =
            HeaderName::from_bytes(name.as_bytes()).map_err(|e| bad(name, e.to_string()))?;
        let value = HeaderValue::from_str(value).map_err(|e| bad(name, e.to_string()))?;
        map.insert(header, value);
    }
    Ok(map)
}

/// One answer being fetched.
struct Answer {
    model: HttpModel,
    /// The request body, shared by every attempt (cloning `Bytes` copies nothing).
    body: Bytes,
    cancel: Cancellation,
    /// Attempts made so far, minus one.
    attempt: u32,
    phase: Phase,
    /// What is ready to be yielded, in order; a failure is always last.
    queue: VecDeque<Result<StreamChunk, ModelError>>,
    /// Whether any chunk has been produced: from then on the answer is committed.
    produced: bool,
}

enum Phase {
    Connect,
    Stream {
        // Boxed, both: a response and a reader are large, and the phase moves on every read.
        response: Box<reqwest::Response>,
        reader: Box<AnswerReader>,
    },
    Done,
}

impl Answer {
    /// The next item of the stream; `None` once it has ended.
    async fn next(&mut self) -> Option<Result<StreamChunk, ModelError>> {
        loop {
            if let Some(item) = self.queue.pop_front() {
                return Some(item);
            }
            match std::mem::replace(&mut self.phase, Phase::Done) {
                Phase::Done => return None,
                Phase::Connect => match self.connect().await {
                    Ok(response) => {
                        self.phase = Phase::Stream {
                            response: Box::new(response),
                            reader: Box::new(AnswerReader::new(self.model.endpoint.wire)),
                        }
                    }
                    Err(error) => self.fail(error).await,
                },
                Phase::Stream {
                    mut response,
                    mut reader,
                } => {
                    let mut chunks = Vec::new();
                    let result = match read(&self.model.endpoint, &self.cancel, &mut response).await
                    {
                        Ok(Some(bytes)) => match reader.push(&bytes, &mut chunks) {
                            Ok(()) if !reader.is_done() => {
                                self.phase = Phase::Stream { response, reader };
                                Ok(())
                            }
                            Ok(()) => reader.finish(&mut chunks),
                            Err(error) => Err(error),
                        },
                        // The connection ended: the format says whether that was its end.
                        Ok(None) => reader.finish(&mut chunks),
                        Err(error) => Err(error),
                    };
                    self.produced |= !chunks.is_empty();
                    self.queue.extend(chunks.into_iter().map(Ok));
                    if let Err(error) = result {
                        self.fail(error).await;
                    }
                }
            }
        }
    }

    /// Ends the attempt with `error`: waits and retries when nothing was produced and the policy
    /// allows; otherwise queues the failure as the stream's last item.
    async fn fail(&mut self, error: ModelError) {
        let error = self.redacted(error);
        match self.retry_delay(&error) {
            Some(delay) => {
                tracing::debug!(
                    endpoint = %self.model.endpoint.name,
                    code = %error.code,
                    attempt = self.attempt + 1,
                    delay_ms = delay.as_millis() as u64,
                    "retrying a model request that produced nothing"
                );
                tokio::select! {
                    biased;
                    _ = self.cancel.cancelled() => self.queue.push_back(Err(aborted())),
                    _ = tokio::time::sleep(delay) => {
                        self.attempt += 1;
                        self.phase = Phase::Connect;
                    }
                }
            }
            None => self.queue.push_back(Err(error)),
        }
    }

    /// `error` with the key taken out of its wording: some services quote the key they refused,
    /// in an error response or in an error event mid-stream, and every failure passes here on
    /// its way to the turn's stored error.
    fn redacted(&self, mut error: ModelError) -> ModelError {
        let Some(key) = self.model.endpoint.api_key.as_ref() else {
            return error;
        };
        let key = key.expose();
        if key.is_empty() {
            return error;
        }
        if error.message.contains(key) {
            error.message = error.message.replace(key, "<redacted>").into();
        }
        if let Some(id) = error.request_id.as_ref().filter(|id| id.contains(key)) {
            error.request_id = Some(id.replace(key, "<redacted>").into());
        }
        error
    }

    /// How long to wait before retrying after `error`, or `None` when it is final.
    fn retry_delay(&self, error: &ModelError) -> Option<Duration> {
        let policy = self.model.endpoint.retry;
        if self.produced
            || self.attempt >= policy.max_retries
            || !failure::is_retryable(&error.code)
        {
            return None;
        }
        match error.retry_after_ms {
            // The endpoint's word replaces the backoff, as long as it is within the policy.
            Some(ms) => {
                let asked = Duration::from_millis(ms);
                (asked <= policy.max).then_some(asked)
            }
            None => Some(backoff(policy.initial, policy.max, self.attempt)),
        }
    }

    /// Posts the body and waits for a success response head.
    async fn connect(&mut self) -> Result<reqwest::Response, ModelError> {
        let model = &self.model;
        let send = model
            .client
            .post(&model.url)
            .headers(model.headers.clone())
            .body(self.body.clone())
            .send();
        let response = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => return Err(aborted()),
            sent = tokio::time::timeout(model.endpoint.idle_timeout, send) => match sent {
                Err(_) => return Err(idle(&model.endpoint, "the response head")),
                Ok(Err(e)) => return Err(transport(&model.endpoint, &e)),
                Ok(Ok(response)) => response,
            },
        };
        if !response.status().is_success() {
            return Err(self.refusal(response).await);
        }
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !content_type
            .to_ascii_lowercase()
            .starts_with("text/event-stream")
        {
            // A JSON or HTML answer where a stream was asked for: a server that ignored
            // `stream: true`, or a gateway's own page. Say so, rather than "closed early".
            return Err(ModelError::new(
                failure::BAD_RESPONSE,
                format!(
                    "endpoint {} answered {} with content type {:?}, not an event stream",
                    model.endpoint.name,
                    response.status().as_u16(),
                    content_type
                ),
            ));
        }
        Ok(response)
    }

    /// The failure an error response stands for.
    async fn refusal(&mut self, mut response: reqwest::Response) -> ModelError {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let mut body = Vec::new();
        // The body is only wording: whatever of it arrives within the limits is enough.
        while body.len() < MAX_ERROR_BODY {
            match read(&self.model.endpoint, &self.cancel, &mut response).await {
                Ok(Some(bytes)) => body.extend_from_slice(&bytes),
                Ok(None) | Err(_) => break,
            }
        }
        body.truncate(MAX_ERROR_BODY);
        let classified = failure::classify(
            status,
            |name| {
                headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            },
            &String::from_utf8_lossy(&body),
            SystemTime::now(),
        );
        let wording = classified.message;
        ModelError {
            code: classified.code.into(),
            message: format!(
                "endpoint {} answered HTTP {status}: {wording}",
                self.model.endpoint.name
            )
            .into(),
            status: Some(u32::from(status)),
            retry_after_ms: classified.retry_after_ms,
            request_id: classified.request_id.map(Into::into),
        }
    }
}

/// The next bytes of the body, within the idle timeout; `None` at its end.
async fn read(
    endpoint: &Endpoint,
    cancel: &Cancellation,
    response: &mut reqwest::Response,
) -> Result<Option<Bytes>, ModelError> {
    tokio::select! {
        biased;
        _ = cancel.cancelled() => Err(aborted()),
        read = tokio::time::timeout(endpoint.idle_timeout, response.chunk()) => match read {
            Err(_) => Err(idle(endpoint, "the stream")),
            Ok(Ok(bytes)) => Ok(bytes),
            Ok(Err(e)) => Err(ModelError::new(
                failure::STREAM_CLOSED,
                format!("endpoint {}: the stream broke: {}", endpoint.name, error_chain(&e)),
            )),
        },
    }
}

/// The backoff before retry `attempt + 1`: `initial` doubled per attempt, at most `max`, less up
/// to a tenth at random so that many clients refused at once do not return at once.
fn backoff(initial: Duration, max: Duration, attempt: u32) -> Duration {
    let base = initial
        .saturating_mul(1u32.checked_shl(attempt).unwrap_or(u32::MAX))
        .min(max);
    // A fresh RandomState is randomly keyed: enough entropy for jitter, with no extra crate.
    let noise = RandomState::new().hash_one(attempt) % 1000;
    base - base.mul_f64(noise as f64 / 10_000.0)
}

fn aborted() -> ModelError {
    ModelError::new(ABORTED, "the request was cancelled")
}

fn idle(endpoint: &Endpoint, waiting_for: &str) -> ModelError {
    ModelError::new(
        TIMEOUT,
        format!(
            "endpoint {} sent nothing for {} s while Lineage waited for {waiting_for}",
            endpoint.name,
            endpoint.idle_timeout.as_secs_f64()
        ),
    )
}

fn transport(endpoint: &Endpoint, error: &reqwest::Error) -> ModelError {
    ModelError::new(
        TRANSPORT,
        format!(
            "endpoint {} at {} cannot be reached: {}",
            endpoint.name,
            without_userinfo(&endpoint.base_url),
            error_chain(error).replace(&endpoint.base_url, &without_userinfo(&endpoint.base_url))
        ),
    )
}

/// `url` without a `user:password@` part, which may hold a credential.
fn without_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

/// An error and its sources, joined: reqwest's own message alone often says only "error
/// sending request".
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_shown_without_its_credentials() {
        assert_eq!(
            without_userinfo("https://me:s3cret@proxy.example/v1"),
            "https://proxy.example/v1"
        );
        assert_eq!(
            without_userinfo("http://127.0.0.1:8/v1/a@b"),
            "http://127.0.0.1:8/v1/a@b"
        );
        assert_eq!(without_userinfo("not a url"), "not a url");
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_with_at_most_a_tenth_off() {
        let (initial, max) = (Duration::from_millis(500), Duration::from_secs(10));
        for (attempt, full) in [
            (0, 500),
            (1, 1000),
            (2, 2000),
            (4, 8000),
            (5, 10_000),
            (40, 10_000),
        ] {
            let wait = backoff(initial, max, attempt);
            let full = Duration::from_millis(full);
            assert!(
                wait <= full && wait >= full.mul_f64(0.9),
                "{attempt}: {wait:?}"
            );
        }
    }
}
