//! Helpers shared by this crate's test suites.

#![allow(dead_code)] // each test file uses its own part

use std::sync::Arc;

use lineage_agent::{Agent, AgentEvent, CreateAgent, Seed};
use lineage_log::{Event, EventBody, EventKind, Message, SessionId};
use lineage_testkit::agent::{Harness, fresh_with_id, user, wait_appended};
use tokio::sync::mpsc::UnboundedReceiver;

/// The creation of agent `id` (see [`fresh_with_id`]) whose log starts as a copy of all of
/// `parent`'s, at delegation depth `depth`.
pub fn fork_of(id: SessionId, parent: SessionId, depth: u32) -> CreateAgent {
    let mut create = fresh_with_id(id);
    create.seed = Seed::Fork {
        parent,
        boundary: None,
        delegation_depth: depth,
    };
    create
}

/// The agent `id` of `h`, created as a fork of `parent` at delegation depth `depth` (see
/// [`fork_of`]).
pub async fn forked(h: &Harness, id: SessionId, parent: &Agent, depth: u32) -> Arc<Agent> {
    h.agents
        .create(fork_of(id, parent.id(), depth))
        .await
        .expect("the fork is created")
}

/// A fresh agent of `h`, subscribed to, in a turn on `prompt` whose first assistant chunk is
/// written: with a model that then holds its stream (`Response::hang()`), the turn stays open
/// mid-stream.
pub async fn streaming(h: &Harness, prompt: &str) -> (Arc<Agent>, UnboundedReceiver<AgentEvent>) {
    let agent = h.agent().await;
    let mut rx = agent.subscribe();
    agent.followup(user(prompt)).unwrap();
    wait_appended(&mut rx, EventKind::AssistantChunk).await;
    (agent, rx)
}

/// The texts of `messages`, in order.
pub fn texts(messages: &[Message]) -> Vec<String> {
    messages.iter().map(|m| m.text()).collect()
}

/// The numbers of the turns `events` start, in order.
pub fn turn_numbers(events: &[Event]) -> Vec<u32> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::TurnStart(t) => Some(t.turn),
            _ => None,
        })
        .collect()
}
