//! Output streams: `lineage show --json` on a large session writes as it reads, in bounded memory,
//! and stops quietly as soon as its reader closes the pipe, as `export` does.
//!
//! This process stays small (each test re-runs itself to build its store): a child's peak memory
//! as `wait4` reports it includes the peak of the process that started it.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use lineage_log::{Header, SessionId};
use lineage_store::Store;
use lineage_testkit::process::{helper_arg, helper_job, rerun_this_test};
use lineage_testkit::realistic_session;

/// Events in the large session.
const LARGE: usize = 200_000;

/// The most memory `lineage show --json` may take on the large session. Measured: about 22 MiB
/// (debug build) while streaming it, against about 1.5 GiB when the session was held whole to
/// print it; its JSON is about 80 MB.
const PEAK_BOUND_KIB: i64 = 64 * 1024;

fn s(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temp path")
}

/// How a child process ended, and the most memory it held.
struct Ended {
    status: libc::c_int,
    max_rss_kib: i64,
}

impl Ended {
    /// Checks that the peak memory stayed under [`PEAK_BOUND_KIB`].
    fn assert_small(&self) {
        assert!(
            self.max_rss_kib < PEAK_BOUND_KIB,
            "peak memory {} KiB, bound {PEAK_BOUND_KIB} KiB",
            self.max_rss_kib
        );
    }
}

/// Waits for `child` with `wait4`, for its peak memory; kills it if it has not ended within a
/// generous deadline (a test that fails, not one that hangs).
fn wait_with_usage(child: Child) -> Ended {
    let pid = libc::pid_t::try_from(child.id()).expect("a pid");
    // Reaped below by `wait4`; dropping the handle only closes what is left of its pipes.
    drop(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut status: libc::c_int = 0;
        // SAFETY: `rusage` is plain data that `wait4` fills in; `status` is a valid out pointer.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        let _ = tx.send((reaped, status, usage.ru_maxrss));
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok((reaped, status, max_rss)) => {
            assert_eq!(reaped, pid, "wait4 reaped the child");
            Ended {
                status,
                max_rss_kib: max_rss,
            }
        }
        Err(_) => {
            // SAFETY: signalling a child of this process that has not been reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("lineage did not exit within two minutes of its output pipe closing");
        }
    }
}

/// How many events the store-building helper's session holds.
const BUILD_EVENTS_VAR: &str = "LINEAGE_CLI_TEST_BUILD_EVENTS";

/// The store-building helper (each test re-run with the store's path as its job): writes one
/// realistic session of the asked length to a new store at `path` and prints its id. It runs
/// apart so that this process never holds a large log: a child's peak memory (`ru_maxrss`)
/// counts the peak of the process that started it.
fn build_store(path: &str) {
    let events: usize = helper_arg(BUILD_EVENTS_VAR);
    let id = SessionId::new();
    let store = Store::open(path).unwrap();
    store
        .import(
            Header::new(id, 1_750_000_000_000),
            &realistic_session(12, events),
        )
        .unwrap();
    store.close().unwrap();
    println!("built {id}");
}

/// A store holding one realistic session of `events` events, built by the calling test re-run
/// as the store-building helper.
fn store_with_session(dir: &Path, events: usize) -> (std::path::PathBuf, SessionId) {
    let path = dir.join("large.lineage");
    let output = rerun_this_test(&path)
        .env(BUILD_EVENTS_VAR, events.to_string())
        .output()
        .expect("the builder process runs");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let id = stdout
        .split("built ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("the helper built the store: {stdout}"));
    (path, id)
}

/// `lineage show <path> <id> --json`, started with its stdout piped.
fn show_json(path: &Path, id: SessionId, stderr: Stdio) -> Child {
    Command::new(env!("CARGO_BIN_EXE_lineage"))
        .args(["show", s(path), &id.to_string(), "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("the binary runs")
}

#[test]
fn show_json_on_a_large_session_stops_quietly_when_its_pipe_closes_and_stays_small() {
    if let Some(path) = helper_job() {
        return build_store(&path);
    }
    let dir = tempfile::tempdir().unwrap();
    let (path, id) = store_with_session(dir.path(), LARGE);
    let mut child = show_json(&path, id, Stdio::piped());
    let mut stderr = child.stderr.take().expect("piped stderr");
    {
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut first = Vec::new();
        for _ in 0..4 {
            let mut line = String::new();
            stdout.read_line(&mut line).unwrap();
            first.push(line);
        }
        assert_eq!(first[0], "{\n");
        assert_eq!(first[1], "  \"events\": [\n");
        assert_eq!(first[2], "    {\n");
        // The first event's first key: serde_json orders keys sorted (`body`) or as written
        // (`seq`), depending on its features in the build.
        assert!(
            first[3].starts_with("      \"body\": {") || first[3].starts_with("      \"seq\": 0,"),
            "{first:?}"
        );
        // Dropping the reader closes the pipe while most of the session is still unread.
    }
    let ended = wait_with_usage(child);
    let mut said = String::new();
    stderr.read_to_string(&mut said).unwrap();
    assert!(
        libc::WIFEXITED(ended.status),
        "exited by itself, not by a signal: status {}",
        ended.status
    );
    assert_eq!(
        libc::WEXITSTATUS(ended.status),
        0,
        "a closed pipe is a quiet success; stderr: {said}"
    );
    assert_eq!(said, "", "nothing said about the closed pipe");
    ended.assert_small();
}

#[test]
fn show_json_reads_a_large_session_whole_in_bounded_memory() {
    if let Some(path) = helper_job() {
        return build_store(&path);
    }
    let dir = tempfile::tempdir().unwrap();
    let (path, id) = store_with_session(dir.path(), LARGE);
    let mut child = show_json(&path, id, Stdio::null());
    // Counted as it arrives, so this process holds none of it.
    let mut stdout = child.stdout.take().expect("piped stdout");
    let counter = std::thread::spawn(move || {
        let mut buffer = vec![0u8; 1 << 16];
        let (mut bytes, mut events) = (0u64, 0u64);
        let mut tail = Vec::new();
        loop {
            let n = stdout.read(&mut buffer).unwrap();
            if n == 0 {
                return (bytes, events, tail);
            }
            bytes += n as u64;
            // Each event object opens on its own line, indented four spaces.
            let chunk = [tail.as_slice(), &buffer[..n]].concat();
            events += chunk.windows(6).filter(|w| *w == b"\n    {").count() as u64;
            tail = chunk[chunk.len().saturating_sub(5)..].to_vec();
        }
    });
    let ended = wait_with_usage(child);
    let (bytes, events, tail) = counter.join().unwrap();
    assert!(libc::WIFEXITED(ended.status) && libc::WEXITSTATUS(ended.status) == 0);
    let len = Store::open_read_only(&path).unwrap().info(id).unwrap().len;
    assert_eq!(events, len);
    assert!(tail.ends_with(b"\"\n}\n"), "the document is closed");
    assert!(
        bytes > 40 * 1024 * 1024,
        "the JSON is far larger than the bound: {bytes} bytes"
    );
    ended.assert_small();
}

#[test]
fn export_stops_quietly_when_its_output_is_gone() {
    if let Some(path) = helper_job() {
        return build_store(&path);
    }
    let dir = tempfile::tempdir().unwrap();
    let (path, id) = store_with_session(dir.path(), 5_000);
    let mut child = Command::new(env!("CARGO_BIN_EXE_lineage"))
        .args(["export", s(&path), &id.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.starts_with("{\"type\":\"lineage/session\","), "{line}");
    line.clear();
    stdout.read_line(&mut line).unwrap();
    assert!(line.starts_with("{\"seq\":0,"), "{line}");
    drop(stdout);
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert!(output.stderr.is_empty(), "{:?}", output.stderr);
}
