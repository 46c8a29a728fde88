//! A one-shot run's disposal failing after the run finished: the `subagent` tool still reports
//! what the run produced, and after it that the disposal failed.

use std::sync::Arc;

use lineage_agent::Response;
use lineage_subagent::tools::{SubagentTool, SubagentToolConfig};
use lineage_subagent::{Capabilities, ErrorCode, StopReason, SubagentError};
use lineage_testkit::subagent::*;
use serde_json::json;

fn delegation(id: &str) -> Response {
    let arguments = json!({"description": id, "prompt": "task"}).to_string();
    Response::tool_call(id, "subagent", &arguments)
}

#[tokio::test(start_paused = true)]
async fn a_failed_disposal_is_reported_after_the_result_it_does_not_hide() {
    let h = Harness::new();
    let canned = CannedProvider::new("canned", Capabilities::ALL);
    h.runtime.register_provider(canned.clone()).unwrap();
    let teardown = |message: &str| SubagentError::new(ErrorCode::AgentFailure, message);
    canned.push(Canned {
        result: Ok(result(StopReason::Completed, "the answer is 42", None)),
        dispose: Err(teardown("the worker would not stop")),
    });
    canned.push(Canned {
        result: Ok(result(
            StopReason::Refusal,
            "I looked at it",
            Some("a policy blocked the task"),
        )),
        dispose: Err(teardown("the worker would not stop either")),
    });
    let tool = SubagentTool::new(&h.runtime, SubagentToolConfig::new("canned")).unwrap();
    let parent = h
        .parent_with(parent_spec(vec![tool as Arc<dyn lineage_agent::Tool>]))
        .await;
    h.parent_model()
        .push([delegation("completed"), delegation("refused")]);
    h.parent_model().push([Response::text("parent done")]);
    run_turn(&parent, "go").await;

    let answers = tool_results(&parent.events());
    let by_call = |call: &str| answer_to(&answers, call);

    // The completed run's output is there, and after it the disposal's failure, which makes the
    // call fail with the disposal's code.
    let completed = by_call("completed");
    let output = completed.text.find("the answer is 42");
    let failure = completed.text.find("the worker would not stop");
    assert!(output.is_some(), "{}", completed.text);
    assert!(failure.is_some(), "{}", completed.text);
    assert!(output < failure, "{}", completed.text);
    assert!(completed.is_error);
    assert_eq!(completed.code.as_deref(), Some("AGENT_FAILURE"));

    // A run that failed keeps its own code, diagnostic and partial output; the disposal's failure
    // follows them.
    let refused = by_call("refused");
    assert!(refused.is_error);
    assert_eq!(refused.code.as_deref(), Some("refusal"));
    let diagnostic = refused.text.find("a policy blocked the task");
    let partial = refused.text.find("I looked at it");
    let failure = refused.text.find("the worker would not stop either");
    assert!(
        diagnostic.is_some() && partial.is_some(),
        "{}",
        refused.text
    );
    assert!(failure.is_some(), "{}", refused.text);
    assert!(
        diagnostic < failure && partial < failure,
        "{}",
        refused.text
    );

    assert_eq!(canned.disposed(), 2);
    assert_balanced(&parent.events());
}
