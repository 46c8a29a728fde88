//! Delegation to Codex, for real: the `codex` of the pinned package (installed on first use),
//! `codex app-server` in a process of its own per run, its model the loopback server's Responses
//! endpoint.

mod common;

use common::{
    Parent, Product, answered_task, assert_answered, assert_told_after_the_call, cancel_mid_turn,
    diagnostic, refused_command, refuses_option, requests_reach, run_shell, serve,
    shell_start_failure,
};
use lineage_products::{ApprovalPolicy, CodexConfig, SandboxMode};
use lineage_subagent::{JobOutcome, StartRequest, StopReason};
use lineage_testkit::loopback::{Reply, responses};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_reaches_the_model_and_its_answer_completes_the_run() {
    let request = answered_task::<CodexConfig>(responses::text("Paris is the capital.")).await;
    assert_eq!(request.path, "/v1/responses");
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
    let config = CodexConfig {
        sandbox: SandboxMode::DangerFullAccess,
        ..parent.codex(&server)
    };
    let result = parent.delegate(config.provider(), "Write proof.txt.").await;
    assert_answered(&result, "I wrote proof.txt.");
    let proof = std::fs::read_to_string(parent.work().join("proof.txt")).unwrap();
    assert_eq!(proof, "codex-was-here\n");
    // The command's output went back.
    assert_told_after_the_call(&server, &["function_call_output", "codex-was-here"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_request_is_declined_unattended_and_codex_goes_on() {
    let replies = [
        responses::tool_call("call_1", "exec_command", r#"{"cmd":"touch declined.txt"}"#),
        responses::text("I was not allowed to touch it."),
    ];
    let untrusted = |config| CodexConfig {
        approval_policy: ApprovalPolicy::Untrusted,
        sandbox: SandboxMode::ReadOnly,
        ..config
    };
    let task = "Touch declined.txt.";
    refused_command(replies, "declined.txt", task, "rejected", untrusted).await;
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
        .delegate(parent.codex(&server).provider(), "A long task.")
        .await;
    let too_long = diagnostic(result, StopReason::MaxTokens);
    assert!(too_long.contains("contextWindowExceeded"), "{too_long}");
    let result = parent
        .delegate(parent.codex(&server).provider(), "Another task.")
        .await;
    let diagnostic = diagnostic(result, StopReason::Error);
    assert!(
        diagnostic.starts_with("Codex (codex) failed (internalServerError)"),
        "{diagnostic}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_mid_turn_settles_aborted_and_leaves_no_process() {
    cancel_mid_turn::<CodexConfig>(responses::Script::new().body()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_job_is_started_peeked_awaited_and_killed() {
    let server = serve([responses::text("Job done.")]).await;
    let parent = Parent::new().await;
    let runtime = &parent.host.subagents;
    runtime
        .register_provider(parent.codex(&server).provider())
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
async fn a_start_time_option_is_refused_before_a_process_starts() {
    refuses_option::<CodexConfig>(|r| StartRequest {
        output_schema: Some(serde_json::json!({ "type": "object" })),
        ..r
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_fails_names_its_stage_and_what_the_process_told() {
    let script = "echo starting up; echo oops >&2; exit 3";
    let told = ["exit status: 3", "\"starting up\"", "oops"];
    shell_start_failure(
        |config: &mut CodexConfig| run_shell(&mut config.process, script),
        "Codex (codex)",
        &told,
    )
    .await;

    let server = serve([]).await;
    let parent = Parent::new().await;
    let mut config = parent.codex(&server);
    config.name = "missing".into();
    config.process.program = "/nonexistent/codex".into();
    let error = parent.failed_start(config.provider()).await;
    assert!(error.message().contains("stage spawn"), "{error}");
    assert!(error.message().contains("/nonexistent/codex"), "{error}");
}
