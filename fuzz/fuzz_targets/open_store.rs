//! Any bytes as a store file, opened writable over memory. A damaged page that makes the storage
//! engine panic is contained by the store as `StoreError::Damaged`, a normal outcome here, so the
//! fuzzer explores past it (see `lineage_fuzz::panics`); a panic anywhere else, or one that escapes
//! the store, crashes the fuzzer. What must hold:
//!
//! - a session `list` shows has the same row through `info`;
//! - a session `inspect` reads has seqs `0..n`, the listed length plus crash-repair closers that
//!   leave it balanced, and `read_from(0)` returns the same stored events;
//! - a session `verify` passes can be inspected and loaded, and `load` returns what `inspect` did
//!   (or, when it has closers to write, fails to commit them: damage elsewhere in the file); once
//!   the engine has panicked on the file, these reads may fail as `Damaged` instead (a lock it
//!   poisoned makes it refuse the handle);
//!   when every session passes, `stats` reads and counts their events;
//! - writing a new session afterwards returns (an error is allowed, a panic or a hang is not).
//!
//! An input whose store calls have spent their time (`lineage_fuzz::watchdog::spent`: a damaged
//! page reference costs about a second a read) has its remaining sessions left unexplored; the new
//! session is still written and the store still dropped.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lineage_fuzz::backend::SharedMemory;
use lineage_fuzz::panics::{contain_engine_panics, engine_panics, store_call, store_drop};
use lineage_fuzz::watchdog;
use lineage_log::{
    Event, Header, SessionId, StepEnd, StepStart, TurnEnd, TurnEndReason, TurnStart,
    interrupted_turn_closers, is_balanced,
};
use lineage_store::{Store, StoreError, StoreOptions};

fuzz_target!(init: contain_engine_panics(), |data: &[u8]| {
    watchdog::begin_input();
    let Ok(memory) = SharedMemory::holding(data) else { return };
    let options = StoreOptions {
        commit_window: std::time::Duration::ZERO,
        cache_bytes: 1 << 20,
        ..StoreOptions::default()
    };
    let Ok(store) = store_call("open", || Store::with_backend(memory, options)) else { return };
    check(&store);
    store_drop("drop", store);
});

fn check(store: &Store) {
    let panics_before = engine_panics();
    let listed = store_call("list", || store.list());
    let report = store_call("verify", || store.verify());
    let _ = store_call("stats", || store.stats());
    let Ok(listed) = listed else {
        write_new_session(store);
        return;
    };
    for info in &listed {
        if watchdog::spent() {
            break;
        }
        let id = info.header.id;
        if let Ok(again) = store_call("info", || store.info(id)) {
            assert_eq!(&again, info, "info and list read the same row");
        }
        let _ = store_call("session_bytes", || store.session_bytes(id));
        let _ = store_call("children", || store.children(id));
        let _ = store_call("descendants", || store.descendants(id));
        if watchdog::spent() {
            break;
        }
        let inspected = store_call("inspect", || store.inspect(id));
        if let Ok(loaded) = &inspected {
            let stored = usize::try_from(info.len).expect("a length that was read");
            assert_eq!(
                loaded.header, info.header,
                "inspect reads the listed header"
            );
            assert_eq!(
                loaded.events.len(),
                stored + loaded.closers,
                "stored events + closers"
            );
            assert!(
                loaded
                    .events
                    .iter()
                    .enumerate()
                    .all(|(i, e)| e.seq == i as u64)
            );
            assert_eq!(
                interrupted_turn_closers(&loaded.events[..stored]).len(),
                loaded.closers,
                "inspect adds exactly the closers the stored log needs"
            );
            assert!(
                is_balanced(&loaded.events),
                "inspect returns a balanced log"
            );
            if let Ok(read) = store_call("read_from", || store.read_from(id, 0)) {
                assert_eq!(
                    read,
                    loaded.events[..stored],
                    "read_from returns the stored events"
                );
            }
        }
        let Ok(report) = &report else { continue };
        let Some(verdict) = report.sessions.iter().find(|s| s.session == id) else {
            continue;
        };
        if !verdict.problems.is_empty() {
            continue;
        }
        // verify vouched for this session: every read of it must succeed, unless the engine
        // has panicked on this file since (it may then refuse the handle for good).
        let inspected = match inspected {
            Ok(inspected) => inspected,
            Err(StoreError::Damaged { .. }) if engine_panics() > panics_before => continue,
            Err(e) => panic!("verify found no problem in session {id}, but inspect fails: {e}"),
        };
        assert_eq!(verdict.events, info.len, "verify read every stored event");
        assert_eq!(verdict.open_turn.is_some(), inspected.closers > 0);
        if watchdog::spent() {
            break;
        }
        let loaded = match store_call("load", || store.load(id)) {
            Ok(loaded) => loaded,
            // verify reads the session, not the file's free space: writing its closers may fail
            // on damage elsewhere in the file, and the failure must be an error.
            Err(StoreError::CommitFailed { .. }) if inspected.closers > 0 => continue,
            Err(StoreError::Damaged { .. }) if engine_panics() > panics_before => continue,
            Err(e) => panic!("verify found no problem in session {id}, but load fails: {e}"),
        };
        assert_eq!(
            loaded.events, inspected.events,
            "load repairs as inspect does"
        );
    }
    if let Ok(report) = &report
        && !watchdog::spent()
        && report.is_ok()
        && report.sessions.len() == listed.len()
    {
        match store_call("stats", || store.stats()) {
            Ok(stats) => assert_eq!(stats.sessions, listed.len() as u64),
            Err(StoreError::Damaged { .. }) if engine_panics() > panics_before => {}
            Err(e) => panic!("verify found no problem, but stats fails: {e}"),
        }
    }
    write_new_session(store);
}

/// A session that no seed holds, written and read back: the store may refuse it (a damaged file
/// may fail to commit), but must answer.
fn write_new_session(store: &Store) {
    let id = SessionId::from_u128(0x0197_ffff_ffff_7fff_bfff_ffff_ffff_fff0);
    let events = [
        Event::new(0, 1, TurnStart { turn: 1 }),
        Event::new(1, 2, StepStart { turn: 1, step: 1 }),
        Event::new(2, 3, StepEnd { turn: 1, step: 1 }),
        Event::new(
            3,
            4,
            TurnEnd {
                turn: 1,
                reason: TurnEndReason::Completed,
            },
        ),
    ];
    if store_call("import", || store.import(Header::new(id, 1), &events)).is_ok()
        && let Ok(loaded) = store_call("load new", || store.load(id))
    {
        assert_eq!(loaded.events, events, "a committed session reads back");
    }
}
