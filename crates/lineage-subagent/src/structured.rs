//! Structured results: a `structured_output` tool installed in one child, which checks the
//! child's answer against the request's schema and ends the turn once it holds.

use std::sync::{Arc, Mutex};

use lineage_agent::{BoxFuture, INVALID_ARGUMENTS, Tool, ToolContext, ToolOutput};

use crate::schema;

/// The capture tool's name.
pub const STRUCTURED_OUTPUT: &str = "structured_output";

/// The system-prompt guidance of a child that must answer with a structured result.
const STRUCTURED_GUIDANCE: &str = "Your answer is a structured result: when it is \
complete, call the `structured_output` tool once, with arguments that match its parameter \
schema exactly. A plain-text answer does not count as your result.";

/// The error code of a second call after a result was recorded.
pub const ALREADY_RECORDED: &str = "ALREADY_RECORDED";

/// The tool, and the value it captured.
pub(crate) struct StructuredOutput {
    schema: serde_json::Value,
    captured: Arc<Mutex<Option<serde_json::Value>>>,
}

impl StructuredOutput {
    /// A capture tool for `schema` (already checked), and where its value lands.
    pub(crate) fn new(
        schema: serde_json::Value,
    ) -> (Arc<Self>, Arc<Mutex<Option<serde_json::Value>>>) {
        let captured = Arc::new(Mutex::new(None));
        (
            Arc::new(StructuredOutput {
                schema,
                captured: captured.clone(),
            }),
            captured,
        )
    }
}

impl Tool for StructuredOutput {
    fn name(&self) -> &str {
        STRUCTURED_OUTPUT
    }

    fn description(&self) -> &str {
        "Records your final structured result. Call it exactly once, when the answer is complete, \
         with arguments that match the parameter schema exactly."
    }

    fn guidance(&self) -> Option<&str> {
        Some(STRUCTURED_GUIDANCE)
    }

    fn input_schema(&self) -> serde_json::Value {
        self.schema.clone()
    }

    fn call(&self, _: ToolContext, arguments: serde_json::Value) -> BoxFuture<'_, ToolOutput> {
        Box::pin(async move {
            let mut captured = crate::lock(&self.captured);
            if captured.is_some() {
                return ToolOutput::error(
                    "StructuredOutputError",
                    ALREADY_RECORDED,
                    "the structured result is already recorded and the run is complete; this \
                     call did nothing",
                );
            }
            match schema::validate(&self.schema, &arguments) {
                Ok(()) => {
                    *captured = Some(arguments);
                    ToolOutput::text("Structured result recorded.").concluding()
                }
                Err(reason) => ToolOutput::error(
                    "StructuredOutputError",
                    INVALID_ARGUMENTS,
                    format!(
                        "the arguments do not match the schema ({reason}); call again with \
                         arguments that do"
                    ),
                ),
            }
        })
    }
}
