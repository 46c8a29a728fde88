//! Drains cancel top-down: a drained tree of running continuable children sees every parent's
//! cancellation fire before any of its children's, all within one synchronous span.
//!
//! Each child runs a tool that waits on its turn's cancellation through a waker that records the
//! child's id the moment the cancellation wakes it, so the order observed is the order the
//! cancellations fired, not the order the scheduler later runs the woken tasks in.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use lineage_agent::{Agent, Response, ToolOutput};
use lineage_log::{AbortCause, SessionId};
use lineage_subagent::SubagentRuntime;
use lineage_testkit::subagent::*;
use tokio::sync::mpsc;

type Order = Arc<Mutex<Vec<(SessionId, AbortCause)>>>;

/// Records `id` (once) when woken, then wakes the task that polled.
struct Recorder {
    id: SessionId,
    cancel: lineage_agent::Cancellation,
    order: Order,
    inner: Waker,
}

impl Wake for Recorder {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(cause) = self.cancel.cause() {
            let mut order = lock(&self.order);
            if !order.iter().any(|(id, _)| *id == self.id) {
                order.push((self.id, cause));
            }
        }
        self.inner.wake_by_ref();
    }
}

/// `cancel.cancelled()`, polled with a [`Recorder`] around the caller's waker.
struct Observed {
    fut: Pin<Box<dyn Future<Output = AbortCause> + Send>>,
    id: SessionId,
    cancel: lineage_agent::Cancellation,
    order: Order,
}

impl Future for Observed {
    type Output = AbortCause;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<AbortCause> {
        let waker = Waker::from(Arc::new(Recorder {
            id: self.id,
            cancel: self.cancel.clone(),
            order: self.order.clone(),
            inner: cx.waker().clone(),
        }));
        let mut inner = Context::from_waker(&waker);
        self.fut.as_mut().poll(&mut inner)
    }
}

/// A live tree under a fresh top-level parent: `fanout` children, each with `fanout` children,
/// each with `fanout` children, every one running the `hold` tool. Returns the parent, the
/// children's parents by id, and the order their cancellations fire in.
async fn running_tree(
    h: &Harness,
    fanout: usize,
) -> (Arc<Agent>, HashMap<SessionId, SessionId>, Order) {
    let order: Order = Arc::default();
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let tool = {
        let order = order.clone();
        FnTool::new("hold", move |ctx, _| {
            let _ = entered_tx.send(ctx.session());
            let observed = Observed {
                fut: Box::pin({
                    let cancel = ctx.cancel.clone();
                    async move { cancel.cancelled().await }
                }),
                id: ctx.session(),
                cancel: ctx.cancel.clone(),
                order: order.clone(),
            };
            async move {
                observed.await;
                ToolOutput::text("released")
            }
        })
    };
    let root = h.parent_with(parent_spec(vec![tool])).await;
    let mut parents = HashMap::new();
    let mut level = vec![root.clone()];
    for depth in 0..3 {
        let model = format!("level{depth}");
        let mut next = Vec::new();
        for parent in &level {
            for _ in 0..fanout {
                h.model(&model)
                    .push([Response::tool_call("hold-1", "hold", "{}")]);
                let started = within(
                    h.runtime
                        .start_continuable("spawn", continuable(parent, &model, "hold on")),
                )
                .await
                .expect("the child starts");
                parents.insert(started.child, parent.id());
                next.push(h.agents.get(started.child).expect("the child is live"));
            }
        }
        level = next;
    }
    // Every child is inside its tool, waiting on its turn's cancellation.
    let mut inside = 0;
    while inside < parents.len() {
        within(entered.recv())
            .await
            .expect("a child enters its tool");
        inside += 1;
    }
    (root, parents, order)
}

/// Polls `drain` once and asserts that every child's cancellation fired during that poll, each
/// parent's before its children's, then lets the drain finish.
async fn assert_top_down<F: Future<Output = Result<(), lineage_subagent::SubagentError>>>(
    runtime: &SubagentRuntime,
    drain: F,
    parents: &HashMap<SessionId, SessionId>,
    order: &Order,
) {
    let mut drain = std::pin::pin!(drain);
    let first = std::future::poll_fn(|cx| Poll::Ready(drain.as_mut().poll(cx))).await;
    let fired = lock(order).clone();
    assert_eq!(
        fired.len(),
        parents.len(),
        "every cancellation fires in the drain's first synchronous span"
    );
    let position: HashMap<SessionId, usize> = fired
        .iter()
        .enumerate()
        .map(|(i, (id, _))| (*id, i))
        .collect();
    for (child, parent) in parents {
        if let Some(parent_at) = position.get(parent) {
            assert!(
                *parent_at < position[child],
                "parent {parent} is cancelled before its child {child}: {fired:?}"
            );
        }
    }
    assert!(
        fired.iter().all(|(_, cause)| *cause == AbortCause::Parent),
        "a drain cancels with cause parent: {fired:?}"
    );
    match first {
        Poll::Ready(result) => result.expect("the drain succeeds"),
        Poll::Pending => within(drain).await.expect("the drain succeeds"),
    }
    for child in parents.keys() {
        assert!(!runtime.is_resident(*child), "{child} is torn down");
    }
}

#[tokio::test(start_paused = true)]
async fn drain_descendants_cancels_every_parent_before_its_children() {
    for fanout in [1, 2, 2, 3] {
        let h = Harness::new();
        let (root, parents, order) = running_tree(&h, fanout).await;
        assert_top_down(
            &h.runtime,
            h.runtime.drain_descendants(std::slice::from_ref(&root)),
            &parents,
            &order,
        )
        .await;
        h.assert_verified();
    }
}

#[tokio::test(start_paused = true)]
async fn drain_cancels_every_parent_before_its_children() {
    for fanout in [1, 2, 3] {
        let h = Harness::new();
        let (_root, parents, order) = running_tree(&h, fanout).await;
        assert_top_down(&h.runtime, h.runtime.drain(), &parents, &order).await;
        h.assert_verified();
    }
}
