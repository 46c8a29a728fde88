//! The model-facing tools of delegation.

mod subagent;

pub use subagent::{MaxDepth, SubagentTool, SubagentToolConfig};
