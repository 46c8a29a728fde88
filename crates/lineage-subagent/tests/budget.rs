//! Budgets over a delegation tree: a tree budget binds every child, which charges it and ends
//! its turn with the root's budget named; the runaway loop of a root that delegates again on
//! every notice stops at its budget; a restart rebuilds what the tree spent from the store.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lineage_agent::{
    Agent, AgentSpec, Budget, ChunkStream, CreateAgent, Model, ModelRequest, Response,
    ScriptedModel,
};
use lineage_log::{BudgetLimit, EventBody, MessageSource, TurnEndReason};
use lineage_store::Store;
use lineage_subagent::tools::{BackgroundMode, SubagentToolConfig};
use lineage_subagent::{Host, Outcome};
use lineage_testkit::subagent::*;
use serde_json::json;
use tempfile::TempDir;

/// A root that delegates again whenever it is not answering a tool call (so on every notice),
/// and children that answer at once. It counts every request, the children's too.
#[derive(Default)]
struct Redelegating {
    root: AtomicUsize,
    children: AtomicUsize,
}

impl Model for Redelegating {
    fn stream(&self, request: ModelRequest) -> ChunkStream {
        let response = if request.model.as_str() == CHILD {
            self.children.fetch_add(1, Ordering::SeqCst);
            Response::text("done")
        } else {
            let n = self.root.fetch_add(1, Ordering::SeqCst);
            match request.messages.last().map(|m| &m.source) {
                // The delegation's call was answered: the child is at work.
                Some(MessageSource::Tool { .. }) => Response::text("waiting for it"),
                _ => {
                    let again = json!({"description": "again", "prompt": "sub task"});
                    Response::tool_call(&format!("call-{n}"), "subagent", &again.to_string())
                }
            }
        };
        ScriptedModel::new([response]).stream(request)
    }
}

impl Redelegating {
    fn requests(&self) -> (usize, usize) {
        (
            self.root.load(Ordering::SeqCst),
            self.children.load(Ordering::SeqCst),
        )
    }
}

/// A host over a store in a temporary directory, its agents asking one [`Redelegating`] model.
/// The host is declared first so that it is dropped before its directory.
struct Fixture {
    host: Host,
    model: Arc<Redelegating>,
    dir: TempDir,
}

impl Fixture {
    /// A host over the store in `dir` asking `model`: a new process over the same file when
    /// both come from a closed fixture.
    fn over(dir: TempDir, model: Arc<Redelegating>) -> Fixture {
        let store = Store::open(dir.path().join("budget.lineage")).expect("the store opens");
        let host = Host::new(store, model.clone()).expect("the host starts");
        Fixture { host, model, dir }
    }

    /// A fresh fixture, its root held to `budget`, and the outcome of running the root on the
    /// prompt "go".
    async fn run_root(budget: Budget) -> (Fixture, Arc<Agent>, Outcome) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let f = Fixture::over(dir, Arc::default());
        let root = f.root(budget).await;
        let outcome = within(f.host.run(&root, "go")).await.unwrap();
        (f, root, outcome)
    }

    fn spec(&self, budget: Option<Budget>) -> AgentSpec {
        let tools = self.host.delegation_tools(vec![SubagentToolConfig {
            background: BackgroundMode::Continuable,
            agent_options: child_options(),
            ..SubagentToolConfig::new("spawn")
        }]);
        AgentSpec {
            budget,
            ..parent_spec(tools)
        }
    }

    async fn root(&self, budget: Budget) -> Arc<Agent> {
        self.host
            .agents
            .create(CreateAgent::fresh(self.spec(Some(budget))))
            .await
            .expect("the root is created")
    }

    fn children(&self, root: &Agent) -> Vec<lineage_log::SessionId> {
        self.host.store.flush_all().expect("flush");
        self.host.store.children(root.id()).expect("children")
    }

    /// Checks that the store verifies, then closes the host.
    async fn verify_and_close(self) {
        self.host.store.flush_all().expect("flush");
        let report = self.host.store.verify().expect("verify runs");
        assert!(
            report.is_ok(),
            "{:?}",
            report.failures().collect::<Vec<_>>()
        );
        self.host.close().await.unwrap();
    }
}

fn budget_end(outcome: &Outcome) -> (BudgetLimit, u64, lineage_log::SessionId) {
    match &outcome.stop_reason {
        Some(TurnEndReason::Budget(r)) => (r.limit, r.max, r.owner),
        other => panic!("expected a budget end, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_root_that_delegates_on_every_notice_stops_at_its_tree_budget() {
    let (f, root, outcome) = Fixture::run_root(Budget::tree().requests(12)).await;

    assert_eq!(budget_end(&outcome), (BudgetLimit::Requests, 12, root.id()));
    let (root_requests, child_requests) = f.model.requests();
    assert_eq!(
        root_requests + child_requests,
        12,
        "the root and its children share one budget"
    );
    assert!(child_requests > 0);
    assert!(f.host.subagents.resident().is_empty());
    // Every child that was refused a request says whose budget it reached.
    for child in f.children(&root) {
        for reason in turn_ends(&f.host.store.read_from(child, 0).unwrap()) {
            match reason {
                TurnEndReason::Completed => {}
                TurnEndReason::Budget(r) => assert_eq!(r.owner, root.id()),
                other => panic!("unexpected child end {other:?}"),
            }
        }
    }
    f.verify_and_close().await;
}

#[tokio::test(start_paused = true)]
async fn a_child_refused_by_the_tree_budget_settles_with_a_budget_notice() {
    // The root's one request, which delegates, spends it all.
    let (f, root, outcome) = Fixture::run_root(Budget::tree().requests(1)).await;

    assert_eq!(f.model.requests(), (1, 0), "the child asked nothing");
    let [child] = f.children(&root)[..] else {
        panic!("one child")
    };
    let child_events = f.host.store.read_from(child, 0).unwrap();
    match turn_ends(&child_events).as_slice() {
        [TurnEndReason::Budget(r)] => {
            assert_eq!((r.limit, r.owner), (BudgetLimit::Requests, root.id()))
        }
        other => panic!("expected one budget end, got {other:?}"),
    }
    let notice = root
        .events()
        .into_iter()
        .find_map(|e| {
            match e.body {
            EventBody::InboxSpliced(s) => s.inserted.into_iter().find(|m| {
                matches!(m.source, MessageSource::SubagentSettled { sender, .. } if sender == child)
            }),
            _ => None,
        }
        })
        .expect("the root was told");
    assert!(
        notice
            .text()
            .contains("reached its budget before it finished"),
        "{}",
        notice.text()
    );
    // The notice's turn asked nothing either: the run ends at the budget.
    assert_eq!(budget_end(&outcome).0, BudgetLimit::Requests);
    f.verify_and_close().await;
}

#[tokio::test(start_paused = true)]
async fn an_agent_budget_binds_only_its_agent() {
    let (f, root, outcome) = Fixture::run_root(Budget::agent().requests(2)).await;
    // The child ran (its request is not the root's), then the root's notice turn was refused.
    assert_eq!(f.model.requests(), (2, 1));
    assert_eq!(budget_end(&outcome), (BudgetLimit::Requests, 2, root.id()));
    assert_eq!(root.budget().map(|(_, used)| used.requests), Some(2));
    f.host.close().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_restart_rebuilds_what_the_tree_spent_from_the_store() {
    let (f, root, first) = Fixture::run_root(Budget::tree().requests(3)).await;
    assert_eq!(budget_end(&first).0, BudgetLimit::Requests);
    assert_eq!(f.model.requests(), (2, 1));
    let id = root.id();
    drop(root);
    let Fixture { host, model, dir } = f;
    host.close().await.unwrap();

    // A new process: the root resumed with no budget in its spec keeps the recorded one, and
    // its meter holds the child's request as well as its own two.
    let f = Fixture::over(dir, model);
    let root = within(f.host.agents.resume(id, f.spec(None)))
        .await
        .unwrap();
    assert_eq!(
        root.budget().map(|(b, used)| (b, used.requests)),
        Some((Budget::tree().requests(3), 3))
    );
    let again = within(f.host.run(&root, "more")).await.unwrap();
    assert_eq!(budget_end(&again).0, BudgetLimit::Requests);
    assert_eq!(f.model.requests(), (2, 1), "nothing more was asked");
    f.host.close().await.unwrap();
}
