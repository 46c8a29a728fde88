//! What a host can watch: the registry's agents coming and going, an agent's cancellations, and
//! the failures of best-effort work (a disposal's final flush) as events and as the disposal's
//! outcome.

use std::sync::Arc;

use lineage_agent::{
    Agent, AgentError, AgentEvent, Diagnostic, DiagnosticKind, Queued, RegistryEvent,
};
use lineage_log::{AbortCause, InboxTarget, PolicySource, SessionId};
use lineage_store::StoreError;
use lineage_testkit::agent::*;
use lineage_testkit::ev;
use tokio::sync::mpsc::UnboundedReceiver;

/// Everything received so far, without waiting.
fn drain<T>(rx: &mut UnboundedReceiver<T>) -> Vec<T> {
    let mut out = Vec::new();
    while let Ok(event) = rx.try_recv() {
        out.push(event);
    }
    out
}

/// A harness without a script, and a subscription to its registry's events.
fn watched() -> (Harness, UnboundedReceiver<RegistryEvent>) {
    let h = Harness::new([]);
    let watch = h.agents.subscribe();
    (h, watch)
}

/// A fresh agent of `h` that has written an event, so that it is stored and its disposal
/// flushes.
async fn written_agent(h: &Harness) -> Arc<Agent> {
    let agent = h.agent().await;
    agent
        .record(ev::approval("never", PolicySource::Own))
        .unwrap();
    agent
}

/// The registry's report that `agent` was disposed of, its final flush `failed` or not.
fn disposed(agent: SessionId, failed: bool) -> RegistryEvent {
    RegistryEvent::Disposed { agent, failed }
}

#[tokio::test(start_paused = true)]
async fn the_registry_reports_agents_created_resumed_and_disposed_in_order() {
    let (h, mut watch) = watched();
    let agent = written_agent(&h).await;
    let id = agent.id();
    agent.dispose().await;
    let resumed = h.agents.resume(id, spec()).await.unwrap();
    assert!(h.agents.dispose(resumed.id()).await);
    assert_eq!(
        drain(&mut watch),
        vec![
            RegistryEvent::Created { agent: id },
            disposed(id, false),
            RegistryEvent::Resumed { agent: id },
            disposed(id, false),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn every_cancellation_is_published_with_its_cause_and_inbox_choice() {
    let h = Harness::new([]);
    let agent = h.agent().await;
    let mut rx = agent.subscribe();
    agent.inject(user("parked")).unwrap();
    agent.cancel(AbortCause::User, Queued::Keep).unwrap();
    assert_eq!(agent.pending(InboxTarget::NextStep).len(), 1);
    agent
        .cancel(
            AbortCause::Hook {
                reason: "enough".into(),
            },
            Queued::Discard,
        )
        .unwrap();
    agent.dispose().await;
    let cancels: Vec<(AbortCause, Queued)> = drain(&mut rx)
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::Cancelled {
                agent: who,
                cause,
                queued,
            } => {
                assert_eq!(who, agent.id());
                Some((cause, queued))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        cancels,
        vec![
            (AbortCause::User, Queued::Keep),
            (
                AbortCause::Hook {
                    reason: "enough".into()
                },
                Queued::Discard
            ),
            (AbortCause::Disposed, Queued::Discard),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_final_flush_fails_every_disposer_and_is_published_as_a_diagnostic() {
    let (h, mut watch) = watched();
    let agent = written_agent(&h).await;
    let id = agent.id();
    let mut rx = agent.subscribe();
    agent.fail_final_flush(Some(Box::new(|| StoreError::Unavailable {
        reason: "the disk is gone".into(),
    })));
    let (first, second) = tokio::join!(agent.try_dispose(), agent.try_dispose());
    for outcome in [first, second, agent.try_dispose().await] {
        match outcome {
            Err(AgentError::FinalFlushFailed { agent: who, source }) => {
                assert_eq!(who, id);
                assert!(
                    matches!(&*source, StoreError::Unavailable { reason } if reason == "the disk is gone"),
                    "{source:?}"
                );
            }
            other => panic!("expected FinalFlushFailed, got {other:?}"),
        }
    }
    // Disposed all the same.
    assert!(h.agents.get(id).is_none());
    let diagnostics: Vec<Diagnostic> = drain(&mut rx)
        .into_iter()
        .filter_map(|e| match e {
            AgentEvent::Diagnostic(d) => Some(d),
            _ => None,
        })
        .collect();
    assert_eq!(diagnostics.len(), 1, "{diagnostics:?}");
    assert_eq!(diagnostics[0].agent, id);
    assert_eq!(diagnostics[0].kind, DiagnosticKind::FinalFlushFailed);
    assert!(
        diagnostics[0].reason.contains("the disk is gone"),
        "{}",
        diagnostics[0].reason
    );
    assert_eq!(
        drain(&mut watch),
        vec![
            RegistryEvent::Created { agent: id },
            RegistryEvent::Diagnostic(diagnostics[0].clone()),
            disposed(id, true),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_disposal_whose_flush_works_reports_success_to_every_disposer() {
    let h = Harness::new([]);
    let agent = written_agent(&h).await;
    let (first, second) = tokio::join!(agent.try_dispose(), agent.try_dispose());
    assert!(first.is_ok() && second.is_ok());
    assert!(matches!(h.agents.try_dispose(agent.id()).await, Ok(false)));
    assert_eq!(h.store.info(agent.id()).unwrap().len, 1);
}
