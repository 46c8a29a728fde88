//! `job_output` and `job_kill`: how a model collects and stops the one-shot background jobs its
//! `subagent` tools started.

use std::sync::Arc;

use lineage_agent::{BoxFuture, Tool, ToolContext, ToolOutput};
use serde_json::{Value, json};

use super::{answer, invalid, object_schema, refused, string_arg};
use crate::{JobId, SubagentRuntime};

/// The name of [`JobOutputTool`].
pub const JOB_OUTPUT: &str = "job_output";
/// The name of [`JobKillTool`].
pub const JOB_KILL: &str = "job_kill";

/// The job id in `arguments`, or the result that says why not.
fn job_arg(arguments: &Value) -> Result<JobId, ToolOutput> {
    string_arg(arguments, "job_id")?
        .trim()
        .parse()
        .map_err(|e: crate::SubagentError| invalid(e.message()))
}

/// Collects a background job's result, waiting for it by default.
pub struct JobOutputTool {
    runtime: SubagentRuntime,
}

impl JobOutputTool {
    /// The tool over `runtime`.
    pub fn new(runtime: &SubagentRuntime) -> Arc<Self> {
        Arc::new(JobOutputTool {
            runtime: runtime.clone(),
        })
    }
}

impl Tool for JobOutputTool {
    fn name(&self) -> &str {
        JOB_OUTPUT
    }

    fn description(&self) -> &str {
        "Gets the result of one of your background jobs, by the id you got when you started it. \
         By default it waits until the job ends; with `wait` false it answers at once, saying \
         whether the job is still running."
    }

    fn input_schema(&self) -> Value {
        object_schema(
            json!({
                "job_id": {"type": "string", "description": "The job's id (job-N)."},
                "wait": {"type": "boolean", "description": "Whether to wait for the job to end (default true)."},
            }),
            &["job_id"],
        )
    }

    fn parallel_safe(&self, _: &Value) -> bool {
        true
    }

    fn call(&self, ctx: ToolContext, arguments: Value) -> BoxFuture<'_, ToolOutput> {
        answer(async move {
            let job = job_arg(&arguments)?;
            let wait = match arguments.get("wait") {
                None | Some(Value::Null) => true,
                Some(Value::Bool(wait)) => *wait,
                Some(_) => return Err(invalid("`wait` must be true or false")),
            };
            let output = self.runtime.job_output(ctx.agent.id(), job, wait);
            let outcome = tokio::select! {
                outcome = output => outcome,
                _ = ctx.cancel.cancelled() => {
                    return Err(ToolOutput::error(
                        "SubagentError",
                        "CANCELLED",
                        format!("stopped waiting for {job}; the job goes on"),
                    ));
                }
            };
            Ok(match outcome.map_err(|error| refused(&error))? {
                Some(outcome) => ToolOutput::text(outcome.describe(job)),
                None => ToolOutput::text(format!("Background job {job} is still running.")),
            })
        })
    }
}

/// Kills a background job.
pub struct JobKillTool {
    runtime: SubagentRuntime,
}

impl JobKillTool {
    /// The tool over `runtime`.
    pub fn new(runtime: &SubagentRuntime) -> Arc<Self> {
        Arc::new(JobKillTool {
            runtime: runtime.clone(),
        })
    }
}

impl Tool for JobKillTool {
    fn name(&self) -> &str {
        JOB_KILL
    }

    fn description(&self) -> &str {
        "Stops one of your background jobs, by its id, and waits until it has stopped. A job that \
         already ended keeps its result, which this returns."
    }

    fn input_schema(&self) -> Value {
        object_schema(
            json!({
                "job_id": {"type": "string", "description": "The job's id (job-N)."},
            }),
            &["job_id"],
        )
    }

    fn call(&self, ctx: ToolContext, arguments: Value) -> BoxFuture<'_, ToolOutput> {
        answer(async move {
            let job = job_arg(&arguments)?;
            let outcome = self
                .runtime
                .kill_job(ctx.agent.id(), job)
                .await
                .map_err(|error| refused(&error))?;
            Ok(ToolOutput::text(outcome.describe(job)))
        })
    }
}
