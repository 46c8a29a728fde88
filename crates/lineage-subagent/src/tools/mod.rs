//! The model-facing tools of delegation: `subagent` (delegate), `send_message`,
//! `interrupt_agent`, `list_agents`, and `report` (inside continuable children only).

mod control;
mod report;
mod subagent;

pub use control::{
    INTERRUPT_AGENT, InterruptAgentTool, LIST_AGENTS, ListAgentsTool, SEND_MESSAGE, SendMessageTool,
};
pub use report::{REPORT, REPORT_GUIDANCE, ReportSetup, ReportTool};
pub use subagent::{BackgroundMode, MaxDepth, SubagentTool, SubagentToolConfig};
