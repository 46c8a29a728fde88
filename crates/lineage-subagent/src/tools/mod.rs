//! The model-facing tools of delegation: `subagent` (delegate), `send_message`,
//! `interrupt_agent`, `list_agents`, `job_output` and `job_kill` (one-shot background jobs), and
//! `report` (inside continuable children only).

use std::future::Future;

use lineage_agent::{BoxFuture, INVALID_ARGUMENTS, ToolOutput};
use serde_json::{Value, json};

use crate::SubagentError;

mod control;
mod jobs;
mod report;
mod subagent;

pub use control::{
    INTERRUPT_AGENT, InterruptAgentTool, LIST_AGENTS, ListAgentsTool, SEND_MESSAGE, SendMessageTool,
};
pub use jobs::{JOB_KILL, JOB_OUTPUT, JobKillTool, JobOutputTool};
pub use report::{REPORT, REPORT_GUIDANCE, ReportSetup, ReportTool};
pub use subagent::{BackgroundMode, MaxDepth, SubagentTool, SubagentToolConfig};

/// A refusal, as the model reads it.
pub(crate) fn refused(error: &SubagentError) -> ToolOutput {
    ToolOutput::error("SubagentError", error.code().as_str(), error.to_string())
}

/// Arguments the model got wrong, as the model reads it.
pub(crate) fn invalid(text: impl Into<lineage_log::Text>) -> ToolOutput {
    ToolOutput::error("SubagentError", INVALID_ARGUMENTS, text)
}

/// The string in `arguments[key]`, or the result that says it must be one.
fn string_arg<'a>(arguments: &'a Value, key: &str) -> Result<&'a str, ToolOutput> {
    arguments
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(format!("`{key}` must be a string")))
}

/// A tool call whose refusals (arguments the model got wrong, a refused operation) are what
/// the model reads, as its answer is.
fn answer<'a>(
    call: impl Future<Output = Result<ToolOutput, ToolOutput>> + Send + 'a,
) -> BoxFuture<'a, ToolOutput> {
    Box::pin(async move { call.await.unwrap_or_else(|refusal| refusal) })
}

/// A tool's input schema: an object of `properties`, the `required` ones named, and nothing
/// else. The keys come in the order tools have always sent them.
fn object_schema(properties: Value, required: &[&str]) -> Value {
    let mut schema = serde_json::Map::new();
    schema.insert("type".into(), json!("object"));
    schema.insert("properties".into(), properties);
    if !required.is_empty() {
        schema.insert("required".into(), json!(required));
    }
    schema.insert("additionalProperties".into(), json!(false));
    Value::Object(schema)
}
