//! A stored child whose descriptor breaks the descriptor contract (a version this build does not
//! support, a continuable one without a label, a one-shot one with continuable-only fields, a
//! tool filter with neither allow nor deny) is listed as a `corrupt` diagnostic at any depth, its
//! own children still listed below it, and cold resume refuses it with `NOT_RESUMABLE`. Stores
//! written before the contract may hold such descriptors; today's store refuses to write them.

use lineage_agent::Cancellation;
use lineage_log::{
    ContentBlock, DescriptorMode, Event, EventBody, Header, MessageSource, SessionId,
    SubagentDescriptor, Text, ToolFilter, with_log_facts,
};
use lineage_subagent::{DiagnosticReason, ErrorCode, ListingRow};
use lineage_testkit::ev::fresh_lineage;
use lineage_testkit::subagent::*;

fn labelled(label: &str) -> SubagentDescriptor {
    SubagentDescriptor {
        label: Some(Text::from(label)),
        ..SubagentDescriptor::new(DescriptorMode::Continuable, "spawn")
    }
}

/// Stores a child of `parent` at `depth` with `descriptor`, as a build before the descriptor
/// contract would have written it, and returns its id.
fn stored_child(
    h: &Harness,
    parent: SessionId,
    depth: u32,
    descriptor: SubagentDescriptor,
) -> SessionId {
    let id = SessionId::new();
    let lineage = fresh_lineage(parent, depth);
    let header = with_log_facts(&Header::new(id, u64::from(depth)), Some(&lineage), true);
    h.store
        .create(header)
        .expect("the child's header is stored");
    h.store
        .append_before_descriptor_contract(
            id,
            &[
                Event::new(0, 0, lineage),
                Event::new(1, 0, EventBody::from(descriptor)),
            ],
        )
        .expect("the child's log is stored");
    id
}

fn forbidden() -> Vec<(&'static str, SubagentDescriptor)> {
    vec![
        (
            "version",
            SubagentDescriptor {
                version: SubagentDescriptor::VERSION + 1,
                ..labelled("future")
            },
        ),
        (
            "label",
            SubagentDescriptor::new(DescriptorMode::Continuable, "spawn"),
        ),
        (
            "persona",
            SubagentDescriptor {
                persona: Some(Text::from("You are someone else.")),
                ..SubagentDescriptor::new(DescriptorMode::OneShot, "spawn")
            },
        ),
        (
            "model",
            SubagentDescriptor {
                model: Some(Text::from("m")),
                ..SubagentDescriptor::new(DescriptorMode::OneShot, "spawn")
            },
        ),
        (
            "tool_filter",
            SubagentDescriptor {
                tool_filter: Some(ToolFilter::default()),
                ..labelled("no filter")
            },
        ),
    ]
}

fn diagnostic(rows: &[ListingRow], id: SessionId) -> &lineage_subagent::DiagnosticRow {
    match rows.iter().find(|r| r.id() == id) {
        Some(ListingRow::Diagnostic(d)) => d,
        other => panic!("{id} should be a diagnostic row, got {other:?} in {rows:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn children_with_forbidden_descriptors_list_as_corrupt_at_every_depth_with_their_subtrees() {
    let h = Harness::new();
    let root = h.parent().await;
    for (field, descriptor) in forbidden() {
        // root → bad → good → worse → leaf: a forbidden descriptor at depths 1 and 3.
        let bad = stored_child(&h, root.id(), 1, descriptor.clone());
        let good = stored_child(&h, bad, 2, labelled("good"));
        let worse = stored_child(&h, good, 3, descriptor);
        let leaf = stored_child(&h, worse, 4, labelled("leaf"));

        let children = within(h.runtime.list_children(root.id(), &Cancellation::new()))
            .await
            .unwrap();
        let row = diagnostic(&children, bad);
        assert_eq!(row.reason, DiagnosticReason::Corrupt, "{field}: {row:?}");
        assert!(row.detail.contains(field), "{field}: {}", row.detail);

        let rows = within(h.runtime.list_descendants(root.id(), &Cancellation::new()))
            .await
            .unwrap();
        for (id, depth) in [(bad, 1), (worse, 3)] {
            let row = diagnostic(&rows, id);
            assert_eq!(row.reason, DiagnosticReason::Corrupt, "{field}: {row:?}");
            assert_eq!(row.depth, depth, "{field}");
            assert!(row.detail.contains(field), "{field}: {}", row.detail);
        }
        for (id, parent, depth) in [(good, bad, 2), (leaf, worse, 4)] {
            match rows.iter().find(|r| r.id() == id) {
                Some(ListingRow::Child(row)) => {
                    assert_eq!((row.parent, row.depth), (parent, depth), "{field}");
                }
                other => panic!("{field}: {id} should be listed as a child, got {other:?}"),
            }
        }
        // Pre-order: each below the one before it.
        let order: Vec<SessionId> = rows
            .iter()
            .map(ListingRow::id)
            .filter(|id| [bad, good, worse, leaf].contains(id))
            .collect();
        assert_eq!(order, [bad, good, worse, leaf], "{field}");
    }
}

#[tokio::test(start_paused = true)]
async fn cold_resume_refuses_a_child_whose_descriptor_breaks_the_contract() {
    let h = Harness::new();
    let parent = h.parent().await;
    for (field, descriptor) in forbidden() {
        let child = stored_child(&h, parent.id(), 1, descriptor);
        let before = h.stored(child);
        let refused = within(h.runtime.followup(
            &parent,
            child,
            vec![ContentBlock::text("carry on")],
            MessageSource::Coordinator {
                sender: parent.id(),
            },
            &Cancellation::new(),
        ))
        .await;
        let error = refusal(refused);
        assert_eq!(error.code(), ErrorCode::NotResumable, "{field}: {error}");
        assert!(error.to_string().contains(&child.to_string()), "{error}");
        assert!(
            h.agents.get(child).is_none(),
            "{field}: nothing was resumed"
        );
        assert_eq!(h.stored(child), before, "{field}: nothing was written");
    }
}

#[tokio::test(start_paused = true)]
async fn the_store_refuses_to_write_a_descriptor_that_breaks_the_contract() {
    let h = Harness::new();
    let parent = h.parent().await;
    for (field, descriptor) in forbidden() {
        let id = SessionId::new();
        let lineage = fresh_lineage(parent.id(), 1);
        let header = with_log_facts(&Header::new(id, 1), Some(&lineage), true);
        h.store.create(header.clone()).unwrap();
        let written = h.store.append(
            id,
            &[
                Event::new(0, 0, lineage.clone()),
                Event::new(1, 0, EventBody::from(descriptor.clone())),
            ],
        );
        let error = written.expect_err(field).to_string();
        assert!(error.contains("seq 1") && error.contains(field), "{error}");
        // Nothing entered: the same seqs take a descriptor that keeps the contract.
        h.store
            .append(
                id,
                &[
                    Event::new(0, 0, lineage.clone()),
                    Event::new(1, 0, EventBody::from(labelled("fine"))),
                ],
            )
            .expect("a descriptor that keeps the contract is written");

        let imported = h.store.import(
            with_log_facts(&Header::new(SessionId::new(), 1), Some(&lineage), true),
            &[
                Event::new(0, 0, lineage),
                Event::new(1, 0, EventBody::from(descriptor)),
            ],
        );
        assert!(
            imported.is_err(),
            "{field}: an import holding it is refused"
        );
    }
}
