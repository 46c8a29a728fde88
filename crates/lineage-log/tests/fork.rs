//! `fork_session`: a child inherits a completed-turn prefix verbatim and starts its own suffix with
//! `session/lineage` at `seq == seed_len`, whose `seed_digest` is the parent's running digest at
//! `seed_len - 1`. A boundary inside an open turn is `OpenTurn`; one past the log is
//! `InvalidBoundary`. The parent is never changed.

use lineage_log::{
    AbortCause, Digest, Event, EventBody, EventKind, ForkSpec, Forked, Header, LogError, SessionId,
    SessionLineage, TurnEndReason, check_seed, fold_header, fold_lineage, fork_session, own_suffix,
    seed_len,
};
use lineage_testkit::ev::{self, mid};
use lineage_testkit::realistic_session;
use lineage_testkit::running_digests;

fn parent_header() -> Header {
    let mut header = Header::new(SessionId::from_u128(0xA), 1_000).with_cwd("/work/project");
    header.agent_preset = Some("reviewer".into());
    header.delegation_depth = 2;
    header
}

fn spec(boundary: Option<u64>) -> ForkSpec {
    ForkSpec {
        child: SessionId::from_u128(0xC),
        boundary,
        time_ms: 9_000,
        delegation_depth: 0,
        agent_preset: None,
    }
}

fn lineage(forked: &Forked) -> &SessionLineage {
    match &forked.events.last().unwrap().body {
        EventBody::SessionLineage(l) => l,
        other => panic!("a child's log ends with its lineage, got {other:?}"),
    }
}

/// Two completed turns, then log-only events, then turn 3 left open.
fn parent_with_open_tail() -> Vec<Event> {
    let mut events = realistic_session(21, 60);
    let turns = events
        .iter()
        .filter(|e| e.kind() == EventKind::TurnStart)
        .count() as u32;
    let mut bodies: Vec<EventBody> = events.drain(..).map(|e| e.body).collect();
    bodies.push(ev::user(mid(900), "between turns"));
    bodies.push(ev::turn_start(turns + 1));
    bodies.push(ev::step_start(turns + 1, 1));
    ev::log(bodies)
}

/// [`parent_with_open_tail`], the seq of its last event of `kind`, and the log forked there.
fn tail_forked_at_last(kind: EventKind) -> (Vec<Event>, u64, Forked) {
    let events = parent_with_open_tail();
    let boundary = events.iter().rposition(|e| e.kind() == kind).unwrap() as u64;
    let forked = fork_session(&parent_header(), &events, &spec(Some(boundary))).unwrap();
    (events, boundary, forked)
}

#[test]
fn a_boundary_inside_an_open_turn_is_refused_as_open_turn() {
    let events = realistic_session(22, 120);
    let second_start = events
        .iter()
        .filter(|e| e.kind() == EventKind::TurnStart)
        .nth(1)
        .unwrap()
        .seq;
    for boundary in [second_start, second_start + 3] {
        let err = fork_session(&parent_header(), &events, &spec(Some(boundary))).unwrap_err();
        assert_eq!(err, LogError::OpenTurn { boundary, turn: 2 });
    }
}

#[test]
fn forking_the_whole_log_while_a_turn_is_open_is_refused_as_open_turn() {
    let events = parent_with_open_tail();
    let last = events.len() as u64 - 1;
    let err = fork_session(&parent_header(), &events, &spec(None)).unwrap_err();
    assert!(
        matches!(err, LogError::OpenTurn { boundary, .. } if boundary == last),
        "{err:?}"
    );
}

#[test]
fn a_boundary_past_the_log_is_refused_as_invalid_boundary() {
    let events = realistic_session(23, 40);
    let len = events.len() as u64;
    for boundary in [len, len + 1, u64::MAX] {
        let err = fork_session(&parent_header(), &events, &spec(Some(boundary))).unwrap_err();
        assert_eq!(err, LogError::InvalidBoundary { boundary, len });
    }
    let err = fork_session(&parent_header(), &[], &spec(Some(0))).unwrap_err();
    assert_eq!(
        err,
        LogError::InvalidBoundary {
            boundary: 0,
            len: 0
        }
    );
}

#[test]
fn forking_an_empty_log_gives_an_empty_seed() {
    let forked = fork_session(&parent_header(), &[], &spec(None)).unwrap();
    assert_eq!(forked.events.len(), 1);
    let lineage = lineage(&forked);
    assert_eq!(forked.events[0].seq, 0);
    assert_eq!(lineage.seed_len, 0);
    assert_eq!(lineage.seed_digest, Digest::of_empty());
    assert_eq!(forked.header.seed_len, 0);
}

#[test]
fn forking_a_balanced_log_without_a_boundary_inherits_all_of_it() {
    let events = realistic_session(24, 150);
    let forked = fork_session(&parent_header(), &events, &spec(None)).unwrap();
    assert_eq!(&forked.events[..events.len()], &events[..]);
    assert_eq!(lineage(&forked).seed_len, events.len() as u64);
    assert_eq!(forked.events.len(), events.len() + 1);
}

#[test]
fn a_boundary_on_turn_end_is_valid_for_every_reason() {
    let reasons = [
        TurnEndReason::Completed,
        TurnEndReason::Aborted {
            cause: AbortCause::User,
        },
        TurnEndReason::Aborted {
            cause: AbortCause::Hook {
                reason: "policy".into(),
            },
        },
        TurnEndReason::Blocked,
        TurnEndReason::MaxTokens,
        TurnEndReason::Interrupted,
    ];
    for reason in reasons {
        let events = ev::log([
            ev::turn_start(1),
            ev::step_start(1, 1),
            ev::step_end(1, 1),
            ev::turn_end(1, reason.clone()),
            ev::turn_start(2),
        ]);
        let forked = fork_session(&parent_header(), &events, &spec(Some(3)))
            .unwrap_or_else(|e| panic!("{reason:?}: {e}"));
        assert_eq!(lineage(&forked).seed_len, 4);
    }
}

#[test]
fn a_boundary_on_log_only_events_after_a_turn_end_is_valid() {
    let (_, between, forked) = tail_forked_at_last(EventKind::UserMessage);
    assert_eq!(lineage(&forked).seed_len, between + 1);
    assert_eq!(
        forked.events[between as usize].kind(),
        EventKind::UserMessage
    );
}

#[test]
fn a_boundary_before_any_turn_is_valid() {
    let events = ev::log([
        ev::user(mid(1), "queued"),
        ev::turn_start(1),
        ev::turn_completed(1),
    ]);
    let forked = fork_session(&parent_header(), &events, &spec(Some(0))).unwrap();
    assert_eq!(lineage(&forked).seed_len, 1);
}

#[test]
fn the_child_is_the_prefix_verbatim_then_lineage_at_seq_seed_len() {
    let (events, boundary, forked) = tail_forked_at_last(EventKind::TurnEnd);
    let seed_len = boundary as usize + 1;
    assert_eq!(&forked.events[..seed_len], &events[..seed_len]);
    assert_eq!(forked.events.len(), seed_len + 1);
    let last = forked.events.last().unwrap();
    assert_eq!(last.seq, seed_len as u64);
    assert_eq!(last.time_ms, 9_000);
    let lineage = lineage(&forked);
    assert_eq!(lineage.parent, parent_header().id);
    assert_eq!(lineage.seed_len, seed_len as u64);
    assert_eq!(lineage.delegation_depth, 0);
    let structure = check_seed(&forked.events).expect("a child's log is a valid seed");
    assert!(structure.is_balanced());
}

#[test]
fn the_seed_digest_is_the_parents_running_digest_at_seed_len_minus_one() {
    let events = realistic_session(25, 300);
    let digests = running_digests(&events);
    for (k, event) in events.iter().enumerate() {
        if event.kind() != EventKind::TurnEnd {
            continue;
        }
        let forked = fork_session(&parent_header(), &events, &spec(Some(k as u64))).unwrap();
        assert_eq!(lineage(&forked).seed_digest, digests[k + 1], "boundary {k}");
        assert_eq!(forked.header.seed_digest, Some(digests[k + 1]));
    }
    // The child's own running digest over its inherited records is the same value.
    let forked = fork_session(&parent_header(), &events, &spec(None)).unwrap();
    let child = running_digests(&forked.events[..events.len()]);
    assert_eq!(lineage(&forked).seed_digest, *child.last().unwrap());
}

#[test]
fn the_parent_is_untouched() {
    let events = parent_with_open_tail();
    let before = events.clone();
    let header = parent_header();
    let _ = fork_session(&header, &events, &spec(Some(3)));
    let _ = fork_session(&header, &events, &spec(None));
    assert_eq!(events, before);
    assert_eq!(header, parent_header());
}

#[test]
fn the_child_header_names_its_parent_and_seed_and_copies_only_the_cwd() {
    let events = realistic_session(26, 80);
    let mut spec = spec(None);
    spec.delegation_depth = 3;
    let forked = fork_session(&parent_header(), &events, &spec).unwrap();
    let header = &forked.header;
    assert_eq!(header.id, spec.child);
    assert_eq!(header.created_at_ms, 9_000);
    assert_eq!(header.parent, Some(parent_header().id));
    assert_eq!(header.seed_len, events.len() as u64);
    assert_eq!(
        header.delegation_depth, 3,
        "the spec's depth, not the parent's"
    );
    assert_eq!(header.cwd, parent_header().cwd);
    assert_eq!(header.origin, None);
    assert_eq!(header.agent_preset, None, "a fork does not copy the preset");
    header.validate().unwrap();
    assert_eq!(
        &fold_header(header, &forked.events),
        header,
        "the header caches what the log says"
    );
}

#[test]
fn a_fork_of_a_fork_keeps_its_ancestors_lineage_and_adds_its_own() {
    let events = realistic_session(27, 60);
    let child = fork_session(&parent_header(), &events, &spec(None)).unwrap();
    let mut child_events = child.events.clone();
    let next_turn = check_seed(&child_events).unwrap().last_turn() + 1;
    let tail = ev::log([
        ev::turn_start(next_turn),
        ev::step_start(next_turn, 1),
        ev::assistant_text(next_turn, 1, mid(1), "child's own answer"),
        ev::step_end(next_turn, 1),
        ev::turn_completed(next_turn),
    ]);
    let first = child_events.len() as u64;
    child_events.extend(
        tail.into_iter()
            .map(|e| Event::new(first + e.seq, e.time_ms, e.body)),
    );
    check_seed(&child_events).unwrap();

    let grandchild_spec = ForkSpec {
        child: SessionId::from_u128(0xD),
        ..spec(None)
    };
    let grandchild = fork_session(&child.header, &child_events, &grandchild_spec).unwrap();
    check_seed(&grandchild.events).unwrap();
    assert_eq!(seed_len(&grandchild.events), child_events.len() as u64);
    assert_eq!(
        fold_lineage(&grandchild.events).unwrap().parent,
        child.header.id
    );
    assert_eq!(
        own_suffix(&grandchild.events).len(),
        1,
        "only its own lineage"
    );
    assert_eq!(
        lineage(&grandchild).seed_digest,
        *running_digests(&child_events).last().unwrap()
    );
    // The child's own lineage is inherited verbatim at its original seq.
    assert_eq!(grandchild.events[events.len()], child.events[events.len()]);
}
