//! The check after a plan: the store file, reopened plainly (no faults), verifies, holds every
//! acknowledged event byte for byte, and nothing that was not admitted.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use lineage_log::{Chain, SessionId, encode_record};
use lineage_store::{SessionInfo, Store};

use super::workload::Ledger;
use crate::check::{against_row, seqs, verify_failures};

/// What the check found.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Acknowledged events compared with the store.
    pub compared: u64,
    /// Acknowledged events missing or different.
    pub lost: u64,
    /// Everything wrong.
    pub problems: Vec<String>,
}

/// Opens `path` with `Store::open` and checks it against every thread's ledgers, each with the
/// end of what is acknowledged to be in this file.
pub fn check(path: &Path, ledgers: &[(&Ledger, u64)]) -> Verdict {
    let mut out = Verdict::default();
    let owed = |(_, acked): &(&Ledger, u64)| *acked;
    let store = match Store::open(path) {
        Ok(store) => store,
        Err(e) => {
            out.lost = ledgers.iter().map(owed).sum();
            out.problems.push(format!(
                "the store file does not open again, and with it {} acknowledged events: {e}",
                out.lost
            ));
            return out;
        }
    };
    // verify's only allowed finding, an open tail turn, is not a problem in its report.
    match verify_failures(&store) {
        Ok(failures) => out
            .problems
            .extend(failures.iter().map(|what| format!("verify: {what}"))),
        Err(what) => out.problems.push(what),
    }
    let stored = match store.list() {
        Ok(infos) => infos,
        Err(e) => {
            out.problems.push(format!("list fails: {e}"));
            return out;
        }
    };
    let by_id: HashMap<SessionId, (&Ledger, u64)> = ledgers
        .iter()
        .map(|(l, acked)| (l.id, (*l, *acked)))
        .collect();
    let mut seen = BTreeMap::new();
    for info in stored {
        let id = info.header.id;
        let Some(&(ledger, acked)) = by_id.get(&id) else {
            out.problems
                .push(format!("session {id} is stored but no thread created it"));
            continue;
        };
        seen.insert(id, ());
        compare(&store, ledger, acked, &info, &mut out);
    }
    for (ledger, acked) in ledgers {
        if *acked > 0 && !seen.contains_key(&ledger.id) {
            out.lost += acked;
            out.problems.push(format!(
                "session {} is not stored; seqs 0..{acked} were acknowledged",
                ledger.id
            ));
        }
    }
    if let Err(e) = store.close() {
        out.problems.push(format!("close fails: {e}"));
    }
    out
}

/// One stored session against its ledger: the records read give the row's head digest (so what
/// is compared is the stored bytes), every acknowledged event is there as admitted, and every
/// other stored event is one that was admitted.
fn compare(store: &Store, ledger: &Ledger, acked: u64, info: &SessionInfo, out: &mut Verdict) {
    let id = ledger.id;
    let events = match store.read_from(id, 0) {
        Ok(events) => events,
        Err(e) => {
            out.lost += acked;
            out.problems
                .push(format!("session {id}: the read fails: {e}"));
            return;
        }
    };
    let mut chain = Chain::new();
    let records: Vec<Vec<u8>> = events.iter().map(encode_record).collect();
    for record in &records {
        chain.update(record);
    }
    out.problems
        .extend(against_row(info, events.len(), chain.digest()));
    let (mut missing, mut altered, mut strays) = (Vec::new(), Vec::new(), Vec::new());
    for seq in 0..acked.max(records.len() as u64) {
        let admitted = ledger.admitted.get(seq as usize).map(encode_record);
        let stored = records.get(seq as usize);
        let acknowledged = seq < acked;
        if acknowledged {
            out.compared += 1;
        }
        match (stored, admitted) {
            (None, _) => missing.push(seq),
            (Some(stored), Some(admitted)) if *stored == admitted => {}
            (Some(_), _) if acknowledged => altered.push(seq),
            (Some(_), _) => strays.push(seq),
        }
    }
    if !missing.is_empty() || !altered.is_empty() {
        out.lost += (missing.len() + altered.len()) as u64;
        out.problems.push(format!(
            "session {id}: {} acknowledged events missing ({}), {} different ({}); stored {}, \
             acknowledged {}, admitted {} in batches {}",
            missing.len(),
            seqs(&missing),
            altered.len(),
            seqs(&altered),
            records.len(),
            acked,
            ledger.end(),
            batches(&ledger.batches)
        ));
    }
    if !strays.is_empty() {
        out.problems.push(format!(
            "session {id}: {} stored events were not admitted as stored ({})",
            strays.len(),
            seqs(&strays)
        ));
    }
}

/// The last few batches, as seq ranges.
fn batches(batches: &[std::ops::Range<u64>]) -> String {
    let from = batches.len().saturating_sub(6);
    let shown: Vec<String> = batches[from..]
        .iter()
        .map(|b| format!("{}..{}", b.start, b.end))
        .collect();
    let more = if from > 0 { "…, " } else { "" };
    format!("{more}{}", shown.join(", "))
}
