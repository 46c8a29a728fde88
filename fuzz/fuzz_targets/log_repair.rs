//! A whole log's load and repair. The input builds a log the rules accept (from records, from the
//! test kit's generator, or event by event; see `lineage_fuzz::logs`); then:
//!
//! - the log: the seed contract accepts it with the same structure, and so does the store's replay
//!   of the tail turn only; its records decode back to it;
//! - crash repair: the closers are empty exactly when the log is balanced, continue its seqs at its
//!   last time, end with `turn/end {Interrupted}`, are accepted by the append rules, leave the log
//!   balanced, and need no closers of their own;
//! - the store (in memory, with small blocks, the log appended in batches): `inspect` repairs in
//!   memory only; `load` writes the closers and returns the repaired log; a second `load` and a
//!   load after reopening add nothing; every read returns the events exactly; `verify` finds
//!   nothing wrong.
#![no_main]

use libfuzzer_sys::arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use lineage_fuzz::backend::SharedMemory;
use lineage_fuzz::logs::{SESSION, Source, accepted_log};
use lineage_fuzz::panics::{contain_engine_panics, store_call, store_drop};
use lineage_fuzz::watchdog;
use lineage_log::{
    Encoder, Event, EventBody, Header, Structure, TurnEndReason, check_append, check_seed,
    decode_records, fold_header, interrupted_turn_closers, is_balanced,
};
use lineage_store::{Store, StoreOptions};
use lineage_testkit::SplitMix64;

fuzz_target!(init: contain_engine_panics(), |data: &[u8]| {
    watchdog::begin_input();
    let mut u = Unstructured::new(data);
    let Ok(source) = u.arbitrary::<u8>() else { return };
    let source = [Source::Records, Source::Machine, Source::Events][usize::from(source % 3)];
    let (Ok(block_events), Ok(block_bytes), Ok(batching)) =
        (u.arbitrary::<u8>(), u.arbitrary::<u16>(), u.arbitrary::<u64>())
    else {
        return;
    };
    let options = StoreOptions {
        commit_window: std::time::Duration::from_secs(3600),
        block_events: 1 + usize::from(block_events % 16),
        block_bytes: 64 + usize::from(block_bytes % 4096),
        cache_bytes: 1 << 20,
        ..StoreOptions::default()
    };
    let Ok(log) = accepted_log(source, &mut u) else { return };
    let events = log.events;

    check_log(&events, &log.structure);
    let closers = check_repair(&events, &log.structure);
    let mut repaired = events.clone();
    repaired.extend(closers.iter().cloned());
    check_store(&events, &repaired, closers.len(), options, batching);
});

fn check_log(events: &[Event], structure: &Structure) {
    let seeded = check_seed(events).expect("the seed contract accepts what the rules accepted");
    assert_eq!(
        &seeded, structure,
        "the seed contract folds the same structure"
    );
    let replayed = Structure::of_valid_log(events).expect("the tail turn replays");
    assert_eq!(
        &replayed, structure,
        "replaying only the tail turn gives the whole structure"
    );
    let mut records = Vec::new();
    Encoder::new().encode_all(events, &mut records);
    let mut decoded = Vec::new();
    decode_records(&records, 0, &mut decoded).expect("the log's records decode");
    assert_eq!(decoded, events, "the log's records decode to the log");
}

fn check_repair(events: &[Event], structure: &Structure) -> Vec<Event> {
    let closers = interrupted_turn_closers(events);
    assert_eq!(
        closers,
        interrupted_turn_closers(events),
        "repair is deterministic"
    );
    assert_eq!(
        closers.is_empty(),
        structure.is_balanced(),
        "closers exist exactly when a turn is open"
    );
    assert_eq!(is_balanced(events), structure.is_balanced());
    let Some(last) = events.last() else {
        return closers;
    };
    for (i, closer) in closers.iter().enumerate() {
        assert_eq!(
            closer.seq,
            last.seq + 1 + i as u64,
            "closers continue the seqs"
        );
        assert_eq!(
            closer.time_ms, last.time_ms,
            "closers carry the last event's time"
        );
    }
    if let Some(end) = closers.last() {
        match &end.body {
            EventBody::TurnEnd(t) => {
                assert_eq!(
                    Some(t.turn),
                    structure.open_turn(),
                    "the open turn is closed"
                );
                assert_eq!(t.reason, TurnEndReason::Interrupted);
            }
            other => panic!("the last closer is {:?}, not turn/end", other.kind()),
        }
    }
    let after = check_append(structure, &closers)
        .unwrap_or_else(|e| panic!("the append rules refuse the closers: {e}"));
    assert!(after.is_balanced(), "the repaired log is balanced");
    let mut repaired = events.to_vec();
    repaired.extend(closers.iter().cloned());
    assert!(is_balanced(&repaired));
    assert!(
        interrupted_turn_closers(&repaired).is_empty(),
        "a repaired log needs no repair"
    );
    check_seed(&repaired).expect("the repaired log keeps the seed contract");
    closers
}

fn open(memory: &SharedMemory, options: &StoreOptions) -> Store {
    let memory = memory.clone();
    store_call("open", || {
        Store::with_backend_factory(move || memory.clone(), options.clone())
    })
    .expect("a store in memory opens")
}

fn check_store(
    events: &[Event],
    repaired: &[Event],
    closers: usize,
    options: StoreOptions,
    batching: u64,
) {
    let memory = SharedMemory::default();
    let store = open(&memory, &options);
    // The header the log's facts make (parent, seed, depth, origin): the store must take the log.
    let header = fold_header(&Header::new(SESSION, 0), events);
    store_call("create", || store.create(header.clone())).expect("create");
    let mut rng = SplitMix64::new(batching);
    let mut rest = events;
    while !rest.is_empty() {
        let size = (1 + rng.below(24) as usize).min(rest.len());
        let (batch, tail) = rest.split_at(size);
        // Admitted batches wait for a flush (the commit window is longer than any run), so a
        // few commits carry the whole log, in blocks cut across batches.
        if rng.percent(15) {
            store_call("append", || store.append(SESSION, batch))
        } else {
            store_call("admit", || store.admit(SESSION, batch))
        }
        .unwrap_or_else(|e| panic!("the store refuses events the log accepts: {e}"));
        rest = tail;
    }
    store_call("flush", || store.flush(SESSION)).expect("flush");
    if events.is_empty() {
        // Nothing was written, so the session is not stored (a session exists once it has events).
        assert!(
            store_call("list", || store.list())
                .expect("list")
                .is_empty()
        );
        store_drop("drop", store);
        return;
    }

    let inspected = store_call("inspect", || store.inspect(SESSION)).expect("inspect");
    assert_eq!(inspected.events, repaired, "inspect repairs in memory");
    assert_eq!(inspected.closers, closers);
    let info = store_call("info", || store.info(SESSION)).expect("info");
    assert_eq!(info.len, events.len() as u64, "inspect writes nothing");
    assert_eq!(info.header, header);

    let loaded = store_call("load", || store.load(SESSION)).expect("load");
    assert_eq!(loaded.events, repaired, "load returns the repaired log");
    assert_eq!(loaded.closers, closers, "load reports the closers it wrote");
    assert_eq!(loaded.header, header);
    let again = store_call("load again", || store.load(SESSION)).expect("load again");
    assert_eq!(
        again.events, repaired,
        "a second load returns the same events"
    );
    assert_eq!(again.closers, 0, "a second load adds no closers");
    let report = store_call("verify", || store.verify()).expect("verify");
    assert!(
        report.is_ok(),
        "verify finds problems in a log the rules accepted: {report:?}"
    );
    assert_eq!(report.sessions.len(), 1);
    assert_eq!(report.sessions[0].events, repaired.len() as u64);
    assert_eq!(
        report.sessions[0].open_turn, None,
        "the repaired log is balanced"
    );
    store_call("close", || store.clone().close()).expect("close");
    store_drop("drop", store);

    let store = open(&memory, &options);
    let reloaded = store_call("load after reopening", || store.load(SESSION)).expect("reload");
    assert_eq!(
        reloaded.events, repaired,
        "the repaired log round-trips exactly"
    );
    assert_eq!(
        reloaded.closers, 0,
        "a load after reopening adds no closers"
    );
    let read = store_call("read_from", || store.read_from(SESSION, 0)).expect("read_from");
    assert_eq!(read, repaired);
    let info = store_call("info", || store.info(SESSION)).expect("info");
    assert_eq!(info.len, repaired.len() as u64);
    store_drop("drop", store);
}
