//! A parent agent delegating to another Lineage process over the Agent Client Protocol.
//!
//! The parent's `subagent_acp` tool starts `lineage acp serve` as a child process (its own
//! store, its own process group), hands it the task, and gets its answer back; disposing of the
//! run closes the child's input, and it drains and exits. Both agents ask the same loopback
//! server on 127.0.0.1 (Chat Completions from a script): the child's endpoint reaches it only
//! through the variables the provider sets explicitly, since a child inherits nothing else but
//! an allow-list.
//!
//! It needs the `lineage` binary (`LINEAGE_BIN`, by default the release build beside this
//! workspace):
//!
//! ```sh
//! cargo build --release -p lineage-cli
//! cargo run --release --example acp_delegation
//! ```

use std::error::Error;
use std::path::PathBuf;
use std::sync::Arc;

use lineage::acp::{AcpProvider, AcpProviderConfig};
use lineage::agent::{AgentSpec, CreateAgent};
use lineage::models::{Endpoint, Models, Wire};
use lineage::subagent::Host;
use lineage_testkit::loopback::{LoopbackServer, chat};

/// The `lineage` binary: `LINEAGE_BIN`, or the release build in this workspace's target
/// directory.
fn lineage_bin() -> Result<PathBuf, String> {
    let path = match std::env::var_os("LINEAGE_BIN") {
        Some(path) => PathBuf::from(path),
        None => std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(
                || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"),
                PathBuf::from,
            )
            .join("release/lineage"),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "no lineage binary at {}: run `cargo build --release -p lineage-cli` or set LINEAGE_BIN",
            path.display()
        ))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let task = r#"{"description": "ask the expert", "prompt": "What is the capital of France?"}"#;
    let server = LoopbackServer::start([
        // The parent delegates...
        chat::Script::new()
            .tool_call("call-1", "subagent_acp", &[task])
            .tool_stop()
            .reply(),
        // ...the child, in its own process, answers...
        chat::Script::new().text("Paris.").stop().reply(),
        // ...and the parent, having read the answer, finishes.
        chat::Script::new()
            .text("The expert says: Paris.")
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

    let dir = tempfile::tempdir()?;
    let child_store = dir.path().join("child.lineage");
    let mut config = AcpProviderConfig::new(
        "expert",
        lineage_bin()?,
        ["acp", "serve", "--model", "loopback:scripted", "--store"],
    );
    config.args.push(child_store.clone().into());
    config.env = vec![
        ("LINEAGE_BASE_URL".into(), server.base_url().into()),
        ("LINEAGE_WIRE".into(), "chat".into()),
    ];
    let provider = AcpProvider::new(config);
    let row = provider.tool_row("subagent_acp");

    let host = Host::open(&dir.path().join("parent.lineage"), Arc::new(models))?;
    host.subagents.register_provider(Arc::new(provider))?;
    let spec = AgentSpec {
        tools: host.delegation_tools(vec![row]),
        ..AgentSpec::new("loopback", "scripted")
    };
    let mut create = CreateAgent::fresh(spec);
    // The ACP child runs in its parent's working directory.
    create.header.cwd = Some(dir.path().to_string_lossy().as_ref().into());
    let parent = host.agents.create(create).await?;
    let outcome = host
        .run(&parent, "Ask the expert for the capital of France.")
        .await?;
    println!("parent: {}", outcome.text());
    drop(parent);
    host.close().await?;

    let child = lineage::store::Store::open(&child_store)?;
    let sessions = child.list()?;
    println!(
        "the child's store holds {} session(s), verified: {}",
        sessions.len(),
        child.verify()?.is_ok()
    );
    if !outcome.completed() || outcome.text() != "The expert says: Paris." || sessions.len() != 1 {
        return Err(format!("unexpected run: {outcome:?}").into());
    }
    Ok(())
}
