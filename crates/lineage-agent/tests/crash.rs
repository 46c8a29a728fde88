//! A host process killed with SIGKILL in the middle of a turn: on resume the torn turn is closed
//! as interrupted, a call that was recorded as started is answered `TOOL_OUTCOME_UNKNOWN`, and
//! the next turn continues the numbering with the model seeing the synthetic result.

use std::sync::Arc;

use lineage_agent::{Agents, CreateAgent, Response, ScriptedModel, ToolOutput};
use lineage_log::{EventBody, SessionId, TOOL_OUTCOME_UNKNOWN, TurnEndReason};
use lineage_store::Store;
use lineage_testkit::agent::*;
use lineage_testkit::process::{
    crash_after_report, helper_arg, helper_job, report_line, rerun_this_test,
};

/// Names the store file the host process writes.
const STORE_VAR: &str = "LINEAGE_AGENT_CRASH_STORE";

/// The host process (a crash test re-run with the point to stop at as its job: `tool`, inside a
/// tool call, or `stream`, inside a model stream): creates an agent, sends it a prompt and
/// reports, on stdout, when the turn has reached that point; it then waits forever for the parent
/// to kill it.
async fn host_until_killed(point: &str) {
    // The tests run on a paused clock; a host runs on the real one, so nothing in the turn times
    // out early while the host waits to be killed.
    tokio::time::resume();
    let path: String = helper_arg(STORE_VAR);
    let store = Store::open(&path).expect("the host opens the store");
    let script = match point {
        "tool" => vec![Response::tool_call(
            "call-1",
            "deploy",
            r#"{"target":"prod"}"#,
        )],
        _ => vec![Response::hang()],
    };
    let model = ScriptedModel::new(script);
    let agents = Agents::new(store, model.clone());
    let (reached_tx, mut reached) = tokio::sync::mpsc::unbounded_channel::<()>();
    let deploy = FnTool::new("deploy", move |_, _| {
        let reached_tx = reached_tx.clone();
        async move {
            let _ = reached_tx.send(());
            std::future::pending::<ToolOutput>().await
        }
    });
    let agent = agents
        .create(CreateAgent::fresh(spec_with_tools(vec![deploy])))
        .await
        .expect("the agent is created");
    agent
        .followup(user("deploy it"))
        .expect("the prompt is queued");
    match point {
        "tool" => reached.recv().await.expect("the tool runs"),
        _ => model.wait_for_requests(1).await,
    }
    report_line(&format!("reached {}", agent.id()));
    std::future::pending::<()>().await;
}

/// Runs the host (the calling test re-run) until it reports `point`, kills it, and returns the
/// agent's id.
fn crash_host_at(path: &std::path::Path, point: &str) -> SessionId {
    let reached = crash_after_report(rerun_this_test(point).env(STORE_VAR, path), "reached ");
    reached.parse().expect("the host prints a session id")
}

#[tokio::test(start_paused = true)]
async fn a_crash_mid_tool_resumes_with_the_turn_interrupted_and_the_call_answered_unknown() {
    if let Some(point) = helper_job() {
        return host_until_killed(&point).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host.lineage");
    let id = crash_host_at(&path, "tool");
    let store = Store::open(&path).expect("the store opens after the crash");
    let model = ScriptedModel::new([Response::text("checked the deployment")]);
    let agents = Agents::new(store.clone(), model.clone());
    let agent = agents
        .resume(id, spec_with_tools(vec![echo()]))
        .await
        .unwrap();
    let events = agent.events();
    let results = tool_results(&events);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].0, "call-1");
    assert_eq!(results[0].2.as_deref(), Some(TOOL_OUTCOME_UNKNOWN));
    let tail: Vec<_> = kinds(&events).into_iter().rev().take(4).collect();
    assert_eq!(tail, ["turn/end", "step/end", "tool/result", "tool/call"]);
    assert_eq!(turn_ends(&events), [TurnEndReason::Interrupted]);
    assert_balanced(&events);
    assert_stored(&store, &agent);
    // The next turn is turn 2 and the model sees the synthetic answer, so no call dangles.
    agent.followup(user("did it deploy?")).unwrap();
    agent.when_idle().await;
    let events = agent.events();
    assert!(
        events
            .iter()
            .any(|e| matches!(&e.body, EventBody::TurnStart(t) if t.turn == 2))
    );
    let request = &model.requests()[0];
    let answered = request.messages.iter().any(|m| {
        m.source
            == lineage_log::MessageSource::Tool {
                call_id: "call-1".into(),
            }
    });
    assert!(answered, "the synthetic result is in the history");
    assert_eq!(turn_ends(&events)[1], TurnEndReason::Completed);
    assert!(store.verify().unwrap().is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_crash_mid_stream_resumes_with_the_prompt_kept_and_the_turn_interrupted() {
    if let Some(point) = helper_job() {
        return host_until_killed(&point).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host.lineage");
    let id = crash_host_at(&path, "stream");
    let store = Store::open(&path).unwrap();
    let agents = Agents::new(store.clone(), Arc::new(ScriptedModel::default()));
    let agent = agents.resume(id, spec()).await.unwrap();
    let events = agent.events();
    // The prompt was durable before the model was asked.
    assert_eq!(user_texts(&events), ["deploy it"]);
    assert_eq!(turn_ends(&events), [TurnEndReason::Interrupted]);
    assert!(tool_results(&events).is_empty());
    assert_balanced(&events);
}
