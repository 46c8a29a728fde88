//! The four delegation tools side by side, as a parent's model sees them: `subagent` and
//! `subagent_fork` in process, `subagent_codex` and `subagent_claude_code` out of process; a
//! Codex run started as a background job through its tool and collected with `job_output`.

mod common;

use std::sync::Arc;

use common::{Parent, serve};
use lineage_agent::{AgentSpec, Response, ScriptedModel};
use lineage_products::{ClaudeCodeProvider, CodexProvider};
use lineage_subagent::tools::SubagentToolConfig;
use lineage_testkit::loopback::responses;
use lineage_testkit::subagent::{assert_ok, call, offered, tool_names, tool_results};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_sees_four_delegation_tools_and_runs_codex_as_a_background_job() {
    let server = serve([responses::text("Codex says hello.")]).await;
    let model = ScriptedModel::new([
        call(
            "c1",
            "subagent_codex",
            json!({"description": "greet", "prompt": "Say hello.", "run_in_background": true}),
        ),
        call("c2", "job_output", json!({"job_id": "job-1"})),
        Response::text("Codex said hello."),
    ]);
    let parent = Parent::with_model(model.clone()).await;
    let codex = CodexProvider::new(parent.codex(&server));
    let claude = ClaudeCodeProvider::new(parent.claude(&server));
    let mut rows = SubagentToolConfig::in_process_rows();
    rows.push(codex.tool_row("subagent_codex"));
    rows.push(claude.tool_row("subagent_claude_code"));
    let tools = parent.host.delegation_tools(rows);
    parent
        .host
        .subagents
        .register_provider(Arc::new(codex))
        .unwrap();
    parent
        .host
        .subagents
        .register_provider(Arc::new(claude))
        .unwrap();
    let lead = parent
        .agent_with(AgentSpec {
            tools,
            ..AgentSpec::new("scripted", "lead")
        })
        .await;

    let outcome = parent
        .host
        .run(&lead, "Ask Codex to say hello.")
        .await
        .unwrap();
    assert_eq!(outcome.output.unwrap().text(), "Codex said hello.");

    let first = &model.requests()[0];
    let names = tool_names(first);
    assert_eq!(
        names[..4],
        [
            "subagent",
            "subagent_fork",
            "subagent_codex",
            "subagent_claude_code"
        ]
    );
    // The controls for continuable children, and the job tools for the one-shot rows.
    for name in [
        "send_message",
        "interrupt_agent",
        "list_agents",
        "job_output",
        "job_kill",
    ] {
        assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
    }
    let codex_schema = offered(first, "subagent_codex");
    assert!(codex_schema["properties"]["run_in_background"].is_object());
    let answers = tool_results(&lead.events());
    assert_eq!(answers.len(), 2);
    assert_ok(&answers[0]);
    assert!(answers[0].text.contains("job-1"), "{:?}", answers[0]);
    assert_ok(&answers[1]);
    assert!(
        answers[1].text.contains("Codex says hello."),
        "{:?}",
        answers[1]
    );
    assert_eq!(parent.survivors(), Vec::<u32>::new());
}
