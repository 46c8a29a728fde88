//! Activation and residency: starting a continuable child, making a child resident (created or
//! resumed from its log) and rolling back one that could not be published.

use lineage_agent::{AgentOptions, AgentSpec, Cancellation};
use lineage_log::{DescriptorMode, Message, MessageSource, Role, RunId, SubagentDescriptor};

use super::admission::live_lineage;
use super::*;
use crate::birth::{self, ChildPlan};
use crate::lifecycle::Lifecycle;
use crate::oneshot::cancelled_before_publication;
use crate::setup::{Installed, Installer};
use crate::{ContinuableCreate, ContinuableRequest, ContinuableStarted, Provider};

/// How an activation comes to be: the descriptor (provider name, persona, tool filter) and the
/// options the agent runs with, and for a new child how it is born; without a birth the child
/// is resumed from the store.
pub(super) struct ActivationPlan {
    pub(super) descriptor: SubagentDescriptor,
    pub(super) options: AgentOptions,
    pub(super) birth: Option<Birth>,
}

/// How a new continuable child is born, fixed when the start is asked for.
pub(super) struct Birth {
    depth: u32,
    fork_at: Option<u64>,
    policy: crate::DelegatedPolicy,
}

impl Birth {
    /// The creation of `child`, born this way, with `descriptor` and `spec`.
    fn plan(self, child: SessionId, descriptor: SubagentDescriptor, spec: AgentSpec) -> ChildPlan {
        ChildPlan {
            child,
            depth: self.depth,
            fork_at: self.fork_at,
            descriptor,
            policy: self.policy,
            spec,
        }
    }
}

impl Continuation {
    // ----- starting --------------------------------------------------------------------------------

    /// The synchronous part of a continuable start (see [`crate::SubagentRuntime::start_continuable`]):
    /// the checks in their order, then the provider's preparation. `provider` is the lookup of
    /// the provider named `provider_name`, refused in its turn.
    pub(super) fn prepare_continuable(
        &self,
        provider_name: &str,
        provider: Result<Arc<dyn Provider>, SubagentError>,
        request: &ContinuableRequest,
    ) -> Result<(SessionId, ActivationPlan), SubagentError> {
        let parent = &request.parent;
        self.assert_admitting(parent)?;
        birth::check_parent(&self.agents, parent)?;
        let child = request.child.unwrap_or_default();
        self.child_id_available(child)?;
        let depth = birth::child_depth(parent, request.max_depth)?;
        birth::check_tool_filter(request.tool_filter.as_ref(), "a continuable child")?;
        let options = birth::child_options(parent.options(), &request.agent_options, depth);
        let descriptor = SubagentDescriptor {
            label: Some(request.label.clone()),
            endpoint: options.endpoint.clone(),
            model: options.model.clone(),
            persona: request.persona.clone(),
            tool_filter: request.tool_filter.clone(),
            ..SubagentDescriptor::new(DescriptorMode::Continuable, provider_name)
        };
        let policy = birth::capture_policy(parent);
        let provider = provider?;
        let Some(prepare) = provider.continuable() else {
            return Err(SubagentError::new(
                ErrorCode::UnsupportedCapability,
                format!(
                    "subagent provider {provider_name:?} does not support continuable children"
                ),
            ));
        };
        let spec = prepare.prepare(&ContinuableCreate {
            child,
            parent: parent.clone(),
        })?;
        Ok((
            child,
            ActivationPlan {
                descriptor,
                options,
                birth: Some(Birth {
                    depth,
                    fork_at: spec.fork_at,
                    policy,
                }),
            },
        ))
    }

    /// The asynchronous part of a continuable start: under the child's lock, the checks again,
    /// then the child made resident with `installer`'s contributions and given its prompt.
    pub(super) async fn start(
        self: &Arc<Self>,
        child: SessionId,
        how: ActivationPlan,
        request: ContinuableRequest,
        installer: Installer<'_>,
    ) -> Result<ContinuableStarted, SubagentError> {
        let parent = request.parent.clone();
        let _guard = tokio::select! {
            guard = self.child_lock(child) => guard,
            _ = request.cancel.cancelled() => {
                return Err(cancelled_before_publication(parent.id()));
            }
        };
        if request.cancel.is_cancelled() {
            return Err(cancelled_before_publication(parent.id()));
        }
        self.assert_admitting(&parent)?;
        self.child_id_available(child)?;
        if request.child.is_some() {
            let store = self.agents.store().clone();
            let stored = tokio::task::spawn_blocking(move || store.info(child).is_ok())
                .await
                .unwrap_or(true);
            if stored {
                return Err(SubagentError::new(
                    ErrorCode::DuplicateChild,
                    format!("subagent {child} already exists"),
                ));
            }
        }
        if let Some(hooks) = &request.hooks {
            installer.remember_request_hooks(child, hooks.clone());
        }
        let activation = match self
            .activate(&parent, child, how, &request.cancel, installer)
            .await
        {
            Ok(activation) => activation,
            Err(error) => {
                installer.forget_request_hooks(child);
                return Err(error);
            }
        };
        let prompt = Message {
            id: MessageId::new(),
            role: Role::User,
            content: request.prompt,
            source: MessageSource::User,
        };
        let message = self
            .submit_to_new_activation(&activation, prompt, &parent, &request.cancel)
            .await?;
        Ok(ContinuableStarted { child, message })
    }

    /// Makes `child` resident: creates or resumes its agent with `installer`'s contributions
    /// installed, then, once nothing can refuse it any more, publishes the activation, takes the
    /// parent's ownership, emits `subagent/start` and starts watching for settlement.
    pub(super) async fn activate(
        self: &Arc<Self>,
        parent: &Arc<Agent>,
        child: SessionId,
        how: ActivationPlan,
        cancel: &Cancellation,
        installer: Installer<'_>,
    ) -> Result<Arc<Activation>, SubagentError> {
        self.assert_admitting(parent)?;
        let lineage = live_lineage(&self.agents, parent);
        let (settled_tx, settled_rx) = watch::channel(false);
        let ticket = {
            let mut st = lock(&self.state);
            let ticket = st.next_pending;
            st.next_pending += 1;
            st.pending.insert(
                ticket,
                PendingActivation {
                    lineage: lineage.clone(),
                    settled: settled_rx,
                },
            );
            ticket
        };
        // Untracked however this ends, the future dropped midway included, so a drain never
        // waits for an activation nobody is making any more.
        let _untrack = Untrack {
            manager: self,
            ticket,
            settled: settled_tx,
        };
        if cancel.is_cancelled() {
            return Err(cancelled_before_publication(parent.id()));
        }
        let Installed {
            tools,
            context,
            hooks,
        } = installer.install(child);
        let ActivationPlan {
            descriptor,
            options,
            birth: born,
        } = how;
        let provider = descriptor.provider.clone();
        let spec = AgentSpec {
            hooks,
            ..birth::child_spec(
                parent,
                options,
                descriptor.persona.clone(),
                descriptor.tool_filter.clone(),
                tools,
                context,
            )
        };
        let agent = match born {
            Some(born) => {
                let plan = born.plan(child, descriptor, spec);
                birth::create_child(&self.agents, parent, plan).await?
            }
            None => {
                let agent = self.agents.resume(child, spec).await.map_err(|e| {
                    SubagentError::new(
                        ErrorCode::NotResumable,
                        format!("subagent {child} is unavailable"),
                    )
                    .with_source(e)
                })?;
                // The crash that tore this child may have torn its own continuable children:
                // it hears of them before it runs again.
                // Boxed: recovering them may resume them, which recovers theirs.
                let recovered = Box::pin(self.recover_children(&agent, installer)).await;
                if let Err(error) = recovered {
                    agent.dispose().await;
                    return Err(error);
                }
                agent
            }
        };
        let mut ancestry = vec![Arc::downgrade(&agent)];
        ancestry.extend(lineage.iter().map(Arc::downgrade));
        let activation = Arc::new(Activation {
            run: RunInfo {
                run: RunId::new(),
                provider,
                child,
                parent: parent.id(),
                local: true,
            },
            boundary: agent.with_events(|events| events.len()),
            depth: agent.delegation_depth(),
            agent,
            ancestry,
            st: Mutex::new(ActivationState::default()),
            poke: watch::Sender::new(0),
        });
        self.publish(activation.clone());
        let published = if cancel.is_cancelled() {
            Err(cancelled_before_publication(parent.id()))
        } else {
            self.assert_admitting(parent)
                .and_then(|()| self.acquire_ownership(parent, child))
        };
        if let Err(error) = published {
            activation.rollback_unpublished(self).await;
            return Err(error);
        }
        self.listeners
            .emit(&Lifecycle::Start(activation.run.clone()));
        let (runtime, watcher) = (
            self.hold_runtime(),
            activation.clone().watch_settlement(self.clone()),
        );
        tokio::spawn(async move {
            let _runtime = runtime;
            watcher.await;
        });
        Ok(activation)
    }
}

impl Activation {
    /// Undoes an activation of `manager` that could not be published: no notice, no lifecycle
    /// edge.
    async fn rollback_unpublished(self: &Arc<Self>, manager: &Continuation) {
        let (tx, rx) = watch::channel(Some(Ok(())));
        lock(&self.st).disposal = Some(rx);
        self.agent.dispose().await;
        manager.forget(self);
        manager.release_ownership(self.child());
        drop(tx);
    }
}

/// Ends the tracking of an activation being made: removes its pending entry and tells the
/// drains waiting on it.
struct Untrack<'a> {
    manager: &'a Continuation,
    ticket: u64,
    settled: watch::Sender<bool>,
}

impl Drop for Untrack<'_> {
    fn drop(&mut self) {
        lock(&self.manager.state).pending.remove(&self.ticket);
        self.settled.send_replace(true);
    }
}
