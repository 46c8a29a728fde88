//! `lineage` with a store in PostgreSQL: `copy` between a file and a database both ways, and the
//! read-only commands against a `postgres://` URL while a host writes to it.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{run, s};
use lineage_log::{Event, Header, SessionId};
use lineage_store::Store;
use lineage_testkit::ev::{self, fork_spec};
use lineage_testkit::postgres::postgres;

const T0: i64 = 1_750_000_000_000;

fn turn(turn: u32, first_seq: u64) -> Vec<Event> {
    let n = u64::from(turn) * 2;
    ev::numbered(
        first_seq,
        T0 + first_seq as i64 * 1_000,
        1_000,
        ev::completed_turn(turn, ev::mid(n), "question", ev::mid(n + 1), "answer"),
    )
}

/// A root with two turns and a fork of it, in the store at `location`.
fn two_sessions(location: &Path) -> (SessionId, SessionId) {
    let store = Store::open(location).unwrap();
    let root = SessionId::new();
    let header = Header::new(root, T0 as u64).with_cwd("/work/project");
    let mut log = turn(1, 0);
    log.extend(turn(2, log.len() as u64));
    store.import(header, &log).unwrap();
    let child = SessionId::new();
    let spec = fork_spec(child, None, T0 as u64 + 60_000, 1);
    store.fork(root, &spec).unwrap();
    store.close().unwrap();
    (root, child)
}

#[test]
fn copy_moves_every_session_into_a_database_and_back_and_a_second_copy_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sessions.lineage");
    let back = dir.path().join("back.lineage");
    let (root, child) = two_sessions(&file);
    let url = postgres().create_database();

    let first = run(&["copy", s(&file), &url, "--json"]).ok().json();
    let ids = [root.to_string(), child.to_string()];
    assert_eq!(first["copied"], serde_json::json!(ids), "{first}");
    assert_eq!(first["verify"]["ok"], true, "{first}");
    let second = run(&["copy", s(&file), &url, "--json"]).ok().json();
    assert_eq!(second["copied"], serde_json::json!([]), "{second}");
    assert_eq!(second["present"], serde_json::json!(ids), "{second}");

    let text = run(&["copy", &url, s(&back)]).ok().stdout;
    assert!(text.contains("copied 2 session(s)"), "{text}");
    assert!(text.contains("verify: ok, 2 sessions intact"), "{text}");
    // The three stores read the same, session by session and event by event.
    for session in &ids {
        let original = run(&["export", s(&file), session]).ok().stdout;
        assert_eq!(run(&["export", &url, session]).ok().stdout, original);
        assert_eq!(run(&["export", s(&back), session]).ok().stdout, original);
    }
    let listed = |location: &str| run(&["ls", location, "--json"]).ok().stdout;
    assert_eq!(listed(&url), listed(s(&file)));
    assert_eq!(listed(s(&back)), listed(s(&file)));
}

#[test]
fn the_read_only_commands_follow_a_database_while_a_host_writes() {
    let url = postgres().create_database();
    let store = Store::open(&url).unwrap();
    let root = SessionId::new();
    store
        .import(
            Header::new(root, T0 as u64).with_cwd("/work/project"),
            &turn(1, 0),
        )
        .unwrap();
    let id = root.to_string();

    // The host keeps appending turns while the commands run.
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let host = scope.spawn(|| {
            let mut turns = 1;
            while !stop.load(Ordering::Relaxed) {
                let len = store.info(root).unwrap().len;
                turns += 1;
                store.append(root, &turn(turns, len)).unwrap();
            }
            turns
        });
        let mut seen = 0;
        for _ in 0..3 {
            let ls = run(&["ls", &url, "--json"]).ok().json();
            let events = ls[0]["events"]
                .as_u64()
                .expect("ls gives the session's events");
            assert!(events >= seen, "a later listing never shows fewer events");
            seen = events;
            let shown = run(&["show", &url, &id]).ok().stdout;
            assert!(shown.contains("turn/end"), "{shown}");
            run(&["tail", &url, &id, "-n", "3"]).ok();
            run(&["tree", &url]).ok();
            run(&["stats", &url]).ok();
            let verified = run(&["verify", &url, "--json"]).ok().json();
            assert_eq!(verified["ok"], true, "{verified}");
        }
        stop.store(true, Ordering::Relaxed);
        let turns = host.join().unwrap();
        assert!(turns > 1, "the host wrote while the commands ran");
    });
    let listed = run(&["ls", &url, "--json"]).ok().json();
    assert_eq!(listed[0]["events"], store.info(root).unwrap().len);
}

#[test]
fn a_database_url_is_shown_without_its_password() {
    let url = lineage_testkit::postgres::unanswered_url();
    let failed = run(&["ls", &url]);
    assert_ne!(failed.code, 0);
    assert!(
        failed.stderr.contains("ann:***@127.0.0.1"),
        "{}",
        failed.stderr
    );
    assert!(!failed.stderr.contains("hunter2"), "{}", failed.stderr);
}

/// Each reason a database's server refuses a command has its own exit code and sentence.
#[test]
fn a_server_that_refuses_is_named_with_its_own_exit_code() {
    let server = postgres();
    let url = server.create_database();
    drop(Store::open(&url).unwrap());
    server.psql(&url, "CREATE ROLE bare LOGIN");
    let as_role =
        |role: &str| url.replacen("postgres://lineage@", &format!("postgres://{role}@"), 1);
    let cases = [
        (
            lineage_testkit::postgres::unanswered_url(),
            4,
            "cannot be reached",
        ),
        (as_role("nobody_known"), 5, "refused the login"),
        (as_role("bare"), 6, "lacks a right"),
        (server.url("no_such_database"), 7, "does not exist"),
    ];
    for (target, code, says) in cases {
        for command in ["ls", "tree"] {
            let failed = run(&[command, &target]);
            assert_eq!(failed.code, code, "{command} {target}: {}", failed.stderr);
            assert!(
                failed.stderr.contains(says),
                "{command} {target}: {}",
                failed.stderr
            );
            assert!(!failed.stderr.contains("damaged"), "{}", failed.stderr);
        }
    }
}

/// A server that accepts connections and never answers fails a command within the connect bound.
#[test]
fn a_command_on_a_server_that_never_answers_fails_within_its_bound() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for connection in listener.incoming() {
            held.push(connection);
        }
    });
    let started = std::time::Instant::now();
    let failed = run(&["ls", &format!("postgres://lineage@127.0.0.1:{port}/silent")]);
    let took = started.elapsed();
    assert_eq!(failed.code, 4, "{}", failed.stderr);
    assert!(
        failed.stderr.contains("got no answer within 5s"),
        "{}",
        failed.stderr
    );
    let bound = lineage_store::PostgresTimeouts::default().connect;
    assert!(took < bound + std::time::Duration::from_secs(5), "{took:?}");
}

/// One garbled session row: `ls`, `tree` and `copy` go on with the other sessions, name the
/// garbled one, and exit 1.
#[test]
fn ls_tree_and_copy_go_on_past_a_garbled_session_row() {
    let server = postgres();
    let dir = tempfile::tempdir().unwrap();
    let url = server.create_database();
    let (root, child) = two_sessions(Path::new(&url));
    let store = Store::open(&url).unwrap();
    let garbled = SessionId::new();
    store
        .import(Header::new(garbled, T0 as u64), &turn(1, 0))
        .unwrap();
    store.close().unwrap();
    server.psql(
        &url,
        &format!("UPDATE lineage_sessions SET row = '\\x00ffee' WHERE id = '{garbled}'"),
    );
    for command in ["ls", "tree"] {
        let failed = run(&[command, &url]);
        assert_eq!(failed.code, 1, "{command}: {}", failed.stderr);
        for id in [root, child] {
            assert!(
                failed.stdout.contains(&id.to_string()[..8]),
                "{command}: {}",
                failed.stdout
            );
        }
        assert!(
            failed
                .stderr
                .contains(&format!("corrupt header of session {garbled}")),
            "{command}: {}",
            failed.stderr
        );
    }
    let back = dir.path().join("back.lineage");
    let failed = run(&["copy", &url, s(&back), "--json"]);
    assert_eq!(failed.code, 1, "{}", failed.stderr);
    let report: serde_json::Value = serde_json::from_str(&failed.stdout).unwrap();
    assert_eq!(
        report["copied"],
        serde_json::json!([root.to_string(), child.to_string()])
    );
    assert_eq!(report["damaged"], serde_json::json!([garbled.to_string()]));
    assert!(
        failed.stderr.contains(&garbled.to_string()),
        "{}",
        failed.stderr
    );
    assert_eq!(
        Store::open_read_only(&back).unwrap().list().unwrap().len(),
        2
    );
}
