//! Forking a session at a turn boundary.

use crate::rules::{check_seed, last_turn_marker, resolve_fork_boundary};
use crate::{
    Chain, Encoder, Event, EventBody, EventKind, Header, LogError, Origin, SessionId,
    SessionLineage, Text,
};

/// How to create a fork's child.
#[derive(Clone, Debug)]
pub struct ForkSpec {
    /// The child's id.
    pub child: SessionId,
    /// The inclusive seq to fork at; `None` forks the whole log.
    pub boundary: Option<u64>,
    /// The child's creation time, also the time of its `session/lineage` event.
    pub time_ms: u64,
    /// The child's delegation depth (0 for a plain fork; the parent's depth + 1 for a subagent).
    pub delegation_depth: u32,
    /// The child's agent preset. A plain fork names none; a delegated child carries the one its
    /// parent runs with.
    pub agent_preset: Option<Text>,
}

impl ForkSpec {
    /// The time of the child's `session/lineage` event.
    pub fn lineage_time(&self) -> i64 {
        i64::try_from(self.time_ms).unwrap_or(i64::MAX)
    }
}

/// A fork's child: its header and its log (the inherited prefix, then `session/lineage`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forked {
    /// The child's header.
    pub header: Header,
    /// The child's events.
    pub events: Vec<Event>,
}

/// Forks `parent` at `spec.boundary`. The child inherits `events[..=boundary]` verbatim, then its
/// own suffix starts with `session/lineage` at `seq == seed_len`, carrying the parent's running
/// digest at `seed_len - 1`. Refuses a boundary inside an open turn ([`LogError::OpenTurn`]) or
/// past the log ([`LogError::InvalidBoundary`]). The child's `cwd` is the parent's.
pub fn fork_session(
    parent: &Header,
    events: &[Event],
    spec: &ForkSpec,
) -> Result<Forked, LogError> {
    fork_session_with_setup(parent, events, spec, Vec::new())
}

/// [`fork_session`], with `setup` events written right after `session/lineage` (at the spec's
/// time): a delegated child's `subagent/descriptor` and delegated policy overrides. The header is
/// the fold of the child's own suffix, so a descriptor makes its origin `Subagent`.
pub fn fork_session_with_setup(
    parent: &Header,
    events: &[Event],
    spec: &ForkSpec,
    setup: Vec<EventBody>,
) -> Result<Forked, LogError> {
    let seed_len = resolve_fork_boundary(events.len() as u64, spec.boundary, |b| {
        last_turn_marker(&events[..=b as usize])
    })?;
    let seed = &events[..seed_len as usize];
    let mut chain = Chain::new();
    let mut encoder = Encoder::new();
    let mut buf = Vec::new();
    for event in seed {
        buf.clear();
        encoder.encode(event, &mut buf);
        chain.update(&buf);
    }
    let lineage = SessionLineage {
        parent: parent.id,
        seed_len,
        seed_digest: chain.digest(),
        delegation_depth: spec.delegation_depth,
    };
    let mut header = child_header(parent, spec, &lineage);
    let mut child_events = Vec::with_capacity(seed.len() + 1 + setup.len());
    child_events.extend_from_slice(seed);
    child_events.push(Event::new(seed_len, spec.lineage_time(), lineage));
    let own = setup_events(seed_len + 1, spec.lineage_time(), setup);
    header.origin = origin_of(&own);
    child_events.extend(own);
    // The inherited prefix is valid (it is the parent's); the child's whole log must be too.
    check_seed(&child_events)?;
    Ok(Forked {
        header,
        events: child_events,
    })
}

/// Numbers `setup` from `first_seq`, all at `time_ms`.
pub fn setup_events(first_seq: u64, time_ms: i64, setup: Vec<EventBody>) -> Vec<Event> {
    setup
        .into_iter()
        .zip(first_seq..)
        .map(|(body, seq)| Event::new(seq, time_ms, body))
        .collect()
}

/// A child's origin as its own setup says: `Subagent` when it carries a descriptor.
pub fn origin_of(own: &[Event]) -> Option<Origin> {
    own.iter()
        .any(|e| e.kind() == EventKind::SubagentDescriptor)
        .then_some(Origin::Subagent)
}

/// The header of a fork's child, given its lineage event.
pub fn child_header(parent: &Header, spec: &ForkSpec, lineage: &SessionLineage) -> Header {
    Header {
        cwd: parent.cwd.clone(),
        parent: Some(parent.id),
        seed_len: lineage.seed_len,
        delegation_depth: lineage.delegation_depth,
        seed_digest: Some(lineage.seed_digest),
        agent_preset: spec.agent_preset.clone(),
        ..Header::new(spec.child, spec.time_ms)
    }
}
