//! What the parent knows a store must hold: per session, the events confirmed by earlier checks,
//! what the current writer said it would write, and what the store acknowledged to it.

use std::collections::BTreeMap;

use lineage_log::{Digest, SessionId};

use crate::report::Report;

/// A fork as the writer reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForkFact {
    /// The session forked.
    pub parent: SessionId,
    /// The boundary asked for (`None`: the whole parent). Unknown for forks confirmed earlier.
    pub boundary: Option<Option<u64>>,
    /// The child's creation time, also its `session/lineage` time.
    pub time_ms: u64,
    /// The seed length and digest the store acknowledged, if it did.
    pub acknowledged: Option<(u64, Digest)>,
}

/// One session.
#[derive(Clone, Debug, Default)]
pub struct Known {
    /// Digests of seqs `0..confirmed.len()`, stored at the last check.
    pub confirmed: Vec<Digest>,
    /// What the current writer described, by seq.
    pub described: BTreeMap<u64, Digest>,
    /// Every seq below this must be stored.
    pub acknowledged: u64,
    /// For a forked session, its fork.
    pub fork: Option<ForkFact>,
}

/// Every session the parent knows of.
#[derive(Clone, Debug, Default)]
pub struct Model {
    /// By id.
    pub sessions: BTreeMap<SessionId, Known>,
}

impl Model {
    /// Takes one report line of the current writer.
    pub fn apply(&mut self, report: &Report) {
        match report {
            Report::Phase(_) | Report::Error(_) => {}
            Report::Create(id) => {
                self.sessions.entry(*id).or_default();
            }
            Report::Events {
                session,
                first,
                digests,
                ..
            } => {
                let known = self.sessions.entry(*session).or_default();
                for (i, digest) in digests.iter().enumerate() {
                    known.described.insert(first + i as u64, *digest);
                }
            }
            Report::Durable { session, through } => {
                let known = self.sessions.entry(*session).or_default();
                known.acknowledged = known.acknowledged.max(through + 1);
            }
            Report::ForkStart {
                child,
                parent,
                boundary,
                time_ms,
            } => {
                self.sessions.entry(*child).or_default().fork = Some(ForkFact {
                    parent: *parent,
                    boundary: Some(*boundary),
                    time_ms: *time_ms,
                    acknowledged: None,
                });
            }
            Report::Fork {
                child,
                seed_len,
                seed_digest,
                ..
            } => {
                let known = self.sessions.entry(*child).or_default();
                if let Some(fork) = &mut known.fork {
                    fork.acknowledged = Some((*seed_len, *seed_digest));
                }
                known.acknowledged = known.acknowledged.max(seed_len + 1);
            }
        }
    }

    /// The events confirmed in every session.
    pub fn confirmed_events(&self) -> u64 {
        self.sessions
            .values()
            .map(|k| k.confirmed.len() as u64)
            .sum()
    }
}
