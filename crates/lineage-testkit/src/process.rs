//! Helper processes: a test binary re-runs itself to run one ignored helper test in a process of
//! its own (a writer to kill, a host to crash, a store to build), and talks to it over stdout.
//!
//! The protocol is line-based. The helper prints with [`report_line`]; the parent reads lines and
//! looks for a marker *inside* each line, because libtest prints `test <name> ... ` before the
//! helper's first output on the same line.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long [`wait_for_line`] waits for an expected line before it fails the test. Generous: it
/// bounds a broken helper, never a healthy one (which answers in milliseconds).
pub const LINE_DEADLINE: Duration = Duration::from_secs(60);

/// This test binary, set to run only the test `helper` (exactly that name, ignored or not, on one
/// thread, its output not captured), with stdin closed, stdout piped back to the caller and stderr
/// inherited so a helper's panic shows in the test's output.
///
/// The helper takes its helper branch only when the environment names it a job (the caller sets
/// that with [`Command::env`]). Best, the helper is the calling test itself, which re-runs itself
/// and takes that branch in the child, so nothing is left ignored; a helper shared by several
/// tests must do nothing without the job, as a plain `cargo test -- --include-ignored` runs it too.
pub fn helper_command(helper: &str) -> Command {
    let exe = std::env::current_exe().expect("the test binary knows its path");
    let mut command = Command::new(exe);
    command
        .args([
            "--exact",
            helper,
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
    /// Starts `command` (usually from [`helper_command`]).
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
