//! The in-process one-shot run shared by the spawn and fork providers: create the child,
//! give it the prompt, wait for it to go idle, and read its result from its own events.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use lineage_agent::{Agent, BoxFuture, Cancellation, Queued, Tool};
use lineage_log::{
    AbortCause, ContentBlock, Event, Message, MessageId, MessageSource, Role, SessionId,
};

use crate::birth::{self, ChildPlan};
use crate::outcome;
use crate::structured::StructuredOutput;
use crate::{
    ErrorCode, ResolvedStart, StopReason, SubagentError, SubagentResult, SubagentRun,
    bound_diagnostic,
};

/// Starts a one-shot child in this process, forked from the parent through `fork_at` or fresh.
///
/// Everything taken from the parent (its depth, options and tools) is read now, when the
/// delegation is asked for; the child is created (and its first events written) when the
/// returned future runs, unless by then the request was cancelled or the parent is gone.
pub fn start_in_process(
    resolved: ResolvedStart,
    fork_at: Option<u64>,
) -> BoxFuture<'static, Result<SubagentRun, SubagentError>> {
    let ResolvedStart {
        request,
        descriptor,
        policy,
        agents,
    } = resolved;
    let parent = request.parent.clone();
    let planned = if request.cancel.is_cancelled() {
        Err(cancelled_before_publication(parent.id()))
    } else {
        birth::child_depth(&parent, request.max_depth).map(|depth| {
            let mut own: Vec<Arc<dyn Tool>> = Vec::new();
            let captured = request.output_schema.clone().map(|schema| {
                let (tool, captured) = StructuredOutput::new(schema);
                own.push(tool);
                captured
            });
            let options = birth::child_options(parent.options(), &request.agent_options, depth);
            let spec = birth::child_spec(
                &parent,
                options,
                request.persona.clone(),
                request.tool_filter.clone(),
                own,
                Vec::new(),
            );
            let plan = ChildPlan {
                child: SessionId::new(),
                depth,
                fork_at,
                descriptor,
                policy,
                spec,
            };
            (plan, captured)
        })
    };
    Box::pin(async move {
        let (plan, captured) = planned?;
        if request.cancel.is_cancelled() {
            return Err(cancelled_before_publication(parent.id()));
        }
        birth::check_parent(&agents, &parent)?;
        let child = birth::create_child(&agents, &parent, plan).await?;
        Ok(one_shot_run(
            child,
            request.prompt,
            request.cancel,
            captured,
        ))
    })
}

pub(crate) fn cancelled_before_publication(parent: SessionId) -> SubagentError {
    SubagentError::new(
        ErrorCode::Cancelled,
        format!("the delegation from {parent} was cancelled before the child was published"),
    )
}

/// Drives a freshly created one-shot child: the prompt as its one turn, the caller's
/// cancellation forwarded to it, and its result read from the events after `boundary`.
fn one_shot_run(
    child: Arc<Agent>,
    prompt: Vec<ContentBlock>,
    cancel: Cancellation,
    captured: Option<Arc<Mutex<Option<serde_json::Value>>>>,
) -> SubagentRun {
    let boundary = child.with_events(|events| events.len());
    let cancelled = Arc::new(AtomicBool::new(false));
    // Fires when the run is over or disposed, ending the forwarding task.
    let finished = Cancellation::new();
    let forward = {
        let (child, cancelled, finished) = (child.clone(), cancelled.clone(), finished.clone());
        move || {
            cancelled.store(true, Ordering::SeqCst);
            finished.cancel(AbortCause::Parent);
            if let Err(error) = child.cancel(AbortCause::Parent, Queued::Discard) {
                tracing::warn!(child = %child.id(), %error, "cancelling the child failed");
            }
        }
    };
    if cancel.is_cancelled() {
        forward();
    } else {
        let finished = finished.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = cancel.cancelled() => forward(),
                _ = finished.cancelled() => {}
            }
        });
    }
    let result = {
        let (child, cancelled, finished) = (child.clone(), cancelled.clone(), finished.clone());
        async move {
            if !cancelled.load(Ordering::SeqCst) {
                let message = Message {
                    id: MessageId::new(),
                    role: Role::User,
                    content: prompt,
                    source: MessageSource::User,
                };
                child
                    .followup(message)
                    .map_err(|e| SubagentError::agent(child.id(), e))?;
            }
            child.when_idle().await;
            finished.cancel(AbortCause::Parent);
            let structured = captured.map(|c| crate::lock(&c).take());
            let cancelled = cancelled.load(Ordering::SeqCst);
            Ok(child.with_events(|events| {
                read_result(&events[boundary.min(events.len())..], cancelled, structured)
            }))
        }
    };
    let dispose = {
        let (child, cancelled) = (child.clone(), cancelled.clone());
        move || -> BoxFuture<'static, Result<(), SubagentError>> {
            Box::pin(async move {
                cancelled.store(true, Ordering::SeqCst);
                finished.cancel(AbortCause::Disposed);
                child
                    .try_dispose()
                    .await
                    .map_err(|e| SubagentError::agent(child.id(), e))
            })
        }
    };
    SubagentRun::new(child.id(), Some(child), result, dispose)
}

/// The result of a one-shot epoch: its stop reason and final output, read from `own` (the
/// events the epoch wrote). A cancelled run that did not complete is `aborted`. `structured` is
/// `None` when no structured result was asked for, and `Some` of what was captured when one was:
/// a run that completed without capturing one failed.
pub(crate) fn read_result(
    own: &[Event],
    cancelled: bool,
    structured: Option<Option<serde_json::Value>>,
) -> SubagentResult {
    let (recorded, mut diagnostic) = outcome::run_outcome(own);
    let mut stop = if cancelled && recorded != StopReason::Completed {
        StopReason::Aborted
    } else {
        recorded
    };
    let output = outcome::epoch_answer(own);
    let structured = match structured {
        Some(Some(value)) => Some(value),
        Some(None) if stop == StopReason::Completed => {
            stop = if cancelled {
                StopReason::Aborted
            } else {
                StopReason::Error
            };
            diagnostic = Some("the child finished without recording a structured result".into());
            None
        }
        Some(None) | None => None,
    };
    SubagentResult {
        output,
        structured,
        diagnostic: diagnostic.map(|d| bound_diagnostic(&d)),
        stop_reason: stop,
    }
}
