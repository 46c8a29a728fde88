//! An agent that never wrote anything holds no durable session: disposing of it frees its id, and
//! a fork of it inherits nothing. An agent that wrote keeps its id.

mod common;

use common::forked;

use lineage_agent::AgentError;
use lineage_log::{EventBody, EventKind, Header, PolicySource, SessionId, SessionLineage};
use lineage_store::StoreError;
use lineage_testkit::agent::*;
use lineage_testkit::ev;

#[tokio::test(start_paused = true)]
async fn an_agent_disposed_without_writing_leaves_its_id_free() {
    let h = Harness::new([]);
    let id = SessionId::new();
    let agent = h.agents.create(fresh_with_id(id)).await.unwrap();
    assert!(agent.events().is_empty(), "a fresh agent writes nothing");
    agent.dispose().await;
    // Through the registry: the same id is created again.
    let again = h.agents.create(fresh_with_id(id)).await.unwrap();
    assert_eq!(again.id(), id);
    again.dispose().await;
    // Through the store: the same id is created again and written.
    h.store.create(Header::new(id, 1_780_000_000_001)).unwrap();
    h.store
        .append(
            id,
            &[lineage_log::Event::new(
                0,
                0,
                ev::approval("never", PolicySource::Own),
            )],
        )
        .unwrap();
    assert_eq!(h.store.info(id).unwrap().len, 1);
}

#[tokio::test(start_paused = true)]
async fn disposal_frees_only_the_id_of_an_agent_that_wrote_nothing() {
    let h = Harness::new([]);
    // Recorded, admitted but not yet durable: the disposal's flush makes it durable.
    let recorded = h
        .agents
        .create(fresh_with_id(SessionId::new()))
        .await
        .unwrap();
    recorded
        .record(ev::approval("never", PolicySource::Own))
        .unwrap();
    // Written at creation.
    let mut create = fresh_with_id(SessionId::new());
    create.setup = vec![ev::approval("never", PolicySource::Own)];
    let seeded = h.agents.create(create).await.unwrap();
    // Nothing written.
    let lazy = h
        .agents
        .create(fresh_with_id(SessionId::new()))
        .await
        .unwrap();
    for agent in [&recorded, &seeded, &lazy] {
        agent.dispose().await;
    }
    for id in [recorded.id(), seeded.id()] {
        assert_eq!(h.store.info(id).unwrap().len, 1);
        match h.agents.create(fresh_with_id(id)).await {
            Err(AgentError::Store {
                agent,
                source: StoreError::SessionExists { session },
            }) => assert_eq!((agent, session), (id, id)),
            other => panic!("expected SessionExists for {id}, got {other:?}"),
        }
        assert_eq!(h.agents.resume(id, spec()).await.unwrap().events().len(), 1);
    }
    assert!(matches!(
        h.store.info(lazy.id()),
        Err(StoreError::UnknownSession { .. })
    ));
    h.store.create(Header::new(lazy.id(), 0)).unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_disposed_agent_whose_id_was_freed_writes_nothing_to_its_successor() {
    let h = Harness::new([]);
    let id = SessionId::new();
    let stale = h.agents.create(fresh_with_id(id)).await.unwrap();
    stale.dispose().await;
    let successor = h.agents.create(fresh_with_id(id)).await.unwrap();
    match stale.record(ev::approval("stale", PolicySource::Own)) {
        Err(AgentError::NotLive { agent }) => assert_eq!(agent, id),
        other => panic!("expected NotLive, got {other:?}"),
    }
    assert_eq!(
        successor
            .record(ev::approval("fresh", PolicySource::Own))
            .unwrap(),
        0
    );
    successor.flush().await.unwrap();
    let stored = h.store.read_from(id, 0).unwrap();
    assert_eq!(stored.len(), 1);
    assert!(matches!(&stored[0].body, EventBody::ApprovalPolicy(p) if p.policy == "fresh"));
}

#[tokio::test(start_paused = true)]
async fn a_fork_of_an_agent_that_never_wrote_inherits_nothing() {
    let h = Harness::new([]);
    let parent = h.agent().await;
    let child_id = SessionId::new();
    let child = forked(&h, child_id, &parent, 1).await;
    let events = child.events();
    assert_eq!(events.len(), 1);
    match &events[0].body {
        EventBody::SessionLineage(lineage) => assert_eq!(
            **lineage,
            SessionLineage {
                parent: parent.id(),
                seed_len: 0,
                seed_digest: lineage_log::Digest::of_empty(),
                delegation_depth: 1,
            }
        ),
        other => panic!("expected session/lineage, got {other:?}"),
    }
    assert_eq!(child.header().seed_len, 0);
    assert_eq!(child.header().parent, Some(parent.id()));
    assert_eq!(child.delegation_depth(), 1);
    assert_eq!(h.store.children(parent.id()).unwrap(), vec![child_id]);
    // The parent is still unwritten; its child names it, so its id stays taken after disposal.
    assert!(parent.events().is_empty());
    parent.dispose().await;
    assert!(matches!(
        h.store.create(Header::new(parent.id(), 0)),
        Err(StoreError::SessionExists { .. })
    ));
    assert_eq!(
        kinds(&h.store.read_from(child_id, 0).unwrap()),
        vec![EventKind::SessionLineage.name()]
    );
}
