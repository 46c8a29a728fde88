//! Store format 1 (a block is `count ‖ S(last) ‖ canonical records back to back`, before packed
//! blocks) opens read-only with every read working, a writable open of it is refused without
//! writing to the file at all, and `Store::upgrade` rewrites it in format 2 losing and altering
//! nothing: the store id, every session's row (header, length, head digest, revision) byte for
//! byte, every event, every prefix's running digest, the children index and the session metadata
//! are the same afterwards, and the upgraded store takes writes.
//!
//! The stores upgraded are the golden format-1 files the format-1 writer wrote
//! (`schema/golden/store-v1`) and larger ones this file writes in the format-1 layout with redb
//! directly (`lineage_testkit::store_v1::write_store`).

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::*;
use lineage_log::{
    Event, EventBody, EventKind, ForkSpec, Header, SessionId, SessionMeta, fork_session,
};
use lineage_store::{KindStats, Loaded, Scan, SessionInfo, Store, StoreError, Upgraded};
use lineage_testkit::files::names_in;
use lineage_testkit::store_v1::{golden_copy, write_store};
use lineage_testkit::{ev, last_turn, realistic_session, running_digests};

/// The golden session `019b76da-a800-7000-8000-0000000000NN`.
fn golden_id(nn: &str) -> SessionId {
    format!("019b76da-a800-7000-8000-0000000000{nn}")
        .parse()
        .expect("a session id")
}

/// One session as every read of a store gives it.
#[derive(Debug, PartialEq)]
struct SessionView {
    info: SessionInfo,
    /// `inspect`: the stored events, then the crash-repair closers.
    inspected: Loaded,
    meta: SessionMeta,
    children: Vec<SessionId>,
    descendants: Vec<SessionId>,
    /// What `verify` read: events, blocks are left out (their layout is the format's).
    verified_events: u64,
    open_turn: Option<u32>,
}

impl SessionView {
    /// The stored events, without the closers.
    fn stored(&self) -> &[Event] {
        &self.inspected.events[..self.inspected.events.len() - self.inspected.closers]
    }
}

/// Everything a store says about itself and its sessions, minus what depends on the block layout
/// (block counts, block bytes, the file size).
#[derive(Debug, PartialEq)]
struct StoreView {
    store_id: uuid::Uuid,
    sessions: BTreeMap<SessionId, SessionView>,
    stat_sessions: u64,
    stat_events: u64,
    stat_record_bytes: u64,
    by_kind: BTreeMap<EventKind, KindStats>,
}

impl StoreView {
    fn session(&self, id: SessionId) -> &SessionView {
        self.sessions
            .get(&id)
            .unwrap_or_else(|| panic!("session {id} is in the store"))
    }
}

/// A way to scan a session from a seq: checked or unchecked.
type ScanFrom = fn(&Store, SessionId, u64) -> lineage_store::Result<Scan>;

/// Reads everything `store` holds through every read of its API, checking that the reads agree
/// with each other (list and info, inspect, checked and unchecked scans, `read_from`), that each
/// head is the running digest of the events read, each child's seed digest its parent's running
/// digest at the boundary, and that `verify` finds nothing wrong.
fn read_everything(store: &Store) -> StoreView {
    let list = store.list().expect("list");
    let report = store.verify().expect("verify runs");
    assert_intact(&report);
    assert_eq!(
        report
            .sessions
            .iter()
            .map(|s| s.session)
            .collect::<Vec<_>>(),
        list.iter().map(|i| i.header.id).collect::<Vec<_>>(),
        "verify reports every listed session, in id order"
    );
    let mut sessions = BTreeMap::new();
    for (listed, verified) in list.into_iter().zip(&report.sessions) {
        let id = listed.header.id;
        let info = store.info(id).expect("info");
        assert_eq!(info, listed, "{id}: info agrees with list");
        let inspected = store.inspect(id).expect("inspect");
        assert_eq!(inspected.header, info.header, "{id}: inspect's header");
        let stored = &inspected.events[..inspected.events.len() - inspected.closers];
        assert_eq!(
            stored.len() as u64,
            info.len,
            "{id}: inspect reads len events"
        );
        for (i, event) in stored.iter().enumerate() {
            assert_eq!(event.seq, i as u64, "{id}: seqs are contiguous from 0");
        }
        // A checked scan, whole and from the middle, reads the same events and closers.
        let mut scan = store.scan(id, 0).expect("scan");
        assert_eq!(scan.info(), &info, "{id}: the scan's info");
        let scanned: Vec<Event> = scan.by_ref().map(|e| e.expect("scan reads")).collect();
        assert!(scanned == stored, "{id}: scan reads what inspect reads");
        assert_eq!(
            scan.closers(),
            Some(&inspected.events[stored.len()..]),
            "{id}: scan's closers are inspect's"
        );
        let middle = info.len / 2;
        let scans: [(&str, ScanFrom); 2] = [
            ("scan", Store::scan),
            ("unchecked scan", Store::scan_unchecked),
        ];
        for (how, scan) in scans {
            let scan = scan(store, id, middle).unwrap_or_else(|e| panic!("{id}: {how}: {e}"));
            let tail: Vec<Event> = scan.map(|e| e.expect("the scan reads")).collect();
            assert!(
                tail == stored[middle as usize..],
                "{id}: {how} from {middle}"
            );
        }
        // `read_from` from 0, from a seq inside the log and past its end.
        assert!(store.read_from(id, 0).expect("read_from 0") == stored);
        let late = info.len - info.len / 3;
        assert!(
            store.read_from(id, late).expect("read_from") == stored[late as usize..],
            "{id}: read_from {late}"
        );
        assert!(
            store
                .read_from(id, info.len)
                .expect("read_from the end")
                .is_empty()
        );
        // The head is the running digest of the events read, computed independently.
        let digests = running_digests(stored);
        assert_eq!(info.head, digests[stored.len()], "{id}: head is S(len - 1)");
        assert_eq!(verified.events, info.len, "{id}: verify reads every event");
        let view = SessionView {
            meta: store.session_meta(id).expect("session_meta"),
            children: store.children(id).expect("children"),
            descendants: store.descendants(id).expect("descendants"),
            verified_events: verified.events,
            open_turn: verified.open_turn,
            info,
            inspected,
        };
        sessions.insert(id, view);
    }
    // A child's seed digest is its parent's running digest at the boundary, and its inherited
    // prefix is the parent's.
    for view in sessions.values() {
        let header = &view.info.header;
        let (Some(parent), true) = (header.parent, header.seed_len > 0) else {
            continue;
        };
        let Some(parent) = sessions.get(&parent) else {
            continue;
        };
        let seed = header.seed_len as usize;
        assert!(
            view.stored()[..seed] == parent.stored()[..seed],
            "{}: its seed is its parent's prefix",
            header.id
        );
        assert_eq!(
            header.seed_digest,
            Some(running_digests(&parent.stored()[..seed])[seed]),
            "{}: seed digest",
            header.id
        );
        assert!(parent.children.contains(&header.id), "children index");
    }
    let stats = store.stats().expect("stats");
    StoreView {
        store_id: store.store_id(),
        sessions,
        stat_sessions: stats.sessions,
        stat_events: stats.events,
        stat_record_bytes: stats.record_bytes,
        by_kind: stats.by_kind,
    }
}

/// Fails unless `after` reads exactly as `before`, naming the first difference (a whole-view
/// `assert_eq!` would print every event).
fn assert_same(before: &StoreView, after: &StoreView) {
    assert_eq!(before.store_id, after.store_id, "the store id");
    assert_eq!(
        before.sessions.keys().collect::<Vec<_>>(),
        after.sessions.keys().collect::<Vec<_>>(),
        "the sessions"
    );
    for (id, old) in &before.sessions {
        let new = &after.sessions[id];
        assert_eq!(old.info, new.info, "{id}: header, len, head and revision");
        assert_eq!(
            old.inspected.events.len(),
            new.inspected.events.len(),
            "{id}: events"
        );
        if let Some(seq) = (0..old.inspected.events.len())
            .find(|&i| old.inspected.events[i] != new.inspected.events[i])
        {
            panic!(
                "{id}: the event at {seq} changed:\nbefore {:?}\nafter  {:?}",
                old.inspected.events[seq], new.inspected.events[seq]
            );
        }
        assert_eq!(old.inspected, new.inspected, "{id}: inspect");
        assert_eq!(old.meta, new.meta, "{id}: session metadata");
        assert_eq!(old.children, new.children, "{id}: children");
        assert_eq!(old.descendants, new.descendants, "{id}: descendants");
        assert_eq!(old.verified_events, new.verified_events, "{id}: verify");
        assert_eq!(old.open_turn, new.open_turn, "{id}: open turn");
    }
    assert_eq!(before.stat_sessions, after.stat_sessions, "stats: sessions");
    assert_eq!(before.stat_events, after.stat_events, "stats: events");
    assert_eq!(
        before.stat_record_bytes, after.stat_record_bytes,
        "stats: record bytes"
    );
    assert_eq!(before.by_kind, after.by_kind, "stats by kind");
    assert!(before == after);
}

/// The `meta` table of a closed store file: format version (u32 LE) and store id.
fn raw_meta(path: &Path) -> (u32, uuid::Uuid) {
    use redb::{ReadableDatabase, ReadableTable};
    let db = raw_db(path);
    let txn = db.begin_read().unwrap();
    let meta = txn.open_table(META).unwrap();
    assert_eq!(
        meta.get("magic").unwrap().expect("magic").value(),
        b"lineage store"
    );
    let version = meta.get("format_version").unwrap().expect("format_version");
    let version = u32::from_le_bytes(version.value().try_into().expect("4 bytes"));
    let id = meta.get("store_id").unwrap().expect("store_id");
    (
        version,
        uuid::Uuid::from_slice(id.value()).expect("16 bytes"),
    )
}

/// Checks every block of a closed store file against the events `view` read, independently of
/// the store's code: each session's blocks start at seq 0 and follow one another without a gap,
/// their counts add up to its length, and each block's header holds `S` at its last record as
/// computed here from the events. In format 1 each block's body must be the events' canonical
/// records; in format 2 it starts with a body encoding the format knows (0 packed, 1 LZ4).
fn check_raw_blocks(path: &Path, view: &StoreView, format: u32) {
    let dump = Dump::of(path);
    let mut by_session: BTreeMap<u128, Vec<(u64, &Vec<u8>)>> = BTreeMap::new();
    for ((session, first_seq), value) in &dump.blocks {
        by_session
            .entry(*session)
            .or_default()
            .push((*first_seq, value));
    }
    assert_eq!(
        by_session.keys().copied().collect::<Vec<_>>(),
        view.sessions
            .keys()
            .map(|s| s.as_u128())
            .collect::<Vec<_>>(),
        "blocks belong to the stored sessions, and every one has some"
    );
    for (id, session) in &view.sessions {
        let events = session.stored();
        let digests = running_digests(events);
        let mut expected = 0u64;
        for (first_seq, value) in &by_session[&id.as_u128()] {
            assert_eq!(*first_seq, expected, "{id}: blocks follow one another");
            let count = u32::from_le_bytes(value[..4].try_into().unwrap()) as u64;
            assert!(count > 0, "{id}: block at {first_seq} holds records");
            let last = first_seq + count;
            assert!(last <= events.len() as u64, "{id}: block runs past the log");
            assert_eq!(
                &value[4..BLOCK_HEADER_LEN],
                &digests[last as usize].0,
                "{id}: the block at {first_seq} holds S({})",
                last - 1
            );
            let body = &value[BLOCK_HEADER_LEN..];
            match format {
                1 => {
                    let mut records = Vec::new();
                    lineage_log::Encoder::new()
                        .encode_all(&events[*first_seq as usize..last as usize], &mut records);
                    assert!(
                        body == records,
                        "{id}: format-1 block at {first_seq} holds the canonical records"
                    );
                }
                _ => assert!(
                    matches!(body.first(), Some(0 | 1)),
                    "{id}: format-2 block at {first_seq} has a known body encoding"
                ),
            }
            expected = last;
        }
        assert_eq!(
            expected, session.info.len,
            "{id}: the blocks hold every event"
        );
    }
}

/// Fails unless opening the store at `path` for writing is refused as a format-1 store that needs
/// `lineage upgrade`, and the refusal left the store as it was: still format 1 with the same id,
/// every row, block and children entry byte for byte. (The file's bytes are another matter: see
/// [`a_refused_writable_open_leaves_the_format_1_file_byte_for_byte`].)
fn assert_writable_open_refused(path: &Path) {
    let meta = raw_meta(path);
    assert_eq!(meta.0, 1, "a format-1 store");
    let tables = Dump::of(path);
    match Store::open(path) {
        Err(StoreError::UpgradeRequired { store, found }) => {
            assert_eq!(found, 1);
            assert_eq!(store, path.display().to_string());
        }
        Err(other) => panic!("expected UpgradeRequired, got {other:?}"),
        Ok(_) => panic!("a format-1 store opened for writing"),
    }
    let message = Store::open(path).expect_err("refused again").to_string();
    assert!(
        message.contains("lineage upgrade") && message.contains("read-only"),
        "{message}"
    );
    assert_eq!(raw_meta(path), meta, "a refused open left the meta table");
    assert!(
        Dump::of(path) == tables,
        "a refused writable open changed the store's tables"
    );
}

/// Upgrades the format-1 store at `path` and checks that nothing was lost or altered: it reads the
/// same through every read before and after ([`read_everything`], [`assert_same`]); its rows and
/// children index are byte for byte the same, its meta says format 2 with the same store id, and
/// its blocks hold the same digests ([`check_raw_blocks`]); no temporary file is left beside it.
/// Returns what the store read before and what the upgrade said.
fn upgrade_losing_nothing(path: &Path) -> (StoreView, Upgraded) {
    let reader = Store::open_read_only(path).expect("a format-1 store opens read-only");
    assert!(reader.is_read_only());
    let before = read_everything(&reader);
    drop(reader);
    assert_writable_open_refused(path);
    assert_eq!(raw_meta(path), (1, before.store_id), "a format-1 store");
    check_raw_blocks(path, &before, 1);
    let raw_before = Dump::of(path);

    let upgraded = Store::upgrade(path).expect("the upgrade");
    let events: u64 = before.sessions.values().map(|s| s.info.len).sum();
    assert_eq!(
        upgraded,
        Upgraded {
            from: 1,
            to: 2,
            sessions: before.sessions.len(),
            events,
        }
    );
    let dir = path.parent().unwrap();
    assert_eq!(
        names_in(dir),
        [path.file_name().unwrap().to_str().unwrap()],
        "the upgrade leaves only the store"
    );

    let reader = Store::open_read_only(path).expect("the upgraded store opens read-only");
    let after = read_everything(&reader);
    drop(reader);
    assert_same(&before, &after);

    assert_eq!(raw_meta(path), (2, before.store_id), "a format-2 store");
    check_raw_blocks(path, &after, 2);
    let raw_after = Dump::of(path);
    assert_eq!(
        raw_after.rows, raw_before.rows,
        "rows are kept byte for byte"
    );
    assert_eq!(
        raw_after.children, raw_before.children,
        "the children index"
    );
    (before, upgraded)
}

/// The events of the golden session `…c3`, as its README describes them: an ignorable
/// `lineage.session/meta` custom event, an ignorable opaque record (tag 4000, payload `010203`),
/// then a turn left open after `turn/start`, `step/start`, the user's `hello` and three deltas.
fn assert_golden_c3(c3: &SessionView) {
    let events = c3.stored();
    assert_eq!(events.len(), 8);
    assert_eq!(c3.inspected.closers, 2, "loading closes the open turn");
    assert_eq!(c3.inspected.events.len(), 10);
    assert_eq!(c3.open_turn, Some(1), "verify reports the open turn");
    match &events[0].body {
        EventBody::Custom(custom) => {
            assert_eq!(&*custom.type_name, "lineage.session/meta");
            assert!(custom.ignorable);
        }
        other => panic!("expected the meta event, got {other:?}"),
    }
    match &events[1].body {
        EventBody::Opaque(opaque) => {
            assert_eq!(opaque.tag, 4000);
            assert_eq!(&*opaque.payload, &[1, 2, 3]);
        }
        other => panic!("expected the opaque record, got {other:?}"),
    }
    let kinds: Vec<EventKind> = events.iter().map(|e| e.body.kind()).collect();
    assert_eq!(
        kinds[2..],
        [
            EventKind::TurnStart,
            EventKind::StepStart,
            EventKind::UserMessage,
            EventKind::AssistantChunk,
            EventKind::AssistantChunk,
            EventKind::AssistantChunk,
        ]
    );
    assert_eq!(events[4].body, ev::user(ev::mid(9100), "hello"));
    for (i, event) in events.iter().enumerate() {
        assert_eq!(
            event.time_ms,
            1_767_225_800_000 + 3 * i as i64,
            "time of {i}"
        );
    }
    assert_eq!(c3.info.header.created_at_ms, 1_767_225_800_000);
    assert_eq!(c3.meta.title.as_deref(), Some("golden"));
    assert_eq!(
        c3.meta.tags.get("kind").map(String::as_str),
        Some("v1"),
        "tag kind=v1"
    );
}

/// The golden `sessions.redb` holds what its README says, and every read of the API works on it
/// while it is in format 1: `…a1` is `realistic_session(21, 3000)` exactly, created at
/// 1767225600000 in `/work/golden`, in 15 blocks; `…b2` is a fork of all of it with one more turn
/// answering `forked and on`, and `…a1`'s only child; `…c3` ends in an open turn that loading closes
/// with 2 closers, and is titled `golden`. Verify finds nothing wrong.
#[test]
fn the_golden_format_1_store_opens_read_only_and_reads_whole() {
    let (_dir, path) = golden_copy("sessions.redb");
    let bytes = std::fs::read(&path).unwrap();
    let store = Store::open_read_only(&path).expect("a format-1 store opens read-only");
    assert!(store.is_read_only());
    let view = read_everything(&store);
    let (a1, b2, c3) = (golden_id("a1"), golden_id("b2"), golden_id("c3"));
    assert_eq!(
        view.sessions.keys().copied().collect::<Vec<_>>(),
        [a1, b2, c3]
    );

    let a = view.session(a1);
    let realistic = realistic_session(21, 3000);
    assert_eq!(realistic.len(), 3020);
    assert!(
        a.stored() == realistic,
        "…a1 is realistic_session(21, 3000)"
    );
    assert_eq!(a.inspected.closers, 0);
    assert_eq!(
        a.info.header,
        Header::new(a1, 1_767_225_600_000).with_cwd("/work/golden")
    );
    assert_eq!(a.children, [b2]);
    assert_eq!(a.descendants, [b2]);

    let b = view.session(b2);
    assert_eq!(b.info.len, 3029);
    assert_eq!(b.info.header.parent, Some(a1));
    assert_eq!(b.info.header.seed_len, 3020);
    assert_eq!(b.info.header.created_at_ms, 1_767_225_700_000);
    assert_eq!(b.info.header.delegation_depth, 0);
    assert!(b.stored()[..3020] == realistic, "…b2 inherits all of …a1");
    assert_eq!(b.stored()[3020].body.kind(), EventKind::SessionLineage);
    let answer = ev::assistant_text(last_turn(b.stored()), 1, ev::mid(9001), "forked and on");
    assert!(
        b.stored().iter().any(|e| e.body == answer),
        "…b2's own turn answers `forked and on`"
    );
    assert_eq!(b.stored()[3028].body.kind(), EventKind::TurnEnd);
    assert!(b.children.is_empty());

    assert_golden_c3(view.session(c3));

    // Loading repairs, so a read-only store refuses it; reads go on working.
    assert!(store.load(c3).is_err(), "a read-only store does not repair");
    assert_eq!(store.info(c3).unwrap().len, 8);

    assert_eq!(view.stat_sessions, 3);
    assert_eq!(view.stat_events, 6057);
    assert_eq!(
        view.by_kind.values().map(|k| k.events).sum::<u64>(),
        6057,
        "stats by kind count every event"
    );
    let blocks = store.stats().unwrap().blocks;
    drop(store);
    assert!(
        std::fs::read(&path).unwrap() == bytes,
        "read-only opens leave the golden file byte for byte"
    );
    assert_writable_open_refused(&path);

    // The layout the README describes, read with redb directly.
    assert_eq!(raw_meta(&path), (1, view.store_id));
    let dump = Dump::of(&path);
    assert_eq!(blocks, dump.blocks.len() as u64, "stats count the blocks");
    assert_eq!(
        dump.blocks
            .keys()
            .filter(|(s, _)| *s == a1.as_u128())
            .count(),
        15,
        "…a1 is in 15 blocks"
    );
    assert_eq!(dump.children, [(a1.as_u128(), b2.as_u128())]);
    check_raw_blocks(&path, &view, 1);
}

/// `Store::upgrade` rewrites the golden format-1 store in format 2: `Upgraded { from: 1, to: 2,
/// sessions: 3, events: 6057 }`, and nothing is lost or altered ([`upgrade_losing_nothing`]). The
/// upgraded store then opens for writing: loading `…c3` writes the closers a read computed before,
/// an append to `…a1` commits and verifies, forks of `…a1` at turn ends across its log carry the
/// running digest of their prefix as computed from the events, and `…b2` still proves its seed. A
/// second upgrade is a no-op (`from == to == 2`) that leaves the store's tables as they were.
#[test]
fn the_golden_format_1_store_upgrades_losing_nothing() {
    let (dir, path) = golden_copy("sessions.redb");
    let (before, upgraded) = upgrade_losing_nothing(&path);
    assert_eq!(
        upgraded,
        Upgraded {
            from: 1,
            to: 2,
            sessions: 3,
            events: 6057
        }
    );
    let (a1, b2, c3) = (golden_id("a1"), golden_id("b2"), golden_id("c3"));
    let realistic = realistic_session(21, 3000);

    let store = Store::open(&path).expect("the upgraded store opens for writing");
    assert!(!store.is_read_only());
    assert_eq!(store.store_id(), before.store_id);
    assert!(store.inspect(a1).unwrap().events == realistic);

    // Loading …c3 repairs its open turn with the closers a read computed before the upgrade.
    let repaired = store.load(c3).expect("load repairs");
    assert_eq!(repaired.closers, 2);
    assert_eq!(repaired.events, before.session(c3).inspected.events);
    assert_eq!(store.info(c3).unwrap().len, 10, "the closers are stored");
    assert_eq!(store.inspect(c3).unwrap().closers, 0, "…c3 is balanced now");

    // An append continues …a1's log and its running digest.
    let old = store.info(a1).unwrap();
    let turn = last_turn(&realistic) + 1;
    let last_time = realistic.last().unwrap().time_ms;
    let appended = ev::numbered(
        old.len,
        last_time + 1 - old.len as i64,
        1,
        ev::completed_turn(
            turn,
            ev::mid(7001),
            "after the upgrade",
            ev::mid(7002),
            "yes",
        ),
    );
    store.append(a1, &appended).expect("an append to …a1");
    let mut whole = realistic.clone();
    whole.extend(appended.iter().cloned());
    let info = store.info(a1).unwrap();
    assert_eq!(info.len, old.len + 6);
    assert_eq!(info.revision, old.revision + 1);
    assert_eq!(info.head, running_digests(&whole)[whole.len()]);
    assert!(store.inspect(a1).unwrap().events == whole);
    // …b2's seed is still …a1's prefix.
    assert_eq!(store.info(b2).unwrap(), before.session(b2).info);
    // Forks at turn ends across the log, each cut inside one of the new blocks, carry the running
    // digest of their prefix as computed here from the events.
    let digests = running_digests(&whole);
    let ends: Vec<usize> = (0..whole.len())
        .filter(|&i| whole[i].body.kind() == EventKind::TurnEnd)
        .collect();
    for (n, &end) in ends.iter().step_by(ends.len() / 7).enumerate() {
        let child = SessionId::from_u128(0x019b_76da_a800_7000_8000_0000_0000_0f00 + n as u128);
        let forked = store
            .fork(
                a1,
                &ForkSpec {
                    child,
                    boundary: Some(end as u64),
                    time_ms: 1_767_300_000_000,
                    delegation_depth: 0,
                    agent_preset: None,
                },
            )
            .expect("a fork of the upgraded …a1");
        assert_eq!(forked.seed_len, end as u64 + 1);
        assert_eq!(forked.seed_digest, Some(digests[end + 1]), "fork at {end}");
    }
    assert_intact(&store.verify().unwrap());
    store.close().unwrap();

    let reader = Store::open_read_only(&path).unwrap();
    assert_intact(&reader.verify().unwrap());
    assert!(reader.inspect(a1).unwrap().events == whole);
    drop(reader);

    let tables = Dump::of(&path);
    assert_eq!(
        Store::upgrade(&path).expect("a second upgrade"),
        Upgraded {
            from: 2,
            to: 2,
            sessions: 0,
            events: 0
        }
    );
    assert!(
        Dump::of(&path) == tables,
        "an upgrade of a format-2 store changes nothing"
    );
    assert_eq!(raw_meta(&path), (2, before.store_id));
    assert_eq!(names_in(dir.path()), ["sessions.redb"]);
}

/// The golden empty format-1 store opens read-only (no sessions, verify clean, zero stats),
/// refuses a writable open untouched, and upgrades to an empty format-2 store with the same id
/// (`Upgraded { from: 1, to: 2, sessions: 0, events: 0 }`) that opens for writing and takes a
/// session.
#[test]
fn the_golden_empty_format_1_store_upgrades_to_an_empty_format_2_store() {
    let (dir, path) = golden_copy("empty.redb");
    let (before, upgraded) = upgrade_losing_nothing(&path);
    assert!(before.sessions.is_empty());
    assert_eq!((before.stat_sessions, before.stat_events), (0, 0));
    assert_eq!(
        upgraded,
        Upgraded {
            from: 1,
            to: 2,
            sessions: 0,
            events: 0
        }
    );
    let store = Store::open(&path).expect("the upgraded store opens for writing");
    assert_eq!(store.store_id(), before.store_id);
    assert!(store.list().unwrap().is_empty());
    let (id, header) = fresh();
    store.import(header, &completed_turns(2)).unwrap();
    assert_eq!(store.info(id).unwrap().len, 12);
    store.close().unwrap();
    assert_eq!(raw_meta(&path), (2, before.store_id));
    assert_eq!(names_in(dir.path()), ["empty.redb"]);
}

/// An upgrade is refused with `AlreadyOpen` while another writer holds the format-1 file (here
/// redb itself, as a running host would), and the refusal changes nothing: the file is byte for
/// byte as it was, no temporary file is left, and once the writer is gone it still reads as before
/// and upgrades.
#[test]
fn an_upgrade_is_refused_while_another_writer_holds_the_file() {
    let (dir, path) = golden_copy("sessions.redb");
    let reader = Store::open_read_only(&path).unwrap();
    let before = read_everything(&reader);
    drop(reader);

    let holder = raw_db(&path);
    let bytes = std::fs::read(&path).unwrap();
    match Store::upgrade(&path) {
        Err(StoreError::AlreadyOpen { path: named }) => assert_eq!(named, path),
        other => panic!("expected AlreadyOpen, got {other:?}"),
    }
    assert!(
        std::fs::read(&path).unwrap() == bytes,
        "a refused upgrade changed the file"
    );
    assert_eq!(names_in(dir.path()), ["sessions.redb"]);
    drop(holder);

    assert_eq!(raw_meta(&path).0, 1, "still format 1");
    let reader = Store::open_read_only(&path).unwrap();
    assert_same(&before, &read_everything(&reader));
    drop(reader);
    assert_eq!(
        Store::upgrade(&path).unwrap(),
        Upgraded {
            from: 1,
            to: 2,
            sessions: 3,
            events: 6057
        }
    );
}

/// A read-only handle opened on the format-1 file before the upgrade keeps reading the old file
/// as it was after the new one replaced it (what `Store::upgrade` promises readers), and a handle
/// opened after reads the upgraded store, the same sessions.
#[test]
fn a_reader_of_the_old_file_keeps_reading_it_through_the_upgrade() {
    let (_dir, path) = golden_copy("sessions.redb");
    let old = Store::open_read_only(&path).unwrap();
    let before = read_everything(&old);
    Store::upgrade(&path).expect("the upgrade, a reader open");
    assert_same(&before, &read_everything(&old));
    let new = Store::open_read_only(&path).unwrap();
    assert_same(&before, &read_everything(&new));
}

/// A larger format-1 store written here in the format-1 layout: two realistic sessions of 50,000
/// events in blocks of irregular sizes, a fork of the first at a turn boundary with a turn of its
/// own, and a session whose log ends inside a turn. It reads the same before and after the upgrade
/// in every respect ([`upgrade_losing_nothing`]), its events are the ones written, and the
/// upgraded store takes writes to every session.
#[test]
fn a_large_format_1_store_upgrades_losing_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("large.redb");
    let id = |n: u128| SessionId::from_u128(0x019b_76da_a800_7000_8000_0000_0000_0000 | n);
    let first = realistic_session(101, 50_000);
    let second = realistic_session(202, 50_000);
    // A fork of `first` at the end of a turn in its middle, then a turn of its own.
    let boundary = (20_000..)
        .find(|&i| first[i].body.kind() == EventKind::TurnEnd)
        .unwrap();
    let first_header = header(id(1));
    let forked = fork_session(
        &first_header,
        &first,
        &ForkSpec {
            child: id(3),
            boundary: Some(boundary as u64),
            time_ms: first[boundary].time_ms as u64 + 1,
            delegation_depth: 0,
            agent_preset: None,
        },
    )
    .expect("a fork at a turn boundary");
    let mut fork_events = forked.events;
    let turn = last_turn(&fork_events) + 1;
    let start = fork_events.last().unwrap().time_ms + 1;
    fork_events.extend(ev::numbered(
        fork_events.len() as u64,
        start - fork_events.len() as i64,
        1,
        ev::completed_turn(turn, ev::mid(8001), "on the fork", ev::mid(8002), "forked"),
    ));
    // A log cut inside a turn, after a step's first events.
    let mut open = realistic_session(303, 3000);
    let cut = (2000..)
        .find(|&i| open[i].body.kind() == EventKind::StepStart)
        .unwrap()
        + 3;
    open.truncate(cut);
    let sessions = vec![
        (first_header, first.clone()),
        (header(id(2)), second.clone()),
        (forked.header, fork_events.clone()),
        (header(id(4)), open.clone()),
    ];
    let store_id = write_store(&path, &sessions);

    let (before, upgraded) = upgrade_losing_nothing(&path);
    assert_eq!(before.store_id, store_id);
    assert_eq!(upgraded.sessions, 4);
    assert_eq!(
        upgraded.events,
        (first.len() + second.len() + fork_events.len() + open.len()) as u64
    );
    for (header, events) in &sessions {
        let view = before.session(header.id);
        assert!(view.stored() == events, "{}: the events written", header.id);
        assert_eq!(&view.info.header, header);
    }
    assert_eq!(before.session(id(1)).children, [id(3)]);
    assert!(
        before.session(id(4)).inspected.closers > 0,
        "…4 ends in an open turn"
    );
    assert!(before.session(id(4)).open_turn.is_some());

    // The upgraded store takes writes: a repair, and appends to each balanced session.
    let store = Store::open(&path).unwrap();
    let repaired = store.load(id(4)).unwrap();
    assert_eq!(repaired.events, before.session(id(4)).inspected.events);
    for (session, events) in [(id(1), &first), (id(2), &second), (id(3), &fork_events)] {
        let next = events.len() as u64;
        let batch = ev::numbered(
            next,
            events.last().unwrap().time_ms + 1 - next as i64,
            1,
            ev::completed_turn(
                last_turn(events) + 1,
                ev::mid(next),
                "more",
                ev::mid(next + 1),
                "done",
            ),
        );
        store.append(session, &batch).unwrap();
        let mut whole = events.clone();
        whole.extend(batch);
        assert_eq!(
            store.info(session).unwrap().head,
            running_digests(&whole)[whole.len()]
        );
    }
    assert_intact(&store.verify().unwrap());
    store.close().unwrap();
}

/// A writable open of a format-1 store is refused without writing to the file: the file is byte
/// for byte as it was, so the build that wrote it (or a byte-level backup check) finds it as it
/// left it (the storage engine's writable open would rewrite its header, so the format is read
/// first).
#[test]
fn a_refused_writable_open_leaves_the_format_1_file_byte_for_byte() {
    let (_dir, path) = golden_copy("sessions.redb");
    let bytes = std::fs::read(&path).unwrap();
    assert!(matches!(
        Store::open(&path),
        Err(StoreError::UpgradeRequired { found: 1, .. })
    ));
    let after = std::fs::read(&path).unwrap();
    let differing = bytes.iter().zip(&after).filter(|(a, b)| a != b).count();
    assert!(
        after == bytes,
        "a refused writable open changed {differing} bytes of the file (length {} then {})",
        bytes.len(),
        after.len()
    );
}

/// An upgrade keeps the store file's permissions: a store only its owner may read (sessions hold
/// prompts, tool output, file contents) is still only its owner's afterwards.
#[cfg(unix)]
#[test]
fn an_upgrade_keeps_the_store_files_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let (_dir, path) = golden_copy("sessions.redb");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    Store::upgrade(&path).expect("the upgrade");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the upgraded store's mode is {mode:o}");
}

/// An upgrade of a store named through a symbolic link upgrades the store the link names, and the
/// link still names it: a host opening the store by its real path finds it upgraded.
#[cfg(unix)]
#[test]
fn an_upgrade_through_a_symbolic_link_upgrades_the_store_it_names() {
    let (dir, real) = golden_copy("sessions.redb");
    let link = dir.path().join("link.redb");
    std::os::unix::fs::symlink("sessions.redb", &link).unwrap();
    Store::upgrade(&link).expect("the upgrade");
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link is still a link"
    );
    assert_eq!(raw_meta(&real).0, 2, "the store the link names is upgraded");
}
