//! The workload of one plan: threads appending realistic turns to sessions of their own, each
//! keeping a ledger of what it admitted and what the store acknowledged, and judging every error
//! the store returns against the contract of a failed commit.
//!
//! The contract: after a failed commit the admitted batches stay queued and are committed once
//! storage works. `append`, `flush` and `flush_all` return `Ok` only when every batch admitted
//! before the call is durable, else `CommitFailed`, whose `not_durable` names, per session, the
//! admitted events the call waited for that are not yet durable (from the first such event to the
//! last admitted). So a session the call waited for and that is not named is durable through its
//! last admitted event, and a named one is durable up to where its range starts.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lineage_log::{Event, Header, SessionId};
use lineage_store::{NotDurable, Store, StoreError};
use lineage_testkit::{STREAM_T0, SplitMix64, TurnStream};

use super::backend::Switch;
use crate::writer::next_batch;

/// What one session's thread admitted and what the store acknowledged.
pub struct Ledger {
    pub id: SessionId,
    stream: TurnStream,
    /// Every admitted event in seq order (`admitted[i].seq == i`): batches the store took, and
    /// a batch it may have taken (an `append` that failed in a way that does not say).
    pub admitted: Vec<Event>,
    /// The batches admitted, as seq ranges.
    pub batches: Vec<Range<u64>>,
    /// Every event below this seq is acknowledged: durable by the store's word.
    pub acked: u64,
    /// A batch whose admission failed with nothing taken: admitted again before anything new.
    held: Option<Vec<Event>>,
    /// The store refused the session (its write or an admission): nothing more is written to it,
    /// and nothing more of it is acknowledged.
    pub refused: bool,
}

impl Ledger {
    fn new(id: SessionId, seed: u64) -> Ledger {
        Ledger {
            id,
            stream: TurnStream::new(seed, 0, 1),
            admitted: Vec::new(),
            batches: Vec::new(),
            acked: 0,
            held: None,
            refused: false,
        }
    }

    /// The seq after the last admitted event.
    pub fn end(&self) -> u64 {
        self.admitted.len() as u64
    }

    /// Records a batch the store took.
    fn take(&mut self, batch: Vec<Event>) {
        let first = self.end();
        self.batches.push(first..first + batch.len() as u64);
        self.admitted.extend(batch);
    }

    /// Everything admitted is acknowledged.
    fn ack_all(&mut self) {
        if !self.refused {
            self.acked = self.end();
        }
    }
}

/// The store calls under way, so a supervisor can tell a hang: one slot per thread.
#[derive(Debug)]
pub struct Calls(Mutex<Vec<Option<(&'static str, Instant)>>>);

impl Calls {
    pub fn new(slots: usize) -> Calls {
        Calls(Mutex::new(vec![None; slots]))
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Vec<Option<(&'static str, Instant)>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `call` (named `what`) in `slot`, marked as under way meanwhile.
    pub fn during<T>(&self, slot: usize, what: &'static str, call: impl FnOnce() -> T) -> T {
        self.slots()[slot] = Some((what, Instant::now()));
        let result = call();
        self.slots()[slot] = None;
        result
    }

    /// The longest call under way for more than `limit`, with how long it has run.
    pub fn overdue(&self, limit: Duration) -> Option<(&'static str, Duration)> {
        self.slots()
            .iter()
            .flatten()
            .map(|(what, since)| (*what, since.elapsed()))
            .filter(|(_, ran)| *ran > limit)
            .max_by_key(|(_, ran)| *ran)
    }
}

/// Creates the sessions of every thread (before any fault: a creation reads the store).
pub fn create_sessions(store: &Store, sessions: &[usize]) -> Result<Vec<Vec<SessionId>>, String> {
    let mut all = Vec::new();
    for count in sessions {
        let mut own = Vec::new();
        for _ in 0..*count {
            let id = SessionId::new();
            store
                .create(Header::new(id, STREAM_T0 as u64).with_cwd("/work/project"))
                .map_err(|e| format!("create session {id}: {e}"))?;
            own.push(id);
        }
        all.push(own);
    }
    Ok(all)
}

/// What a thread found and counted.
#[derive(Debug, Default)]
pub struct Found {
    /// Everything the store did against its contract, as seen from the calls.
    pub problems: Vec<String>,
    /// Errors the store returned.
    pub errors: u64,
}

/// Which sessions a flush waited for.
#[derive(Clone, Copy)]
enum Scope {
    One(usize),
    All,
}

/// One writing thread.
pub struct Worker<'a> {
    pub slot: usize,
    pub store: &'a Store,
    pub switch: &'a Switch,
    pub calls: &'a Calls,
    /// Every session of the plan (a flush of every session may name other threads' sessions).
    pub known: &'a HashSet<SessionId>,
    rng: SplitMix64,
    pub ledgers: Vec<Ledger>,
    pub found: Found,
}

impl<'a> Worker<'a> {
    pub fn new(
        slot: usize,
        seed: u64,
        sessions: &[SessionId],
        store: &'a Store,
        switch: &'a Switch,
        calls: &'a Calls,
        known: &'a HashSet<SessionId>,
    ) -> Worker<'a> {
        let mut rng = SplitMix64::new(seed);
        let ledgers = sessions
            .iter()
            .map(|id| Ledger::new(*id, rng.next_u64()))
            .collect();
        Worker {
            slot,
            store,
            switch,
            calls,
            known,
            rng,
            ledgers,
            found: Found::default(),
        }
    }

    fn problem(&mut self, what: String) {
        self.found.problems.push(what);
    }

    /// A session still written to, chosen at random; `None` once the store refused them all.
    fn pick(&mut self) -> Option<usize> {
        let live: Vec<usize> = (0..self.ledgers.len())
            .filter(|s| !self.ledgers[*s].refused)
            .collect();
        let at = self.rng.below(live.len() as u64) as usize;
        live.get(at).copied()
    }

    /// The next batch of a session: the one the store did not take, or a new one of its stream.
    fn batch(&mut self, s: usize) -> Vec<Event> {
        if let Some(held) = self.ledgers[s].held.take() {
            return held;
        }
        next_batch(&mut self.rng, &mut self.ledgers[s].stream)
    }

    /// One step: an append; an admission left for the commit window or a later flush; an
    /// admission flushed with `flush(session)`; or admissions to several sessions flushed with
    /// `flush_all`, so batches share group commits (with other threads' too). Returns `false`
    /// once the thread has no session left to write.
    pub fn step(&mut self) -> bool {
        let Some(s) = self.pick() else {
            return false;
        };
        match self.rng.weighted(&[35, 20, 20, 25]) {
            Some(0) => self.append(s),
            Some(1) => {
                self.admit(s);
            }
            Some(2) => {
                if self.admit(s) {
                    self.flush(Scope::One(s));
                }
            }
            _ => {
                self.admit(s);
                for _ in 0..self.rng.below(3) {
                    if let Some(other) = self.pick() {
                        self.admit(other);
                    }
                }
                self.flush(Scope::All);
            }
        }
        true
    }

    /// Admits a batch to session `s`; returns whether the store took it.
    fn admit(&mut self, s: usize) -> bool {
        let batch = self.batch(s);
        let id = self.ledgers[s].id;
        let result = self
            .calls
            .during(self.slot, "admit", || self.store.admit(id, &batch));
        match result {
            Ok(()) => {
                self.ledgers[s].take(batch);
                true
            }
            Err(error) => {
                self.found.errors += 1;
                self.admission_failed(s, batch, error, "admit");
                false
            }
        }
    }

    /// What a failed admission means: refused (a failure of the store, which holds the session's
    /// log and should have taken a batch that continues it), or not taken because the admission
    /// read storage that fails (then it is admitted again later).
    fn admission_failed(&mut self, s: usize, batch: Vec<Event>, error: StoreError, call: &str) {
        let ledger = &mut self.ledgers[s];
        let (id, first) = (ledger.id, ledger.end());
        let seqs = first..first + batch.len() as u64;
        match error {
            StoreError::Storage(_) | StoreError::Unavailable { .. } if self.switch.armed() => {
                ledger.held = Some(batch);
            }
            error => {
                ledger.refused = true;
                self.problem(format!(
                    "{call} of seqs {}..{} to session {id}: refused: {error}",
                    seqs.start, seqs.end
                ));
            }
        }
    }

    fn append(&mut self, s: usize) {
        let batch = self.batch(s);
        let id = self.ledgers[s].id;
        let result = self
            .calls
            .during(self.slot, "append", || self.store.append(id, &batch));
        let Err(error) = result else {
            self.ledgers[s].take(batch);
            self.ledgers[s].ack_all();
            return;
        };
        self.found.errors += 1;
        match error {
            // The flush failed: the admission took the batch.
            StoreError::CommitFailed { not_durable, .. } => {
                self.ledgers[s].take(batch);
                self.judge_commit_failed(Scope::One(s), &not_durable, "append");
            }
            // From the admission (not taken) or from the flush reporting a refused write (taken,
            // then dropped): either way the store refused a batch that continues the log it holds.
            StoreError::SeqMismatch { .. } => {
                let first = self.ledgers[s].end();
                self.problem(format!(
                    "append of seqs {first}..{} to session {id}: refused: {error}",
                    first + batch.len() as u64
                ));
                // It may be stored, never acknowledged.
                self.ledgers[s].take(batch);
                self.ledgers[s].refused = true;
            }
            error => self.admission_failed(s, batch, error, "append"),
        }
    }

    fn flush(&mut self, scope: Scope) {
        let what = match scope {
            Scope::One(_) => "flush",
            Scope::All => "flush_all",
        };
        let result = self.calls.during(self.slot, what, || match scope {
            Scope::One(s) => self.store.flush(self.ledgers[s].id),
            Scope::All => self.store.flush_all(),
        });
        let Err(error) = result else {
            for s in self.covered(scope) {
                self.ledgers[s].ack_all();
            }
            return;
        };
        self.found.errors += 1;
        match error {
            StoreError::CommitFailed { not_durable, .. } => {
                self.judge_commit_failed(scope, &not_durable, what)
            }
            error => {
                // A refused write: the store dropped the session's tail.
                if let StoreError::SeqMismatch { session, .. } = &error
                    && let Some(ledger) = self.ledgers.iter_mut().find(|l| l.id == *session)
                {
                    ledger.refused = true;
                }
                self.problem(format!("{what}: an error other than CommitFailed: {error}"));
            }
        }
    }

    /// The thread's sessions a flush waited for.
    fn covered(&self, scope: Scope) -> Vec<usize> {
        match scope {
            Scope::One(s) => vec![s],
            Scope::All => (0..self.ledgers.len()).collect(),
        }
    }

    /// Checks a `CommitFailed`'s names against this thread's ledgers and advances what is
    /// acknowledged by them: a session the call waited for that is not named is durable through
    /// its last admitted event; a named one through the event before its range, which must end at
    /// the session's admitted end and start at or after its acknowledged end (what was
    /// acknowledged cannot become not durable again).
    fn judge_commit_failed(&mut self, scope: Scope, not_durable: &[NotDurable], call: &str) {
        for named in not_durable {
            if !self.known.contains(&named.session) {
                self.problem(format!(
                    "{call}: CommitFailed names session {}, which no thread created",
                    named.session
                ));
            }
            if let Scope::One(s) = scope
                && named.session != self.ledgers[s].id
            {
                self.problem(format!(
                    "{call} of session {}: CommitFailed names another session, {named}",
                    self.ledgers[s].id
                ));
            }
        }
        for s in self.covered(scope) {
            let ledger = &self.ledgers[s];
            if ledger.refused {
                continue;
            }
            let names: Vec<&NotDurable> = not_durable
                .iter()
                .filter(|n| n.session == ledger.id)
                .collect();
            let (id, end, acked) = (ledger.id, ledger.end(), ledger.acked);
            match names[..] {
                [] => self.ledgers[s].ack_all(),
                [named] => {
                    let seqs = named.seqs.clone();
                    if seqs.end != end || seqs.start < acked || seqs.start >= seqs.end {
                        self.problem(format!(
                            "{call}: CommitFailed names session {id} seqs {}..{}, but seqs \
                             0..{acked} were acknowledged and 0..{end} admitted",
                            seqs.start, seqs.end
                        ));
                    } else {
                        self.ledgers[s].acked = seqs.start;
                    }
                }
                _ => self.problem(format!(
                    "{call}: CommitFailed names session {id} {} times",
                    names.len()
                )),
            }
        }
    }

    /// Makes what this thread holds acknowledged known to `acks`, by session.
    pub fn publish(&self, acks: &Mutex<HashMap<SessionId, u64>>) {
        let mut acks = acks.lock().unwrap_or_else(|p| p.into_inner());
        for ledger in &self.ledgers {
            acks.insert(ledger.id, ledger.acked);
        }
    }

    /// After the workload: every admitted batch is acknowledged by a `flush_all` that returned
    /// `Ok` once every thread had stopped admitting.
    pub fn all_durable(&mut self) {
        for ledger in &mut self.ledgers {
            ledger.ack_all();
        }
    }
}
