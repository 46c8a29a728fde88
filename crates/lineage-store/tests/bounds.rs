//! Every wait on a PostgreSQL server has a bound: an open of a server that never answers, a write
//! that waits on a lock another client holds, and a read the server does not answer within the
//! call's deadline all fail within their bounds, and the store serves the next call once the
//! server answers again.

mod common;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::*;
use lineage_store::{EngineErrorKind, PostgresTimeouts, Store, StoreError, StoreOptions};
use lineage_testkit::postgres::postgres;

/// What a bound may be overrun by on a busy test machine: scheduling, never a wait of its own.
const SLACK: Duration = Duration::from_secs(3);

/// A listener on 127.0.0.1 that accepts connections and never answers them (a black-holed
/// server as a client sees it), for as long as the test runs.
fn black_hole() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a port to listen on");
    let port = listener.local_addr().expect("a bound address").port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for connection in listener.incoming() {
            held.push(connection);
        }
    });
    port
}

fn options(postgres: PostgresTimeouts) -> StoreOptions {
    StoreOptions {
        commit_window: Duration::ZERO,
        postgres,
        ..StoreOptions::default()
    }
}

fn timeout_of(error: &StoreError) -> String {
    match error.engine() {
        Some(engine) if engine.kind() == EngineErrorKind::Timeout => engine.to_string(),
        _ => panic!("expected a timeout, got {error:?}"),
    }
}

#[test]
fn an_open_of_a_server_that_never_answers_fails_within_the_connect_bound() {
    let port = black_hole();
    let url = format!("postgres://ann:hunter2@127.0.0.1:{port}/nowhere");
    let connect = Duration::from_millis(300);
    let started = Instant::now();
    let opened = Store::open_with(
        &url,
        options(PostgresTimeouts {
            connect,
            ..PostgresTimeouts::default()
        }),
    );
    let took = started.elapsed();
    let error = opened.expect_err("a server that never answers is not opened");
    let message = timeout_of(&error);
    assert!(message.contains("connecting to"), "{message}");
    assert!(message.contains("300ms"), "{message}");
    assert!(!error.to_string().contains("hunter2"), "{error}");
    assert!(took >= connect, "it waited the bound: {took:?}");
    assert!(
        took < connect + SLACK,
        "it failed within the bound: {took:?}"
    );
    // A reader, with the default bounds, is bounded too.
    let started = Instant::now();
    let error = Store::open_read_only(&url).expect_err("nor read");
    timeout_of(&error);
    assert!(started.elapsed() < PostgresTimeouts::default().connect + SLACK);
}

#[test]
fn bounds_that_never_end_or_never_wait_are_refused() {
    let url = postgres().create_database();
    let error = Store::open_with(
        &url,
        options(PostgresTimeouts {
            call: Duration::ZERO,
            ..PostgresTimeouts::default()
        }),
    )
    .expect_err("a zero call deadline is refused");
    assert!(
        matches!(
            error,
            StoreError::InvalidOption {
                field: "postgres.call",
                ..
            }
        ),
        "{error:?}"
    );
}

/// A write that waits on a row lock another client holds fails by the server's `lock_timeout`,
/// and commits once the lock is gone.
#[test]
fn a_write_waiting_on_a_lock_fails_by_the_lock_timeout_and_commits_after() {
    let server = postgres();
    let url = server.create_database();
    let store = Store::open_with(
        &url,
        options(PostgresTimeouts {
            lock: Duration::from_millis(200),
            ..PostgresTimeouts::default()
        }),
    )
    .unwrap();
    let (id, header) = fresh();
    store.create(header).unwrap();
    store.append(id, &completed_turn(1, 0, "before")).unwrap();

    let mut holder = server.psql_session(&url);
    holder.run(&format!(
        "BEGIN; SELECT 1 FROM lineage_sessions WHERE id = '{id}' FOR UPDATE;"
    ));
    let started = Instant::now();
    let error = store
        .append(id, &completed_turn(2, 6, "blocked"))
        .expect_err("the write waits on the lock");
    assert!(started.elapsed() < Duration::from_millis(200) + SLACK);
    match &error {
        StoreError::CommitFailed { source, .. } => {
            assert!(source.to_string().contains("55P03"), "{source}");
        }
        other => panic!("expected a failed commit, got {other:?}"),
    }
    holder.run("ROLLBACK;");
    store
        .flush(id)
        .expect("the write commits once the lock is gone");
    assert_eq!(
        store.read_from(id, 0).unwrap(),
        [
            completed_turn(1, 0, "before"),
            completed_turn(2, 6, "blocked")
        ]
        .concat()
    );
}

/// The server's own bounds are off here, so only the store's call deadline ends the waits.
fn call_bound_only(call: Duration) -> PostgresTimeouts {
    PostgresTimeouts {
        statement: Duration::ZERO,
        lock: Duration::ZERO,
        call,
        ..PostgresTimeouts::default()
    }
}

/// A read the server holds past the call's deadline fails with a timeout, its connection is
/// dropped, and the store reads again once the server answers.
#[test]
fn a_read_past_the_call_deadline_fails_and_the_next_read_is_served() {
    let server = postgres();
    let url = server.create_database();
    let call = Duration::from_millis(300);
    let store = Store::open_with(&url, options(call_bound_only(call))).unwrap();
    let (id, header) = fresh();
    store.create(header).unwrap();
    store.append(id, &completed_turn(1, 0, "stored")).unwrap();

    let mut holder = server.psql_session(&url);
    holder.run("BEGIN; LOCK TABLE lineage_sessions IN ACCESS EXCLUSIVE MODE;");
    let started = Instant::now();
    let error = store.load(id).expect_err("the read waits on the lock");
    let took = started.elapsed();
    let message = timeout_of(&error);
    assert!(
        message.contains("reading") && message.contains("300ms"),
        "{message}"
    );
    assert!(took >= call && took < call + SLACK, "{took:?}");
    holder.run("ROLLBACK;");
    assert_eq!(
        store.read_from(id, 0).unwrap(),
        completed_turn(1, 0, "stored")
    );
}

/// A commit whose statement the server holds past the call's deadline fails, its connection is
/// dropped (the writer's included), and the next flush commits on a new one.
#[test]
fn a_commit_past_the_call_deadline_fails_and_the_next_flush_commits() {
    let server = postgres();
    let url = server.create_database();
    let call = Duration::from_millis(300);
    let store = Store::open_with(&url, options(call_bound_only(call))).unwrap();
    let (id, header) = fresh();
    store.create(header).unwrap();
    store.append(id, &completed_turn(1, 0, "before")).unwrap();

    let mut holder = server.psql_session(&url);
    holder.run(&format!(
        "BEGIN; SELECT 1 FROM lineage_sessions WHERE id = '{id}' FOR UPDATE;"
    ));
    let started = Instant::now();
    let error = store
        .append(id, &completed_turn(2, 6, "held"))
        .expect_err("the write waits on the lock");
    assert!(started.elapsed() < call + SLACK);
    match &error {
        StoreError::CommitFailed { source, .. } => {
            assert_eq!(source.kind(), EngineErrorKind::Timeout, "{source}");
            assert!(source.to_string().contains("writing a session"), "{source}");
        }
        other => panic!("expected a failed commit, got {other:?}"),
    }
    holder.run("ROLLBACK;");
    store
        .flush(id)
        .expect("the next flush commits on a new connection");
    drop(store);
    let reader = Store::open_read_only(&url).unwrap();
    assert_eq!(
        reader.read_from(id, 0).unwrap(),
        [completed_turn(1, 0, "before"), completed_turn(2, 6, "held")].concat()
    );
    assert_intact(&reader.verify().unwrap());
}

/// A TCP proxy to the test server that, when armed, lets the next `COMMIT` through and then
/// swallows everything the server says on that connection, leaving it open: the client sees a
/// half-open connection, as after a partition right after the commit.
struct StallingProxy {
    port: u16,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl StallingProxy {
    fn start(target: u16) -> StallingProxy {
        use std::io::{Read, Write};
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let armed = Arc::new(AtomicBool::new(false));
        let arming = armed.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let stalled = Arc::new(AtomicBool::new(false));
                let (mut client_in, mut server_out) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (armed, stalling) = (arming.clone(), stalled.clone());
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n @ 1..) = client_in.read(&mut buf) {
                        let chunk = &buf[..n];
                        if chunk.windows(6).any(|w| w == b"COMMIT")
                            && armed.swap(false, Ordering::SeqCst)
                        {
                            stalling.store(true, Ordering::SeqCst);
                        }
                        if server_out.write_all(chunk).is_err() {
                            break;
                        }
                    }
                    let _ = server_out.shutdown(std::net::Shutdown::Both);
                });
                let (mut server_in, mut client_out) = (server, client);
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n @ 1..) = server_in.read(&mut buf) {
                        if !stalled.load(Ordering::SeqCst)
                            && client_out.write_all(&buf[..n]).is_err()
                        {
                            break;
                        }
                    }
                    let _ = client_out.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        StallingProxy { port, armed }
    }

    fn stall_after_next_commit(&self) {
        self.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A `COMMIT` the server applied but whose answer never comes passes its call deadline: the
/// commit is in doubt, the writer reads the round back on another connection and finds it, so
/// the append is durable and acknowledged, and the next one continues after it.
#[test]
fn a_commit_past_the_call_deadline_is_in_doubt_and_resolved_by_reading_back() {
    let server = postgres();
    let direct = server.create_database();
    let proxy = StallingProxy::start(server.port());
    let (host, database) = direct.rsplit_once('/').unwrap();
    let (host, _) = host.rsplit_once(':').unwrap();
    let through = format!("{host}:{}/{database}", proxy.port);
    let call = Duration::from_millis(500);
    let store = Store::open_with(
        &through,
        options(PostgresTimeouts {
            call,
            ..PostgresTimeouts::default()
        }),
    )
    .unwrap();
    let (id, header) = fresh();
    store.create(header).unwrap();
    let turns: Vec<_> = (0..3)
        .map(|t| completed_turn(t as u32 + 1, t * 6, &format!("turn {t}")))
        .collect();
    store.append(id, &turns[0]).unwrap();

    proxy.stall_after_next_commit();
    let started = Instant::now();
    store
        .append(id, &turns[1])
        .expect("the round is found in the store: the append is durable");
    let took = started.elapsed();
    assert!(took >= call, "the commit waited its deadline: {took:?}");
    assert!(took < call + SLACK, "{took:?}");
    store.append(id, &turns[2]).unwrap();
    drop(store);

    let reader = Store::open_read_only(&direct).unwrap();
    assert_eq!(reader.read_from(id, 0).unwrap(), turns.concat());
    assert_intact(&reader.verify().unwrap());
}
