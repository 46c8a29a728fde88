//! A store on PostgreSQL names why it cannot open or read: the server cannot be reached, the
//! database does not exist, the login was refused, the role lacks a right, the tables are another
//! application's, or one session's row is damaged (then that session, and only it, fails).

mod common;

use std::time::{Duration, Instant};

use lineage_store::{EngineErrorKind, Store, StoreError};
use lineage_testkit::postgres::{ROLE, postgres};

/// The kind and message of a failed open.
fn failure(opened: lineage_store::Result<Store>) -> (EngineErrorKind, String) {
    match opened {
        Ok(_) => panic!("the open succeeded"),
        Err(StoreError::Storage(engine)) => (engine.kind(), engine.to_string()),
        Err(other) => panic!("expected a storage error, got {other:?}"),
    }
}

/// `url` (of the test server) with another role and password.
fn as_role(url: &str, role: &str, password: &str) -> String {
    url.replacen(
        &format!("postgres://{ROLE}@"),
        &format!("postgres://{role}:{password}@"),
        1,
    )
}

/// The database name at the end of `url`.
fn database_of(url: &str) -> &str {
    url.rsplit_once('/').expect("a database URL").1
}

#[test]
fn a_server_nobody_listens_for_is_unreachable() {
    let url = lineage_testkit::postgres::unanswered_url();
    for opened in [Store::open(&url), Store::open_read_only(&url)] {
        let (kind, message) = failure(opened);
        assert_eq!(kind, EngineErrorKind::Unreachable, "{message}");
        assert!(message.contains("cannot be reached"), "{message}");
        assert!(message.contains("ann:***@127.0.0.1"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
    }
}

#[test]
fn a_database_the_server_does_not_hold_is_missing() {
    let url = postgres().url("no_such_database");
    for opened in [Store::open(&url), Store::open_read_only(&url)] {
        let (kind, message) = failure(opened);
        assert_eq!(kind, EngineErrorKind::DatabaseMissing, "{message}");
        assert!(message.contains("3D000"), "{message}");
        assert!(message.contains("does not exist"), "{message}");
    }
}

#[test]
fn a_role_the_server_does_not_know_is_refused_its_login() {
    let url = as_role(&postgres().create_database(), "nobody_known", "secret");
    let (kind, message) = failure(Store::open(&url));
    assert_eq!(kind, EngineErrorKind::AuthenticationFailed, "{message}");
    assert!(message.contains("28000"), "{message}");
    assert!(!message.contains("secret"), "{message}");
}

/// The server trusts local connections; one database gets a rule that asks its role for a
/// password, and a wrong one is refused.
#[test]
fn a_wrong_password_is_refused_its_login() {
    let server = postgres();
    let url = server.create_database();
    let database = database_of(&url).to_owned();
    server.psql(
        &url,
        "CREATE ROLE ann LOGIN PASSWORD 'right'; GRANT CREATE ON SCHEMA public TO ann",
    );
    let hba = server.dir().join("data/pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(
        &hba,
        format!("host {database} ann 127.0.0.1/32 scram-sha-256\n{rules}"),
    )
    .unwrap();
    server.psql(&url, "SELECT pg_reload_conf()");
    let wrong = as_role(&url, "ann", "wrong");
    // The server takes the rule up as it reloads: until then it trusts the login.
    let deadline = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        match Store::open_read_only(&wrong) {
            Err(error) => break error,
            Ok(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Ok(_) => panic!("the server did not take up the password rule within 20 s"),
        }
    };
    let (kind, message) = failure(Err(refused));
    assert_eq!(kind, EngineErrorKind::AuthenticationFailed, "{message}");
    assert!(message.contains("28P01"), "{message}");
    assert!(!message.contains("wrong@"), "{message}");
    Store::open(as_role(&url, "ann", "right")).expect("the right password logs in");
}

#[test]
fn a_role_without_rights_is_denied_and_told_which() {
    let server = postgres();
    let url = server.create_database();
    server.psql(&url, "CREATE ROLE bare LOGIN");
    let bare = as_role(&url, "bare", "unused");
    // A new database: the role may not create the tables in its schema.
    let (kind, message) = failure(Store::open(&bare));
    assert_eq!(kind, EngineErrorKind::PermissionDenied, "{message}");
    assert!(message.contains("42501"), "{message}");
    assert!(message.contains("CREATE on the schema"), "{message}");
    // A store: the role may not read its tables.
    drop(Store::open(&url).unwrap());
    let (kind, message) = failure(Store::open_read_only(&bare));
    assert_eq!(kind, EngineErrorKind::PermissionDenied, "{message}");
    assert!(message.contains("lineage_"), "{message}");
}

/// A `lineage_meta` of another application (other columns, or other types) is not a store's, and
/// says so; neither open panics, and a writer creates nothing beside it.
#[test]
fn a_meta_table_of_another_shape_is_not_a_lineage_table() {
    let server = postgres();
    let shapes = [
        "CREATE TABLE lineage_meta (id int, note text); INSERT INTO lineage_meta VALUES (1, 'x')",
        "CREATE TABLE lineage_meta (name text, value int); INSERT INTO lineage_meta VALUES ('magic', 7)",
        "CREATE TABLE lineage_meta (name text, value bytea); INSERT INTO lineage_meta VALUES (NULL, NULL)",
    ];
    for shape in shapes {
        let url = server.create_database();
        server.psql(&url, shape);
        for opened in [Store::open(&url), Store::open_read_only(&url)] {
            match opened {
                Err(StoreError::NotAStore { reason, .. }) => assert!(
                    reason.starts_with("the table lineage_meta is not a Lineage table: "),
                    "{shape}: {reason}"
                ),
                other => panic!("{shape}: expected NotAStore, got {other:?}"),
            }
        }
        assert_eq!(
            server.psql(
                &url,
                "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'lineage_%'"
            ),
            "1",
            "{shape}: nothing was created beside it"
        );
    }
}

/// A garbled session row is that session's error: the list names it and lists the others, and a
/// copy copies the others and names it.
#[test]
fn a_garbled_session_row_fails_only_its_session() {
    use common::*;
    let server = postgres();
    let url = server.create_database();
    let store = Store::open(&url).unwrap();
    let mut ids = Vec::new();
    for turn in 0..3 {
        let (id, header) = fresh();
        store.create(header).unwrap();
        store
            .append(id, &completed_turn(1, 0, &format!("turn {turn}")))
            .unwrap();
        ids.push(id);
    }
    drop(store);
    let garbled = ids[1];
    server.psql(
        &url,
        &format!("UPDATE lineage_sessions SET row = '\\x00ffee' WHERE id = '{garbled}'"),
    );
    let store = Store::open_read_only(&url).unwrap();
    match store.list() {
        Err(StoreError::CorruptHeader { session, .. }) => assert_eq!(session, garbled),
        other => panic!("expected the garbled row's error, got {other:?}"),
    }
    let listed = store.list_each().unwrap();
    assert_eq!(listed.len(), 3);
    for (id, entry) in ids.iter().zip(&listed) {
        match entry {
            Ok(info) => assert_eq!(info.header.id, *id),
            Err(StoreError::CorruptHeader { session, .. }) => assert_eq!(*session, garbled),
            Err(other) => panic!("expected the garbled row's error, got {other:?}"),
        }
    }
    assert_eq!(listed.iter().filter(|e| e.is_err()).count(), 1);

    let copy = mem_store();
    let copied = store.copy_into(&copy).unwrap();
    assert_eq!(copied.copied, vec![ids[0], ids[2]]);
    assert_eq!(copied.damaged.len(), 1);
    assert_eq!(copied.damaged[0].0, garbled);
    assert!(
        copied.damaged[0].1.contains(&garbled.to_string()),
        "{:?}",
        copied.damaged
    );
    assert_eq!(copy.list().unwrap().len(), 2);
}
