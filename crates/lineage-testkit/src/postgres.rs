//! A private PostgreSQL server for tests that need a real one.
//!
//! [`postgres`] starts one server per test process on first use: `initdb` into a fresh directory
//! under the system's temporary directory, then `postgres` listening on a free port of 127.0.0.1
//! only (its Unix socket in the data directory), trusting local connections of its one role,
//! `lineage`. The tests of a binary share it; each takes a database of its own with
//! [`Postgres::create_database`].
//!
//! The server runs under a small supervisor whose stdin is a pipe from the test process: when
//! the test process ends, however it ends (a SIGKILL included), the pipe closes, and the
//! supervisor stops the server and removes its directory. Through the same pipe a test restarts
//! the server on its port and data directory ([`Postgres::restart`]), as an operator or a crash
//! would. PostgreSQL refuses to run as root, so
//! under root the server and its files belong to `nobody`.
//!
//! The first start in a test process writes the server's version (`SELECT version()`) to stderr,
//! past the test harness's capture, so a run says which PostgreSQL it tested.
//!
//! The binaries are found in `$LINEAGE_PG_BIN` (`scripts/install-postgres-18` prints one for
//! PostgreSQL 18), else the newest `/usr/lib/postgresql/*/bin`
//! (Debian's `postgresql` package), else on `PATH`. When there are none, `scripts/install-postgres`
//! installs the package (as root or with sudo, as on CI's machines); a machine where that fails
//! fails the test that asked, saying what to install: a test that needs the server never passes
//! by skipping.

use std::io::ErrorKind;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The role every database belongs to.
pub const ROLE: &str = "lineage";

/// How long a start waits for the server to accept connections. It bounds a broken start, never
/// a healthy one (which takes about a second).
const READY_DEADLINE: Duration = Duration::from_secs(60);

/// How many free ports a start tries before it gives up (another process may take the port
/// between the probe and the server's bind).
const PORT_TRIES: usize = 5;

/// The running server of this test process.
#[derive(Debug)]
pub struct Postgres {
    bin: PathBuf,
    port: u16,
    dir: PathBuf,
    /// The supervisor's stdin: this process's end of the pipe whose closing stops the server, and
    /// the supervisor's answers (one line per restart), read on a thread of their own.
    lifeline: Mutex<(ChildStdin, Receiver<String>)>,
    _supervisor: Mutex<Child>,
}

/// How [`Postgres::restart`] stops the server before it starts it again (`pg_ctl`'s modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shutdown {
    /// Sessions are ended, and a checkpoint written (SIGINT, `-m fast`).
    Fast,
    /// The server quits at once, with no checkpoint; the next start recovers from the WAL, as
    /// after a crash (SIGQUIT, `-m immediate`).
    Immediate,
}

/// The server of this test process, started on first use.
///
/// # Panics
///
/// When no PostgreSQL server binaries are found, or the server does not start: the test that
/// asked fails with what went wrong.
pub fn postgres() -> &'static Postgres {
    static SERVER: OnceLock<Postgres> = OnceLock::new();
    SERVER.get_or_init(|| {
        let server = Postgres::start().unwrap_or_else(|error| panic!("{error}"));
        server.announce_version();
        server
    })
}

impl Postgres {
    /// Starts a server; `Err` says why it could not.
    pub fn start() -> Result<Postgres, String> {
        let bin = match bin_dir() {
            Ok(bin) => bin,
            Err(_) => {
                install()?;
                bin_dir()?
            }
        };
        let dir = fresh_dir()?;
        let data = dir.join("data");
        let account = Account::for_server()?;
        account.own(&dir)?;
        let mut initdb = initdb_command(&bin, &data);
        // A directory the server's user may enter, whatever this process's is.
        initdb.current_dir(&dir);
        let initdb = account
            .run_as(initdb)
            .output()
            .map_err(|e| format!("cannot run initdb: {e}"))?;
        succeeded("initdb", &initdb)?;
        let mut last = String::new();
        for _ in 0..PORT_TRIES {
            let port = free_port()?;
            match Postgres::launch(&bin, &dir, port, &account) {
                Ok(server) => return Ok(server),
                Err(error) => last = error,
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        Err(last)
    }

    /// Starts the supervised server on `port` and waits until it accepts connections.
    fn launch(bin: &Path, dir: &Path, port: u16, account: &Account) -> Result<Postgres, String> {
        // The supervisor: the server in the background, then commands read from stdin until its
        // end (the test process is gone, or dropped us), then a fast shutdown and the directory
        // removed. A command `<signal> <seconds>` restarts the server: stopped by `<signal>`
        // (INT is a fast shutdown, QUIT an immediate one), down for `<seconds>`, started again on
        // the same port and data directory; `restarted` on stdout says it was started again.
        // The directory's removal is left to the next start when the server fails early.
        const SUPERVISOR: &str = r#"
: >"$2/server.log"
serve() {
    "$1/postgres" -D "$2/data" -p "$3" -c listen_addresses=127.0.0.1 -c unix_socket_directories="$2/data" >>"$2/server.log" 2>&1 &
    server=$!
}
serve "$1" "$2" "$3"
while read -r signal seconds; do
    kill -"$signal" "$server" 2>/dev/null
    wait "$server"
    sleep "$seconds"
    serve "$1" "$2" "$3"
    echo restarted
done
kill -INT "$server" 2>/dev/null
wait "$server"
rm -rf "$2"
"#;
        let mut command = Command::new("sh");
        command
            .args(["-c", SUPERVISOR, "lineage-postgres"])
            .arg(bin)
            .arg(dir)
            .arg(port.to_string())
            .current_dir(dir);
        let mut supervisor = account
            .run_as(command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start the PostgreSQL supervisor: {e}"))?;
        let lifeline = supervisor
            .stdin
            .take()
            .ok_or("the supervisor's stdin was not piped")?;
        let said = supervisor
            .stdout
            .take()
            .ok_or("the supervisor's stdout was not piped")?;
        let (tx, answers) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(said).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        if let Err(error) = wait_ready(bin, dir, port, &mut supervisor) {
            drop(lifeline);
            let _ = supervisor.wait();
            return Err(error);
        }
        Ok(Postgres {
            bin: bin.to_path_buf(),
            port,
            dir: dir.to_path_buf(),
            lifeline: Mutex::new((lifeline, answers)),
            _supervisor: Mutex::new(supervisor),
        })
    }

    /// Stops the server as `how` says, leaves it down for `down`, and starts it again on the
    /// same port and data directory; returns once it accepts connections. Every client's
    /// connection is broken by it (a fast shutdown ends sessions; an immediate one is a crash,
    /// recovered from the WAL at the next start).
    ///
    /// # Panics
    ///
    /// When the server does not stop and start again within a minute past `down`, or does not
    /// accept connections after: the test that asked fails with the server's log.
    pub fn restart(&self, how: Shutdown, down: Duration) {
        use std::io::Write;
        let signal = match how {
            Shutdown::Fast => "INT",
            Shutdown::Immediate => "QUIT",
        };
        let mut lifeline = self.lifeline.lock().unwrap_or_else(|p| p.into_inner());
        let (stdin, answers) = &mut *lifeline;
        writeln!(stdin, "{signal} {:.3}", down.as_secs_f64())
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("the PostgreSQL supervisor takes no command: {e}"));
        let log = || std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        match answers.recv_timeout(down + READY_DEADLINE) {
            Ok(_) => {}
            Err(RecvTimeoutError::Timeout) => panic!(
                "PostgreSQL was not restarted ({how:?}) within {:?}:\n{}",
                down + READY_DEADLINE,
                log()
            ),
            Err(RecvTimeoutError::Disconnected) => {
                panic!(
                    "the PostgreSQL supervisor ended during a restart:\n{}",
                    log()
                )
            }
        }
        let mut supervisor = self._supervisor.lock().unwrap_or_else(|p| p.into_inner());
        wait_ready(&self.bin, &self.dir, self.port, &mut supervisor)
            .unwrap_or_else(|error| panic!("after a restart ({how:?}): {error}"));
    }

    /// Writes the server's `SELECT version()` to stderr, past the test harness's capture.
    fn announce_version(&self) {
        use std::io::Write;
        let version = self.psql(&self.url("postgres"), "SELECT version()");
        let _ = writeln!(
            std::io::stderr(),
            "lineage-testkit: {version} (binaries in {})",
            self.bin.display()
        );
    }

    /// The port it listens on (127.0.0.1 only).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory that holds its data and log; removed when the server stops.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The connection URL of `database`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://{ROLE}@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates a database no other test uses and returns its URL.
    ///
    /// # Panics
    ///
    /// When `createdb` fails.
    pub fn create_database(&self) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!("test_{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let created = Command::new(self.bin.join("createdb"))
            .args([
                "-h",
                "127.0.0.1",
                "-U",
                ROLE,
                "-p",
                &self.port.to_string(),
                &name,
            ])
            .output()
            .unwrap_or_else(|e| panic!("cannot run createdb: {e}"));
        succeeded("createdb", &created).unwrap_or_else(|e| panic!("{e}"));
        self.url(&name)
    }

    /// Runs `sql` with `psql` against the database at `url` and returns what it printed
    /// (unaligned, tuples only).
    ///
    /// # Panics
    ///
    /// When `psql` fails (an SQL error included).
    pub fn psql(&self, url: &str, sql: &str) -> String {
        let output = Command::new(self.bin.join("psql"))
            .args([
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                url,
                "-c",
                sql,
            ])
            .output()
            .unwrap_or_else(|e| panic!("cannot run psql: {e}"));
        succeeded("psql", &output).unwrap_or_else(|e| panic!("{e}"));
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }
}

/// A `psql` left running on one connection, so a test can hold a lock or a transaction open
/// while the code under test meets it. Dropping it ends `psql` (and its transaction).
pub struct PsqlSession {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
}

/// How long [`PsqlSession::run`] waits for `psql`'s answer: it bounds a broken test, never a
/// healthy one.
const PSQL_DEADLINE: Duration = Duration::from_secs(30);

impl Postgres {
    /// Starts `psql` on the database at `url` (a statement that fails ends it).
    ///
    /// # Panics
    ///
    /// When `psql` cannot start.
    pub fn psql_session(&self, url: &str) -> PsqlSession {
        let mut child = Command::new(self.bin.join("psql"))
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", url])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run psql: {e}"));
        let stdout = child.stdout.take().expect("psql's stdout is piped");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let stdin = child.stdin.take();
        PsqlSession {
            child,
            stdin,
            lines,
        }
    }
}

impl PsqlSession {
    /// Runs `sql` and waits until `psql` has answered it (it then prints a marker line).
    ///
    /// # Panics
    ///
    /// When `psql` ends or does not answer within 30 s (a failed statement ends it).
    pub fn run(&mut self, sql: &str) {
        use std::io::Write;
        const DONE: &str = "lineage-testkit: done";
        let stdin = self.stdin.as_mut().expect("psql's stdin is open");
        writeln!(stdin, "{sql}\n\\echo '{DONE}'")
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("cannot write to psql: {e}"));
        let deadline = Instant::now() + PSQL_DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line == DONE => return,
                Ok(_) => {}
                Err(e) => panic!("psql did not answer `{sql}`: {e}"),
            }
        }
    }
}

impl Drop for PsqlSession {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until the server on `port` accepts connections; `Err` (with the server's log) when the
/// supervisor ended, the port was taken, or [`READY_DEADLINE`] passed first.
fn wait_ready(bin: &Path, dir: &Path, port: u16, supervisor: &mut Child) -> Result<(), String> {
    let deadline = Instant::now() + READY_DEADLINE;
    loop {
        let ready = Command::new(bin.join("pg_isready"))
            .args(["-q", "-h", "127.0.0.1", "-U", ROLE, "-p", &port.to_string()])
            .status()
            .map_err(|e| format!("cannot run pg_isready: {e}"))?;
        if ready.success() {
            return Ok(());
        }
        let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
        if let Ok(Some(status)) = supervisor.try_wait() {
            return Err(format!(
                "PostgreSQL stopped ({status}) on port {port}:\n{log}"
            ));
        }
        if Instant::now() >= deadline || log.contains("could not bind") {
            return Err(format!("PostgreSQL did not start on port {port}:\n{log}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn initdb_command(bin: &Path, data: &Path) -> Command {
    let mut command = Command::new(bin.join("initdb"));
    command
        .args([
            "-U",
            ROLE,
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
            "-D",
        ])
        .arg(data);
    command
}

fn succeeded(what: &str, output: &Output) -> Result<(), String> {
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{what} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    ))
}

/// Runs `scripts/install-postgres`, which installs Debian's package (as root, or with sudo).
fn install() -> Result<(), String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/install-postgres");
    let output = Command::new(&script)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    succeeded(&script.display().to_string(), &output)
}

/// The directory of the server binaries.
fn bin_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("LINEAGE_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").is_file().then_some((version, bin))
        })
        .max();
    if let Some((_, bin)) = newest {
        return Ok(bin);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .find(|dir| dir.join("postgres").is_file() && dir.join("initdb").is_file());
    on_path.ok_or_else(|| {
        "no PostgreSQL server binaries (postgres, initdb): install Debian's `postgresql` \
         package, or set LINEAGE_PG_BIN to their directory"
            .to_owned()
    })
}

/// A new, empty directory of this process under the system's temporary directory.
fn fresh_dir() -> Result<PathBuf, String> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let base = std::env::temp_dir();
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("lineage-postgres-{}-{n}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(error) if error.kind() == ErrorKind::AlreadyExists => continue,
            Err(error) => return Err(format!("cannot create {}: {error}", dir.display())),
        }
    }
}

/// A PostgreSQL URL of 127.0.0.1 on a port nothing listens on, with a user and a password
/// (`hunter2`) that whatever reports the failed connection must not show.
pub fn unanswered_url() -> String {
    let port = free_port().expect("a free port");
    format!("postgres://ann:hunter2@127.0.0.1:{port}/nowhere")
}

/// A free TCP port of 127.0.0.1, as the kernel hands it out now.
fn free_port() -> Result<u16, String> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|e| format!("cannot find a free port: {e}"))
}

/// Whom the server runs as: this process's user, or `nobody` when that is root.
struct Account {
    /// `(uid, gid)` to switch to, when this process is root.
    switch: Option<(u32, u32)>,
}

impl Account {
    fn for_server() -> Result<Account, String> {
        if !running_as_root() {
            return Ok(Account { switch: None });
        }
        let id = |flag: &str| -> Result<u32, String> {
            let output = Command::new("id")
                .args([flag, "nobody"])
                .output()
                .map_err(|e| format!("cannot run id: {e}"))?;
            String::from_utf8_lossy(&output.stdout)
                .trim()
                .parse()
                .map_err(|_| "there is no user `nobody` to run PostgreSQL as".to_owned())
        };
        Ok(Account {
            switch: Some((id("-u")?, id("-g")?)),
        })
    }

    /// Gives `dir` to the server's user.
    fn own(&self, dir: &Path) -> Result<(), String> {
        match self.switch {
            Some((uid, gid)) => std::os::unix::fs::chown(dir, Some(uid), Some(gid))
                .map_err(|e| format!("cannot give {} to nobody: {e}", dir.display())),
            None => Ok(()),
        }
    }

    /// `command` (its program, arguments, environment and directory; not its stdio), run as the
    /// server's user.
    fn run_as(&self, command: Command) -> Command {
        let Some((uid, gid)) = self.switch else {
            return command;
        };
        let mut switched = Command::new("setpriv");
        switched
            .arg(format!("--reuid={uid}"))
            .arg(format!("--regid={gid}"))
            .arg("--clear-groups")
            .arg(command.get_program())
            .args(command.get_args());
        for (name, value) in command.get_envs() {
            match value {
                Some(value) => switched.env(name, value),
                None => switched.env_remove(name),
            };
        }
        if let Some(dir) = command.get_current_dir() {
            switched.current_dir(dir);
        }
        switched
    }
}

/// Whether this process runs as root (from `/proc`, without unsafe code).
fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A restart, fast or immediate, keeps the port and the data: what was committed before is
    /// there after, and the server answers again.
    #[test]
    fn a_restarted_server_keeps_its_port_and_its_data() {
        let server = postgres();
        let url = server.create_database();
        server.psql(
            &url,
            "CREATE TABLE kept (n int); INSERT INTO kept VALUES (1)",
        );
        server.restart(Shutdown::Fast, Duration::ZERO);
        server.psql(&url, "INSERT INTO kept VALUES (2)");
        server.restart(Shutdown::Immediate, Duration::from_millis(200));
        assert_eq!(server.psql(&url, "SELECT sum(n) FROM kept"), "3");
    }
}
