//! Folds: the facts a session derives from its log. Authority comes from the own suffix
//! (`seq >= seed_len`, where `seed_len` is the last `session/lineage`'s); inherited history is
//! context only.

use lineage_log::{
    ApprovalPolicy, ContentBlock, DescriptorMode, Digest, Event, EventBody, Header, Origin,
    PolicySource, SandboxMode, SessionId, SessionLineage, SubagentDescriptor, final_output,
    fold_delegation_depth, fold_descriptor, fold_header, fold_lineage, fold_policy, model_history,
    own_suffix, seed_len,
};
use lineage_testkit::ev::{self, mid};

fn lineage_at(seq: u64, parent: u128, depth: u32) -> EventBody {
    SessionLineage {
        parent: SessionId::from_u128(parent),
        seed_len: seq,
        seed_digest: Digest::of_empty(),
        delegation_depth: depth,
    }
    .into()
}

fn descriptor(provider: &str) -> EventBody {
    SubagentDescriptor {
        version: 2,
        mode: DescriptorMode::Continuable,
        provider: provider.into(),
        label: Some("helper".into()),
        endpoint: None,
        model: None,
        persona: None,
        tool_filter: None,
    }
    .into()
}

fn approval(policy: &str) -> EventBody {
    ApprovalPolicy {
        policy: policy.into(),
        source: PolicySource::Delegation,
    }
    .into()
}

fn sandbox(mode: &str) -> EventBody {
    SandboxMode {
        mode: mode.into(),
        source: PolicySource::Own,
    }
    .into()
}

/// A grandchild's log: the grandparent's events (seqs 0..3, a descriptor and policies among them),
/// the child's lineage at 3 and its events, then the grandchild's own lineage at 7 and its events.
fn grandchild() -> Vec<Event> {
    ev::log([
        ev::user(mid(1), "root prompt"),
        approval("on-request"),
        sandbox("danger-full-access"),
        lineage_at(3, 1, 1),
        descriptor("child-provider"),
        approval("never"),
        ev::turn_start(1),
        lineage_at(7, 2, 2),
    ])
}

#[test]
fn without_lineage_the_whole_log_is_the_own_suffix() {
    let events = ev::log([ev::user(mid(1), "hi"), approval("never")]);
    assert_eq!(fold_lineage(&events), None);
    assert_eq!(seed_len(&events), 0);
    assert_eq!(own_suffix(&events), &events[..]);
}

#[test]
fn the_last_lineage_is_the_sessions_own_and_gives_seed_len() {
    let events = grandchild();
    let lineage = fold_lineage(&events).unwrap();
    assert_eq!(lineage.parent, SessionId::from_u128(2));
    assert_eq!(seed_len(&events), 7);
    assert_eq!(own_suffix(&events), &events[7..]);
}

#[test]
fn the_descriptor_is_the_first_in_the_own_suffix() {
    let mut events = ev::log([
        lineage_at(0, 1, 1),
        descriptor("first"),
        descriptor("second"),
    ]);
    assert_eq!(fold_descriptor(&events).unwrap().provider, "first");
    events.truncate(1);
    assert_eq!(fold_descriptor(&events), None);
}

#[test]
fn a_descriptor_in_the_inherited_prefix_is_ignored() {
    let events = grandchild();
    assert_eq!(
        fold_descriptor(&events),
        None,
        "the child's descriptor is not the grandchild's"
    );
    assert_eq!(
        fold_descriptor(&events[..7]).unwrap().provider,
        "child-provider"
    );
}

#[test]
fn the_last_policy_of_each_kind_in_the_own_suffix_wins() {
    let events = ev::log([
        lineage_at(0, 1, 1),
        approval("never"),
        sandbox("read-only"),
        approval("on-request"),
        ev::user(mid(1), "x"),
    ]);
    let policy = fold_policy(&events);
    assert_eq!(policy.approval.unwrap().policy, "on-request");
    assert_eq!(policy.sandbox.unwrap().mode, "read-only");
}

#[test]
fn policies_in_the_inherited_prefix_are_ignored() {
    let events = grandchild();
    let policy = fold_policy(&events);
    assert_eq!(policy.approval, None);
    assert_eq!(
        policy.sandbox, None,
        "the grandparent's full access does not leak into the child"
    );
    let child = fold_policy(&events[..7]);
    assert_eq!(child.approval.unwrap().policy, "never");
    assert_eq!(child.sandbox, None);
}

#[test]
fn the_delegation_depth_is_the_larger_of_lineage_and_runtime() {
    let events = grandchild();
    assert_eq!(fold_delegation_depth(&events, 0), 2);
    assert_eq!(fold_delegation_depth(&events, 5), 5);
    assert_eq!(fold_delegation_depth(&[], 0), 0);
    assert_eq!(fold_delegation_depth(&[], 3), 3);
}

#[test]
fn no_runtime_depth_lowers_the_logged_depth() {
    let events = grandchild();
    for runtime in 0..10 {
        assert!(fold_delegation_depth(&events, runtime) >= 2);
        assert!(fold_delegation_depth(&events, runtime) >= runtime);
    }
}

#[test]
fn the_model_history_is_every_user_message_assistant_message_with_content_and_tool_result() {
    let events = ev::log([
        ev::user(mid(1), "inherited question"),
        lineage_at(1, 1, 1),
        ev::turn_start(1),
        ev::step_start(1, 1),
        ev::text_delta(1, 1, "not history"),
        ev::assistant(1, 1, mid(2), Vec::new()),
        ev::assistant_calls(1, 1, mid(3), &[("c1", "grep")]),
        ev::tool_call(1, 1, "c1", "grep", "{}"),
        ev::tool_result(1, 1, mid(4), "c1", "found"),
        ev::step_end(1, 1),
        ev::step_start(1, 2),
        ev::assistant_text(1, 2, mid(5), "done"),
        ev::step_end(1, 2),
        ev::turn_completed(1),
    ]);
    let ids: Vec<_> = model_history(&events).iter().map(|m| m.id).collect();
    assert_eq!(
        ids,
        [mid(1), mid(3), mid(4), mid(5)],
        "the empty assistant message is skipped"
    );
}

#[test]
fn inbox_splices_do_not_enter_the_history() {
    let events = ev::log([lineage_log::InboxSpliced {
        target: lineage_log::InboxTarget::NextTurn,
        start: 0,
        removed: 0,
        inserted: vec![ev::user_text_message(mid(1), "queued")],
        canceled: false,
    }
    .into()]);
    assert!(model_history(&events).is_empty());
}

#[test]
fn the_final_output_is_the_last_assistant_message_with_content_in_the_own_suffix() {
    let events = ev::log([
        ev::turn_start(1),
        ev::step_start(1, 1),
        ev::assistant_text(1, 1, mid(1), "parent's answer"),
        ev::step_end(1, 1),
        ev::turn_completed(1),
        lineage_at(5, 1, 1),
    ]);
    assert_eq!(
        final_output(&events),
        None,
        "the inherited answer is not the child's output"
    );
    assert_eq!(final_output(&events[..5]).unwrap().id, mid(1));

    let mut bodies: Vec<EventBody> = events.into_iter().map(|e| e.body).collect();
    bodies.extend([
        ev::turn_start(2),
        ev::step_start(2, 1),
        ev::assistant_text(2, 1, mid(2), "first"),
        ev::assistant_text(2, 1, mid(3), "second"),
        ev::assistant(2, 1, mid(4), Vec::new()),
    ]);
    let events = ev::log(bodies);
    let output = final_output(&events).unwrap();
    assert_eq!(output.id, mid(3), "an empty last message is skipped");
    assert_eq!(output.content, vec![ContentBlock::text("second")]);
}

#[test]
fn fold_header_replaces_cached_facts_with_what_the_log_says() {
    let mut stale = Header::new(SessionId::from_u128(5), 77).with_cwd("/srv");
    stale.parent = Some(SessionId::from_u128(99));
    stale.seed_len = 1;
    stale.delegation_depth = 9;
    stale.agent_preset = Some("preset".into());

    let folded = fold_header(&stale, &grandchild());
    assert_eq!(folded.parent, Some(SessionId::from_u128(2)));
    assert_eq!(folded.seed_len, 7);
    assert_eq!(folded.seed_digest, Some(Digest::of_empty()));
    assert_eq!(folded.delegation_depth, 2);
    assert_eq!(folded.origin, None, "no descriptor in the own suffix");
    // Creation facts are not in the log and stay.
    assert_eq!((folded.id, folded.created_at_ms), (stale.id, 77));
    assert_eq!(folded.cwd, stale.cwd);
    assert_eq!(folded.agent_preset, stale.agent_preset);
}

#[test]
fn fold_header_of_a_subagent_says_subagent_and_of_a_fresh_session_says_nothing() {
    let header = Header::new(SessionId::from_u128(5), 77);
    let child = ev::log([lineage_at(0, 1, 1), descriptor("spawn")]);
    assert_eq!(fold_header(&header, &child).origin, Some(Origin::Subagent));
    let fresh = fold_header(&header, &ev::log([ev::user(mid(1), "hi")]));
    assert_eq!(fresh, header);
}
