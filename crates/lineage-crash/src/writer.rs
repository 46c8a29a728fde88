//! The writer process: works on a real store file in a seeded loop until it is killed, printing
//! each step before it takes it and each acknowledgement as the store gives it.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use lineage_log::{
    Event, EventBody, ForkSpec, Header, SessionId, TurnNo, interrupted_turn_closers,
};
use lineage_store::{Store, StoreOptions};
use lineage_testkit::{STREAM_T0 as T0, SplitMix64, TurnStream};

use crate::report::{Phase, Report, Write, record_digest};

/// How the parent starts a writer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriterArgs {
    /// The store file.
    pub store: PathBuf,
    /// The seed of every choice the writer makes.
    pub seed: u64,
    /// Stop right after opening the store, before writing anything, and wait to be killed.
    pub hold: bool,
    /// The store's commit window, in milliseconds.
    pub window_ms: u64,
    /// The most events in one stored block.
    pub block_events: usize,
    /// How many steps the writer takes before it waits to be killed.
    pub steps: u32,
}

/// At most this many sessions in one store; beyond it the writer creates no new one (it still
/// forks: the parent starts every cycle from a new file once the store is large).
const MAX_SESSIONS: usize = 24;
/// At most this many sessions worked on at once; a fork beyond it replaces one of them.
const MAX_WORKING: usize = 8;

/// Runs the writer; never returns. Exits 1 after reporting an error, 0 when its output is gone.
pub fn run(args: &WriterArgs) -> ! {
    let outcome = Writer::start(args).and_then(|mut w| w.work(args.steps).map(|()| w));
    match outcome {
        Ok(_open) => {
            // Killed with the store still open, as a writer with nothing to do would be.
            say(&Report::Phase(Phase::Done));
            hold()
        }
        Err(what) => {
            say(&Report::Error(what));
            std::process::exit(1)
        }
    }
}

/// Prints one report line and flushes it; exits quietly when the parent stopped reading.
fn say(report: &Report) {
    let mut line = report.to_string();
    line.push('\n');
    let mut out = std::io::stdout().lock();
    if out
        .write_all(line.as_bytes())
        .and_then(|()| out.flush())
        .is_err()
    {
        std::process::exit(0);
    }
}

/// Waits to be killed.
fn hold() -> ! {
    loop {
        std::thread::park();
    }
}

fn digests(events: &[Event]) -> Vec<lineage_log::Digest> {
    events.iter().map(record_digest).collect()
}

/// What the writer knows of a session it works on.
struct Live {
    id: SessionId,
    next_seq: u64,
    last_turn: TurnNo,
    /// The events of the open turn, from its `turn/start`; empty when no turn is open.
    tail: Vec<Event>,
    /// Seqs after which no turn is open (where a fork may cut), with the last turn then.
    boundaries: Vec<(u64, TurnNo)>,
    stream: TurnStream,
    /// The last seq admitted and not yet reported durable.
    admitted: Option<u64>,
}

impl Live {
    fn new(id: SessionId, seed: u64) -> Live {
        Live {
            id,
            next_seq: 0,
            last_turn: 0,
            tail: Vec::new(),
            boundaries: Vec::new(),
            stream: TurnStream::new(seed, 0, 1),
            admitted: None,
        }
    }

    /// A session whose balanced log is `events`.
    fn of_log(id: SessionId, events: &[Event], seed: u64) -> Live {
        let mut live = Live::new(id, seed);
        live.note(events);
        live.stream = TurnStream::new(seed, live.next_seq, live.last_turn + 1);
        live
    }

    /// Follows the log through `events`, which continue it.
    fn note(&mut self, events: &[Event]) {
        for event in events {
            match &event.body {
                EventBody::TurnStart(t) => {
                    self.last_turn = t.turn;
                    self.tail = vec![event.clone()];
                }
                EventBody::TurnEnd(_) => self.tail.clear(),
                _ if !self.tail.is_empty() => self.tail.push(event.clone()),
                _ => {}
            }
            if self.tail.is_empty() {
                self.boundaries.push((event.seq, self.last_turn));
            }
            self.next_seq = event.seq + 1;
        }
    }

    /// Everything written to the session is durable: reported so.
    fn all_durable(&mut self) {
        self.admitted = None;
        say(&Report::Durable {
            session: self.id,
            through: self.next_seq - 1,
        });
    }

    /// What was admitted and not yet reported durable is durable now: reported so.
    fn report_durable(&mut self) {
        if let Some(through) = self.admitted.take() {
            say(&Report::Durable {
                session: self.id,
                through,
            });
        }
    }
}

/// The next batch of `stream`: now and then the rest of the open turn, else 1 to 3 or 4 to 60
/// events, so that turns are often left open across batches.
pub fn next_batch(rng: &mut SplitMix64, stream: &mut TurnStream) -> Vec<Event> {
    let roll = rng.below(100);
    if roll < 15 {
        stream.rest_of_turn()
    } else if roll < 45 {
        stream.take(rng.between(1, 3) as usize)
    } else {
        stream.take(rng.between(4, 60) as usize)
    }
}

struct Writer {
    store: Store,
    rng: SplitMix64,
    live: Vec<Live>,
    sessions: usize,
}

impl Writer {
    fn start(args: &WriterArgs) -> Result<Writer, String> {
        let mut rng = SplitMix64::new(args.seed);
        let exists = args.store.exists();
        say(&Report::Phase(if exists {
            Phase::Opening
        } else {
            Phase::Creating
        }));
        let options = StoreOptions {
            commit_window: Duration::from_millis(args.window_ms),
            block_events: args.block_events,
            ..StoreOptions::default()
        };
        let store = Store::open_with(&args.store, options)
            .map_err(|e| format!("open {}: {e}", args.store.display()))?;
        say(&Report::Phase(Phase::Opened));
        if args.hold {
            hold();
        }
        let mut stored: Vec<SessionId> = store
            .list()
            .map_err(|e| format!("list: {e}"))?
            .into_iter()
            .map(|info| info.header.id)
            .collect();
        let sessions = stored.len();
        // A few stored sessions, chosen at random, each loaded with repair before it is used.
        for i in (1..stored.len()).rev() {
            stored.swap(i, rng.below(i as u64 + 1) as usize);
        }
        stored.truncate(rng.between(1, 3) as usize);
        let mut writer = Writer {
            store,
            rng,
            live: Vec::new(),
            sessions,
        };
        for id in stored {
            writer.resume(id)?;
        }
        while writer.live.len() < 2 {
            writer.create()?;
        }
        Ok(writer)
    }

    /// Loads a stored session with repair: the closers it will write are announced first.
    fn resume(&mut self, id: SessionId) -> Result<(), String> {
        let seen = self
            .store
            .inspect(id)
            .map_err(|e| format!("inspect session {id}: {e}"))?;
        let stored = seen.events.len() - seen.closers;
        say(&Report::Events {
            write: Write::Repair,
            session: id,
            first: stored as u64,
            digests: digests(&seen.events[stored..]),
        });
        let loaded = self
            .store
            .load(id)
            .map_err(|e| format!("load session {id}: {e}"))?;
        if loaded.events != seen.events {
            return Err(format!(
                "load of session {id} returned {} events ({} closers), inspect {} ({} closers)",
                loaded.events.len(),
                loaded.closers,
                seen.events.len(),
                seen.closers
            ));
        }
        say(&Report::Durable {
            session: id,
            through: loaded.events.len() as u64 - 1,
        });
        let seed = self.rng.next_u64();
        self.live.push(Live::of_log(id, &loaded.events, seed));
        Ok(())
    }

    fn create(&mut self) -> Result<(), String> {
        let id = SessionId::new();
        say(&Report::Create(id));
        self.store
            .create(Header::new(id, T0 as u64).with_cwd("/work/project"))
            .map_err(|e| format!("create session {id}: {e}"))?;
        let seed = self.rng.next_u64();
        self.live.push(Live::new(id, seed));
        self.sessions += 1;
        Ok(())
    }

    fn work(&mut self, steps: u32) -> Result<(), String> {
        for _ in 0..steps {
            let room = self.sessions < MAX_SESSIONS && self.live.len() < MAX_WORKING;
            let weights = [
                40,                  // append
                15,                  // admit
                20,                  // group commit
                8,                   // fork
                7,                   // reload with repair
                7,                   // flush one session
                3 * u32::from(room), // new session
            ];
            let at = self.rng.below(self.live.len() as u64) as usize;
            match self.rng.weighted(&weights) {
                Some(0) => self.write(at, Write::Append)?,
                Some(1) => self.write(at, Write::Admit)?,
                Some(2) => self.group()?,
                Some(3) => self.fork(at)?,
                Some(4) => self.reload(at)?,
                Some(5) => self.flush(at)?,
                Some(6) => self.create()?,
                _ => {}
            }
        }
        Ok(())
    }

    /// Appends (admitted and flushed at once) or admits (made durable by the commit window or a
    /// later flush) the next batch of session `at`, announced first.
    fn write(&mut self, at: usize, write: Write) -> Result<(), String> {
        let batch = next_batch(&mut self.rng, &mut self.live[at].stream);
        let live = &mut self.live[at];
        let (id, first) = (live.id, live.next_seq);
        say(&Report::Events {
            write,
            session: id,
            first,
            digests: digests(&batch),
        });
        let written = match write {
            Write::Append => self.store.append(id, &batch),
            _ => self.store.admit(id, &batch),
        };
        written.map_err(|e| format!("{} seqs {first}.. to session {id}: {e}", write.word()))?;
        live.note(&batch);
        match write {
            Write::Append => live.all_durable(),
            _ => live.admitted = Some(live.next_seq - 1),
        }
        Ok(())
    }

    /// Admits batches to several sessions, then waits for the commit they share.
    fn group(&mut self) -> Result<(), String> {
        for _ in 0..self.rng.between(2, 4) {
            let at = self.rng.below(self.live.len() as u64) as usize;
            self.write(at, Write::Admit)?;
        }
        say(&Report::Phase(Phase::Flush));
        self.store
            .flush_all()
            .map_err(|e| format!("flush of every session: {e}"))?;
        for live in &mut self.live {
            live.report_durable();
        }
        Ok(())
    }

    fn flush(&mut self, at: usize) -> Result<(), String> {
        let live = &mut self.live[at];
        say(&Report::Phase(Phase::Flush));
        self.store
            .flush(live.id)
            .map_err(|e| format!("flush of session {}: {e}", live.id))?;
        live.report_durable();
        Ok(())
    }

    /// Forks a session whole (when no turn is open) or at an earlier turn boundary.
    fn fork(&mut self, at: usize) -> Result<(), String> {
        let whole = self.rng.percent(40);
        let pick = self.rng.next_u64();
        let parent = &self.live[at];
        if parent.next_seq == 0 {
            return Ok(());
        }
        let (boundary, last_turn) = if whole && parent.tail.is_empty() {
            (None, parent.last_turn)
        } else if parent.boundaries.is_empty() {
            return Ok(());
        } else {
            let n = parent.boundaries.len() as u64;
            let (b, turn) = parent.boundaries[((u128::from(pick) * u128::from(n)) >> 64) as usize];
            (Some(b), turn)
        };
        let seed_len = boundary.map_or(parent.next_seq, |b| b + 1);
        let child = SessionId::new();
        let time_ms = T0 as u64 + 3 * seed_len;
        let parent_id = parent.id;
        say(&Report::ForkStart {
            child,
            parent: parent_id,
            boundary,
            time_ms,
        });
        let spec = ForkSpec {
            child,
            boundary,
            time_ms,
            delegation_depth: 0,
            agent_preset: None,
        };
        let header = self.store.fork(parent_id, &spec).map_err(|e| {
            format!("fork of session {parent_id} at {boundary:?} into {child}: {e}")
        })?;
        let Some(seed_digest) = header.seed_digest else {
            return Err(format!(
                "fork {child} of {parent_id}: the header has no seed digest"
            ));
        };
        if header.seed_len != seed_len {
            return Err(format!(
                "fork {child} of {parent_id} at {boundary:?}: seed_len {} instead of {seed_len}",
                header.seed_len
            ));
        }
        say(&Report::Fork {
            child,
            parent: parent_id,
            seed_len,
            seed_digest,
        });
        let seed = self.rng.next_u64();
        let parent = &self.live[at];
        let mut boundaries: Vec<(u64, TurnNo)> = parent
            .boundaries
            .iter()
            .copied()
            .filter(|(b, _)| *b < seed_len)
            .collect();
        boundaries.push((seed_len, last_turn));
        if self.live.len() >= MAX_WORKING {
            // The writer stops working on one session (what it admitted there stays admitted).
            let out = self.rng.below(self.live.len() as u64) as usize;
            self.live.swap_remove(out);
        }
        self.live.push(Live {
            id: child,
            next_seq: seed_len + 1,
            last_turn,
            tail: Vec::new(),
            boundaries,
            stream: TurnStream::new(seed, seed_len + 1, last_turn + 1),
            admitted: None,
        });
        self.sessions += 1;
        Ok(())
    }

    /// Loads a session with repair as a restarted agent would: an open turn is closed, and the
    /// writer goes on with the next turn.
    fn reload(&mut self, at: usize) -> Result<(), String> {
        let seed = self.rng.next_u64();
        let live = &mut self.live[at];
        if live.next_seq == 0 {
            return Ok(());
        }
        let id = live.id;
        let closers = interrupted_turn_closers(&live.tail);
        say(&Report::Events {
            write: Write::Repair,
            session: id,
            first: live.next_seq,
            digests: digests(&closers),
        });
        let loaded = self
            .store
            .load(id)
            .map_err(|e| format!("load session {id}: {e}"))?;
        let mine = live.next_seq as usize;
        if loaded.closers != closers.len()
            || loaded.events.len() != mine + closers.len()
            || loaded.events[mine..] != closers[..]
        {
            return Err(format!(
                "load of session {id} returned {} events ending in {} closers; the writer wrote {mine} and expected {} closers",
                loaded.events.len(),
                loaded.closers,
                closers.len()
            ));
        }
        live.note(&closers);
        live.stream = TurnStream::new(seed, live.next_seq, live.last_turn + 1);
        live.all_durable();
        Ok(())
    }
}
