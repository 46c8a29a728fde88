//! Delegation to Claude Code, for real: the `claude` of the pinned package (installed on first
//! use), `claude -p` with stream-json in a process of its own per run, its endpoint the loopback
//! server's Messages API.

mod common;

use common::{
    Parent, Product, answered_task, assert_answered, assert_told_after_the_call, cancel_mid_turn,
    diagnostic, refused_command, refuses_option, run_shell, serve, shell_start_failure,
};
use lineage_products::{ClaudeCodeConfig, PermissionMode};
use lineage_subagent::{StartRequest, StopReason};
use lineage_testkit::loopback::{Reply, anthropic};

/// The arguments of a `Read` of the working directory's `notes.txt`, written holding `text`.
fn read_notes(parent: &Parent, text: &str) -> String {
    let notes = parent.work_file("notes.txt", text);
    serde_json::json!({ "file_path": notes }).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_reaches_the_model_and_its_answer_completes_the_run() {
    let request = answered_task::<ClaudeCodeConfig>(anthropic::text("Paris is the capital.")).await;
    assert!(request.path.starts_with("/v1/messages"), "{}", request.path);
    assert_eq!(request.header("x-api-key"), Some("placeholder"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_reads_a_file_itself_then_answers() {
    let parent = Parent::new().await;
    let read = read_notes(&parent, "the-secret-word\n");
    let server = serve([
        anthropic::tool_call("toolu_1", "Read", &read),
        anthropic::text("The note says the-secret-word."),
    ])
    .await;
    let result = parent
        .delegate(
            parent.claude(&server).provider(),
            "What does notes.txt say?",
        )
        .await;
    assert_answered(&result, "The note says the-secret-word.");
    // The file went back to the model.
    assert_told_after_the_call(&server, &["tool_result", "the-secret-word"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permission_request_is_denied_unattended_and_claude_code_goes_on() {
    let touch = r#"{"command":"touch denied.txt","description":"Create a file"}"#;
    let replies = [
        anthropic::tool_call("toolu_1", "Bash", touch),
        anthropic::text("I was not allowed to."),
    ];
    let ask = |config| ClaudeCodeConfig {
        permission_mode: PermissionMode::Ask,
        ..config
    };
    let denial = "nobody can grant permission";
    refused_command(replies, "denied.txt", "Create denied.txt.", denial, ask).await;
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
        .delegate(parent.claude(&server).provider(), "A task.")
        .await;
    assert!(
        result.output.is_empty(),
        "a failure's text is not an answer"
    );
    let diagnostic = diagnostic(result, StopReason::Error);
    let category = "Claude Code (claude) ended success (api_error): API Error: 500";
    assert!(diagnostic.starts_with(category), "{diagnostic}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_turn_limit_ends_a_run_as_a_budget() {
    let parent = Parent::new().await;
    let read = read_notes(&parent, "words\n");
    let server = serve([anthropic::tool_call("toolu_1", "Read", &read)]).await;
    let config = ClaudeCodeConfig {
        max_turns: Some(1),
        ..parent.claude(&server)
    };
    let result = parent
        .delegate(config.provider(), "Read notes.txt, then think more.")
        .await;
    let diagnostic = diagnostic(result, StopReason::Budget);
    assert!(diagnostic.contains("error_max_turns"), "{diagnostic}");
    assert_eq!(
        server.requests().len(),
        1,
        "the limit stopped a second request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_mid_turn_settles_aborted_and_leaves_no_process() {
    cancel_mid_turn::<ClaudeCodeConfig>(anthropic::Script::new().body()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_fails_names_its_stage_and_what_the_process_told() {
    let shell = |config: &mut ClaudeCodeConfig| {
        run_shell(&mut config.process, "echo 'no such flag' >&2; exit 2");
    };
    let told = ["exit status: 2", "no such flag"];
    shell_start_failure(shell, "Claude Code (claude)", &told).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_time_option_is_refused_before_a_process_starts() {
    refuses_option::<ClaudeCodeConfig>(|r| StartRequest {
        persona: Some("a reviewer".into()),
        ..r
    })
    .await;
}
