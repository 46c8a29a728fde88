//! One-shot delegation: the order and codes of refusals, spawn and fork seeds, a child's first own
//! events and header, depth, the policy fixed at delegation time, results, lifecycle events, the
//! `subagent` tool and tool filters.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use lineage_agent::{
    Agent, AgentOptions, AgentSpec, CreateAgent, Gate, INVALID_ARGUMENTS, Queued, Response,
    TOOL_NOT_AVAILABLE, Tool, ToolOutput,
};
use lineage_log::{
    AbortCause, ApprovalPolicy, ContentBlock, DescriptorMode, Digest, Event, EventBody, Origin,
    PolicySource, SandboxMode, SubagentDescriptor, Text, ToolFilter, TurnEndReason,
    fold_descriptor, fold_header, fold_lineage, fold_policy, seed_len,
};
use lineage_subagent::tools::{MaxDepth, SubagentTool, SubagentToolConfig};
use lineage_subagent::{
    ALREADY_RECORDED, Capabilities, Capability, DELEGATION_CONTEXT, DepthExceeded, ErrorCode,
    ForkProvider, Lifecycle, STRUCTURED_OUTPUT, SpawnProvider, StartRequest, StopReason,
    SubagentError, SubagentResult, SubagentRun, SubagentRuntime,
};
use lineage_testkit::continuation::*;
use lineage_testkit::running_digests;
use lineage_testkit::subagent::*;
use serde_json::json;
use tokio::sync::mpsc::UnboundedReceiver;

// ----- helpers -----------------------------------------------------------------------------------

/// A request that uses every start option, each valid.
fn every_option(parent: &Arc<Agent>) -> StartRequest {
    StartRequest {
        output_schema: Some(json!({"type": "object"})),
        max_depth: Some(5),
        tool_filter: Some(ToolFilter {
            allow: Some(Vec::new()),
            deny: None,
        }),
        persona: Some("You check facts.".into()),
        ..request(parent, "task")
    }
}

fn without(mut request: StartRequest, capability: Capability) -> StartRequest {
    match capability {
        Capability::OutputSchema => request.output_schema = None,
        Capability::DepthLimit => request.max_depth = None,
        Capability::ToolFilter => request.tool_filter = None,
        Capability::Persona => request.persona = None,
    }
    request
}

const CAPABILITIES: [Capability; 4] = [
    Capability::OutputSchema,
    Capability::DepthLimit,
    Capability::ToolFilter,
    Capability::Persona,
];

fn lacking(capability: Capability) -> Capabilities {
    let mut capabilities = Capabilities::ALL;
    let supported = match capability {
        Capability::OutputSchema => &mut capabilities.output_schema,
        Capability::DepthLimit => &mut capabilities.depth_limit,
        Capability::ToolFilter => &mut capabilities.tool_filter,
        Capability::Persona => &mut capabilities.persona,
    };
    *supported = false;
    capabilities
}

fn filter(allow: Option<&[&str]>, deny: Option<&[&str]>) -> ToolFilter {
    let names = |names: &[&str]| names.iter().map(|n| Text::from(*n)).collect::<Vec<_>>();
    ToolFilter {
        allow: allow.map(names),
        deny: deny.map(names),
    }
}

/// A parent tool `delegate` that starts a child through `provider` with the prompt `child task`
/// while its turn is open, keeps the run in `slot`, and answers with the child's text.
fn delegate_tool(
    runtime: &SubagentRuntime,
    provider: &'static str,
    slot: Arc<Mutex<Option<SubagentRun>>>,
) -> Arc<dyn Tool> {
    let runtime = runtime.clone();
    FnTool::new("delegate", move |ctx, _| {
        let (runtime, slot) = (runtime.clone(), slot.clone());
        async move {
            let request = StartRequest {
                agent_options: child_options(),
                ..StartRequest::new(ctx.agent.clone(), "child task")
            };
            let failed =
                |e: SubagentError| ToolOutput::error("E", e.code().as_str(), e.to_string());
            let run = match runtime.start(provider, request).await {
                Ok(run) => run,
                Err(error) => return failed(error),
            };
            *lock(&slot) = Some(run.clone());
            match run.result().await {
                Ok(result) => ToolOutput::text(result.text()),
                Err(error) => failed(error),
            }
        }
    })
}

fn subagent_tool(h: &Harness, config: SubagentToolConfig) -> Arc<SubagentTool> {
    SubagentTool::new(
        &h.runtime,
        SubagentToolConfig {
            agent_options: child_options(),
            ..config
        },
    )
    .expect("the tool is built")
}

/// A model call of the `subagent` tool.
fn delegation(id: &str, description: &str, prompt: &str) -> Response {
    let arguments = json!({"description": description, "prompt": prompt}).to_string();
    Response::tool_call(id, "subagent", &arguments)
}

fn own_kinds(events: &[lineage_log::Event]) -> Vec<&'static str> {
    kinds(&events[seed_len(events) as usize..])
}

/// A child answer that repeats its prompt.
fn answer_to_prompt() -> Response {
    Response::compute(|request| {
        let prompt = request
            .messages
            .last()
            .map(|m| m.text())
            .unwrap_or_default();
        Response::text(&format!("answer to {prompt}"))
    })
}

/// A harness whose parent model answers with `parent_answers` and whose child model answers with
/// `child_answers`, one a request, in order.
fn scripted(parent_answers: &[&str], child_answers: &[&str]) -> Harness {
    let h = Harness::new();
    h.parent_model()
        .push(parent_answers.iter().map(|text| Response::text(text)));
    h.child_model()
        .push(child_answers.iter().map(|text| Response::text(text)));
    h
}

/// What a refused start must leave as it was: the store's footprint (taken when the watch
/// begins, and adjusted by a test that changes it on purpose), the lifecycle, which hears
/// nothing, and the child model, never asked.
struct Untouched {
    footprint: Footprint,
    lifecycle: UnboundedReceiver<Lifecycle>,
}

impl Untouched {
    fn watch(h: &Harness) -> Untouched {
        let (_, lifecycle) = listen(&h.runtime);
        Untouched {
            footprint: h.footprint(),
            lifecycle,
        }
    }

    fn assert_untouched(mut self, h: &Harness) {
        assert_eq!(
            h.footprint(),
            self.footprint,
            "a refusal stores and publishes nothing"
        );
        assert!(
            drain(&mut self.lifecycle).is_empty(),
            "a refusal emits no event"
        );
        assert!(
            h.child_model().requests().is_empty(),
            "no child asked its model"
        );
    }
}

/// A harness, its parent, and a watch (see [`Untouched`]) begun once the parent exists.
async fn a_watched_parent() -> (Harness, Arc<Agent>, Untouched) {
    let h = Harness::new();
    let parent = h.parent().await;
    let watch = Untouched::watch(&h);
    (h, parent, watch)
}

/// A parent of `h` that has completed one turn, on "hello".
async fn parent_after_a_turn(h: &Harness) -> Arc<Agent> {
    let parent = h.parent().await;
    run_turn(&parent, "hello").await;
    parent
}

/// Starts `start()` through `spawn` and then through `fork`, checks that both refuse it with
/// `code`, and returns their errors.
async fn refused_by_both(
    h: &Harness,
    start: impl Fn() -> StartRequest,
    code: ErrorCode,
) -> Vec<SubagentError> {
    let mut errors = Vec::new();
    for provider in ["spawn", "fork"] {
        let error = refusal(h.runtime.start(provider, start()).await);
        assert_eq!(error.code(), code, "{provider}: {error}");
        errors.push(error);
    }
    errors
}

/// Asks `spawn` for `start`, runs `interrupt` before the start is awaited, and checks that the
/// start is refused with `code` and, no child created, leaves what `watch` holds as it was.
async fn interrupted_before_the_child_exists(
    h: &Harness,
    watch: Untouched,
    start: StartRequest,
    interrupt: impl Future<Output = ()>,
    code: ErrorCode,
) {
    let starting = h.runtime.start("spawn", start);
    interrupt.await;
    let error = refusal(within(starting).await);
    assert_eq!(error.code(), code, "{error}");
    watch.assert_untouched(h);
}

/// Starts `start` through `provider` and waits for its result.
async fn finished(
    h: &Harness,
    provider: &str,
    start: StartRequest,
) -> (SubagentRun, SubagentResult) {
    let run = within(h.runtime.start(provider, start))
        .await
        .expect("the run starts");
    let result = within(run.result()).await.expect("the run has a result");
    (run, result)
}

/// Starts `start` through `spawn`, its child to answer `answer` once the returned gate opens, and
/// waits until the child asked its model.
async fn working(h: &Harness, start: StartRequest, answer: &str) -> (SubagentRun, Gate) {
    let gate = gated_text(&h.child_model(), answer);
    let run = within(h.runtime.start("spawn", start))
        .await
        .expect("the run starts");
    within(h.child_model().wait_for_requests(1)).await;
    (run, gate)
}

/// A harness and its parent whose tools are the `subagent` tool `config` builds (see
/// [`subagent_tool`]).
async fn delegating(config: SubagentToolConfig) -> (Harness, Arc<Agent>) {
    let h = Harness::new();
    let tool = subagent_tool(&h, config);
    let parent = h.parent_with(parent_spec(vec![tool])).await;
    (h, parent)
}

/// The `subagent` tool over `spawn` whose children may delegate `depth` levels below the
/// caller.
fn limited_to(depth: u32) -> SubagentToolConfig {
    SubagentToolConfig {
        max_depth: MaxDepth::Limit(depth),
        ..SubagentToolConfig::new("spawn")
    }
}

/// A harness and its parent whose `delegate` tool forks a child (see [`delegate_tool`]), and the
/// slot that tool keeps the run in. The parent's model answers with `answers_before`, then calls
/// `delegate`, then says "parent done"; the child answers "child answer".
async fn forking_parent(
    answers_before: &[&str],
) -> (Harness, Arc<Agent>, Arc<Mutex<Option<SubagentRun>>>) {
    let h = scripted(answers_before, &["child answer"]);
    h.parent_model().push([
        Response::tool_call("c1", "delegate", "{}"),
        Response::text("parent done"),
    ]);
    let slot = Arc::new(Mutex::new(None));
    let tool = delegate_tool(&h.runtime, "fork", slot.clone());
    let parent = h.parent_with(parent_spec(vec![tool])).await;
    (h, parent, slot)
}

/// A parent of `h` at delegation depth `depth`.
async fn parent_at_depth(h: &Harness, depth: u32) -> Arc<Agent> {
    h.parent_with(AgentSpec {
        options: AgentOptions {
            subagent_depth: depth,
            ..parent_options()
        },
        ..AgentSpec::default()
    })
    .await
}

/// The spec of a parent with the tools `echo` and `search`.
fn echo_and_search() -> AgentSpec {
    parent_spec(vec![plain_tool("echo"), plain_tool("search")])
}

/// Checks that a child's log `events` is balanced and its one turn was aborted by its parent.
fn assert_aborted_by_its_parent(events: Vec<Event>) {
    assert_balanced(&events);
    assert_eq!(
        turn_ends(&events),
        [TurnEndReason::Aborted {
            cause: AbortCause::Parent
        }]
    );
}

/// Checks that `answer` is an error with `code` whose text holds each of `texts`.
fn assert_failed(answer: &Answer, code: &str, texts: &[&str]) {
    assert!(answer.is_error, "{answer:?}");
    assert_eq!(answer.code.as_deref(), Some(code));
    for text in texts {
        assert!(answer.text.contains(text), "{}", answer.text);
    }
}

// ----- validation ------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_start_naming_no_registered_provider_is_refused_with_no_provider() {
    let h = Harness::bare();
    let parent = h.parent().await;
    let watch = Untouched::watch(&h);

    let error = refusal(h.runtime.start("spawn", request(&parent, "task")).await);
    assert_eq!(error.code(), ErrorCode::NoProvider);
    assert_eq!(error.code().as_str(), "NO_PROVIDER");
    assert!(error.message().contains("\"spawn\""), "{error}");

    // The provider is checked first: a request that is wrong in every other way still gets
    // NO_PROVIDER.
    h.runtime
        .register_provider(Arc::new(SpawnProvider::new()))
        .unwrap();
    let everything_wrong = StartRequest {
        output_schema: Some(json!({"type": "string"})),
        max_depth: Some(0),
        tool_filter: Some(filter(Some(&["nope"]), None)),
        ..request(&parent, "task")
    };
    parent.dispose().await;
    let error = refusal(h.runtime.start("fork", everything_wrong).await);
    assert_eq!(error.code(), ErrorCode::NoProvider);
    assert!(error.message().contains("\"fork\""), "{error}");

    let mut watch = watch;
    watch.footprint.live.remove(&parent.id());
    watch.assert_untouched(&h);
}

#[tokio::test(start_paused = true)]
async fn a_removed_provider_refuses_new_starts_while_its_running_child_finishes() {
    let h = Harness::new();
    let parent = h.parent().await;
    let (run, gate) = working(&h, request(&parent, "long task"), "finished anyway").await;

    let removed = h.runtime.remove_provider("spawn").expect("spawn was there");
    assert_eq!(removed.name(), "spawn");
    assert!(h.runtime.remove_provider("spawn").is_none());
    assert!(h.runtime.provider("spawn").is_none());
    assert_eq!(h.runtime.providers(), ["fork"]);

    let before = h.footprint();
    let error = refusal(h.runtime.start("spawn", request(&parent, "again")).await);
    assert_eq!(error.code(), ErrorCode::NoProvider);
    assert_eq!(h.footprint(), before);

    gate.open();
    let result = within(run.result()).await.expect("the run has a result");
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(result.text(), "finished anyway");
    within(run.dispose()).await.expect("the run is disposed");
}

#[tokio::test(start_paused = true)]
async fn unsupported_capabilities_are_refused_in_the_documented_order_naming_each() {
    let h = Harness::bare();
    let none = CannedProvider::new("limited", Capabilities::NONE);
    h.runtime.register_provider(none.clone()).unwrap();
    let parent = h.parent().await;
    let watch = Untouched::watch(&h);

    // Everything is unsupported: the first option in the documented order is named, and dropping
    // it names the next.
    let mut request = every_option(&parent);
    for capability in CAPABILITIES {
        let error = refusal(h.runtime.start("limited", request.clone()).await);
        assert_eq!(error.code(), ErrorCode::UnsupportedCapability, "{error}");
        assert_eq!(error.code().as_str(), "UNSUPPORTED_CAPABILITY");
        let named = format!("\"{}\"", capability.as_str());
        assert!(error.message().contains(&named), "{capability:?}: {error}");
        assert!(error.message().contains("\"limited\""), "{error}");
        for later in CAPABILITIES.iter().filter(|c| **c != capability) {
            assert!(
                !error.message().contains(&format!("\"{}\"", later.as_str())),
                "only the first unsupported capability is named: {error}"
            );
        }
        request = without(request, capability);
    }
    assert!(none.started().is_empty(), "the provider was never asked");

    // A provider lacking exactly one capability refuses a request using all four, naming it.
    for capability in CAPABILITIES {
        let name = format!("without-{}", capability.as_str());
        h.runtime
            .register_provider(CannedProvider::new(&name, lacking(capability)))
            .unwrap();
        let error = refusal(h.runtime.start(&name, every_option(&parent)).await);
        assert_eq!(error.code(), ErrorCode::UnsupportedCapability);
        assert!(
            error
                .message()
                .contains(&format!("\"{}\"", capability.as_str())),
            "{error}"
        );
    }
    watch.assert_untouched(&h);

    // A request using none of them goes through.
    let run = h.runtime.start("limited", request).await.expect("starts");
    assert_eq!(none.started().len(), 1);
    within(run.dispose()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_checks_run_provider_then_capability_then_schema_then_parent_then_depth() {
    let h = Harness::new();
    h.runtime
        .register_provider(CannedProvider::new(
            "no-schema",
            lacking(Capability::OutputSchema),
        ))
        .unwrap();
    let parent = h.parent().await;
    parent.dispose().await;
    let watch = Untouched::watch(&h);
    let bad_schema = StartRequest {
        output_schema: Some(json!({"type": "string"})),
        max_depth: Some(0),
        ..request(&parent, "task")
    };
    async fn code(h: &Harness, provider: &str, request: StartRequest) -> ErrorCode {
        refusal(h.runtime.start(provider, request).await).code()
    }
    assert_eq!(
        code(&h, "missing", bad_schema.clone()).await,
        ErrorCode::NoProvider
    );
    assert_eq!(
        code(&h, "no-schema", bad_schema.clone()).await,
        ErrorCode::UnsupportedCapability,
        "an unsupported option is refused before its value is checked"
    );
    assert_eq!(
        code(&h, "spawn", bad_schema.clone()).await,
        ErrorCode::InvalidRequest,
        "a bad schema is refused before the parent is looked at"
    );
    let dead_parent = StartRequest {
        output_schema: Some(json!({"type": "object"})),
        ..bad_schema
    };
    assert_eq!(
        code(&h, "spawn", dead_parent).await,
        ErrorCode::ParentUnavailable,
        "the parent is checked before the depth"
    );
    watch.assert_untouched(&h);
}

#[tokio::test(start_paused = true)]
async fn an_output_schema_outside_the_supported_subset_is_an_invalid_request() {
    let (h, parent, watch) = a_watched_parent().await;
    // Each schema, and the part of it its refusal names where it names one.
    for (schema, pointer) in [
        (json!({"type": "string"}), None),
        (json!(["object"]), None),
        (json!({"properties": {"a": {"type": "string"}}}), None),
        (
            json!({"type": "object", "properties": {"a": {"$ref": "#/defs/a"}}}),
            None,
        ),
        (json!({"type": "object", "required": "a"}), None),
        (
            json!({"type": "object", "properties": {"a": {"$ref": "#/x"}}}),
            Some("/properties/a/$ref"),
        ),
    ] {
        let start = StartRequest {
            output_schema: Some(schema.clone()),
            ..request(&parent, "task")
        };
        let error = refusal(h.runtime.start("spawn", start).await);
        assert_eq!(error.code(), ErrorCode::InvalidRequest, "{schema}: {error}");
        assert_eq!(error.code().as_str(), "INVALID_REQUEST");
        assert!(
            error.message().starts_with("invalid output schema"),
            "{error}"
        );
        if let Some(pointer) = pointer {
            assert!(error.message().contains(pointer), "{error}");
        }
    }
    watch.assert_untouched(&h);
}

#[tokio::test(start_paused = true)]
async fn a_parent_that_is_not_the_live_agent_is_refused_with_parent_unavailable() {
    let h = scripted(&["hi"], &["from the resumed parent's child"]);
    let parent = parent_after_a_turn(&h).await;
    parent.dispose().await;
    let watch = Untouched::watch(&h);

    let error = refusal(h.runtime.start("spawn", request(&parent, "task")).await);
    assert_eq!(error.code(), ErrorCode::ParentUnavailable);
    assert_eq!(error.code().as_str(), "PARENT_UNAVAILABLE");
    assert!(
        error.message().contains(&parent.id().to_string()),
        "{error}"
    );

    // Resumed, the session is live again, but only through the new handle: the stale one keeps
    // being refused.
    let resumed = h
        .agents
        .resume(parent.id(), parent_spec(Vec::new()))
        .await
        .expect("the parent resumes");
    let error = refusal(h.runtime.start("fork", request(&parent, "task")).await);
    assert_eq!(error.code(), ErrorCode::ParentUnavailable);
    let mut watch = watch;
    watch.footprint.live.insert(resumed.id());
    watch.assert_untouched(&h);

    let run = within(h.runtime.start("spawn", request(&resumed, "task")))
        .await
        .expect("the live parent delegates");
    let result = within(run.result()).await.unwrap();
    assert_eq!(result.text(), "from the resumed parent's child");
    within(run.dispose()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_child_deeper_than_max_depth_is_refused_with_the_attempted_and_allowed_depths() {
    let h = scripted(&[], &["deep enough"]);
    let top = h.parent().await;
    let deep = parent_at_depth(&h, 2).await;
    let watch = Untouched::watch(&h);

    for (parent, max, attempted) in [(&top, 0, 1), (&deep, 2, 3), (&deep, 0, 3)] {
        let too_deep = || StartRequest {
            max_depth: Some(max),
            ..request(parent, "task")
        };
        for error in refused_by_both(&h, too_deep, ErrorCode::DepthExceeded).await {
            assert_eq!(error.code().as_str(), "DEPTH_EXCEEDED");
            assert_eq!(
                error.depth_exceeded(),
                Some(&DepthExceeded { attempted, max }),
                "{error}"
            );
            assert!(error.message().contains(&attempted.to_string()));
        }
    }
    watch.assert_untouched(&h);

    // At the limit the child is allowed.
    let start = StartRequest {
        max_depth: Some(3),
        ..request(&deep, "task")
    };
    let run = within(h.runtime.start("spawn", start)).await.unwrap();
    let child = run.local_agent().expect("a local child").clone();
    assert_eq!(child.delegation_depth(), 3);
    within(run.dispose()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn registering_a_taken_provider_name_is_refused_and_keeps_the_first() {
    let h = Harness::new();
    let first = h.runtime.provider("spawn").expect("registered");
    let error = h
        .runtime
        .register_provider(Arc::new(SpawnProvider::new()))
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::DuplicateProvider);
    assert_eq!(error.code().as_str(), "DUPLICATE_PROVIDER");
    assert!(error.message().contains("\"spawn\""), "{error}");
    let error = h
        .runtime
        .register_provider(Arc::new(ForkProvider::named("spawn")))
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::DuplicateProvider);
    assert_eq!(h.runtime.providers(), ["spawn", "fork"]);
    let kept = h.runtime.provider("spawn").unwrap();
    assert!(Arc::ptr_eq(&kept, &first));
    assert!(!kept.inherits_parent_context());

    // Once removed, the name can be taken again.
    h.runtime.remove_provider("spawn");
    h.runtime
        .register_provider(Arc::new(ForkProvider::named("spawn")))
        .expect("the name is free");
    assert_eq!(h.runtime.providers(), ["fork", "spawn"]);
    assert!(
        h.runtime
            .provider("spawn")
            .unwrap()
            .inherits_parent_context()
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_cancelled_before_it_starts_is_refused_with_cancelled() {
    let (h, parent, watch) = a_watched_parent().await;
    let cancelled = || {
        let start = request(&parent, "task");
        start.cancel.cancel(AbortCause::User);
        start
    };
    for error in refused_by_both(&h, cancelled, ErrorCode::Cancelled).await {
        assert_eq!(error.code().as_str(), "CANCELLED");
    }
    watch.assert_untouched(&h);
}

#[tokio::test(start_paused = true)]
async fn a_request_cancelled_before_the_child_is_created_is_refused_with_cancelled() {
    let (h, parent, watch) = a_watched_parent().await;
    let start = request(&parent, "task");
    let cancel = start.cancel.clone();
    let cancelling = async move {
        cancel.cancel(AbortCause::User);
    };
    interrupted_before_the_child_exists(&h, watch, start, cancelling, ErrorCode::Cancelled).await;
}

#[tokio::test(start_paused = true)]
async fn a_parent_disposed_before_the_child_is_created_is_refused_with_parent_unavailable() {
    let h = Harness::new();
    let parent = h.parent_with(parent_spec(vec![plain_tool("search")])).await;
    // The parent leaves: that is all that changes.
    let mut watch = Untouched::watch(&h);
    watch.footprint.live.remove(&parent.id());
    let start = request(&parent, "task");
    let unavailable = ErrorCode::ParentUnavailable;
    interrupted_before_the_child_exists(&h, watch, start, parent.dispose(), unavailable).await;
}

#[tokio::test(start_paused = true)]
async fn a_child_the_registry_refuses_leaves_nothing_behind() {
    let (h, parent, watch) = a_watched_parent().await;
    let no_tokens = || {
        let mut start = request(&parent, "task");
        start.agent_options.max_tokens = Some(0);
        start
    };
    for error in refused_by_both(&h, no_tokens, ErrorCode::InvalidRequest).await {
        assert!(error.message().contains("max_tokens"), "{error}");
    }
    watch.assert_untouched(&h);
}

// ----- seeds -----------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_spawn_child_starts_fresh_with_its_lineage_at_seq_zero() {
    let h = scripted(&["first answer"], &["child answer"]);
    let parent = parent_after_a_turn(&h).await;

    let (run, result) = finished(&h, "spawn", request(&parent, "child task")).await;
    assert_eq!(result.text(), "child answer");
    let events = run.local_agent().unwrap().events();
    assert_eq!(seed_len(&events), 0);
    assert_eq!(events[0].kind().name(), "session/lineage");
    let lineage = fold_lineage(&events).unwrap();
    assert_eq!(lineage.parent, parent.id());
    assert_eq!(lineage.seed_len, 0);
    assert_eq!(lineage.seed_digest, Digest::of_empty());
    assert_eq!(lineage.delegation_depth, 1);
    // The child sees its task and nothing of the parent's conversation.
    let asked = &h.child_model().requests()[0];
    assert_eq!(message_texts(asked), ["child task"]);
    assert_eq!(user_texts(&events), ["child task"]);
    within(run.dispose()).await.unwrap();
    h.assert_verified();
}

#[tokio::test(start_paused = true)]
async fn a_fork_inherits_the_completed_turns_but_not_the_turn_in_flight() {
    let (h, parent, slot) = forking_parent(&["first answer"]).await;
    run_turn(&parent, "hello").await;
    let completed = parent.events();
    assert_eq!(completed.last().unwrap().kind().name(), "turn/end");
    run_turn(&parent, "now delegate").await;

    let run = lock(&slot).clone().expect("the tool started a run");
    let child = run.local_agent().expect("a local child").clone();
    let events = child.events();
    let seed = completed.len();
    assert_eq!(seed_len(&events), seed as u64);
    assert_eq!(
        &events[..seed],
        &completed[..],
        "the prefix is the parent's first turn, verbatim"
    );
    assert_eq!(events[seed].kind().name(), "session/lineage");
    let lineage = fold_lineage(&events).unwrap();
    assert_eq!(lineage.parent, parent.id());
    assert_eq!(lineage.delegation_depth, 1);
    assert_eq!(
        lineage.seed_digest,
        running_digests(&parent.events())[seed],
        "the seed digest is the parent's running digest at seed_len - 1"
    );
    // The child saw the completed turn, not the one that delegated.
    let asked = &h.child_model().requests()[0];
    assert_eq!(
        message_texts(asked),
        ["hello", "first answer", "child task"]
    );
    assert!(!user_texts(&events).contains(&"now delegate".to_owned()));
    // Its own turn is numbered after the inherited one.
    let own_turns: Vec<_> = events[seed..]
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::TurnStart(t) => Some(t.turn),
            _ => None,
        })
        .collect();
    assert_eq!(own_turns, [2]);
    // The parent got the child's answer.
    let answers = tool_results(&parent.events());
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].text, "child answer");
    assert!(!answers[0].is_error);
    within(run.dispose()).await.unwrap();
    assert_balanced(&parent.events());
    h.assert_verified();
}

#[tokio::test(start_paused = true)]
async fn a_fork_asked_for_from_outside_while_the_parent_is_mid_turn_inherits_only_completed_turns()
{
    let h = Harness::new();
    let gate = Gate::new();
    h.parent_model().push([
        Response::text("first answer"),
        Response::text("second answer").gated(&gate),
    ]);
    h.child_model().push([Response::text("child answer")]);
    let parent = parent_after_a_turn(&h).await;
    let completed = parent.events();
    parent.followup(user("second question")).unwrap();
    within(h.parent_model().wait_for_requests(2)).await;
    assert!(
        parent.events().len() > completed.len(),
        "the second turn is open"
    );

    let (run, result) = finished(&h, "fork", request(&parent, "child task")).await;
    assert_eq!(result.text(), "child answer");
    let events = run.local_agent().unwrap().events();
    assert_eq!(seed_len(&events), completed.len() as u64);
    assert_eq!(&events[..completed.len()], &completed[..]);
    assert_eq!(
        fold_lineage(&events).unwrap().seed_digest,
        running_digests(&completed)[completed.len()]
    );
    assert_eq!(
        message_texts(&h.child_model().requests()[0]),
        ["hello", "first answer", "child task"]
    );

    gate.open();
    within(parent.when_idle()).await;
    assert_balanced(&parent.events());
    within(run.dispose()).await.unwrap();
    h.assert_verified();
}

#[tokio::test(start_paused = true)]
async fn a_fork_of_a_parent_without_a_completed_turn_starts_fresh() {
    let (h, parent, slot) = forking_parent(&[]).await;
    run_turn(&parent, "delegate at once").await;

    let run = lock(&slot).clone().expect("the tool started a run");
    let events = run.local_agent().unwrap().events();
    assert_eq!(seed_len(&events), 0);
    assert_eq!(events[0].kind().name(), "session/lineage");
    let lineage = fold_lineage(&events).unwrap();
    assert_eq!(lineage.seed_digest, Digest::of_empty());
    assert_eq!(lineage.parent, parent.id());
    assert_eq!(
        message_texts(&h.child_model().requests()[0]),
        ["child task"]
    );
    assert_eq!(tool_results(&parent.events())[0].text, "child answer");
    within(run.dispose()).await.unwrap();
    h.assert_verified();
}

#[tokio::test(start_paused = true)]
async fn a_fork_reads_the_parent_as_it_was_when_the_delegation_was_asked_for() {
    let h = scripted(&["first answer", "second answer"], &["child answer"]);
    let parent = parent_after_a_turn(&h).await;
    let completed = parent.events().len();

    let starting = h.runtime.start("fork", request(&parent, "child task"));
    run_turn(&parent, "more").await;
    let run = within(starting).await.unwrap();
    within(run.result()).await.unwrap();
    let events = run.local_agent().unwrap().events();
    assert_eq!(seed_len(&events), completed as u64);
    assert_eq!(
        message_texts(&h.child_model().requests()[0]),
        ["hello", "first answer", "child task"]
    );
    within(run.dispose()).await.unwrap();
    h.assert_verified();
}

// ----- birth -----------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn the_lineage_descriptor_and_policy_open_the_childs_own_suffix_and_the_header_agrees() {
    let h = scripted(&["first answer"], &["spawned", "forked"]);
    let parent = parent_after_a_turn(&h).await;
    let completed = parent.events().len() as u64;

    for (provider, seed) in [("spawn", 0), ("fork", completed)] {
        let start = StartRequest {
            label: Some("inspect the logs".into()),
            ..request(&parent, "child task")
        };
        let (run, _) = finished(&h, provider, start).await;
        let child = run.local_agent().unwrap().clone();
        assert_eq!(run.id(), child.id());
        let events = child.events();
        assert_eq!(seed_len(&events), seed, "{provider}");
        let own = &events[seed as usize..];
        assert_eq!(
            kinds(&own[..3]),
            ["session/lineage", "subagent/descriptor", "approval/policy"],
            "{provider}"
        );
        for later in &own[3..] {
            assert!(
                !matches!(
                    later.kind().name(),
                    "session/lineage" | "subagent/descriptor" | "approval/policy" | "sandbox/mode"
                ),
                "{provider}: no birth event after the setup: {:?}",
                kinds(own)
            );
        }
        let lineage = fold_lineage(&events).unwrap().clone();
        assert_eq!(lineage.parent, parent.id());
        assert_eq!(lineage.seed_len, seed);
        assert_eq!(lineage.delegation_depth, 1);
        assert_eq!(
            fold_descriptor(&events),
            Some(&SubagentDescriptor {
                label: Some("inspect the logs".into()),
                ..SubagentDescriptor::new(DescriptorMode::OneShot, provider)
            })
        );
        let policy = fold_policy(&events);
        assert_eq!(
            policy.approval,
            Some(&ApprovalPolicy {
                policy: ApprovalPolicy::NEVER.into(),
                source: PolicySource::Delegation,
            })
        );
        assert_eq!(policy.sandbox, None);

        let header = h.store.info(child.id()).unwrap().header;
        assert_eq!(header.id, child.id());
        assert_eq!(header.parent, Some(parent.id()));
        assert_eq!(header.seed_len, seed);
        assert_eq!(header.seed_digest, Some(lineage.seed_digest));
        assert_eq!(header.delegation_depth, 1);
        assert_eq!(header.origin, Some(Origin::Subagent));
        assert_eq!(fold_header(&header, &events), header, "{provider}");
        assert_eq!(child.header(), &header, "{provider}");
        assert!(h.children(&parent).contains(&child.id()));
        within(run.dispose()).await.unwrap();
    }
    h.assert_verified();
}

#[tokio::test(start_paused = true)]
async fn a_child_keeps_its_parents_working_directory_and_a_spawn_child_its_preset() {
    let h = scripted(&["first answer"], &["a", "b"]);
    let mut create = CreateAgent::fresh(parent_spec(Vec::new()));
    create.header.cwd = Some("/work/project".into());
    create.header.agent_preset = Some("reviewer".into());
    let parent = h.agents.create(create).await.unwrap();
    run_turn(&parent, "hello").await;
    for provider in ["spawn", "fork"] {
        let (run, _) = finished(&h, provider, request(&parent, "task")).await;
        let header = h.store.info(run.id()).unwrap().header;
        assert_eq!(header.cwd.as_deref(), Some("/work/project"), "{provider}");
        if provider == "spawn" {
            assert_eq!(header.agent_preset.as_deref(), Some("reviewer"));
        }
        within(run.dispose()).await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_fork_child_keeps_its_parents_agent_preset() {
    let h = scripted(&["first answer"], &["forked"]);
    let mut create = CreateAgent::fresh(parent_spec(Vec::new()));
    create.header.agent_preset = Some("reviewer".into());
    let parent = h.agents.create(create).await.unwrap();
    run_turn(&parent, "hello").await;
    let (run, _) = finished(&h, "fork", request(&parent, "task")).await;
    let child = run.local_agent().unwrap().clone();
    assert_eq!(child.header().agent_preset.as_deref(), Some("reviewer"));
    let header = h.store.info(run.id()).unwrap().header;
    assert_eq!(header.agent_preset.as_deref(), Some("reviewer"));
    within(run.dispose()).await.unwrap();
}

// ----- depth -----------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_childs_depth_is_one_below_its_parents_depth_floor() {
    let h = scripted(&[], &["a", "b"]);
    let deep = parent_at_depth(&h, 3).await;
    for provider in ["spawn", "fork"] {
        let (run, _) = finished(&h, provider, request(&deep, "task")).await;
        let child = run.local_agent().unwrap().clone();
        assert_eq!(child.delegation_depth(), 4, "{provider}");
        assert_eq!(child.options().subagent_depth, 4, "{provider}");
        assert_eq!(fold_lineage(&child.events()).unwrap().delegation_depth, 4);
        assert_eq!(h.store.info(child.id()).unwrap().header.delegation_depth, 4);
        within(run.dispose()).await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_resumed_parent_counts_depth_from_its_stored_lineage_not_a_lower_option() {
    let h = scripted(&[], &["child", "grandchild"]);
    let parent = h.parent().await;
    let (run, _) = finished(&h, "spawn", request(&parent, "task")).await;
    let child_id = run.id();
    within(run.dispose()).await.unwrap();
    assert!(
        h.agents.get(child_id).is_none(),
        "disposing the run releases the child"
    );

    let child = h
        .agents
        .resume(
            child_id,
            AgentSpec {
                options: AgentOptions {
                    model: Some(CHILD.into()),
                    subagent_depth: 0,
                    ..parent_options()
                },
                ..AgentSpec::default()
            },
        )
        .await
        .expect("the child resumes");
    assert_eq!(child.options().subagent_depth, 0);
    assert_eq!(child.delegation_depth(), 1, "the stored depth is a floor");

    let capped = StartRequest {
        max_depth: Some(1),
        ..request(&child, "too deep")
    };
    let error = refusal(h.runtime.start("spawn", capped).await);
    assert_eq!(
        error.depth_exceeded(),
        Some(&DepthExceeded {
            attempted: 2,
            max: 1
        })
    );

    let (run, _) = finished(&h, "spawn", request(&child, "grandchild task")).await;
    let grandchild = run.local_agent().unwrap().clone();
    let lineage = fold_lineage(&grandchild.events()).unwrap().clone();
    assert_eq!(lineage.parent, child_id);
    assert_eq!(lineage.delegation_depth, 2);
    assert_eq!(grandchild.delegation_depth(), 2);
    assert_eq!(
        h.store
            .info(grandchild.id())
            .unwrap()
            .header
            .delegation_depth,
        2
    );
    within(run.dispose()).await.unwrap();
    h.assert_verified();
}

// ----- policy ----------------------------------------------------------------------------------

fn sandbox(mode: &str, source: PolicySource) -> SandboxMode {
    SandboxMode {
        mode: mode.into(),
        source,
    }
}

/// Delegates a spawn child's task from `parent`, which switches its sandbox to
/// `danger-full-access` right after asking; returns the finished run and the child's log.
async fn child_of_a_switching_parent(
    h: &Harness,
    parent: &Arc<Agent>,
) -> (SubagentRun, Vec<Event>) {
    let starting = h.runtime.start("spawn", request(parent, "task"));
    parent
        .record(sandbox("danger-full-access", PolicySource::Own))
        .unwrap();
    let run = within(starting).await.unwrap();
    within(run.result()).await.unwrap();
    let events = run.local_agent().unwrap().events();
    (run, events)
}

#[tokio::test(start_paused = true)]
async fn the_parents_sandbox_is_captured_when_the_delegation_is_asked_for() {
    let h = scripted(&[], &["done"]);
    let parent = h.parent().await;
    parent
        .record(sandbox("read-only", PolicySource::Own))
        .unwrap();

    let (run, events) = child_of_a_switching_parent(&h, &parent).await;
    assert_eq!(
        kinds(&events[..4]),
        [
            "session/lineage",
            "subagent/descriptor",
            "sandbox/mode",
            "approval/policy"
        ]
    );
    let policy = fold_policy(&events);
    assert_eq!(
        policy.sandbox,
        Some(&sandbox("read-only", PolicySource::Delegation)),
        "the switch made after the delegation was asked for does not reach the child"
    );
    assert_eq!(policy.approval.unwrap().policy.as_str(), "never");
    assert_eq!(policy.approval.unwrap().source, PolicySource::Delegation);
    within(run.dispose()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_unswitched_parent_pins_only_the_never_approval_policy() {
    let h = scripted(&[], &["done"]);
    let parent = h.parent().await;
    let (run, events) = child_of_a_switching_parent(&h, &parent).await;
    assert!(
        !kinds(&events).contains(&"sandbox/mode"),
        "{:?}",
        kinds(&events)
    );
    let policy = fold_policy(&events);
    assert_eq!(policy.sandbox, None);
    assert_eq!(
        policy.approval,
        Some(&ApprovalPolicy {
            policy: "never".into(),
            source: PolicySource::Delegation
        })
    );
    within(run.dispose()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_fork_childs_policy_comes_from_the_delegation_not_its_inherited_prefix() {
    let h = scripted(&["first answer"], &["done"]);
    let parent = h.parent().await;
    // Recorded before the first turn: inside the prefix the child inherits.
    parent
        .record(sandbox("read-only", PolicySource::Own))
        .unwrap();
    run_turn(&parent, "hello").await;
    // Recorded after the last completed turn: the parent's override when it delegates, outside
    // the prefix.
    parent
        .record(sandbox("workspace-write", PolicySource::Own))
        .unwrap();

    let (run, _) = finished(&h, "fork", request(&parent, "task")).await;
    let events = run.local_agent().unwrap().events();
    let seed = seed_len(&events) as usize;
    assert!(seed > 0);
    assert!(
        events[..seed].iter().any(|e| matches!(
            &e.body,
            EventBody::SandboxMode(m) if m.mode.as_str() == "read-only"
        )),
        "the prefix keeps the parent's early switch as context"
    );
    assert_eq!(
        own_kinds(&events)[..4],
        [
            "session/lineage",
            "subagent/descriptor",
            "sandbox/mode",
            "approval/policy"
        ]
    );
    assert_eq!(
        fold_policy(&events).sandbox,
        Some(&sandbox("workspace-write", PolicySource::Delegation))
    );
    within(run.dispose()).await.unwrap();
    h.assert_verified();
}

// ----- results ---------------------------------------------------------------------------------

async fn one_shot(h: &Harness, start: StartRequest) -> SubagentResult {
    let run = within(h.runtime.start("spawn", start))
        .await
        .expect("the run starts");
    let result = within(run.result()).await.expect("the run has a result");
    within(run.dispose()).await.expect("the run is disposed");
    result
}

#[tokio::test(start_paused = true)]
async fn a_completed_run_returns_the_childs_last_assistant_text() {
    let h = Harness::new();
    let parent = h.parent_with(parent_spec(vec![plain_tool("lookup")])).await;
    h.child_model().push([
        Response::tool_calls(Some("let me look"), &[("l1", "lookup", "{}")]),
        Response::text("the answer is 42"),
    ]);
    let result = one_shot(&h, request(&parent, "what is it?")).await;
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert!(result.stop_reason.is_success());
    assert_eq!(result.text(), "the answer is 42");
    assert_eq!(result.diagnostic, None);
    assert_eq!(result.structured, None);
}

#[tokio::test(start_paused = true)]
async fn a_child_out_of_tokens_stops_with_max_tokens_and_keeps_its_partial_output() {
    let h = Harness::new();
    let parent = h.parent().await;
    h.child_model().push([Response::max_tokens("half an ans")]);
    let result = one_shot(&h, request(&parent, "write a lot")).await;
    assert_eq!(result.stop_reason, StopReason::MaxTokens);
    assert_eq!(result.stop_reason.as_str(), "max-tokens");
    assert_eq!(result.text(), "half an ans");
}

#[tokio::test(start_paused = true)]
async fn a_model_failure_stops_with_error_and_a_diagnostic_naming_its_code() {
    let h = Harness::new();
    let parent = h.parent().await;
    h.child_model()
        .push([Response::error("RATE_LIMITED", "slow down")]);
    let result = one_shot(&h, request(&parent, "task")).await;
    assert_eq!(result.stop_reason, StopReason::Error);
    let diagnostic = result.diagnostic.expect("a diagnostic");
    assert!(diagnostic.contains("RATE_LIMITED"), "{diagnostic}");
    assert!(diagnostic.contains("slow down"), "{diagnostic}");
    assert!(result.output.is_empty());
}

fn counted() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {"count": {"type": "integer", "minimum": 0}},
        "required": ["count"],
        "additionalProperties": false
    })
}

/// A request from `parent` to "count them", answered by a structured result of [`counted`].
fn counting(parent: &Arc<Agent>) -> StartRequest {
    StartRequest {
        output_schema: Some(counted()),
        ..request(parent, "count them")
    }
}

#[tokio::test(start_paused = true)]
async fn a_structured_result_is_captured_after_an_invalid_attempt() {
    let h = Harness::new();
    let parent = h.parent().await;
    h.child_model().push([
        Response::tool_call("s1", STRUCTURED_OUTPUT, r#"{"count":"many"}"#),
        Response::tool_call("s2", STRUCTURED_OUTPUT, r#"{"count":3}"#),
    ]);
    let (run, result) = finished(&h, "spawn", counting(&parent)).await;
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(result.structured, Some(json!({"count": 3})));

    let requests = h.child_model().requests();
    assert_eq!(requests.len(), 2, "the recording call ends the turn");
    let offered = requests[0]
        .tools
        .iter()
        .find(|t| t.name == STRUCTURED_OUTPUT)
        .expect("the child is offered the capture tool");
    assert_eq!(offered.parameters, counted());
    assert!(requests[0].system.contains(STRUCTURED_OUTPUT));
    let answers = tool_results(&run.local_agent().unwrap().events());
    assert_eq!(answers.len(), 2);
    assert!(answers[0].is_error);
    assert_eq!(answers[0].code.as_deref(), Some(INVALID_ARGUMENTS));
    assert!(answers[0].text.contains("/count"), "{}", answers[0].text);
    assert!(!answers[1].is_error);
    within(run.dispose()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_child_that_finishes_without_a_structured_result_fails() {
    let h = Harness::new();
    let parent = h.parent().await;
    h.child_model().push([Response::text("three, I think")]);
    let result = one_shot(&h, counting(&parent)).await;
    assert_eq!(result.stop_reason, StopReason::Error);
    assert_eq!(result.structured, None);
    assert_eq!(result.text(), "three, I think");
    let diagnostic = result.diagnostic.expect("a diagnostic");
    assert!(diagnostic.contains("structured"), "{diagnostic}");
}

#[tokio::test(start_paused = true)]
async fn a_second_structured_result_is_refused_and_the_first_is_kept() {
    let h = Harness::new();
    let parent = h.parent().await;
    h.child_model().push([Response::tool_calls(
        None,
        &[
            ("s1", STRUCTURED_OUTPUT, r#"{"count":1}"#),
            ("s2", STRUCTURED_OUTPUT, r#"{"count":2}"#),
        ],
    )]);
    let (run, result) = finished(&h, "spawn", counting(&parent)).await;
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(result.structured, Some(json!({"count": 1})));
    let answers = tool_results(&run.local_agent().unwrap().events());
    assert!(!answers[0].is_error);
    assert_eq!(answers[1].code.as_deref(), Some(ALREADY_RECORDED));
    assert_eq!(h.child_model().requests().len(), 1);
    within(run.dispose()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn cancelling_the_request_aborts_the_child_with_cause_parent() {
    let h = Harness::new();
    let parent = h.parent().await;
    let start = request(&parent, "task");
    let cancel = start.cancel.clone();
    let (run, gate) = working(&h, start, "too late").await;
    cancel.cancel(AbortCause::User);
    let result = within(run.result()).await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Aborted);
    let child = run.local_agent().unwrap().clone();
    let events = child.events();
    assert_eq!(
        turn_ends(&events),
        [TurnEndReason::Aborted {
            cause: AbortCause::Parent
        }]
    );
    assert_balanced(&events);
    gate.open();
    within(run.dispose()).await.unwrap();
    assert!(h.agents.get(child.id()).is_none());
    assert_eq!(h.stored(child.id()), events);
}

#[tokio::test(start_paused = true)]
async fn disposing_a_run_cancels_a_working_child_and_releases_it() {
    let h = Harness::new();
    let parent = h.parent().await;
    let (run, gate) = working(&h, request(&parent, "task"), "too late").await;
    let child = run.local_agent().unwrap().clone();
    within(run.dispose()).await.unwrap();
    within(run.dispose()).await.expect("disposal is idempotent");
    let result = within(run.result()).await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Aborted);
    assert!(h.agents.get(child.id()).is_none());
    let stored = h.stored(child.id());
    assert_balanced(&stored);
    assert!(matches!(
        turn_ends(&stored).as_slice(),
        [TurnEndReason::Aborted { .. }]
    ));
    gate.open();
}

#[tokio::test(start_paused = true)]
async fn child_options_persona_and_the_delegation_context_reach_the_childs_requests() {
    let h = scripted(&["inherited"], &["checked"]);
    let parent = h.parent().await;
    let mut start = StartRequest {
        persona: Some("You check facts.".into()),
        ..request(&parent, "check this")
    };
    start.agent_options.max_tokens = Some(77);
    one_shot(&h, start).await;
    let asked = &h.child_model().requests()[0];
    assert_eq!(asked.model.as_str(), CHILD);
    assert_eq!(
        asked.endpoint.as_str(),
        "scripted",
        "inherited from the parent"
    );
    assert_eq!(asked.max_tokens, Some(77));
    assert!(
        asked.system.starts_with("You check facts."),
        "{}",
        asked.system
    );
    assert!(
        asked.system.contains(DELEGATION_CONTEXT),
        "{}",
        asked.system
    );

    // Without child options, the child asks what its parent asks.
    let inherited = one_shot(&h, StartRequest::new(parent.clone(), "same model")).await;
    assert_eq!(inherited.text(), "inherited");
    let asked = &h.parent_model().requests()[0];
    assert_eq!(asked.model.as_str(), PARENT);
    assert_eq!(asked.max_tokens, Some(1024));
    assert!(asked.system.contains(DELEGATION_CONTEXT));
}

// ----- lifecycle -------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn lifecycle_events_pair_a_start_before_an_end_with_a_fresh_run_id_per_run() {
    let h = Harness::new();
    h.child_model().push([
        Response::text("answer one"),
        Response::error("BROKEN", "the model broke"),
    ]);
    let parent = h.parent().await;
    let (_, mut lifecycle) = listen(&h.runtime);
    let mut runs = Vec::new();
    for (prompt, stop, last) in [
        (
            "first",
            StopReason::Completed,
            Some(vec![ContentBlock::text("answer one")]),
        ),
        ("second", StopReason::Error, None),
    ] {
        let run = within(h.runtime.start("spawn", request(&parent, prompt)))
            .await
            .unwrap();
        let start = within(lifecycle.recv()).await.unwrap();
        let Lifecycle::Start(info) = &start else {
            panic!("expected subagent/start first, got {start:?}");
        };
        assert_eq!(start.name(), "subagent/start");
        assert_eq!(info.child, run.id());
        assert_eq!(info.parent, parent.id());
        assert_eq!(info.provider.as_str(), "spawn");
        assert!(info.local);
        within(run.result()).await.unwrap();
        let end = within(lifecycle.recv()).await.unwrap();
        assert_eq!(end.name(), "subagent/end");
        assert_eq!(
            end,
            Lifecycle::End {
                info: info.clone(),
                stop_reason: stop,
                last_assistant_message: last,
            }
        );
        runs.push(info.run);
        within(run.dispose()).await.unwrap();
    }
    assert_ne!(runs[0], runs[1], "every run has its own id");
    assert!(drain(&mut lifecycle).is_empty(), "one pair per run");
}

#[tokio::test(start_paused = true)]
async fn a_failing_or_panicking_listener_disturbs_neither_the_run_nor_other_listeners() {
    let h = scripted(&[], &["fine"]);
    let parent = h.parent().await;
    let failures = Arc::new(AtomicUsize::new(0));
    let panics = Arc::new(AtomicUsize::new(0));
    {
        let failures = failures.clone();
        h.runtime.on_lifecycle(move |_| {
            failures.fetch_add(1, Ordering::SeqCst);
            Err("this listener always fails".into())
        });
        let panics = panics.clone();
        h.runtime.on_lifecycle(move |_| {
            panics.fetch_add(1, Ordering::SeqCst);
            panic!("this listener always panics")
        });
    }
    let (_, mut lifecycle) = listen(&h.runtime);
    let run = within(h.runtime.start("spawn", request(&parent, "task")))
        .await
        .expect("the start survives its listeners");
    let result = within(run.result()).await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(result.text(), "fine");
    let start = within(lifecycle.recv()).await.unwrap();
    let end = within(lifecycle.recv()).await.unwrap();
    assert_eq!(start.name(), "subagent/start");
    assert_eq!(end.name(), "subagent/end");
    assert_eq!(start.info(), end.info());
    assert_eq!(failures.load(Ordering::SeqCst), 2);
    assert_eq!(panics.load(Ordering::SeqCst), 2);
    within(run.dispose()).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_removed_listener_hears_nothing_more() {
    let h = scripted(&[], &["one", "two"]);
    let parent = h.parent().await;
    let (id, mut removed) = listen(&h.runtime);
    let (_, mut kept) = listen(&h.runtime);
    assert!(h.runtime.remove_listener(id));
    assert!(!h.runtime.remove_listener(id));
    one_shot(&h, request(&parent, "task")).await;
    within(kept.recv()).await.unwrap();
    within(kept.recv()).await.unwrap();
    assert!(drain(&mut removed).is_empty());
}

// ----- the subagent tool -----------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn the_subagent_tool_is_offered_only_while_its_provider_is_registered() {
    let h = Harness::bare();
    let tool = subagent_tool(&h, SubagentToolConfig::new("spawn"));
    assert!(!tool.available());
    let parent = h.parent_with(parent_spec(vec![tool.clone()])).await;
    h.parent_model().push([
        Response::text("one"),
        Response::text("two"),
        Response::text("three"),
        delegation("c1", "late call", "do it"),
        Response::text("four"),
    ]);
    let offered = |i: usize| tool_names(&h.parent_model().requests()[i]);

    run_turn(&parent, "before").await;
    assert!(!offered(0).contains(&"subagent".to_owned()));

    h.runtime
        .register_provider(Arc::new(SpawnProvider::new()))
        .unwrap();
    assert!(tool.available());
    run_turn(&parent, "registered").await;
    assert_eq!(offered(1), ["subagent"]);

    h.runtime.remove_provider("spawn");
    assert!(!tool.available());
    run_turn(&parent, "removed").await;
    assert!(offered(2).is_empty());

    // Called anyway while unmounted, it is refused like a tool the agent does not have.
    run_turn(&parent, "call it anyway").await;
    let answers = tool_results(&parent.events());
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].code.as_deref(), Some(TOOL_NOT_AVAILABLE));
    assert!(h.children(&parent).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_provider_the_tool_cannot_work_with_is_refused_at_registration() {
    let h = Harness::bare();
    let no_depth = lacking(Capability::DepthLimit);
    let limited = subagent_tool(&h, SubagentToolConfig::new("limited"));
    assert_eq!(limited.config().max_depth, MaxDepth::Limit(3));

    let error = h
        .runtime
        .register_provider(CannedProvider::new("limited", no_depth))
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::UnsupportedCapability);
    assert!(error.message().contains("\"limited\""), "{error}");
    assert!(h.runtime.provider("limited").is_none());
    assert!(h.runtime.providers().is_empty());
    assert!(!limited.available());

    // A tool for another provider name does not interfere.
    h.runtime
        .register_provider(CannedProvider::new("other", no_depth))
        .expect("no tool is bound to it");

    // A tool that leaves depth to the provider can work with it; once the refusing tool is gone,
    // the provider registers.
    let managed = subagent_tool(
        &h,
        SubagentToolConfig {
            max_depth: MaxDepth::ProviderManaged,
            ..SubagentToolConfig::new("limited")
        },
    );
    assert!(
        h.runtime
            .register_provider(CannedProvider::new("limited", no_depth))
            .is_err(),
        "the limiting tool still lives"
    );
    drop(limited);
    h.runtime
        .register_provider(CannedProvider::new("limited", no_depth))
        .expect("only a tool that can work with it remains");
    assert!(managed.available());

    // A limiting tool built while such a provider is registered is refused at once.
    let error = SubagentTool::new(&h.runtime, SubagentToolConfig::new("limited")).unwrap_err();
    assert_eq!(error.code(), ErrorCode::UnsupportedCapability);
}

#[tokio::test(start_paused = true)]
async fn a_tool_filter_that_names_nothing_is_refused_when_the_tool_is_built() {
    let h = Harness::new();
    let error = SubagentTool::new(
        &h.runtime,
        SubagentToolConfig {
            tool_filter: Some(ToolFilter {
                allow: None,
                deny: None,
            }),
            ..SubagentToolConfig::new("spawn")
        },
    )
    .unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidRequest);
    assert!(error.message().contains("\"subagent\""), "{error}");
    SubagentTool::new(
        &h.runtime,
        SubagentToolConfig {
            tool_filter: Some(filter(None, Some(&["shell"]))),
            ..SubagentToolConfig::new("spawn")
        },
    )
    .expect("a filter that names something is accepted");
}

#[tokio::test(start_paused = true)]
async fn the_tool_describes_a_fork_differently_from_a_spawn() {
    let h = Harness::new();
    let spawn = subagent_tool(&h, SubagentToolConfig::new("spawn"));
    let fork = subagent_tool(
        &h,
        SubagentToolConfig {
            tool_name: "fork_subagent".into(),
            ..SubagentToolConfig::new("fork")
        },
    );
    assert_eq!(spawn.name(), "subagent");
    assert_eq!(fork.name(), "fork_subagent");
    assert_ne!(spawn.description(), fork.description());
    let prompt = |tool: &SubagentTool| tool.input_schema()["properties"]["prompt"].clone();
    assert_ne!(prompt(&spawn), prompt(&fork));
    for tool in [&spawn, &fork] {
        let schema = tool.input_schema();
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["required"], json!(["description", "prompt"]));
        assert_eq!(schema["properties"]["description"]["type"], "string");
        assert_eq!(schema["properties"]["prompt"]["type"], "string");
        assert!(tool.parallel_safe(&json!({})));
    }

    // The wording follows the provider registered under the name.
    let spawn_wording = (spawn.description().to_owned(), prompt(&spawn));
    h.runtime.remove_provider("spawn");
    h.runtime
        .register_provider(Arc::new(ForkProvider::named("spawn")))
        .unwrap();
    assert_eq!(spawn.description(), fork.description());
    assert_eq!(prompt(&spawn), prompt(&fork));
    assert_ne!(
        spawn_wording,
        (spawn.description().to_owned(), prompt(&spawn))
    );
}

#[tokio::test(start_paused = true)]
async fn a_delegation_through_the_tool_returns_the_childs_answer_to_the_parent() {
    let (h, parent) = delegating(SubagentToolConfig::new("spawn")).await;
    h.parent_model().push([
        delegation("c1", "sum up", "summarise the notes"),
        Response::text("parent done"),
    ]);
    h.child_model().push([Response::text("the summary")]);
    let (_, mut lifecycle) = listen(&h.runtime);
    run_turn(&parent, "please delegate").await;

    let answers = tool_results(&parent.events());
    assert_eq!(
        answers,
        [Answer {
            call: "c1".into(),
            text: "the summary".into(),
            is_error: false,
            code: None,
        }]
    );
    let child = h.only_child(&parent);
    assert!(h.agents.get(child).is_none(), "the tool disposes its child");
    let events = h.stored(child);
    assert_eq!(user_texts(&events), ["summarise the notes"]);
    assert_eq!(
        fold_descriptor(&events).unwrap().label.as_deref(),
        Some("sum up")
    );
    assert_eq!(
        fold_lineage(&events).unwrap().delegation_depth,
        1,
        "a tool's child is one below its caller"
    );
    let pair = drain(&mut lifecycle);
    assert_eq!(pair.len(), 2);
    assert_eq!(pair[0].info().child, child);
    assert_balanced(&parent.events());
    h.assert_verified();
}

#[tokio::test(start_paused = true)]
async fn a_failed_child_is_rendered_with_its_reason_diagnostic_and_partial_output() {
    let (h, parent) = delegating(SubagentToolConfig::new("spawn")).await;
    h.parent_model().push([
        delegation("c1", "fails", "task one"),
        delegation("c2", "runs out", "task two"),
        Response::text("parent done"),
    ]);
    h.child_model().push([
        Response::error("OVERLOADED", "try again later"),
        Response::max_tokens("half an ans"),
    ]);
    run_turn(&parent, "go").await;
    let answers = tool_results(&parent.events());
    assert_eq!(answers.len(), 2);

    assert_failed(&answers[0], "error", &["OVERLOADED", "try again later"]);
    assert_failed(&answers[1], "max-tokens", &["half an ans"]);
    assert_ne!(
        answers[0].text.lines().next(),
        answers[1].text.lines().next(),
        "each reason has its own headline"
    );
    assert_balanced(&parent.events());
}

#[tokio::test(start_paused = true)]
async fn every_outcome_a_provider_reports_is_rendered_for_the_model() {
    let h = Harness::new();
    let canned = CannedProvider::new("canned", Capabilities::ALL);
    h.runtime.register_provider(canned.clone()).unwrap();
    let failure = |message: &str| SubagentError::new(ErrorCode::AgentFailure, message);
    canned.push(Canned::ok(result(
        StopReason::Refusal,
        "I started on it",
        Some("a policy blocked the task"),
    )));
    canned.push(Canned::ok(result(StopReason::Aborted, "", None)));
    canned.push(Canned::ok(result(
        StopReason::Other("timeout".into()),
        "",
        Some("ran for too long"),
    )));
    canned.push(Canned {
        result: Err(failure("the remote worker vanished")),
        dispose: Ok(()),
    });
    canned.push(Canned {
        result: Ok(result(StopReason::Completed, "fine", None)),
        dispose: Err(failure("teardown broke")),
    });
    canned.push(Canned {
        result: Err(failure("the run broke")),
        dispose: Err(failure("and so did teardown")),
    });
    canned.push(Canned::ok(result(StopReason::Completed, "", None)));
    let tool = subagent_tool(&h, SubagentToolConfig::new("canned"));
    let parent = h.parent_with(parent_spec(vec![tool])).await;
    let calls = [
        "refused", "aborted", "other", "failed", "teardown", "both", "empty",
    ];
    h.parent_model()
        .push(calls.iter().map(|c| delegation(c, c, "task")));
    h.parent_model().push([Response::text("parent done")]);
    run_turn(&parent, "go").await;

    let answers = tool_results(&parent.events());
    let by_call = |call: &str| answer_to(&answers, call);
    let refused = by_call("refused");
    assert!(refused.is_error);
    assert_eq!(refused.code.as_deref(), Some("refusal"));
    assert!(refused.text.contains("a policy blocked the task"));
    assert!(refused.text.contains("I started on it"));
    assert_eq!(by_call("aborted").code.as_deref(), Some("aborted"));
    let other = by_call("other");
    assert_eq!(other.code.as_deref(), Some("timeout"));
    assert!(other.text.contains("timeout") && other.text.contains("ran for too long"));
    let failed = by_call("failed");
    assert_eq!(failed.code.as_deref(), Some("AGENT_FAILURE"));
    assert!(failed.text.contains("the remote worker vanished"));
    let teardown = by_call("teardown");
    assert!(teardown.is_error, "a failed teardown is reported");
    assert_eq!(teardown.code.as_deref(), Some("AGENT_FAILURE"));
    assert!(teardown.text.contains("teardown broke"));
    let both = by_call("both");
    assert_eq!(both.code.as_deref(), Some("AGENT_FAILURE"));
    assert!(both.text.contains("the run broke") && both.text.contains("and so did teardown"));
    let empty = by_call("empty");
    assert!(!empty.is_error);
    assert!(
        !empty.text.is_empty(),
        "an empty success still says something"
    );

    // Every run was disposed, whatever its outcome, and the tool passed its own settings on.
    assert_eq!(canned.disposed(), calls.len());
    for start in canned.started() {
        assert_eq!(start.request.max_depth, Some(3));
        assert_eq!(start.request.agent_options, child_options());
        assert_eq!(start.descriptor.provider.as_str(), "canned");
        assert!(start.request.label.is_some());
        assert_eq!(start.policy.approval.as_str(), "never");
        assert!(Arc::ptr_eq(&start.request.parent, &parent));
    }
}

#[tokio::test(start_paused = true)]
async fn a_refused_or_malformed_delegation_is_reported_to_the_model_with_its_code() {
    let (h, parent) = delegating(limited_to(0)).await;
    h.parent_model().push([
        delegation("deep", "too deep", "task"),
        delegation("blank", "  ", "task"),
        Response::tool_call("missing", "subagent", r#"{"description":"no prompt"}"#),
        Response::text("parent done"),
    ]);
    run_turn(&parent, "go").await;
    let answers = tool_results(&parent.events());
    let codes: Vec<_> = answers.iter().map(|a| a.code.as_deref()).collect();
    assert_eq!(
        codes,
        [
            Some("DEPTH_EXCEEDED"),
            Some(INVALID_ARGUMENTS),
            Some(INVALID_ARGUMENTS)
        ]
    );
    assert!(answers.iter().all(|a| a.is_error));
    assert!(h.children(&parent).is_empty());
    assert!(h.child_model().requests().is_empty());
}

#[tokio::test(start_paused = true)]
async fn cancelling_the_parents_turn_cancels_the_child_and_keeps_both_logs_balanced() {
    let (h, parent) = delegating(SubagentToolConfig::new("spawn")).await;
    let gate = Gate::new();
    h.parent_model()
        .push([delegation("c1", "slow", "take your time")]);
    h.child_model()
        .push([Response::text("too late").gated(&gate)]);
    parent.followup(user("delegate")).unwrap();
    within(h.child_model().wait_for_requests(1)).await;
    let child = h.only_child(&parent);
    assert!(h.agents.get(child).is_some(), "the child is working");

    parent.cancel(AbortCause::User, Queued::Discard).unwrap();
    within(parent.when_idle()).await;

    let events = parent.events();
    assert_balanced(&events);
    assert_eq!(
        turn_ends(&events),
        [TurnEndReason::Aborted {
            cause: AbortCause::User
        }]
    );
    let answers = tool_results(&events);
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].code.as_deref(), Some("aborted"));
    assert!(h.agents.get(child).is_none(), "the child was disposed");
    assert_aborted_by_its_parent(h.stored(child));
    assert_eq!(h.parent_model().requests().len(), 1);
    gate.open();
    h.assert_verified();
}

#[tokio::test(start_paused = true)]
async fn disposing_the_parent_mid_delegation_cancels_and_releases_the_child() {
    let (h, parent) = delegating(SubagentToolConfig::new("spawn")).await;
    let gate = Gate::new();
    h.parent_model().push([delegation("c1", "slow", "task")]);
    h.child_model()
        .push([Response::text("too late").gated(&gate)]);
    parent.followup(user("delegate")).unwrap();
    within(h.child_model().wait_for_requests(1)).await;
    let child = h.only_child(&parent);

    within(parent.dispose()).await;
    assert!(
        h.agents.list().is_empty(),
        "neither parent nor child is live"
    );
    let parent_events = h.stored(parent.id());
    assert_balanced(&parent_events);
    assert_eq!(
        turn_ends(&parent_events),
        [TurnEndReason::Aborted {
            cause: AbortCause::Disposed
        }]
    );
    assert_aborted_by_its_parent(h.stored(child));
    gate.open();
}

#[tokio::test(start_paused = true)]
async fn two_delegations_in_one_message_run_in_parallel() {
    let (h, parent) = delegating(SubagentToolConfig::new("spawn")).await;
    let first = json!({"description": "one", "prompt": "first"}).to_string();
    let second = json!({"description": "two", "prompt": "second"}).to_string();
    h.parent_model().push([
        Response::tool_calls(
            None,
            &[("a", "subagent", &first), ("b", "subagent", &second)],
        ),
        Response::text("both done"),
    ]);
    let (gate_a, gate_b) = (Gate::new(), Gate::new());
    h.child_model().push([
        answer_to_prompt().gated(&gate_a),
        answer_to_prompt().gated(&gate_b),
    ]);
    parent.followup(user("delegate twice")).unwrap();
    // Both children ask their model before either is let go: the calls overlap.
    within(h.child_model().wait_for_requests(2)).await;
    assert_eq!(h.children(&parent).len(), 2);
    gate_b.open();
    gate_a.open();
    within(parent.when_idle()).await;

    let answers = tool_results(&parent.events());
    let texts: Vec<_> = answers
        .iter()
        .map(|a| (a.call.as_str(), a.text.as_str()))
        .collect();
    assert_eq!(
        texts,
        [("a", "answer to first"), ("b", "answer to second")],
        "results are committed in the model's order"
    );
    assert_balanced(&parent.events());
    h.assert_verified();
}

#[tokio::test(start_paused = true)]
async fn the_tools_max_depth_stops_a_grandchild() {
    let (h, parent) = delegating(limited_to(1)).await;
    h.parent_model().push([
        delegation("c1", "delegate on", "hand this on"),
        Response::text("parent done"),
    ]);
    h.child_model().push([
        delegation("g1", "deeper", "grandchild task"),
        Response::text("could not hand it on"),
    ]);
    run_turn(&parent, "go").await;

    assert_eq!(
        tool_results(&parent.events())[0].text,
        "could not hand it on"
    );
    let child = h.only_child(&parent);
    let child_events = h.stored(child);
    let offered = tool_names(&h.child_model().requests()[0]);
    assert!(offered.contains(&"subagent".to_owned()), "{offered:?}");
    let answers = tool_results(&child_events);
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].code.as_deref(), Some("DEPTH_EXCEEDED"));
    assert!(
        h.store.children(child).unwrap().is_empty(),
        "no grandchild was created"
    );
}

// ----- tool filters ----------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_tool_filter_narrows_the_parents_tools_for_the_child() {
    let h = Harness::new();
    let parent = h.parent_with(echo_and_search()).await;
    h.child_model().push([
        Response::text("all"),
        Response::text("allowed"),
        Response::tool_call("x", "search", "{}"),
        Response::text("denied"),
    ]);
    one_shot(&h, request(&parent, "no filter")).await;
    let allowed = StartRequest {
        tool_filter: Some(filter(Some(&["echo"]), None)),
        ..request(&parent, "allow echo")
    };
    one_shot(&h, allowed).await;
    let denied = StartRequest {
        tool_filter: Some(filter(None, Some(&["echo"]))),
        ..request(&parent, "deny echo")
    };
    let (run, _) = finished(&h, "spawn", denied).await;
    let run_events = run.local_agent().unwrap().events();
    within(run.dispose()).await.unwrap();

    let requests = h.child_model().requests();
    assert_eq!(tool_names(&requests[0]), ["echo", "search"]);
    assert_eq!(tool_names(&requests[1]), ["echo"]);
    assert_eq!(tool_names(&requests[2]), ["search"]);
    // A hidden tool is refused when called anyway.
    let hidden = StartRequest {
        tool_filter: Some(filter(Some(&["echo"]), None)),
        ..request(&parent, "call search")
    };
    h.child_model().push([
        Response::tool_call("y", "search", "{}"),
        Response::text("ok"),
    ]);
    let (run, _) = finished(&h, "spawn", hidden).await;
    let answers = tool_results(&run.local_agent().unwrap().events());
    assert_eq!(answers[0].code.as_deref(), Some(TOOL_NOT_AVAILABLE));
    within(run.dispose()).await.unwrap();
    // The visible one runs.
    let answers = tool_results(&run_events);
    assert_eq!(answers[0].code, None);
    assert_eq!(answers[0].text, "ok");
}

#[tokio::test(start_paused = true)]
async fn a_tool_filter_naming_an_unknown_tool_refuses_the_start_and_stores_nothing() {
    let h = Harness::new();
    let parent = h.parent_with(parent_spec(vec![plain_tool("echo")])).await;
    let watch = Untouched::watch(&h);
    for unknown in [
        filter(Some(&["echo", "nope"]), None),
        filter(None, Some(&["nope"])),
    ] {
        let start = || StartRequest {
            tool_filter: Some(unknown.clone()),
            ..request(&parent, "task")
        };
        for error in refused_by_both(&h, start, ErrorCode::InvalidRequest).await {
            assert!(error.message().contains("nope"), "{error}");
        }
    }
    watch.assert_untouched(&h);
}

#[tokio::test(start_paused = true)]
async fn a_child_never_gets_a_tool_its_parent_is_denied() {
    let h = Harness::new();
    let parent = h
        .parent_with(AgentSpec {
            tool_filter: Some(filter(None, Some(&["search"]))),
            ..echo_and_search()
        })
        .await;
    h.child_model().push([Response::text("done")]);
    one_shot(&h, request(&parent, "task")).await;
    assert_eq!(tool_names(&h.child_model().requests()[0]), ["echo"]);

    let before = h.footprint();
    let widening = StartRequest {
        tool_filter: Some(filter(Some(&["search"]), None)),
        ..request(&parent, "task")
    };
    let error = refusal(h.runtime.start("spawn", widening).await);
    assert_eq!(error.code(), ErrorCode::InvalidRequest, "{error}");
    assert_eq!(h.footprint(), before);
}

#[tokio::test(start_paused = true)]
async fn the_structured_output_tool_survives_the_childs_tool_filter() {
    let h = Harness::new();
    let parent = h.parent_with(echo_and_search()).await;
    h.child_model().push([
        Response::tool_call("s1", STRUCTURED_OUTPUT, r#"{"count":1}"#),
        Response::tool_call("s2", STRUCTURED_OUTPUT, r#"{"count":2}"#),
    ]);
    for tool_filter in [
        filter(Some(&["echo"]), None),
        filter(None, Some(&["echo", STRUCTURED_OUTPUT])),
    ] {
        let start = StartRequest {
            output_schema: Some(counted()),
            tool_filter: Some(tool_filter),
            ..request(&parent, "count")
        };
        let result = one_shot(&h, start).await;
        assert!(result.structured.is_some(), "{result:?}");
    }
    let requests = h.child_model().requests();
    assert_eq!(tool_names(&requests[0]), ["echo", STRUCTURED_OUTPUT]);
    assert_eq!(tool_names(&requests[1]), ["search", STRUCTURED_OUTPUT]);
}
