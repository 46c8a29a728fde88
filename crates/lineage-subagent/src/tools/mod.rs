//! The model-facing tools of delegation: `subagent` (delegate), `send_message`,
//! `interrupt_agent`, `list_agents`, `job_output` and `job_kill` (one-shot background jobs), and
//! `report` (inside continuable children only).

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
