//! Child agent processes: what every out-of-process delegation (an ACP agent, Codex, Claude
//! Code) needs from the operating system.
//!
//! - [`AgentProcess`]: a child spawned in a process group of its own, with an allow-listed
//!   environment ([`child_env`]: credential-shaped names never pass through), piped stdio and
//!   the newest bytes of its stderr kept for diagnostics; torn down by a ladder (stdin closed,
//!   SIGTERM, SIGKILL) that returns only once no process of the group is left.
//! - [`FrameReader`]: newline-delimited JSON frames read from a child's stdout, bounded in size.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod child;
mod frames;

pub use child::{
    AgentProcess, DEFAULT_PASSTHROUGH, Ladder, Launch, STDERR_TAIL_BYTES, StderrTail, child_env,
    credential_shaped, failure_report, group_alive,
};
pub use frames::{FrameReader, MAX_FRAME_BYTES, Malformed, SharedWriter, write_frame};
