//! Delegation to Claude Code, for real: the `claude` of the pinned package (installed on first
//! use), `claude -p` with stream-json in a process of its own per run, its endpoint the loopback
//! server's Messages API.

mod common;

use std::sync::Arc;

use common::{Parent, assert_answered, assert_completed, body_has, serve};
use lineage_products::{ClaudeCodeConfig, ClaudeCodeProvider, PermissionMode};
use lineage_subagent::{ErrorCode, StartRequest, StopReason};
use lineage_testkit::loopback::{Reply, anthropic};

fn provider(config: ClaudeCodeConfig) -> Arc<ClaudeCodeProvider> {
    Arc::new(ClaudeCodeProvider::new(config))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_reaches_the_model_and_its_answer_completes_the_run() {
    let server = serve([anthropic::text("Paris is the capital.")]).await;
    let parent = Parent::new().await;
    let task = "Name the capital of France.";
    let result = parent
        .delegate(provider(parent.claude(&server)), task)
        .await;
    assert_answered(&result, "Paris is the capital.");
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert!(
        requests[0].path.starts_with("/v1/messages"),
        "{}",
        requests[0].path
    );
    assert_eq!(requests[0].header("x-api-key"), Some("placeholder"));
    assert!(body_has(&requests[0], "Name the capital of France."));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_reads_a_file_itself_then_answers() {
    let parent = Parent::new().await;
    let notes = parent.work().join("notes.txt");
    std::fs::write(&notes, "the-secret-word\n").unwrap();
    let read = serde_json::json!({ "file_path": notes }).to_string();
    let server = serve([
        anthropic::tool_call("toolu_1", "Read", &read),
        anthropic::text("The note says the-secret-word."),
    ])
    .await;
    let result = parent
        .delegate(provider(parent.claude(&server)), "What does notes.txt say?")
        .await;
    assert_answered(&result, "The note says the-secret-word.");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert!(body_has(&requests[1], "tool_result"));
    assert!(
        body_has(&requests[1], "the-secret-word"),
        "the file went back to the model"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permission_request_is_denied_unattended_and_claude_code_goes_on() {
    let touch = r#"{"command":"touch denied.txt","description":"Create a file"}"#;
    let server = serve([
        anthropic::tool_call("toolu_1", "Bash", touch),
        anthropic::text("I was not allowed to."),
    ])
    .await;
    let parent = Parent::new().await;
    let mut config = parent.claude(&server);
    config.permission_mode = PermissionMode::Ask;
    let result = parent
        .delegate(provider(config), "Create denied.txt.")
        .await;
    assert_completed(&result);
    assert!(
        !parent.work().join("denied.txt").exists(),
        "a denied command ran"
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert!(
        body_has(&requests[1], "nobody can grant permission"),
        "the model heard the denial"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_failure_is_an_error_with_its_category_and_message() {
    let server = serve([Reply::status(
        500,
        anthropic::error_body("api_error", "it broke"),
    )])
    .await;
    let parent = Parent::new().await;
    let result = parent
        .delegate(provider(parent.claude(&server)), "A task.")
        .await;
    assert_eq!(result.stop_reason, StopReason::Error);
    assert!(
        result.output.is_empty(),
        "a failure's text is not an answer"
    );
    let diagnostic = result.diagnostic.unwrap();
    let category = "Claude Code (claude) ended success (api_error): API Error: 500";
    assert!(diagnostic.starts_with(category), "{diagnostic}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_turn_limit_ends_a_run_as_a_budget() {
    let parent = Parent::new().await;
    let notes = parent.work().join("notes.txt");
    std::fs::write(&notes, "words\n").unwrap();
    let read = serde_json::json!({ "file_path": notes }).to_string();
    let server = serve([anthropic::tool_call("toolu_1", "Read", &read)]).await;
    let mut config = parent.claude(&server);
    config.max_turns = Some(1);
    let result = parent
        .delegate(provider(config), "Read notes.txt, then think more.")
        .await;
    assert_eq!(
        result.stop_reason,
        StopReason::Budget,
        "{:?}",
        result.diagnostic
    );
    let diagnostic = result.diagnostic.unwrap();
    assert!(diagnostic.contains("error_max_turns"), "{diagnostic}");
    assert_eq!(
        server.requests().len(),
        1,
        "the limit stopped a second request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_mid_turn_settles_aborted_and_leaves_no_process() {
    let stalled = Reply::Stall {
        body: anthropic::Script::new().body(),
    };
    let server = serve([stalled]).await;
    let parent = Parent::new().await;
    let provider = provider(parent.claude(&server));
    parent.cancel_mid_turn(provider, &server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_time_option_is_refused_before_a_process_starts() {
    let server = serve([]).await;
    let parent = Parent::new().await;
    let error = parent
        .start(provider(parent.claude(&server)), "A task.", |r| {
            StartRequest {
                persona: Some("a reviewer".into()),
                ..r
            }
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::UnsupportedCapability, "{error}");
    assert_eq!(parent.survivors(), Vec::<u32>::new());
    assert!(server.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_fails_names_its_stage_and_what_the_process_told() {
    let server = serve([]).await;
    let parent = Parent::new().await;
    let mut config = parent.claude(&server);
    config.process.program = "/bin/sh".into();
    config.process.args = vec!["-c".into(), "echo 'no such flag' >&2; exit 2".into()];
    let error = parent
        .start(provider(config), "A task.", |r| r)
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::AgentFailure);
    let message = error.message();
    assert!(
        message.starts_with("Claude Code (claude) failed at stage initialize"),
        "{message}"
    );
    assert!(message.contains("exit status: 2"), "{message}");
    assert!(message.contains("no such flag"), "{message}");
    assert_eq!(parent.survivors(), Vec::<u32>::new());
}
