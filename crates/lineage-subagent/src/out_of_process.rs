//! The provider every out-of-process agent shares: a configuration that names the agent,
//! describes it to the model and starts its runs, made a [`Provider`] once.

use std::fmt;
use std::sync::Arc;

use lineage_agent::BoxFuture;

use crate::tools::SubagentToolConfig;
use crate::{Provider, ResolvedStart, SubagentError, SubagentRun};

/// What an agent run in a process of its own is set up by (an ACP agent's, Codex's or Claude
/// Code's configuration). [`OutOfProcess`] makes it a one-shot [`Provider`] that supports no
/// start-time option and whose children never see the parent's conversation.
pub trait OutOfProcessAgent: fmt::Debug + Send + Sync + 'static {
    /// The provider's name, which delegations select it by.
    fn name(&self) -> &str;

    /// How its delegation tool describes the agent to the model.
    fn describe(&self) -> String;

    /// Starts a run of the agent. Called synchronously at delegation time, as
    /// [`Provider::start`] is: what it reads from the request before returning the future is the
    /// parent as it was then.
    fn start(
        config: Arc<Self>,
        request: ResolvedStart,
    ) -> BoxFuture<'static, Result<SubagentRun, SubagentError>>;
}

/// A one-shot provider whose children are processes that `C` starts.
#[derive(Debug)]
pub struct OutOfProcess<C> {
    config: Arc<C>,
}

impl<C> Clone for OutOfProcess<C> {
    fn clone(&self) -> Self {
        OutOfProcess {
            config: self.config.clone(),
        }
    }
}

impl<C: OutOfProcessAgent> OutOfProcess<C> {
    /// A provider set up by `config`.
    pub fn new(config: C) -> Self {
        OutOfProcess {
            config: Arc::new(config),
        }
    }

    /// The delegation tool row for this provider: a one-shot tool named `tool_name`, its depth
    /// left to the agent, described as [`OutOfProcessAgent::describe`] says.
    pub fn tool_row(&self, tool_name: impl Into<String>) -> SubagentToolConfig {
        SubagentToolConfig::out_of_process(self.config.name(), tool_name, self.config.describe())
    }
}

impl<C: OutOfProcessAgent> Provider for OutOfProcess<C> {
    fn name(&self) -> &str {
        self.config.name()
    }

    fn start(
        &self,
        request: ResolvedStart,
    ) -> BoxFuture<'static, Result<SubagentRun, SubagentError>> {
        C::start(self.config.clone(), request)
    }
}
