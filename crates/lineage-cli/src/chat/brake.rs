//! The brake: how the chat stops a prompt's work for certain, whatever the model answers.
//!
//! Cancelling a turn only ends the turn running now; a fast model may already have started a
//! child whose notice starts the next one. So the chat also puts a pre-step hook on the root
//! and on every continuable child (through a setup contribution): once the brake is engaged,
//! every step is refused before its model request (the turn ends `blocked`, its claimed input
//! never entering the history), so nothing asks the model again and the work winds down.
//!
//! The root's hook also counts the root's turns of the prompt and engages the brake itself when
//! a turn beyond [`MAX_ROOT_TURNS`] is about to ask the model, so the bound holds exactly.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use lineage_agent::{BoxFuture, HookError, Hooks, PreStep, PreStepDecision};
use lineage_log::SessionId;
use lineage_subagent::{ContinuableSetup, Installed, SubagentRuntime};

use super::MAX_ROOT_TURNS;

/// Shared by the root's hook and every child's.
#[derive(Debug, Default)]
pub struct Brake {
    engaged: AtomicBool,
    /// The root's turns that asked the model since the prompt was sent.
    root_turns: AtomicU32,
    /// The bound engaged the brake (rather than Ctrl-C).
    bound_reached: AtomicBool,
}

impl Brake {
    /// A released brake, with no turns counted.
    pub fn new() -> Arc<Brake> {
        Arc::new(Brake::default())
    }

    /// Releases the brake and restarts the count, for a new prompt.
    pub fn release(&self) {
        self.root_turns.store(0, Ordering::SeqCst);
        self.bound_reached.store(false, Ordering::SeqCst);
        self.engaged.store(false, Ordering::SeqCst);
    }

    /// Refuses every step from now on.
    pub fn engage(&self) {
        self.engaged.store(true, Ordering::SeqCst);
    }

    /// Whether steps are refused.
    pub fn is_engaged(&self) -> bool {
        self.engaged.load(Ordering::SeqCst)
    }

    /// Whether the root's turn bound engaged it.
    pub fn bound_reached(&self) -> bool {
        self.bound_reached.load(Ordering::SeqCst)
    }

    /// The root's hook.
    pub fn root_hooks(self: &Arc<Brake>) -> Arc<dyn Hooks> {
        Arc::new(Gate {
            brake: self.clone(),
            counts_turns: true,
        })
    }

    /// The setup contribution that gives every continuable child the brake's hook.
    pub fn child_setup(self: &Arc<Brake>) -> Arc<dyn ContinuableSetup> {
        Arc::new(Gate {
            brake: self.clone(),
            counts_turns: false,
        })
    }

    /// The decision for a step: refuse when engaged, or when it opens a root turn past the bound.
    fn decide(&self, step: u32, counts_turns: bool) -> bool {
        if self.is_engaged() {
            return false;
        }
        if counts_turns && step == 1 {
            let turns = self.root_turns.fetch_add(1, Ordering::SeqCst) + 1;
            if turns > MAX_ROOT_TURNS {
                self.bound_reached.store(true, Ordering::SeqCst);
                self.engage();
                return false;
            }
        }
        true
    }
}

/// One agent's view of the brake.
struct Gate {
    brake: Arc<Brake>,
    /// This is the root's gate: it counts turns against the bound.
    counts_turns: bool,
}

impl Hooks for Gate {
    fn pre_step(&self, step: PreStep) -> BoxFuture<'_, Result<PreStepDecision, HookError>> {
        let enter = self.brake.decide(step.step, self.counts_turns);
        Box::pin(async move {
            match (enter, self.counts_turns) {
                (true, _) => Ok(PreStepDecision::Enter(step.messages)),
                // The root's input (its children's notices, mostly) is not refused but parked:
                // a failed hook puts the claimed input back for the next wake, so the next
                // prompt (or a resume) still hears how each child ended.
                (false, true) => Err(HookError::new(
                    "this prompt's work was stopped (Ctrl-C, or the bound of root turns); \
                     its input waits for the next prompt",
                )),
                // A child being wound down gives up its step; its settlement notice still
                // reaches the root.
                (false, false) => Ok(PreStepDecision::Reject),
            }
        })
    }
}

impl ContinuableSetup for Gate {
    fn install(&self, _runtime: &SubagentRuntime, _child: SessionId) -> Installed {
        Installed {
            hooks: Some(Arc::new(Gate {
                brake: self.brake.clone(),
                counts_turns: false,
            })),
            ..Installed::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_may_take_the_bound_of_turns_and_no_more() {
        let brake = Brake::new();
        for turn in 1..=MAX_ROOT_TURNS {
            assert!(brake.decide(1, true), "turn {turn} asks the model");
            assert!(brake.decide(2, true), "so do its later steps");
        }
        assert!(!brake.decide(1, true), "the next turn is refused");
        assert!(brake.bound_reached() && brake.is_engaged());
        assert!(!brake.decide(1, false), "and so is every child's step");
        brake.release();
        assert!(
            brake.decide(1, true) && brake.decide(1, false),
            "a new prompt starts afresh"
        );
    }

    #[test]
    fn an_engaged_brake_refuses_every_step_without_counting_it_against_the_bound() {
        let brake = Brake::new();
        brake.engage();
        assert!(!brake.decide(1, true));
        assert!(!brake.decide(3, false));
        assert!(!brake.bound_reached(), "Ctrl-C, not the bound");
    }
}
