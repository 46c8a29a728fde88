//! Delegation to Codex, for real: the `codex` of the pinned package (installed on first use),
//! `codex app-server` in a process of its own per run, its model the loopback server's Responses
//! endpoint.

mod common;

use std::sync::Arc;

use common::{Parent, assert_answered, assert_completed, body_has, requests_reach, serve};
use lineage_products::{ApprovalPolicy, CodexConfig, CodexProvider, SandboxMode};
use lineage_subagent::{ErrorCode, JobOutcome, StartRequest, StopReason};
use lineage_testkit::loopback::{Reply, responses};

fn provider(config: CodexConfig) -> Arc<CodexProvider> {
    Arc::new(CodexProvider::new(config))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_reaches_the_model_and_its_answer_completes_the_run() {
    let server = serve([responses::text("Paris is the capital.")]).await;
    let parent = Parent::new().await;
    let task = "Name the capital of France.";
    let result = parent.delegate(provider(parent.codex(&server)), task).await;
    assert_answered(&result, "Paris is the capital.");
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].path, "/v1/responses");
    assert!(body_has(&requests[0], "Name the capital of France."));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_runs_a_command_itself_then_answers() {
    let command = r#"{"cmd":"echo codex-was-here > proof.txt && cat proof.txt"}"#;
    let server = serve([
        responses::tool_call("call_1", "exec_command", command),
        responses::text("I wrote proof.txt."),
    ])
    .await;
    let parent = Parent::new().await;
    let mut config = parent.codex(&server);
    config.sandbox = SandboxMode::DangerFullAccess;
    let result = parent.delegate(provider(config), "Write proof.txt.").await;
    assert_answered(&result, "I wrote proof.txt.");
    let proof = std::fs::read_to_string(parent.work().join("proof.txt")).unwrap();
    assert_eq!(proof, "codex-was-here\n");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert!(body_has(&requests[1], "function_call_output"));
    assert!(
        body_has(&requests[1], "codex-was-here"),
        "the command's output went back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_request_is_declined_unattended_and_codex_goes_on() {
    let command = r#"{"cmd":"touch declined.txt"}"#;
    let server = serve([
        responses::tool_call("call_1", "exec_command", command),
        responses::text("I was not allowed to touch it."),
    ])
    .await;
    let parent = Parent::new().await;
    let mut config = parent.codex(&server);
    config.approval_policy = ApprovalPolicy::Untrusted;
    config.sandbox = SandboxMode::ReadOnly;
    let result = parent
        .delegate(provider(config), "Touch declined.txt.")
        .await;
    assert_completed(&result);
    assert!(
        !parent.work().join("declined.txt").exists(),
        "a declined command ran"
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert!(
        body_has(&requests[1], "rejected"),
        "the model heard of the refusal"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_failures_keep_their_category() {
    let too_long = responses::error_body("context_length_exceeded", "too many tokens");
    let server = serve([
        Reply::status(400, too_long),
        Reply::status(500, responses::error_body("server_error", "it broke")),
    ])
    .await;
    let parent = Parent::new().await;
    let result = parent
        .delegate(provider(parent.codex(&server)), "A long task.")
        .await;
    assert_eq!(
        result.stop_reason,
        StopReason::MaxTokens,
        "{:?}",
        result.diagnostic
    );
    let diagnostic = result.diagnostic.unwrap();
    assert!(diagnostic.contains("contextWindowExceeded"), "{diagnostic}");
    let result = parent
        .delegate(provider(parent.codex(&server)), "Another task.")
        .await;
    assert_eq!(result.stop_reason, StopReason::Error);
    let diagnostic = result.diagnostic.unwrap();
    assert!(
        diagnostic.starts_with("Codex (codex) failed (internalServerError)"),
        "{diagnostic}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_mid_turn_settles_aborted_and_leaves_no_process() {
    let stalled = Reply::Stall {
        body: responses::Script::new().body(),
    };
    let server = serve([stalled]).await;
    let parent = Parent::new().await;
    let provider = provider(parent.codex(&server));
    parent.cancel_mid_turn(provider, &server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_time_option_is_refused_before_a_process_starts() {
    let server = serve([]).await;
    let parent = Parent::new().await;
    let error = parent
        .start(provider(parent.codex(&server)), "A task.", |r| {
            StartRequest {
                output_schema: Some(serde_json::json!({ "type": "object" })),
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
async fn a_background_job_is_started_peeked_awaited_and_killed() {
    let server = serve([responses::text("Job done.")]).await;
    let parent = Parent::new().await;
    let runtime = &parent.host.subagents;
    runtime
        .register_provider(provider(parent.codex(&server)))
        .unwrap();
    let owner = parent.agent.id();
    let request = |task: &str| StartRequest::new(parent.agent.clone(), task);

    let first = runtime
        .start_job("codex", request("A quick job."))
        .await
        .unwrap();
    let outcome = runtime.job_output(owner, first, true).await.unwrap();
    assert_eq!(
        outcome,
        Some(JobOutcome::Completed {
            output: "Job done.".into()
        })
    );

    server.push(Reply::Stall {
        body: responses::Script::new().body(),
    });
    let second = runtime
        .start_job("codex", request("A slow job."))
        .await
        .unwrap();
    requests_reach(&server, 2).await;
    assert_eq!(
        runtime.job_output(owner, second, false).await.unwrap(),
        None
    );
    assert!(runtime.has_running_jobs(owner));
    assert_eq!(
        runtime.kill_job(owner, second).await.unwrap(),
        JobOutcome::Killed
    );
    assert!(!runtime.has_running_jobs(owner));
    server.stalls_released(1).await;
    assert_eq!(parent.survivors(), Vec::<u32>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_fails_names_its_stage_and_what_the_process_told() {
    let server = serve([]).await;
    let parent = Parent::new().await;
    let mut config = parent.codex(&server);
    config.process.program = "/bin/sh".into();
    config.process.args = vec![
        "-c".into(),
        "echo starting up; echo oops >&2; exit 3".into(),
    ];
    let error = parent
        .start(provider(config), "A task.", |r| r)
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::AgentFailure);
    let message = error.message();
    assert!(
        message.starts_with("Codex (codex) failed at stage initialize"),
        "{message}"
    );
    assert!(message.contains("exit status: 3"), "{message}");
    assert!(message.contains("\"starting up\""), "{message}");
    assert!(message.contains("oops"), "{message}");

    let mut config = parent.codex(&server);
    config.name = "missing".into();
    config.process.program = "/nonexistent/codex".into();
    let error = parent
        .start(provider(config), "A task.", |r| r)
        .await
        .unwrap_err();
    assert!(error.message().contains("stage spawn"), "{error}");
    assert!(error.message().contains("/nonexistent/codex"), "{error}");
    assert_eq!(parent.survivors(), Vec::<u32>::new());
}
