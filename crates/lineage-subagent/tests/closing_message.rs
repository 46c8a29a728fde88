//! The closing message of a continuable child's epoch is its final assistant message, verbatim:
//! every content block, tool calls included, in the parent's settlement notice and in
//! `subagent/end`. The notice's summary is its whole first line, full child id included.

use std::sync::Arc;

use lineage_agent::{Gate, Response, ToolOutput};
use lineage_log::{CallId, ContentBlock, Message, MessageSource, SessionId};
use lineage_subagent::{Lifecycle, StopReason};
use lineage_testkit::subagent::*;

/// A tool that answers and ends its turn, so the assistant message that called it is the last.
fn finish_tool() -> Arc<dyn lineage_agent::Tool> {
    FnTool::new("finish", |_, _| async {
        ToolOutput::text("filed").concluding()
    })
}

fn call(id: &str) -> ContentBlock {
    ContentBlock::ToolCall {
        id: CallId::new(id),
        name: "finish".into(),
        arguments: "{\"case\":1}".into(),
    }
}

/// Runs a child whose only turn ends with the assistant message `closing`, and returns the
/// notice its parent got and the blocks its `subagent/end` carried.
async fn settle_with(response: Response) -> (SessionId, Message, Option<Vec<ContentBlock>>) {
    let h = Harness::new();
    let gate = Gate::new();
    h.model("worker").push([response.gated(&gate)]);
    h.parent_model().push([Response::text("noted")]);
    let parent = h.parent_with(parent_spec(vec![finish_tool()])).await;
    let mut parent_events = parent.subscribe();
    let (_, mut life) = listen(&h.runtime);
    let started = within(
        h.runtime
            .start_continuable("spawn", continuable(&parent, "worker", "file it")),
    )
    .await
    .expect("the child starts");
    gate.open();
    let message = settled_notice(&mut parent_events).await;
    let Lifecycle::End {
        stop_reason: stop,
        last_assistant_message: blocks,
        ..
    } = child_end(&mut life, started.child).await
    else {
        unreachable!("child_end returns an end")
    };
    assert_eq!(stop, StopReason::Completed);
    within(parent.when_idle()).await;
    within(h.runtime.drain()).await.unwrap();
    h.assert_verified();
    (started.child, message, blocks)
}

/// Asserts the notice's summary is its whole first line, within its bound, naming `child` in
/// full.
fn assert_summary_is_first_line(child: SessionId, message: &Message) {
    let MessageSource::SubagentSettled { sender, summary } = &message.source else {
        panic!("a settlement notice");
    };
    assert_eq!(*sender, child);
    let Some(ContentBlock::Text { text: first }) = message.content.first() else {
        panic!(
            "the notice opens with its summary line: {:?}",
            message.content
        );
    };
    assert_eq!(
        summary.as_str(),
        first.as_str(),
        "the summary is the whole first line"
    );
    assert!(
        first.contains(&child.to_string()),
        "the line names the child in full: {first}"
    );
    assert!(
        first.chars().count() <= 120 && !first.ends_with('…'),
        "the line fits its bound uncut: {first}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_closing_message_with_text_and_a_tool_call_reaches_notice_and_end_verbatim() {
    let (child, message, end) = settle_with(Response::tool_calls(
        Some("filed the report"),
        &[("call-1", "finish", "{\"case\":1}")],
    ))
    .await;
    let closing = vec![ContentBlock::text("filed the report"), call("call-1")];
    assert_summary_is_first_line(child, &message);
    assert_eq!(
        message.content[1..],
        [
            [ContentBlock::text("Its closing message:")].as_slice(),
            closing.as_slice()
        ]
        .concat(),
        "the notice carries the closing message's blocks verbatim"
    );
    assert_eq!(end, Some(closing), "subagent/end carries the same blocks");
}

#[tokio::test(start_paused = true)]
async fn a_closing_message_of_only_a_tool_call_is_still_a_closing_message() {
    let (child, message, end) =
        settle_with(Response::tool_call("call-1", "finish", "{\"case\":1}")).await;
    assert_summary_is_first_line(child, &message);
    assert_eq!(
        message.content[1..],
        [ContentBlock::text("Its closing message:"), call("call-1")]
    );
    assert_eq!(end, Some(vec![call("call-1")]));
}

#[tokio::test(start_paused = true)]
async fn a_text_closing_message_is_sent_whole_under_a_first_line_that_fits() {
    let (child, message, end) = settle_with(Response::text("the answer is 42")).await;
    assert_summary_is_first_line(child, &message);
    assert_eq!(
        message.content[1..],
        [
            ContentBlock::text("Its closing message:"),
            ContentBlock::text("the answer is 42")
        ]
    );
    assert_eq!(end, Some(vec![ContentBlock::text("the answer is 42")]));
}
