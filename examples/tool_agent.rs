//! A single agent with a tool, on a real HTTP endpoint, run to completion.
//!
//! By default the endpoint is a loopback server on 127.0.0.1 that speaks the OpenAI-compatible
//! Chat Completions format from a script: it first asks for the `add` tool, then answers with
//! the sum the tool returned. Set `LINEAGE_MODEL=ENDPOINT:MODEL` (and the endpoint's key
//! variable, see `lineage chat --help`) to ask a real model the same question instead:
//!
//! ```sh
//! cargo run --release --example tool_agent
//! LINEAGE_MODEL=openai:gpt-4.1 OPENAI_API_KEY=sk-... cargo run --release --example tool_agent
//! ```
//!
//! An optional argument names the store file to keep (by default a temporary one); `lineage
//! show FILE ID` then prints every event of the run.

use std::error::Error;
use std::path::PathBuf;
use std::sync::Arc;

use lineage::agent::{AgentSpec, BoxFuture, CreateAgent, Tool, ToolContext, ToolOutput};
use lineage::models::{Endpoint, Models, Wire};
use lineage::subagent::Host;
use lineage_testkit::loopback::{LoopbackServer, chat};
use serde_json::{Value, json};

const QUESTION: &str = "What is 19.5 + 22.5? Use the add tool.";

/// The tool: adds two numbers. A bad argument is a result the model reads, never a panic.
struct Add;

impl Tool for Add {
    fn name(&self) -> &str {
        "add"
    }

    fn description(&self) -> &str {
        "Adds two numbers and returns their sum."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        })
    }

    fn call(&self, _ctx: ToolContext, arguments: Value) -> BoxFuture<'_, ToolOutput> {
        Box::pin(async move {
            match (arguments["a"].as_f64(), arguments["b"].as_f64()) {
                (Some(a), Some(b)) => ToolOutput::text((a + b).to_string()),
                _ => ToolOutput::error("add", "BAD_NUMBERS", "`a` and `b` must be numbers"),
            }
        })
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    // The model: a real endpoint from the environment, or the loopback server's script.
    let mut loopback = None;
    let (models, spec) = match std::env::var("LINEAGE_MODEL") {
        Ok(_) => {
            let (models, choice) = Models::from_env(None, |v| std::env::var(v).ok())?;
            (models, AgentSpec::new(choice.endpoint, choice.model))
        }
        Err(_) => {
            let call = r#"{"a": 19.5, "b": 22.5}"#;
            let server = LoopbackServer::start([
                chat::Script::new()
                    .tool_call("call-1", "add", &[call])
                    .usage(61, 18, None)
                    .tool_stop()
                    .reply(),
                chat::Script::new()
                    .text("19.5 + 22.5 = 42.")
                    .usage(87, 9, None)
                    .stop()
                    .reply(),
            ])
            .await?;
            let mut models = Models::new();
            models.endpoint(Endpoint::new(
                "loopback",
                Wire::ChatCompletions,
                server.base_url(),
            ))?;
            loopback = Some(server);
            (models, AgentSpec::new("loopback", "scripted"))
        }
    };

    let dir = tempfile::tempdir()?;
    let path = std::env::args_os()
        .nth(1)
        .map_or_else(|| dir.path().join("sessions.lineage"), PathBuf::from);
    let host = Host::open(&path, Arc::new(models))?;
    let spec = AgentSpec {
        tools: vec![Arc::new(Add)],
        ..spec
    };
    let agent = host.agents.create(CreateAgent::fresh(spec)).await?;
    println!("agent {} asks: {QUESTION}", agent.id());

    let outcome = host.run(&agent, QUESTION).await?;
    for event in agent.events() {
        if let lineage::log::EventBody::AssistantMessage(step) = &event.body {
            for (_, name, arguments) in step.message.tool_calls() {
                println!("  seq {}: the model called {name} {arguments}", event.seq);
            }
        }
    }
    println!(
        "answer: {}\nstop reason: {:?}, turns: {}, tokens in/out: {}/{}",
        outcome.text(),
        outcome.stop_reason,
        outcome.turns,
        outcome.usage.input_tokens,
        outcome.usage.output_tokens,
    );
    host.close().await?;

    if let Some(server) = loopback {
        // The second request carried the tool's result back to the model.
        let requests = server.requests();
        let sent = requests.get(1).and_then(|r| r.json()).unwrap_or_default();
        if requests.len() != 2 || !sent.to_string().contains("\"42\"") || !outcome.completed() {
            return Err(format!("unexpected run: {outcome:?}, {} requests", requests.len()).into());
        }
    } else if !outcome.completed() {
        return Err(format!("the turn did not complete: {:?}", outcome.stop_reason).into());
    }
    if std::env::args_os().nth(1).is_some() {
        println!("kept: lineage show {} {}", path.display(), agent.id());
    }
    Ok(())
}
