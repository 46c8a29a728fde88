//! Listing under a cancellation: a listing whose cancellation has fired stops with `CANCELLED`,
//! never with rows, whether it is asked for directly or through the `list_agents` tool.

use lineage_agent::{Cancellation, Tool, ToolContext};
use lineage_log::{
    AbortCause, DescriptorMode, Event, EventBody, Header, SessionId, SubagentDescriptor,
    with_log_facts,
};
use lineage_subagent::tools::ListAgentsTool;
use lineage_subagent::{ErrorCode, ListingRow};
use lineage_testkit::ev::fresh_lineage;
use lineage_testkit::subagent::*;
use serde_json::json;

/// Stores a continuable child of `parent` at `depth`, labelled `label`, and returns its id.
fn stored_child(h: &Harness, parent: SessionId, depth: u32, label: &str) -> SessionId {
    let id = SessionId::new();
    let lineage = fresh_lineage(parent, depth);
    let descriptor = SubagentDescriptor {
        label: Some(label.into()),
        ..SubagentDescriptor::new(DescriptorMode::Continuable, "spawn")
    };
    let header = with_log_facts(&Header::new(id, u64::from(depth)), Some(&lineage), true);
    h.store
        .import(
            header,
            &[
                Event::new(0, 0, lineage),
                Event::new(1, 0, EventBody::SubagentDescriptor(Box::new(descriptor))),
            ],
        )
        .expect("the child is stored");
    id
}

/// Under `root`: two children, the first with a child of its own, which has one too.
fn stored_tree(h: &Harness, root: SessionId) -> [SessionId; 4] {
    let first = stored_child(h, root, 1, "first");
    let second = stored_child(h, root, 1, "second");
    let grandchild = stored_child(h, first, 2, "grandchild");
    let great = stored_child(h, grandchild, 3, "great-grandchild");
    [first, second, grandchild, great]
}

fn fired() -> Cancellation {
    let cancel = Cancellation::new();
    cancel.cancel(AbortCause::User);
    cancel
}

#[tokio::test(start_paused = true)]
async fn a_listing_cancelled_before_it_is_asked_for_is_cancelled_and_lists_nothing() {
    let h = Harness::new();
    let root = h.parent().await;
    let [first, second, grandchild, great] = stored_tree(&h, root.id());

    // Uncancelled, the tree lists in full.
    let ids = |rows: Vec<ListingRow>| rows.iter().map(ListingRow::id).collect::<Vec<_>>();
    let children = within(h.runtime.list_children(root.id(), &Cancellation::new()))
        .await
        .unwrap();
    assert_eq!(ids(children), [first, second]);
    let tree = within(h.runtime.list_descendants(root.id(), &Cancellation::new()))
        .await
        .unwrap();
    assert_eq!(ids(tree), [first, grandchild, great, second]);

    // Cancelled, neither listing yields rows: both stop with CANCELLED, naming the root.
    let cancel = fired();
    for listed in [
        within(h.runtime.list_children(root.id(), &cancel)).await,
        within(h.runtime.list_descendants(root.id(), &cancel)).await,
    ] {
        let error = listed.expect_err("a cancelled listing does not succeed");
        assert_eq!(error.code(), ErrorCode::Cancelled, "{error}");
        assert_eq!(error.code().as_str(), "CANCELLED");
        assert!(
            error.to_string().contains(&root.id().to_string()),
            "{error}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn list_agents_stops_with_cancelled_when_its_call_is_cancelled() {
    let h = Harness::new();
    let root = h.parent().await;
    let children = stored_tree(&h, root.id());
    let tool = ListAgentsTool::new(&h.runtime);
    for scope in ["children", "descendants"] {
        let ctx = ToolContext {
            agent: root.clone(),
            cancel: fired(),
            call_id: "list".into(),
            turn: 0,
            step: 0,
        };
        let output = within(tool.call(ctx, json!({ "scope": scope }))).await;
        assert!(output.is_error, "{scope}: {output:?}");
        let code = output.error.as_ref().map(|e| e.code.to_string());
        assert_eq!(code.as_deref(), Some("CANCELLED"), "{scope}: {output:?}");
        let text = format!("{:?}", output.content);
        for child in children {
            assert!(!text.contains(&child.to_string()), "{scope}: {text}");
        }
    }
}
