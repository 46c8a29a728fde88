//! `report`: how a continuable child tells its parent what it found. It exists only inside
//! continuable children, installed by [`ReportSetup`] at each activation.

use std::sync::Arc;

use lineage_agent::{BoxFuture, Tool, ToolContext, ToolOutput};
use lineage_log::{ContentBlock, SessionId};
use serde_json::{Value, json};

use super::{answer, object_schema, refused, string_arg};
use crate::{ContinuableSetup, Installed, ReportDelivery, SubagentRuntime};

/// The tool's name.
pub const REPORT: &str = "report";

/// The guidance a continuable child gets with the tool.
pub const REPORT_GUIDANCE: &str = "Deliver your result with the `report` tool before you finish: \
call it once with an answer that stands on its own. The agent that started you shares your \
workspace but does not see your transcript, tool output or reasoning, so a closing remark such as \
\"done\" gives it nothing to use. Report earlier too whenever a partial finding changes what that \
agent should do next; reporting never ends your turn.";

/// Installs `report` in every continuable child, delivering as configured.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReportSetup {
    delivery: ReportDelivery,
}

impl ReportSetup {
    /// Reports delivered with `delivery`.
    pub fn new(delivery: ReportDelivery) -> Arc<Self> {
        Arc::new(ReportSetup { delivery })
    }
}

impl ContinuableSetup for ReportSetup {
    fn install(&self, runtime: &SubagentRuntime, _child: SessionId) -> Installed {
        Installed {
            tools: vec![Arc::new(ReportTool {
                runtime: runtime.clone(),
                delivery: self.delivery,
            })],
            ..Installed::default()
        }
    }
}

/// The `report` tool of one continuable child.
pub struct ReportTool {
    runtime: SubagentRuntime,
    delivery: ReportDelivery,
}

impl Tool for ReportTool {
    fn name(&self) -> &str {
        REPORT
    }

    fn description(&self) -> &str {
        "Sends content to the agent that started you. Call it once before you finish, with a \
         final result that stands on its own, and earlier for progress or findings that change \
         what that agent does next. It shares your workspace but does not see your transcript, \
         tool output or reasoning, so finishing your work is not a result by itself. Reporting \
         does not end your turn, and only your direct parent receives it. A failed call may \
         still have arrived, so do not repeat it blindly."
    }

    fn guidance(&self) -> Option<&str> {
        Some(REPORT_GUIDANCE)
    }

    fn input_schema(&self) -> Value {
        object_schema(
            json!({
                "output": {"type": "string", "description": "What your parent can act on: conclusions, and the shared paths they concern."},
            }),
            &["output"],
        )
    }

    fn call(&self, ctx: ToolContext, arguments: Value) -> BoxFuture<'_, ToolOutput> {
        answer(async move {
            let output = string_arg(&arguments, "output")?;
            let id = self
                .runtime
                .report(
                    &ctx.agent,
                    vec![ContentBlock::text(output)],
                    self.delivery,
                    &ctx.cancel,
                )
                .map_err(|error| refused(&error))?;
            Ok(ToolOutput::text(format!(
                "The agent that started you accepted the report as message {id}."
            )))
        })
    }
}
