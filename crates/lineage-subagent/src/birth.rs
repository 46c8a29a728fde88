//! Child birth: depth, options, the captured policy, the child's tools and prompt, and its first
//! events (`session/lineage`, `subagent/descriptor`, the delegated policy), written with the seed
//! in one store operation before the child is published.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use lineage_agent::{Agent, AgentOptions, AgentSpec, Agents, CreateAgent, Seed, Tool};
use lineage_log::{
    ApprovalPolicy, Custom, DescriptorMode, Digest, Event, EventBody, Header, PolicySource,
    SandboxMode, SessionId, SessionLineage, SubagentDescriptor, Text, ToolFilter, fold_policy,
    own_suffix, with_log_facts,
};

use crate::{ChildOptions, DelegatedPolicy, DepthExceeded, ErrorCode, SubagentError};

/// The runtime-context statement every delegated child gets.
pub const DELEGATION_CONTEXT: &str = "You are a delegated subagent. The permissions you have were \
fixed when you were started and cannot grow from inside this session: anything that needs an \
approval is refused automatically. If the task needs more than you are allowed, do not retry the \
refused operation; say in your answer what you could not do, so the agent that delegated to you \
can take care of it.";

/// Tools the delegation layer installs in one child for that child alone. A child never inherits
/// its parent's instance of them (it would act for the parent), only its own.
pub(crate) const CHILD_SCOPED_TOOLS: [&str; 2] = ["structured_output", "report"];

/// The depth a child of `parent` has: one below the parent's depth floor (the larger of its
/// stored depth and its runtime option), refused when deeper than `max_depth`.
pub fn child_depth(parent: &Agent, max_depth: Option<u32>) -> Result<u32, SubagentError> {
    let attempted = parent.delegation_depth().checked_add(1).ok_or_else(|| {
        SubagentError::new(
            ErrorCode::InvalidRequest,
            format!(
                "subagent of {}: the child depth is out of range",
                parent.id()
            ),
        )
    })?;
    match max_depth {
        Some(max) if attempted > max => Err(DepthExceeded { attempted, max }.into()),
        _ => Ok(attempted),
    }
}

/// Refuses a tool filter that names neither allowed nor denied tools: it would filter nothing,
/// and a continuable child's descriptor could not record it. `owner` says whose filter it is.
pub(crate) fn check_tool_filter(
    filter: Option<&ToolFilter>,
    owner: &str,
) -> Result<(), SubagentError> {
    match filter {
        Some(f) if f.allow.is_none() && f.deny.is_none() => Err(SubagentError::new(
            ErrorCode::InvalidRequest,
            format!(
                "{owner}: the tool filter names neither allowed nor denied tools; remove it or \
                 fill it in"
            ),
        )),
        _ => Ok(()),
    }
}

/// The child's options: the parent's model endpoint, model and token limit unless the request sets
/// them, and always the child's depth.
pub fn child_options(parent: &AgentOptions, requested: &ChildOptions, depth: u32) -> AgentOptions {
    AgentOptions {
        endpoint: requested
            .endpoint
            .clone()
            .or_else(|| parent.endpoint.clone()),
        model: requested.model.clone().or_else(|| parent.model.clone()),
        max_tokens: requested.max_tokens.or(parent.max_tokens),
        subagent_depth: depth,
    }
}

/// The `custom` event type in which a continuable child records the options its descriptor does
/// not carry (today the token limit), so a cold resume runs it with the options it was born with.
/// Readers that do not know it may skip it.
pub const OPTIONS_EVENT: &str = "lineage.subagent/options";

/// The event that records `options`' token limit: a JSON object with `max_tokens` when one is
/// set, empty otherwise.
pub(crate) fn options_event(options: &AgentOptions) -> EventBody {
    let mut payload = serde_json::Map::new();
    if let Some(max) = options.max_tokens {
        payload.insert("max_tokens".into(), max.into());
    }
    Custom {
        type_name: OPTIONS_EVENT.into(),
        payload: serde_json::Value::Object(payload).to_string().into(),
        ignorable: true,
    }
    .into()
}

/// The token limit `child` recorded in its own suffix (the first [`OPTIONS_EVENT`] there), or
/// `None` when it recorded none. A record that is not a JSON object, or whose `max_tokens` is
/// not a positive 32-bit number, is refused (`NOT_RESUMABLE`) naming the seq and the field.
pub(crate) fn recorded_max_tokens(
    child: SessionId,
    events: &[Event],
) -> Result<Option<u32>, SubagentError> {
    let Some(event) = own_suffix(events)
        .iter()
        .find(|e| matches!(&e.body, EventBody::Custom(c) if c.type_name.as_str() == OPTIONS_EVENT))
    else {
        return Ok(None);
    };
    let EventBody::Custom(custom) = &event.body else {
        return Ok(None);
    };
    let corrupt = |what: &str| {
        SubagentError::new(
            ErrorCode::NotResumable,
            format!(
                "subagent {child} cannot be resumed: its {OPTIONS_EVENT} record at seq {} {what}",
                event.seq
            ),
        )
    };
    let value: serde_json::Value =
        serde_json::from_str(custom.payload.as_str()).map_err(|_| corrupt("is not JSON"))?;
    let Some(object) = value.as_object() else {
        return Err(corrupt("is not a JSON object"));
    };
    match object.get("max_tokens") {
        None => Ok(None),
        Some(max) => max
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|&n| n > 0)
            .map(Some)
            .ok_or_else(|| corrupt("has a max_tokens field that is not a positive 32-bit number")),
    }
}

/// The policy `parent` fixes on a child now: its explicit sandbox override (the last
/// `sandbox/mode` of its own suffix, whoever set it) and approvals pinned to `never`.
pub fn capture_policy(parent: &Agent) -> DelegatedPolicy {
    let sandbox = parent.with_events(|events| fold_policy(events).sandbox.map(|m| m.mode.clone()));
    DelegatedPolicy {
        sandbox,
        approval: ApprovalPolicy::NEVER.into(),
    }
}

/// The events that pin `policy` on a child, sandbox first, both marked as the delegation's.
pub(crate) fn policy_events(policy: &DelegatedPolicy) -> Vec<EventBody> {
    let mut events = Vec::with_capacity(2);
    if let Some(mode) = &policy.sandbox {
        events.push(
            SandboxMode {
                mode: mode.clone(),
                source: PolicySource::Delegation,
            }
            .into(),
        );
    }
    events.push(
        ApprovalPolicy {
            policy: policy.approval.clone(),
            source: PolicySource::Delegation,
        }
        .into(),
    );
    events
}

/// What a child runs with: the parent's tools as the parent's filter allows them (so a child
/// never sees more than its parent) plus `own` tools that only this child has, narrowed by the
/// child's `filter`; the child's persona; the delegation statement and `context`.
///
/// `own` tools stay visible whatever the filter says: they are how the child reports back.
pub fn child_spec(
    parent: &Agent,
    options: AgentOptions,
    persona: Option<Text>,
    filter: Option<ToolFilter>,
    own: Vec<Arc<dyn Tool>>,
    context: Vec<Text>,
) -> AgentSpec {
    let parent_tools = parent.toolset();
    let mut tools: Vec<Arc<dyn Tool>> = parent_tools
        .allowed()
        .filter(|t| !CHILD_SCOPED_TOOLS.contains(&t.name()))
        .filter(|t| !own.iter().any(|o| o.name() == t.name()))
        .cloned()
        .collect();
    let own_names: Vec<Text> = own.iter().map(|t| Text::from(t.name())).collect();
    tools.extend(own);
    let tool_filter = filter.map(|f| ToolFilter {
        allow: f.allow.map(|mut allow| {
            allow.extend(own_names.iter().cloned());
            allow
        }),
        deny: f.deny.map(|deny| {
            deny.into_iter()
                .filter(|n| !own_names.contains(n))
                .collect()
        }),
    });
    let mut statements = vec![Text::from(DELEGATION_CONTEXT)];
    statements.extend(context);
    AgentSpec {
        options,
        tools,
        tool_filter,
        persona,
        context: statements,
        ..AgentSpec::default()
    }
}

/// Everything that decides a child, fixed before it is created.
pub(crate) struct ChildPlan {
    pub child: SessionId,
    pub depth: u32,
    /// Fork the parent through this `turn/end`; `None` starts fresh.
    pub fork_at: Option<u64>,
    pub descriptor: SubagentDescriptor,
    pub policy: DelegatedPolicy,
    pub spec: AgentSpec,
}

/// Refuses a parent that is not the exact live agent of `agents`, or is being disposed.
pub(crate) fn check_parent(agents: &Agents, parent: &Arc<Agent>) -> Result<(), SubagentError> {
    if !crate::continuation::is_live_agent(agents, parent) {
        return Err(SubagentError::new(
            ErrorCode::ParentUnavailable,
            format!(
                "agent {} is not a live agent and cannot delegate",
                parent.id()
            ),
        ));
    }
    Ok(())
}

/// Creates the child: its seed (a fork of the parent's completed turns, or nothing), then
/// `session/lineage`, `subagent/descriptor`, the delegated policy and, for a continuable child,
/// its [`OPTIONS_EVENT`], in one store operation,
/// before it is published. A refusal leaves no agent and no stored session.
pub(crate) async fn create_child(
    agents: &Agents,
    parent: &Arc<Agent>,
    plan: ChildPlan,
) -> Result<Arc<Agent>, SubagentError> {
    let ChildPlan {
        child,
        depth,
        fork_at,
        descriptor,
        policy,
        spec,
    } = plan;
    let continuable = descriptor.mode == DescriptorMode::Continuable;
    let mut setup: Vec<EventBody> = vec![descriptor.into()];
    setup.extend(policy_events(&policy));
    if continuable {
        // A cold resume rebuilds the child's options from its own events.
        setup.push(options_event(&spec.options));
    }
    let base = Header {
        cwd: parent.header().cwd.clone(),
        agent_preset: parent.header().agent_preset.clone(),
        ..Header::new(child, now_ms())
    };
    let create = match fork_at {
        Some(boundary) => {
            // The store forks what it holds: make sure it holds the prefix.
            parent
                .flush()
                .await
                .map_err(|e| SubagentError::agent(parent.id(), e))?;
            CreateAgent {
                header: base,
                seed: Seed::Fork {
                    parent: parent.id(),
                    boundary: Some(boundary),
                    delegation_depth: depth,
                },
                setup,
                spec,
            }
        }
        None => {
            let lineage = SessionLineage {
                parent: parent.id(),
                seed_len: 0,
                seed_digest: Digest::of_empty(),
                delegation_depth: depth,
            };
            let header = with_log_facts(&base, Some(&lineage), true);
            setup.insert(0, lineage.into());
            CreateAgent {
                header,
                seed: Seed::Fresh,
                setup,
                spec,
            }
        }
    };
    agents
        .create(create)
        .await
        .map_err(|e| SubagentError::agent(child, e))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_options_inherit_unless_overridden_and_always_carry_the_depth() {
        let parent = AgentOptions {
            endpoint: Some("p".into()),
            model: Some("big".into()),
            max_tokens: Some(100),
            subagent_depth: 0,
        };
        let inherited = child_options(&parent, &ChildOptions::default(), 1);
        assert_eq!(
            inherited,
            AgentOptions {
                subagent_depth: 1,
                ..parent.clone()
            }
        );
        let overridden = child_options(
            &parent,
            &ChildOptions {
                model: Some("small".into()),
                max_tokens: Some(50),
                ..ChildOptions::default()
            },
            2,
        );
        assert_eq!(overridden.endpoint.as_deref(), Some("p"));
        assert_eq!(overridden.model.as_deref(), Some("small"));
        assert_eq!(overridden.max_tokens, Some(50));
        assert_eq!(overridden.subagent_depth, 2);
    }

    #[test]
    fn the_options_record_reads_back_and_a_bad_one_is_refused_naming_its_seq() {
        let child = SessionId::default();
        let with = AgentOptions {
            max_tokens: Some(300),
            ..AgentOptions::default()
        };
        let events = [Event::new(0, 0, options_event(&with))];
        assert_eq!(recorded_max_tokens(child, &events).unwrap(), Some(300));
        let events = [Event::new(0, 0, options_event(&AgentOptions::default()))];
        assert_eq!(recorded_max_tokens(child, &events).unwrap(), None);
        assert_eq!(recorded_max_tokens(child, &[]).unwrap(), None);
        for payload in [
            "not json",
            "[1]",
            r#"{"max_tokens":0}"#,
            r#"{"max_tokens":-3}"#,
        ] {
            let bad = Custom {
                type_name: OPTIONS_EVENT.into(),
                payload: payload.into(),
                ignorable: true,
            };
            let error = recorded_max_tokens(child, &[Event::new(0, 0, bad)]).unwrap_err();
            assert_eq!(error.code(), ErrorCode::NotResumable, "{payload}");
            assert!(
                error.message().contains("seq 0"),
                "{payload}: {}",
                error.message()
            );
        }
    }

    #[test]
    fn the_policy_events_put_the_sandbox_before_the_approval() {
        let policy = DelegatedPolicy {
            sandbox: Some("read-only".into()),
            approval: "never".into(),
        };
        let kinds: Vec<_> = policy_events(&policy)
            .iter()
            .map(|e| e.kind().name())
            .collect();
        assert_eq!(kinds, ["sandbox/mode", "approval/policy"]);
        let unswitched = DelegatedPolicy {
            sandbox: None,
            approval: "never".into(),
        };
        assert_eq!(policy_events(&unswitched).len(), 1);
    }
}
