//! A live writer owns its session: while it does, `load` never repairs the session underneath it.
//! An owned session with an open turn is flushed and refused (`LiveTurnOpen`), nothing is written
//! and the owner's next appends are accepted; `inspect` reads it repaired in memory; once the
//! owner lets go, `load` repairs as it always does.

mod common;

use common::*;
use lineage_store::{Store, StoreError};
use lineage_testkit::ev::{self};

#[test]
fn load_of_an_owned_session_mid_turn_is_refused_and_writes_nothing() {
    let store = mem_store();
    let (id, header) = fresh();
    let owner = store.own(id).unwrap();
    let open = open_turn_log();
    store.import(header, &open).unwrap();
    let before = store.info(id).unwrap();

    match store.load(id) {
        Err(StoreError::LiveTurnOpen { session }) => assert_eq!(session, id),
        other => panic!("expected LiveTurnOpen, got {other:?}"),
    }
    let refused = store.load(id).unwrap_err().to_string();
    assert!(
        refused.contains(&id.to_string()) && refused.contains("open in a live agent"),
        "{refused}"
    );
    assert_eq!(store.info(id).unwrap(), before, "no closers were written");

    // inspect repairs in memory only, as for any session.
    let inspected = store.inspect(id).unwrap();
    assert_eq!(inspected.closers, 4);
    assert_eq!(store.info(id).unwrap(), before);

    // The owner goes on where it was: its own closing events are accepted.
    let next = open.len() as u64;
    store
        .append(
            id,
            &events_from(
                next,
                vec![
                    ev::tool_result(2, 1, mid(next, 1), "c1", "found it"),
                    ev::tool_call(2, 1, "c2", "read_file", "{}"),
                    ev::tool_result(2, 1, mid(next, 2), "c2", "read it"),
                    ev::step_end(2, 1),
                    ev::turn_completed(2),
                ],
            ),
        )
        .unwrap();
    // Balanced now: load returns the log and writes nothing.
    let loaded = store.load(id).unwrap();
    assert_eq!(loaded.closers, 0);
    assert_eq!(loaded.events.len(), open.len() + 5);
    assert!(store.is_owned(id));
    owner.release();
    assert!(!store.is_owned(id));
}

#[test]
fn load_flushes_what_the_owner_admitted_before_it_decides() {
    let store = mem_store();
    let (id, header) = fresh();
    let _owner = store.own(id).unwrap();
    store.create(header).unwrap();
    store.admit(id, &completed_turn(1, 0, "admitted")).unwrap();
    let loaded = store.load(id).unwrap();
    assert_eq!(loaded.events, completed_turn(1, 0, "admitted"));
    assert_eq!(
        store.info(id).unwrap().len,
        6,
        "the admitted turn is durable"
    );
    store
        .admit(id, &events_from(6, vec![ev::turn_start(2)]))
        .unwrap();
    assert!(matches!(
        store.load(id),
        Err(StoreError::LiveTurnOpen { .. })
    ));
    assert_eq!(store.info(id).unwrap().len, 7, "flushed, then refused");
}

#[test]
fn once_the_owner_lets_go_load_repairs_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_location(dir.path());
    let (id, header) = fresh();
    {
        let store = Store::open(&path).unwrap();
        let owner = store.own(id).unwrap();
        store.import(header, &open_turn_log()).unwrap();
        assert!(store.load(id).is_err());
        drop(owner);
        assert_eq!(store.load(id).unwrap().closers, 4);
    }
    // Ownership is not stored: another handle of the file repairs nothing more.
    let store = Store::open(&path).unwrap();
    assert!(!store.is_owned(id));
    assert_eq!(store.load(id).unwrap().closers, 0);
}

#[test]
fn a_session_has_one_owner_and_read_only_handles_own_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = store_location(dir.path());
    let store = Store::open(&path).unwrap();
    let (id, header) = fresh();
    store.import(header, &completed_turns(1)).unwrap();
    let owner = store.own(id).unwrap();
    let clone = store.clone();
    match clone.own(id) {
        Err(StoreError::AlreadyOwned { session }) => assert_eq!(session, id),
        other => panic!("expected AlreadyOwned, got {other:?}"),
    }
    drop(owner);
    let again = clone.own(id).unwrap();
    assert_eq!(again.session(), id);
    let reader = Store::open_read_only(&path).unwrap();
    assert!(matches!(reader.own(id), Err(StoreError::ReadOnly)));
}

// Every test above runs on PostgreSQL too.
on_postgres_too! {
    load_of_an_owned_session_mid_turn_is_refused_and_writes_nothing,
    load_flushes_what_the_owner_admitted_before_it_decides,
    once_the_owner_lets_go_load_repairs_the_session,
    a_session_has_one_owner_and_read_only_handles_own_nothing,
}
