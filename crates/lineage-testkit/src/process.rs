//! Helper processes: a test that needs a process of its own (a writer to kill, a host to crash, a
//! store to build) re-runs itself, by its own exact name, with the environment naming the job,
//! and in that child takes its helper branch; the two talk over stdout. So no helper test sits
//! ignored beside the tests that use it, and none passes by doing nothing:
//!
//! ```text
//! #[test]
//! fn a_killed_writer_loses_nothing() {
//!     if let Some(path) = helper_job() {
//!         return write_until_killed(&path);
//!     }
//!     let path = a_new_store();
//!     let flushed = crash_after_report(&mut rerun_this_test(&path), "flushed ");
//!     // … the store holds everything up to `flushed`.
//! }
//! ```
//!
//! Tests that share a helper each re-run themselves and call one helper function from their
//! helper branch.
//!
//! The protocol is line-based. The helper prints with [`report_line`]; the parent reads lines and
//! looks for a marker *inside* each line, because libtest prints `test <name> ... ` before the
//! helper's first output on the same line.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long [`wait_for_line`] waits for an expected line before it fails the test. Generous: it
/// bounds a broken helper, never a healthy one (which answers in milliseconds).
pub const LINE_DEADLINE: Duration = Duration::from_secs(60);

/// The environment variable that names the job of a test re-run by [`rerun_this_test`].
const JOB_VAR: &str = "LINEAGE_TEST_HELPER_JOB";

/// The job this process was started for when it is a test re-run by [`rerun_this_test`] (what the
/// job says, such as the store to write, is the test's to define); `None` in an ordinary run.
pub fn helper_job() -> Option<String> {
    std::env::var_os(JOB_VAR).map(|job| {
        job.into_string()
            .expect("a helper's job is UTF-8, as rerun_this_test was given it")
    })
}

/// What the parent set in the environment variable `var` for this helper, parsed: the details
/// of a job beyond [`helper_job`]. Panics, failing the helper, when it is unset or does not parse.
pub fn helper_arg<T: std::str::FromStr>(var: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    let value = std::env::var(var).unwrap_or_else(|e| panic!("the parent sets {var}: {e}"));
    value
        .parse()
        .unwrap_or_else(|e| panic!("{var} holds {value:?}, which does not parse: {e:?}"))
}

/// The calling test re-run alone, as [`helper_command`] runs it, with the environment naming
/// `job`, which [`helper_job`] returns in the child.
///
/// The test is found by the name of the thread calling this: libtest runs each test on a thread
/// named after it. Panics when called off that thread, or from a helper (a helper that started
/// helpers would start itself again without end).
pub fn rerun_this_test(job: impl AsRef<OsStr>) -> Command {
    assert!(
        helper_job().is_none(),
        "a helper process does not start helpers of its own"
    );
    let thread = std::thread::current();
    let test = thread
        .name()
        .filter(|name| *name != "main")
        .expect("rerun_this_test is called on the test's own thread, which libtest names after it");
    let mut command = helper_command(test);
    command.env(JOB_VAR, job);
    command
}

/// This test binary, set to run only the test `test` (exactly that name, ignored or not, on one
/// thread, its output not captured), with stdin closed, stdout piped back to the caller and stderr
/// inherited so a helper's panic shows in the test's output.
///
/// The test takes its helper branch only when the environment names it a job; the caller sets
/// that with [`Command::env`]. [`rerun_this_test`] does both for the calling test.
pub fn helper_command(test: &str) -> Command {
    let exe = std::env::current_exe().expect("the test binary knows its path");
    let mut command = Command::new(exe);
    command
        .args([
            "--exact",
            test,
            "--nocapture",
            "--include-ignored",
            "--test-threads=1",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    command
}

/// Writes `line` and a newline to stdout and flushes, so the parent sees it at once. When the
/// parent is gone (the pipe is closed) the helper exits quietly with status 0 instead of
/// panicking on a broken pipe.
pub fn report_line(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        std::process::exit(0);
    }
}

/// A helper process that is killed and reaped when dropped, so a failing test (which unwinds past
/// it) never leaves one running.
pub struct Helper(pub Child);

impl Helper {
    /// Starts `command` (usually from [`rerun_this_test`]).
    pub fn spawn(command: &mut Command) -> Helper {
        Helper(command.spawn().expect("the helper process starts"))
    }

    /// The lines the helper prints, read on a thread of their own so the helper never blocks on
    /// a full pipe. The channel closes when the helper's stdout does. Panics if stdout was not
    /// piped or was taken already.
    pub fn lines(&mut self) -> mpsc::Receiver<String> {
        let stdout = self.0.stdout.take().expect("piped stdout, not taken yet");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        rx
    }

    /// Kills the helper with SIGKILL and reaps it; returns whether it had already exited on its
    /// own (a helper meant to be killed mid-work has then failed before the kill).
    pub fn kill(&mut self) -> bool {
        let finished = matches!(self.0.try_wait(), Ok(Some(_)));
        let _ = self.0.kill();
        self.0.wait().expect("the helper is reaped");
        finished
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        // Already reaped when the test waited for it; both calls then fail harmlessly.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The next line from `rx` for which `pick` gives a value. Lines `pick` refuses are skipped.
/// Fails the test if no such line arrives within [`LINE_DEADLINE`] or the helper's stdout closes
/// first.
pub fn wait_for_line<T>(rx: &mpsc::Receiver<String>, mut pick: impl FnMut(&str) -> Option<T>) -> T {
    let deadline = Instant::now() + LINE_DEADLINE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(value) = pick(&line) {
                    return value;
                }
            }
            Err(e) => panic!("no expected line from the helper before the deadline: {e}"),
        }
    }
}

/// What follows `marker` in `line`, trimmed, if `line` holds it (anywhere: libtest may have
/// printed its own `test … ` before it).
pub fn after_marker<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    line.split_once(marker).map(|(_, rest)| rest.trim())
}

/// Runs `command` until the helper reports a line holding `marker`, then kills it with SIGKILL,
/// reaps it, and returns what followed the marker on that line (see [`after_marker`]).
///
/// The kill comes only after the report, so whatever the helper made durable before reporting is
/// on disk; what it was doing after is torn. Fails the test if the helper's stdout ends, or
/// [`LINE_DEADLINE`] passes, before the marker.
pub fn crash_after_report(command: &mut Command, marker: &str) -> String {
    let mut helper = Helper::spawn(command);
    let lines = helper.lines();
    let reported = wait_for_line(&lines, |line| after_marker(line, marker).map(str::to_owned));
    let finished = helper.kill();
    assert!(
        !finished,
        "the helper exited on its own before it was killed"
    );
    reported
}
