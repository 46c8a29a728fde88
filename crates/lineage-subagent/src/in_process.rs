//! The two in-process providers: `spawn` (a fresh child) and `fork` (a child seeded with the
//! parent's completed turns, never the turn in flight).

use lineage_agent::BoxFuture;

use crate::contract::completed_boundary;
use crate::oneshot::start_in_process;
use crate::{
    Capabilities, ContinuableCreate, ContinuableSpec, PrepareContinuable, Provider, ResolvedStart,
    SubagentError, SubagentRun,
};

/// Starts children that do not see the parent's conversation: they get a self-contained task.
#[derive(Clone, Debug)]
pub struct SpawnProvider {
    name: String,
}

impl SpawnProvider {
    /// The provider's default name.
    pub const NAME: &'static str = "spawn";

    /// A spawn provider named `spawn`.
    pub fn new() -> Self {
        Self::named(Self::NAME)
    }

    /// A spawn provider registered under `name`.
    pub fn named(name: impl Into<String>) -> Self {
        SpawnProvider { name: name.into() }
    }
}

impl Default for SpawnProvider {
    fn default() -> Self {
        Self::new()
    }
}

impl Provider for SpawnProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    fn start(
        &self,
        request: ResolvedStart,
    ) -> BoxFuture<'static, Result<SubagentRun, SubagentError>> {
        start_in_process(request, None)
    }

    fn continuable(&self) -> Option<&dyn PrepareContinuable> {
        Some(self)
    }
}

impl PrepareContinuable for SpawnProvider {
    fn prepare(&self, _: &ContinuableCreate) -> Result<ContinuableSpec, SubagentError> {
        Ok(ContinuableSpec { fork_at: None })
    }
}

/// Starts children seeded with the parent's completed turns (up to its last `turn/end`, read
/// when the delegation is asked for). A parent with no completed turn forks like a spawn.
#[derive(Clone, Debug)]
pub struct ForkProvider {
    name: String,
}

impl ForkProvider {
    /// The provider's default name.
    pub const NAME: &'static str = "fork";

    /// A fork provider named `fork`.
    pub fn new() -> Self {
        Self::named(Self::NAME)
    }

    /// A fork provider registered under `name`.
    pub fn named(name: impl Into<String>) -> Self {
        ForkProvider { name: name.into() }
    }
}

impl Default for ForkProvider {
    fn default() -> Self {
        Self::new()
    }
}

impl Provider for ForkProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    fn inherits_parent_context(&self) -> bool {
        true
    }

    fn start(
        &self,
        request: ResolvedStart,
    ) -> BoxFuture<'static, Result<SubagentRun, SubagentError>> {
        let fork_at = request.request.parent.with_events(completed_boundary);
        start_in_process(request, fork_at)
    }

    fn continuable(&self) -> Option<&dyn PrepareContinuable> {
        Some(self)
    }
}

impl PrepareContinuable for ForkProvider {
    fn prepare(&self, request: &ContinuableCreate) -> Result<ContinuableSpec, SubagentError> {
        Ok(ContinuableSpec {
            fork_at: request.parent.with_events(completed_boundary),
        })
    }
}
