//! The checks after a kill: the store opens read-only and writable, verifies, holds every
//! acknowledged event byte for byte, nothing the writer did not write, and every fork's prefix.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use lineage_log::{Chain, Digest, Event, EventBody, SessionId, SessionLineage, encode_record};
use lineage_store::{SessionInfo, Store};

use crate::model::{ForkFact, Known, Model};
use crate::report::digest_of_record;

/// One thing found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// A short class: `read-only open`, `read-only read`, `unopenable`, `verify`, `lost`,
    /// `altered`, `unexpected`, `fork`, `read-only view`, `store error` (and from the harness:
    /// `writer`, `report`, `hang`).
    pub kind: &'static str,
    /// What exactly, naming the session and seq.
    pub what: String,
}

/// What one check found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Everything wrong.
    pub found: Vec<Found>,
    /// Acknowledged events of the last writer compared with the store.
    pub acknowledged: u64,
    /// Stored events compared in all (acknowledged, confirmed earlier, inherited, written without
    /// acknowledgement).
    pub compared: u64,
    /// Acknowledged events missing or different.
    pub lost: u64,
    /// Whether the store file did not open for writing.
    pub unopenable: bool,
    /// Whether there was no store file (a creation killed before it made one).
    pub no_file: bool,
    /// Forks checked.
    pub forks: u64,
    /// Sessions read.
    pub sessions: u64,
    /// Events stored that the writer described but was not acknowledged (durable all the same).
    pub unacknowledged: u64,
    /// Whether the read-only open said that the file awaits recovery by its next writer.
    pub awaiting_recovery: bool,
    /// Whether the store's content is wrong, so later cycles must start from a new file.
    pub damaged: bool,
}

impl Outcome {
    fn fail(&mut self, kind: &'static str, what: String) {
        if !matches!(kind, "read-only open" | "read-only read" | "read-only view") {
            self.damaged = true;
        }
        self.found.push(Found { kind, what });
    }
}

/// A session as read back.
struct Read {
    info: SessionInfo,
    digests: Vec<Digest>,
    /// `S(n - 1)` at each seed length `n` a child of this session needs.
    seed_digests: HashMap<u64, Digest>,
    /// For a child, its event at `seq == seed_len`.
    lineage: Option<Event>,
}

/// Checks the store at `path` against `model` after a kill, then makes `model` the store's
/// content (confirmed) for the next writer.
///
/// `opened` says whether the killed writer had opened the store: its file must then say that it
/// awaits recovery.
pub fn check(path: &Path, model: &mut Model, opened: bool) -> Outcome {
    let mut out = Outcome::default();
    if !path.exists() {
        out.no_file = true;
        let owed: u64 = model.sessions.values().map(|k| k.acknowledged).sum();
        if owed > 0 {
            out.lost += owed;
            out.fail(
                "lost",
                format!("the store file is gone, and with it {owed} acknowledged events"),
            );
        }
        model.sessions.clear();
        return out;
    }
    let reader_view = read_only_view(path, opened, &mut out);
    let store = match Store::open(path) {
        Ok(store) => store,
        Err(e) => {
            out.unopenable = true;
            out.fail("unopenable", format!("the writable open fails: {e}"));
            return out;
        }
    };
    for what in verify_failures(&store).unwrap_or_else(|e| vec![e]) {
        out.fail("verify", what);
    }
    let infos = match store.list() {
        Ok(infos) => infos,
        Err(e) => {
            out.fail("store error", format!("list fails: {e}"));
            return out;
        }
    };
    let read = read_all(&store, infos, &mut out);
    compare(model, &read, &mut out);
    check_forks(model, &read, &mut out);
    if let Some(view) = reader_view {
        let writer_view: BTreeMap<SessionId, (u64, Digest)> = read
            .iter()
            .map(|(id, r)| (*id, (r.info.len, r.info.head)))
            .collect();
        if view != writer_view {
            out.fail(
                "read-only view",
                format!(
                    "the read-only open saw {} sessions ({} events), the writable one {} ({} events)",
                    view.len(),
                    view.values().map(|v| v.0).sum::<u64>(),
                    writer_view.len(),
                    writer_view.values().map(|v| v.0).sum::<u64>()
                ),
            );
        }
    }
    if let Err(e) = store.close() {
        out.fail("store error", format!("close fails: {e}"));
    }
    out.sessions = read.len() as u64;
    confirm(model, read);
    out
}

/// Opens the store read-only and reads every session; `None` when it cannot.
fn read_only_view(
    path: &Path,
    opened: bool,
    out: &mut Outcome,
) -> Option<BTreeMap<SessionId, (u64, Digest)>> {
    let reader = match Store::open_read_only(path) {
        Ok(reader) => reader,
        Err(e) => {
            out.fail("read-only open", format!("the read-only open fails: {e}"));
            return None;
        }
    };
    out.awaiting_recovery = reader.awaits_recovery();
    if opened && !out.awaiting_recovery {
        out.fail(
            "read-only open",
            "the writer was killed with the store open, but the read-only open does not say \
             that the file awaits recovery"
                .into(),
        );
    }
    let infos = match reader.list() {
        Ok(infos) => infos,
        Err(e) => {
            out.fail("read-only read", format!("a read-only list fails: {e}"));
            return None;
        }
    };
    let mut view = BTreeMap::new();
    for info in infos {
        let id = info.header.id;
        match reader.read_from(id, 0) {
            Ok(events) if events.len() as u64 == info.len => {}
            Ok(events) => out.fail(
                "read-only read",
                format!(
                    "session {id}: the read-only open reads {} events, its row says {}",
                    events.len(),
                    info.len
                ),
            ),
            Err(e) => out.fail("read-only read", format!("session {id}: {e}")),
        }
        view.insert(id, (info.len, info.head));
    }
    Some(view)
}

/// Reads every stored session: the digest of each record, the running digest at the seed lengths
/// its children need, and checks that the records give the head digest of the session's row (so
/// the records re-encoded from the decoded events are the stored bytes).
fn read_all(
    store: &Store,
    infos: Vec<SessionInfo>,
    out: &mut Outcome,
) -> BTreeMap<SessionId, Read> {
    let mut needed: HashMap<SessionId, BTreeSet<u64>> = HashMap::new();
    for info in &infos {
        if let Some(parent) = info.header.parent {
            needed
                .entry(parent)
                .or_default()
                .insert(info.header.seed_len);
        }
    }
    let mut read = BTreeMap::new();
    for info in infos {
        let id = info.header.id;
        let events = match store.read_from(id, 0) {
            Ok(events) => events,
            Err(e) => {
                out.fail("store error", format!("session {id}: the read fails: {e}"));
                continue;
            }
        };
        let wanted = needed.remove(&id).unwrap_or_default();
        let mut seed_digests = HashMap::new();
        let mut chain = Chain::new();
        if wanted.contains(&0) {
            seed_digests.insert(0, chain.digest());
        }
        let mut digests = Vec::with_capacity(events.len());
        for event in &events {
            let record = encode_record(event);
            chain.update(&record);
            digests.push(digest_of_record(&record));
            let n = event.seq + 1;
            if wanted.contains(&n) {
                seed_digests.insert(n, chain.digest());
            }
        }
        if let Some(what) = against_row(&info, events.len(), chain.digest()) {
            out.fail("store error", what);
        }
        let lineage = info
            .header
            .parent
            .and_then(|_| events.get(info.header.seed_len as usize).cloned());
        read.insert(
            id,
            Read {
                info,
                digests,
                seed_digests,
                lineage,
            },
        );
    }
    read
}

/// Every session the model knows against the store, and every stored session against the model.
fn compare(model: &Model, read: &BTreeMap<SessionId, Read>, out: &mut Outcome) {
    for (id, known) in &model.sessions {
        let Some(r) = read.get(id) else {
            let owed = match &known.fork {
                Some(ForkFact {
                    acknowledged: Some((seed_len, _)),
                    ..
                }) => known.acknowledged.max(seed_len + 1),
                _ => known.acknowledged,
            };
            if owed > 0 {
                out.lost += owed;
                out.fail(
                    "lost",
                    format!(
                        "session {id} is not in the store; seqs 0..={} were acknowledged",
                        owed - 1
                    ),
                );
            }
            continue;
        };
        // A child's prefix and `session/lineage` are checked against its parent in check_forks.
        let inherited = if r.info.header.parent.is_some() && known.confirmed.is_empty() {
            r.info.header.seed_len + 1
        } else {
            0
        };
        let stored = &r.digests;
        let (mut missing, mut altered): (Vec<u64>, Vec<u64>) = (Vec::new(), Vec::new());
        let mut unwritten = Vec::new();
        let mut differs = Vec::new();
        let end = (stored.len() as u64).max(known.acknowledged);
        for seq in 0..end {
            let acknowledged = seq < known.acknowledged;
            let from_writer = seq as usize >= known.confirmed.len();
            if acknowledged && from_writer {
                out.acknowledged += 1;
            }
            if seq < inherited {
                continue;
            }
            let expected = if from_writer {
                known.described.get(&seq)
            } else {
                known.confirmed.get(seq as usize)
            };
            let Some(actual) = stored.get(seq as usize) else {
                missing.push(seq);
                continue;
            };
            out.compared += 1;
            match expected {
                Some(expected) if expected == actual => {
                    if !acknowledged {
                        out.unacknowledged += 1;
                    }
                }
                Some(_) if acknowledged => altered.push(seq),
                Some(_) => differs.push(seq),
                None => unwritten.push(seq),
            }
        }
        let held = format!(
            "; the store holds {}, {} were acknowledged",
            stored.len(),
            known.acknowledged
        );
        // Each finding: its kind, whether its seqs count as lost, the seqs, what they are, and
        // what follows their list.
        let findings = [
            (
                "lost",
                true,
                missing,
                "acknowledged events are missing",
                &*held,
            ),
            (
                "altered",
                true,
                altered,
                "acknowledged events differ from what was written",
                "",
            ),
            (
                "altered",
                false,
                differs,
                "stored events differ from what the writer admitted",
                "",
            ),
            (
                "unexpected",
                false,
                unwritten,
                "stored events were never written by the writer",
                "",
            ),
        ];
        for (kind, lost, found, what, more) in findings {
            if found.is_empty() {
                continue;
            }
            if lost {
                out.lost += found.len() as u64;
            }
            let n = found.len();
            out.fail(
                kind,
                format!("session {id}: {n} {what} ({}){more}", seqs(&found)),
            );
        }
    }
    for id in read.keys() {
        if !model.sessions.contains_key(id) {
            out.fail(
                "unexpected",
                format!("session {id} is stored but no writer created or forked it"),
            );
        }
    }
}

/// Every stored child: its inherited prefix is its parent's, byte for byte, its seed digest is the
/// parent's running digest at the boundary, its `session/lineage` says so, and it is the fork the
/// writer asked for and was acknowledged.
fn check_forks(model: &Model, read: &BTreeMap<SessionId, Read>, out: &mut Outcome) {
    for (id, r) in read {
        let header = &r.info.header;
        let Some(parent) = header.parent else {
            continue;
        };
        out.forks += 1;
        let seed_len = header.seed_len;
        let mut wrong = Vec::new();
        let fact = model.sessions.get(id).and_then(|k| k.fork.as_ref());
        if let Some(fact) = fact {
            if fact.parent != parent {
                wrong.push(format!(
                    "its parent is {parent}, the fork was of {}",
                    fact.parent
                ));
            }
            if let Some(Some(boundary)) = fact.boundary
                && seed_len != boundary + 1
            {
                wrong.push(format!(
                    "seed_len is {seed_len}, the fork was at boundary {boundary}"
                ));
            }
            if let Some((acked_len, acked_digest)) = fact.acknowledged
                && (acked_len != seed_len || Some(acked_digest) != header.seed_digest)
            {
                wrong.push(format!(
                    "seed_len {seed_len} and digest {:?} differ from the acknowledged {acked_len} and {acked_digest}",
                    header.seed_digest
                ));
            }
        }
        match read.get(&parent) {
            None => wrong.push(format!("its parent {parent} is not stored")),
            Some(p) => {
                if p.digests.len() < seed_len as usize {
                    wrong.push(format!(
                        "it inherits {seed_len} events, its parent holds {}",
                        p.digests.len()
                    ));
                } else if r.digests.len() <= seed_len as usize {
                    wrong.push(format!(
                        "it holds {} events, fewer than its seed and session/lineage",
                        r.digests.len()
                    ));
                } else {
                    let inherited = &r.digests[..seed_len as usize];
                    out.compared += seed_len;
                    if let Some(seq) =
                        (0..seed_len as usize).find(|&i| inherited[i] != p.digests[i])
                    {
                        wrong.push(format!(
                            "inherited event at seq {seq} differs from its parent's"
                        ));
                    }
                }
                let computed = p.seed_digests.get(&seed_len).copied();
                if computed.is_none() || computed != header.seed_digest {
                    wrong.push(format!(
                        "seed digest {:?}, the parent's records up to seq {} give {computed:?}",
                        header.seed_digest,
                        seed_len as i64 - 1
                    ));
                }
                let expected = SessionLineage {
                    parent,
                    seed_len,
                    seed_digest: computed.unwrap_or(Digest::of_empty()),
                    delegation_depth: 0,
                };
                match &r.lineage {
                    Some(Event {
                        seq,
                        time_ms,
                        body: EventBody::SessionLineage(lineage),
                    }) if *seq == seed_len && **lineage == expected => {
                        if let Some(fact) = fact
                            && *time_ms != fact.time_ms as i64
                        {
                            wrong.push(format!(
                                "session/lineage is at time {time_ms}, the fork at {}",
                                fact.time_ms
                            ));
                        }
                    }
                    other => wrong.push(format!(
                        "the event at seq {seed_len} is not the expected session/lineage: {other:?}"
                    )),
                }
            }
        }
        if !wrong.is_empty() {
            out.fail(
                "fork",
                format!("fork {id} of {parent}: {}", wrong.join("; ")),
            );
        }
    }
}

/// The store's content becomes what the next writer's reports are checked against.
fn confirm(model: &mut Model, read: BTreeMap<SessionId, Read>) {
    let mut next = BTreeMap::new();
    for (id, r) in read {
        let fork = r.info.header.parent.map(|parent| {
            let time_ms = match &r.lineage {
                Some(event) => event.time_ms as u64,
                None => 0,
            };
            ForkFact {
                parent,
                boundary: None,
                time_ms: model
                    .sessions
                    .get(&id)
                    .and_then(|k| k.fork.as_ref())
                    .map_or(time_ms, |f| f.time_ms),
                acknowledged: r
                    .info
                    .header
                    .seed_digest
                    .map(|d| (r.info.header.seed_len, d)),
            }
        });
        next.insert(
            id,
            Known {
                acknowledged: r.digests.len() as u64,
                confirmed: r.digests,
                described: BTreeMap::new(),
                fork,
            },
        );
    }
    model.sessions = next;
}

/// What `verify` finds wrong in `store`: a line per failing session, `session <id>: <problems>`;
/// `Err` with the line to report when verify itself fails.
pub fn verify_failures(store: &Store) -> Result<Vec<String>, String> {
    let report = store.verify().map_err(|e| format!("verify fails: {e}"))?;
    Ok(report
        .failures()
        .map(|session| {
            let problems: Vec<String> = session.problems.iter().map(|p| p.to_string()).collect();
            format!("session {}: {}", session.session, problems.join("; "))
        })
        .collect())
}

/// How `read` events whose records give `digest` differ from the session's row, if they do: the
/// row's length and head digest say whether the records re-encoded from the decoded events are
/// the stored bytes.
pub fn against_row(info: &SessionInfo, read: usize, digest: Digest) -> Option<String> {
    (read as u64 != info.len || digest != info.head).then(|| {
        format!(
            "session {}: {read} events read whose records give {digest}, the row says {} events and {}",
            info.header.id, info.len, info.head
        )
    })
}

/// A short list of seqs: the first few and how many more.
pub fn seqs(seqs: &[u64]) -> String {
    if seqs.is_empty() {
        return "none".into();
    }
    let shown: Vec<String> = seqs.iter().take(5).map(u64::to_string).collect();
    if seqs.len() > 5 {
        format!("seqs {} and {} more", shown.join(", "), seqs.len() - 5)
    } else {
        format!("seqs {}", shown.join(", "))
    }
}
