//! The private PostgreSQL server: it serves databases of their own to the tests of a process,
//! and stops, its directory removed, when that process ends, however it ends.

use std::time::{Duration, Instant};

use lineage_testkit::postgres::postgres;
use lineage_testkit::process::{Helper, after_marker, helper_command, report_line, wait_for_line};

#[test]
fn each_test_gets_a_database_of_its_own() {
    let server = postgres();
    let first = server.create_database();
    let second = server.create_database();
    assert_ne!(first, second);
    server.psql(&first, "CREATE TABLE t (x int); INSERT INTO t VALUES (7)");
    assert_eq!(server.psql(&first, "SELECT x FROM t"), "7");
    let tables = "SELECT count(*) FROM pg_tables WHERE tablename = 't'";
    assert_eq!(server.psql(&second, tables), "0");
    assert!(
        first.starts_with("postgres://lineage@127.0.0.1:"),
        "{first}"
    );
}

/// Waits until `done` holds; a bounded wait on another process, not a timing.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "{what}, within 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_server_stops_when_its_test_process_is_killed() {
    const JOB: &str = "LINEAGE_POSTGRES_HELPER";
    if std::env::var_os(JOB).is_some() {
        // The helper: a server, its address told, then nothing until it is killed.
        let server = postgres();
        report_line(&format!(
            "server={} {}",
            server.port(),
            server.dir().display()
        ));
        loop {
            std::thread::park();
        }
    }
    let mut helper = Helper::spawn(
        helper_command("the_server_stops_when_its_test_process_is_killed").env(JOB, "1"),
    );
    let lines = helper.lines();
    let (port, dir) = wait_for_line(&lines, |line| {
        let found = after_marker(line, "server=")?;
        let (port, dir) = found.split_once(' ')?;
        Some((port.parse::<u16>().ok()?, std::path::PathBuf::from(dir)))
    });
    let probe = || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
    assert!(probe(), "the helper's server accepts connections");
    helper.kill();
    eventually("the server stopped", || !probe());
    eventually("its directory was removed", || !dir.exists());
}
