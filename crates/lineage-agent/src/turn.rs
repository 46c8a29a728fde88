//! The turn loop: turns, steps, the model stream and tool calls, and the closing events that
//! keep the log balanced whatever stops a turn. It reaches its agent only through the
//! [`Driver`] it is spawned with.

use std::collections::VecDeque;
use std::sync::Arc;

use lineage_log::{
    AbortCause, AssistantChunk, AssistantMessage, CallId, ContentBlock, FinishReason, Message,
    MessageId, MessageSource, Role, StepEnd, StepNo, StepStart, StreamChunk, Text, ToolCall,
    ToolResult, TurnEnd, TurnEndReason, TurnError, TurnNo, interrupted_turn_closers,
};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::agent::{Claimed, Driver, Opened};
use crate::contain::{self, Contained};
use crate::model::{ABORTED, Assembler, ModelStream, failure_finish};
use crate::tool::{
    ABORTED_BEFORE_DISPATCH, INVALID_ARGUMENTS, TOOL_NOT_AVAILABLE, TOOL_PANICKED, parse_arguments,
};
use crate::{
    AgentError, Cancellation, HOOK_FAILED, HOOK_PANICKED, ModelError, ModelRequest, PreStep,
    PreStepDecision, Tool, ToolContext, ToolOutput, Toolset,
};

/// The error code of a turn whose agent names no model endpoint or model.
pub const NO_MODEL: &str = "NO_MODEL";
/// The error code of a turn that could not write its log.
pub const PERSISTENCE: &str = "PERSISTENCE";
/// The error code of a turn that panicked outside a model, a hook or a tool call (in host code the
/// driver calls directly, such as a tool's `input_schema`).
pub const TURN_PANICKED: &str = "TURN_PANICKED";

/// Why a turn stops early.
enum Stop {
    Aborted(AbortCause),
    Failed(TurnError),
}

impl From<AgentError> for Stop {
    fn from(error: AgentError) -> Self {
        Stop::Failed(turn_error(PERSISTENCE, error.to_string()))
    }
}

fn turn_error(code: &str, message: impl Into<Text>) -> TurnError {
    TurnError {
        message: message.into(),
        code: code.into(),
        status: None,
        retry_after_ms: None,
        request_id: None,
    }
}

fn check(cancel: &Cancellation) -> Result<(), Stop> {
    match cancel.cause() {
        Some(cause) => Err(Stop::Aborted(cause)),
        None => Ok(()),
    }
}

/// How a step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StepOutcome {
    Completed,
    MaxTokens,
    /// Tools ran: the model is owed another request.
    ToolsOwe,
}

/// Runs turns until the agent has nothing more to do, then leaves it idle.
pub(crate) async fn drive(driver: Driver, mut opened: Opened) {
    loop {
        let span = tracing::info_span!("turn", agent = %driver.agent().id(), turn = opened.turn);
        let reason = run_turn(&driver, opened).instrument(span).await;
        let run_more = matches!(reason, TurnEndReason::Completed | TurnEndReason::MaxTokens);
        match driver.after_turn(run_more) {
            Some(next) => opened = next,
            None => return,
        }
    }
}

/// Runs one opened turn to its `turn/end`, which it always writes, then flushes.
async fn run_turn(driver: &Driver, opened: Opened) -> TurnEndReason {
    let Opened {
        turn,
        cancel,
        claimed,
    } = opened;
    // The driver calls host code outside the model and the hooks too (a tool's `available`,
    // `input_schema`, `guidance` or `parallel_safe`): a panic anywhere in the turn ends the turn.
    let body = Contained::new(
        Box::pin(turn_body(driver, turn, &cancel, claimed)),
        "a turn",
    );
    let reason = match body.await {
        Ok(Ok(reason)) => reason,
        Ok(Err(Stop::Aborted(cause))) => TurnEndReason::Aborted { cause },
        Ok(Err(Stop::Failed(error))) => {
            tracing::warn!(code = %error.code, message = %error.message, "turn failed");
            TurnEndReason::Error(Box::new(error))
        }
        Err(panic) => {
            tracing::error!(%panic, "the turn panicked");
            close_torn_step(driver);
            TurnEndReason::Error(Box::new(turn_error(
                TURN_PANICKED,
                format!(
                    "agent {}: turn {turn} panicked: {panic}",
                    driver.agent().id()
                ),
            )))
        }
    };
    if let Err(error) = driver.append(TurnEnd {
        turn,
        reason: reason.clone(),
    }) {
        tracing::warn!(%error, "could not close the turn");
    }
    if let Err(error) = driver.flush().await {
        tracing::warn!(%error, "could not flush at turn end");
    }
    reason
}

/// Closes what a panicking turn left open, as crash repair would: an error result for each call
/// without one, then `step/end`. The `turn/end` is the caller's.
fn close_torn_step(driver: &Driver) {
    let mut closers = driver.agent().with_events(interrupted_turn_closers);
    closers.pop();
    for closer in closers {
        if let Err(error) = driver.append(closer.body) {
            tracing::warn!(%error, "could not close the step of a turn that panicked");
            return;
        }
    }
}

async fn turn_body(
    driver: &Driver,
    turn: TurnNo,
    cancel: &Cancellation,
    claimed: Claimed,
) -> Result<TurnEndReason, Stop> {
    // Completed or MaxTokens once a step says the turn may end; MaxTokens is sticky.
    let mut ends: Option<StepOutcome> = None;
    let mut step: StepNo = 0;
    let mut first_input = Some(claimed);
    loop {
        check(cancel)?;
        let claimed = match first_input.take() {
            Some(claimed) => claimed,
            None => driver.claim_step_input(turn),
        };
        let messages = match pre_step(driver, turn, step + 1, &claimed, cancel).await {
            Ok(PreStepDecision::Enter(messages)) => messages,
            Ok(PreStepDecision::Reject) => return Ok(TurnEndReason::Blocked),
            Err(error) => return Err(hook_failed(driver, claimed, cancel, error)),
        };
        check(cancel)?;
        if ends.is_some() && messages.is_empty() {
            break;
        }
        if step == 0 && messages.is_empty() {
            return Ok(TurnEndReason::Completed);
        }
        // A model request is due: every budget in force must allow it. What the step claimed
        // goes back to the inbox, parked for when a budget allows more.
        if let Some(reached) = driver.agent().budget_reached() {
            tracing::info!(code = reached.limit.code(), %reached, "budget reached");
            if let Some(cause) = give_back(driver, claimed, cancel) {
                return Err(Stop::Aborted(cause));
            }
            return Ok(TurnEndReason::Budget(Box::new(reached)));
        }
        step += 1;
        driver.append(StepStart { turn, step })?;
        let span = tracing::info_span!("step", step);
        let outcome = async {
            for message in messages {
                driver.append(message)?;
            }
            run_step(driver, turn, step, cancel).await
        }
        .instrument(span)
        .await;
        // The step closes whatever happened inside it.
        let closed = driver.append(StepEnd { turn, step });
        let outcome = outcome?;
        closed?;
        if ends != Some(StepOutcome::MaxTokens) {
            ends = (outcome != StepOutcome::ToolsOwe).then_some(outcome);
        }
        check(cancel)?;
        if ends.is_some() && !driver.has_step_input() {
            break;
        }
    }
    Ok(match ends {
        Some(StepOutcome::MaxTokens) => TurnEndReason::MaxTokens,
        _ => TurnEndReason::Completed,
    })
}

/// Asks the pre-step hook about a step's claimed input. A hook error or a panic (in the call or in
/// its future) is the turn's error.
async fn pre_step(
    driver: &Driver,
    turn: TurnNo,
    step: StepNo,
    claimed: &Claimed,
    cancel: &Cancellation,
) -> Result<PreStepDecision, TurnError> {
    let input = PreStep {
        agent: driver.agent().clone(),
        turn,
        step,
        messages: claimed.messages(),
        cancel: cancel.clone(),
    };
    let hooks = &driver.config().hooks;
    let decided = match contain::call(|| hooks.pre_step(input)) {
        Ok(future) => Contained::new(future, "a pre-step hook").await,
        Err(panic) => Err(panic),
    };
    let subject = format!(
        "agent {}: the pre-step hook of turn {turn} step {step}",
        driver.agent().id()
    );
    match decided {
        Ok(Ok(decision)) => Ok(decision),
        Ok(Err(error)) => Err(turn_error(
            HOOK_FAILED,
            format!("{subject} failed: {error}"),
        )),
        Err(panic) => Err(turn_error(
            HOOK_PANICKED,
            format!("{subject} panicked: {panic}"),
        )),
    }
}

/// Ends a turn whose pre-step hook failed or panicked. The hook refused nothing, so the input
/// claimed for the step goes back to the front of its lists, parked for the next wake; a turn
/// cancelled meanwhile ends aborted instead and its claimed input is dropped, as for any cancel.
fn hook_failed(driver: &Driver, claimed: Claimed, cancel: &Cancellation, error: TurnError) -> Stop {
    match give_back(driver, claimed, cancel) {
        Some(cause) => Stop::Aborted(cause),
        None => Stop::Failed(error),
    }
}

/// Puts a step's claimed input back at the front of its lists, parked for the next wake. When
/// the turn was cancelled meanwhile, the input is dropped as for any cancel, and the cause is
/// returned: the turn ends aborted.
fn give_back(driver: &Driver, claimed: Claimed, cancel: &Cancellation) -> Option<AbortCause> {
    match driver.requeue(claimed, cancel) {
        Ok(true) => None,
        Ok(false) => cancel.cause(),
        Err(requeue) => {
            tracing::warn!(%requeue, "the input of a stopped step could not be requeued");
            None
        }
    }
}

/// One model request and the tool calls it asks for.
async fn run_step(
    driver: &Driver,
    turn: TurnNo,
    step: StepNo,
    cancel: &Cancellation,
) -> Result<StepOutcome, Stop> {
    // Everything so far is durable before the model is asked anything.
    driver.flush().await?;
    let agent = driver.agent();
    let tools = agent.toolset();
    let options = agent.options();
    let (Some(endpoint), Some(model)) = (options.endpoint.clone(), options.model.clone()) else {
        return Err(Stop::Failed(turn_error(
            NO_MODEL,
            format!(
                "agent {} has no model: set both its endpoint and model options",
                agent.id()
            ),
        )));
    };
    let config = driver.config();
    let request = ModelRequest {
        session: agent.id(),
        turn,
        step,
        endpoint: endpoint.clone(),
        model: model.clone(),
        max_tokens: options.max_tokens,
        system: config.prompt.render(
            config.persona.as_deref(),
            &tools.guidance(),
            &config.context,
        ),
        tools: tools.schemas(),
        messages: driver.history(),
        cancel: cancel.clone(),
    };
    let mut stream = ModelStream::start(&*config.model, request);
    let mut assembler = Assembler::new();
    // The adapter's failure in full: the finish chunk records its code and message, the turn's
    // error all of it (status, Retry-After, request id).
    let mut failed: Option<ModelError> = None;
    loop {
        let item = tokio::select! {
            biased;
            cause = cancel.cancelled() => {
                return Err(interrupt(driver, turn, step, &assembler, cause));
            }
            item = stream.next() => item,
        };
        let chunk = match item {
            None => break,
            Some(Ok(chunk)) => chunk,
            Some(Err(error)) => {
                let chunk = failure_finish(error.failure(), cancel.is_cancelled());
                failed = Some(error);
                chunk
            }
        };
        let finished = matches!(chunk, StreamChunk::Finish { .. });
        assembler.push(&chunk);
        driver.append(AssistantChunk { turn, step, chunk })?;
        if finished {
            break;
        }
    }
    drop(stream);
    if let Some(cause) = cancel.cause() {
        return Err(interrupt(driver, turn, step, &assembler, cause));
    }
    let finish = assembler.finish();
    match &finish {
        FinishReason::Error(failure) => {
            return Err(Stop::Failed(match failed {
                Some(error) => error.into_turn_error(),
                None => turn_error(&failure.code, failure.message.clone()),
            }));
        }
        FinishReason::Aborted(failure) => {
            // The model gave up without the turn being cancelled: a failure, not an abort.
            return Err(Stop::Failed(turn_error(ABORTED, failure.message.clone())));
        }
        _ => {}
    }
    let message = Message {
        id: MessageId::new(),
        role: Role::Assistant,
        content: assembler.blocks(),
        source: MessageSource::Model { endpoint, model },
    };
    let calls: Vec<(CallId, Text, Text)> = message
        .tool_calls()
        .map(|(id, name, arguments)| (id.clone(), name.into(), arguments.into()))
        .collect();
    driver.append(AssistantMessage {
        turn,
        step,
        message,
        usage: assembler.usage(),
        interrupted: false,
    })?;
    if finish == FinishReason::MaxTokens {
        return Ok(StepOutcome::MaxTokens);
    }
    if calls.is_empty() {
        return Ok(StepOutcome::Completed);
    }
    let concluded = run_tool_calls(driver, &tools, turn, step, calls, cancel).await?;
    Ok(if concluded {
        StepOutcome::Completed
    } else {
        StepOutcome::ToolsOwe
    })
}

/// Writes what survives of a stream cut off by cancellation (its non-blank text and reasoning,
/// marked interrupted) and returns the abort.
fn interrupt(
    driver: &Driver,
    turn: TurnNo,
    step: StepNo,
    assembler: &Assembler,
    cause: AbortCause,
) -> Stop {
    let content = assembler.interrupted_blocks();
    if !content.is_empty() {
        let options = driver.agent().options();
        let message = Message {
            id: MessageId::new(),
            role: Role::Assistant,
            content,
            source: MessageSource::Model {
                endpoint: options.endpoint.clone().unwrap_or_default(),
                model: options.model.clone().unwrap_or_default(),
            },
        };
        if let Err(error) = driver.append(AssistantMessage {
            turn,
            step,
            message,
            usage: assembler.usage(),
            interrupted: true,
        }) {
            tracing::warn!(%error, "could not record the interrupted assistant prefix");
        }
    }
    Stop::Aborted(cause)
}

/// A call ready to start: either a tool to dispatch or a result decided without running one.
enum Prepared {
    Dispatch(Arc<dyn Tool>, serde_json::Value),
    Decided(ToolOutput),
}

impl Prepared {
    fn of(tools: &Toolset, name: &str, raw: &str) -> Self {
        let Some(tool) = tools.get(name) else {
            return Prepared::Decided(ToolOutput::error(
                "ToolNotAvailable",
                TOOL_NOT_AVAILABLE,
                format!("No tool named {name:?} is available to this agent."),
            ));
        };
        match parse_arguments(raw) {
            Ok(arguments) => Prepared::Dispatch(tool.clone(), arguments),
            Err(reason) => Prepared::Decided(ToolOutput::error(
                "InvalidArguments",
                INVALID_ARGUMENTS,
                format!("The arguments for {name:?} are not valid JSON ({reason}); nothing ran."),
            )),
        }
    }

    /// Whether the call may run alongside others. Decided results run nothing, so they may.
    fn parallel(&self) -> bool {
        match self {
            Prepared::Dispatch(tool, arguments) => tool.parallel_safe(arguments),
            Prepared::Decided(_) => true,
        }
    }
}

/// A started call whose result is not committed yet.
enum Started {
    Running(JoinHandle<ToolOutput>),
    Decided(ToolOutput),
}

impl Started {
    async fn settle(self) -> ToolOutput {
        match self {
            Started::Decided(output) => output,
            Started::Running(handle) => match handle.await {
                Ok(output) => output,
                Err(join) => ToolOutput::error(
                    "ToolPanicked",
                    TOOL_PANICKED,
                    format!("The tool failed unexpectedly and returned no result ({join})."),
                ),
            },
        }
    }
}

/// Runs the calls of one assistant message. Calls start in model order: a call that is not
/// parallel-safe runs alone, parallel-safe calls run together up to the agent's limit. Results
/// are committed in model order. Every `tool/call` is durable before its tool runs. Once the turn
/// is cancelled no call starts, not even one whose `tool/call` was being flushed when the cancel
/// came; started calls settle and commit, and every call that did not start gets an
/// `ABORTED_BEFORE_DISPATCH` result (and its `tool/call` first), so the log stays paired. Returns whether
/// a result concluded the turn.
async fn run_tool_calls(
    driver: &Driver,
    tools: &Toolset,
    turn: TurnNo,
    step: StepNo,
    calls: Vec<(CallId, Text, Text)>,
    cancel: &Cancellation,
) -> Result<bool, Stop> {
    let limit = driver.config().max_parallel_tools.max(1);
    let mut prepared: VecDeque<(CallId, Prepared)> = calls
        .iter()
        .map(|(id, name, raw)| (id.clone(), Prepared::of(tools, name, raw)))
        .collect();
    let mut unstarted = calls.into_iter();
    let mut in_flight: VecDeque<(CallId, Started, bool)> = VecDeque::new();
    let mut concluded = false;
    loop {
        let mut dispatch = Vec::new();
        while let Some((_, next)) = prepared.front() {
            let alone = in_flight.is_empty() && dispatch.is_empty();
            let joins = next.parallel()
                && in_flight.iter().all(|(_, _, parallel)| *parallel)
                && in_flight.len() + dispatch.len() < limit
                && dispatch.iter().all(|(_, _, parallel)| *parallel);
            if cancel.is_cancelled() || !(alone || joins) {
                break;
            }
            let (call_id, next) = prepared.pop_front().expect("front() was Some");
            let (_, name, raw) = unstarted
                .next()
                .expect("calls and prepared advance together");
            append_call(driver, turn, step, &call_id, name, raw)?;
            let parallel = next.parallel();
            dispatch.push((call_id, next, parallel));
        }
        if dispatch
            .iter()
            .any(|(_, p, _)| matches!(p, Prepared::Dispatch(..)))
        {
            // The calls are durable before anything they do can happen.
            driver.flush().await?;
        }
        // A cancel that lands while the calls are flushed keeps their bodies from starting.
        let cancelled = cancel.is_cancelled();
        for (call_id, next, parallel) in dispatch {
            let started = match next {
                Prepared::Decided(output) => Started::Decided(output),
                Prepared::Dispatch(..) if cancelled => Started::Decided(not_dispatched()),
                Prepared::Dispatch(tool, arguments) => {
                    let ctx = ToolContext {
                        agent: driver.agent().clone(),
                        cancel: cancel.clone(),
                        call_id: call_id.clone(),
                        turn,
                        step,
                    };
                    let span = tracing::info_span!("tool", name = tool.name(), call = %call_id);
                    let run = async move { tool.call(ctx, arguments).await };
                    Started::Running(driver.runtime().spawn(run.instrument(span)))
                }
            };
            in_flight.push_back((call_id, started, parallel));
        }
        let Some((call_id, started, _)) = in_flight.pop_front() else {
            break;
        };
        let output = started.settle().await;
        concluded |= output.concludes_turn;
        commit(driver, turn, step, call_id, output)?;
    }
    for (call_id, name, raw) in unstarted {
        append_call(driver, turn, step, &call_id, name, raw)?;
        commit(driver, turn, step, call_id, not_dispatched())?;
    }
    Ok(concluded)
}

/// Writes a call's `tool/call`.
fn append_call(
    driver: &Driver,
    turn: TurnNo,
    step: StepNo,
    call_id: &CallId,
    name: Text,
    arguments: Text,
) -> Result<(), Stop> {
    driver.append(ToolCall {
        turn,
        step,
        call_id: call_id.clone(),
        name,
        arguments,
    })?;
    Ok(())
}

/// The result of a call whose turn was cancelled before its body started.
fn not_dispatched() -> ToolOutput {
    ToolOutput::error(
        "Aborted",
        ABORTED_BEFORE_DISPATCH,
        "This tool call did not run: its turn was cancelled before it started.",
    )
}

/// Writes a call's `tool/result`, then queues its contexts for the next step.
fn commit(
    driver: &Driver,
    turn: TurnNo,
    step: StepNo,
    call_id: CallId,
    output: ToolOutput,
) -> Result<(), Stop> {
    let message = Message {
        id: MessageId::new(),
        role: Role::User,
        content: vec![ContentBlock::ToolResult {
            tool_call_id: call_id.clone(),
            content: output.content,
            is_error: output.is_error,
        }],
        source: MessageSource::Tool { call_id },
    };
    driver.append(ToolResult {
        turn,
        step,
        message,
        error: output.error,
    })?;
    for context in output.contexts {
        if let Err(error) = driver.push_step_input(context) {
            tracing::warn!(%error, "a tool result's context could not be queued");
        }
    }
    Ok(())
}
