//! The public requests and answers of the continuation manager.

use std::sync::Arc;

use lineage_agent::{Agent, Cancellation, Hooks};
use lineage_log::{ContentBlock, MessageId, MessageSource, SessionId, Text, ToolFilter};

use crate::ChildOptions;

/// A request to start a continuable child.
#[derive(Clone)]
pub struct ContinuableRequest {
    /// The delegating agent: the exact live `Arc`.
    pub parent: Arc<Agent>,
    /// The first task.
    pub prompt: Vec<ContentBlock>,
    /// A label for people and for `list_agents`.
    pub label: Text,
    /// An id the caller reserved for the child; a fresh one when `None`.
    pub child: Option<SessionId>,
    /// Covers only the work before the prompt is accepted.
    pub cancel: Cancellation,
    /// Model options for the child.
    pub agent_options: ChildOptions,
    /// The deepest delegation depth the child may have.
    pub max_depth: Option<u32>,
    /// Which of the parent's tools the child may use.
    pub tool_filter: Option<ToolFilter>,
    /// A persona for the child.
    pub persona: Option<Text>,
    /// Turn-loop hooks for the child (a pre-step that may refuse its turns), applied at every
    /// activation in this process, cold resumes included, before those of setup contributions.
    /// They live in memory: after a restart, a setup contribution gives a resumed child its hooks.
    pub hooks: Option<Arc<dyn Hooks>>,
}

impl ContinuableRequest {
    /// A request from `parent` to start a child labelled `label` on `prompt`.
    pub fn new(parent: Arc<Agent>, label: impl Into<Text>, prompt: impl Into<Text>) -> Self {
        ContinuableRequest {
            parent,
            prompt: vec![ContentBlock::text(prompt)],
            label: label.into(),
            child: None,
            cancel: Cancellation::new(),
            agent_options: ChildOptions::default(),
            max_depth: None,
            tool_filter: None,
            persona: None,
            hooks: None,
        }
    }
}

impl std::fmt::Debug for ContinuableRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContinuableRequest")
            .field("parent", &self.parent.id())
            .field("label", &self.label)
            .field("child", &self.child)
            .field("hooks", &self.hooks.is_some())
            .finish_non_exhaustive()
    }
}

/// A follow-up: a message from a continuable child's exact live parent, delivered to the child
/// as its next turn (see [`crate::SubagentRuntime::send_followup`]).
#[derive(Clone)]
pub struct FollowupRequest {
    /// The delegating agent: the exact live `Arc` of the child's durable parent.
    pub parent: Arc<Agent>,
    /// The child.
    pub child: SessionId,
    /// What to tell it.
    pub content: Vec<ContentBlock>,
    /// Who the message is from, as the child's log records it.
    pub source: MessageSource,
    /// The message's id, chosen by the caller so that a retry is recognised: a message id the
    /// child's log holds (or its mail, on its way from another host) is delivered once however
    /// many times it is sent, and a retry of a delivered one is accepted. A fresh id when
    /// `None`.
    pub message_id: Option<MessageId>,
    /// Covers only the work before the child accepts the message.
    pub cancel: Cancellation,
}

impl FollowupRequest {
    /// A follow-up from `parent` to `child` saying `text`, as its coordinating parent.
    pub fn new(parent: Arc<Agent>, child: SessionId, text: impl Into<Text>) -> Self {
        FollowupRequest {
            source: MessageSource::Coordinator {
                sender: parent.id(),
            },
            parent,
            child,
            content: vec![ContentBlock::text(text)],
            message_id: None,
            cancel: Cancellation::new(),
        }
    }
}

impl std::fmt::Debug for FollowupRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FollowupRequest")
            .field("parent", &self.parent.id())
            .field("child", &self.child)
            .field("message_id", &self.message_id)
            .finish_non_exhaustive()
    }
}

/// A continuable child whose first prompt was accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContinuableStarted {
    /// The child's durable id.
    pub child: SessionId,
    /// The id of the accepted prompt.
    pub message: MessageId,
}

/// Who asks for an interrupt.
#[derive(Clone, Debug)]
pub enum Authority {
    /// The user, on behalf of the durable parent session `parent`: allowed for that parent's
    /// direct children.
    User {
        /// The parent session.
        parent: SessionId,
    },
    /// An agent: allowed for its live descendants, when it is the exact live agent.
    Ancestor(Arc<Agent>),
}

/// How a child's report reaches its parent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReportDelivery {
    /// At the parent's next step, waking it when idle (a steer).
    #[default]
    NextStep,
    /// Into the parent's next step without waking it (an inject).
    Quiet,
}
