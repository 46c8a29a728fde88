//! The single writer: admission, group commit and flush.
//!
//! Callers admit batches (validated, encoded and digested in the caller's thread, then queued per
//! session). One writer thread commits every session's queued blocks in one transaction with one
//! fsync. A flush waits until everything admitted before it is durable. A failed commit puts its
//! blocks back at the front of their queues, so order is kept, and pauses the writer until the next
//! admission or flush, which retries and reports.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use lineage_log::{Chain, Digest, Header, SessionId, Structure};
use redb::Database;

use crate::delete::{DeleteJob, Deleted, delete_in};
use crate::error::EngineError;
use crate::layout::{CHILDREN, EVENTS, SESSIONS, SessionRecord, encode_block};
use crate::store::{Writable, contained};
use crate::{Result, StoreError, StoreOptions};

/// Admitted records of one session, not yet durable: a contiguous run ending at `digest`.
#[derive(Debug)]
pub(crate) struct PendingBlock {
    pub first_seq: u64,
    pub count: u32,
    pub records: Vec<u8>,
    /// The running digest at the block's last record.
    pub digest: Digest,
}

/// What the writer knows of a session this process has touched.
#[derive(Debug)]
pub(crate) struct Tail {
    pub header: Header,
    /// Whether the session has a row in `sessions` (is durable at all).
    pub row_written: bool,
    /// The committed revision.
    pub revision: u64,
    /// The seq the next admitted event must carry.
    pub next_seq: u64,
    /// The structure after every admitted event.
    pub structure: Structure,
    /// The running digest after every admitted event.
    pub chain: Chain,
    /// Admitted blocks not yet durable, in seq order.
    pub pending: Vec<PendingBlock>,
    /// The ticket of the last batch admitted for this session.
    pub last_ticket: u64,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    pub tails: HashMap<SessionId, Tail>,
    /// The last ticket issued; each admitted batch takes the next one.
    pub next_ticket: u64,
    /// Every batch with a ticket at or below this is durable.
    pub durable: u64,
    /// Completed commit attempts.
    pub attempts: u64,
    /// The failure of the latest attempt, if it failed.
    pub last_failure: Option<EngineError>,
    /// Set by a failure; cleared by the next admission or flush.
    pub paused: bool,
    pub flush_requested: bool,
    pub pending_blocks: usize,
    pub first_pending_at: Option<Instant>,
    pub shutdown: bool,
    pub writer_gone: bool,
    /// Deletions waiting for the next commit (see `Store::delete`).
    pub deletions: Vec<DeleteJob>,
    /// The id of the last deletion queued.
    pub last_deletion: u64,
    /// Each decided deletion's answer, by id, until its caller takes it.
    pub deleted_answers: HashMap<u64, Result<Deleted>>,
    /// Sessions this handle deleted: a tail read from the store before the deletion committed is
    /// not remembered, and forks of them are refused.
    pub deleted: HashSet<SessionId>,
}

pub(crate) struct Queue {
    pub state: Mutex<State>,
    pub wake_writer: Condvar,
    pub wake_waiters: Condvar,
}

impl Queue {
    pub fn new() -> Queue {
        Queue {
            state: Mutex::new(State::default()),
            wake_writer: Condvar::new(),
            wake_waiters: Condvar::new(),
        }
    }

    /// The queue of a read-only handle: nothing is ever admitted, and a wait returns at once.
    pub fn without_writer() -> Queue {
        let queue = Queue::new();
        queue.lock().writer_gone = true;
        queue
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a panic while holding it; the state is plain data whose every
        // mutation completes before any call that could panic, so it is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `blocks` for `session` (whose tail is already updated) and wakes the writer.
    pub fn enqueue(&self, state: &mut State, session: SessionId, blocks: Vec<PendingBlock>) -> u64 {
        state.next_ticket += 1;
        let ticket = state.next_ticket;
        let tail = state
            .tails
            .get_mut(&session)
            .expect("enqueue is only called for a session with a tail");
        state.pending_blocks += blocks.len();
        tail.pending.extend(blocks);
        tail.last_ticket = ticket;
        if state.paused || state.first_pending_at.is_none() {
            state.first_pending_at = Some(Instant::now());
        }
        state.paused = false;
        self.wake_writer.notify_one();
        ticket
    }

    /// Waits until every batch with a ticket at or below `target` is durable.
    pub fn wait_durable(&self, mut state: MutexGuard<'_, State>, target: u64) -> Result<()> {
        if target <= state.durable {
            return Ok(());
        }
        let start_attempts = state.attempts;
        state.flush_requested = true;
        state.paused = false;
        self.wake_writer.notify_one();
        loop {
            if state.durable >= target {
                return Ok(());
            }
            if state.attempts > start_attempts
                && let Some(failure) = &state.last_failure
            {
                return Err(StoreError::CommitFailed {
                    source: failure.clone(),
                });
            }
            if state.writer_gone {
                return Err(StoreError::Closed);
            }
            state = self
                .wake_waiters
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// One session's share of a commit.
struct Job {
    session: SessionId,
    /// Present when the session has no row yet: the commit writes its header too.
    new_header: Option<Header>,
    header: Header,
    revision: u64,
    blocks: Vec<PendingBlock>,
}

/// The writer thread's body.
pub(crate) fn run(db: Arc<Writable>, queue: Arc<Queue>, options: StoreOptions) {
    struct Gone<'a>(&'a Queue);
    impl Drop for Gone<'_> {
        fn drop(&mut self) {
            let mut state = self.0.lock();
            state.writer_gone = true;
            self.0.wake_waiters.notify_all();
        }
    }
    let _gone = Gone(&queue);
    let mut scratch = Vec::new();
    loop {
        let mut state = queue.lock();
        loop {
            // At shutdown a paused queue gets one last attempt.
            let work = state.pending_blocks > 0 || !state.deletions.is_empty();
            let ready = work && (!state.paused || state.shutdown);
            if state.shutdown && !ready {
                return;
            }
            if ready {
                // A deletion's caller waits for it, as a flush's does.
                if state.flush_requested || state.shutdown || !state.deletions.is_empty() {
                    break;
                }
                let opened = *state.first_pending_at.get_or_insert_with(Instant::now);
                let deadline = opened + options.commit_window;
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                state = queue
                    .wake_writer
                    .wait_timeout(state, deadline - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                continue;
            }
            state = queue
                .wake_writer
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
        let watermark = state.next_ticket;
        let mut jobs = Vec::new();
        for (session, tail) in state.tails.iter_mut() {
            if tail.pending.is_empty() {
                continue;
            }
            jobs.push(Job {
                session: *session,
                new_header: (!tail.row_written).then(|| tail.header.clone()),
                header: tail.header.clone(),
                revision: tail.revision + 1,
                blocks: std::mem::take(&mut tail.pending),
            });
        }
        let deletions = std::mem::take(&mut state.deletions);
        state.pending_blocks = 0;
        state.flush_requested = false;
        state.first_pending_at = None;
        let shutting_down = state.shutdown;
        drop(state);

        // A handle is missing only after a reopen failed: try again before committing.
        let handle = db.get().or_else(|_| {
            db.reopen();
            db.get()
        });
        let result = match handle {
            // The engine may panic committing onto a damaged file: that is a failed commit.
            Ok(handle) => contained(|| commit(&handle, &jobs, &deletions, &options, &mut scratch))
                .unwrap_or_else(|panic| {
                    Err(redb::Error::Corrupted(format!(
                        "the storage engine panicked committing: {panic}"
                    )))
                }),
            // Name why the file is unavailable, not only that it is.
            Err(error) => Err(redb::Error::Io(std::io::Error::other(error.to_string()))),
        };
        if result.is_err() {
            // The engine refuses a handle after an I/O failure: reopen before any retry.
            db.reopen();
        }

        let mut state = queue.lock();
        state.attempts += 1;
        match result {
            Ok(answers) => {
                state.durable = watermark;
                state.last_failure = None;
                for job in jobs {
                    if let Some(tail) = state.tails.get_mut(&job.session) {
                        tail.revision = job.revision;
                        tail.row_written = true;
                    }
                }
                for (id, answer) in answers {
                    if let Ok(deleted) = &answer {
                        forget_deleted(&mut state, &deleted.sessions);
                    }
                    state.deleted_answers.insert(id, answer);
                }
            }
            Err(error) => {
                tracing::warn!(%error, sessions = jobs.len(), "group commit failed; its batches stay queued");
                for job in jobs {
                    let count = job.blocks.len();
                    if let Some(tail) = state.tails.get_mut(&job.session) {
                        // Back in front of anything admitted meanwhile: order is kept.
                        tail.pending.splice(0..0, job.blocks);
                        state.pending_blocks += count;
                    }
                }
                let failure = EngineError::from_engine(error);
                // A failed deletion deleted nothing; its caller is told, and may try again.
                for deletion in deletions {
                    state.deleted_answers.insert(
                        deletion.id,
                        Err(StoreError::CommitFailed {
                            source: failure.clone(),
                        }),
                    );
                }
                state.last_failure = Some(failure);
                state.paused = true;
                if shutting_down {
                    queue.wake_waiters.notify_all();
                    return;
                }
            }
        }
        queue.wake_waiters.notify_all();
    }
}

/// Drops what the writer knows of sessions a committed deletion removed: their tails, with any
/// blocks admitted to them since the commit began (they are discarded with the session), and
/// remembers them as deleted.
fn forget_deleted(state: &mut State, sessions: &[SessionId]) {
    for session in sessions {
        if let Some(tail) = state.tails.remove(session) {
            state.pending_blocks -= tail.pending.len().min(state.pending_blocks);
        }
        state.deleted.insert(*session);
    }
    if state.pending_blocks == 0 {
        // Every ticket issued is now durable or discarded: no flush may wait for a commit that
        // has nothing left to write.
        state.durable = state.next_ticket;
        state.first_pending_at = None;
    }
}

/// The answer to each deletion of a commit, by its id.
type Answers = Vec<(u64, Result<Deleted>)>;

/// One transaction: every job's blocks (adjacent small blocks merged up to the block limits), its
/// session row, and for a new child its `children` entry; then the deletions, after the blocks
/// (so blocks admitted to a session before its deletion are deleted with it); then one durable
/// commit.
fn commit(
    db: &Database,
    jobs: &[Job],
    deletions: &[DeleteJob],
    options: &StoreOptions,
    scratch: &mut Vec<u8>,
) -> std::result::Result<Answers, redb::Error> {
    let txn = db.begin_write()?;
    {
        let mut events = txn.open_table(EVENTS)?;
        let mut sessions = txn.open_table(SESSIONS)?;
        let mut children = txn.open_table(CHILDREN)?;
        let id_of = |s: SessionId| s.as_u128();
        for job in jobs {
            let id = id_of(job.session);
            let mut i = 0;
            while i < job.blocks.len() {
                let first = &job.blocks[i];
                let mut j = i + 1;
                let mut count = first.count;
                let mut bytes = first.records.len();
                while j < job.blocks.len() {
                    let next = &job.blocks[j];
                    if (count + next.count) as usize > options.block_events
                        || bytes + next.records.len() > options.block_bytes
                    {
                        break;
                    }
                    count += next.count;
                    bytes += next.records.len();
                    j += 1;
                }
                scratch.clear();
                if j == i + 1 {
                    encode_block(count, first.digest, &first.records, scratch);
                } else {
                    let mut records = Vec::with_capacity(bytes);
                    for block in &job.blocks[i..j] {
                        records.extend_from_slice(&block.records);
                    }
                    encode_block(count, job.blocks[j - 1].digest, &records, scratch);
                }
                events.insert((id, first.first_seq), scratch.as_slice())?;
                i = j;
            }
            let last = job.blocks.last().expect("jobs have blocks");
            let record = SessionRecord {
                header: job.header.clone(),
                next_seq: last.first_seq + u64::from(last.count),
                head: last.digest,
                revision: job.revision,
            };
            sessions.insert(id, record.encode().as_slice())?;
            if let Some(header) = &job.new_header
                && let Some(parent) = header.parent
            {
                children.insert((id_of(parent), id), ())?;
            }
        }
    }
    let mut answers = Vec::with_capacity(deletions.len());
    for deletion in deletions {
        answers.push((deletion.id, delete_in(&txn, deletion)?));
    }
    txn.commit()?;
    Ok(answers)
}
