//! Folds: facts derived from a log. Authority comes from a session's own suffix (`seq >=
//! seed_len`); the inherited prefix is context only.

use crate::{
    ApprovalPolicy, Event, EventBody, Header, Message, Origin, SandboxMode, SessionLineage,
    SubagentDescriptor,
};

/// The session's own `session/lineage`: the last one in the log. A child's inherited prefix may
/// hold its ancestors' lineage events; its own comes after them, at `seq == seed_len`.
pub fn fold_lineage(events: &[Event]) -> Option<&SessionLineage> {
    events.iter().rev().find_map(|e| match &e.body {
        EventBody::SessionLineage(lineage) => Some(&**lineage),
        _ => None,
    })
}

/// Where the session's own suffix starts: the lineage's `seed_len`, or 0 without one.
pub fn seed_len(events: &[Event]) -> u64 {
    fold_lineage(events).map_or(0, |l| l.seed_len)
}

/// The session's own events: those at or after `seed_len`.
pub fn own_suffix(events: &[Event]) -> &[Event] {
    let start = (seed_len(events) as usize).min(events.len());
    &events[start..]
}

/// The session's descriptor: the first `subagent/descriptor` of its own suffix.
pub fn fold_descriptor(events: &[Event]) -> Option<&SubagentDescriptor> {
    own_suffix(events).iter().find_map(|e| match &e.body {
        EventBody::SubagentDescriptor(d) => Some(&**d),
        _ => None,
    })
}

/// The policy overrides in force: the last of each kind in the own suffix.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyOverrides<'a> {
    /// The approval policy override, if any.
    pub approval: Option<&'a ApprovalPolicy>,
    /// The sandbox mode override, if any.
    pub sandbox: Option<&'a SandboxMode>,
}

/// The policy overrides in force for the session.
pub fn fold_policy(events: &[Event]) -> PolicyOverrides<'_> {
    let mut policy = PolicyOverrides::default();
    for event in own_suffix(events) {
        match &event.body {
            EventBody::ApprovalPolicy(p) => policy.approval = Some(p),
            EventBody::SandboxMode(m) => policy.sandbox = Some(m),
            _ => {}
        }
    }
    policy
}

/// The delegation depth: the larger of what the lineage says and what the runtime asks for. It is a
/// monotone floor: no resume can lower it.
pub fn fold_delegation_depth(events: &[Event], runtime_depth: u32) -> u32 {
    fold_lineage(events)
        .map_or(0, |l| l.delegation_depth)
        .max(runtime_depth)
}

/// The header facts the log holds, applied to `header`: parent, seed length and digest, depth and
/// origin. `verify` compares a stored header with this.
pub fn fold_header(header: &Header, events: &[Event]) -> Header {
    with_log_facts(
        header,
        fold_lineage(events),
        fold_descriptor(events).is_some(),
    )
}

/// `header` with the facts of a session's own `session/lineage` (if any) and of whether its own
/// suffix holds a `subagent/descriptor`.
pub fn with_log_facts(
    header: &Header,
    lineage: Option<&SessionLineage>,
    has_descriptor: bool,
) -> Header {
    Header {
        parent: lineage.map(|l| l.parent),
        seed_len: lineage.map_or(0, |l| l.seed_len),
        seed_digest: lineage.map(|l| l.seed_digest),
        delegation_depth: lineage.map_or(0, |l| l.delegation_depth),
        origin: has_descriptor.then_some(Origin::Subagent),
        ..header.clone()
    }
}

/// The model's view of the conversation: user messages, assistant messages with content and tool
/// results, in log order, inherited prefix included.
pub fn model_history(events: &[Event]) -> Vec<&Message> {
    events
        .iter()
        .filter_map(|e| e.body.history_message())
        .collect()
}

/// The session's final output: the last assistant message with content in its own suffix.
pub fn final_output(events: &[Event]) -> Option<&Message> {
    own_suffix(events).iter().rev().find_map(|e| match &e.body {
        EventBody::AssistantMessage(m) if !m.message.content.is_empty() => Some(&m.message),
        _ => None,
    })
}
