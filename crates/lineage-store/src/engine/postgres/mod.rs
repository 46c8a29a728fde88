//! The PostgreSQL engine: a store that many hosts share, in six tables of one database.
//!
//! Four tables mirror redb's (see `layout`): `lineage_meta` (magic, format version, store id),
//! `lineage_sessions` (the postcard row, with its `next_seq` beside it so a write can be made
//! conditional on it), `lineage_blocks` (the same block values, keyed by session and first seq)
//! and `lineage_children`. Two coordinate the hosts: `lineage_leases` (each session's holder,
//! fencing token and expiry) and `lineage_mailbox` (messages for sessions another host keeps). Values are stored uncompressed (`STORAGE EXTERNAL`): blocks are
//! written once and read whole, and compressing them would cost every load.
//!
//! The store is synchronous and hosts call it from inside tokio runtimes, so the engine runs
//! `tokio-postgres` on a runtime of its own, on its own thread, and waits for each answer on a
//! plain channel (the synchronous `postgres` crate would start a runtime inside the caller's,
//! which tokio refuses).
//!
//! A read view is a `REPEATABLE READ READ ONLY` transaction on a pooled connection, so a load sees
//! one commit whole. A round is one transaction on the writer's connection: each session's write
//! is one statement that moves the session's row only if its `next_seq` is the one the writer
//! expects and inserts the blocks only if the row moved; a write that finds another end is a
//! conflict, and the rest of the round commits without it. A statement the server refuses for
//! one session alone (a constraint, a value out of range) rolls the round back, and it is tried
//! again without that session.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use lineage_log::SessionId;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config, NoTls, Row, Statement};
use uuid::Uuid;

use crate::engine::{
    Acquired, Blocks, Bytes, CommitError, Committed, Coordination, Deletion, Engine, LeaseState,
    Mail, MailWake, Removal, Removed, SessionWrite, View, Written, block_count, redact,
    round_in_store,
};
use crate::error::{EngineError, EngineErrorKind};
use crate::layout::{BlockFormat, MAGIC, META_FORMAT, META_MAGIC, META_STORE_ID, SessionRecord};
use crate::store::{PostgresTimeouts, STORE_FORMAT_VERSION};
use crate::{Result, StoreError};

mod notify;

const CREATE: &str = "
CREATE TABLE lineage_meta (name text PRIMARY KEY, value bytea NOT NULL);
CREATE TABLE lineage_sessions (id uuid PRIMARY KEY, next_seq bigint NOT NULL, row bytea NOT NULL);
CREATE TABLE lineage_blocks (
    session uuid NOT NULL,
    first_seq bigint NOT NULL,
    value bytea NOT NULL,
    PRIMARY KEY (session, first_seq)
);
CREATE TABLE lineage_children (parent uuid NOT NULL, child uuid NOT NULL, PRIMARY KEY (parent, child));
CREATE INDEX lineage_children_by_child ON lineage_children (child);
CREATE TABLE lineage_mailbox (
    id uuid PRIMARY KEY,
    posted bigserial NOT NULL,
    recipient uuid NOT NULL,
    sender uuid NOT NULL,
    body bytea NOT NULL,
    claimed_by uuid
);
CREATE INDEX lineage_mailbox_by_recipient ON lineage_mailbox (recipient, posted);
CREATE TABLE lineage_leases (
    session uuid PRIMARY KEY,
    holder uuid,
    expires_at timestamptz,
    fence bigint NOT NULL
);
ALTER TABLE lineage_sessions ALTER COLUMN row SET STORAGE EXTERNAL;
ALTER TABLE lineage_blocks ALTER COLUMN value SET STORAGE EXTERNAL;
";

/// The deadline of an upgrade, one transaction that rewrites every session.
const UPGRADE_CALL: Duration = Duration::from_secs(3600);

/// How many blocks a read asks for at once (a few MiB): a scan holds about this much.
const PAGE_BLOCKS: i64 = 256;

/// The statements every connection prepares once.
struct Statements {
    row: Statement,
    rows: Statement,
    blocks: Statement,
    block_start: Statement,
    children: Statement,
    child_index: Statement,
    descendants: Statement,
    next_seq: Statement,
    create_session: Statement,
    extend_session: Statement,
    remove_row: Statement,
    remove_index: Statement,
    remove_blocks: Statement,
    write_refusal: Statement,
    lease: Statement,
    acquire: Statement,
    renew: Statement,
    release: Statement,
    post: Statement,
    mail_for: Statement,
    take_mail: Statement,
    claim_mail: Statement,
    withdraw_mail: Statement,
    remove_mail: Statement,
}

const ROW: &str = "SELECT row FROM lineage_sessions WHERE id = $1";
const ROWS: &str = "SELECT id, row FROM lineage_sessions ORDER BY id";
const BLOCKS: &str = "SELECT first_seq, value FROM lineage_blocks \
     WHERE session = $1 AND first_seq >= $2 ORDER BY first_seq LIMIT $3";
const BLOCK_START: &str = "SELECT first_seq FROM lineage_blocks \
     WHERE session = $1 AND first_seq <= $2 ORDER BY first_seq DESC LIMIT 1";
const CHILDREN: &str = "SELECT child FROM lineage_children WHERE parent = $1 ORDER BY child";
const CHILD_INDEX: &str = "SELECT parent, child FROM lineage_children ORDER BY parent, child";
/// Breadth first, as the index is walked on redb: by depth, then by the path of ids from the
/// root (which orders each level by its parents' order, then by id). The path also stops a
/// damaged index's cycle.
const DESCENDANTS: &str = "
WITH RECURSIVE tree (child, path) AS (
    SELECT child, ARRAY[child] FROM lineage_children WHERE parent = $1
    UNION ALL
    SELECT c.child, t.path || c.child FROM lineage_children c JOIN tree t ON c.parent = t.child
    WHERE c.child <> ALL (t.path) AND c.child <> $1
)
SELECT child FROM tree ORDER BY cardinality(path), path";
const NEXT_SEQ: &str = "SELECT next_seq FROM lineage_sessions WHERE id = $1";
/// Whether a write may apply under the session's lease (locked for the statement, so a takeover
/// waits for the write's transaction and then sees it): with a token (`$8`), only if the lease is
/// still this holder's (`$7`) with that token; without one, only if no other holder's is live.
const LEASED: &str = "
lease AS (
    SELECT holder, fence, expires_at > now() AS live FROM lineage_leases WHERE session = $1 FOR SHARE
), allowed AS (
    SELECT CASE WHEN $8::bigint IS NULL
        THEN NOT EXISTS (SELECT 1 FROM lease WHERE live AND holder <> $7::uuid)
        ELSE EXISTS (SELECT 1 FROM lease WHERE holder = $7::uuid AND fence = $8::bigint)
    END AS ok
)";
/// A new session: its row only if none is stored and its lease allows, then its index entry and
/// blocks only if the row was made. Affects as many rows as blocks, or none.
fn create_session() -> String {
    format!(
        "WITH {LEASED}, made AS (
    INSERT INTO lineage_sessions (id, next_seq, row) SELECT $1, $3, $4 FROM allowed WHERE ok
    ON CONFLICT (id) DO NOTHING RETURNING id
), linked AS (
    INSERT INTO lineage_children (parent, child) SELECT $2, id FROM made WHERE $2::uuid IS NOT NULL
    ON CONFLICT DO NOTHING
)
INSERT INTO lineage_blocks (session, first_seq, value)
SELECT made.id, b.first_seq, b.value FROM made, unnest($5::bigint[], $6::bytea[]) AS b (first_seq, value)"
    )
}
/// A stored session: its row moves only from the expected end and as its lease allows, and the
/// blocks follow only if it moved, replacing the stored blocks `$9` names (a block of the same key
/// overwrites one, the others are removed). Affects as many rows as blocks, or none.
fn extend_session() -> String {
    format!(
        "WITH {LEASED}, moved AS (
    UPDATE lineage_sessions SET next_seq = $3, row = $4
    WHERE id = $1 AND next_seq = $2 AND (SELECT ok FROM allowed)
    RETURNING id
), gone AS (
    DELETE FROM lineage_blocks WHERE session = $1 AND first_seq = ANY($9::bigint[])
    AND first_seq <> ALL($5::bigint[]) AND EXISTS (SELECT 1 FROM moved)
)
INSERT INTO lineage_blocks (session, first_seq, value)
SELECT moved.id, b.first_seq, b.value FROM moved, unnest($5::bigint[], $6::bytea[]) AS b (first_seq, value)
ON CONFLICT (session, first_seq) DO UPDATE SET value = EXCLUDED.value"
    )
}
/// Why a write applied to nothing: where the stored log ends, and the session's lease.
const WRITE_REFUSAL: &str = "
SELECT (SELECT next_seq FROM lineage_sessions WHERE id = $1), l.holder, l.fence,
       GREATEST(COALESCE(EXTRACT(EPOCH FROM l.expires_at - now()) * 1000, 0), 0)::bigint
FROM (SELECT 1) AS one LEFT JOIN lineage_leases l ON l.session = $1";
/// A session's lease: holder, token, and the milliseconds it has left (locked until the end of
/// the transaction it is read in, so a deletion orders with a takeover).
const LEASE: &str = "
SELECT holder, fence, GREATEST(COALESCE(EXTRACT(EPOCH FROM expires_at - now()) * 1000, 0), 0)::bigint
FROM lineage_leases WHERE session = $1 FOR SHARE";
/// Takes a lease (`$1` session, `$2` holder, `$3` milliseconds): free, released or expired, or
/// already this holder's. Every acquisition starts a tenure and raises the token, even over this
/// holder's own live lease (one whose release failed): a tenure's writes are told from an earlier
/// one's by the token alone. Renewals (`RENEW`) keep it.
const ACQUIRE: &str = "
INSERT INTO lineage_leases AS l (session, holder, expires_at, fence)
VALUES ($1, $2, now() + $3::float8 * interval '1 millisecond', 1)
ON CONFLICT (session) DO UPDATE SET
    fence = l.fence + 1,
    holder = $2,
    expires_at = now() + $3::float8 * interval '1 millisecond'
WHERE l.holder IS NULL OR l.holder = $2 OR l.expires_at <= now()
RETURNING fence";
/// Extends the leases (`$3` sessions with `$4` tokens) still held by `$1` for `$2` milliseconds.
/// A lease that ran out and was not taken over is still its holder's (a takeover would have
/// changed the holder and raised the token), so a late renewal keeps it.
const RENEW: &str = "
UPDATE lineage_leases AS l SET expires_at = now() + $2::float8 * interval '1 millisecond'
FROM unnest($3::uuid[], $4::bigint[]) AS h (session, fence)
WHERE l.session = h.session AND l.fence = h.fence AND l.holder = $1
RETURNING l.session";
const POST: &str = "INSERT INTO lineage_mailbox (id, recipient, sender, body) VALUES ($1, $2, $3, $4) \
     ON CONFLICT (id) DO NOTHING";
const MAIL_FOR: &str = "SELECT id, recipient, sender, body FROM lineage_mailbox \
     WHERE recipient = ANY($1) ORDER BY posted";
const TAKE_MAIL: &str = "DELETE FROM lineage_mailbox WHERE id = ANY($1) RETURNING id";
/// Claims mail (`$1`) for a holder (`$2`) about to deliver it, in its tenure of the recipient's
/// lease with the fencing token `$3`: only while that lease is live. Any earlier claim is then
/// void, as its claimant no longer holds the lease (at most one host holds it).
const CLAIM_MAIL: &str = "
UPDATE lineage_mailbox AS m SET claimed_by = $2
WHERE m.id = $1 AND EXISTS (
    SELECT 1 FROM lineage_leases l
    WHERE l.session = m.recipient AND l.holder = $2 AND l.fence = $3 AND l.expires_at > now())
RETURNING m.id";
/// Takes mail back if no host has claimed it for delivery.
const WITHDRAW_MAIL: &str =
    "DELETE FROM lineage_mailbox WHERE id = $1 AND claimed_by IS NULL RETURNING id";
const REMOVE_MAIL: &str = "DELETE FROM lineage_mailbox WHERE recipient = $1";
/// Gives a lease up, keeping its token.
const RELEASE: &str = "
UPDATE lineage_leases SET holder = NULL, expires_at = NULL
WHERE session = $1 AND holder = $2 AND fence = $3";
const REMOVE_ROW: &str = "DELETE FROM lineage_sessions WHERE id = $1 RETURNING row";
const REMOVE_INDEX: &str = "DELETE FROM lineage_children WHERE parent = $1 OR child = $1";
const REMOVE_BLOCKS: &str = "DELETE FROM lineage_blocks WHERE session = $1 RETURNING substring(value FROM 1 FOR 4), length(value)";

/// A connection with its statements prepared.
struct Conn {
    client: Client,
    st: Statements,
    /// The task that drives the connection's socket.
    task: tokio::task::AbortHandle,
    /// Set when a call on it passed its deadline: it is never used again.
    discarded: AtomicBool,
}

/// A connection a call runs on: one that a call past its deadline leaves is dropped, since its
/// server may answer the abandoned request later, or never.
trait Connection {
    fn discard(&self);
    fn discarded(&self) -> bool;
}

impl Connection for Conn {
    fn discard(&self) {
        self.discarded.store(true, Ordering::Release);
        // Closing the socket ends the server's side too, and with it any transaction left open.
        self.task.abort();
    }

    fn discarded(&self) -> bool {
        self.discarded.load(Ordering::Acquire)
    }
}

/// The first connection of an open or an upgrade: a call past its deadline fails the open, and
/// the engine's runtime stops with the connection's task.
impl Connection for Client {
    fn discard(&self) {}

    fn discarded(&self) -> bool {
        false
    }
}

impl Conn {
    /// Whether it may serve a call: not discarded, and still connected.
    fn usable(&self) -> bool {
        !self.discarded() && !self.client.is_closed()
    }
}

/// How long `Runtime::run` waits past a call's deadline for the runtime to report it (a runtime
/// thread kept busy delays its timers): the caller's own bound, never reached while the runtime
/// runs.
const REPORT_GRACE: Duration = Duration::from_secs(1);

/// The engine's own runtime, on its own thread, which stops when the engine is dropped.
struct Runtime {
    handle: tokio::runtime::Handle,
    stop: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    /// The deadline of each call.
    call: Duration,
}

impl Runtime {
    fn start(call: Duration) -> std::result::Result<Runtime, EngineError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(EngineError::io)?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("lineage-postgres".into())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })
            .map_err(EngineError::io)?;
        Ok(Runtime {
            handle,
            stop: Mutex::new(Some(stop)),
            call,
        })
    }

    /// Runs `work` (the `operation`) on the engine's runtime and waits for it on this thread,
    /// which may be a thread of another runtime, until the call's deadline: past it `work` is
    /// dropped unfinished and the call fails with [`EngineErrorKind::Timeout`].
    fn run<T: Send + 'static>(
        &self,
        operation: &'static str,
        work: impl Future<Output = T> + Send + 'static,
    ) -> std::result::Result<T, EngineError> {
        let (tx, rx) = mpsc::sync_channel(1);
        let call = self.call;
        self.handle.spawn(async move {
            let _ = tx.send(tokio::time::timeout(call, work).await);
        });
        match rx.recv_timeout(call + REPORT_GRACE) {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) | Err(mpsc::RecvTimeoutError::Timeout) => {
                Err(timed_out(operation, call, "StoreOptions::postgres.call"))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(EngineError::new(
                EngineErrorKind::Other,
                "the PostgreSQL engine stopped",
            )),
        }
    }
}

/// The failure of a wait on the server past its `bound` (the option that sets it).
fn timed_out(operation: &str, bound: Duration, option: &str) -> EngineError {
    EngineError::new(
        EngineErrorKind::Timeout,
        format!(
            "PostgreSQL: {operation} got no answer within {bound:?} ({option}); the connection is dropped"
        ),
    )
}

/// The connection settings of `url` with the bounds of `timeouts` (see [`PostgresTimeouts`]):
/// the URL's own server settings (its `options`) win over them.
fn config_of(url: &str, timeouts: &PostgresTimeouts) -> Result<Config> {
    timeouts.check()?;
    let mut config: Config = url.parse().map_err(|e| StoreError::NotAStore {
        path: redact(url).into(),
        reason: format!("its URL does not parse as a PostgreSQL connection URL: {e}"),
    })?;
    const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
    const KEEPALIVE_PROBES: u32 = 3;
    config
        .connect_timeout(timeouts.connect)
        .keepalives(true)
        .keepalives_idle(timeouts.keepalive_idle)
        .keepalives_interval(KEEPALIVE_INTERVAL)
        .keepalives_retries(KEEPALIVE_PROBES)
        .tcp_user_timeout(timeouts.keepalive_idle + KEEPALIVE_INTERVAL * KEEPALIVE_PROBES);
    let mut options = config.get_options().unwrap_or_default().to_owned();
    let settings = [
        ("statement_timeout", timeouts.statement),
        ("lock_timeout", timeouts.lock),
        (
            "idle_in_transaction_session_timeout",
            timeouts.idle_in_transaction,
        ),
    ];
    for (name, bound) in settings {
        if bound.is_zero() || options.contains(name) {
            continue;
        }
        if !options.is_empty() {
            options.push(' ');
        }
        // Whole milliseconds, at least one (zero would turn the bound off).
        let ms = bound.as_millis().max(1);
        options.push_str(&format!("-c {name}={ms}"));
    }
    config.options(options);
    Ok(config)
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = stop.send(());
        }
    }
}

/// The kind of failure an SQLSTATE says, in the store's terms.
fn kind_of(code: &SqlState) -> EngineErrorKind {
    match code.code() {
        "3D000" => EngineErrorKind::DatabaseMissing,
        "42501" => EngineErrorKind::PermissionDenied,
        class if class.starts_with("28") => EngineErrorKind::AuthenticationFailed,
        _ => EngineErrorKind::Other,
    }
}

/// What to do about a failure of `kind`, said after the server's own words.
fn remedy(kind: EngineErrorKind) -> &'static str {
    match kind {
        EngineErrorKind::DatabaseMissing => {
            "; the database does not exist: create it (createdb) or correct the URL"
        }
        EngineErrorKind::AuthenticationFailed => {
            "; the server refused the login: check the user and password in the URL, and the \
             server's access rules (pg_hba.conf)"
        }
        EngineErrorKind::PermissionDenied => {
            "; the role lacks a right the store needs: CREATE on the schema to create the tables \
             in a new database, then SELECT, INSERT, UPDATE and DELETE on them"
        }
        _ => "",
    }
}

/// The engine's error for a failure of the server or the connection.
fn pg_error(error: tokio_postgres::Error) -> EngineError {
    match error.as_db_error() {
        Some(db) => {
            let kind = kind_of(db.code());
            let mut message = format!(
                "PostgreSQL: {} (SQLSTATE {})",
                db.message(),
                db.code().code()
            );
            if let Some(detail) = db.detail() {
                message.push_str(": ");
                message.push_str(detail);
            }
            message.push_str(remedy(kind));
            EngineError::new(kind, message)
        }
        None if error.is_closed() => EngineError::new(
            EngineErrorKind::Io,
            "PostgreSQL: the connection to the server is closed",
        ),
        None => EngineError::new(EngineErrorKind::Io, format!("PostgreSQL: {error}")),
    }
}

/// The engine's error for a connection that could not be made to the server `shown`.
fn connect_error(shown: &str, error: tokio_postgres::Error) -> EngineError {
    if error.as_db_error().is_some() {
        let error = pg_error(error);
        return EngineError::new(error.kind(), format!("cannot connect to {shown}: {error}"));
    }
    // The server asked for a password the URL does not give (the client's own refusal).
    if error.to_string().contains("password missing") {
        return EngineError::new(
            EngineErrorKind::AuthenticationFailed,
            format!(
                "cannot connect to {shown}: the server asks for a password and the URL gives none"
            ),
        );
    }
    EngineError::new(
        EngineErrorKind::Unreachable,
        format!("cannot connect to {shown}: the PostgreSQL server cannot be reached: {error}"),
    )
}

/// Whether the server refused a statement for its own data alone (a constraint, a value out of
/// range, a limit), so the rest of a round may commit without it.
fn refused_for_its_data(error: &tokio_postgres::Error) -> bool {
    error.as_db_error().is_some_and(|db| {
        let class = &db.code().code()[..2];
        matches!(class, "22" | "23" | "54") && *db.code() != SqlState::T_R_SERIALIZATION_FAILURE
    })
}

fn seq_param(seq: u64) -> std::result::Result<i64, EngineError> {
    i64::try_from(seq).map_err(|_| {
        EngineError::new(
            EngineErrorKind::Other,
            format!("seq {seq} is past the largest PostgreSQL bigint"),
        )
    })
}

/// Runs `$body` (an expression awaiting on `$c`, a clone of the connection `$conn`; the
/// `$operation`) on the engine's runtime: the outer result is the engine's, the inner one the
/// statement's.
macro_rules! on {
    ($shared:expr, $conn:expr, $operation:expr, |$c:ident| $body:expr) => {{
        let $c = Arc::clone($conn);
        $shared.run_on(&**$conn, $operation, async move { $body })
    }};
}

struct Shared {
    runtime: Runtime,
    /// The connection settings, bounds included.
    config: Config,
    /// How long making a connection may take.
    connect_bound: Duration,
    /// The URL as messages show it (without its password).
    shown: String,
    /// Idle connections of finished read views.
    pool: Arc<Mutex<Vec<Arc<Conn>>>>,
    /// The writer thread's connection; replaced when it breaks.
    writer: Mutex<Option<Arc<Conn>>>,
}

/// A new connection: its client, and the task that drives its socket.
type Connected = (Client, tokio::task::AbortHandle);

impl Shared {
    /// The engine's runtime for the database at `url`, and a first connection to it.
    fn start(url: &str, timeouts: &PostgresTimeouts) -> Result<(Shared, Connected)> {
        let shared = Shared {
            runtime: Runtime::start(timeouts.call).map_err(StoreError::Storage)?,
            config: config_of(url, timeouts)?,
            connect_bound: timeouts.connect,
            shown: redact(url),
            pool: Arc::default(),
            writer: Mutex::new(None),
        };
        let connected = shared.connect_bare().map_err(StoreError::Storage)?;
        Ok((shared, connected))
    }

    /// Runs `work` (the `operation`) on `conn` within the call's deadline; a call past it
    /// discards the connection, and a discarded connection serves no call.
    fn run_on<C: Connection + ?Sized, T: Send + 'static>(
        &self,
        conn: &C,
        operation: &'static str,
        work: impl Future<Output = T> + Send + 'static,
    ) -> std::result::Result<T, EngineError> {
        if conn.discarded() {
            return Err(EngineError::new(
                EngineErrorKind::Io,
                format!(
                    "PostgreSQL: {operation}: the connection was dropped after a call past its deadline"
                ),
            ));
        }
        let answer = self.runtime.run(operation, work);
        if answer
            .as_ref()
            .is_err_and(|e| e.kind() == EngineErrorKind::Timeout)
        {
            conn.discard();
        }
        answer
    }

    /// A new connection with its statements prepared.
    fn connect(&self) -> std::result::Result<Arc<Conn>, EngineError> {
        let connected = self.connect_bare()?;
        self.prepare(connected)
    }

    /// Makes a connection whose messages the caller polls (the client answers only while its
    /// connection is polled), within the connect bound: start-up and authentication included,
    /// which a server that accepts and never answers would otherwise hold for ever.
    fn connect_raw(
        &self,
    ) -> impl Future<
        Output = std::result::Result<
            (
                Client,
                tokio_postgres::Connection<
                    tokio_postgres::Socket,
                    tokio_postgres::tls::NoTlsStream,
                >,
            ),
            EngineError,
        >,
    >
    + Send
    + 'static
    + use<> {
        let (config, bound, shown) = (self.config.clone(), self.connect_bound, self.shown.clone());
        async move {
            match tokio::time::timeout(bound, config.connect(NoTls)).await {
                Ok(connected) => connected.map_err(|e| connect_error(&shown, e)),
                Err(_) => Err(timed_out(
                    &format!("connecting to {shown}"),
                    bound,
                    "StoreOptions::postgres.connect",
                )),
            }
        }
    }

    fn connect_bare(&self) -> std::result::Result<Connected, EngineError> {
        let connecting = self.connect_raw();
        let handle = self.runtime.handle.clone();
        self.runtime.run("connecting", async move {
            let (client, connection) = connecting.await?;
            let task = handle.spawn(async move {
                if let Err(error) = connection.await {
                    tracing::debug!(%error, "a PostgreSQL connection ended");
                }
            });
            Ok((client, task.abort_handle()))
        })?
    }

    /// Prepares the statements (the tables must exist).
    fn prepare(&self, (client, task): Connected) -> std::result::Result<Arc<Conn>, EngineError> {
        let (create_session, extend_session) = (create_session(), extend_session());
        let driver = task.clone();
        let prepared = self.runtime.run("preparing statements", async move {
            // Sent together: one round trip's wait, not one per statement.
            let prepared = tokio::join!(
                client.prepare(ROW),
                client.prepare(ROWS),
                client.prepare(BLOCKS),
                client.prepare(BLOCK_START),
                client.prepare(CHILDREN),
                client.prepare(CHILD_INDEX),
                client.prepare(DESCENDANTS),
                client.prepare(NEXT_SEQ),
                client.prepare(&create_session),
                client.prepare(&extend_session),
                client.prepare(REMOVE_ROW),
                client.prepare(REMOVE_INDEX),
                client.prepare(REMOVE_BLOCKS),
                client.prepare(WRITE_REFUSAL),
                client.prepare(LEASE),
                client.prepare(ACQUIRE),
                client.prepare(RENEW),
                client.prepare(RELEASE),
                client.prepare(POST),
                client.prepare(MAIL_FOR),
                client.prepare(TAKE_MAIL),
                client.prepare(CLAIM_MAIL),
                client.prepare(WITHDRAW_MAIL),
                client.prepare(REMOVE_MAIL),
            );
            let st = Statements {
                row: prepared.0?,
                rows: prepared.1?,
                blocks: prepared.2?,
                block_start: prepared.3?,
                children: prepared.4?,
                child_index: prepared.5?,
                descendants: prepared.6?,
                next_seq: prepared.7?,
                create_session: prepared.8?,
                extend_session: prepared.9?,
                remove_row: prepared.10?,
                remove_index: prepared.11?,
                remove_blocks: prepared.12?,
                write_refusal: prepared.13?,
                lease: prepared.14?,
                acquire: prepared.15?,
                renew: prepared.16?,
                release: prepared.17?,
                post: prepared.18?,
                mail_for: prepared.19?,
                take_mail: prepared.20?,
                claim_mail: prepared.21?,
                withdraw_mail: prepared.22?,
                remove_mail: prepared.23?,
            };
            Ok(Arc::new(Conn {
                client,
                st,
                task: driver,
                discarded: AtomicBool::new(false),
            }))
        });
        if prepared.is_err() {
            // The client went with the unfinished call; its socket goes too.
            task.abort();
        }
        prepared?.map_err(pg_error)
    }

    /// A pooled connection, or a new one.
    fn idle(&self) -> std::result::Result<Arc<Conn>, EngineError> {
        loop {
            let pooled = self.pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
            match pooled {
                Some(conn) if !conn.usable() => continue,
                Some(conn) => return Ok(conn),
                None => return self.connect(),
            }
        }
    }
}

/// The PostgreSQL engine of a store.
pub(crate) struct PgEngine {
    shared: Arc<Shared>,
    read_only: bool,
    /// The id this store holds leases under: new at every open, so a restarted host fences off
    /// whatever its predecessor still had in flight.
    holder: Uuid,
    /// Whether posts and takes notify the other hosts, and watchers listen (see `notify`).
    pub(crate) mail_push: bool,
    listener: notify::Listener,
}

/// A lease from the columns `holder, fence, milliseconds left` starting at `at` (`None` when the
/// fence is null: no lease row).
fn lease_of(row: &Row, at: usize) -> Option<LeaseState> {
    let fence = row.get::<_, Option<i64>>(at + 1)?;
    Some(LeaseState {
        holder: row.get::<_, Option<Uuid>>(at),
        fence: u64::try_from(fence).unwrap_or(0),
        expires_in: std::time::Duration::from_millis(
            u64::try_from(row.get::<_, Option<i64>>(at + 2).unwrap_or(0)).unwrap_or(0),
        ),
    })
}

fn ttl_ms(ttl: std::time::Duration) -> f64 {
    ttl.as_secs_f64() * 1000.0
}

impl PgEngine {
    /// Connects to `url`, creating the tables in an empty database unless `read_only`, and checks
    /// the store's meta rows. Returns the engine and the store id.
    pub fn open(
        url: &str,
        read_only: bool,
        timeouts: &PostgresTimeouts,
    ) -> Result<(PgEngine, Uuid, BlockFormat)> {
        let shown = redact(url);
        let storage = |e: EngineError| StoreError::Storage(e);
        let (shared, (client, task)) = Shared::start(url, timeouts)?;
        let client = Arc::new(client);
        let shared = Arc::new(shared);
        if !read_only {
            create_tables(&shared, &client).map_err(storage)?;
        }
        let meta = on!(shared, &client, "reading the meta rows", |c| {
            let exists = c
                .query_one("SELECT to_regclass('lineage_meta') IS NOT NULL", &[])
                .await?
                .get::<_, bool>(0);
            if !exists {
                return Ok(None);
            }
            Ok(Some(meta_rows(&c).await?))
        })
        .map_err(storage)?
        .map_err(|e| storage(pg_error(e)))?;
        let (store_id, format) = check_meta(&shown, meta)?;
        let client = Arc::try_unwrap(client).map_err(|_| {
            storage(EngineError::new(
                EngineErrorKind::Other,
                "the first connection is still in use",
            ))
        })?;
        let conn = shared.prepare((client, task)).map_err(|e| {
            // A statement naming a column or table that is not there, or of another type: the
            // tables are not all the ones a store makes.
            if e.to_string().contains("(SQLSTATE 42") && e.kind() == EngineErrorKind::Other {
                StoreError::NotAStore {
                    path: shown.clone().into(),
                    reason: format!("its tables are not all Lineage tables: {e}"),
                }
            } else {
                storage(e)
            }
        })?;
        shared
            .pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(conn);
        Ok((
            PgEngine {
                shared,
                read_only,
                holder: Uuid::now_v7(),
                mail_push: true,
                listener: notify::Listener::default(),
            },
            store_id,
            format,
        ))
    }

    fn writer(&self) -> std::result::Result<Arc<Conn>, EngineError> {
        let mut slot = self.shared.writer.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(conn) = slot.as_ref().filter(|c| c.usable()) {
            return Ok(conn.clone());
        }
        let conn = self.shared.connect()?;
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// One attempt at a round without the writes in `skip`. On an error the transaction is
    /// rolled back.
    fn round(
        &self,
        conn: &Arc<Conn>,
        writes: &[SessionWrite],
        skip: &[usize],
        deletions: &[&dyn Deletion],
    ) -> std::result::Result<Committed, RoundError> {
        let shared = &self.shared;
        let whole = |e: tokio_postgres::Error| RoundError::Whole(pg_error(e));
        on!(shared, conn, "beginning a commit", |c| c
            .client
            .batch_execute("BEGIN")
            .await)
        .map_err(RoundError::Whole)?
        .map_err(whole)?;
        let abort = |error: RoundError| {
            let _ = on!(shared, conn, "rolling a commit back", |c| c
                .client
                .batch_execute("ROLLBACK")
                .await);
            error
        };
        let mut written = Vec::with_capacity(writes.len());
        for (i, write) in writes.iter().enumerate() {
            if skip.contains(&i) {
                // Filled in by the caller.
                written.push(Written::Applied);
                continue;
            }
            let params = WriteParams::of(write).map_err(|e| abort(RoundError::Session(i, e)))?;
            let (new, holder) = (write.new, self.holder);
            let affected = on!(shared, conn, "writing a session", |c| {
                let p = params;
                let statement = if new {
                    &c.st.create_session
                } else {
                    &c.st.extend_session
                };
                // Both take the session, what it must hold, its new end and row, the blocks, and
                // the lease it is written under.
                let must_hold: &(dyn tokio_postgres::types::ToSql + Sync) =
                    if new { &p.parent } else { &p.expected };
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 9] = [
                    &p.id,
                    must_hold,
                    &p.next_seq,
                    &p.row,
                    &p.firsts,
                    &p.values,
                    &holder,
                    &p.fence,
                    &p.replaced,
                ];
                // A new session replaces nothing: its statement takes no ninth parameter.
                let params = if new { &params[..8] } else { &params[..] };
                c.client.execute(statement, params).await
            })
            .map_err(|e| abort(RoundError::Whole(e)))?;
            match affected {
                Ok(n) if n > 0 => written.push(Written::Applied),
                Ok(_) => {
                    let id = uuid_of(write.session);
                    let row = on!(shared, conn, "reading why a write was refused", |c| c
                        .client
                        .query_one(&c.st.write_refusal, &[&id])
                        .await)
                    .map_err(|e| abort(RoundError::Whole(e)))?
                    .map_err(|e| abort(whole(e)))?;
                    let found = row
                        .get::<_, Option<i64>>(0)
                        .map(|n| u64::try_from(n).unwrap_or(u64::MAX));
                    let lease = lease_of(&row, 1);
                    let allowed = match (write.fence, &lease) {
                        (Some(fence), Some(lease)) => {
                            lease.holder == Some(self.holder) && lease.fence == fence
                        }
                        (Some(_), None) => false,
                        (None, lease) => !lease
                            .as_ref()
                            .is_some_and(|l| l.is_live() && l.holder != Some(self.holder)),
                    };
                    written.push(if allowed {
                        Written::Conflict { found }
                    } else {
                        Written::Fenced { lease }
                    });
                }
                Err(e) if refused_for_its_data(&e) => {
                    return Err(abort(RoundError::Session(i, pg_error(e))));
                }
                Err(e) => return Err(abort(whole(e))),
            }
        }
        let mut answers = Vec::with_capacity(deletions.len());
        let mut removal = PgRemoval {
            shared,
            conn,
            holder: self.holder,
        };
        for deletion in deletions {
            match deletion.run(&mut removal) {
                Ok(answer) => answers.push((deletion.id(), answer)),
                Err(e) => return Err(abort(RoundError::Whole(e))),
            }
        }
        let committed = Committed {
            writes: written,
            deletions: answers,
        };
        // Without an answer to COMMIT the transaction may have committed or not.
        match on!(shared, conn, "committing", |c| c
            .client
            .batch_execute("COMMIT")
            .await)
        {
            Ok(Ok(())) => Ok(committed),
            // The server answered: it rolled the transaction back.
            Ok(Err(e)) if e.as_db_error().is_some() => Err(whole(e)),
            // No answer (the connection broke, or the call passed its deadline and the
            // connection was dropped): the writer reads the round back.
            Ok(Err(e)) => Err(RoundError::InDoubt(pg_error(e), committed)),
            Err(e) => Err(RoundError::InDoubt(e, committed)),
        }
    }
}

/// Why a round's attempt failed.
enum RoundError {
    /// The server refused the write at this index for its own data: the round is tried again
    /// without it.
    Session(usize, EngineError),
    /// Nothing of the round can commit now.
    Whole(EngineError),
    /// `COMMIT` got no answer, or an error after it was sent: the round may be in the store, and
    /// then it did this.
    InDoubt(EngineError, Committed),
}

/// A write's statement parameters, owned so the statement can run on the engine's runtime.
struct WriteParams {
    id: Uuid,
    parent: Option<Uuid>,
    expected: i64,
    next_seq: i64,
    row: Vec<u8>,
    firsts: Vec<i64>,
    values: Vec<Vec<u8>>,
    fence: Option<i64>,
    replaced: Vec<i64>,
}

impl WriteParams {
    fn of(write: &SessionWrite) -> std::result::Result<WriteParams, EngineError> {
        let next_seq = SessionRecord::decode(write.session, &write.row)
            .map(|r| r.next_seq)
            .map_err(|e| EngineError::new(EngineErrorKind::Other, e.to_string()))?;
        Ok(WriteParams {
            id: Uuid::from_u128(write.session.as_u128()),
            parent: write.parent.map(|p| Uuid::from_u128(p.as_u128())),
            expected: seq_param(write.expected)?,
            next_seq: seq_param(next_seq)?,
            row: write.row.clone(),
            firsts: write
                .blocks
                .iter()
                .map(|(first, _)| seq_param(*first))
                .collect::<std::result::Result<_, _>>()?,
            values: write.blocks.iter().map(|(_, v)| v.clone()).collect(),
            fence: write.fence.map(seq_param).transpose()?,
            replaced: write
                .replaced
                .iter()
                .map(|first| seq_param(*first))
                .collect::<std::result::Result<_, _>>()?,
        })
    }
}

impl Engine for PgEngine {
    fn view(&self) -> Result<Box<dyn View>> {
        let conn = self.shared.idle().map_err(StoreError::Storage)?;
        Ok(Box::new(PgView {
            held: Arc::new(Held {
                shared: self.shared.clone(),
                conn,
                begun: AtomicBool::new(false),
            }),
        }))
    }

    fn commit(
        &self,
        writes: &[SessionWrite],
        deletions: &[&dyn Deletion],
    ) -> std::result::Result<Committed, CommitError> {
        if self.read_only {
            return Err(CommitError::before(EngineError::new(
                EngineErrorKind::Other,
                "the store is read-only",
            )));
        }
        let conn = self.writer().map_err(CommitError::before)?;
        let mut skipped: Vec<(usize, EngineError)> = Vec::new();
        loop {
            let skip: Vec<usize> = skipped.iter().map(|(i, _)| *i).collect();
            match self.round(&conn, writes, &skip, deletions) {
                Ok(mut committed) => {
                    for (i, error) in skipped {
                        committed.writes[i] = Written::Failed(error);
                    }
                    return Ok(committed);
                }
                Err(RoundError::Session(i, error)) => {
                    tracing::warn!(session = %writes[i].session, %error, "PostgreSQL refused a session's write; the round goes on without it");
                    skipped.push((i, error));
                }
                Err(RoundError::Whole(error)) => return Err(CommitError::before(error)),
                Err(RoundError::InDoubt(error, mut committed)) => {
                    for (i, error) in skipped {
                        committed.writes[i] = Written::Failed(error);
                    }
                    return Err(CommitError {
                        error,
                        in_doubt: Some(committed),
                    });
                }
            }
        }
    }

    /// Reads the rows back on a fresh connection: a committed transaction is durable on the
    /// server, so finding the round is enough.
    fn resolve(
        &self,
        writes: &[SessionWrite],
        in_doubt: &Committed,
    ) -> std::result::Result<bool, EngineError> {
        let view = self.view().map_err(|e| match e {
            StoreError::Storage(error) => error,
            other => EngineError::new(EngineErrorKind::Other, other.to_string()),
        })?;
        round_in_store(&*view, writes, in_doubt)
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn recover(&self) {
        let mut slot = self.shared.writer.lock().unwrap_or_else(|p| p.into_inner());
        // A connection left inside a failed transaction is not reused.
        *slot = None;
    }
}

/// Hosts share the database: leases and the mailbox are rows every host sees, fenced by tokens
/// the server raises.
impl Coordination for PgEngine {
    fn shared(&self) -> bool {
        true
    }

    fn holder(&self) -> Uuid {
        self.holder
    }

    fn acquire(
        &self,
        session: SessionId,
        ttl: std::time::Duration,
    ) -> std::result::Result<Acquired, EngineError> {
        let (id, holder, ms) = (uuid_of(session), self.holder, ttl_ms(ttl));
        let granted = self.on_idle(move |c| async move {
            c.client
                .query_opt(&c.st.acquire, &[&id, &holder, &ms])
                .await
        })?;
        match granted {
            Some(row) => Ok(Acquired::Granted {
                fence: u64::try_from(row.get::<_, i64>(0)).unwrap_or(0),
            }),
            // Refused: someone else's live lease, as it stands now (it may have gone since).
            None => match self.lease(session)? {
                Some(lease) if lease.held_by_other(self.holder) => {
                    Ok(Acquired::HeldElsewhere(lease))
                }
                _ => self.acquire(session, ttl),
            },
        }
    }

    fn renew(
        &self,
        held: &[(SessionId, u64)],
        ttl: std::time::Duration,
    ) -> std::result::Result<Vec<SessionId>, EngineError> {
        let sessions: Vec<Uuid> = held.iter().map(|(s, _)| uuid_of(*s)).collect();
        let fences = held
            .iter()
            .map(|(_, f)| seq_param(*f))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let (holder, ms) = (self.holder, ttl_ms(ttl));
        let renewed = self.on_idle(move |c| async move {
            c.client
                .query(&c.st.renew, &[&holder, &ms, &sessions, &fences])
                .await
        })?;
        let renewed: std::collections::HashSet<Uuid> =
            renewed.iter().map(|row| row.get::<_, Uuid>(0)).collect();
        Ok(held
            .iter()
            .map(|(s, _)| *s)
            .filter(|s| !renewed.contains(&uuid_of(*s)))
            .collect())
    }

    fn release_lease(
        &self,
        session: SessionId,
        fence: u64,
    ) -> std::result::Result<(), EngineError> {
        let (id, holder, fence) = (uuid_of(session), self.holder, seq_param(fence)?);
        self.on_idle(move |c| async move {
            c.client
                .execute(&c.st.release, &[&id, &holder, &fence])
                .await
        })?;
        Ok(())
    }

    fn post(&self, mail: &Mail) -> std::result::Result<bool, EngineError> {
        let (id, recipient, sender, body) = (
            mail.id,
            uuid_of(mail.recipient),
            uuid_of(mail.sender),
            mail.body.clone(),
        );
        let push = self.mail_push;
        let posted = self.on_idle(move |c| async move {
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
                [&id, &recipient, &sender, &body];
            notified(push, &c.client, c.client.execute(&c.st.post, &params)).await
        })?;
        Ok(posted == 1)
    }

    fn mail_for(&self, recipients: &[SessionId]) -> std::result::Result<Vec<Mail>, EngineError> {
        let recipients: Vec<Uuid> = recipients.iter().map(|s| uuid_of(*s)).collect();
        let rows =
            self.on_idle(
                move |c| async move { c.client.query(&c.st.mail_for, &[&recipients]).await },
            )?;
        Ok(rows
            .iter()
            .map(|row| Mail {
                id: row.get(0),
                recipient: SessionId::from_u128(row.get::<_, Uuid>(1).as_u128()),
                sender: SessionId::from_u128(row.get::<_, Uuid>(2).as_u128()),
                body: row.get(3),
            })
            .collect())
    }

    fn take_mail(&self, ids: &[Uuid]) -> std::result::Result<Vec<Uuid>, EngineError> {
        let ids = ids.to_vec();
        let push = self.mail_push;
        let rows = self.on_idle(move |c| async move {
            notified(push, &c.client, c.client.query(&c.st.take_mail, &[&ids])).await
        })?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    fn claim_mail(&self, id: Uuid, fence: u64) -> std::result::Result<bool, EngineError> {
        let (holder, fence) = (self.holder, seq_param(fence)?);
        let rows = self.on_idle(move |c| async move {
            c.client
                .query(&c.st.claim_mail, &[&id, &holder, &fence])
                .await
        })?;
        Ok(!rows.is_empty())
    }

    fn withdraw_mail(&self, id: Uuid) -> std::result::Result<bool, EngineError> {
        let rows = self
            .on_idle(move |c| async move { c.client.query(&c.st.withdraw_mail, &[&id]).await })?;
        Ok(!rows.is_empty())
    }

    fn lease(&self, session: SessionId) -> std::result::Result<Option<LeaseState>, EngineError> {
        let id = uuid_of(session);
        let row =
            self.on_idle(move |c| async move { c.client.query_opt(&c.st.lease, &[&id]).await })?;
        Ok(row.and_then(|row| lease_of(&row, 0)))
    }

    fn watch_mail(&self, wake: MailWake) -> bool {
        if self.mail_push {
            self.listener.watch(&self.shared, wake);
        }
        self.mail_push
    }
}

/// Runs a change of the mailbox, followed (when `push`) by the notification that wakes the hosts
/// watching it: pipelined, one round trip, and sent only after the change committed (each is a
/// transaction of its own), so a woken host sees the change. A failed notification costs the
/// watchers only their wake-up (they poll too), never the change.
async fn notified<T>(
    push: bool,
    client: &Client,
    change: impl Future<Output = std::result::Result<T, tokio_postgres::Error>>,
) -> std::result::Result<T, tokio_postgres::Error> {
    if !push {
        return change.await;
    }
    let (changed, notified) = tokio::join!(change, client.batch_execute(notify::NOTIFY));
    if let Err(error) = notified {
        tracing::debug!(%error, "notifying the mailbox's watchers failed");
    }
    changed
}

impl PgEngine {
    /// Runs one statement outside any transaction on a pooled connection, pooled again after.
    fn on_idle<T, F>(
        &self,
        work: impl FnOnce(Arc<Conn>) -> F + Send + 'static,
    ) -> std::result::Result<T, EngineError>
    where
        T: Send + 'static,
        F: Future<Output = std::result::Result<T, tokio_postgres::Error>> + Send + 'static,
    {
        let conn = self.shared.idle()?;
        let answer =
            self.shared
                .run_on(&*conn, "a lease or mailbox statement", work(conn.clone()))?;
        if conn.usable() {
            self.shared
                .pool
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(conn);
        }
        answer.map_err(pg_error)
    }
}

/// A read view's connection, inside its transaction (begun with its first query) until the last
/// of the view and its block iterators is dropped; then rolled back and pooled.
struct Held {
    shared: Arc<Shared>,
    conn: Arc<Conn>,
    begun: AtomicBool,
}

/// A view's transaction: one snapshot for all its reads.
const BEGIN_VIEW: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";

impl Drop for Held {
    fn drop(&mut self) {
        let conn = self.conn.clone();
        let pool = self.shared.pool.clone();
        let begun = *self.begun.get_mut();
        let call = self.shared.runtime.call;
        self.shared.runtime.handle.spawn(async move {
            if !conn.usable() {
                return;
            }
            let ended = !begun
                || matches!(
                    tokio::time::timeout(call, conn.client.batch_execute("ROLLBACK")).await,
                    Ok(Ok(()))
                );
            if !ended {
                conn.discard();
            } else if conn.usable() {
                let mut pool = pool.lock().unwrap_or_else(|p| p.into_inner());
                if pool.len() < 8 {
                    pool.push(conn);
                }
            }
        });
    }
}

/// A query on a connection, run on the engine's runtime.
type RowsFuture = std::pin::Pin<
    Box<dyn Future<Output = std::result::Result<Vec<Row>, tokio_postgres::Error>> + Send>,
>;

impl Held {
    fn query(&self, work: impl FnOnce(Arc<Conn>) -> RowsFuture) -> Result<Vec<Row>> {
        let future = work(self.conn.clone());
        let begin = !self.begun.swap(true, Ordering::AcqRel);
        let conn = self.conn.clone();
        self.shared
            .run_on(&*self.conn, "reading", async move {
                if !begin {
                    return future.await;
                }
                // The transaction's start goes out with the first query, in order, in one
                // round trip.
                let (began, rows) = tokio::join!(conn.client.batch_execute(BEGIN_VIEW), future);
                began.and(rows)
            })
            .map_err(StoreError::Storage)?
            .map_err(|e| StoreError::Storage(pg_error(e)))
    }
}

struct PgView {
    held: Arc<Held>,
}

fn uuid_of(session: SessionId) -> Uuid {
    Uuid::from_u128(session.as_u128())
}

fn session_of(row: &Row, index: usize) -> Result<SessionId> {
    row.try_get::<_, Uuid>(index)
        .map(|id| SessionId::from_u128(id.as_u128()))
        .map_err(|e| StoreError::Storage(pg_error(e)))
}

fn seq_of(row: &Row, index: usize) -> Result<u64> {
    let seq = row
        .try_get::<_, i64>(index)
        .map_err(|e| StoreError::Storage(pg_error(e)))?;
    u64::try_from(seq).map_err(|_| {
        StoreError::Storage(EngineError::new(
            EngineErrorKind::Corrupted,
            format!("a negative seq ({seq}) is stored"),
        ))
    })
}

/// A row's bytes at `index`, checked to be bytes so that reading them later cannot fail.
fn bytes_of(row: Row, index: usize) -> Result<Bytes> {
    row.try_get::<_, &[u8]>(index)
        .map_err(|e| StoreError::Storage(pg_error(e)))?;
    Ok(Bytes::new(Column(row, index)))
}

/// A row's bytes column, checked to be bytes when it was read.
struct Column(Row, usize);

impl AsRef<[u8]> for Column {
    fn as_ref(&self) -> &[u8] {
        self.0.get(self.1)
    }
}

impl PgView {
    /// The sessions `statement` lists under `session`, as its one column of ids.
    fn sessions_below(
        &self,
        session: SessionId,
        statement: fn(&Statements) -> &Statement,
    ) -> Result<Vec<SessionId>> {
        let id = uuid_of(session);
        let rows = self
            .held
            .query(|c| Box::pin(async move { c.client.query(statement(&c.st), &[&id]).await }))?;
        rows.iter().map(|row| session_of(row, 0)).collect()
    }
}

impl View for PgView {
    fn row(&self, session: SessionId) -> Result<Option<Bytes>> {
        let id = uuid_of(session);
        let rows = self
            .held
            .query(|c| Box::pin(async move { c.client.query(&c.st.row, &[&id]).await }))?;
        rows.into_iter()
            .next()
            .map(|row| bytes_of(row, 0))
            .transpose()
    }

    fn rows(&self) -> Result<Vec<(SessionId, Bytes)>> {
        let rows = self
            .held
            .query(|c| Box::pin(async move { c.client.query(&c.st.rows, &[]).await }))?;
        rows.into_iter()
            .map(|row| Ok((session_of(&row, 0)?, bytes_of(row, 1)?)))
            .collect()
    }

    fn blocks(&self, session: SessionId, start: u64) -> Result<Blocks> {
        Ok(Box::new(PgBlocks {
            held: self.held.clone(),
            session,
            next: Some(start),
            page: VecDeque::new(),
        }))
    }

    fn block_start(&self, session: SessionId, seq: u64) -> Result<u64> {
        let id = uuid_of(session);
        let seq = i64::try_from(seq).unwrap_or(i64::MAX);
        let rows = self.held.query(|c| {
            Box::pin(async move { c.client.query(&c.st.block_start, &[&id, &seq]).await })
        })?;
        match rows.first() {
            Some(row) => seq_of(row, 0),
            None => Ok(0),
        }
    }

    fn children(&self, parent: SessionId) -> Result<Vec<SessionId>> {
        self.sessions_below(parent, |st| &st.children)
    }

    fn child_index(&self) -> Result<Vec<(SessionId, SessionId)>> {
        let rows = self
            .held
            .query(|c| Box::pin(async move { c.client.query(&c.st.child_index, &[]).await }))?;
        rows.iter()
            .map(|row| Ok((session_of(row, 0)?, session_of(row, 1)?)))
            .collect()
    }

    fn descendants(&self, root: SessionId) -> Result<Vec<SessionId>> {
        self.sessions_below(root, |st| &st.descendants)
    }
}

/// A session's blocks, fetched a page at a time inside the view's transaction.
struct PgBlocks {
    held: Arc<Held>,
    session: SessionId,
    /// The first seq of the next page, `None` once the last page is read.
    next: Option<u64>,
    page: VecDeque<Row>,
}

impl PgBlocks {
    fn fetch(&mut self, start: u64) -> Result<()> {
        let id = uuid_of(self.session);
        let Ok(start) = i64::try_from(start) else {
            self.next = None;
            return Ok(());
        };
        let rows = self.held.query(|c| {
            Box::pin(async move {
                c.client
                    .query(&c.st.blocks, &[&id, &start, &PAGE_BLOCKS])
                    .await
            })
        })?;
        self.next = match rows.last() {
            Some(last) if rows.len() as i64 == PAGE_BLOCKS => {
                Some(seq_of(last, 0)?.saturating_add(1))
            }
            _ => None,
        };
        self.page = rows.into();
        Ok(())
    }
}

impl Iterator for PgBlocks {
    type Item = Result<(u64, Bytes)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.page.is_empty() {
            let start = self.next?;
            if let Err(e) = self.fetch(start) {
                self.next = None;
                return Some(Err(e));
            }
        }
        let row = self.page.pop_front()?;
        Some(seq_of(&row, 0).and_then(|first_seq| Ok((first_seq, bytes_of(row, 1)?))))
    }
}

/// A deletion's statements, inside the round's transaction.
struct PgRemoval<'a> {
    shared: &'a Shared,
    conn: &'a Arc<Conn>,
    holder: Uuid,
}

impl PgRemoval<'_> {
    fn rows(
        &self,
        work: impl FnOnce(Arc<Conn>) -> RowsFuture,
    ) -> std::result::Result<Vec<Row>, EngineError> {
        self.shared
            .run_on(&**self.conn, "deleting a session", work(self.conn.clone()))?
            .map_err(pg_error)
    }
}

impl Removal for PgRemoval<'_> {
    fn held_elsewhere(
        &mut self,
        session: SessionId,
    ) -> std::result::Result<Option<LeaseState>, EngineError> {
        let id = uuid_of(session);
        let rows =
            self.rows(|c| Box::pin(async move { c.client.query(&c.st.lease, &[&id]).await }))?;
        Ok(rows
            .first()
            .and_then(|row| lease_of(row, 0))
            .filter(|lease| lease.held_by_other(self.holder)))
    }

    fn is_stored(&mut self, session: SessionId) -> std::result::Result<bool, EngineError> {
        let id = uuid_of(session);
        let rows =
            self.rows(|c| Box::pin(async move { c.client.query(&c.st.next_seq, &[&id]).await }))?;
        Ok(!rows.is_empty())
    }

    fn children(&mut self, parent: SessionId) -> std::result::Result<Vec<SessionId>, EngineError> {
        let id = uuid_of(parent);
        let rows =
            self.rows(|c| Box::pin(async move { c.client.query(&c.st.children, &[&id]).await }))?;
        rows.iter()
            .map(|row| {
                session_of(row, 0)
                    .map_err(|e| EngineError::new(EngineErrorKind::Corrupted, e.to_string()))
            })
            .collect()
    }

    fn remove(&mut self, session: SessionId) -> std::result::Result<Removed, EngineError> {
        let id = uuid_of(session);
        self.rows(|c| Box::pin(async move { c.client.query(&c.st.remove_row, &[&id]).await }))?;
        // Mail for a session that is gone has nobody to reach.
        self.rows(|c| Box::pin(async move { c.client.query(&c.st.remove_mail, &[&id]).await }))?;
        self.rows(|c| Box::pin(async move { c.client.query(&c.st.remove_index, &[&id]).await }))?;
        let blocks = self
            .rows(|c| Box::pin(async move { c.client.query(&c.st.remove_blocks, &[&id]).await }))?;
        let mut removed = Removed::default();
        for row in blocks {
            let head: &[u8] = row.try_get(0).map_err(pg_error)?;
            let len: i32 = row.try_get(1).map_err(pg_error)?;
            removed.blocks += 1;
            removed.events += block_count(head);
            removed.bytes += u64::try_from(len).unwrap_or(0);
        }
        Ok(removed)
    }
}

/// Creates the tables and meta rows in a database that has none, once among racing hosts.
///
/// No lock orders the creators (advisory locks are PostgreSQL's own, and engines that speak its
/// protocol lack them): each creates everything in one transaction, and a creator that loses the
/// race meets the winner's committed tables (a duplicate table, or a unique violation on the
/// catalog) or a serialization failure; it rolls back and looks again, and finds them.
fn create_tables(shared: &Shared, client: &Arc<Client>) -> std::result::Result<(), EngineError> {
    const ATTEMPTS: usize = 5;
    let id = Uuid::now_v7();
    let version = STORE_FORMAT_VERSION.to_le_bytes().to_vec();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let version = version.clone();
        let created = on!(shared, client, "creating the tables", |c| {
            c.batch_execute("BEGIN").await?;
            let work = async {
                let exists: bool = c
                    .query_one("SELECT to_regclass('lineage_meta') IS NOT NULL", &[])
                    .await?
                    .get(0);
                if !exists {
                    c.batch_execute(CREATE).await?;
                    let insert = "INSERT INTO lineage_meta (name, value) VALUES ($1, $2)";
                    let rows: [(&str, &[u8]); 3] = [
                        (META_MAGIC, MAGIC),
                        (META_FORMAT, &version),
                        (META_STORE_ID, id.as_bytes()),
                    ];
                    for (name, value) in rows {
                        c.execute(insert, &[&name, &value]).await?;
                    }
                }
                c.batch_execute("COMMIT").await
            };
            match work.await {
                Ok(()) => Ok(()),
                Err(e) => {
                    let _ = c.batch_execute("ROLLBACK").await;
                    Err(e)
                }
            }
        })?;
        match created {
            Ok(()) => return Ok(()),
            Err(e) if attempt < ATTEMPTS && lost_the_creation_race(&e) => {
                tracing::debug!(%e, "another host created the tables first; looking again");
            }
            Err(e) => return Err(pg_error(e)),
        }
    }
}

/// Whether creating the tables failed because another creator's committed first (or the engine
/// refused the concurrent transaction): then they are there, or the next attempt makes them.
fn lost_the_creation_race(error: &tokio_postgres::Error) -> bool {
    error.as_db_error().is_some_and(|db| {
        [
            SqlState::DUPLICATE_TABLE,
            SqlState::DUPLICATE_OBJECT,
            SqlState::UNIQUE_VIOLATION,
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::T_R_DEADLOCK_DETECTED,
        ]
        .contains(db.code())
    })
}

/// The store's meta rows, by name, or why the table `lineage_meta` is not the one a store makes
/// (another application's, or another shape): never a panic on what the table holds.
async fn meta_rows(c: &Client) -> std::result::Result<Meta, tokio_postgres::Error> {
    let rows = match c.query("SELECT name, value FROM lineage_meta", &[]).await {
        Ok(rows) => rows,
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_COLUMN) => {
            return Ok(Err(foreign_meta(&pg_error(e).to_string())));
        }
        Err(e) => return Err(e),
    };
    Ok(rows
        .iter()
        .map(|row| Ok((row.try_get::<_, String>(0)?, row.try_get::<_, Vec<u8>>(1)?)))
        .collect::<std::result::Result<_, tokio_postgres::Error>>()
        .map_err(|e| foreign_meta(&format!("its rows are not (text, bytea) pairs: {e}"))))
}

/// The meta rows, or the reason the table is not a store's.
type Meta = std::result::Result<Vec<(String, Vec<u8>)>, String>;

fn foreign_meta(reason: &str) -> String {
    format!("the table lineage_meta is not a Lineage table: {reason}")
}

/// Checks the meta rows as redb's `meta` table is checked: the magic, a format version this
/// build reads, a store id.
fn check_meta(shown: &str, meta: Option<Meta>) -> Result<(Uuid, BlockFormat)> {
    let not_a_store = |reason: &str| StoreError::NotAStore {
        path: shown.into(),
        reason: reason.to_owned(),
    };
    let meta = meta
        .ok_or_else(|| not_a_store("it holds no Lineage tables"))?
        .map_err(|reason| not_a_store(&reason))?;
    let get = |name: &str| {
        meta.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    };
    if get(META_MAGIC) != Some(MAGIC) {
        return Err(not_a_store("its meta table lacks the Lineage magic"));
    }
    let version = get(META_FORMAT)
        .and_then(|v| <[u8; 4]>::try_from(v).ok())
        .map(u32::from_le_bytes)
        .ok_or_else(|| not_a_store("its meta table has no format version"))?;
    let format = crate::store::check_store_version(shown, version)?;
    let id = get(META_STORE_ID)
        .and_then(|v| Uuid::from_slice(v).ok())
        .ok_or_else(|| not_a_store("its meta table has no store id"))?;
    Ok((id, format))
}

/// What an upgrade of a PostgreSQL store changed: the format it found, and the sessions and
/// events it rewrote.
pub(crate) struct PgUpgraded {
    pub from: u32,
    pub sessions: usize,
    pub events: u64,
}

/// Rewrites a PostgreSQL store of an older format in this build's, in one transaction: every
/// session's blocks go through `relayout` (the stored blocks in seq order, the new ones back), and
/// the format version is raised. Refused while any host holds a lease on one of its sessions.
pub(crate) fn upgrade(
    url: &str,
    relayout: impl Fn(SessionId, Vec<(u64, Vec<u8>)>) -> Result<Vec<(u64, Vec<u8>)>>
    + Send
    + Sync
    + 'static,
) -> Result<PgUpgraded> {
    let shown = redact(url);
    let storage = |e: EngineError| StoreError::Storage(e);
    // One transaction rewrites every session: each statement is bounded by the server's
    // `statement_timeout`, and the whole by an hour.
    let timeouts = PostgresTimeouts {
        call: UPGRADE_CALL,
        ..PostgresTimeouts::default()
    };
    let (shared, (client, _task)) = Shared::start(url, &timeouts)?;
    let client = Arc::new(client);
    let version = STORE_FORMAT_VERSION.to_le_bytes().to_vec();
    on!(shared, &client, "upgrading the store", |c| {
        c.batch_execute("BEGIN").await.map_err(|e| storage(pg_error(e)))?;
        let work = async {
            let pg = |e: tokio_postgres::Error| storage(pg_error(e));
            let tables: bool = c
                .query_one("SELECT to_regclass('lineage_meta') IS NOT NULL", &[])
                .await
                .map_err(pg)?
                .get(0);
            if !tables {
                return Err(StoreError::NotAStore {
                    path: shown.clone().into(),
                    reason: "it holds no Lineage tables".into(),
                });
            }
            // The format row, locked until the upgrade commits: a concurrent upgrade waits here
            // and then reads the format this one wrote. Writers do not write a store of an older
            // format (they open it read-only), and readers read their own snapshot.
            c.query(
                "SELECT value FROM lineage_meta WHERE name = $1 FOR UPDATE",
                &[&META_FORMAT],
            )
            .await
            .map_err(pg)?;
            let meta = meta_rows(&c).await.map_err(pg)?;
            let (_, format) = check_meta(&shown, Some(meta))?;
            let from = match format {
                BlockFormat::V2 => {
                    return Ok(PgUpgraded {
                        from: STORE_FORMAT_VERSION,
                        sessions: 0,
                        events: 0,
                    });
                }
                BlockFormat::V1 => 1,
            };
            let leases: bool = c
                .query_one("SELECT to_regclass('lineage_leases') IS NOT NULL", &[])
                .await
                .map_err(pg)?
                .get(0);
            if leases {
                let held: i64 = c
                    .query_one(
                        "SELECT count(*) FROM lineage_leases \
                         WHERE holder IS NOT NULL AND expires_at > now()",
                        &[],
                    )
                    .await
                    .map_err(pg)?
                    .get(0);
                if held > 0 {
                    return Err(StoreError::NotAStore {
                        path: shown.clone().into(),
                        reason: format!(
                            "{held} of its sessions are held by running hosts: stop them, then upgrade"
                        ),
                    });
                }
            }
            let sessions = c
                .query("SELECT id, next_seq FROM lineage_sessions ORDER BY id", &[])
                .await
                .map_err(pg)?;
            let mut events = 0u64;
            for row in &sessions {
                let id: Uuid = row.get(0);
                events += u64::try_from(row.get::<_, i64>(1)).unwrap_or(0);
                let session = SessionId::from_u128(id.as_u128());
                let blocks = c
                    .query(
                        "SELECT first_seq, value FROM lineage_blocks WHERE session = $1 \
                         ORDER BY first_seq",
                        &[&id],
                    )
                    .await
                    .map_err(pg)?
                    .iter()
                    .map(|b| (u64::try_from(b.get::<_, i64>(0)).unwrap_or(u64::MAX), b.get(1)))
                    .collect();
                let rewritten = relayout(session, blocks)?;
                let firsts = rewritten
                    .iter()
                    .map(|(first, _)| seq_param(*first))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(storage)?;
                let values: Vec<&[u8]> = rewritten.iter().map(|(_, v)| v.as_slice()).collect();
                c.execute("DELETE FROM lineage_blocks WHERE session = $1", &[&id])
                    .await
                    .map_err(pg)?;
                c.execute(
                    "INSERT INTO lineage_blocks (session, first_seq, value) \
                     SELECT $1, b.first_seq, b.value FROM unnest($2::bigint[], $3::bytea[]) AS b (first_seq, value)",
                    &[&id, &firsts, &values],
                )
                .await
                .map_err(pg)?;
            }
            c.execute(
                "UPDATE lineage_meta SET value = $1 WHERE name = $2",
                &[&version, &META_FORMAT],
            )
            .await
            .map_err(pg)?;
            Ok(PgUpgraded {
                from,
                sessions: sessions.len(),
                events,
            })
        };
        match work.await {
            Ok(done) => {
                c.batch_execute("COMMIT").await.map_err(|e| storage(pg_error(e)))?;
                Ok(done)
            }
            Err(e) => {
                let _ = c.batch_execute("ROLLBACK").await;
                Err(e)
            }
        }
    })
    .map_err(storage)?
}
