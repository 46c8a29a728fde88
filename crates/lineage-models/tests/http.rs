//! The HTTP layer over real sockets, for every wire format: what is sent, how each kind of
//! refusal is classified, which failures are retried (and after how long), the idle timeout,
//! an unreachable endpoint, cancellation, and the router. Time is paused: backoffs and timeouts
//! pass at once, and each test measures them on the paused clock.

mod common;

use common::loopback_endpoint;

use std::time::Duration;

use futures_util::StreamExt;
use lineage_agent::{Cancellation, ChunkStream, Model, ModelError, ModelRequest};
use lineage_log::{AbortCause, Message, MessageSource, SessionId, StreamChunk};
use lineage_models::failure::{
    AUTH, CONTEXT_WINDOW_EXCEEDED, INVALID_REQUEST, QUOTA, RATE_LIMIT, SERVER, TIMEOUT, TRANSPORT,
};
use lineage_models::{Endpoint, HttpModel, Models, RetryPolicy, UNKNOWN_ENDPOINT, Wire};
use lineage_testkit::loopback::{LoopbackServer, Reply};
use tokio::time::Instant;

const KEY: &str = "sk-test-0123456789abcdef";

fn endpoint(server: &LoopbackServer, wire: Wire) -> Endpoint {
    let retry = RetryPolicy {
        max_retries: 3,
        initial: Duration::from_millis(500),
        max: Duration::from_secs(10),
    };
    loopback_endpoint(server, wire, KEY, retry, Duration::from_secs(30))
}

fn model(endpoint: Endpoint) -> HttpModel {
    HttpModel::new(endpoint).expect("the client builds")
}

fn request(cancel: &Cancellation) -> ModelRequest {
    ModelRequest {
        session: SessionId::new(),
        turn: 1,
        step: 1,
        endpoint: "loop".into(),
        model: "test-model".into(),
        max_tokens: Some(256),
        system: "Be brief.".into(),
        tools: Vec::new(),
        messages: vec![Message::user_text("hello", MessageSource::User)],
        cancel: cancel.clone(),
    }
}

async fn collect(stream: ChunkStream) -> Vec<Result<StreamChunk, ModelError>> {
    stream.collect().await
}

/// The one failure a stream that produced nothing ends with.
async fn failure_of(model: &dyn Model) -> ModelError {
    let items = collect(model.stream(request(&Cancellation::new()))).await;
    match <[_; 1]>::try_from(items) {
        Ok([Err(error)]) => error,
        Ok([other]) => panic!("expected one failure, got {other:?}"),
        Err(items) => panic!("expected one failure, got {items:?}"),
    }
}

/// The failure of one request to `server` in `wire`, without retries.
async fn failure_without_retries(server: &LoopbackServer, wire: Wire) -> ModelError {
    let mut endpoint = endpoint(server, wire);
    endpoint.retry = RetryPolicy::NEVER;
    failure_of(&model(endpoint)).await
}

fn status(status: u16, headers: &[(&str, &str)], body: &str) -> Reply {
    Reply::Status {
        status,
        headers: headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
        body: body.into(),
    }
}

#[tokio::test(start_paused = true)]
async fn each_format_posts_to_its_path_with_its_headers_and_a_streaming_body() {
    for wire in Wire::ALL {
        let server = LoopbackServer::start([Reply::status(401, "{}")])
            .await
            .unwrap();
        let mut endpoint = endpoint(&server, wire);
        endpoint.headers.push(("x-tenant".into(), "blue".into()));
        failure_of(&model(endpoint)).await;
        let [sent] = <[_; 1]>::try_from(server.requests()).expect("one request");
        assert_eq!(sent.method, "POST");
        assert_eq!(sent.path, format!("/v1{}", wire.path()), "{wire}");
        assert_eq!(sent.header("content-type"), Some("application/json"));
        assert_eq!(sent.header("accept"), Some("text/event-stream"));
        assert_eq!(sent.header("x-tenant"), Some("blue"));
        match wire {
            Wire::AnthropicMessages => {
                assert_eq!(sent.header("x-api-key"), Some(KEY));
                assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
                assert_eq!(sent.header("authorization"), None);
            }
            _ => {
                assert_eq!(
                    sent.header("authorization"),
                    Some(&*format!("Bearer {KEY}"))
                );
                assert_eq!(sent.header("x-api-key"), None);
            }
        }
        let body = sent.json().expect("a JSON body");
        assert_eq!(body["stream"], true, "{wire}");
        assert_eq!(body["model"], "test-model", "{wire}");
    }
}

#[tokio::test(start_paused = true)]
async fn each_refusal_has_its_code_status_retry_after_and_request_id() {
    let cases: [(Reply, &str); 8] = [
        (status(401, &[], r#"{"error":{"message":"bad key"}}"#), AUTH),
        (status(403, &[], "{}"), AUTH),
        (
            status(
                429,
                &[],
                r#"{"error":{"message":"You exceeded your current quota"}}"#,
            ),
            QUOTA,
        ),
        (
            status(
                400,
                &[],
                r#"{"error":{"message":"This model's maximum context length is 8192 tokens"}}"#,
            ),
            CONTEXT_WINDOW_EXCEEDED,
        ),
        (
            status(400, &[], r#"{"error":{"message":"no such tool"}}"#),
            INVALID_REQUEST,
        ),
        (status(413, &[], "too large"), INVALID_REQUEST),
        (
            status(
                429,
                &[("retry-after", "7"), ("x-request-id", "req-42")],
                "{}",
            ),
            RATE_LIMIT,
        ),
        (
            status(
                529,
                &[],
                r#"{"type":"error","error":{"type":"overloaded_error"}}"#,
            ),
            SERVER,
        ),
    ];
    for wire in Wire::ALL {
        for (reply, code) in cases.clone() {
            let expected = match &reply {
                Reply::Status { status, .. } => u32::from(*status),
                _ => unreachable!(),
            };
            let server = LoopbackServer::start([reply]).await.unwrap();
            let error = failure_without_retries(&server, wire).await;
            assert_eq!(
                (&*error.code, error.status),
                (code, Some(expected)),
                "{wire}: {error}"
            );
            assert!(
                error.message.contains("endpoint loop answered HTTP"),
                "{error}"
            );
            if code == RATE_LIMIT {
                assert_eq!(error.retry_after_ms, Some(7_000));
                assert_eq!(error.request_id.as_deref(), Some("req-42"));
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_retryable_refusal_is_retried_with_backoff_until_an_answer_is_final() {
    let server = LoopbackServer::start([
        status(503, &[], "{}"),
        status(500, &[], "{}"),
        status(401, &[], "{}"),
    ])
    .await
    .unwrap();
    let started = Instant::now();
    let error = failure_of(&model(endpoint(&server, Wire::ChatCompletions))).await;
    let waited = started.elapsed();
    assert_eq!(error.code, AUTH, "the first final refusal ends the retries");
    assert_eq!(server.requests().len(), 3);
    // 500 ms then 1 s, each less at most a tenth.
    assert!(
        waited >= Duration::from_millis(1350) && waited <= Duration::from_millis(1600),
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn retry_after_replaces_the_backoff_and_one_too_long_is_returned_to_the_host() {
    let server = LoopbackServer::start([
        status(429, &[("retry-after", "4")], "{}"),
        status(429, &[("retry-after", "60")], "{}"),
    ])
    .await
    .unwrap();
    let started = Instant::now();
    let error = failure_of(&model(endpoint(&server, Wire::AnthropicMessages))).await;
    assert_eq!(server.requests().len(), 2);
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(4),
        "the endpoint's word, exactly"
    );
    assert_eq!(
        (&*error.code, error.retry_after_ms),
        (RATE_LIMIT, Some(60_000)),
        "a wait beyond the policy's cap is the host's to decide"
    );
}

#[tokio::test(start_paused = true)]
async fn exhausted_quota_and_spend_limits_are_never_retried() {
    let spend = r#"{"type":"error","error":{"type":"rate_limit_error","message":"limit","details":{"error_code":"enforced_spend_limit_reached"}}}"#;
    for body in [r#"{"error":{"message":"insufficient balance"}}"#, spend] {
        let server = LoopbackServer::start([status(429, &[], body)])
            .await
            .unwrap();
        let error = failure_of(&model(endpoint(&server, Wire::AnthropicMessages))).await;
        assert_eq!(error.code, QUOTA, "{body}");
        assert_eq!(server.requests().len(), 1, "{body}");
    }
}

#[tokio::test(start_paused = true)]
async fn retries_stop_at_the_policy_limit() {
    let server = LoopbackServer::start(std::iter::repeat_n(status(502, &[], "{}"), 4))
        .await
        .unwrap();
    let error = failure_of(&model(endpoint(&server, Wire::Responses))).await;
    assert_eq!(error.code, SERVER);
    assert_eq!(server.requests().len(), 4, "one attempt and three retries");
    assert_eq!(server.remaining(), 0);
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_endpoint_is_a_transport_failure_naming_it() {
    // A port that was just bound and released: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut endpoint = Endpoint::new(
        "gone",
        Wire::ChatCompletions,
        format!("http://127.0.0.1:{port}/v1"),
    );
    endpoint.retry = RetryPolicy::NEVER;
    let error = failure_of(&model(endpoint)).await;
    assert_eq!(error.code, TRANSPORT);
    assert!(
        error.message.contains("endpoint gone at http://127.0.0.1:"),
        "{error}"
    );
    assert_eq!(error.status, None);
}

#[tokio::test(start_paused = true)]
async fn a_silent_stream_times_out_after_the_idle_timeout() {
    let server = LoopbackServer::start([Reply::Stall { body: Vec::new() }])
        .await
        .unwrap();
    let started = Instant::now();
    let error = failure_without_retries(&server, Wire::ChatCompletions).await;
    assert_eq!(error.code, TIMEOUT);
    assert_eq!(started.elapsed(), Duration::from_secs(30));
    assert!(error.message.contains("sent nothing for 30 s"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn keep_alive_comments_re_arm_the_idle_timeout() {
    // A comment every 20 s for a minute, then silence: the 30 s timer fires 30 s after the last.
    let server = LoopbackServer::start([Reply::Sse {
        body: b": ping\n\n: ping\n\n: ping\n\n".to_vec(),
        chunk: Some(8),
        delay: Duration::from_secs(20),
    }])
    .await
    .unwrap();
    let started = Instant::now();
    let error = failure_without_retries(&server, Wire::ChatCompletions).await;
    // The server closes after its last comment: the stream ends without the format's end.
    assert_ne!(error.code, TIMEOUT, "{error}");
    assert!(
        started.elapsed() >= Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn cancellation_ends_a_waiting_stream_at_once_with_aborted() {
    let server = LoopbackServer::start([Reply::Stall {
        body: b": hello\n\n".to_vec(),
    }])
    .await
    .unwrap();
    let model = model(endpoint(&server, Wire::ChatCompletions));
    let cancel = Cancellation::new();
    let mut stream = model.stream(request(&cancel));
    let next = stream.next();
    tokio::pin!(next);
    // Nothing arrives: the stream waits on the stalled server.
    assert!(
        tokio::time::timeout(Duration::from_secs(5), &mut next)
            .await
            .is_err(),
        "the stream waits"
    );
    let started = Instant::now();
    cancel.cancel(AbortCause::User);
    let item = next.await.expect("an item");
    assert_eq!(item.unwrap_err().code, lineage_agent::ABORTED);
    assert_eq!(started.elapsed(), Duration::ZERO, "at once");
    // The connection is gone, not merely unread.
    tokio::time::timeout(Duration::from_secs(5), server.stalls_released(1))
        .await
        .expect("the server sees the client close");
    assert!(stream.next().await.is_none(), "nothing after the failure");
    assert!(stream.next().await.is_none(), "an ended stream stays ended");
}

#[tokio::test(start_paused = true)]
async fn cancellation_during_a_backoff_ends_it() {
    let server = LoopbackServer::start([status(503, &[("retry-after", "9")], "{}")])
        .await
        .unwrap();
    let model = model(endpoint(&server, Wire::ChatCompletions));
    let cancel = Cancellation::new();
    let canceller = {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            cancel.cancel(AbortCause::User);
        })
    };
    let started = Instant::now();
    let items = collect(model.stream(request(&cancel))).await;
    canceller.await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert!(
        matches!(&items[..], [Err(e)] if e.code == lineage_agent::ABORTED),
        "{items:?}"
    );
    assert_eq!(server.requests().len(), 1, "no retry after the cancel");
}

#[tokio::test(start_paused = true)]
async fn a_key_the_endpoint_quotes_back_is_redacted() {
    let body = format!(r#"{{"error":{{"message":"Incorrect API key provided: {KEY}."}}}}"#);
    let server = LoopbackServer::start([status(401, &[], &body)])
        .await
        .unwrap();
    let endpoint = endpoint(&server, Wire::ChatCompletions);
    let debug = format!("{:?}", model(endpoint.clone()));
    let error = failure_of(&model(endpoint)).await;
    assert_eq!(error.code, AUTH);
    assert!(
        error
            .message
            .contains("Incorrect API key provided: <redacted>."),
        "{error}"
    );
    assert!(!format!("{error:?}").contains(KEY));
    assert!(!debug.contains(KEY), "{debug}");
}

#[tokio::test(start_paused = true)]
async fn the_router_sends_each_request_to_its_endpoint_and_names_the_configured_ones() {
    let server = LoopbackServer::start([status(401, &[], "{}")])
        .await
        .unwrap();
    let mut models = Models::new();
    models
        .endpoint(endpoint(&server, Wire::ChatCompletions))
        .unwrap();
    assert_eq!(failure_of(&models).await.code, AUTH);
    assert_eq!(server.requests().len(), 1);

    let mut elsewhere = request(&Cancellation::new());
    elsewhere.endpoint = "mars".into();
    let items = collect(models.stream(elsewhere)).await;
    match &items[..] {
        [Err(e)] => {
            assert_eq!(e.code, UNKNOWN_ENDPOINT);
            assert!(
                e.message.contains("\"mars\"") && e.message.contains("loop"),
                "{e}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_environment_configures_the_chosen_endpoint_and_its_key() {
    let server = LoopbackServer::start([status(401, &[], "{}")])
        .await
        .unwrap();
    let base = format!("{}/v1", server.base_url());
    let vars = [
        ("LINEAGE_MODEL", "loop:claude-test"),
        ("LINEAGE_BASE_URL", base.as_str()),
        ("LINEAGE_WIRE", "anthropic"),
        ("LINEAGE_API_KEY_VAR", "LOOP_KEY"),
        ("LOOP_KEY", KEY),
    ];
    let env = |name: &str| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    };
    let (models, choice) = Models::from_env(None, env).expect("configured");
    assert_eq!((&*choice.endpoint, &*choice.model), ("loop", "claude-test"));
    assert_eq!(models.names().collect::<Vec<_>>(), ["loop"]);
    assert_eq!(failure_of(&models).await.code, AUTH);
    let [sent] = <[_; 1]>::try_from(server.requests()).expect("one request");
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.header("x-api-key"), Some(KEY));
    // A choice on the command line wins over the variable.
    let (_, chosen) = Models::from_env(Some("loop:other"), env).expect("configured");
    assert_eq!(chosen.model, "other");
}

#[tokio::test(start_paused = true)]
async fn a_redirect_is_a_failure_and_the_key_is_not_sent_on() {
    let elsewhere = LoopbackServer::start([status(401, &[], "{}")])
        .await
        .unwrap();
    let location = format!("{}/v1/messages", elsewhere.base_url());
    let server = LoopbackServer::start([status(307, &[("location", &location)], "")])
        .await
        .unwrap();
    let error = failure_without_retries(&server, Wire::AnthropicMessages).await;
    assert_eq!(
        (&*error.code, error.status),
        ("HTTP_307", Some(307)),
        "{error}"
    );
    assert!(
        elsewhere.requests().is_empty(),
        "the redirect was not followed"
    );
}

#[tokio::test(start_paused = true)]
async fn an_answer_that_is_not_an_event_stream_says_what_it_was() {
    let server = LoopbackServer::start([Reply::status(200, r#"{"choices":[]}"#)])
        .await
        .unwrap();
    let error = failure_of(&model(endpoint(&server, Wire::ChatCompletions))).await;
    assert_eq!(error.code, lineage_models::failure::BAD_RESPONSE);
    assert!(
        error
            .message
            .contains("content type \"application/json\", not an event stream"),
        "{error}"
    );
    assert_eq!(server.requests().len(), 1, "not retried");
}

#[tokio::test(start_paused = true)]
async fn a_key_quoted_in_an_error_event_mid_stream_is_redacted() {
    use lineage_testkit::loopback::chat::Script;
    let answer = Script::new()
        .text("partial")
        .error("invalid_request", &format!("key {KEY} is not allowed here"));
    let server = LoopbackServer::start([answer.reply()]).await.unwrap();
    let items = collect(
        model(endpoint(&server, Wire::ChatCompletions)).stream(request(&Cancellation::new())),
    )
    .await;
    let error = match items.last() {
        Some(Err(error)) => error,
        other => panic!("expected a failure last, got {other:?}"),
    };
    assert!(
        error.message.contains("key <redacted> is not allowed"),
        "{error}"
    );
    assert!(!format!("{error:?}").contains(KEY));
}
