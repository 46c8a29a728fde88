//! What the two agent hosts of this command (`lineage demo` and `lineage chat`) share: one
//! process's runtime over a store (agents, delegation, providers), the root's delegation tools,
//! the test of quiet, the shutdown, and the words for a child's messages.

use std::path::Path;
use std::sync::Arc;

use lineage_agent::{Agent, AgentStatus, Agents, Model, Tool};
use lineage_log::{ContentBlock, Message, MessageSource};
use lineage_store::Store;
use lineage_subagent::tools::{
    InterruptAgentTool, ListAgentsTool, ReportSetup, SendMessageTool, SubagentTool,
    SubagentToolConfig,
};
use lineage_subagent::{ForkProvider, ReportDelivery, SpawnProvider, SubagentRuntime};

/// One process's worth of runtime: the store, the agents, delegation.
pub struct Host {
    /// The store, open for writing.
    pub store: Store,
    /// Every live agent of this process.
    pub agents: Agents,
    /// Delegation: providers, continuable children, the settlement notices.
    pub subagents: SubagentRuntime,
}

impl Host {
    /// Opens (or creates) the store at `path` with `model` answering every agent. With
    /// `with_providers`, `spawn` and `fork` are registered, so agents can start children;
    /// without, stored continuable children can still be resumed from their logs alone.
    /// Every continuable child gets the `report` tool.
    pub fn open(path: &Path, model: Arc<dyn Model>, with_providers: bool) -> Result<Host, String> {
        let store = Store::open(path).map_err(|e| format!("opening the store: {e}"))?;
        let agents = Agents::new(store.clone(), model);
        let subagents = SubagentRuntime::new(agents.clone());
        subagents.register_continuable_setup(ReportSetup::new(ReportDelivery::NextStep));
        if with_providers {
            for provider in [
                Arc::new(SpawnProvider::new()) as Arc<dyn lineage_subagent::Provider>,
                Arc::new(ForkProvider::new()),
            ] {
                subagents
                    .register_provider(provider)
                    .map_err(|e| format!("registering a provider: {e}"))?;
            }
        }
        Ok(Host {
            store,
            agents,
            subagents,
        })
    }

    /// The delegation tools of a root agent: one `subagent`-like tool per config (a config this
    /// runtime cannot serve is left out, with a warning), then `send_message`,
    /// `interrupt_agent` and `list_agents`.
    pub fn delegation_tools(&self, configs: Vec<SubagentToolConfig>) -> Vec<Arc<dyn Tool>> {
        let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
        for config in configs {
            match SubagentTool::new(&self.subagents, config) {
                Ok(tool) => tools.push(tool),
                Err(error) => tracing::warn!(%error, "a delegation tool was not set up"),
            }
        }
        tools.push(SendMessageTool::new(&self.subagents));
        tools.push(InterruptAgentTool::new(&self.subagents));
        tools.push(ListAgentsTool::new(&self.subagents));
        tools
    }

    /// Whether `root` and every resident child are quiet: no child resident, and the root idle
    /// with nothing pending (or, when `parked_ok`, with input it holds for its next wake: an idle
    /// agent with pending input has parked it, since a waking send starts a turn at once), its
    /// log unchanged while this looked.
    ///
    /// The order matters. A child's activation is forgotten before its notice is sent to its
    /// parent, so once no child is resident every notice is already in the root's inbox; and a
    /// child can only be started by a root turn, which appends to the root's log. The log's
    /// length read first and again last catches a root turn that started a child (or a notice
    /// spliced into its inbox) between the two reads of state.
    pub fn is_quiet(&self, root: &Agent, parked_ok: bool) -> bool {
        let before = root.with_events(<[_]>::len);
        let quiet = self.subagents.resident().is_empty()
            && root.status() == AgentStatus::Idle
            && (parked_ok || !root.has_pending());
        quiet && root.with_events(<[_]>::len) == before
    }

    /// Tears down every resident child and agent and closes the store (its last flush).
    pub async fn close(self) -> Result<(), String> {
        let drained = self
            .subagents
            .drain()
            .await
            .map_err(|e| format!("draining the subagents: {e}"));
        // Agents are disposed of and the store flushed even when the drain failed.
        self.agents.dispose_all().await;
        drop(self.subagents);
        drop(self.agents);
        let closed = self
            .store
            .close()
            .map_err(|e| format!("closing the store: {e}"));
        drained.and(closed)
    }
}

/// What a child's message arriving in its parent's inbox says, for people: `report in: …` for
/// a report, `notice in: …` for a settlement notice; `None` for any other message.
pub fn child_message_line(message: &Message) -> Option<String> {
    match &message.source {
        MessageSource::SubagentReport { .. } => {
            let text: Vec<String> = message
                .content
                .iter()
                .filter_map(|b| match b {
                    ContentBlock::Text { text } => Some(text.to_string()),
                    _ => None,
                })
                .collect();
            Some(format!("report in: {}", one_line(&text.join(" "))))
        }
        MessageSource::SubagentSettled { summary, .. } => Some(format!("notice in: {summary}")),
        _ => None,
    }
}

/// The text of a tool result message (the texts inside its result blocks).
pub fn result_text(message: &Message) -> String {
    message
        .content
        .iter()
        .flat_map(|b| match b {
            ContentBlock::ToolResult { content, .. } => content.clone(),
            other => vec![other.clone()],
        })
        .filter_map(|b| match b {
            ContentBlock::Text { text } => Some(text.to_string()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `text` on one line, cut to a readable length.
pub fn one_line(text: &str) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > 110 {
        let mut cut: String = flat.chars().take(109).collect();
        cut.push('…');
        cut
    } else {
        flat
    }
}
