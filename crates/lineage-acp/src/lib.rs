//! Lineage over the Agent Client Protocol (ACP): JSON-RPC on a process's stdin and stdout, the
//! open standard editors and agents speak.
//!
//! Two directions:
//!
//! - [`serve`]: a Lineage host served as an ACP agent (what `lineage acp serve` runs). Each ACP
//!   session is a durable Lineage session, so `session/load` works after a restart.
//! - [`AcpProvider`]: a delegation provider whose one-shot children are any ACP agent command,
//!   each run a process of its own, torn down by a ladder that leaves none of its process group.
//!
//! The protocol crate is pinned to one exact version and none of its types appear in this
//! crate's API, so a new protocol version changes this crate only.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod provider;
mod serve;
mod wire;

pub use lineage_process::{DEFAULT_PASSTHROUGH, child_env, credential_shaped, group_alive};
pub use provider::{AcpProvider, AcpProviderConfig, PermissionPolicy};
pub use serve::{ServeError, ServeOptions, SessionSpec, serve};
