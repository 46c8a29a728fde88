//! `send_message`, `interrupt_agent` and `list_agents`: how a model talks to, stops and finds
//! its continuable children.

use std::sync::Arc;

use lineage_agent::{AgentStatus, BoxFuture, Tool, ToolContext, ToolOutput};
use lineage_log::{DescriptorMode, MessageId, SessionId};
use serde_json::{Value, json};

use super::{answer, invalid, object_schema, refused, string_arg};
use crate::{Authority, FollowupRequest, ListingRow, SubagentRuntime};

/// The name of [`SendMessageTool`].
pub const SEND_MESSAGE: &str = "send_message";
/// The name of [`InterruptAgentTool`].
pub const INTERRUPT_AGENT: &str = "interrupt_agent";
/// The name of [`ListAgentsTool`].
pub const LIST_AGENTS: &str = "list_agents";

/// The session id in `arguments[key]`, or the result that says why not.
fn session_arg(arguments: &Value, key: &str) -> Result<SessionId, ToolOutput> {
    let raw = string_arg(arguments, key)?;
    raw.trim()
        .parse()
        .map_err(|_| invalid(format!("`{key}` is not an agent id: {raw:?}")))
}

/// The message id a model's `message_id` names: the same for the same sender, child and name,
/// so a resent message is recognised, and distinct across senders and children.
fn named_message_id(sender: SessionId, child: SessionId, name: &str) -> MessageId {
    MessageId::derived(&[
        b"send_message",
        &sender.as_u128().to_be_bytes(),
        &child.as_u128().to_be_bytes(),
        name.as_bytes(),
    ])
}

/// Sends a message to one of the caller's continuable children as its next turn.
pub struct SendMessageTool {
    runtime: SubagentRuntime,
}

impl SendMessageTool {
    /// The tool over `runtime`.
    pub fn new(runtime: &SubagentRuntime) -> Arc<Self> {
        Arc::new(SendMessageTool {
            runtime: runtime.clone(),
        })
    }
}

impl Tool for SendMessageTool {
    fn name(&self) -> &str {
        SEND_MESSAGE
    }

    fn description(&self) -> &str {
        "Sends a message to one of your background subagents, by the id you got when you started \
         it, continuing the same conversation. The message becomes its next turn: if it is still \
         working, the message waits until the current turn ends, so it cannot change work already \
         under way. You get back only a confirmation that the message was delivered, not an \
         answer; use it to give the subagent more work. If the call fails, the message was not \
         delivered, except when the failure says OUTCOME_UNKNOWN: then send it again with the \
         same message_id, which delivers it at most once."
    }

    fn input_schema(&self) -> Value {
        object_schema(
            json!({
                "subagent_id": {"type": "string", "description": "The id returned when the background subagent was started."},
                "message": {"type": "string", "description": "What to tell the subagent."},
                "message_id": {"type": "string", "description": "Optional. A name of your choice for this message; a message sent again under the same name to the same subagent is delivered once."},
            }),
            &["subagent_id", "message"],
        )
    }

    fn call(&self, ctx: ToolContext, arguments: Value) -> BoxFuture<'_, ToolOutput> {
        answer(async move {
            let child = session_arg(&arguments, "subagent_id")?;
            let text = string_arg(&arguments, "message")?;
            let message_id = match arguments.get("message_id") {
                None | Some(Value::Null) => None,
                Some(_) => Some(named_message_id(
                    ctx.agent.id(),
                    child,
                    string_arg(&arguments, "message_id")?,
                )),
            };
            let request = FollowupRequest {
                message_id,
                cancel: ctx.cancel.clone(),
                ..FollowupRequest::new(ctx.agent.clone(), child, text)
            };
            let id = self
                .runtime
                .send_followup(&request)
                .await
                .map_err(|error| refused(&error))?;
            Ok(ToolOutput::text(format!(
                "Message {id} is queued as the next turn of subagent {child}."
            )))
        })
    }
}

/// Stops the current turn of one of the caller's descendants.
pub struct InterruptAgentTool {
    runtime: SubagentRuntime,
}

impl InterruptAgentTool {
    /// The tool over `runtime`.
    pub fn new(runtime: &SubagentRuntime) -> Arc<Self> {
        Arc::new(InterruptAgentTool {
            runtime: runtime.clone(),
        })
    }
}

impl Tool for InterruptAgentTool {
    fn name(&self) -> &str {
        INTERRUPT_AGENT
    }

    fn description(&self) -> &str {
        "Asks a background agent to stop its current turn, by its agent id. The target may be \
         your direct child or any agent started below it. Only the current turn stops: messages \
         already queued for it stay parked until your next send_message, agents it started keep \
         running, and it stays available for follow-ups. The call returns once the request is \
         accepted, so the target may run on briefly; interrupting an agent that has already \
         finished is accepted and does nothing."
    }

    fn input_schema(&self) -> Value {
        object_schema(
            json!({
                "agent_id": {"type": "string", "description": "The id of the agent to interrupt."},
            }),
            &["agent_id"],
        )
    }

    fn parallel_safe(&self, _: &Value) -> bool {
        true
    }

    fn call(&self, ctx: ToolContext, arguments: Value) -> BoxFuture<'_, ToolOutput> {
        answer(async move {
            let target = session_arg(&arguments, "agent_id")?;
            self.runtime
                .interrupt(target, &Authority::Ancestor(ctx.agent.clone()))
                .map_err(|error| refused(&error))?;
            Ok(ToolOutput::text(format!(
                "Interrupt requested for agent {target}."
            )))
        })
    }
}

/// Lists the caller's continuable children (or all its continuable descendants).
pub struct ListAgentsTool {
    runtime: SubagentRuntime,
}

impl ListAgentsTool {
    /// The tool over `runtime`.
    pub fn new(runtime: &SubagentRuntime) -> Arc<Self> {
        Arc::new(ListAgentsTool {
            runtime: runtime.clone(),
        })
    }

    /// The status a row shows: `running` or `idle` for a live agent, `ready` for one that exists
    /// only in the store.
    fn status(&self, id: SessionId) -> &'static str {
        match self.runtime.agents().get(id) {
            None => "ready",
            Some(agent) if agent.status() == AgentStatus::Running => "running",
            Some(_) => "idle",
        }
    }

    fn render(&self, rows: &[ListingRow], descendants: bool) -> String {
        let mut lines = Vec::new();
        for row in rows {
            let (id, parent, depth, head, label) = match row {
                ListingRow::Child(child) if child.mode == DescriptorMode::Continuable => (
                    child.id,
                    child.parent,
                    child.depth,
                    format!("[{}]", self.status(child.id)),
                    Some(child.label.as_deref().unwrap_or("").to_owned()),
                ),
                ListingRow::Child(_) => continue,
                ListingRow::Diagnostic(d) => (
                    d.id,
                    d.parent,
                    d.depth,
                    format!("[diagnostic: {}]", d.reason.as_str()),
                    None,
                ),
            };
            let mut line = format!("{id} {head}");
            if descendants {
                line.push_str(&format!(" parent={parent} depth={depth}"));
            }
            if let Some(label) = label {
                line.push_str(" \u{2014} ");
                line.push_str(&label);
            }
            lines.push(line);
        }
        if lines.is_empty() {
            "(no subagents)".to_owned()
        } else {
            lines.join("\n")
        }
    }
}

impl Tool for ListAgentsTool {
    fn name(&self) -> &str {
        LIST_AGENTS
    }

    fn description(&self) -> &str {
        "Lists your background (continuable) subagents by id and label. Use it to recall which \
         ones you started, not to poll them: you are told when one finishes. Status comes from \
         the live registry: running means it is working now; idle means it is loaded but between \
         turns (it may be waiting on agents it started); ready means it exists only in storage, \
         which is neither a failure nor a result waiting for you: send_message starts a new turn \
         of the same conversation, and a direct child accepts send_message in every status. The \
         list is a snapshot, not a promise: send_message makes the real check and can still fail. \
         Children that could not be read are listed as diagnostics rather than left out. With \
         scope `descendants` the whole tree below you is listed in a stable order, each entry with \
         its direct parent's id and its depth; send_message works only for depth-1 entries, \
         deeper ones can only be interrupted."
    }

    fn input_schema(&self) -> Value {
        object_schema(
            json!({
                "scope": {
                    "type": "string",
                    "enum": ["children", "descendants"],
                    "description": "`children` (the default) lists your direct children; `descendants` lists the whole tree below you.",
                },
            }),
            &[],
        )
    }

    fn parallel_safe(&self, _: &Value) -> bool {
        true
    }

    fn call(&self, ctx: ToolContext, arguments: Value) -> BoxFuture<'_, ToolOutput> {
        answer(async move {
            let descendants = match arguments.get("scope").map(|v| v.as_str()) {
                None | Some(Some("children")) => false,
                Some(Some("descendants")) => true,
                _ => return Err(invalid("`scope` must be \"children\" or \"descendants\"")),
            };
            let listed = if descendants {
                self.runtime
                    .list_descendants(ctx.agent.id(), &ctx.cancel)
                    .await
            } else {
                self.runtime
                    .list_children(ctx.agent.id(), &ctx.cancel)
                    .await
            };
            let rows = listed.map_err(|error| refused(&error))?;
            Ok(ToolOutput::text(self.render(&rows, descendants)))
        })
    }
}
