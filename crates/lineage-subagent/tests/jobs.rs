//! One-shot background jobs: `subagent` with `run_in_background: true` in one-shot mode, then
//! `job_output` and `job_kill`; the owner told of each job's end; jobs ending with their owner
//! and at a drain. Time is paused and children are held by gates: nothing sleeps.

use std::sync::Arc;

use lineage_agent::{Agent, INVALID_ARGUMENTS, Response, Tool};
use lineage_log::MessageSource;
use lineage_subagent::tools::{JobKillTool, JobOutputTool, SubagentTool, SubagentToolConfig};
use lineage_subagent::{ErrorCode, JobId, JobOutcome};
use lineage_testkit::continuation::*;
use lineage_testkit::subagent::*;
use serde_json::json;

/// A parent with a one-shot `subagent` tool (background allowed, as by default) and the job
/// tools.
async fn parent(h: &Harness) -> Arc<Agent> {
    let subagent = SubagentTool::new(
        &h.runtime,
        SubagentToolConfig {
            agent_options: child_options(),
            ..SubagentToolConfig::new("spawn")
        },
    )
    .unwrap();
    let tools: Vec<Arc<dyn Tool>> = vec![
        subagent,
        JobOutputTool::new(&h.runtime),
        JobKillTool::new(&h.runtime),
    ];
    h.parent_with(parent_spec(tools)).await
}

/// A model call of the one-shot `subagent` tool that starts `prompt` as a background job.
fn in_background(id: &str, description: &str, prompt: &str) -> Response {
    let arguments =
        json!({"description": description, "prompt": prompt, "run_in_background": true});
    call(id, "subagent", arguments)
}

fn job_notices(agent: &Agent) -> Vec<String> {
    agent
        .events()
        .iter()
        .filter_map(|e| match &e.body {
            lineage_log::EventBody::UserMessage(m)
                if matches!(&m.source, MessageSource::Plugin { name } if name.as_str() == "jobs") =>
            {
                Some(m.text())
            }
            _ => None,
        })
        .collect()
}

/// Waits until `agent` has ended `n` turns and is idle.
async fn turns_done(agent: &Arc<Agent>, n: usize) {
    let mut changes = agent.changes();
    within(async {
        while turn_ends(&agent.events()).len() < n
            || agent.status() != lineage_agent::AgentStatus::Idle
        {
            changes.changed().await.expect("the agent lives");
        }
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_background_job_returns_its_id_at_once_and_its_owner_collects_the_result() {
    let h = Harness::new();
    let gate = gated_text(&h.child_model(), "the survey is done");
    h.parent_model().push([
        in_background("c1", "survey", "survey the code"),
        call(
            "c2",
            "job_output",
            json!({"job_id": "job-1", "wait": false}),
        ),
        Response::text("started it"),
    ]);
    let parent = parent(&h).await;
    run_turn(&parent, "survey in the background").await;

    // The one-shot tool offered the switch, described as a job.
    let schema = offered(&h.parent_model().requests()[0], "subagent");
    let switch = &schema["properties"]["run_in_background"]["description"];
    assert!(switch.as_str().unwrap().contains("job_output"), "{schema}");

    let results = tool_results(&parent.events());
    assert!(
        results[0].text.starts_with("Started background job job-1."),
        "{}",
        results[0].text
    );
    assert_eq!(results[1].text, "Background job job-1 is still running.");
    assert!(h.runtime.has_running_jobs(parent.id()));
    let job: JobId = "job-1".parse().unwrap();
    // Only the owner knows its jobs.
    let stranger = lineage_log::SessionId::new();
    assert!(h.runtime.job_output(stranger, job, false).await.is_err());

    // The job ends: the owner is told, which starts its next turn, and collects the result.
    h.parent_model().push([
        call("c3", "job_output", json!({"job_id": "job-1"})),
        Response::text("collected"),
    ]);
    gate.open();
    turns_done(&parent, 2).await;
    assert_eq!(
        job_notices(&parent),
        ["[survey] Background job job-1 completed:\nthe survey is done"]
    );
    let results = tool_results(&parent.events());
    assert_eq!(
        results[2].text,
        "Background job job-1 completed:\nthe survey is done"
    );
    assert!(!h.runtime.has_running_jobs(parent.id()));
    // The child was a one-shot run, disposed of when it ended.
    let child = h.only_child(&parent);
    assert!(h.agents.get(child).is_none());
    h.assert_verified();
}

#[tokio::test(start_paused = true)]
async fn job_kill_stops_a_running_job_and_waits_for_it() {
    let h = Harness::new();
    h.child_model().push([Response::hang()]);
    h.parent_model().push([
        in_background("c1", "slow", "take forever"),
        call("c2", "job_kill", json!({"job_id": "job-1"})),
        Response::text("killed it"),
        // The turn the job's notice starts.
        Response::text("noted"),
    ]);
    let parent = parent(&h).await;
    run_turn(&parent, "start and stop").await;
    turns_done(&parent, 2).await;
    let results = tool_results(&parent.events());
    assert_eq!(results[1].text, "Background job job-1 was killed.");
    assert_eq!(
        job_notices(&parent),
        ["[slow] Background job job-1 was killed."]
    );
    let child = h.only_child(&parent);
    assert!(h.agents.get(child).is_none(), "the child is gone");
    assert!(
        turn_ends(&h.stored(child))
            .iter()
            .all(|r| matches!(r, lineage_log::TurnEndReason::Aborted { .. }))
    );
    h.assert_verified();
}

#[tokio::test(start_paused = true)]
async fn bad_job_ids_and_other_agents_jobs_are_refused() {
    let h = Harness::new();
    h.parent_model().push([
        call("c1", "job_output", json!({"job_id": "7"})),
        call("c2", "job_kill", json!({"job_id": "job-9"})),
        call(
            "c3",
            "job_output",
            json!({"job_id": "job-1", "wait": "yes"}),
        ),
        Response::text("ok"),
    ]);
    let parent = parent(&h).await;
    run_turn(&parent, "try").await;
    let results = tool_results(&parent.events());
    assert_error(&results[0], INVALID_ARGUMENTS);
    assert!(
        results[1].text.contains("has no job job-9"),
        "{}",
        results[1].text
    );
    assert_error(&results[2], INVALID_ARGUMENTS);
}

#[tokio::test(start_paused = true)]
async fn jobs_end_with_their_owner_and_at_a_drain() {
    let h = Harness::new();
    h.child_model().push([Response::hang(), Response::hang()]);
    let start = |parent: &Arc<Agent>| {
        h.runtime.start_job("spawn", {
            let mut request = request(parent, "wait forever");
            request.agent_options = child_options();
            request
        })
    };
    // Disposed owner: its job is killed, then forgotten (nobody can ask for it any more).
    let owner = h.parent().await;
    let job = within(start(&owner)).await.unwrap();
    let owner_id = owner.id();
    within(owner.dispose()).await;
    let outcome = within(h.runtime.job_output(owner_id, job, true)).await;
    assert_eq!(outcome.unwrap(), Some(JobOutcome::Killed));
    let forgotten = h.runtime.job_output(owner_id, job, false).await;
    assert_eq!(refusal(forgotten).code(), ErrorCode::InvalidRequest);
    assert!(!h.runtime.has_running_jobs(owner_id));

    // A drain kills what is left.
    let other = h.parent().await;
    let job = within(start(&other)).await.unwrap();
    assert!(h.runtime.has_running_jobs(other.id()));
    within(h.runtime.drain()).await.unwrap();
    assert_eq!(
        h.runtime.job_output(other.id(), job, false).await.unwrap(),
        Some(JobOutcome::Killed)
    );
    h.assert_verified();
}
