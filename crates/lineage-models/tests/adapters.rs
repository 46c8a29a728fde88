//! Each adapter behind a real agent, against the loopback server over real sockets: a text
//! turn, a tool round trip whose result reaches the next request, parallel tool calls, usage in
//! the log, a refusal's detail in the stored turn error, a retry before the first chunk and none
//! after it, a stream cut mid-event, an idle timeout mid-stream, cancellation mid-stream leaving a
//! balanced log, and a key that never reaches the store.
//!
//! The same specification runs once per wire format (`adapter_tests!`), each with that format's
//! scripts from the test kit.

mod common;

use common::loopback_endpoint;

use std::sync::Arc;
use std::time::Duration;

use lineage_agent::{AgentSpec, Agents, CreateAgent, Queued, Tool, ToolOutput};
use lineage_log::{AbortCause, Event, EventBody, EventKind, TurnEndReason};
use lineage_models::failure::{RATE_LIMIT, STREAM_CLOSED, TIMEOUT};
use lineage_models::{HttpModel, RetryPolicy, Wire};
use lineage_store::Store;
use lineage_testkit::agent::*;
use lineage_testkit::loopback::{LoopbackServer, Reply};

const KEY: &str = "sk-adapter-test-fedcba9876543210";

/// A store in a temporary directory and a registry whose model is `wire` on `server`.
struct Host {
    dir: tempfile::TempDir,
    store: Store,
    agents: Agents,
}

impl Host {
    fn new(server: &LoopbackServer, wire: Wire) -> Host {
        let retry = RetryPolicy {
            max_retries: 2,
            initial: Duration::from_millis(200),
            max: Duration::from_secs(5),
        };
        let endpoint = loopback_endpoint(server, wire, KEY, retry, Duration::from_secs(20));
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = Store::open(dir.path().join("agents.lineage")).expect("the store opens");
        let model = Arc::new(HttpModel::new(endpoint).expect("the client builds"));
        let agents = Agents::new(store.clone(), model);
        Host { dir, store, agents }
    }

    async fn agent(&self, tools: Vec<Arc<dyn Tool>>) -> Arc<lineage_agent::Agent> {
        self.agents
            .create(CreateAgent::fresh(AgentSpec { tools, ..spec() }))
            .await
            .expect("the agent is created")
    }

    /// The store file's bytes, after everything is flushed.
    async fn file_bytes(&self, agent: &lineage_agent::Agent) -> Vec<u8> {
        agent.flush().await.expect("flushed");
        std::fs::read(self.dir.path().join("agents.lineage")).expect("the store file reads")
    }
}

fn weather() -> Arc<dyn Tool> {
    FnTool::parallel("weather", |_, input| async move {
        let city = input["city"].as_str().unwrap_or("nowhere").to_owned();
        ToolOutput::text(format!("sunny in {city}"))
    })
}

fn only_error(agent: &lineage_agent::Agent) -> lineage_log::TurnError {
    match &turn_ends(&agent.events())[..] {
        [TurnEndReason::Error(error)] => (**error).clone(),
        other => panic!("expected one failed turn, got {other:?}"),
    }
}

macro_rules! adapter_tests {
    ($format:ident, $wire:expr) => {
        mod $format {
            use super::*;
            use lineage_testkit::loopback::$format::{self as script, Script};

            const WIRE: Wire = $wire;

            /// An agent with `tools` on `server`, in a host of its own, after one turn on
            /// `prompt`.
            async fn after_one_turn(
                server: &LoopbackServer,
                tools: Vec<Arc<dyn Tool>>,
                prompt: &str,
            ) -> (Host, Arc<lineage_agent::Agent>) {
                let host = Host::new(server, WIRE);
                let agent = host.agent(tools).await;
                run_turn(&agent, prompt).await;
                (host, agent)
            }

            /// The log of one turn on `prompt` by an agent with the weather tool on `server`,
            /// checked to have completed.
            async fn completed_weather_turn(server: &LoopbackServer, prompt: &str) -> Vec<Event> {
                let (_host, agent) = after_one_turn(server, vec![weather()], prompt).await;
                let events = agent.events();
                assert_eq!(turn_ends(&events), [TurnEndReason::Completed]);
                events
            }

            #[tokio::test(start_paused = true)]
            async fn a_text_turn_streams_into_the_log_with_its_usage() {
                let answer = Script::new()
                    .text("Hel")
                    .text("lo, ")
                    .text("world")
                    .usage(12, 3, Some(4))
                    .stop();
                let server = LoopbackServer::start([answer.chunked(7, Duration::from_millis(5))])
                    .await
                    .unwrap();
                let (_host, agent) = after_one_turn(&server, Vec::new(), "greet me").await;
                let events = agent.events();
                assert_eq!(turn_ends(&events), [TurnEndReason::Completed]);
                assert_eq!(assistant_texts(&events), ["Hello, world"]);
                let usage = events.iter().find_map(|e| match &e.body {
                    EventBody::AssistantMessage(m) => m.usage,
                    _ => None,
                });
                let usage = usage.expect("usage is logged");
                assert_eq!((usage.input_tokens, usage.output_tokens), (12, 3));
                assert_eq!(usage.cache_read_tokens, Some(4));
                assert_balanced(&events);
                let sent = server.requests()[0].json().expect("a JSON body");
                assert!(sent.to_string().contains("greet me"), "{sent}");
            }

            #[tokio::test(start_paused = true)]
            async fn a_tool_result_reaches_the_next_request() {
                let server = LoopbackServer::start([
                    Script::new()
                        .tool_call("call_7", "weather", &["{\"ci", "ty\": \"Oslo\"}"])
                        .tool_stop()
                        .reply(),
                    script::text("It is sunny."),
                ])
                .await
                .unwrap();
                let events = completed_weather_turn(&server, "weather?").await;
                assert_eq!(
                    assistant_texts(&events).last().map(String::as_str),
                    Some("It is sunny.")
                );
                let requests = server.requests();
                assert_eq!(requests.len(), 2);
                let first = requests[0].json().unwrap().to_string();
                assert!(
                    first.contains("\"weather\""),
                    "the tool is offered: {first}"
                );
                let second = requests[1].json().unwrap().to_string();
                assert!(second.contains("call_7"), "the call is sent back: {second}");
                assert!(
                    second.contains("sunny in Oslo"),
                    "with its result: {second}"
                );
                assert_balanced(&events);
            }

            #[tokio::test(start_paused = true)]
            async fn parallel_tool_calls_each_run_and_each_result_is_sent_back() {
                let calls: [(&str, &str, &[&str]); 2] = [
                    ("call_a", "weather", &["{\"city\":", " \"Rome\"}"]),
                    ("call_b", "weather", &["{\"city\"", ": \"Lima\"}"]),
                ];
                let server = LoopbackServer::start([
                    Script::new()
                        .parallel_tool_calls(&calls)
                        .tool_stop()
                        .chunked(5, Duration::ZERO),
                    script::text("Both sunny."),
                ])
                .await
                .unwrap();
                let events = completed_weather_turn(&server, "two cities").await;
                let answers = tool_answers(&events);
                assert_eq!(answers.len(), 2, "{answers:?}");
                let second = server.requests()[1].json().unwrap().to_string();
                for needle in ["call_a", "call_b", "sunny in Rome", "sunny in Lima"] {
                    assert!(second.contains(needle), "{needle}: {second}");
                }
            }

            #[tokio::test(start_paused = true)]
            async fn a_refusal_keeps_status_retry_after_and_request_id_in_the_turn_error() {
                let refusal = Reply::Status {
                    status: 429,
                    headers: vec![
                        ("retry-after".into(), "30".into()),
                        ("x-request-id".into(), "req-9".into()),
                    ],
                    body: script::error_body("rate_limit", "slow down"),
                };
                let server = LoopbackServer::start([refusal]).await.unwrap();
                let (_host, agent) = after_one_turn(&server, Vec::new(), "hi").await;
                let error = only_error(&agent);
                assert_eq!(&*error.code, RATE_LIMIT);
                assert_eq!(error.status, Some(429));
                assert_eq!(error.retry_after_ms, Some(30_000));
                assert_eq!(error.request_id.as_deref(), Some("req-9"));
                assert_eq!(
                    server.requests().len(),
                    1,
                    "30 s is beyond the policy: no retry"
                );
                assert_balanced(&agent.events());
            }

            /// A first attempt that fails having produced nothing, then an answer of `text`:
            /// the turn completes on the retry.
            async fn completes_on_the_retry_after(first: Reply, text: &str) {
                let server = LoopbackServer::start([first, script::text(text)])
                    .await
                    .unwrap();
                let (_host, agent) = after_one_turn(&server, Vec::new(), "hi").await;
                assert_eq!(turn_ends(&agent.events()), [TurnEndReason::Completed]);
                assert_eq!(assistant_texts(&agent.events()), [text]);
                assert_eq!(server.requests().len(), 2);
            }

            #[tokio::test(start_paused = true)]
            async fn a_failure_before_the_first_chunk_is_retried_and_the_turn_completes() {
                let overloaded = Reply::status(503, script::error_body("overloaded", "busy"));
                completes_on_the_retry_after(overloaded, "made it").await;
            }

            #[tokio::test(start_paused = true)]
            async fn a_failure_event_before_the_first_chunk_is_retried_too() {
                let overloaded = Script::new().error("overloaded", "busy").reply();
                completes_on_the_retry_after(overloaded, "second time lucky").await;
            }

            #[tokio::test(start_paused = true)]
            async fn a_stream_cut_mid_event_after_a_chunk_fails_without_a_retry() {
                let mut body = Script::new().text("half an ans").body();
                body.extend_from_slice(b"data: {\"trunc");
                let server =
                    LoopbackServer::start([Reply::Cut { body }, script::text("never asked")])
                        .await
                        .unwrap();
                let (_host, agent) = after_one_turn(&server, Vec::new(), "hi").await;
                let error = only_error(&agent);
                assert_eq!(&*error.code, STREAM_CLOSED, "{error:?}");
                assert_eq!(
                    server.requests().len(),
                    1,
                    "a half-streamed answer is never replayed"
                );
                assert_eq!(server.remaining(), 1);
                assert_balanced(&agent.events());
            }

            /// A server that streams `text` and then goes silent, and an agent on it.
            async fn stalled_after(
                text: &str,
            ) -> (LoopbackServer, Host, Arc<lineage_agent::Agent>) {
                let body = Script::new().text(text).body();
                let server = LoopbackServer::start([Reply::Stall { body }])
                    .await
                    .unwrap();
                let host = Host::new(&server, WIRE);
                let agent = host.agent(Vec::new()).await;
                (server, host, agent)
            }

            #[tokio::test(start_paused = true)]
            async fn a_stream_that_goes_silent_mid_answer_times_out() {
                let (server, _host, agent) = stalled_after("thinking about it").await;
                let started = tokio::time::Instant::now();
                run_turn(&agent, "hi").await;
                assert_eq!(started.elapsed(), Duration::from_secs(20));
                assert_eq!(&*only_error(&agent).code, TIMEOUT);
                assert_eq!(server.requests().len(), 1);
                assert_balanced(&agent.events());
            }

            #[tokio::test(start_paused = true)]
            async fn cancelling_mid_stream_drops_the_request_and_leaves_a_balanced_log() {
                let (server, _host, agent) = stalled_after("a long story").await;
                let mut events = agent.subscribe();
                agent.followup(user("tell me")).unwrap();
                wait_appended(&mut events, EventKind::AssistantChunk).await;
                agent.cancel(AbortCause::User, Queued::Keep).unwrap();
                within(agent.when_idle()).await;
                within(server.stalls_released(1)).await;
                let log = agent.events();
                assert_eq!(
                    turn_ends(&log),
                    [TurnEndReason::Aborted {
                        cause: AbortCause::User
                    }]
                );
                assert_balanced(&log);
            }

            #[tokio::test(start_paused = true)]
            async fn the_key_never_reaches_the_store_or_the_turn_error() {
                let quoted = script::error_body("authentication", &format!("bad key {KEY}"));
                let server = LoopbackServer::start([Reply::status(401, quoted)])
                    .await
                    .unwrap();
                let (host, agent) = after_one_turn(&server, Vec::new(), "hi").await;
                let error = only_error(&agent);
                assert!(!error.message.contains(KEY), "{error:?}");
                let bytes = host.file_bytes(&agent).await;
                let needle = KEY.as_bytes();
                assert!(
                    !bytes.windows(needle.len()).any(|w| w == needle),
                    "the key is in the store file"
                );
                drop(host.store);
            }
        }
    };
}

adapter_tests!(chat, Wire::ChatCompletions);
adapter_tests!(responses, Wire::Responses);
adapter_tests!(anthropic, Wire::AnthropicMessages);
