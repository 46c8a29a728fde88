//! `Host`: a prompt run to completion (the root and every child in its tree quiet), a run stopped
//! midway, and the shutdown in order.
//!
//! Time is paused and child models are held by gates the tests open on the root's own events.

use std::sync::Arc;

use lineage_agent::{Agent, Gate, Response};
use lineage_log::{ContentBlock, EventBody, Message, MessageSource, TurnEndReason, Usage};
use lineage_store::Store;
use lineage_subagent::tools::{BackgroundMode, SubagentToolConfig};
use lineage_subagent::{Host, Outcome};
use lineage_testkit::subagent::*;
use serde_json::json;
use tempfile::TempDir;

/// A host over a fresh store in a temporary directory, its agents answered by a [`Router`].
struct Fixture {
    dir: TempDir,
    router: Arc<Router>,
    host: Host,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = Store::open(dir.path().join("host.lineage")).expect("the store opens");
        let router = Arc::new(Router::default());
        let host = Host::new(store, router.clone()).expect("the host starts");
        Fixture { dir, router, host }
    }

    /// A root agent asking the `parent` model, with the delegation tools of a continuable
    /// `subagent` over `spawn`.
    async fn root(&self) -> Arc<Agent> {
        let tools = self.host.delegation_tools(vec![SubagentToolConfig {
            background: BackgroundMode::Continuable,
            agent_options: child_options(),
            ..SubagentToolConfig::new("spawn")
        }]);
        self.host
            .agents
            .create(lineage_agent::CreateAgent::fresh(parent_spec(tools)))
            .await
            .expect("the root is created")
    }

    /// Scripts the root to delegate "take forever" to a child whose model never answers, then
    /// to answer with `then`, one response a request.
    fn script_a_child_that_works_on(&self, then: impl IntoIterator<Item = Response>) {
        self.router.script(CHILD, [Response::hang()]);
        let delegating = std::iter::once(delegate("take forever")).chain(then);
        self.router.script(PARENT, delegating);
    }

    /// A root that delegated a job to a child still working on it (see
    /// [`Fixture::script_a_child_that_works_on`]), the root itself idle after answering
    /// "running" and then with `then`.
    async fn root_with_a_working_child(
        &self,
        then: impl IntoIterator<Item = Response>,
    ) -> Arc<Agent> {
        let answers = std::iter::once(Response::text("running")).chain(then);
        self.script_a_child_that_works_on(answers);
        let root = self.root().await;
        root.followup(user("delegate a long job")).unwrap();
        within(self.router.model(CHILD).wait_for_requests(1)).await;
        within(root.when_idle()).await;
        root
    }

    /// Closes the host and reopens its store file, which must verify.
    async fn close_and_verify(self) -> Store {
        self.host.close().await.expect("the host closes");
        let store = Store::open(self.dir.path().join("host.lineage")).expect("the store reopens");
        let report = store.verify().expect("verify runs");
        assert!(
            report.is_ok(),
            "the store verifies: {:?}",
            report.failures().collect::<Vec<_>>()
        );
        store
    }
}

fn delegate(prompt: &str) -> Response {
    let arguments = json!({"description": "a job", "prompt": prompt}).to_string();
    Response::tool_call("c1", "subagent", &arguments)
}

/// Resolves once `agent` has ended `n` turns.
async fn turns_ended(agent: &Agent, n: usize) {
    let mut changes = agent.changes();
    while turn_ends(&agent.events()).len() < n {
        changes.changed().await.expect("the agent is live");
    }
}

#[tokio::test(start_paused = true)]
async fn run_returns_the_answer_stop_reason_and_usage_of_a_text_turn() {
    let f = Fixture::new();
    f.router.script(PARENT, [Response::text("four")]);
    let root = f.root().await;
    let outcome = within(f.host.run(&root, "what is 2 + 2?")).await.unwrap();
    assert_eq!(
        outcome,
        Outcome {
            session: root.id(),
            output: Some(Message {
                content: vec![ContentBlock::text("four")],
                ..outcome.output.clone().expect("an answer")
            }),
            stop_reason: Some(TurnEndReason::Completed),
            turns: 1,
            usage: Usage {
                input_tokens: 10,
                output_tokens: 4,
                cache_read_tokens: None,
            },
            stopped: false,
        }
    );
    assert_eq!(outcome.text(), "four");
    assert!(outcome.completed());

    // A second run covers only its own prompt's events.
    f.router.script(PARENT, [Response::text("six")]);
    let outcome = within(f.host.run(&root, "and 3 + 3?")).await.unwrap();
    assert_eq!((outcome.text().as_str(), outcome.turns), ("six", 1));
    assert_eq!(outcome.usage.output_tokens, 3);
    drop(root);
    f.close_and_verify().await;
}

#[tokio::test(start_paused = true)]
async fn run_waits_for_a_continuable_child_that_reports_and_settles() {
    let f = Fixture::new();
    let (report_gate, answer_gate) = (Gate::new(), Gate::new());
    f.router.script(
        CHILD,
        [
            Response::tool_call("r1", "report", r#"{"output":"halfway there"}"#)
                .gated(&report_gate),
            Response::text("the answer is 42").gated(&answer_gate),
        ],
    );
    f.router.script(
        PARENT,
        [
            delegate("find the answer"),
            Response::text("it is running"),
            Response::text("noted the progress"),
            Response::text("the child says 42"),
        ],
    );
    let root = f.root().await;
    // The child's report comes after the root's first turn, its answer after the report's turn:
    // three root turns, in this order.
    let (outcome, ()) = within(async {
        tokio::join!(f.host.run(&root, "delegate the question"), async {
            turns_ended(&root, 1).await;
            report_gate.open();
            turns_ended(&root, 2).await;
            answer_gate.open();
        })
    })
    .await;
    let outcome = outcome.unwrap();
    assert_eq!(outcome.text(), "the child says 42");
    assert_eq!(outcome.turns, 3);
    assert!(outcome.completed() && !outcome.stopped);
    // Four model calls of the root: 10 input tokens each, 5 output for the tool call.
    assert_eq!(outcome.usage.input_tokens, 40);
    assert_eq!(outcome.usage.output_tokens, 5 + 13 + 18 + 17);

    // The run returned only after the child settled and the root answered its notice.
    assert!(f.host.subagents.resident().is_empty());
    assert!(f.host.is_quiet(&root));
    let sources: Vec<_> = root
        .events()
        .into_iter()
        .filter_map(|e| match e.body {
            EventBody::UserMessage(m) => Some(m.source),
            _ => None,
        })
        .collect();
    assert!(matches!(
        sources.as_slice(),
        [
            MessageSource::User,
            MessageSource::SubagentReport { .. },
            MessageSource::SubagentSettled { .. },
        ]
    ));
    let last_request = f.router.model(PARENT).requests().pop().expect("requests");
    let notice = last_request.messages.last().expect("a message");
    assert!(notice.text().contains("the answer is 42"), "{notice:?}");
    drop(root);
    f.close_and_verify().await;
}

#[tokio::test(start_paused = true)]
async fn run_until_stops_the_root_and_its_children_and_leaves_every_log_balanced() {
    let f = Fixture::new();
    // The notice of the interrupted child wakes the root; that turn is cancelled too, wherever
    // it is, so its response hangs rather than depending on how far it got.
    f.script_a_child_that_works_on([Response::text("it is running"), Response::hang()]);
    let root = f.root().await;
    let child_model = f.router.model(CHILD);
    let outcome = within(f.host.run_until(
        &root,
        user("delegate a long job"),
        child_model.wait_for_requests(1),
    ))
    .await
    .unwrap();
    assert!(outcome.stopped);
    assert!(
        matches!(outcome.stop_reason, Some(TurnEndReason::Aborted { .. })),
        "{outcome:?}"
    );
    assert!(f.host.subagents.resident().is_empty());
    assert!(f.host.is_quiet(&root));
    let child = f.host.store.children(root.id()).expect("children")[0];
    let child_events = f
        .host
        .store
        .read_from(child, 0)
        .expect("the child is stored");
    assert!(matches!(
        turn_ends(&child_events).as_slice(),
        [TurnEndReason::Aborted { .. }]
    ));
    assert_balanced(&child_events);
    assert_balanced(&root.events());

    // The host still serves the root afterwards.
    f.router.script(PARENT, [Response::text("back")]);
    let outcome = within(f.host.run(&root, "are you there?")).await.unwrap();
    assert_eq!(outcome.text(), "back");
    drop(root);
    f.close_and_verify().await;
}

#[tokio::test(start_paused = true)]
async fn close_tears_down_a_resident_child_first_and_its_parent_is_told() {
    let f = Fixture::new();
    let root = f.root_with_a_working_child([]).await;
    let root_id = root.id();
    drop(root);
    let store = within(f.close_and_verify()).await;
    let child = store.children(root_id).expect("children")[0];
    let child_events = store.read_from(child, 0).expect("the child is stored");
    assert!(matches!(
        turn_ends(&child_events).as_slice(),
        [TurnEndReason::Aborted { .. }]
    ));
    // The root was told before it was disposed of: the notice sits in its stored inbox.
    let root_events = store.read_from(root_id, 0).expect("the root is stored");
    let told = root_events.iter().any(|e| {
        match &e.body {
        EventBody::InboxSpliced(splice) => splice.inserted.iter().any(|m| {
            matches!(m.source, MessageSource::SubagentSettled { sender, .. } if sender == child)
        }),
        _ => false,
    }
    });
    assert!(told, "the root holds the child's notice");
}

#[tokio::test(start_paused = true)]
async fn a_run_waits_only_for_its_own_tree() {
    let f = Fixture::new();
    let busy = f.root_with_a_working_child([Response::text("hello")]).await;

    let other = f.root().await;
    let outcome = within(f.host.run(&other, "hi")).await.unwrap();
    assert_eq!(outcome.text(), "hello");
    assert!(!f.host.is_quiet(&busy), "the other tree still works");
    drop((busy, other));
    f.close_and_verify().await;
}
