//! A session created but never written holds nothing durable: forgetting it frees its id, and a
//! fork of it inherits nothing. A session with anything admitted, or one a fork took as its parent,
//! is never forgotten.

mod common;

use common::*;
use lineage_log::{Event, ForkSpec, LogError, SessionId, SessionLineage, fork_session};
use lineage_store::StoreError;
use lineage_testkit::ev::fork_spec;

fn spec(child: SessionId, boundary: Option<u64>) -> ForkSpec {
    fork_spec(child, boundary, T0 + 9_000, 1)
}

fn assert_exists<T: std::fmt::Debug>(result: Result<T, StoreError>, id: SessionId) {
    match result {
        Err(StoreError::SessionExists { session }) => assert_eq!(session, id),
        other => panic!("expected SessionExists for {id}, got {other:?}"),
    }
}

#[test]
fn a_created_but_unwritten_session_is_forgotten_and_its_id_created_again() {
    let store = mem_store();
    let (id, header) = fresh();
    store.create(header.clone()).unwrap();
    assert_exists(store.create(header.clone()), id);
    assert!(store.forget_unwritten(id), "nothing was written: forgotten");
    assert!(store.list().unwrap().is_empty());
    assert!(
        !store.forget_unwritten(id),
        "a second call has nothing to forget"
    );
    // The id is free: a new session takes it and is written as any other.
    let mut again = header;
    again.cwd = Some("/work/elsewhere".into());
    store.create(again.clone()).unwrap();
    store.append(id, &completed_turns(1)).unwrap();
    let loaded = store.inspect(id).unwrap();
    assert_eq!(loaded.header, again);
    assert_eq!(loaded.events, completed_turns(1));
    assert_eq!(store.list().unwrap().len(), 1);
    assert_intact(&store.verify().unwrap());
}

#[test]
fn a_session_with_admitted_events_is_never_forgotten() {
    // A long commit window: the admitted batch is still queued when the forget is asked for.
    let store = mem_store_with(lineage_store::StoreOptions {
        commit_window: std::time::Duration::from_secs(3_600),
        ..lineage_store::StoreOptions::default()
    });
    let (id, header) = fresh();
    store.create(header.clone()).unwrap();
    store.admit(id, &completed_turns(1)).unwrap();
    assert!(!store.forget_unwritten(id), "admitted, not yet durable");
    assert_exists(store.create(header.clone()), id);
    store.flush(id).unwrap();
    assert!(!store.forget_unwritten(id), "durable");
    assert_exists(store.create(header), id);
    assert_eq!(store.inspect(id).unwrap().events, completed_turns(1));
}

#[test]
fn forgetting_a_stored_or_unknown_session_changes_nothing() {
    let store = mem_store();
    let (stored, header) = fresh();
    store.import(header.clone(), &completed_turns(2)).unwrap();
    assert!(!store.forget_unwritten(stored));
    assert_exists(store.create(header), stored);
    assert_eq!(store.read_from(stored, 0).unwrap(), completed_turns(2));
    assert!(!store.forget_unwritten(SessionId::new()));
}

#[test]
fn a_refused_first_batch_leaves_the_session_unwritten() {
    let store = mem_store();
    let (id, header) = fresh();
    store.create(header.clone()).unwrap();
    // Starts at seq 1: refused whole, nothing admitted.
    let gap = events_from(1, vec![lineage_testkit::ev::turn_start(1)]);
    assert!(store.admit(id, &gap).is_err());
    assert!(store.forget_unwritten(id));
    store.create(header).unwrap();
}

#[test]
fn a_fork_of_a_created_but_unwritten_session_inherits_nothing() {
    let store = mem_store();
    let (parent, parent_header) = fresh();
    store.create(parent_header.clone()).unwrap();
    let child = SessionId::new();
    let header = store.fork(parent, &spec(child, None)).unwrap();
    // What the pure fork of an empty log gives.
    let expected = fork_session(&parent_header, &[], &spec(child, None)).unwrap();
    assert_eq!(header, expected.header);
    assert_eq!(header.parent, Some(parent));
    assert_eq!(header.seed_len, 0);
    assert_eq!(header.cwd, parent_header.cwd);
    let loaded = store.inspect(child).unwrap();
    assert_eq!(loaded.events, expected.events);
    assert_eq!(
        loaded.events,
        vec![Event::new(
            0,
            (T0 + 9_000) as i64,
            SessionLineage {
                parent,
                seed_len: 0,
                seed_digest: digest_of(&[]),
                delegation_depth: 1,
            }
        )]
    );
    assert_eq!(store.info(child).unwrap().len, 1);
    assert_eq!(store.children(parent).unwrap(), vec![child]);
    // The parent is still unwritten: not listed, and its own first append writes its row.
    assert_eq!(
        store
            .list()
            .unwrap()
            .iter()
            .map(|i| i.header.id)
            .collect::<Vec<_>>(),
        vec![child]
    );
    store.append(parent, &completed_turns(1)).unwrap();
    assert_eq!(
        store.info(parent).unwrap().len,
        completed_turns(1).len() as u64
    );
    assert_intact(&store.verify().unwrap());
}

#[test]
fn a_fork_of_a_created_but_unwritten_session_refuses_any_boundary() {
    let store = mem_store();
    let (parent, parent_header) = fresh();
    store.create(parent_header).unwrap();
    let child = SessionId::new();
    match store.fork(parent, &spec(child, Some(0))) {
        Err(StoreError::Rejected {
            session,
            source: LogError::InvalidBoundary { boundary, len },
        }) => {
            assert_eq!(session, parent);
            assert_eq!((boundary, len), (0, 0));
        }
        other => panic!("expected InvalidBoundary, got {other:?}"),
    }
    assert!(store.children(parent).unwrap().is_empty());
    assert!(matches!(
        store.info(child),
        Err(StoreError::UnknownSession { .. })
    ));
}

#[test]
fn a_session_forked_from_while_unwritten_keeps_its_id() {
    let store = mem_store();
    let (parent, parent_header) = fresh();
    store.create(parent_header.clone()).unwrap();
    let child = SessionId::new();
    store.fork(parent, &spec(child, None)).unwrap();
    // Its child names it: freeing the id would let an unrelated session inherit the child.
    assert!(!store.forget_unwritten(parent));
    assert_exists(store.create(parent_header), parent);
}

// Every test above runs on PostgreSQL too.
on_postgres_too! {
    a_created_but_unwritten_session_is_forgotten_and_its_id_created_again,
    a_session_with_admitted_events_is_never_forgotten,
    forgetting_a_stored_or_unknown_session_changes_nothing,
    a_refused_first_batch_leaves_the_session_unwritten,
    a_fork_of_a_created_but_unwritten_session_inherits_nothing,
    a_fork_of_a_created_but_unwritten_session_refuses_any_boundary,
    a_session_forked_from_while_unwritten_keeps_its_id,
}
