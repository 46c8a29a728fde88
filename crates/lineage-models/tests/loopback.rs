//! The loopback model server over real sockets, read by a plain TCP client and this crate's
//! event-stream decoder: every kind of scripted reply, and the record of what was sent.

use std::time::Duration;

use lineage_models::failure;
use lineage_models::sse::{Decoder, Frame};
use lineage_testkit::loopback::{LoopbackServer, Recorded, Reply, sse_body};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A connection to `server` on which `request` has been sent as it is.
async fn send_raw(server: &LoopbackServer, request: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(server.addr()).await.expect("connects");
    stream.write_all(request).await.expect("sends");
    stream
}

/// Sends a `POST` of `body` to `path` and returns the raw response bytes as far as the server
/// sends them before it closes.
async fn post(server: &LoopbackServer, path: &str, body: &str) -> Vec<u8> {
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
Authorization: Bearer test-key\r\nContent-Length: {}\r\n\r\n{body}",
        server.addr(),
        body.len()
    );
    let mut stream = send_raw(server, request.as_bytes()).await;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.expect("reads");
    response
}

/// The status code, headers (lower-case names) and body of a raw response.
fn split(response: &[u8]) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let end = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a whole response head");
    let head = std::str::from_utf8(&response[..end]).expect("a UTF-8 head");
    let mut lines = head.split("\r\n");
    let status = lines.next().expect("a status line").split(' ').nth(1);
    let headers = lines
        .map(|l| {
            let (n, v) = l.split_once(':').expect("a header line");
            (n.trim().to_ascii_lowercase(), v.trim().to_owned())
        })
        .collect();
    let status = status.and_then(|s| s.parse().ok()).expect("a status code");
    (status, headers, response[end + 4..].to_vec())
}

fn data_of(frames: &[Frame]) -> Vec<&str> {
    frames
        .iter()
        .filter_map(|f| match f {
            Frame::Event(e) => Some(e.data.as_str()),
            Frame::Comment(_) => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_streamed_reply_arrives_whole_in_any_chunking_and_the_request_is_recorded() {
    let events = [r#"{"choices":[{"delta":{"content":"Hel"}}]}"#, "[DONE]"];
    let server = LoopbackServer::start([Reply::Sse {
        body: sse_body(events),
        chunk: Some(3),
        delay: Duration::from_millis(20),
    }])
    .await
    .expect("the server starts");
    let response = post(&server, "/v1/chat/completions", r#"{"stream":true}"#).await;
    let (status, headers, body) = split(&response);
    assert_eq!(status, 200);
    assert!(headers.contains(&("content-type".into(), "text/event-stream".into())));
    let mut decoder = Decoder::new();
    let frames = decoder.push(&body).expect("a valid stream");
    assert_eq!(data_of(&frames), events);
    assert!(!decoder.finish(), "the stream ended cleanly");

    let [request]: [Recorded; 1] = server.requests().try_into().expect("one request");
    assert_eq!(request.method, "POST");
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(request.header("Authorization"), Some("Bearer test-key"));
    assert_eq!(request.json(), Some(serde_json::json!({"stream": true})));
    assert_eq!(server.remaining(), 0);
}

#[tokio::test]
async fn an_error_reply_carries_its_status_headers_and_body_and_classifies() {
    let server = LoopbackServer::start([Reply::Status {
        status: 429,
        headers: vec![
            ("retry-after".into(), "2".into()),
            ("x-request-id".into(), "req-1".into()),
        ],
        body: r#"{"error":{"type":"rate_limit_error","message":"slow down"}}"#.into(),
    }])
    .await
    .expect("the server starts");
    let (status, headers, body) = split(&post(&server, "/v1/messages", "{}").await);
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let classified = failure::classify(
        status,
        header,
        std::str::from_utf8(&body).expect("a UTF-8 body"),
        std::time::SystemTime::now(),
    );
    assert_eq!(classified.code, failure::RATE_LIMIT);
    assert_eq!(classified.retry_after_ms, Some(2000));
    assert_eq!(classified.request_id.as_deref(), Some("req-1"));
    assert_eq!(classified.message, "slow down");
}

#[tokio::test]
async fn a_cut_stream_ends_mid_event_and_the_decoder_says_so() {
    let mut body = sse_body([r#"{"type":"message_start"}"#]);
    body.extend_from_slice(b"data: {\"type\":\"content_block_del");
    let server = LoopbackServer::start([Reply::Cut { body }])
        .await
        .expect("the server starts");
    let (_, _, body) = split(&post(&server, "/v1/messages", "{}").await);
    let mut decoder = Decoder::new();
    let frames = decoder.push(&body).expect("valid so far");
    assert_eq!(data_of(&frames), [r#"{"type":"message_start"}"#]);
    assert!(decoder.finish(), "the stream was cut inside an event");
}

#[tokio::test(start_paused = true)]
async fn a_stalled_stream_sends_what_it_has_then_nothing_until_the_client_leaves() {
    let server = LoopbackServer::start([Reply::Stall {
        body: sse_body(["first"]),
    }])
    .await
    .expect("the server starts");
    let mut stream = send_raw(
        &server,
        b"POST /v1/responses HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    )
    .await;
    let mut received = Vec::new();
    let mut chunk = [0u8; 1024];
    while !received.ends_with(b"data: first\n\n") {
        let n = stream.read(&mut chunk).await.expect("reads");
        assert!(n > 0, "the server closed a stalled stream");
        received.extend_from_slice(&chunk[..n]);
    }
    let more = tokio::time::timeout(Duration::from_secs(300), stream.read(&mut chunk)).await;
    assert!(more.is_err(), "a stalled stream sent more: {more:?}");
}

#[tokio::test]
async fn a_request_beyond_the_script_is_answered_500_saying_so() {
    let server = LoopbackServer::start([Reply::status(401, r#"{"error":{"message":"no"}}"#)])
        .await
        .expect("the server starts");
    assert_eq!(split(&post(&server, "/a", "{}").await).0, 401);
    let (status, _, body) = split(&post(&server, "/b", "{}").await);
    assert_eq!(status, 500);
    assert!(
        String::from_utf8_lossy(&body).contains("no reply left"),
        "{body:?}"
    );
    let paths: Vec<String> = server.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/a", "/b"]);
    // A reply added later is used by the next request.
    server.push(Reply::sse(["late"]));
    let (status, _, body) = split(&post(&server, "/c", "{}").await);
    assert_eq!(status, 200);
    assert_eq!(body, b"data: late\n\n");
}

#[tokio::test]
async fn a_request_the_server_cannot_read_is_answered_400() {
    let server = LoopbackServer::start([]).await.expect("the server starts");
    let mut stream = send_raw(
        &server,
        b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    )
    .await;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.expect("reads");
    let (status, _, body) = split(&response);
    assert_eq!(status, 400);
    assert!(
        String::from_utf8_lossy(&body).contains("chunked"),
        "{body:?}"
    );
    assert!(
        server.requests().is_empty(),
        "an unread request is not recorded"
    );
}
