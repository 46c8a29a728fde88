//! Deleting sessions: a session's row, blocks and children-index entries go in one commit; a
//! session with descendants is refused unless the whole subtree is asked for; an owned session is
//! refused; appends to a deleted session are refused; every other session stays byte for byte;
//! and `verify` is clean after each deletion, after a reopen, and after a writer killed while
//! deleting.

mod common;

use common::*;
use lineage_log::{Event, ForkSpec, SessionId};
use lineage_store::{DeleteRule, Store, StoreError};
use lineage_testkit::ev::{fork_spec, spawned_child};
use lineage_testkit::process::{
    Helper, after_marker, helper_job, report_line, rerun_this_test, wait_for_line,
};

fn spec(child: SessionId, boundary: Option<u64>) -> ForkSpec {
    fork_spec(child, boundary, T0 + 60_000, 0)
}

/// A tree and a bystander, in a file store with small blocks:
/// `root` (3 turns) ← `child` (a fork, one more turn) ← `grandchild` (a fork of the child);
/// `root` ← `spawned` (a fresh subagent, seed length 0); and `other` (3 turns) ← `other_fork`.
struct Tree {
    location: std::path::PathBuf,
    /// Holds the store file of the redb engine.
    _dir: tempfile::TempDir,
    root: SessionId,
    child: SessionId,
    grandchild: SessionId,
    spawned: SessionId,
    other: SessionId,
    other_fork: SessionId,
}

impl Tree {
    fn path(&self) -> std::path::PathBuf {
        self.location.clone()
    }

    fn open(&self) -> Store {
        Store::open_with(self.path(), small_blocks(4)).unwrap()
    }
}

fn tree() -> Tree {
    let dir = tempfile::tempdir().unwrap();
    let path = store_location(dir.path());
    let store = Store::open_with(&path, small_blocks(4)).unwrap();
    let (root, h) = fresh();
    store.import(h, &completed_turns(3)).unwrap();
    let child = SessionId::new();
    let forked = store.fork(root, &spec(child, None)).unwrap();
    let next = forked.seed_len + 1;
    store
        .append(child, &completed_turn(4, next, "child's own turn"))
        .unwrap();
    let grandchild = SessionId::new();
    store.fork(child, &spec(grandchild, Some(11))).unwrap();
    let spawned = SessionId::new();
    let (spawned_header, lineage) = spawned_child(header(spawned), root);
    let mut spawned_log = events_from(
        0,
        vec![
            lineage,
            lineage_log::SubagentDescriptor::new(lineage_log::DescriptorMode::OneShot, "spawn")
                .into(),
        ],
    );
    spawned_log.extend(completed_turn(1, 2, "look around"));
    store.import(spawned_header, &spawned_log).unwrap();
    let (other, h) = fresh();
    store.import(h, &completed_turns(3)).unwrap();
    let other_fork = SessionId::new();
    store.fork(other, &spec(other_fork, Some(5))).unwrap();
    assert_intact(&store.verify().unwrap());
    store.close().unwrap();
    Tree {
        location: path.clone(),
        _dir: dir,
        root,
        child,
        grandchild,
        spawned,
        other,
        other_fork,
    }
}

fn ids(store: &Store) -> Vec<SessionId> {
    store.list().unwrap().iter().map(|i| i.header.id).collect()
}

#[test]
fn delete_removes_a_leaf_whole_and_leaves_the_rest_byte_for_byte() {
    let tree = tree();
    let before = Dump::of(&tree.path());
    let store = tree.open();
    let info = store.info(tree.grandchild).unwrap();
    let deleted = store
        .delete(tree.grandchild, DeleteRule::Refuse)
        .expect("a leaf has no descendants");
    assert_eq!(deleted.sessions, [tree.grandchild]);
    assert_eq!(deleted.events, info.len);
    assert!(deleted.blocks >= 3, "small blocks: {deleted:?}");
    assert_eq!(
        deleted.bytes,
        Dump::of_blocks_of(&before, tree.grandchild),
        "the bytes of its blocks"
    );

    // Gone from every view, and verify is clean.
    assert!(!ids(&store).contains(&tree.grandchild));
    assert!(
        !store
            .children(tree.child)
            .unwrap()
            .contains(&tree.grandchild)
    );
    assert!(matches!(
        store.info(tree.grandchild),
        Err(StoreError::UnknownSession { session }) if session == tree.grandchild
    ));
    assert_intact(&store.verify().unwrap());
    // Deleting it again is an unknown session.
    assert!(matches!(
        store.delete(tree.grandchild, DeleteRule::Subtree),
        Err(StoreError::UnknownSession { session }) if session == tree.grandchild
    ));
    store.close().unwrap();

    // Reopened: the others are byte for byte what they were; nothing of the leaf is left.
    let after = Dump::of(&tree.path());
    assert!(!after.holds_anything_of(tree.grandchild));
    assert_eq!(after, before.without(&[tree.grandchild]));
    let store = tree.open();
    assert_intact(&store.verify().unwrap());
    assert_eq!(store.list().unwrap().len(), 5);
}

impl Dump {
    fn of_blocks_of(dump: &Dump, session: SessionId) -> u64 {
        dump.blocks
            .iter()
            .filter(|((s, _), _)| *s == session.as_u128())
            .map(|(_, v)| v.len() as u64)
            .sum()
    }
}

#[test]
fn a_session_with_descendants_is_refused_by_default_naming_it_and_their_number() {
    let tree = tree();
    let before = Dump::of(&tree.path());
    let store = tree.open();
    match store.delete(tree.root, DeleteRule::Refuse) {
        Err(StoreError::HasDescendants {
            session,
            descendants,
        }) => {
            assert_eq!(session, tree.root);
            assert_eq!(descendants, 3, "child, spawned and grandchild");
        }
        other => panic!("expected HasDescendants, got {other:?}"),
    }
    let message = store
        .delete(tree.root, DeleteRule::default())
        .unwrap_err()
        .to_string();
    assert!(
        message.contains(&tree.root.to_string()) && message.contains("3 stored session(s)"),
        "{message}"
    );
    match store.delete(tree.child, DeleteRule::Refuse) {
        Err(StoreError::HasDescendants {
            session,
            descendants,
        }) => assert_eq!((session, descendants), (tree.child, 1)),
        other => panic!("expected HasDescendants, got {other:?}"),
    }
    assert_intact(&store.verify().unwrap());
    store.close().unwrap();
    assert_eq!(Dump::of(&tree.path()), before, "a refusal changes nothing");

    // Leaves first, then the parents: each deletion allowed once its descendants are gone.
    let store = tree.open();
    for session in [tree.grandchild, tree.child, tree.spawned, tree.root] {
        store.delete(session, DeleteRule::Refuse).unwrap();
        assert_intact(&store.verify().unwrap());
    }
    assert_eq!(ids(&store), [tree.other, tree.other_fork]);
    store.close().unwrap();
    let gone = [tree.root, tree.child, tree.grandchild, tree.spawned];
    assert_eq!(Dump::of(&tree.path()), before.without(&gone));
}

#[test]
fn subtree_delete_removes_every_descendant_in_one_commit() {
    let tree = tree();
    let before = Dump::of(&tree.path());
    let store = tree.open();
    let deleted = store.delete(tree.root, DeleteRule::Subtree).unwrap();
    assert_eq!(
        deleted.sessions[0], tree.root,
        "the session asked for first"
    );
    let mut got = deleted.sessions.clone();
    got.sort();
    let mut want = vec![tree.root, tree.child, tree.grandchild, tree.spawned];
    want.sort();
    assert_eq!(got, want);
    // Breadth first: the grandchild after its parent.
    let at = |s| deleted.sessions.iter().position(|x| *x == s).unwrap();
    assert!(at(tree.child) < at(tree.grandchild));

    assert_eq!(ids(&store), [tree.other, tree.other_fork]);
    assert!(store.children(tree.root).unwrap().is_empty());
    assert!(store.descendants(tree.root).unwrap().is_empty());
    assert_eq!(store.children(tree.other).unwrap(), [tree.other_fork]);
    let report = store.verify().unwrap();
    assert_intact(&report);
    assert_eq!(report.sessions.len(), 2);
    // A subtree delete of a leaf deletes just the leaf.
    let leaf = store.delete(tree.other_fork, DeleteRule::Subtree).unwrap();
    assert_eq!(leaf.sessions, [tree.other_fork]);
    assert_intact(&store.verify().unwrap());
    store.close().unwrap();

    let after = Dump::of(&tree.path());
    let gone = [
        tree.root,
        tree.child,
        tree.grandchild,
        tree.spawned,
        tree.other_fork,
    ];
    assert_eq!(after, before.without(&gone));
    assert_eq!(after.rows.len(), 1);
    assert!(after.children.is_empty());
    // The other session reads back whole after a reopen.
    let store = tree.open();
    assert_intact(&store.verify().unwrap());
    assert_eq!(
        store.inspect(tree.other).unwrap().events,
        completed_turns(3)
    );
}

#[test]
fn a_session_a_live_writer_owns_is_refused_and_so_is_a_subtree_holding_one() {
    let tree = tree();
    let store = tree.open();
    let owner = store.own(tree.grandchild).unwrap();
    match store.delete(tree.grandchild, DeleteRule::Refuse) {
        Err(StoreError::OwnedSession { session, owned }) => {
            assert_eq!((session, owned), (tree.grandchild, tree.grandchild));
        }
        other => panic!("expected OwnedSession, got {other:?}"),
    }
    let refused = store.delete(tree.root, DeleteRule::Subtree).unwrap_err();
    match &refused {
        StoreError::OwnedSession { session, owned } => {
            assert_eq!((*session, *owned), (tree.root, tree.grandchild));
        }
        other => panic!("expected OwnedSession, got {other:?}"),
    }
    let message = refused.to_string();
    assert!(
        message.contains(&tree.root.to_string()) && message.contains(&tree.grandchild.to_string()),
        "{message}"
    );
    assert_eq!(ids(&store).len(), 6, "nothing was deleted");
    assert_intact(&store.verify().unwrap());
    owner.release();
    assert_eq!(
        store
            .delete(tree.root, DeleteRule::Subtree)
            .unwrap()
            .sessions
            .len(),
        4
    );
    assert_intact(&store.verify().unwrap());
}

#[test]
fn batches_admitted_before_a_delete_go_with_it_and_later_writes_are_refused() {
    let tree = tree();
    let store = Store::open_with(
        tree.path(),
        lineage_store::StoreOptions {
            commit_window: std::time::Duration::from_secs(3600),
            ..small_blocks(4)
        },
    )
    .unwrap();
    let len = store.info(tree.other_fork).unwrap().len;
    // Admitted, not yet durable (the commit window is long): the deletion's commit takes it.
    store
        .admit(tree.other_fork, &completed_turn(2, len, "pending"))
        .unwrap();
    let deleted = store.delete(tree.other_fork, DeleteRule::Refuse).unwrap();
    assert_eq!(
        deleted.events,
        len + 6,
        "the admitted batch was written, then deleted"
    );

    let more = completed_turn(3, len + 6, "too late");
    for result in [
        store.append(tree.other_fork, &more),
        store.flush(tree.other_fork),
        store.load(tree.other_fork).map(drop),
        store
            .fork(tree.other_fork, &spec(SessionId::new(), None))
            .map(drop),
    ] {
        assert!(
            matches!(result, Err(StoreError::UnknownSession { session }) if session == tree.other_fork),
            "{result:?}"
        );
    }
    // The other sessions write on.
    let other_len = store.info(tree.other).unwrap().len;
    store
        .append(tree.other, &completed_turn(4, other_len, "still here"))
        .unwrap();
    store.flush_all().unwrap();
    assert_intact(&store.verify().unwrap());
    store.close().unwrap();
    assert!(!Dump::of(&tree.path()).holds_anything_of(tree.other_fork));
}

#[test]
fn unknown_sessions_and_read_only_stores_are_refused() {
    let tree = tree();
    let store = tree.open();
    let stranger = SessionId::new();
    assert!(matches!(
        store.delete(stranger, DeleteRule::Refuse),
        Err(StoreError::UnknownSession { session }) if session == stranger
    ));
    // Created but never written: not stored, so not deletable (it is forgotten instead).
    let (unwritten, h) = fresh();
    store.create(h).unwrap();
    assert!(matches!(
        store.delete(unwritten, DeleteRule::Refuse),
        Err(StoreError::UnknownSession { .. })
    ));
    assert!(store.forget_unwritten(unwritten));
    store.close().unwrap();
    let reader = Store::open_read_only(tree.path()).unwrap();
    assert!(matches!(
        reader.delete(tree.grandchild, DeleteRule::Refuse),
        Err(StoreError::ReadOnly)
    ));
    assert_eq!(ids(&reader).len(), 6);
}

#[test]
fn a_new_session_may_be_written_under_a_deleted_id() {
    let store = mem_store();
    let (id, h) = fresh();
    store.import(h.clone(), &completed_turns(2)).unwrap();
    store.delete(id, DeleteRule::Refuse).unwrap();
    store.import(h, &completed_turns(1)).unwrap();
    assert_eq!(store.info(id).unwrap().len, 6);
    store.append(id, &completed_turn(2, 6, "again")).unwrap();
    assert_intact(&store.verify().unwrap());
}

// ---------------------------------------------------------------------------------------------
// A writer killed while deleting.

/// How many sessions the crash test's store holds.
const CRASH_SESSIONS: usize = 24;

/// The deleter (the crash test re-run with the store's location as its job): opens the store and
/// deletes its sessions oldest first, one commit each, saying `deleting <n>` before the n-th,
/// until it is killed.
fn delete_until_killed(path: &str) {
    let store = Store::open(path).expect("the helper opens the store");
    let sessions = ids(&store);
    report_line("ready");
    for (n, session) in sessions.into_iter().enumerate() {
        report_line(&format!("deleting {}", n + 1));
        store.delete(session, DeleteRule::Subtree).expect("delete");
    }
    report_line("done");
    std::thread::sleep(std::time::Duration::from_secs(60));
}

#[test]
fn a_writer_killed_while_deleting_leaves_each_session_whole_or_gone() {
    if let Some(path) = helper_job() {
        return delete_until_killed(&path);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = store_location(dir.path());
    let store = Store::open_with(&path, small_blocks(8)).unwrap();
    let mut order = Vec::new();
    for _ in 0..CRASH_SESSIONS {
        let (id, h) = fresh();
        store.import(h, &completed_turns(200)).unwrap();
        order.push(id);
    }
    store.close().unwrap();
    let before = Dump::of(&path);

    for kill_after in [1usize, 7, 15] {
        let mut helper = Helper::spawn(&mut rerun_this_test(&path));
        let lines = helper.lines();
        wait_for_line(&lines, |l| after_marker(l, "ready").map(drop));
        // Killed as the deletion of session `kill_after` begins: it is committed or not.
        let started: usize = wait_for_line(&lines, |l| {
            after_marker(l, "deleting ")
                .and_then(|n| n.parse().ok())
                .filter(|n| *n >= kill_after)
        });
        assert!(!helper.kill(), "the helper was still deleting");
        let reported = started - 1;

        // The next writer recovers the file; every session is whole or gone, and the gone ones
        // are a prefix of the deletion order at least as long as what was reported.
        let store = Store::open(&path).unwrap();
        assert_intact(&store.verify().unwrap());
        let left = ids(&store);
        let gone: Vec<SessionId> = order
            .iter()
            .copied()
            .filter(|s| !left.contains(s))
            .collect();
        assert!(gone.len() >= reported, "{} < {reported}", gone.len());
        assert_eq!(gone, order[..gone.len()], "deleted in order, none torn");
        store.close().unwrap();
        assert_eq!(Dump::of(&path), before.without(&gone));
        // Put the deleted ones back for the next round.
        let store = Store::open_with(&path, small_blocks(8)).unwrap();
        for id in &gone {
            store.import(header(*id), &completed_turns(200)).unwrap();
        }
        store.close().unwrap();
        let restored = Dump::of(&path);
        assert_eq!(restored.rows.len(), CRASH_SESSIONS);
        assert_eq!(restored, before, "restored byte for byte");
    }
}

#[test]
fn metadata_of_a_session_and_a_fork() {
    let store = mem_store();
    let (id, h) = fresh();
    let mut events = completed_turns(1);
    let meta = lineage_log::MetaUpdate::new()
        .title("Parser fix")
        .tag("user", "alice")
        .to_custom()
        .unwrap();
    events.push(Event::new(6, T0 as i64, lineage_log::EventBody::from(meta)));
    store.import(h, &events).unwrap();
    let got = store.session_meta(id).unwrap();
    assert_eq!(got.title.as_deref(), Some("Parser fix"));
    assert_eq!(got.tags.get("user").map(String::as_str), Some("alice"));
    // A fork inherits the event in its prefix but not the metadata.
    let child = SessionId::new();
    store.fork(id, &spec(child, None)).unwrap();
    assert_eq!(store.session_meta(child).unwrap(), Default::default());
    assert!(matches!(
        store.session_meta(SessionId::new()),
        Err(StoreError::UnknownSession { .. })
    ));
}

// Every test above runs on PostgreSQL too.
on_postgres_too! {
    delete_removes_a_leaf_whole_and_leaves_the_rest_byte_for_byte,
    a_session_with_descendants_is_refused_by_default_naming_it_and_their_number,
    subtree_delete_removes_every_descendant_in_one_commit,
    a_session_a_live_writer_owns_is_refused_and_so_is_a_subtree_holding_one,
    batches_admitted_before_a_delete_go_with_it_and_later_writes_are_refused,
    unknown_sessions_and_read_only_stores_are_refused,
    a_new_session_may_be_written_under_a_deleted_id,
    a_writer_killed_while_deleting_leaves_each_session_whole_or_gone,
    metadata_of_a_session_and_a_fork,
}
