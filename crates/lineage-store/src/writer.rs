//! The single writer: admission, group commit and flush.
//!
//! Callers admit batches (validated, encoded and digested in the caller's thread, then queued per
//! session). One writer thread commits every session's queued blocks in one transaction with one
//! fsync. A flush waits until everything admitted before it is durable.
//!
//! A failed commit puts its blocks back at the front of their queues, so order is kept, and
//! pauses the writer until the next admission or flush, which retries and reports. A commit that
//! failed at its commit point (the sync, the answer to `COMMIT`) may have landed all the same: the
//! round is then *in doubt*, and before anything else is committed the writer reads back what the
//! store holds ([`Engine::resolve`]). A round found in the store is finished as if its commit had
//! returned (its blocks leave the queues); one found absent is retried with whatever was admitted
//! since. A commit found absent may still land later (it was in flight on the old connection):
//! a retry whose write then meets a conflict reads the stored row back, and one the store already
//! ends with (same end, same head digest) is finished as committed. So a retry never refuses its
//! own earlier write, and nothing admitted is dropped because storage failed.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use lineage_log::{Chain, Digest, Header, SessionId, Structure};

use crate::delete::{DeleteJob, Deleted};
use crate::engine::{CommitError, Committed, Deletion, Engine, LeaseState, SessionWrite, Written};
use crate::error::{EngineError, NotDurable};
use crate::fill::{OpenRun, Ratio, lay_out};
use crate::layout::{SessionRecord, encode_block};
use crate::lease::{LeaseLoss, LeaseWatch, lose};
use crate::store::contained;
use crate::{EngineErrorKind, Result, StoreError, StoreOptions};

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
    /// The ticket of the batch it belongs to (set when it is queued).
    pub ticket: u64,
}

impl PendingBlock {
    /// The seq after its last record.
    fn end_seq(&self) -> u64 {
        self.first_seq + u64::from(self.count)
    }
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
    /// What the round being committed took of each session: its seqs and the ticket of its first
    /// block. Not durable until the round ends, though no longer queued.
    pub committing: HashMap<SessionId, (std::ops::Range<u64>, u64)>,
    /// Leases lost and not yet announced to the store's lease watchers (see
    /// [`Queue::announce_losses`]).
    pub losses: Vec<(SessionId, LeaseLoss)>,
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
    /// The session's lease (`fence`) lapsed: the database answered no renewal for `silent`.
    Lapsed {
        fence: u64,
        silent: std::time::Duration,
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
            Refusal::Lapsed { fence, silent } => StoreError::LeaseLapsed {
                session,
                fence: *fence,
                silent_ms: crate::lease::millis(*silent),
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
    /// Who hears of each lost lease (see `Store::watch_leases`).
    pub lease_watchers: Mutex<Vec<LeaseWatch>>,
}

impl Queue {
    pub fn new() -> Queue {
        Queue {
            state: Mutex::new(State::default()),
            wake_writer: Condvar::new(),
            wake_waiters: Condvar::new(),
            lease_watchers: Mutex::new(Vec::new()),
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

    /// Tells the lease watchers of every lease lost since the last call. Called with no lock
    /// held, so a watcher may call into the store.
    pub fn announce_losses(&self) {
        let losses = std::mem::take(&mut self.lock().losses);
        if losses.is_empty() {
            return;
        }
        let watchers = self
            .lease_watchers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for (session, loss) in losses {
            for watcher in &watchers {
                if let Err(panic) = contained(|| watcher(session, loss.clone())) {
                    tracing::error!(%session, panic, "a lease watcher panicked");
                }
            }
        }
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
        tail.pending.extend(
            blocks
                .into_iter()
                .map(|block| PendingBlock { ticket, ..block }),
        );
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
                    not_durable: not_durable(&state, session, target),
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

/// What of `session`'s (or, for `None`, every session's) batches up to ticket `target` is still
/// queued, by session: what a failed wait reports as not durable.
fn not_durable(state: &State, session: Option<SessionId>, target: u64) -> Vec<NotDurable> {
    let mut out: Vec<NotDurable> = state
        .tails
        .iter()
        .filter(|(id, _)| session.is_none_or(|s| s == **id))
        .filter_map(|(id, tail)| {
            // Taken by a round still under way, then queued: both ranges, in seq order.
            let committing = state
                .committing
                .get(id)
                .filter(|(_, ticket)| *ticket <= target)
                .map(|(seqs, _)| seqs.clone());
            let mut waited = tail.pending.iter().filter(|b| b.ticket <= target);
            let queued = waited
                .next()
                .map(|first| first.first_seq..waited.next_back().unwrap_or(first).end_seq());
            let seqs = match (committing, queued) {
                (Some(taken), Some(queued)) => taken.start..queued.end,
                (Some(seqs), None) | (None, Some(seqs)) => seqs,
                (None, None) => return None,
            };
            Some(NotDurable { session: *id, seqs })
        })
        .collect();
    out.sort_by_key(|n| n.session);
    out
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

/// What a round took of one session, kept until the round is settled.
struct Taken {
    session: SessionId,
    revision: u64,
    /// The first seq of its first block, and how many blocks it took.
    first_seq: u64,
    blocks: usize,
    last_ticket: u64,
    fence: Option<u64>,
    /// The session's open run once the write applies.
    open: Option<OpenRun>,
    /// Where the write leaves the log: the seq after its last event, and the running digest there.
    end: (u64, Digest),
    /// The revision of the stored row when a write refused as a conflict turned out to be in the
    /// store already (see [`Writer::recognise_stored`]).
    stored: Option<u64>,
}

/// A round whose commit failed at its commit point, not yet known to be in the store or not. Its
/// blocks are queued again in front of their sessions' queues meanwhile.
struct Doubt {
    round: u64,
    watermark: u64,
    taken: Vec<Taken>,
    writes: Vec<SessionWrite>,
    /// What the round did if it is in the store.
    committed: Committed,
}

/// The writer thread's own memory: each session's open run (with the round that last wrote it),
/// how well records compress, and a round in doubt. Only this thread touches it.
struct Writer {
    engine: Arc<dyn Engine>,
    queue: Arc<Queue>,
    options: StoreOptions,
    open_runs: HashMap<SessionId, (u64, OpenRun)>,
    round: u64,
    ratio: Ratio,
    doubt: Option<Doubt>,
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
    let mut writer = Writer {
        engine,
        queue: queue.clone(),
        options,
        open_runs: HashMap::new(),
        round: 0,
        ratio: Ratio::default(),
        doubt: None,
    };
    while writer.next_round() {
        queue.announce_losses();
    }
    queue.announce_losses();
}

impl Writer {
    /// Waits for work, then settles a round in doubt or commits one. Returns `false` once the
    /// writer is to stop.
    fn next_round(&mut self) -> bool {
        let queue = self.queue.clone();
        let mut state = queue.lock();
        loop {
            // At shutdown a paused queue gets one last attempt.
            let work = state.pending_blocks > 0 || !state.deletions.is_empty();
            let ready = work && (!state.paused || state.shutdown);
            if state.shutdown && !ready {
                return false;
            }
            if ready {
                // A deletion's caller waits for it, as a flush's does; a round in doubt is
                // settled before anything waits for the commit window.
                if state.flush_requested
                    || state.shutdown
                    || !state.deletions.is_empty()
                    || self.doubt.is_some()
                {
                    break;
                }
                let opened = *state.first_pending_at.get_or_insert_with(Instant::now);
                let deadline = opened + self.options.commit_window;
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
        let shutting_down = state.shutdown;
        drop(state);
        if let Some(mut doubt) = self.doubt.take() {
            let resolved = self.resolve(&mut doubt);
            let mut state = queue.lock();
            let settled = self.settle_doubt(&mut state, doubt, resolved);
            queue.wake_waiters.notify_all();
            if !settled {
                return !shutting_down;
            }
            if state.pending_blocks == 0 && state.deletions.is_empty() {
                return true;
            }
        }
        self.commit_round()
    }

    /// Takes every queued block and deletion and commits them as one round.
    fn commit_round(&mut self) -> bool {
        let queue = self.queue.clone();
        let mut state = queue.lock();
        let watermark = state.next_ticket;
        self.round += 1;
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
        state.committing = jobs
            .iter()
            .map(|job| {
                let (first, last) = (&job.blocks[0], &job.blocks[job.blocks.len() - 1]);
                (job.session, (first.first_seq..last.end_seq(), first.ticket))
            })
            .collect();
        let deletions = std::mem::take(&mut state.deletions);
        state.pending_blocks = 0;
        state.flush_requested = false;
        state.first_pending_at = None;
        let shutting_down = state.shutdown;
        drop(state);

        let mut writes = Vec::with_capacity(jobs.len());
        let mut taken = Vec::with_capacity(jobs.len());
        for job in &jobs {
            let last = &job.blocks[job.blocks.len() - 1];
            let open = self.open_runs.get(&job.session).map(|(_, open)| open);
            let (write, open) = job.write(&self.options, open, &mut self.ratio);
            writes.push(write);
            taken.push(Taken {
                session: job.session,
                revision: job.revision,
                first_seq: job.blocks[0].first_seq,
                blocks: job.blocks.len(),
                last_ticket: job.last_ticket,
                fence: job.fence,
                open,
                end: (last.end_seq(), last.digest),
                stored: None,
            });
        }
        let deleting: Vec<&dyn Deletion> = deletions.iter().map(|d| d as &dyn Deletion).collect();
        let result = self.engine.commit(&writes, &deleting);
        let failure = match result {
            Ok(committed) => {
                drop(writes);
                self.recognise_stored(&mut taken, &committed.writes);
                let mut state = queue.lock();
                state.committing.clear();
                state.attempts += 1;
                self.finish(&mut state, self.round, watermark, taken, committed, false);
                queue.wake_waiters.notify_all();
                return true;
            }
            Err(failure) => failure,
        };
        // A redb handle is refused after an I/O failure: reopen before any retry.
        self.engine.recover();
        let CommitError { error, in_doubt } = failure;
        tracing::warn!(%error, sessions = jobs.len(), in_doubt = in_doubt.is_some(), "group commit failed; its batches stay queued");
        let mut state = queue.lock();
        state.committing.clear();
        // Back in front of anything admitted meanwhile: order is kept.
        for job in jobs {
            let count = job.blocks.len();
            if let Some(tail) = state.tails.get_mut(&job.session) {
                tail.pending.splice(0..0, job.blocks);
                state.pending_blocks += count;
            }
        }
        // A deletion's caller is told at once; if its round turns out to be in the store, the
        // sessions it removed are forgotten then.
        for deletion in &deletions {
            let answer = Err(StoreError::CommitFailed {
                source: error.clone(),
                not_durable: Vec::new(),
            });
            state.deleted_answers.insert(deletion.id, answer);
        }
        let Some(committed) = in_doubt else {
            // Nothing of the round was committed.
            self.fail(&mut state, error);
            queue.wake_waiters.notify_all();
            return !shutting_down;
        };
        let mut doubt = Doubt {
            round: self.round,
            watermark,
            taken,
            writes,
            committed,
        };
        drop(state);
        // Storage that answers again at once settles the round now: a commit whose sync failed
        // after its write reached the store is then finished, not failed.
        let resolved = self.resolve(&mut doubt);
        let mut state = queue.lock();
        let landed = match resolved {
            Ok(true) => self.settle_doubt(&mut state, doubt, Ok(true)),
            Ok(false) => {
                self.fail(&mut state, error);
                false
            }
            Err(_) => {
                // The commit's own error says more than the failed read-back.
                self.doubt = Some(doubt);
                self.fail(&mut state, error);
                false
            }
        };
        queue.wake_waiters.notify_all();
        // At shutdown a round that failed was the last attempt: retrying storage that keeps
        // failing would hold the closing store forever.
        landed || !shutting_down
    }

    /// Asks the engine whether a round in doubt is in the store; if it is, its conflicts are
    /// read back as a committed round's are.
    fn resolve(&self, doubt: &mut Doubt) -> std::result::Result<bool, EngineError> {
        let resolved = contained(|| self.engine.resolve(&doubt.writes, &doubt.committed))
            .unwrap_or_else(|panic| {
                Err(EngineError::new(
                    EngineErrorKind::Corrupted,
                    format!("the storage engine panicked reading back a commit in doubt: {panic}"),
                ))
            });
        if let Ok(true) = resolved {
            self.recognise_stored(&mut doubt.taken, &doubt.committed.writes);
        }
        resolved
    }

    /// Finds, among the writes a committed round refused as conflicts, those whose end the store
    /// already holds, and marks them with the stored row's revision ([`Taken::stored`]).
    ///
    /// A commit whose answer was lost may land after its read-back found it absent (it was still
    /// in flight on the old connection): its retry then meets its own write as a conflict. The
    /// digest chain makes "the store ends with these events" checkable: a stored row whose next
    /// seq is the write's end and whose head is the digest the writer computed for the write's
    /// last event holds exactly the log this write would have left, so the write is durable. An
    /// identical write by another writer is indistinguishable, and equally correct. Anything else,
    /// or a row that cannot be read, stays a conflict.
    fn recognise_stored(&self, taken: &mut [Taken], written: &[Written]) {
        let mut candidates = taken
            .iter_mut()
            .zip(written)
            .filter(|(taken, written)| {
                matches!(written, Written::Conflict { found: Some(found) } if *found == taken.end.0)
            })
            .map(|(taken, _)| taken)
            .peekable();
        if candidates.peek().is_none() {
            return;
        }
        let view = match contained(|| self.engine.view()) {
            Ok(Ok(view)) => view,
            Ok(Err(error)) => {
                tracing::warn!(%error, "cannot read back sessions whose write met a conflict");
                return;
            }
            Err(panic) => {
                tracing::error!(panic, "the storage engine panicked opening a read view");
                return;
            }
        };
        for taken in candidates {
            let session = taken.session;
            let record = view.row(session).and_then(|row| {
                row.map(|row| SessionRecord::decode(session, &row))
                    .transpose()
            });
            match record {
                Ok(Some(record)) if (record.next_seq, record.head) == taken.end => {
                    tracing::info!(%session, next_seq = record.next_seq, "a write refused as a conflict is in the store already; it is finished");
                    taken.stored = Some(record.revision);
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%session, %error, "cannot read back a session whose write met a conflict");
                }
            }
        }
    }

    /// Acts on what reading back a round in doubt found. Returns whether it is settled.
    fn settle_doubt(
        &mut self,
        state: &mut State,
        doubt: Doubt,
        resolved: std::result::Result<bool, EngineError>,
    ) -> bool {
        match resolved {
            Ok(true) => {
                tracing::info!(
                    round = doubt.round,
                    "a commit reported failed is in the store; it is finished"
                );
                // Its blocks are the first of their queues (nothing else was committed since):
                // they leave them, as a committed round's did.
                for taken in &doubt.taken {
                    if let Some(tail) = state.tails.get_mut(&taken.session)
                        && tail.pending.first().map(|b| b.first_seq) == Some(taken.first_seq)
                        && tail.pending.len() >= taken.blocks
                    {
                        tail.pending.drain(..taken.blocks);
                        state.pending_blocks -= taken.blocks.min(state.pending_blocks);
                    }
                }
                state.attempts += 1;
                let watermark = doubt.watermark.max(state.durable);
                let Doubt {
                    round,
                    taken,
                    committed,
                    ..
                } = doubt;
                self.finish(state, round, watermark, taken, committed, true);
                // What was admitted after the round is still to commit.
                if state.pending_blocks > 0 {
                    state.flush_requested = true;
                }
                true
            }
            Ok(false) => {
                tracing::info!(
                    round = doubt.round,
                    "a commit in doubt is not in the store; its batches are committed again"
                );
                true
            }
            Err(error) => {
                self.doubt = Some(doubt);
                self.fail(state, error);
                false
            }
        }
    }

    /// Records a failed attempt: its waiters are told, and the writer pauses until the next
    /// admission or flush.
    fn fail(&self, state: &mut State, error: EngineError) {
        state.attempts += 1;
        state.last_failure = Some(error);
        state.paused = true;
    }

    /// Finishes a round that is in the store: every batch up to `watermark` is durable but those
    /// a write refused, each session's tail and open run follow what was written, and deletions
    /// are answered (unless the round was `in_doubt`: their callers were answered then).
    fn finish(
        &mut self,
        state: &mut State,
        round: u64,
        watermark: u64,
        taken: Vec<Taken>,
        committed: Committed,
        in_doubt: bool,
    ) {
        state.durable = state.durable.max(watermark);
        state.last_failure = None;
        for (taken, written) in taken.into_iter().zip(committed.writes) {
            // What the store holds of the session is known only after a write applied.
            self.open_runs.remove(&taken.session);
            let why = match written {
                Written::Applied => {
                    // A round read back from doubt holds this write's events, but perhaps laid
                    // out by an earlier attempt that landed late (its commit still in flight when
                    // a read-back found it absent): an open run rewrites stored blocks by key,
                    // so only a write known to have applied as laid out here keeps its run open.
                    if let Some(open) = taken.open.filter(|_| !in_doubt) {
                        keep_open(&mut self.open_runs, taken.session, round, open);
                    }
                    if let Some(tail) = state.tails.get_mut(&taken.session) {
                        tail.revision = taken.revision;
                        tail.row_written = true;
                    }
                    continue;
                }
                // The store ends with this write's events: durable, as if applied. The blocks
                // holding them were laid out by whichever write landed, not necessarily as
                // `taken.open` says, and an open run rewrites stored blocks by key, so the
                // session's open blocks count as closed: the next write starts a new block after
                // them (its open run was removed above).
                Written::Conflict { found } => match taken.stored {
                    Some(revision) => {
                        if let Some(tail) = state.tails.get_mut(&taken.session) {
                            tail.revision = revision;
                            tail.row_written = true;
                        }
                        continue;
                    }
                    None => Refusal::Conflict {
                        found,
                        got: taken.first_seq,
                    },
                },
                Written::Fenced { lease } => {
                    // The lease is lost for good: later writes are refused here at once.
                    if let Some(fence) = taken.fence {
                        let loss = LeaseLoss::Refused {
                            lease: lease.clone(),
                        };
                        lose(state, taken.session, fence, loss);
                    }
                    Refusal::Fenced {
                        ours: taken.fence,
                        lease,
                    }
                }
                Written::Failed(error) => Refusal::Failed(error),
            };
            refuse(state, taken.session, taken.last_ticket, why);
        }
        for (id, answer) in committed.deletions {
            if let Ok(deleted) = &answer {
                for session in &deleted.sessions {
                    self.open_runs.remove(session);
                }
                forget_deleted(state, &deleted.sessions);
            }
            // A round settled after a failure told its deletions' callers of it at the time.
            if !in_doubt {
                state.deleted_answers.insert(id, answer);
            }
        }
        settle_if_idle(state);
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
