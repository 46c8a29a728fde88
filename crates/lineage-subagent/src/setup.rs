//! Setup contributions: capabilities installed into every continuable child at each activation
//! (this is how `report` gets there), revocable while children are resident. A contribution may
//! give tools, prompt context and turn-loop hooks; since every activation installs them again,
//! a child resumed cold from its log gets the same ones.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lineage_agent::{
    BoxFuture, HookError, Hooks, PreStep, PreStepDecision, Tool, ToolContext, ToolOutput,
};
use lineage_log::{SessionId, Text};

use crate::{SubagentRuntime, lock};

/// What a contribution installs in one child.
#[derive(Default)]
pub struct Installed {
    /// Tools only this child has. They stay visible whatever its tool filter says.
    pub tools: Vec<Arc<dyn Tool>>,
    /// Runtime-context statements for its system prompt, for the whole activation. Guidance
    /// that must leave with a tool when the contribution is removed belongs in
    /// [`Tool::guidance`] instead.
    pub context: Vec<Text>,
    /// Turn-loop hooks for this child: a pre-step that may rewrite a step's input or refuse it
    /// (the turn ends `blocked`, and the child settles declining the task). With several
    /// contributions, each hook sees what the ones registered before it let through, and the
    /// first to refuse or fail decides.
    pub hooks: Option<Arc<dyn Hooks>>,
}

/// A capability every continuable child gets, at creation and at every cold resume.
pub trait ContinuableSetup: Send + Sync + 'static {
    /// What to install in the continuable child `child` of `runtime`.
    fn install(&self, runtime: &SubagentRuntime, child: SessionId) -> Installed;
}

/// Identifies a registered setup contribution, to remove it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SetupId(u64);

struct Registration {
    id: SetupId,
    setup: Arc<dyn ContinuableSetup>,
    revoked: Arc<AtomicBool>,
}

/// The registered contributions, in registration order, and the hooks continuable requests gave
/// their children.
#[derive(Default)]
pub(crate) struct Setups {
    registrations: Mutex<Vec<Registration>>,
    next: AtomicU64,
    request_hooks: Mutex<HashMap<SessionId, Arc<dyn Hooks>>>,
}

impl SubagentRuntime {
    /// Registers a contribution; it applies from the next activation on.
    pub fn register_continuable_setup(&self, setup: Arc<dyn ContinuableSetup>) -> SetupId {
        let setups = self.setups();
        let id = SetupId(setups.next.fetch_add(1, Ordering::Relaxed));
        lock(&setups.registrations).push(Registration {
            id,
            setup,
            revoked: Arc::new(AtomicBool::new(false)),
        });
        id
    }

    /// Removes a contribution: new activations no longer get it, and the tools it installed in
    /// resident children unmount now. Returns whether it was registered.
    pub fn remove_continuable_setup(&self, id: SetupId) -> bool {
        let mut registrations = lock(&self.setups().registrations);
        match registrations.iter().position(|r| r.id == id) {
            Some(at) => {
                registrations
                    .remove(at)
                    .revoked
                    .store(true, Ordering::SeqCst);
                true
            }
            None => false,
        }
    }

    /// What the continuation manager installs in its children from this runtime.
    pub(crate) fn installer(&self) -> Installer<'_> {
        Installer(self)
    }
}

/// A runtime's setup contributions and the hooks continuable requests gave, as the continuation
/// manager installs them at each activation (a contribution installs for its runtime).
#[derive(Clone, Copy)]
pub(crate) struct Installer<'a>(&'a SubagentRuntime);

impl Installer<'_> {
    /// Keeps the hooks a continuable request gave `child`, for every activation of it.
    pub(crate) fn remember_request_hooks(self, child: SessionId, hooks: Arc<dyn Hooks>) {
        lock(&self.0.setups().request_hooks).insert(child, hooks);
    }

    pub(crate) fn forget_request_hooks(self, child: SessionId) {
        lock(&self.0.setups().request_hooks).remove(&child);
    }

    /// Everything the registered contributions install in `child`, with the hooks its request
    /// gave it first.
    pub(crate) fn install(self, child: SessionId) -> Installed {
        let registrations: Vec<(Arc<dyn ContinuableSetup>, Arc<AtomicBool>)> =
            lock(&self.0.setups().registrations)
                .iter()
                .map(|r| (r.setup.clone(), r.revoked.clone()))
                .collect();
        let mut installed = Installed::default();
        let mut hooks: Vec<Arc<dyn Hooks>> = lock(&self.0.setups().request_hooks)
            .get(&child)
            .cloned()
            .into_iter()
            .collect();
        for (setup, revoked) in registrations {
            let Installed {
                tools,
                context,
                hooks: contributed,
            } = setup.install(self.0, child);
            hooks.extend(contributed.map(|hooks| -> Arc<dyn Hooks> {
                Arc::new(RevocableHooks {
                    hooks,
                    revoked: revoked.clone(),
                })
            }));
            installed
                .tools
                .extend(tools.into_iter().map(|tool| -> Arc<dyn Tool> {
                    Arc::new(Revocable {
                        tool,
                        revoked: revoked.clone(),
                    })
                }));
            installed.context.extend(context);
        }
        if !hooks.is_empty() {
            installed.hooks = Some(Arc::new(Chain(hooks)));
        }
        installed
    }
}

/// Contributed hooks, in registration order: each runs on what the one before let through.
struct Chain(Vec<Arc<dyn Hooks>>);

impl Hooks for Chain {
    fn pre_step(&self, step: PreStep) -> BoxFuture<'_, Result<PreStepDecision, HookError>> {
        Box::pin(async move {
            let PreStep {
                agent,
                turn,
                step,
                mut messages,
                cancel,
            } = step;
            for hooks in &self.0 {
                let input = PreStep {
                    agent: agent.clone(),
                    turn,
                    step,
                    messages,
                    cancel: cancel.clone(),
                };
                match hooks.pre_step(input).await? {
                    PreStepDecision::Enter(passed) => messages = passed,
                    PreStepDecision::Reject => return Ok(PreStepDecision::Reject),
                }
            }
            Ok(PreStepDecision::Enter(messages))
        })
    }
}

/// Contributed hooks that change nothing once their contribution is removed.
struct RevocableHooks {
    hooks: Arc<dyn Hooks>,
    revoked: Arc<AtomicBool>,
}

impl Hooks for RevocableHooks {
    fn pre_step(&self, step: PreStep) -> BoxFuture<'_, Result<PreStepDecision, HookError>> {
        if self.revoked.load(Ordering::SeqCst) {
            return Box::pin(async move { Ok(PreStepDecision::Enter(step.messages)) });
        }
        self.hooks.pre_step(step)
    }
}

/// A contributed tool that unmounts when its contribution is removed.
struct Revocable {
    tool: Arc<dyn Tool>,
    revoked: Arc<AtomicBool>,
}

impl Tool for Revocable {
    fn name(&self) -> &str {
        self.tool.name()
    }
    fn description(&self) -> &str {
        self.tool.description()
    }
    fn input_schema(&self) -> serde_json::Value {
        self.tool.input_schema()
    }
    fn parallel_safe(&self, arguments: &serde_json::Value) -> bool {
        self.tool.parallel_safe(arguments)
    }
    fn guidance(&self) -> Option<&str> {
        self.tool.guidance()
    }
    fn available(&self) -> bool {
        !self.revoked.load(Ordering::SeqCst) && self.tool.available()
    }
    fn call(&self, ctx: ToolContext, arguments: serde_json::Value) -> BoxFuture<'_, ToolOutput> {
        self.tool.call(ctx, arguments)
    }
}
