//! A child agent's process: spawned in its own process group with an allow-listed environment, its
//! stderr's tail kept for diagnostics, and torn down by a ladder that leaves no process of its
//! group behind.

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::process::{Pid, Signal};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::time::Instant;

/// The variables a child inherits from the parent when the configuration names none.
pub const DEFAULT_PASSTHROUGH: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TMPDIR",
    "TZ",
];

/// The most bytes of a child's stderr kept for its diagnostics (the newest ones).
pub const STDERR_TAIL_BYTES: usize = 2048;

/// Whether a variable's name looks like it holds a credential. Such a variable is never passed
/// through from the parent, even when allow-listed; only an explicit `env` entry sets one.
pub fn credential_shaped(name: &OsStr) -> bool {
    const MARKS: &[&str] = &[
        "KEY",
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
        "AUTH",
        "COOKIE",
        "PRIVATE",
    ];
    let name = name.to_string_lossy().to_ascii_uppercase();
    MARKS.iter().any(|mark| name.contains(mark))
}

/// The environment of a child: the parent's variables that `passthrough` names and that are
/// not credential-shaped, then `explicit`, which wins over what it repeats.
pub fn child_env(
    parent: impl IntoIterator<Item = (OsString, OsString)>,
    passthrough: &[OsString],
    explicit: &[(OsString, OsString)],
) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = parent
        .into_iter()
        .filter(|(name, _)| passthrough.contains(name) && !credential_shaped(name))
        .filter(|(name, _)| !explicit.iter().any(|(set, _)| set == name))
        .collect();
    env.extend(explicit.iter().cloned());
    env
}

/// The newest bytes a child wrote to stderr ([`STDERR_TAIL_BYTES`] at most), and whether its
/// stderr has ended.
#[derive(Clone, Debug, Default)]
pub struct StderrTail(Arc<Tail>);

#[derive(Debug, Default)]
struct Tail {
    bytes: Mutex<Vec<u8>>,
    ended: tokio::sync::watch::Sender<bool>,
}

impl StderrTail {
    fn push(&self, bytes: &[u8]) {
        let mut tail = self.0.bytes.lock().unwrap_or_else(|p| p.into_inner());
        tail.extend_from_slice(bytes);
        if tail.len() > STDERR_TAIL_BYTES {
            let cut = tail.len() - STDERR_TAIL_BYTES;
            tail.drain(..cut);
        }
    }

    fn end(&self) {
        self.0.ended.send_replace(true);
    }

    /// Waits, for at most `bound`, until the child's stderr has ended, so that a report made
    /// after it exited holds everything it wrote there. Bounded: a process it left behind may
    /// keep the pipe open.
    pub async fn drained(&self, bound: Duration) {
        let mut ended = self.0.ended.subscribe();
        let _ = tokio::time::timeout(bound, ended.wait_for(|ended| *ended)).await;
    }

    /// The tail as text (lossy), trimmed.
    pub fn text(&self) -> String {
        let tail = self.0.bytes.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&tail).trim().to_owned()
    }
}

/// What to run.
#[derive(Debug)]
pub struct Launch<'a> {
    /// The program, found on `PATH` when it has no directory part.
    pub program: &'a OsStr,
    /// Its arguments.
    pub args: &'a [OsString],
    /// Its working directory.
    pub cwd: &'a Path,
    /// Its whole environment (see [`child_env`]): nothing else is inherited.
    pub env: Vec<(OsString, OsString)>,
}

/// A running agent process, the leader of its own process group.
#[derive(Debug)]
pub struct AgentProcess {
    child: Child,
    /// The group's id (the leader's pid); `None` only if the pid was unknown at spawn.
    group: Option<Pid>,
    /// The child's stdin, shared with the transport that writes frames; taking it closes it.
    pub stdin: Arc<tokio::sync::Mutex<Option<ChildStdin>>>,
    /// The newest bytes of its stderr.
    pub stderr: StderrTail,
    status: Option<ExitStatus>,
}

impl AgentProcess {
    /// Spawns `launch` with piped stdio in a new process group; its stdout is returned for the
    /// transport to read. Stderr is drained on a task of its own into the tail (and to
    /// `tracing` at debug level), so a chatty child never blocks on a full pipe.
    pub fn spawn(launch: Launch<'_>) -> io::Result<(AgentProcess, ChildStdout)> {
        let mut child = Command::new(launch.program)
            .args(launch.args)
            .current_dir(launch.cwd)
            .env_clear()
            .envs(launch.env)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // The last resort, if the process is dropped without its ladder: the leader dies.
            .kill_on_drop(true)
            .spawn()?;
        let group = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .and_then(Pid::from_raw);
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| io::Error::other("the child's stdout was not piped"))?;
        let stdin = child.stdin.take();
        let stderr = StderrTail::default();
        if let Some(mut pipe) = child.stderr.take() {
            let tail = stderr.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = pipe.read(&mut buf).await {
                    tail.push(&buf[..n]);
                    tracing::debug!(target: "lineage_process::child", "{}", String::from_utf8_lossy(&buf[..n]).trim_end());
                }
                tail.end();
            });
        }
        Ok((
            AgentProcess {
                child,
                group,
                stdin: Arc::new(tokio::sync::Mutex::new(stdin)),
                stderr,
                status: None,
            },
            stdout,
        ))
    }

    /// The group's id.
    pub fn group(&self) -> Option<i32> {
        self.group.map(Pid::as_raw_nonzero).map(i32::from)
    }

    /// Waits up to `limit` for the leader to exit; its status, if it did.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let _ = tokio::time::timeout(limit, self.reap()).await;
        self.status
    }

    /// Kills the whole group at once and reaps the leader: for a start that failed before its
    /// run was published, when there is nothing to wind down.
    pub async fn kill(&mut self) -> Option<ExitStatus> {
        self.stdin.lock().await.take();
        self.signal(Signal::KILL);
        self.reap().await;
        self.wait_group_gone(Instant::now() + Duration::from_secs(1))
            .await;
        self.status
    }

    /// The dispose ladder: close stdin, wait `eof_grace` for the group to leave; SIGTERM the
    /// group, wait `term_grace`; SIGKILL the group; reap. Returns once the leader is reaped and
    /// no process of the group is left (or, for members only the kernel can still hold, a
    /// second after the SIGKILL).
    pub async fn shut_down(&mut self, eof_grace: Duration, term_grace: Duration) -> Ladder {
        self.stdin.lock().await.take();
        if self.wait_all(eof_grace).await {
            return Ladder::Exited;
        }
        self.signal(Signal::TERM);
        if self.wait_all(term_grace).await {
            return Ladder::Terminated;
        }
        self.kill().await;
        Ladder::Killed
    }

    /// Waits up to `grace` for the leader to exit and the group to empty.
    async fn wait_all(&mut self, grace: Duration) -> bool {
        let deadline = Instant::now() + grace;
        tokio::time::timeout_at(deadline, self.reap()).await.is_ok()
            && self.wait_group_gone(deadline).await
    }

    async fn reap(&mut self) {
        if self.status.is_none() {
            self.status = self.child.wait().await.ok();
        }
    }

    /// Polls until no live process is left in the group, until `deadline`. There is no
    /// notification for a group emptying whose members are not our children.
    async fn wait_group_gone(&self, deadline: Instant) -> bool {
        let Some(group) = self.group() else {
            return true;
        };
        loop {
            if !group_alive(group) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn signal(&self, signal: Signal) {
        if let Some(group) = self.group {
            // ESRCH (the group is gone) is the outcome wanted.
            let _ = rustix::process::kill_process_group(group, signal);
        }
    }
}

/// A child's failure for people: `headline`, then what the process can tell: its exit status
/// (or that it still runs), the first line it wrote that was not a frame, its stderr's tail.
pub fn failure_report(
    headline: &str,
    status: Option<ExitStatus>,
    malformed: &crate::Malformed,
    stderr: &StderrTail,
) -> String {
    let mut text = headline.to_owned();
    match status {
        Some(status) => text.push_str(&format!("; the process exited ({status})")),
        None => text.push_str("; the process was still running"),
    }
    if let Some(line) = malformed.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
        text.push_str(&format!("; it wrote a line that is not a frame: {line:?}"));
    }
    let stderr = stderr.text();
    if !stderr.is_empty() {
        text.push_str("\nstderr (last lines):\n");
        text.push_str(&stderr);
    }
    text
}

/// Where the dispose ladder stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ladder {
    /// The group left after stdin closed.
    Exited,
    /// The group left after SIGTERM.
    Terminated,
    /// The group was killed.
    Killed,
}

/// Whether any process of group `group` is alive (zombies, which only their parent can reap,
/// are not).
pub fn group_alive(group: i32) -> bool {
    #[cfg(target_os = "linux")]
    {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return probe_group(group);
        };
        entries.flatten().any(|entry| {
            let is_pid = entry.file_name().to_string_lossy().parse::<u32>().is_ok();
            is_pid
                && std::fs::read_to_string(entry.path().join("stat"))
                    .ok()
                    .and_then(|stat| live_group_of(&stat))
                    == Some(group)
        })
    }
    #[cfg(not(target_os = "linux"))]
    {
        probe_group(group)
    }
}

/// Whether signal 0 reaches group `group` (zombies included).
fn probe_group(group: i32) -> bool {
    Pid::from_raw(group).is_some_and(|pid| rustix::process::test_kill_process_group(pid).is_ok())
}

/// The process group of a `/proc/<pid>/stat` line, unless the process is a zombie or dead.
/// The command name may hold spaces and parentheses, so fields are counted after its last `)`.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn live_group_of(stat: &str) -> Option<i32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    let _parent = fields.next()?;
    let group = fields.next()?.parse().ok()?;
    (!matches!(state, "Z" | "X" | "x")).then_some(group)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(n, v)| ((*n).into(), (*v).into()))
            .collect()
    }

    #[test]
    fn the_environment_is_the_allow_list_without_credentials_plus_what_is_explicit() {
        let parent = os(&[
            ("PATH", "/bin"),
            ("HOME", "/home/me"),
            ("OPENAI_API_KEY", "sk-1"),
            ("GITHUB_TOKEN", "t"),
            ("EDITOR", "vi"),
        ]);
        let passthrough: Vec<OsString> = ["PATH", "HOME", "GITHUB_TOKEN"]
            .iter()
            .map(OsString::from)
            .collect();
        let explicit = os(&[("HOME", "/tmp/child"), ("LINEAGE_API_KEY", "explicit")]);
        let env = child_env(parent, &passthrough, &explicit);
        assert_eq!(
            env,
            os(&[
                ("PATH", "/bin"),
                ("HOME", "/tmp/child"),
                ("LINEAGE_API_KEY", "explicit"),
            ])
        );
    }

    #[test]
    fn credential_shaped_names() {
        for name in [
            "ANTHROPIC_API_KEY",
            "aws_secret_access_key",
            "NPM_TOKEN",
            "PGPASSWORD",
        ] {
            assert!(credential_shaped(OsStr::new(name)), "{name}");
        }
        for name in ["PATH", "HOME", "LANG", "TERM"] {
            assert!(!credential_shaped(OsStr::new(name)), "{name}");
        }
    }

    #[test]
    fn stat_lines_give_the_group_of_live_processes() {
        assert_eq!(live_group_of("42 (sh) S 1 42 42 0 -1"), Some(42));
        assert_eq!(live_group_of("43 (a) b (c)) R 42 40 40 0"), Some(40));
        assert_eq!(live_group_of("44 (sleep) Z 1 42 42"), None);
        assert_eq!(live_group_of("garbage"), None);
    }

    /// Everything a child wrote to stderr before it exited is in the tail once `drained`
    /// returns, however late the draining task runs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_drained_tail_holds_all_a_child_wrote_before_it_exited() {
        for _ in 0..20 {
            let (mut process, _stdout) = AgentProcess::spawn(Launch {
                program: OsStr::new("/bin/sh"),
                args: &["-c".into(), "echo first >&2; echo last >&2; exit 3".into()],
                cwd: Path::new("/"),
                env: Vec::new(),
            })
            .unwrap();
            let status = process.wait_exit(Duration::from_secs(60)).await;
            assert_eq!(status.and_then(|s| s.code()), Some(3));
            process.stderr.drained(Duration::from_secs(60)).await;
            assert_eq!(process.stderr.text(), "first\nlast");
        }
    }

    /// A stderr that never ends (a process left behind keeps the pipe) holds a report only for
    /// the bound.
    #[tokio::test(start_paused = true)]
    async fn draining_a_tail_that_never_ends_stops_at_the_bound() {
        let tail = StderrTail::default();
        tail.push(b"partial");
        let started = tokio::time::Instant::now();
        tail.drained(Duration::from_millis(500)).await;
        assert_eq!(started.elapsed(), Duration::from_millis(500));
        tail.end();
        tail.drained(Duration::from_secs(3600)).await;
        assert_eq!(started.elapsed(), Duration::from_millis(500));
    }

    #[test]
    fn the_stderr_tail_keeps_the_newest_bytes() {
        let tail = StderrTail::default();
        tail.push(&vec![b'a'; STDERR_TAIL_BYTES]);
        tail.push(b"the end");
        let text = tail.text();
        assert_eq!(text.len(), STDERR_TAIL_BYTES);
        assert!(text.ends_with("the end"));
    }
}
