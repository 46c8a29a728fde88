//! Activation and residency: starting a continuable child, making a child resident (created or
//! resumed from its log) and rolling back one that could not be published.

use std::future::Future;

use lineage_agent::{AgentOptions, AgentSpec, Cancellation};
use lineage_log::{DescriptorMode, Message, MessageSource, Role, RunId, SubagentDescriptor};

use super::*;
use crate::birth::{self, ChildPlan};
use crate::lifecycle::Lifecycle;
use crate::oneshot::cancelled_before_publication;
use crate::setup::Installed;
use crate::{ContinuableCreate, ContinuableRequest, ContinuableStarted};

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

impl SubagentRuntime {
    // ----- starting --------------------------------------------------------------------------------

    /// Starts a continuable child of `request.parent` with the provider `provider` and gives it
    /// its first prompt. Resolves as soon as the child's inbox has accepted the prompt (before
    /// its turn starts), with the child's id and the prompt's id.
    ///
    /// Checked now, before anything awaits: admission (`DRAINING`), the parent is live
    /// (`PARENT_UNAVAILABLE`), the id is free (`DUPLICATE_CHILD`), the depth
    /// (`DEPTH_EXCEEDED`), the tool filter names something (`INVALID_REQUEST`), the provider is
    /// registered (`NO_PROVIDER`) and can prepare continuable children
    /// (`UNSUPPORTED_CAPABILITY`). The parent's policy and the fork point are captured now too.
    /// Every failure before the prompt is accepted leaves no activation, no live child and no
    /// ownership; the cancellation covers only that part.
    ///
    /// Cancel safety: the checks above run when this is called, not when the future is first
    /// polled. Fire `request.cancel` to give up before the prompt is accepted; dropping the future
    /// instead may leave a child created and resident without its prompt, which then settles at once
    /// (`completed`, no notice: it was never announced).
    pub fn start_continuable(
        &self,
        provider: &str,
        request: ContinuableRequest,
    ) -> impl Future<Output = Result<ContinuableStarted, SubagentError>> + Send + 'static {
        let prepared = self.prepare_continuable(provider, &request);
        let runtime = self.clone();
        async move {
            let (child, how) = prepared?;
            let parent = request.parent.clone();
            let _guard = tokio::select! {
                guard = runtime.child_lock(child) => guard,
                _ = request.cancel.cancelled() => {
                    return Err(cancelled_before_publication(parent.id()));
                }
            };
            if request.cancel.is_cancelled() {
                return Err(cancelled_before_publication(parent.id()));
            }
            runtime.continuation().assert_admitting(&parent)?;
            runtime.continuation().child_id_available(child)?;
            if request.child.is_some() {
                let store = runtime.agents().store().clone();
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
                runtime.remember_request_hooks(child, hooks.clone());
            }
            let activation = match runtime.activate(&parent, child, how, &request.cancel).await {
                Ok(activation) => activation,
                Err(error) => {
                    runtime.forget_request_hooks(child);
                    return Err(error);
                }
            };
            let prompt = Message {
                id: MessageId::new(),
                role: Role::User,
                content: request.prompt,
                source: MessageSource::User,
            };
            let message = runtime
                .submit_to_new_activation(&activation, prompt, &parent, &request.cancel)
                .await?;
            Ok(ContinuableStarted { child, message })
        }
    }

    /// The synchronous part of a continuable start.
    pub(super) fn prepare_continuable(
        &self,
        provider_name: &str,
        request: &ContinuableRequest,
    ) -> Result<(SessionId, ActivationPlan), SubagentError> {
        let parent = &request.parent;
        self.continuation().assert_admitting(parent)?;
        birth::check_parent(self.agents(), parent)?;
        let child = request.child.unwrap_or_default();
        self.continuation().child_id_available(child)?;
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
        let provider = self.expect_provider(provider_name)?;
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

    /// Makes `child` resident: creates or resumes its agent with the setup contributions
    /// installed, then, once nothing can refuse it any more, publishes the activation, takes the
    /// parent's ownership, emits `subagent/start` and starts watching for settlement.
    pub(super) async fn activate(
        &self,
        parent: &Arc<Agent>,
        child: SessionId,
        how: ActivationPlan,
        cancel: &Cancellation,
    ) -> Result<Arc<Activation>, SubagentError> {
        self.continuation().assert_admitting(parent)?;
        let lineage = self.continuation().live_lineage(parent);
        let (settled_tx, settled_rx) = watch::channel(false);
        let ticket = {
            let mut st = lock(&self.continuation().state);
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
            runtime: self,
            ticket,
            settled: settled_tx,
        };
        self.activate_tracked(parent, child, how, lineage, cancel)
            .await
    }

    pub(super) async fn activate_tracked(
        &self,
        parent: &Arc<Agent>,
        child: SessionId,
        how: ActivationPlan,
        lineage: Vec<Arc<Agent>>,
        cancel: &Cancellation,
    ) -> Result<Arc<Activation>, SubagentError> {
        if cancel.is_cancelled() {
            return Err(cancelled_before_publication(parent.id()));
        }
        let Installed {
            tools,
            context,
            hooks,
        } = self.install_setups(child);
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
            Some(Birth {
                depth,
                fork_at,
                policy,
            }) => {
                let plan = ChildPlan {
                    child,
                    depth,
                    fork_at,
                    descriptor,
                    policy,
                    spec,
                };
                birth::create_child(self.agents(), parent, plan).await?
            }
            None => {
                let agent = self.agents().resume(child, spec).await.map_err(|e| {
                    SubagentError::new(
                        ErrorCode::NotResumable,
                        format!("subagent {child} is unavailable"),
                    )
                    .with_source(e)
                })?;
                // The crash that tore this child may have torn its own continuable children:
                // it hears of them before it runs again.
                if let Err(error) = self.recover_children(&agent).await {
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
        self.continuation().publish(activation.clone());
        let published = if cancel.is_cancelled() {
            Err(cancelled_before_publication(parent.id()))
        } else {
            self.continuation()
                .assert_admitting(parent)
                .and_then(|()| self.continuation().acquire_ownership(parent, child))
        };
        if let Err(error) = published {
            self.rollback_unpublished(&activation).await;
            return Err(error);
        }
        self.emit(&Lifecycle::Start(activation.run.clone()));
        tokio::spawn(self.clone().watch_settlement(activation.clone()));
        Ok(activation)
    }

    /// Undoes an activation that could not be published: no notice, no lifecycle edge.
    pub(super) async fn rollback_unpublished(&self, activation: &Arc<Activation>) {
        let (tx, rx) = watch::channel(Some(Ok(())));
        lock(&activation.st).disposal = Some(rx);
        activation.agent.dispose().await;
        self.continuation().forget(activation);
        self.continuation().release_ownership(activation.child());
        drop(tx);
    }
}

/// Ends the tracking of an activation being made: removes its pending entry and tells the
/// drains waiting on it.
struct Untrack<'a> {
    runtime: &'a SubagentRuntime,
    ticket: u64,
    settled: watch::Sender<bool>,
}

impl Drop for Untrack<'_> {
    fn drop(&mut self) {
        lock(&self.runtime.continuation().state)
            .pending
            .remove(&self.ticket);
        self.settled.send_replace(true);
    }
}
