//! What only a shared store has to prove: writers in several processes racing on one session, the
//! tables' format version, and the log's round trips under random partitions in a database (the
//! contract suite runs on PostgreSQL in the other test files).

mod common;

use std::io::{BufRead, Write};
use std::process::Stdio;

use common::*;
use lineage_log::SessionId;
use lineage_store::{STORE_FORMAT_VERSION, Store, StoreError};
use lineage_testkit::postgres::postgres;
use lineage_testkit::process::{
    Helper, after_marker, helper_arg, helper_job, report_line, rerun_this_test, wait_for_line,
};
use lineage_testkit::{last_turn, realistic_session};
use proptest::prelude::*;

/// The database the racing writers open.
const URL_VAR: &str = "LINEAGE_RACE_URL";
/// The session both writers append to.
const SESSION_VAR: &str = "LINEAGE_RACE_SESSION";

/// The writer process of the racing test (which re-runs itself with the writer's name, written
/// into its turns, as its job): at each `go` on stdin it appends one completed turn where its view
/// of the session ends, and says whether it `won` (the new length) or `lost` (the conflict's
/// expected and got seqs); after a loss it loads the session again.
fn racing_writer(name: &str) {
    let url: String = helper_arg(URL_VAR);
    let id: SessionId = helper_arg(SESSION_VAR);
    let store = Store::open(&url).expect("the writer opens the store");
    let mut events = store.load(id).expect("the session loads").events;
    report_line("race: ready");
    for line in std::io::stdin().lock().lines() {
        if line.expect("stdin reads") != "go" {
            break;
        }
        let turn = completed_turn(
            last_turn(&events) + 1,
            events.len() as u64,
            &format!("written by {name}"),
        );
        match store.append(id, &turn) {
            Ok(()) => {
                events.extend(turn);
                report_line(&format!("race: won {}", events.len()));
            }
            Err(StoreError::SeqMismatch { expected, got, .. }) => {
                events = store.load(id).expect("the session loads again").events;
                report_line(&format!("race: lost {expected} {got}"));
            }
            Err(e) => panic!("{name}: an append failed otherwise than by a conflict: {e}"),
        }
    }
}

#[test]
fn of_two_writers_racing_on_one_session_one_wins_and_the_other_gets_the_conflict() {
    if let Some(name) = helper_job() {
        return racing_writer(&name);
    }
    let url = postgres().create_database();
    let (id, header) = fresh();
    let store = Store::open(&url).unwrap();
    store.import(header, &completed_turns(2)).unwrap();
    let start = store.info(id).unwrap().len;

    let mut writers: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|name| {
            let mut command = rerun_this_test(name);
            command
                .env(URL_VAR, &url)
                .env(SESSION_VAR, id.to_string())
                .stdin(Stdio::piped());
            let mut helper = Helper::spawn(&mut command);
            let stdin = helper.0.stdin.take().expect("piped stdin");
            let lines = helper.lines();
            wait_for_line(&lines, |l| after_marker(l, "race: ready").map(drop));
            (helper, stdin, lines)
        })
        .collect();

    const ROUNDS: usize = 12;
    let mut len = start;
    let mut wins = [0usize; 2];
    for round in 0..ROUNDS {
        for (_, stdin, _) in &mut writers {
            writeln!(stdin, "go").expect("the writer reads");
        }
        let outcomes: Vec<String> = writers
            .iter()
            .map(|(_, _, lines)| {
                wait_for_line(lines, |l| after_marker(l, "race:").map(str::to_owned))
            })
            .collect();
        let turn_len = completed_turn(1, 0, "").len() as u64;
        let won: Vec<usize> = (0..2).filter(|&i| outcomes[i].starts_with("won")).collect();
        assert_eq!(
            won.len(),
            1,
            "round {round}: exactly one writer wins: {outcomes:?}"
        );
        let (winner, loser) = (won[0], 1 - won[0]);
        let new_len = len + turn_len;
        assert_eq!(outcomes[winner], format!("won {new_len}"), "round {round}");
        // The loser's batch began where the session ended before the round; the store had moved
        // on to where the winner left it.
        assert_eq!(
            outcomes[loser],
            format!("lost {new_len} {len}"),
            "round {round}: the conflict names the stored end and the batch's start"
        );
        wins[winner] += 1;
        len = new_len;
    }
    for (helper, stdin, _) in writers {
        drop(stdin);
        let mut helper = helper;
        assert!(helper.0.wait().expect("the writer exits").success());
    }

    let store = Store::open_read_only(&url).unwrap();
    assert_eq!(store.info(id).unwrap().len, len);
    assert_intact(&store.verify().unwrap());
    // Every stored turn is one writer's whole: nothing of a losing batch was written.
    let events = store.read_from(id, start).unwrap();
    assert_eq!(events.len() as u64, len - start);
    println!("racing writers: {ROUNDS} rounds, wins {wins:?}");
}

#[test]
fn a_database_of_a_newer_or_older_store_format_is_refused_and_left_alone() {
    let server = postgres();
    let url = server.create_database();
    let (_, header) = fresh();
    let store = Store::open(&url).unwrap();
    store.import(header, &completed_turns(1)).unwrap();
    store.close().unwrap();
    let set_version = |version: u32| {
        let hex: String = version
            .to_le_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        server.psql(
            &url,
            &format!("UPDATE lineage_meta SET value = '\\x{hex}' WHERE name = 'format_version'"),
        );
    };
    set_version(STORE_FORMAT_VERSION + 1);
    let before = store_contents(std::path::Path::new(&url));
    for opened in [Store::open(&url), Store::open_read_only(&url)] {
        match opened {
            Err(StoreError::NewerFormat {
                found,
                supported,
                what,
            }) => {
                assert_eq!(
                    (found, supported),
                    (STORE_FORMAT_VERSION + 1, STORE_FORMAT_VERSION)
                );
                assert!(what.contains(&url), "{what}");
            }
            other => panic!("expected NewerFormat, got {other:?}"),
        }
    }
    assert_eq!(
        store_contents(std::path::Path::new(&url)),
        before,
        "nothing was written"
    );
    set_version(0);
    assert!(matches!(
        Store::open(&url),
        Err(StoreError::OlderFormat { found: 0, .. })
    ));
    set_version(STORE_FORMAT_VERSION);
    assert_eq!(Store::open(&url).unwrap().list().unwrap().len(), 1);
}

#[test]
fn a_database_without_the_tables_is_not_a_store_to_a_reader_and_becomes_one_for_a_writer() {
    let url = postgres().create_database();
    match Store::open_read_only(&url) {
        Err(StoreError::NotAStore { reason, .. }) => assert!(reason.contains("no Lineage tables")),
        other => panic!("expected NotAStore, got {other:?}"),
    }
    let id = Store::open(&url).unwrap().store_id();
    // A second writer, like every host after the first, opens the same store.
    assert_eq!(Store::open(&url).unwrap().store_id(), id);
    assert_eq!(Store::open_read_only(&url).unwrap().store_id(), id);
}

/// Hosts opening a new database at once all open the one store: the first to commit creates the
/// tables, and the others, which lose the race to create them, find them (no lock orders them).
#[test]
fn many_hosts_opening_a_new_database_at_once_all_open_one_store() {
    const HOSTS: usize = 8;
    for round in 0..4 {
        let url = postgres().create_database();
        let start = std::sync::Arc::new(std::sync::Barrier::new(HOSTS));
        let hosts: Vec<_> = (0..HOSTS)
            .map(|_| {
                let (url, start) = (url.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    Store::open(&url).map(|store| store.store_id())
                })
            })
            .collect();
        let ids: Vec<_> = hosts
            .into_iter()
            .map(|host| {
                host.join()
                    .unwrap()
                    .unwrap_or_else(|e| panic!("round {round}: a host failed to open: {e}"))
            })
            .collect();
        let stored = Store::open_read_only(&url).unwrap().store_id();
        assert!(
            ids.iter().all(|id| *id == stored),
            "round {round}: every host opened the one store: {ids:?}"
        );
    }
}

#[test]
fn a_server_that_does_not_answer_is_named_without_the_password() {
    let url = lineage_testkit::postgres::unanswered_url();
    match Store::open(&url) {
        Err(StoreError::Storage(error)) => {
            let reason = error.to_string();
            let shown = url.replace("hunter2", "***");
            assert!(
                reason.contains(&format!("cannot connect to {shown}")),
                "{reason}"
            );
            assert!(!reason.contains("hunter2"), "{reason}");
        }
        other => panic!("expected a storage error, got {other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, max_shrink_iters: 64, ..ProptestConfig::default() })]

    /// Realistic sessions cut into random batches (turns left open across them) read back identical, with the digests
    /// redb computes, from one shared database (a session per case).
    #[test]
    fn random_partitions_read_back_identical_with_redbs_digests(
        seed in any::<u64>(),
        cuts in proptest::collection::vec(any::<proptest::sample::Index>(), 0..12),
    ) {
        static URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let url = URL.get_or_init(|| postgres().create_database());
        let log = realistic_session(seed, 300);
        let mut at: Vec<usize> = cuts.iter().map(|i| i.index(log.len())).collect();
        at.extend([0, log.len()]);
        at.sort_unstable();
        at.dedup();
        let batches: Vec<_> = at.windows(2).map(|w| log[w[0]..w[1]].to_vec()).collect();
        let (id, header) = fresh();
        let shared = Store::open_with(url, small_blocks(16)).unwrap();
        let file = mem_store_with(small_blocks(16));
        for store in [&shared, &file] {
            store.create(header.clone()).unwrap();
            for batch in &batches {
                store.append(id, batch).unwrap();
            }
        }
        prop_assert_eq!(shared.read_from(id, 0).unwrap(), log.clone());
        prop_assert_eq!(shared.info(id).unwrap(), file.info(id).unwrap());
        prop_assert_eq!(shared.load(id).unwrap(), file.load(id).unwrap());
        prop_assert_eq!(shared.session_bytes(id).unwrap(), file.session_bytes(id).unwrap());
    }
}

#[test]
fn a_conflict_fails_only_its_sessions_flushes_in_a_shared_round() {
    let url = postgres().create_database();
    let waits = lineage_store::StoreOptions {
        commit_window: std::time::Duration::from_secs(3600),
        ..lineage_store::StoreOptions::default()
    };
    let host = Store::open_with(&url, waits).unwrap();
    let other = Store::open(&url).unwrap();
    let (raced, raced_header) = fresh();
    let (calm, calm_header) = fresh();
    host.import(raced_header, &completed_turns(1)).unwrap();
    host.import(calm_header, &completed_turns(1)).unwrap();
    let len = host.info(raced).unwrap().len;

    // Both of the host's batches wait for one round; meanwhile another host extends `raced`.
    host.admit(raced, &completed_turn(2, len, "the host's"))
        .unwrap();
    host.admit(calm, &completed_turn(2, len, "the host's"))
        .unwrap();
    let theirs = completed_turn(2, len, "the other host's");
    other.load(raced).unwrap();
    other.append(raced, &theirs).unwrap();

    match host.flush_all() {
        Err(StoreError::SeqMismatch {
            session,
            expected,
            got,
            ..
        }) => {
            assert_eq!(
                (session, expected, got),
                (raced, len + theirs.len() as u64, len)
            );
        }
        other => panic!("expected the conflict, got {other:?}"),
    }
    host.flush(calm)
        .expect("the other session of the round is durable");
    assert!(matches!(
        host.flush(raced),
        Err(StoreError::SeqMismatch { .. })
    ));
    assert_eq!(host.info(calm).unwrap().len, len + theirs.len() as u64);
    // The raced session holds the other host's turn whole and nothing of the host's.
    assert_eq!(host.read_from(raced, len).unwrap(), theirs);
    // The host loads the session as stored and continues after it.
    let loaded = host.load(raced).unwrap();
    let next = completed_turn(3, loaded.events.len() as u64, "the host's, again");
    host.append(raced, &next).unwrap();
    assert_intact(&host.verify().unwrap());
}

/// A write whose events the store already holds, byte for byte and ending where the write ends,
/// is durable, not a conflict: what a commit whose answer was lost, and that landed only after
/// its read-back found it absent, leaves for its retry. Another host storing exactly the same
/// batch first is the same to the writer, and here stands in for it.
#[test]
fn a_write_the_store_already_ends_with_is_finished_and_a_different_one_still_conflicts() {
    let url = postgres().create_database();
    let a = Store::open(&url).unwrap();
    let b = Store::open(&url).unwrap();
    let (id, header) = fresh();
    a.import(header, &completed_turns(1)).unwrap();
    let len = a.info(id).unwrap().len;

    // Both hold the same prefix; B stores exactly the batch A is about to append.
    let batch = completed_turn(2, len, "the same question");
    b.load(id).unwrap();
    b.append(id, &batch).unwrap();
    let revision = b.info(id).unwrap().revision;
    a.append(id, &batch)
        .expect("the store ends with A's events: its write is durable");
    assert_eq!(a.admitted_next_seq(id), Some(len + 6), "A's tail continues");

    let next = completed_turn(3, len + 6, "a's next question");
    a.append(id, &next)
        .expect("A continues after the stored batch");
    assert_eq!(
        a.info(id).unwrap().revision,
        revision + 1,
        "A's next row follows the stored revision"
    );

    // A different batch at the seq where the log already moved on is a conflict, as ever.
    let end = len + 12;
    let c = Store::open(&url).unwrap();
    c.load(id).unwrap();
    let theirs = completed_turn(4, end, "c's question");
    c.append(id, &theirs).unwrap();
    match a.append(id, &completed_turn(4, end, "a's question")) {
        Err(StoreError::SeqMismatch {
            session,
            expected,
            got,
            ..
        }) => assert_eq!((session, expected, got), (id, end + 6, end)),
        other => panic!("a different batch at a stored seq is a conflict: {other:?}"),
    }

    let reader = Store::open_read_only(&url).unwrap();
    assert_eq!(
        reader.read_from(id, 0).unwrap(),
        [completed_turns(1), batch, next, theirs].concat()
    );
    assert_intact(&reader.verify().unwrap());
}

#[test]
fn copy_from_a_file_to_a_database_and_back_is_byte_for_byte_and_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let source_path = dir.path().join("source.lineage");
    let back_path = dir.path().join("back.lineage");
    let url = postgres().create_database();
    // Small blocks, several commits, a fork inside a block and a spawned grandchild: every block
    // shape and the children index.
    let ids = {
        let source = Store::open_with(&source_path, small_blocks(5)).unwrap();
        let (root, header) = fresh();
        source.import(header, &completed_turns(3)).unwrap();
        let len = source.info(root).unwrap().len;
        source
            .append(root, &completed_turn(4, len, "more"))
            .unwrap();
        let child = SessionId::new();
        let spec = lineage_log::ForkSpec {
            child,
            boundary: Some(11),
            time_ms: T0 + 9_000,
            delegation_depth: 1,
            agent_preset: None,
        };
        source.fork(root, &spec).unwrap();
        let grandchild = SessionId::new();
        source
            .fork(
                child,
                &lineage_log::ForkSpec {
                    child: grandchild,
                    boundary: None,
                    ..spec
                },
            )
            .unwrap();
        vec![root, child, grandchild]
    };
    let source = Store::open_read_only(&source_path).unwrap();
    let database = Store::open(&url).unwrap();
    let copied = source.copy_into(&database).unwrap();
    assert_eq!(copied.copied, ids, "parents first");
    assert!(copied.present.is_empty());
    let back = Store::open(&back_path).unwrap();
    assert_eq!(database.copy_into(&back).unwrap().copied, ids);
    // Twice changes nothing.
    let again = source.copy_into(&database).unwrap();
    assert_eq!((again.copied.len(), again.present), (0, ids.clone()));
    assert_intact(&database.verify().unwrap());
    assert_intact(&back.verify().unwrap());
    drop((database, back, source));

    let original = Dump::of(&source_path);
    assert_eq!(
        Dump::of(std::path::Path::new(&url)),
        original,
        "the database's tables"
    );
    assert_eq!(Dump::of(&back_path), original, "the file copied back");

    // Another log under a copied id is refused, naming the session, and nothing is written.
    let stray = tempfile::tempdir().unwrap();
    let stray_path = stray.path().join("stray.lineage");
    let stray_store = Store::open(&stray_path).unwrap();
    let header = lineage_log::Header::new(ids[0], T0).with_cwd("/elsewhere");
    stray_store.import(header, &completed_turns(1)).unwrap();
    let before = Dump::of(std::path::Path::new(&url));
    match stray_store.copy_into(&Store::open(&url).unwrap()) {
        Err(StoreError::CopyDiverged { session, .. }) => assert_eq!(session, ids[0]),
        other => panic!("expected CopyDiverged, got {other:?}"),
    }
    assert_eq!(Dump::of(std::path::Path::new(&url)), before);
}

#[test]
fn a_write_the_server_refuses_fails_only_its_sessions_flushes() {
    let server = postgres();
    let url = server.create_database();
    let waits = lineage_store::StoreOptions {
        commit_window: std::time::Duration::from_secs(3600),
        ..lineage_store::StoreOptions::default()
    };
    let host = Store::open_with(&url, waits).unwrap();
    let (refused, refused_header) = fresh();
    let (calm, calm_header) = fresh();
    host.import(refused_header, &completed_turns(1)).unwrap();
    host.import(calm_header, &completed_turns(1)).unwrap();
    let len = host.info(refused).unwrap().len;
    // The server will take no block over 4 KB: a rule of this database, not of the store.
    let rule =
        "ALTER TABLE lineage_blocks ADD CONSTRAINT small_blocks CHECK (length(value) < 4096)";
    server.psql(&url, rule);

    // Text that does not compress, so its block stays over the limit as stored.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let noise: String = (0..8_000)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from(b'a' + (state % 26) as u8)
        })
        .collect();
    host.admit(refused, &completed_turn(2, len, &noise))
        .unwrap();
    host.admit(calm, &completed_turn(2, len, "short")).unwrap();
    match host.flush(refused) {
        Err(StoreError::CommitFailed { source, .. }) => {
            assert!(source.to_string().contains("small_blocks"), "{source}");
        }
        other => panic!("expected the refusal, got {other:?}"),
    }
    host.flush(calm)
        .expect("the round's other session is durable");
    assert_eq!(host.info(calm).unwrap().len, len + 6);
    assert_eq!(
        host.info(refused).unwrap().len,
        len,
        "nothing of the refused batch"
    );

    server.psql(
        &url,
        "ALTER TABLE lineage_blocks DROP CONSTRAINT small_blocks",
    );
    let loaded = host.load(refused).unwrap();
    let next = completed_turn(2, loaded.events.len() as u64, &"x".repeat(8_000));
    host.append(refused, &next).unwrap();
    assert_intact(&host.verify().unwrap());
}

/// The hex form of `bytes` as a PostgreSQL `bytea` literal.
fn bytea(bytes: &[u8]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("'\\x{hex}'::bytea")
}

/// A PostgreSQL store in format 1 holding what the golden format-1 store file holds: its rows,
/// blocks and children index written into the tables as a format-1 host left them.
fn format1_database(golden: &std::path::Path) -> String {
    use redb::{ReadableDatabase, ReadableTable};
    let url = postgres().create_database();
    drop(Store::open(&url).unwrap());
    let copy = tempfile::tempdir().unwrap();
    let file = copy.path().join("golden.redb");
    std::fs::copy(golden, &file).unwrap();
    let db = raw_db(&file);
    let txn = db.begin_read().unwrap();
    let mut sql = vec![format!(
        "UPDATE lineage_meta SET value = {} WHERE name = 'format_version'",
        bytea(&1u32.to_le_bytes())
    )];
    let rows = txn.open_table(SESSIONS).unwrap();
    for entry in rows.iter().unwrap() {
        let (id, row) = entry.unwrap();
        let id = uuid::Uuid::from_u128(id.value());
        let row = row.value();
        let next_seq = postcard::from_bytes::<RawSessionRecord>(row)
            .unwrap()
            .next_seq;
        sql.push(format!(
            "INSERT INTO lineage_sessions (id, next_seq, row) VALUES ('{id}', {next_seq}, {})",
            bytea(row)
        ));
    }
    let blocks = txn.open_table(EVENTS).unwrap();
    for entry in blocks.iter().unwrap() {
        let (key, value) = entry.unwrap();
        let (id, first_seq) = key.value();
        sql.push(format!(
            "INSERT INTO lineage_blocks (session, first_seq, value) VALUES ('{}', {first_seq}, {})",
            uuid::Uuid::from_u128(id),
            bytea(value.value())
        ));
    }
    let children = txn.open_table(CHILDREN).unwrap();
    for entry in children.iter().unwrap() {
        let (key, _) = entry.unwrap();
        let (parent, child) = key.value();
        sql.push(format!(
            "INSERT INTO lineage_children (parent, child) VALUES ('{}', '{}')",
            uuid::Uuid::from_u128(parent),
            uuid::Uuid::from_u128(child)
        ));
    }
    // One statement at a time: a command line holds a block's hex, not a store's.
    for statement in sql {
        postgres().psql(&url, &statement);
    }
    url
}

/// A PostgreSQL store in format 1 opens read-only, refuses writers, and upgrades in one
/// transaction to what the file upgrade makes of the same store: the same sessions, rows, events
/// and digests. A live lease refuses the upgrade and changes nothing.
#[test]
fn a_format1_database_upgrades_to_what_the_file_upgrade_makes() {
    let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../schema/golden/store-v1/sessions.redb");
    let url = format1_database(&golden);
    let file_dir = tempfile::tempdir().unwrap();
    let file = file_dir.path().join("sessions.redb");
    std::fs::copy(&golden, &file).unwrap();
    Store::upgrade(&file).unwrap();
    let reference = Store::open_read_only(&file).unwrap();

    let before = Store::open_read_only(&url).unwrap();
    for info in reference.list().unwrap() {
        let id = info.header.id;
        assert_eq!(before.info(id).unwrap(), info, "{id} before");
        assert_eq!(before.inspect(id).unwrap(), reference.inspect(id).unwrap());
    }
    assert!(matches!(
        Store::open(&url),
        Err(StoreError::UpgradeRequired { found: 1, .. })
    ));

    // A host holding a lease keeps the store as it is.
    let held = reference.list().unwrap()[0].header.id;
    postgres().psql(
        &url,
        &format!(
            "INSERT INTO lineage_leases (session, holder, expires_at, fence) \
             VALUES ('{held}', '{}', now() + interval '1 hour', 1)",
            uuid::Uuid::now_v7()
        ),
    );
    match Store::upgrade(&url) {
        Err(StoreError::NotAStore { reason, .. }) => assert!(reason.contains("held"), "{reason}"),
        other => panic!("expected the refusal, got {other:?}"),
    }
    assert!(matches!(
        Store::open(&url),
        Err(StoreError::UpgradeRequired { found: 1, .. })
    ));
    postgres().psql(&url, "DELETE FROM lineage_leases");

    let upgraded = Store::upgrade(&url).unwrap();
    assert_eq!(
        (
            upgraded.from,
            upgraded.to,
            upgraded.sessions,
            upgraded.events
        ),
        (1, STORE_FORMAT_VERSION, 3, 6057)
    );
    let after = Store::open(&url).unwrap();
    for info in reference.list().unwrap() {
        let id = info.header.id;
        assert_eq!(after.info(id).unwrap(), info, "{id} after");
        assert_eq!(after.inspect(id).unwrap(), reference.inspect(id).unwrap());
    }
    assert_eq!(
        after.children(held).unwrap(),
        reference.children(held).unwrap()
    );
    assert!(after.verify().unwrap().is_ok());
    assert_eq!(Store::upgrade(&url).unwrap().from, STORE_FORMAT_VERSION);
}

/// `url` with its port replaced by `port`.
fn through(url: &str, port: u16) -> String {
    let (authority, database) = url.rsplit_once('/').expect("a database URL");
    let (host, _) = authority.rsplit_once(':').expect("a port");
    format!("{host}:{port}/{database}")
}

/// A commit whose answer is lost (the connection cut right after the server answered `COMMIT`)
/// is in doubt: the writer reads the session back on another connection, finds the round there
/// and finishes it, so the append returns `Ok` and the next one continues after it. A `COMMIT`
/// the server never saw is found absent and committed again by the next flush. Nothing is
/// refused as a conflict with the store's own write, and nothing admitted is dropped.
#[test]
fn a_commit_whose_outcome_is_unknown_is_resolved_by_reading_back() {
    use lineage_testkit::proxy::{Cut, Proxy};
    let server = postgres();
    let direct = server.create_database();
    let proxy = Proxy::start(server.port());
    let options = lineage_store::StoreOptions {
        commit_window: std::time::Duration::ZERO,
        ..lineage_store::StoreOptions::default()
    };
    let store = Store::open_with(through(&direct, proxy.port()), options).unwrap();
    let (id, header) = fresh();
    store.create(header).unwrap();
    let turns: Vec<_> = (0..4)
        .map(|t| completed_turn(t as u32 + 1, t * 6, &format!("turn {t}")))
        .collect();
    store.append(id, &turns[0]).unwrap();

    proxy.cut_next(Cut::AnswerTo(b"COMMIT".to_vec()));
    store
        .append(id, &turns[1])
        .expect("the round is found in the store: the append is durable");
    assert_eq!(proxy.cuts(), 1);
    store.append(id, &turns[2]).unwrap();

    proxy.cut_next(Cut::Before(b"COMMIT".to_vec()));
    match store.append(id, &turns[3]) {
        Err(StoreError::CommitFailed { not_durable, .. }) => {
            assert_eq!(not_durable.len(), 1);
            assert_eq!(
                (not_durable[0].session, not_durable[0].seqs.clone()),
                (id, 18..24)
            );
        }
        other => panic!("a COMMIT the server never saw fails the append: {other:?}"),
    }
    assert_eq!(proxy.cuts(), 2);
    store.flush(id).expect("the next flush commits it");
    drop(store);

    let reader = Store::open_read_only(&direct).unwrap();
    assert_eq!(reader.read_from(id, 0).unwrap(), turns.concat());
    assert_eq!(reader.info(id).unwrap().revision, 4);
    assert_intact(&reader.verify().unwrap());
}
