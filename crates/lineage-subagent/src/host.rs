//! [`Host`]: one process's runtime over a store in one value (the agents, delegation with the
//! `spawn` and `fork` providers), a prompt run to completion, and the shutdown in its order.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use lineage_agent::{Agent, AgentError, AgentSpec, AgentStatus, Agents, Model, Queued, Tool};
use lineage_log::{
    AbortCause, Event, EventBody, Message, MessageSource, SessionId, Text, TurnEndReason, Usage,
};
use lineage_store::{Store, StoreError};
use tokio::sync::watch;

use crate::tools::{
    BackgroundMode, InterruptAgentTool, JobKillTool, JobOutputTool, ListAgentsTool, ReportSetup,
    SendMessageTool, SubagentTool, SubagentToolConfig,
};
use crate::{
    Authority, ForkProvider, ListenerId, Provider, ReportDelivery, SpawnProvider, SubagentError,
    SubagentRuntime,
};

/// One process's worth of runtime: the store, its agents, and delegation.
///
/// A host makes its root agents through [`Host::agents`], hands each prompt to
/// [`Host::run`], which returns once the root and every child in its delegation tree are
/// quiet, and ends with [`Host::close`].
pub struct Host {
    /// The store, open for writing.
    pub store: Store,
    /// Every live agent of this process.
    pub agents: Agents,
    /// Delegation: providers, continuable children, their settlement notices.
    pub subagents: SubagentRuntime,
    /// Bumped at every delegation's start and end, so a run looks at its tree again.
    lifecycle: watch::Receiver<u64>,
    listener: ListenerId,
    /// On a shared store, the task delivering mail from other hosts
    /// ([`SubagentRuntime::serve_mail`]); stopped with the host.
    mail: Option<MailServer>,
}

/// Stops the mail task when dropped.
struct MailServer(tokio::task::JoinHandle<()>);

impl Drop for MailServer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What went wrong in a host operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// The store refused to open or close.
    #[error("{action} the store: {source}")]
    Store {
        /// `opening` or `closing`.
        action: &'static str,
        /// Why.
        source: StoreError,
    },
    /// The root agent refused the prompt.
    #[error("sending the prompt to agent {agent}: {source}")]
    Send {
        /// The root agent.
        agent: SessionId,
        /// Why.
        source: AgentError,
    },
    /// The agent could not be resumed.
    #[error("resuming agent {agent}: {source}")]
    Resume {
        /// The agent.
        agent: SessionId,
        /// Why.
        source: AgentError,
    },
    /// The root agent was disposed of before its run was quiet.
    #[error("agent {agent} was disposed of before its run ended")]
    Disposed {
        /// The root agent.
        agent: SessionId,
    },
    /// Delegation failed: registering a provider, or draining the children at shutdown.
    #[error(transparent)]
    Subagent(#[from] SubagentError),
}

/// What a [`Host::run`] left: the root's answer, why its last turn ended, and what it spent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The root agent.
    pub session: SessionId,
    /// The root's last assistant message with content in this run, if any.
    pub output: Option<Message>,
    /// How the root's last turn in this run ended (`None` when no turn ran, as when a stop
    /// came before the prompt was claimed).
    pub stop_reason: Option<TurnEndReason>,
    /// The root's turns in this run.
    pub turns: u32,
    /// Token usage summed over the root's model calls in this run (its children's are in
    /// their own sessions).
    pub usage: Usage,
    /// Whether the run was stopped ([`Host::run_until`]) before it was quiet by itself.
    pub stopped: bool,
}

impl Outcome {
    /// The text of [`Outcome::output`], or an empty string.
    pub fn text(&self) -> String {
        self.output.as_ref().map(Message::text).unwrap_or_default()
    }

    /// Whether the root's last turn completed.
    pub fn completed(&self) -> bool {
        self.stop_reason == Some(TurnEndReason::Completed)
    }

    /// The outcome of `session`'s events from `start` on.
    fn of(session: SessionId, events: &[Event], stopped: bool) -> Outcome {
        let mut outcome = Outcome {
            session,
            output: None,
            stop_reason: None,
            turns: 0,
            usage: Usage::default(),
            stopped,
        };
        for event in events {
            match &event.body {
                EventBody::AssistantMessage(m) => {
                    if !m.message.content.is_empty() {
                        outcome.output = Some(m.message.clone());
                    }
                    if let Some(usage) = &m.usage {
                        outcome.usage.input_tokens += usage.input_tokens;
                        outcome.usage.output_tokens += usage.output_tokens;
                        if let Some(cached) = usage.cache_read_tokens {
                            *outcome.usage.cache_read_tokens.get_or_insert(0) += cached;
                        }
                    }
                }
                EventBody::TurnEnd(end) => {
                    outcome.turns += 1;
                    outcome.stop_reason = Some(end.reason.clone());
                }
                _ => {}
            }
        }
        outcome
    }
}

impl Host {
    /// A host over `store` with `model` answering every agent, the `spawn` and `fork`
    /// providers registered and the `report` tool given to every continuable child (its
    /// reports reach the parent at its next step). On a shared store, made inside a tokio
    /// runtime, it also serves the mail other hosts send its agents
    /// ([`SubagentRuntime::serve_mail`]) until it is closed or dropped.
    pub fn new(store: Store, model: Arc<dyn Model>) -> Result<Host, HostError> {
        let host = Host::without_providers(store, model);
        for provider in [
            Arc::new(SpawnProvider::new()) as Arc<dyn Provider>,
            Arc::new(ForkProvider::new()),
        ] {
            host.subagents.register_provider(provider)?;
        }
        Ok(host)
    }

    /// Like [`Host::new`] with no provider registered: agents cannot start children, and the
    /// stored continuable children can still be resumed from their logs alone.
    pub fn without_providers(store: Store, model: Arc<dyn Model>) -> Host {
        let agents = Agents::new(store.clone(), model);
        let subagents = SubagentRuntime::new(agents.clone());
        subagents.register_continuable_setup(ReportSetup::new(ReportDelivery::NextStep));
        let (bump, lifecycle) = watch::channel(0u64);
        let listener = subagents.on_lifecycle(move |_| {
            bump.send_modify(|n| *n = n.wrapping_add(1));
            Ok(())
        });
        let mail = subagents.serve_mail().map(MailServer);
        Host {
            store,
            agents,
            subagents,
            lifecycle,
            listener,
            mail,
        }
    }

    /// Opens (or creates) the store at `path` and makes a [`Host::new`] over it.
    pub fn open(path: &Path, model: Arc<dyn Model>) -> Result<Host, HostError> {
        let store = Store::open(path).map_err(|source| HostError::Store {
            action: "opening",
            source,
        })?;
        Host::new(store, model)
    }

    /// Resumes the stored agent `id` with `spec` (see [`Agents::resume`]) and tells it about
    /// each continuable child of its that a crash stopped mid-turn
    /// ([`SubagentRuntime::recover_children`]): the notices wait for its next turn.
    pub async fn resume(&self, id: SessionId, spec: AgentSpec) -> Result<Arc<Agent>, HostError> {
        let agent = self
            .agents
            .resume(id, spec)
            .await
            .map_err(|source| HostError::Resume { agent: id, source })?;
        self.subagents.recover_children(&agent).await?;
        Ok(agent)
    }

    /// The delegation tools of a root agent: one `subagent`-like tool per config (a config
    /// this runtime cannot serve is left out, with a warning), then `send_message`,
    /// `interrupt_agent` and `list_agents`, and `job_output` and `job_kill` when a one-shot
    /// config may run in the background.
    pub fn delegation_tools(&self, configs: Vec<SubagentToolConfig>) -> Vec<Arc<dyn Tool>> {
        let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
        let jobs = configs
            .iter()
            .any(|c| c.background == BackgroundMode::OneShot && c.run_in_background);
        for config in configs {
            match SubagentTool::new(&self.subagents, config) {
                Ok(tool) => tools.push(tool),
                Err(error) => tracing::warn!(%error, "a delegation tool was not set up"),
            }
        }
        tools.push(SendMessageTool::new(&self.subagents));
        tools.push(InterruptAgentTool::new(&self.subagents));
        tools.push(ListAgentsTool::new(&self.subagents));
        if jobs {
            tools.push(JobOutputTool::new(&self.subagents));
            tools.push(JobKillTool::new(&self.subagents));
        }
        tools
    }

    /// Sends `prompt` to `root` as the user and waits until `root` and every child in its
    /// delegation tree are quiet (see [`Host::is_quiet`]): the root idle, no child resident. The
    /// outcome covers the root's events from the prompt on, so `root` should be idle when
    /// this is called.
    pub async fn run(
        &self,
        root: &Arc<Agent>,
        prompt: impl Into<Text>,
    ) -> Result<Outcome, HostError> {
        self.run_until(
            root,
            Message::user_text(prompt, MessageSource::User),
            std::future::pending(),
        )
        .await
    }

    /// Like [`Host::run`] with any message, stopped when `stop` completes first: the root's
    /// turn is cancelled (what is queued stays parked for its next wake) and every resident
    /// child in its tree is interrupted; a turn a child's notice starts after that is
    /// cancelled too. It returns once the tree is quiet again, with [`Outcome::stopped`] set
    /// and every log balanced. The notices the stop left parked reach the root with its next
    /// prompt.
    pub async fn run_until(
        &self,
        root: &Arc<Agent>,
        message: Message,
        stop: impl Future<Output = ()>,
    ) -> Result<Outcome, HostError> {
        let start = root.with_events(<[_]>::len);
        let mut changes = root.changes();
        let mut lifecycle = self.lifecycle.clone();
        root.followup(message).map_err(|source| HostError::Send {
            agent: root.id(),
            source,
        })?;
        tokio::pin!(stop);
        let mut stopped = false;
        loop {
            // Marked seen before the state is read: a change after this wakes the wait below.
            changes.borrow_and_update();
            lifecycle.borrow_and_update();
            if self.is_quiet(root) {
                break;
            }
            if stopped && root.status() == AgentStatus::Running {
                self.stop(root);
            }
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        return Err(HostError::Disposed { agent: root.id() });
                    }
                }
                _ = lifecycle.changed() => {}
                () = &mut stop, if !stopped => {
                    stopped = true;
                    self.stop(root);
                }
            }
        }
        Ok(root.with_events(|events| Outcome::of(root.id(), &events[start..], stopped)))
    }

    /// Cancels `root`'s turn, keeping what is queued, and interrupts every resident child
    /// below it. Best effort: what was already over refuses, and that is fine.
    pub fn stop(&self, root: &Arc<Agent>) {
        let _ = root.cancel(AbortCause::User, Queued::Keep);
        let authority = Authority::Ancestor(root.clone());
        for child in self.subagents.resident() {
            let _ = self.subagents.interrupt(child, &authority);
        }
    }

    /// Whether `root` and its delegation tree are quiet: no child in it resident, no background
    /// job of the root running (a job's end reaches the root as a message, which wakes it), and
    /// the root idle, its log unchanged while this looked. Input an idle root holds is parked (a waking
    /// send to an idle agent starts its turn before it returns), so it waits for the root's next
    /// wake and is no work in flight: what a stop, a failed pre-step hook or a reached budget
    /// gave back.
    ///
    /// The order matters. A child's activation is forgotten before its notice is sent to its
    /// parent, so once no child is resident every notice is already in the root's inbox; and a
    /// child can only be started by a root turn, which appends to the root's log. The log's
    /// length read first and again last catches a root turn that started a child (or a notice
    /// spliced into its inbox) between the two reads of state.
    pub fn is_quiet(&self, root: &Arc<Agent>) -> bool {
        let before = root.with_events(<[_]>::len);
        let quiet = !self.subagents.has_resident_under(root)
            && !self.subagents.has_running_jobs(root.id())
            && root.status() == AgentStatus::Idle;
        quiet && root.with_events(<[_]>::len) == before
    }

    /// Shuts the host down in order: every resident child torn down (children first, each
    /// parent told), then every agent shut down (its pending input, those notices included,
    /// kept queued for the next resume; each one's final flush), then the store closed (its
    /// last flush). Agents are shut down and the store closed even when the drain failed; the
    /// first failure is returned.
    pub async fn close(self) -> Result<(), HostError> {
        let drained = self.subagents.drain().await.map_err(HostError::from);
        drop(self.mail);
        self.agents.shut_down_all().await;
        self.subagents.remove_listener(self.listener);
        drop(self.subagents);
        drop(self.agents);
        let closed = self.store.close().map_err(|source| HostError::Store {
            action: "closing",
            source,
        });
        drained.and(closed)
    }
}
