//! Budgets: each limit ends the turn before the model request it would exceed, with its own
//! reason and code, in the log; what the stopped step claimed waits parked; a resume keeps
//! counting from the log, and a new budget given at resume starts again.

use std::time::Duration;

use lineage_agent::{Agent, AgentError, AgentSpec, Budget, BudgetUse, Response, ToolOutput};
use lineage_log::{BudgetLimit, BudgetReached, Custom, Event, InboxTarget, TurnEndReason};
use lineage_testkit::agent::*;

/// A model that calls `echo` forever.
fn looping(n: usize) -> Vec<Response> {
    (0..n)
        .map(|i| Response::tool_call(&format!("c{i}"), "echo", "{}"))
        .collect()
}

/// `spec` held to `budget`.
fn budgeted(budget: Budget, spec: AgentSpec) -> AgentSpec {
    AgentSpec {
        budget: Some(budget),
        ..spec
    }
}

/// A spec with the `echo` tool, held to `budget`.
fn with_budget(budget: Budget) -> AgentSpec {
    budgeted(budget, spec_with_tools(vec![echo()]))
}

/// The budget end of the last turn of `events`, asserting there is one.
fn reached(events: &[Event]) -> BudgetReached {
    match turn_ends(events).pop() {
        Some(TurnEndReason::Budget(reached)) => *reached,
        other => panic!("expected a budget end, got {other:?}"),
    }
}

/// The limit the last turn of `agent`'s log reached, and its maximum.
fn limit_reached(agent: &Agent) -> (BudgetLimit, u64) {
    let reached = reached(&agent.events());
    (reached.limit, reached.max)
}

#[tokio::test(start_paused = true)]
async fn a_request_limit_stops_a_looping_model_before_the_request_past_it() {
    let h = Harness::new(looping(50));
    let agent = h.agent_with(with_budget(Budget::agent().requests(3))).await;
    run_turn(&agent, "loop").await;

    assert_eq!(h.model.requests().len(), 3);
    let events = agent.events();
    let reached = reached(&events);
    assert_eq!(
        (reached.limit, reached.max, reached.owner),
        (BudgetLimit::Requests, 3, agent.id())
    );
    assert_eq!(reached.limit.code(), "BUDGET_REQUESTS");
    assert_eq!(
        tool_results(&events).len(),
        3,
        "every call made was answered"
    );
    assert_balanced(&events);
    assert_stored(&h.store, &agent);
    assert_eq!(
        agent.budget(),
        Some((
            Budget::agent().requests(3),
            BudgetUse {
                turns: 1,
                requests: 3,
                output_tokens: 15
            }
        ))
    );
}

#[tokio::test(start_paused = true)]
async fn a_turn_limit_lets_its_turns_run_and_parks_the_next_prompt_unasked() {
    let h = Harness::new(["one", "two"].map(Response::text));
    let agent = h
        .agent_with(budgeted(Budget::agent().turns(2), spec()))
        .await;
    for prompt in ["first", "second", "third"] {
        run_turn(&agent, prompt).await;
    }

    assert_eq!(h.model.requests().len(), 2, "the third turn asked nothing");
    let events = agent.events();
    assert_eq!(turn_ends(&events).len(), 3);
    assert_eq!(reached(&events).limit, BudgetLimit::Turns);
    let parked: Vec<String> = [InboxTarget::NextTurn, InboxTarget::NextStep]
        .into_iter()
        .flat_map(|target| agent.pending(target))
        .map(|m| m.text())
        .collect();
    assert_eq!(parked, ["third"], "the refused prompt is parked, not lost");
    assert_balanced(&events);
}

#[tokio::test(start_paused = true)]
async fn an_output_token_limit_is_checked_before_each_request() {
    // Scripted text reports one output token per character.
    let h = Harness::new([Response::text("twelve chars"), Response::text("never")]);
    let agent = h
        .agent_with(budgeted(Budget::agent().output_tokens(10), spec()))
        .await;
    run_turn(&agent, "talk").await;
    assert_eq!(turn_ends(&agent.events()), [TurnEndReason::Completed]);
    run_turn(&agent, "again").await;
    assert_eq!(h.model.requests().len(), 1);
    assert_eq!(limit_reached(&agent), (BudgetLimit::OutputTokens, 10));
}

#[tokio::test(start_paused = true)]
async fn a_wall_clock_limit_stops_the_step_after_it_passes() {
    let slow = FnTool::new("slow", |_, _| async {
        tokio::time::sleep(Duration::from_secs(61)).await;
        ToolOutput::text("done")
    });
    let h = Harness::new([
        Response::tool_call("c1", "slow", "{}"),
        Response::text("never"),
    ]);
    let agent = h
        .agent_with(budgeted(
            Budget::agent().wall(Duration::from_secs(60)),
            spec_with_tools(vec![slow]),
        ))
        .await;
    run_turn(&agent, "go slowly").await;
    assert_eq!(h.model.requests().len(), 1);
    assert_eq!(limit_reached(&agent), (BudgetLimit::WallClock, 60_000));
    assert_balanced(&agent.events());
}

#[tokio::test(start_paused = true)]
async fn a_resume_keeps_counting_from_the_log_and_a_new_budget_starts_again() {
    let h = Harness::new([
        Response::tool_call("c0", "echo", "{}"),
        Response::text("done"),
    ]);
    let agent = h.agent_with(with_budget(Budget::agent().requests(3))).await;
    run_turn(&agent, "two requests").await;
    let id = agent.id();
    agent.dispose().await;

    // No budget in the spec: the recorded one stays in force, with two requests spent.
    h.model.push(looping(10));
    let agent = h
        .agents
        .resume(id, spec_with_tools(vec![echo()]))
        .await
        .unwrap();
    assert_eq!(agent.budget().map(|(_, used)| used.requests), Some(2));
    run_turn(&agent, "more").await;
    assert_eq!(h.model.requests().len(), 3, "one more request was allowed");
    assert_eq!(reached(&agent.events()).limit, BudgetLimit::Requests);
    agent.dispose().await;

    // A different budget is recorded anew and counts from zero.
    let before = h.model.requests().len();
    let agent = h
        .agents
        .resume(id, with_budget(Budget::agent().requests(2)))
        .await
        .unwrap();
    assert_eq!(
        agent.budget(),
        Some((Budget::agent().requests(2), BudgetUse::default()))
    );
    run_turn(&agent, "again").await;
    assert_eq!(h.model.requests().len() - before, 2);
    assert_eq!(limit_reached(&agent), (BudgetLimit::Requests, 2));
    assert_stored(&h.store, &agent);
}

#[tokio::test(start_paused = true)]
async fn a_malformed_budget_record_refuses_the_resume_naming_its_seq() {
    let h = Harness::new([]);
    let agent = h.agent().await;
    let seq = agent
        .record(Custom {
            type_name: lineage_agent::BUDGET_EVENT.into(),
            payload: r#"{"max_requests": "many"}"#.into(),
            ignorable: true,
        })
        .unwrap();
    let id = agent.id();
    agent.dispose().await;
    let error = h.agents.resume(id, spec()).await.unwrap_err();
    assert!(
        matches!(&error, AgentError::InvalidBudget { agent, seq: s, reason }
            if *agent == id && *s == seq && reason.contains("max_requests")),
        "{error}"
    );
}
