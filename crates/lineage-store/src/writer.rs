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

use crate::delete::{DeleteJob, Deleted};
use crate::engine::{Engine, LeaseState, SessionWrite, Written};
use crate::error::EngineError;
use crate::fill::{OpenRun, Ratio, lay_out};
use crate::layout::{SessionRecord, encode_block};
use crate::{Result, StoreError, StoreOptions};

/// Admitted records of one session, not yet durable: a contiguous run ending at `digest`.
#[derive(Debug)]
pub(crate) struct PendingBlock {
    pub first_seq: u64,
    pub count: u32,
    pub records: Vec<u8>,
    /// The running digest at the block's last record.
    pub digest: Digest,
    /// The running digest before its first record, from which the writer hashes its records
    /// again wherever it cuts them into stored blocks.
    pub start: Chain,
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
    /// Whether its blocks are written as they are, never merged (a copied session keeps its
    /// source's blocks byte for byte).
    pub verbatim: bool,
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
    /// Sessions whose write a commit refused, with why: their batches up to the ticket were
    /// dropped, and their flushes report it.
    pub refused: HashMap<SessionId, Refused>,
    /// The fencing token of each lease this store holds (see the `lease` module): every write of
    /// the session carries it.
    pub leases: HashMap<SessionId, crate::lease::Held>,
}

/// Why a committed round refused one session's write.
#[derive(Clone, Debug)]
pub(crate) struct Refused {
    /// The last ticket of the batches dropped with it.
    pub upto: u64,
    pub why: Refusal,
}

#[derive(Clone, Debug)]
pub(crate) enum Refusal {
    /// The stored log ended at `found` (`None`: no row), not where the batch began (`got`).
    Conflict {
        found: Option<u64>,
        got: u64,
    },
    /// The session's lease forbade the write: `ours` is the token the write carried (`None`:
    /// it held no lease), `lease` the lease as it stood.
    Fenced {
        ours: Option<u64>,
        lease: Option<LeaseState>,
    },
    Failed(EngineError),
}

impl Refused {
    pub fn error(&self, session: SessionId) -> StoreError {
        match &self.why {
            // Another writer got there first: the batch continued an older end of the log.
            Refusal::Conflict { found, got } => StoreError::SeqMismatch {
                session,
                index: 0,
                expected: found.unwrap_or(0),
                got: *got,
            },
            Refusal::Fenced { ours, lease } => StoreError::Fenced {
                session,
                fence: *ours,
                holder: lease.as_ref().and_then(|l| l.holder),
                current: lease.as_ref().map(|l| l.fence),
            },
            Refusal::Failed(source) => StoreError::CommitFailed {
                source: source.clone(),
                not_durable: Vec::new(),
            },
        }
    }
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

    /// Waits until every batch with a ticket at or below `target` is durable: `session`'s, or
    /// every session's for `None`. A batch a commit refused is reported.
    pub fn wait_durable(
        &self,
        mut state: MutexGuard<'_, State>,
        session: Option<SessionId>,
        target: u64,
    ) -> Result<()> {
        let start_durable = state.durable;
        let start_attempts = state.attempts;
        let mut asked = false;
        loop {
            let refused = match session {
                // Ticket 0 is a tail with nothing admitted (one read again after a refusal).
                Some(session) => state
                    .refused
                    .get(&session)
                    .filter(|r| target > 0 && r.upto >= target)
                    .map(|r| r.error(session)),
                None => state
                    .refused
                    .iter()
                    .find(|(_, r)| r.upto > start_durable && r.upto <= target)
                    .map(|(session, r)| r.error(*session)),
            };
            if let Some(error) = refused {
                return Err(error);
            }
            if state.durable >= target {
                return Ok(());
            }
            if !asked {
                asked = true;
                state.flush_requested = true;
                state.paused = false;
                self.wake_writer.notify_one();
            }
            if state.attempts > start_attempts
                && let Some(failure) = &state.last_failure
            {
                return Err(StoreError::CommitFailed {
                    source: failure.clone(),
                    not_durable: Vec::new(),
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
    /// Whether the session has no row yet: the commit writes its header too.
    new: bool,
    header: Header,
    revision: u64,
    blocks: Vec<PendingBlock>,
    /// The session's last ticket when the job was taken.
    last_ticket: u64,
    verbatim: bool,
    /// The token of the lease held on the session when the job was taken.
    fence: Option<u64>,
}

impl Job {
    /// The job as the engine writes it, after the session's open run `open`: its records laid out
    /// in full blocks (or, copied verbatim, as they came), and the session's new row. Also the
    /// open run once the write applies.
    fn write(
        &self,
        options: &StoreOptions,
        open: Option<&OpenRun>,
        ratio: &mut Ratio,
    ) -> (SessionWrite, Option<OpenRun>) {
        let (blocks, replaced, open) = if self.verbatim {
            let blocks = self
                .blocks
                .iter()
                .map(|block| {
                    let mut value = Vec::new();
                    encode_block(block.count, block.digest, &block.records, &mut value);
                    (block.first_seq, value)
                })
                .collect();
            (blocks, Vec::new(), None)
        } else {
            let layout = lay_out(open, &self.blocks, options, ratio);
            (layout.blocks, layout.replaced, layout.open)
        };
        let last = self.blocks.last().expect("jobs have blocks");
        let row = SessionRecord {
            header: self.header.clone(),
            next_seq: last.first_seq + u64::from(last.count),
            head: last.digest,
            revision: self.revision,
        };
        let write = SessionWrite {
            session: self.session,
            new: self.new,
            parent: self.header.parent,
            expected: self.blocks[0].first_seq,
            row: row.encode(),
            blocks,
            replaced,
            fence: self.fence,
        };
        (write, open)
    }
}

pub(crate) fn run(engine: Arc<dyn Engine>, queue: Arc<Queue>, options: StoreOptions) {
    struct Gone<'a>(&'a Queue);
    impl Drop for Gone<'_> {
        fn drop(&mut self) {
            let mut state = self.0.lock();
            state.writer_gone = true;
            self.0.wake_waiters.notify_all();
        }
    }
    let _gone = Gone(&queue);
    // Each session's open run (with the round that last wrote it), and how well records compress:
    // only this thread touches them.
    let mut open_runs: HashMap<SessionId, (u64, OpenRun)> = HashMap::new();
    let mut round = 0u64;
    let mut ratio = Ratio::default();
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
        round += 1;
        let mut jobs = Vec::new();
        let taken = &mut *state;
        for (session, tail) in taken.tails.iter_mut() {
            if tail.pending.is_empty() {
                continue;
            }
            jobs.push(Job {
                session: *session,
                new: !tail.row_written,
                header: tail.header.clone(),
                revision: tail.revision + 1,
                blocks: std::mem::take(&mut tail.pending),
                last_ticket: tail.last_ticket,
                verbatim: tail.verbatim,
                fence: taken.leases.get(session).map(|held| held.fence),
            });
        }
        let deletions = std::mem::take(&mut state.deletions);
        state.pending_blocks = 0;
        state.flush_requested = false;
        state.first_pending_at = None;
        let shutting_down = state.shutdown;
        drop(state);

        let (writes, mut opened): (Vec<SessionWrite>, Vec<Option<OpenRun>>) = jobs
            .iter()
            .map(|job| {
                let open = open_runs.get(&job.session).map(|(_, open)| open);
                job.write(&options, open, &mut ratio)
            })
            .unzip();
        let result = engine.commit(&writes, &deletions);
        drop(writes);
        if result.is_err() {
            // A redb handle is refused after an I/O failure: reopen before any retry.
            engine.recover();
        }

        let mut state = queue.lock();
        state.attempts += 1;
        match result {
            Ok(committed) => {
                state.durable = watermark;
                state.last_failure = None;
                for ((job, written), open) in
                    jobs.into_iter().zip(committed.writes).zip(opened.drain(..))
                {
                    // What the store holds of the session is known only after a write applied.
                    open_runs.remove(&job.session);
                    let why = match written {
                        Written::Applied => {
                            if let Some(open) = open {
                                keep_open(&mut open_runs, job.session, round, open);
                            }
                            if let Some(tail) = state.tails.get_mut(&job.session) {
                                tail.revision = job.revision;
                                tail.row_written = true;
                            }
                            continue;
                        }
                        Written::Conflict { found } => Refusal::Conflict {
                            found,
                            got: job.blocks[0].first_seq,
                        },
                        Written::Fenced { lease } => {
                            // The lease is lost for good: later writes are refused here at once.
                            if let Some(held) = state
                                .leases
                                .get_mut(&job.session)
                                .filter(|held| Some(held.fence) == job.fence)
                            {
                                held.lost = Some(lease.clone());
                            }
                            Refusal::Fenced {
                                ours: job.fence,
                                lease,
                            }
                        }
                        Written::Failed(error) => Refusal::Failed(error),
                    };
                    refuse(&mut state, job.session, job.last_ticket, why);
                }
                for (id, answer) in committed.deletions {
                    if let Ok(deleted) = &answer {
                        for session in &deleted.sessions {
                            open_runs.remove(session);
                        }
                        forget_deleted(&mut state, &deleted.sessions);
                    }
                    state.deleted_answers.insert(id, answer);
                }
                settle_if_idle(&mut state);
            }
            Err(failure) => {
                tracing::warn!(error = %failure, sessions = jobs.len(), "group commit failed; its batches stay queued");
                for job in jobs {
                    let count = job.blocks.len();
                    if let Some(tail) = state.tails.get_mut(&job.session) {
                        // Back in front of anything admitted meanwhile: order is kept.
                        tail.pending.splice(0..0, job.blocks);
                        state.pending_blocks += count;
                    }
                }
                // A failed deletion deleted nothing; its caller is told, and may try again.
                for deletion in deletions {
                    state.deleted_answers.insert(
                        deletion.id,
                        Err(StoreError::CommitFailed {
                            source: failure.clone(),
                            not_durable: Vec::new(),
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

/// The most open runs the writer keeps: each holds up to a block's records in memory. A session
/// whose run is dropped keeps its small blocks as they are.
const MAX_OPEN_RUNS: usize = 1024;

/// Keeps `session`'s open run, dropping the least recently written one beyond [`MAX_OPEN_RUNS`].
fn keep_open(
    open_runs: &mut HashMap<SessionId, (u64, OpenRun)>,
    session: SessionId,
    round: u64,
    open: OpenRun,
) {
    open_runs.insert(session, (round, open));
    if open_runs.len() > MAX_OPEN_RUNS
        && let Some(oldest) = open_runs
            .iter()
            .min_by_key(|(_, (written, _))| *written)
            .map(|(session, _)| *session)
    {
        open_runs.remove(&oldest);
    }
}

/// Forgets the tail of a session whose write a commit refused, with every batch admitted to it
/// since (each was validated against an end of the log the store does not hold), so the next
/// admission reads the session from the store again; its flushes up to `upto` report `why`.
pub(crate) fn refuse(state: &mut State, session: SessionId, upto: u64, why: Refusal) {
    let error = Refused { upto, why };
    tracing::warn!(%session, error = %error.error(session), "a commit refused the session's write; its admitted batches are dropped");
    let upto = match state.tails.remove(&session) {
        Some(tail) => {
            state.pending_blocks -= tail.pending.len().min(state.pending_blocks);
            tail.last_ticket.max(upto)
        }
        None => upto,
    };
    state.refused.insert(session, Refused { upto, ..error });
}

/// When nothing is left to write, every ticket issued is durable or was discarded: no flush may
/// wait for a commit that has nothing left to write.
fn settle_if_idle(state: &mut State) {
    if state.pending_blocks == 0 {
        state.durable = state.next_ticket;
        state.first_pending_at = None;
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
}
