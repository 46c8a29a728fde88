//! The registry: create with rollback, the exact live `Arc`, memoized disposal, resume from the
//! store with numbering continued and restored work left parked, and fork seeds.

mod common;

use common::{forked, streaming, texts, turn_numbers};

use std::sync::Arc;

use lineage_agent::{AgentError, AgentSpec, AgentStatus, CreateAgent, Response, Seed};
use lineage_log::{
    AbortCause, Digest, Event, EventBody, EventKind, Header, InboxTarget, SessionId,
    SessionLineage, StepStart, Text, ToolFilter, TurnEndReason, TurnStart,
};
use lineage_store::StoreError;
use lineage_testkit::agent::*;

#[tokio::test(start_paused = true)]
async fn get_returns_the_exact_live_agent_and_a_live_id_is_refused() {
    let h = Harness::new([]);
    let agent = h.agent().await;
    let got = h.agents.get(agent.id()).unwrap();
    assert!(Arc::ptr_eq(&got, &agent));
    assert!(h.agents.is_live(&agent));
    match h.agents.create(fresh_with_id(agent.id())).await {
        Err(AgentError::AlreadyLive { agent: id }) => assert_eq!(id, agent.id()),
        other => panic!("expected AlreadyLive, got {other:?}"),
    }
    match h.agents.resume(agent.id(), spec()).await {
        Err(AgentError::AlreadyLive { .. }) => {}
        other => panic!("expected AlreadyLive, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn create_refuses_a_header_its_seed_contradicts_before_writing() {
    let h = Harness::new([]);
    let id = SessionId::new();
    for header in [
        Header {
            parent: Some(SessionId::new()),
            ..Header::new(id, 1)
        },
        Header {
            origin: Some(lineage_log::Origin::Subagent),
            ..Header::new(id, 1)
        },
        Header {
            delegation_depth: 3,
            ..Header::new(id, 1)
        },
    ] {
        let mut create = CreateAgent::fresh(spec());
        create.header = header;
        match h.agents.create(create).await {
            Err(AgentError::Store {
                agent,
                source: StoreError::HeaderContradictsLog { session, .. },
            }) => assert_eq!((agent, session), (id, id)),
            other => panic!("expected HeaderContradictsLog, got {other:?}"),
        }
        assert!(h.store.list().unwrap().is_empty(), "nothing was written");
        assert!(h.agents.get(id).is_none());
    }
    let agent = h.agents.create(fresh_with_id(id)).await.unwrap();
    assert_eq!(agent.id(), id, "the id stayed free");
}

#[tokio::test(start_paused = true)]
async fn a_refused_create_writes_nothing_and_frees_the_id() {
    let h = Harness::new([]);
    let id = SessionId::new();
    let mut bad = fresh_with_id(id);
    bad.spec.tool_filter = Some(ToolFilter {
        allow: Some(vec![Text::from("missing")]),
        deny: None,
    });
    bad.setup = vec![EventBody::from(lineage_log::ApprovalPolicy {
        policy: "never".into(),
        source: lineage_log::PolicySource::Delegation,
    })];
    assert!(matches!(
        h.agents.create(bad).await,
        Err(AgentError::UnknownTool { .. })
    ));
    let mut zero = fresh_with_id(id);
    zero.spec.options.max_tokens = Some(0);
    assert!(matches!(
        h.agents.create(zero).await,
        Err(AgentError::InvalidOption {
            field: "max_tokens",
            ..
        })
    ));
    // A seed that breaks the seed contract is refused before anything is written.
    let mut gap = fresh_with_id(id);
    gap.seed = Seed::Events(vec![Event::new(1, 0, TurnStart { turn: 1 })]);
    assert!(matches!(
        h.agents.create(gap).await,
        Err(AgentError::Log { .. })
    ));
    assert!(h.agents.get(id).is_none());
    assert!(matches!(
        h.store.info(id),
        Err(StoreError::UnknownSession { .. })
    ));
    // The id is free again.
    let agent = h.agents.create(fresh_with_id(id)).await.unwrap();
    assert_eq!(agent.id(), id);
}

#[tokio::test(start_paused = true)]
async fn setup_events_are_written_with_the_seed_in_one_transaction() {
    let h = Harness::new([]);
    let parent = SessionId::new();
    let id = SessionId::new();
    let mut create = fresh_with_id(id);
    create.header.parent = Some(parent);
    create.header.seed_digest = Some(Digest::of_empty());
    create.header.delegation_depth = 1;
    create.setup = vec![EventBody::from(SessionLineage {
        parent,
        seed_len: 0,
        seed_digest: Digest::of_empty(),
        delegation_depth: 1,
    })];
    let agent = h.agents.create(create).await.unwrap();
    let stored = h.store.read_from(id, 0).unwrap();
    assert_eq!(kinds(&stored), ["session/lineage"]);
    assert_eq!(agent.delegation_depth(), 1);
    assert_eq!(h.store.info(id).unwrap().header.parent, Some(parent));
}

#[tokio::test(start_paused = true)]
async fn dispose_is_shared_by_every_owner_and_leaves_the_session_stored() {
    let h = Harness::new([Response::hang()]);
    let (agent, mut rx) = streaming(&h, "work").await;
    agent.inject(user("pending")).unwrap();
    let (a, b) = (agent.clone(), agent.clone());
    let first = tokio::spawn(async move { a.dispose().await });
    let second = tokio::spawn(async move { b.dispose().await });
    first.await.unwrap();
    second.await.unwrap();
    assert!(!h.agents.dispose(agent.id()).await, "already gone");
    assert!(h.agents.get(agent.id()).is_none());
    assert!(!h.agents.is_live(&agent));
    assert_eq!(agent.status(), AgentStatus::Idle);
    assert!(!agent.has_pending(), "disposal discards pending input");
    assert_eq!(
        turn_ends(&agent.events()),
        [TurnEndReason::Aborted {
            cause: AbortCause::Disposed
        }]
    );
    assert_balanced(&agent.events());
    assert_stored(&h.store, &agent);
    // The observer's stream ends with the agent.
    while rx.recv().await.is_some() {}
    // A wake after disposal stays parked.
    agent.followup(user("too late")).unwrap();
    assert_eq!(agent.status(), AgentStatus::Idle);
}

#[tokio::test(start_paused = true)]
async fn shut_down_keeps_pending_input_for_the_next_resume() {
    let h = Harness::new([Response::hang()]);
    let (agent, _rx) = streaming(&h, "work").await;
    agent.followup(user("pending")).unwrap();
    agent.shut_down().await.unwrap();
    assert!(h.agents.get(agent.id()).is_none());
    // The running turn ends as a disposal's does; its claimed input is not requeued.
    assert_eq!(
        turn_ends(&agent.events()),
        [TurnEndReason::Aborted {
            cause: AbortCause::Disposed
        }]
    );
    assert_balanced(&agent.events());
    let resumed = h.agents.resume(agent.id(), spec()).await.unwrap();
    let pending = resumed.pending(InboxTarget::NextTurn);
    assert_eq!(pending.len(), 1, "the queued message survives the shutdown");
    assert_eq!(text_lines(&pending[0]), "pending");
}

#[tokio::test(start_paused = true)]
async fn resume_continues_numbering_and_leaves_restored_work_parked() {
    let h = Harness::new(["one", "two", "three"].map(Response::text));
    let agent = h.agent().await;
    agent.followup(user("a")).unwrap();
    run_turn(&agent, "b").await;
    agent.inject(user("context for later")).unwrap();
    let id = agent.id();
    let before = agent.events().len();
    agent.dispose().await;
    // Disposal discarded the inject; queue a fresh one straight into the store's log through a
    // second life, then dispose without running it.
    let second = h.agents.resume(id, spec()).await.unwrap();
    assert!(!Arc::ptr_eq(&second, &agent), "a new life is a new Arc");
    assert!(!h.agents.is_live(&agent), "the old handle is stale");
    assert_eq!(second.events()[..before], agent.events()[..before]);
    second.inject(user("restored context")).unwrap();
    h.store.flush(id).unwrap();
    // Simulate a restart: forget the live agent and its registry without disposal (which would
    // discard input); with them goes the agent's ownership of its session.
    drop(second);
    drop(h.agents);
    let restarted = lineage_agent::Agents::new(h.store.clone(), h.model.clone());
    let third = restarted.resume(id, spec()).await.unwrap();
    assert_eq!(third.status(), AgentStatus::Idle);
    assert_eq!(
        texts(&third.pending(InboxTarget::NextStep)),
        ["restored context"],
        "pending input survives a restart"
    );
    tokio::task::yield_now().await;
    assert_eq!(
        third.status(),
        AgentStatus::Idle,
        "restored work does not run by itself"
    );
    run_turn(&third, "c").await;
    let events = third.events();
    assert_eq!(turn_numbers(&events), [1, 2, 3]);
    assert_eq!(user_texts(&events), ["a", "b", "restored context", "c"]);
    assert!(events.iter().enumerate().all(|(i, e)| e.seq == i as u64));
    assert_balanced(&events);
    assert_stored(&h.store, &third);
}

#[tokio::test(start_paused = true)]
async fn resume_closes_a_torn_turn_before_the_agent_is_published() {
    let h = Harness::new([Response::text("after")]);
    let id = SessionId::new();
    h.store.create(Header::new(id, 1)).unwrap();
    h.store
        .append(
            id,
            &[
                Event::new(0, 1, TurnStart { turn: 1 }),
                Event::new(1, 1, StepStart { turn: 1, step: 1 }),
            ],
        )
        .unwrap();
    let agent = h.agents.resume(id, spec()).await.unwrap();
    assert_eq!(turn_ends(&agent.events()), [TurnEndReason::Interrupted]);
    assert_stored(&h.store, &agent);
    run_turn(&agent, "again").await;
    assert_eq!(
        turn_ends(&agent.events()),
        [TurnEndReason::Interrupted, TurnEndReason::Completed]
    );
}

#[tokio::test(start_paused = true)]
async fn a_fork_seed_inherits_completed_turns_but_not_the_parents_inbox() {
    let h = Harness::new([
        Response::text("parent answer"),
        Response::text("child answer"),
    ]);
    let parent = h.agent().await;
    run_turn(&parent, "question").await;
    parent.inject(user("parent's pending context")).unwrap();
    h.store.flush(parent.id()).unwrap();
    let child_id = SessionId::new();
    // The parent's log now ends with a splice outside any turn: the whole log is balanced.
    let child = forked(&h, child_id, &parent, 1).await;
    let seed_len = parent.events().len();
    assert_eq!(child.events()[..seed_len], parent.events()[..]);
    assert!(
        matches!(&child.events()[seed_len].body, EventBody::SessionLineage(l) if l.seed_len == seed_len as u64)
    );
    assert!(
        !child.has_pending(),
        "the parent's inbox stays the parent's"
    );
    assert_eq!(child.delegation_depth(), 1);
    run_turn(&child, "follow-up").await;
    let events = child.events();
    assert!(
        matches!(
            events
                .iter()
                .rev()
                .find(|e| e.kind() == EventKind::TurnStart)
                .map(|e| &e.body),
            Some(EventBody::TurnStart(TurnStart { turn: 2 }))
        ),
        "numbering continues after the seed"
    );
    let request = h.model.requests().pop().unwrap();
    assert_eq!(
        request.messages[0].text(),
        "question",
        "the child sees the inherited history"
    );
    assert_balanced(&events);
}

#[tokio::test(start_paused = true)]
async fn the_runtime_depth_option_never_lowers_a_stored_depth() {
    let h = Harness::new([Response::text("ok")]);
    let parent = h.agent().await;
    run_turn(&parent, "a turn to fork").await;
    let child = forked(&h, SessionId::new(), &parent, 2).await;
    let id = child.id();
    child.dispose().await;
    let mut low = spec();
    low.options.subagent_depth = 0;
    let resumed = h.agents.resume(id, low).await.unwrap();
    assert_eq!(resumed.delegation_depth(), 2);
    resumed.dispose().await;
    let high = AgentSpec {
        options: lineage_agent::AgentOptions {
            subagent_depth: 3,
            ..options()
        },
        ..spec()
    };
    assert_eq!(
        h.agents.resume(id, high).await.unwrap().delegation_depth(),
        3
    );
}
