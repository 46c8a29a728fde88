//! End to end through the facade: a parent works, a delegated child is forked from its completed
//! turns with its descriptor and pinned policy, the process dies mid-turn in both, and after a
//! restart everything the child needs to resume comes from the log alone.

use lineage::log::{
    ApprovalPolicy, DescriptorMode, Event, EventBody, EventKind, ForkSpec, Header, Origin,
    PolicySource, SessionId, SubagentDescriptor, TOOL_OUTCOME_UNKNOWN, TurnEndReason,
    fold_delegation_depth, fold_descriptor, fold_policy, model_history, own_suffix,
};
use lineage::store::{Store, StoreError};
use lineage_testkit::ev;

const T0: i64 = 1_780_000_000_000;

/// Two completed turns: a question answered after one tool call, then a short exchange.
fn parent_turns() -> Vec<EventBody> {
    vec![
        ev::turn_start(1),
        ev::step_start(1, 1),
        ev::user(ev::mid(1), "Summarize the repository."),
        ev::assistant_calls(1, 1, ev::mid(2), &[("call-1", "read_file")]),
        ev::tool_call(1, 1, "call-1", "read_file", r#"{"path":"README.md"}"#),
        ev::tool_result(1, 1, ev::mid(3), "call-1", "# Lineage"),
        ev::step_end(1, 1),
        ev::step_start(1, 2),
        ev::assistant_text(1, 2, ev::mid(4), "It is a session store."),
        ev::step_end(1, 2),
        ev::turn_completed(1),
        ev::turn_start(2),
        ev::step_start(2, 1),
        ev::user(ev::mid(5), "Thanks."),
        ev::assistant_text(2, 1, ev::mid(6), "You are welcome."),
        ev::step_end(2, 1),
        ev::turn_completed(2),
    ]
}

fn numbered(first_seq: u64, bodies: Vec<EventBody>) -> Vec<Event> {
    ev::numbered(first_seq, T0, 1, bodies)
}

#[test]
fn a_forked_child_resumes_from_its_own_log_after_a_crash() -> Result<(), StoreError> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("sessions.lineage");
    let parent = SessionId::new();
    let child = SessionId::new();
    let completed = parent_turns().len() as u64;

    {
        let store = Store::open(&path)?;
        store.create(Header::new(parent, T0 as u64).with_cwd("/work/project"))?;
        store.append(parent, &numbered(0, parent_turns()))?;
        // The parent starts a third turn; a child is delegated from its completed turns only.
        store.append(
            parent,
            &numbered(completed, vec![ev::turn_start(3), ev::step_start(3, 1)]),
        )?;
        let refused = store.fork(
            parent,
            &ForkSpec {
                child,
                boundary: None,
                time_ms: T0 as u64,
                delegation_depth: 1,
                agent_preset: None,
            },
        );
        assert!(
            matches!(refused, Err(StoreError::Rejected { .. })),
            "a fork inside the open turn is refused: {refused:?}"
        );
        let descriptor = SubagentDescriptor {
            label: Some("reviewer".into()),
            persona: Some("A careful reviewer.".into()),
            ..SubagentDescriptor::new(DescriptorMode::Continuable, "fork")
        };
        let header = store.fork_with_setup(
            parent,
            &ForkSpec {
                child,
                boundary: Some(completed - 1),
                time_ms: T0 as u64 + 100,
                delegation_depth: 1,
                agent_preset: None,
            },
            vec![
                EventBody::from(descriptor),
                ev::sandbox("read-only", PolicySource::Delegation),
                ev::approval(ApprovalPolicy::NEVER, PolicySource::Delegation),
            ],
        )?;
        assert_eq!(header.seed_len, completed);
        assert_eq!(header.origin, Some(Origin::Subagent));
        assert_eq!(header.cwd.as_deref(), Some("/work/project"));

        // The child works and dies inside a tool call it had started.
        let own_start = completed + 4;
        store.append(
            child,
            &numbered(
                own_start,
                vec![
                    ev::turn_start(3),
                    ev::step_start(3, 1),
                    ev::user(ev::mid(10), "Review the summary."),
                    ev::assistant_calls(3, 1, ev::mid(11), &[("call-9", "grep")]),
                    ev::tool_call(3, 1, "call-9", "grep", r#"{"pattern":"TODO"}"#),
                ],
            ),
        )?;
        // The process stops here: the store is dropped without closing either open turn.
    }

    let store = Store::open(&path)?;
    assert_eq!(store.children(parent)?, vec![child]);

    let child_log = store.load(child)?;
    assert_eq!(
        child_log.closers, 3,
        "a result, step/end and turn/end close the tool call"
    );
    let closers = &child_log.events[child_log.events.len() - 3..];
    let EventBody::ToolResult(result) = &closers[0].body else {
        panic!(
            "the first closer answers the started call: {:?}",
            closers[0]
        );
    };
    assert_eq!(
        result.error.as_ref().map(|e| e.code.as_str()),
        Some(TOOL_OUTCOME_UNKNOWN)
    );
    assert_eq!(closers[1].kind(), EventKind::StepEnd);
    let EventBody::TurnEnd(end) = &closers[2].body else {
        panic!("the last closer ends the turn");
    };
    assert_eq!(end.reason, TurnEndReason::Interrupted);

    // Authority comes from the child's own suffix, so it resumes without its provider.
    let events = &child_log.events;
    assert_eq!(own_suffix(events)[0].kind(), EventKind::SessionLineage);
    let descriptor = fold_descriptor(events).expect("the child's descriptor");
    assert_eq!(descriptor.label.as_deref(), Some("reviewer"));
    let policy = fold_policy(events);
    assert_eq!(
        policy.approval.map(|p| p.policy.as_str()),
        Some(ApprovalPolicy::NEVER)
    );
    assert_eq!(policy.sandbox.map(|m| m.mode.as_str()), Some("read-only"));
    assert_eq!(
        fold_delegation_depth(events, 0),
        1,
        "the depth floor survives resume"
    );
    assert_eq!(fold_delegation_depth(events, 3), 3);

    // The child sees the parent's completed conversation, then its own.
    let history: Vec<_> = model_history(events).iter().map(|m| m.id).collect();
    let expected: Vec<_> = [1, 2, 3, 4, 5, 6, 10, 11]
        .into_iter()
        .map(ev::mid)
        .collect();
    assert_eq!(history[..8], expected[..]);
    assert_eq!(
        history.len(),
        9,
        "plus the synthetic result of the interrupted call"
    );

    let parent_log = store.load(parent)?;
    assert_eq!(
        parent_log.closers, 2,
        "step/end and turn/end close the parent's open turn"
    );

    // A grandchild forked from the resumed child proves its prefix is the child's.
    let grandchild = SessionId::new();
    store.fork(
        child,
        &ForkSpec {
            child: grandchild,
            boundary: None,
            time_ms: T0 as u64 + 200,
            delegation_depth: 2,
            agent_preset: None,
        },
    )?;
    assert_eq!(store.descendants(parent)?, vec![child, grandchild]);
    let report = store.verify()?;
    assert!(
        report.is_ok(),
        "{:?}",
        report.failures().collect::<Vec<_>>()
    );
    assert_eq!(report.sessions.len(), 3);
    Ok(())
}
