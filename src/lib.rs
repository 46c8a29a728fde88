//! Lineage: durable, event-sourced sessions and subagent delegation for AI-agent hosts.
//!
//! This facade re-exports the crates most hosts need:
//!
//! - [`log`]: the session log model (events, messages, rules, repair, fork, folds, codec);
//! - [`store`]: the store, in an embedded redb file or a shared PostgreSQL database (append, load,
//!   inspect, fork, verify, group commit);
//! - [`agent`]: the agent runtime on tokio (inbox, turn loop, model and tool traits, registry);
//! - [`subagent`]: delegation (providers, spawn and fork, one-shot and continuable children);
//! - `models` (feature `models`): model adapters for real endpoints (Chat Completions,
//!   Responses, Anthropic Messages) and a router. Off by default: it brings an HTTP client and
//!   TLS, which a host with its own models does not need;
//! - `acp` (feature `acp`): the Agent Client Protocol: a host served as an ACP agent, and a
//!   provider whose children are any ACP agent's processes;
//! - `products` (feature `products`): Codex and Claude Code as one-shot children, each run a
//!   process of the product's own;
//! - [`Host`]: the composition root (a store, the agents and the subagent runtime), from
//!   `subagent`.
//!
//! Each example below is the short form of a program in `examples/` that CI runs (`cargo run
//! --release --example NAME`).
//!
//! # An agent with a tool, on a real endpoint
//!
//! A host opens a store, makes an agent, runs a prompt to completion (the agent and every child
//! it delegates to quiet) and shuts down in one call. The endpoint here is a loopback server on
//! 127.0.0.1 speaking the Chat Completions format from a script; `Models::from_env` puts a real
//! one in its place (`examples/tool_agent.rs` does when `LINEAGE_MODEL` is set).
//!
//! ```
//! use std::sync::Arc;
//!
//! use lineage::agent::{AgentSpec, BoxFuture, CreateAgent, Tool, ToolContext, ToolOutput};
//! use lineage::models::{Endpoint, Models, Wire};
//! use lineage::subagent::Host;
//! use lineage_testkit::loopback::{LoopbackServer, chat};
//! use serde_json::{Value, json};
//!
//! struct Add;
//!
//! impl Tool for Add {
//!     fn name(&self) -> &str {
//!         "add"
//!     }
//!     fn description(&self) -> &str {
//!         "Adds two numbers and returns their sum."
//!     }
//!     fn input_schema(&self) -> Value {
//!         json!({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}})
//!     }
//!     fn call(&self, _ctx: ToolContext, args: Value) -> BoxFuture<'_, ToolOutput> {
//!         Box::pin(async move {
//!             match (args["a"].as_f64(), args["b"].as_f64()) {
//!                 (Some(a), Some(b)) => ToolOutput::text((a + b).to_string()),
//!                 _ => ToolOutput::error("add", "BAD_NUMBERS", "`a` and `b` must be numbers"),
//!             }
//!         })
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("sessions.lineage");
//! let server = LoopbackServer::start([
//!     chat::tool_call("call-1", "add", r#"{"a": 19.5, "b": 22.5}"#),
//!     chat::text("19.5 + 22.5 = 42."),
//! ])
//! .await?;
//! let mut models = Models::new();
//! models.endpoint(Endpoint::new("loopback", Wire::ChatCompletions, server.base_url()))?;
//!
//! let host = Host::open(&path, Arc::new(models))?;
//! let spec = AgentSpec {
//!     tools: vec![Arc::new(Add)],
//!     ..AgentSpec::new("loopback", "scripted") // the endpoint and model its requests name
//! };
//! let agent = host.agents.create(CreateAgent::fresh(spec)).await?;
//! let outcome = host.run(&agent, "What is 19.5 + 22.5?").await?;
//! assert_eq!(outcome.text(), "19.5 + 22.5 = 42.");
//! assert!(outcome.completed());
//! host.close().await?; // children drained, agents shut down, the store flushed
//! # Ok(())
//! # }
//! ```
//!
//! # A continuable child, a follow-up, a restart and a cold resume
//!
//! The lead gets the delegation tools; its model starts a background child with `subagent` and
//! later talks to it with `send_message`. After a restart nothing of the child is in memory: the
//! lead's message resumes it from its log, history and all. (The scripted model, which answers
//! from the request alone, is hidden here; `examples/continuable_child.rs` shows one.)
//!
//! ```
//! use std::sync::Arc;
//!
//! use lineage::agent::{AgentSpec, CreateAgent};
//! use lineage::log::model_history;
//! use lineage::subagent::tools::SubagentToolConfig;
//! use lineage::subagent::{Host, SpawnProvider};
//! # use lineage::agent::{ChunkStream, Model, ModelRequest, Response, ScriptedModel};
//! # use lineage::log::{MessageSource, Role};
//! #
//! # /// The lead starts a worker, then asks it what the user asks; the worker counts its answers.
//! # struct Story;
//! #
//! # impl Model for Story {
//! #     fn stream(&self, request: ModelRequest) -> ChunkStream {
//! #         let last = request.messages.last().expect("a request has messages");
//! #         let worker = request.messages.iter().find_map(|m| match m.source {
//! #             MessageSource::SubagentSettled { sender, .. } => Some(sender),
//! #             _ => None,
//! #         });
//! #         let response = match (request.model.as_str(), &last.source, worker) {
//! #             ("lead", MessageSource::User, None) => Response::tool_call(
//! #                 "start",
//! #                 "subagent",
//! #                 r#"{"description": "notes", "prompt": "Summarize the notes.", "run_in_background": true}"#,
//! #             ),
//! #             ("lead", MessageSource::User, Some(worker)) => Response::tool_call(
//! #                 "ask",
//! #                 "send_message",
//! #                 &format!(r#"{{"subagent_id": "{worker}", "message": "{}"}}"#, last.text()),
//! #             ),
//! #             ("lead", _, _) => Response::text("noted"),
//! #             _ => {
//! #                 let answered = request.messages.iter().filter(|m| m.role == Role::Assistant);
//! #                 Response::text(&format!("answer {}", answered.count() + 1))
//! #             }
//! #         };
//! #         ScriptedModel::new([response]).stream(request)
//! #     }
//! # }
//!
//! fn lead_spec(host: &Host) -> AgentSpec {
//!     let delegate = SubagentToolConfig::new(SpawnProvider::NAME).continuable().child_model("worker");
//!     AgentSpec {
//!         tools: host.delegation_tools(vec![delegate]), // subagent, send_message, ...
//!         ..AgentSpec::new("story", "lead")
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("sessions.lineage");
//! let host = Host::open(&path, Arc::new(Story))?;
//! let lead = host.agents.create(CreateAgent::fresh(lead_spec(&host))).await?;
//! host.run(&lead, "Start a worker on the release notes.").await?; // until the worker settled
//! host.run(&lead, "Which change matters most?").await?; // a follow-up: its second turn
//! let (lead_id, worker) = (lead.id(), host.store.children(lead.id())?[0]);
//! drop(lead);
//! host.close().await?;
//!
//! let host = Host::open(&path, Arc::new(Story))?; // a new process, as it were
//! let lead = host.resume(lead_id, lead_spec(&host)).await?;
//! host.run(&lead, "Anything else?").await?; // resumes the worker from its log
//! let events = host.store.read_from(worker, 0)?;
//! let history = model_history(&events); // what its next model request would read
//! assert_eq!(history.last().map(|m| m.text()).as_deref(), Some("answer 3"));
//! # drop(lead);
//! host.close().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # After a crash
//!
//! A host that comes back after a crash resumes each root with [`subagent::Host::resume`]: it
//! finds, from the store, every continuable child whose turn the crash tore, and queues one
//! settlement notice for each ("stopped by a crash before it finished", with its closing
//! message), once, however often the host restarts. `examples/crash_recovery.rs` kills a real
//! host process with SIGKILL to show it; here nothing crashed, so nothing is told.
//!
//! ```
//! use std::sync::Arc;
//!
//! use lineage::agent::{AgentSpec, CreateAgent, Response, ScriptedModel};
//! use lineage::subagent::Host;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("sessions.lineage");
//! # let host = Host::open(&path, ScriptedModel::new([Response::text("On it.")]))?;
//! # let lead = host.agents.create(CreateAgent::fresh(AgentSpec::new("scripted", "any"))).await?;
//! # host.run(&lead, "Index the files.").await?;
//! # let lead_id = lead.id();
//! # drop(lead);
//! # host.close().await?;
//! let model = ScriptedModel::new([Response::text("Nothing happened.")]);
//! let host = Host::open(&path, model)?;
//! let lead = host.resume(lead_id, AgentSpec::new("scripted", "any")).await?; // notices queued
//! let outcome = host.run(&lead, "What happened while I was away?").await?; // its turns read them
//! assert_eq!(outcome.text(), "Nothing happened.");
//! # drop(lead);
//! host.close().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Delegating to an agent in another process, over ACP
//!
//! Any command that speaks the Agent Client Protocol on its stdio can be a one-shot child; here
//! it is `lineage acp serve`, a Lineage agent with a store of its own. Its tool row gives the
//! parent's model a `subagent_acp` tool (`examples/acp_delegation.rs` runs this on the loopback
//! server, both processes asking it):
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use lineage::acp::{AcpProvider, AcpProviderConfig};
//! use lineage::agent::{AgentSpec, CreateAgent};
//! use lineage::subagent::Host;
//! # use lineage::agent::{Response, ScriptedModel};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let model = ScriptedModel::new([Response::text("ok")]);
//! let host = Host::open("parent.lineage".as_ref(), model)?;
//! let mut config = AcpProviderConfig::new(
//!     "expert",
//!     "lineage",
//!     ["acp", "serve", "--store", "expert.lineage", "--model", "openai:gpt-4.1"],
//! );
//! config.env.push(("OPENAI_API_KEY".into(), "sk-...".into())); // nothing else credential-shaped passes
//! let provider = AcpProvider::new(config);
//! let row = provider.tool_row("subagent_acp"); // one-shot, depth managed by the child
//! host.subagents.register_provider(Arc::new(provider))?;
//! let spec = AgentSpec { tools: host.delegation_tools(vec![row]), ..AgentSpec::new("openai", "gpt-4.1") };
//! let mut create = CreateAgent::fresh(spec);
//! create.header.cwd = Some("/srv/project".into()); // the child runs here
//! let parent = host.agents.create(create).await?;
//! let outcome = host.run(&parent, "Ask the expert to review src/parser.rs").await?;
//! # drop(parent);
//! host.close().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Codex and Claude Code as children
//!
//! The four delegation tools side by side: `subagent` and `subagent_fork` in process,
//! `subagent_codex` and `subagent_claude_code` each a product's process per run (installed by
//! `scripts/install-products products`; no credential is inherited, so each gets its own). No
//! program in `examples/` runs this one, as the products need an account; `lineage-products`'
//! tests run it against the real products and the loopback server instead:
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use lineage::agent::{AgentSpec, CreateAgent};
//! use lineage::products::{ClaudeCodeConfig, ClaudeCodeProvider, CodexConfig, CodexProvider};
//! use lineage::subagent::Host;
//! use lineage::subagent::tools::SubagentToolConfig;
//! # use lineage::agent::{Response, ScriptedModel};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let model = ScriptedModel::new([Response::text("ok")]);
//! let host = Host::open("parent.lineage".as_ref(), model)?;
//! let mut codex = CodexConfig::new("codex", "products/node_modules/.bin/codex");
//! codex.process.env.push(("OPENAI_API_KEY".into(), "sk-...".into()));
//! let mut claude = ClaudeCodeConfig::new("claude", "products/node_modules/.bin/claude");
//! claude.process.env.push(("ANTHROPIC_API_KEY".into(), "sk-ant-...".into()));
//! let (codex, claude) = (CodexProvider::new(codex), ClaudeCodeProvider::new(claude));
//! let mut rows = SubagentToolConfig::in_process_rows(); // subagent, subagent_fork
//! rows.push(codex.tool_row("subagent_codex"));
//! rows.push(claude.tool_row("subagent_claude_code"));
//! host.subagents.register_provider(Arc::new(codex))?;
//! host.subagents.register_provider(Arc::new(claude))?;
//! let spec = AgentSpec { tools: host.delegation_tools(rows), ..AgentSpec::new("openai", "gpt-4.1") };
//! let mut create = CreateAgent::fresh(spec);
//! create.header.cwd = Some("/srv/project".into()); // the products work here
//! let lead = host.agents.create(create).await?;
//! let outcome = host.run(&lead, "Have Codex fix the failing test, then Claude Code review it").await?;
//! # drop(lead);
//! host.close().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # The store on its own
//!
//! The log and the store need no runtime (`examples/quickstart.rs` writes, forks, reloads after a
//! simulated crash and verifies):
//!
//! ```
//! use lineage::log::{Event, Header, SessionId, TurnStart};
//! use lineage::store::Store;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("sessions.lineage");
//! let store = Store::open(&path)?;
//! let id = SessionId::new();
//! store.create(Header::new(id, 1_700_000_000_000))?;
//! store.append(id, &[Event::new(0, 1_700_000_000_000, TurnStart { turn: 1 })])?;
//! let loaded = store.load(id)?; // the open turn is closed by crash repair
//! assert_eq!(loaded.closers, 1);
//! assert!(store.verify()?.is_ok());
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "acp")]
pub use lineage_acp as acp;
pub use lineage_agent as agent;
pub use lineage_log as log;
#[cfg(feature = "models")]
pub use lineage_models as models;
#[cfg(feature = "products")]
pub use lineage_products as products;
pub use lineage_store as store;
pub use lineage_subagent as subagent;

/// The composition root every example starts from: a store, the agent registry and the
/// subagent runtime on one model catalogue (`lineage::subagent::Host`, at the top).
pub use lineage_subagent::Host;
