//! [`SubagentRuntime`]: the provider registry, the validated `start`, and lifecycle listeners.

use std::future::Future;
use std::sync::{Arc, Mutex, Weak};

use lineage_agent::{Agents, Cancellation};
use lineage_log::{DescriptorMode, RunId, SessionId, SubagentDescriptor};

use crate::continuation::Continuation;
use crate::jobs::{JobId, JobOutcome, Jobs};
use crate::lifecycle::{Lifecycle, ListenerError, ListenerId, Listeners, RunInfo};
use crate::setup::Setups;
use crate::{
    Capability, ErrorCode, Provider, ResolvedStart, StartRequest, StopReason, SubagentError,
    SubagentRun, birth, lock, schema,
};

/// Something that mounts with a provider (the delegation tool) and may refuse one it cannot work
/// with: registering that provider then fails.
pub(crate) trait Mount: Send + Sync {
    /// The provider it mounts with.
    fn provider_name(&self) -> &str;
    /// Whether it can work with `provider`.
    fn check(&self, provider: &dyn Provider) -> Result<(), SubagentError>;
}

struct Inner {
    agents: Agents,
    continuation: Arc<Continuation>,
    setups: Setups,
    /// In registration order.
    providers: Mutex<Vec<Arc<dyn Provider>>>,
    listeners: Arc<Listeners>,
    mounts: Mutex<Vec<Weak<dyn Mount>>>,
    jobs: Jobs,
}

/// Delegation for the agents of one registry: named providers create children for parents.
/// Clones share the runtime.
#[derive(Clone)]
pub struct SubagentRuntime {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SubagentRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubagentRuntime")
            .field("providers", &self.providers())
            .finish_non_exhaustive()
    }
}

impl SubagentRuntime {
    /// A runtime whose children live in `agents`, with no provider registered.
    pub fn new(agents: Agents) -> Self {
        let listeners = Arc::new(Listeners::default());
        SubagentRuntime {
            inner: Arc::new_cyclic(|inner: &Weak<Inner>| Inner {
                continuation: Arc::new(Continuation::new(
                    agents.clone(),
                    listeners.clone(),
                    inner.clone(),
                )),
                agents,
                setups: Setups::default(),
                providers: Mutex::new(Vec::new()),
                listeners,
                mounts: Mutex::new(Vec::new()),
                jobs: Jobs::default(),
            }),
        }
    }

    /// The registry parents and children live in.
    pub fn agents(&self) -> &Agents {
        &self.inner.agents
    }

    pub(crate) fn continuation(&self) -> &Arc<Continuation> {
        &self.inner.continuation
    }

    pub(crate) fn setups(&self) -> &Setups {
        &self.inner.setups
    }

    /// Registers `provider`. Refused when its name is taken (`DUPLICATE_PROVIDER`) or when a
    /// delegation tool configured for that name cannot work with it; a refusal registers
    /// nothing.
    pub fn register_provider(&self, provider: Arc<dyn Provider>) -> Result<(), SubagentError> {
        let name = provider.name().to_owned();
        let mut providers = lock(&self.inner.providers);
        if providers.iter().any(|p| p.name() == name) {
            return Err(SubagentError::new(
                ErrorCode::DuplicateProvider,
                format!("a subagent provider named {name:?} is already registered"),
            ));
        }
        for mount in self.mounts() {
            if mount.provider_name() == name {
                mount.check(provider.as_ref())?;
            }
        }
        providers.push(provider);
        Ok(())
    }

    /// Removes the provider `name`, returning it. Runs it started keep going; new starts naming
    /// it are refused (`NO_PROVIDER`) and tools bound to it unmount.
    pub fn remove_provider(&self, name: &str) -> Option<Arc<dyn Provider>> {
        let mut providers = lock(&self.inner.providers);
        let at = providers.iter().position(|p| p.name() == name)?;
        Some(providers.remove(at))
    }

    /// The provider `name`, if registered.
    pub fn provider(&self, name: &str) -> Option<Arc<dyn Provider>> {
        lock(&self.inner.providers)
            .iter()
            .find(|p| p.name() == name)
            .cloned()
    }

    /// The registered providers' names, in registration order.
    pub fn providers(&self) -> Vec<String> {
        lock(&self.inner.providers)
            .iter()
            .map(|p| p.name().to_owned())
            .collect()
    }

    /// The provider `name`, or `NO_PROVIDER`.
    pub(crate) fn expect_provider(&self, name: &str) -> Result<Arc<dyn Provider>, SubagentError> {
        self.provider(name).ok_or_else(|| {
            SubagentError::new(
                ErrorCode::NoProvider,
                format!("no subagent provider is registered as {name:?}"),
            )
        })
    }

    /// Adds a lifecycle listener. It sees every delegation of this runtime; filter on
    /// [`RunInfo::parent`] to follow one parent's.
    pub fn on_lifecycle(
        &self,
        listener: impl Fn(&Lifecycle) -> Result<(), ListenerError> + Send + Sync + 'static,
    ) -> ListenerId {
        self.inner.listeners.add(Arc::new(listener))
    }

    /// Removes a lifecycle listener. Returns whether it was there.
    pub fn remove_listener(&self, id: ListenerId) -> bool {
        self.inner.listeners.remove(id)
    }

    pub(crate) fn emit(&self, event: &Lifecycle) {
        self.inner.listeners.emit(event);
    }

    pub(crate) fn add_mount(&self, mount: Weak<dyn Mount>) {
        let mut mounts = lock(&self.inner.mounts);
        mounts.retain(|m| m.strong_count() > 0);
        mounts.push(mount);
    }

    fn mounts(&self) -> Vec<Arc<dyn Mount>> {
        lock(&self.inner.mounts)
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// Starts a one-shot child of `request.parent` with the provider `provider`.
    ///
    /// Checked now, in this order, before any child exists: the provider is registered
    /// (`NO_PROVIDER`); it supports every option the request uses, in the order output schema,
    /// max depth, tool filter, persona (`UNSUPPORTED_CAPABILITY`, naming the capability); the
    /// output schema is an object-rooted schema of the supported subset (`INVALID_REQUEST`); the
    /// parent is the live agent under its id (`PARENT_UNAVAILABLE`). The parent's policy is
    /// captured and the provider is asked to start now too, so a later switch of the parent does
    /// not reach the child. The child is created when the returned future runs.
    ///
    /// `subagent/start` is emitted once the provider has started the run and `subagent/end`
    /// when its result is in.
    ///
    /// Cancel safety: fire `request.cancel` to give up. Dropping the future once the provider
    /// has started the run leaves the run going with nobody holding its [`SubagentRun`] to
    /// dispose of it.
    pub fn start(
        &self,
        provider: &str,
        request: StartRequest,
    ) -> impl Future<Output = Result<SubagentRun, SubagentError>> + Send + 'static {
        let started = self.resolve(provider, request).map(|(provider, resolved)| {
            let parent = resolved.request.parent.id();
            let name = provider.name().to_owned();
            (provider.start(resolved), name, parent)
        });
        let runtime = self.clone();
        async move {
            let (starting, provider, parent) = started?;
            let run = starting.await?;
            runtime.observe(&run, provider, parent);
            Ok(run)
        }
    }

    /// Starts a one-shot run of `request` as a background job of its parent: the caller does not
    /// wait; the job has a cancellation of its own (the request's is replaced, so the end of the
    /// call that started it does not end it), is killed with its owner, and tells its owner its
    /// outcome with a message at its next turn. Refused as [`SubagentRuntime::start`] refuses.
    pub fn start_job(
        &self,
        provider: &str,
        mut request: StartRequest,
    ) -> impl Future<Output = Result<JobId, SubagentError>> + Send + 'static {
        let cancel = Cancellation::new();
        request.cancel = cancel.clone();
        let owner = request.parent.clone();
        let label = request.label.clone().unwrap_or_default();
        let started = self.start(provider, request);
        let runtime = self.clone();
        async move {
            let run = started.await?;
            Ok(runtime
                .inner
                .jobs
                .adopt(runtime.agents(), &owner, label, run, cancel))
        }
    }

    /// The outcome of `owner`'s job `job`: now (`None` while it runs) or, with `wait`, once it
    /// ends. Only its owner knows a job.
    ///
    /// Cancel safety: dropping the future stops only the wait.
    pub async fn job_output(
        &self,
        owner: SessionId,
        job: JobId,
        wait: bool,
    ) -> Result<Option<JobOutcome>, SubagentError> {
        self.inner.jobs.output(owner, job, wait).await
    }

    /// Kills `owner`'s job `job` and returns its outcome once it has ended (the outcome it had,
    /// if it was already over).
    ///
    /// Cancel safety: dropping the future stops only the wait; the job is killed regardless.
    pub async fn kill_job(
        &self,
        owner: SessionId,
        job: JobId,
    ) -> Result<JobOutcome, SubagentError> {
        self.inner.jobs.kill(owner, job).await
    }

    /// Whether `owner` has a job still running.
    pub fn has_running_jobs(&self, owner: SessionId) -> bool {
        self.inner.jobs.running_for(owner)
    }

    pub(crate) fn jobs(&self) -> &Jobs {
        &self.inner.jobs
    }

    fn resolve(
        &self,
        name: &str,
        request: StartRequest,
    ) -> Result<(Arc<dyn Provider>, ResolvedStart), SubagentError> {
        let provider = self.expect_provider(name)?;
        let capabilities = provider.capabilities();
        let used = [
            (request.output_schema.is_some(), Capability::OutputSchema),
            (request.max_depth.is_some(), Capability::DepthLimit),
            (request.tool_filter.is_some(), Capability::ToolFilter),
            (request.persona.is_some(), Capability::Persona),
        ];
        for (used, capability) in used {
            if used && !capabilities.supports(capability) {
                return Err(SubagentError::new(
                    ErrorCode::UnsupportedCapability,
                    format!(
                        "subagent provider {name:?} does not support the {:?} capability",
                        capability.as_str()
                    ),
                ));
            }
        }
        if let Some(output_schema) = &request.output_schema {
            schema::check_object_schema(output_schema).map_err(|reason| {
                SubagentError::new(
                    ErrorCode::InvalidRequest,
                    format!("invalid output schema: {reason}"),
                )
            })?;
        }
        let descriptor = SubagentDescriptor {
            label: request.label.clone(),
            ..SubagentDescriptor::new(DescriptorMode::OneShot, name)
        };
        birth::check_parent(self.agents(), &request.parent)?;
        let policy = birth::capture_policy(&request.parent);
        Ok((
            provider,
            ResolvedStart {
                request,
                descriptor,
                policy,
                agents: self.agents().clone(),
            },
        ))
    }

    /// Emits `subagent/start` for `run` now and `subagent/end` when its result is in.
    fn observe(&self, run: &SubagentRun, provider: String, parent: lineage_log::SessionId) {
        let info = RunInfo {
            run: RunId::new(),
            provider: provider.into(),
            child: run.id(),
            parent,
            local: run.local_agent().is_some(),
        };
        self.emit(&Lifecycle::Start(info.clone()));
        let (runtime, run) = (self.clone(), run.clone());
        tokio::spawn(async move {
            let (stop_reason, last_assistant_message) = match run.result().await {
                Ok(result) => {
                    let output = (!result.output.is_empty()).then_some(result.output);
                    (result.stop_reason, output)
                }
                Err(_) => (StopReason::Error, None),
            };
            runtime.emit(&Lifecycle::End {
                info,
                stop_reason,
                last_assistant_message,
            });
        });
    }
}
