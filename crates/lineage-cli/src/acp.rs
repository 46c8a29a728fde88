//! `lineage acp serve`: the store's agents served over the Agent Client Protocol on the
//! process's stdin and stdout (lineage-acp's [`lineage_acp::serve`]).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use lineage_agent::{AgentOptions, AgentSpec, Hooks, Model};
use lineage_models::Models;
use lineage_subagent::tools::SubagentToolConfig;

use crate::chat::files::{ListDirTool, ReadFileTool, Root};
use crate::cli::AcpServeArgs;
use crate::error::{CliError, EXIT_OK};
use crate::host::{Host, open_host};
use crate::script::Script;

/// Runs the server until stdin ends; exit 0 after a clean drain.
pub fn serve(args: &AcpServeArgs) -> Result<u8, CliError> {
    let (model, hooks, options): (Arc<dyn Model>, Option<Arc<dyn Hooks>>, AgentOptions) =
        match &args.script {
            Some(path) => {
                let script = Script::load(path).map_err(CliError::Usage)?;
                let options = AgentOptions {
                    endpoint: Some("script".into()),
                    model: Some("script".into()),
                    ..AgentOptions::default()
                };
                (script.clone(), Some(script), options)
            }
            None => {
                let (models, choice) =
                    Models::from_env(args.model.as_deref(), |v| std::env::var(v).ok())
                        .map_err(|e| CliError::Usage(e.to_string()))?;
                let options = AgentOptions {
                    endpoint: Some(choice.endpoint.as_str().into()),
                    model: Some(choice.model.as_str().into()),
                    ..AgentOptions::default()
                };
                (Arc::new(models), None, options)
            }
        };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Acp(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(async {
        let host = open_host(&args.store, model, true)
            .map_err(|e| CliError::CannotOpen(format!("{}: {e}", args.store.display())))?;
        let spec = move |host: &Host, cwd: &Path| session_spec(host, cwd, &options, &hooks);
        let options = lineage_acp::ServeOptions {
            ask_permission: args.ask.iter().cloned().collect::<HashSet<_>>(),
        };
        lineage_acp::serve(
            host,
            Arc::new(spec),
            options,
            tokio::io::stdin(),
            tokio::io::stdout(),
        )
        .await
        .map_err(|e| CliError::Acp(e.to_string()))?;
        Ok(EXIT_OK)
    })
}

/// A served session's agent: delegation (`subagent`, `subagent_fork` and the controls) and,
/// when `cwd` is a directory, the file tools confined to it.
fn session_spec(
    host: &Host,
    cwd: &Path,
    options: &AgentOptions,
    hooks: &Option<Arc<dyn Hooks>>,
) -> AgentSpec {
    let mut tools = host.delegation_tools(SubagentToolConfig::in_process_rows());
    if let Ok(root) = Root::new(cwd) {
        tools.push(ReadFileTool::new(root.clone()));
        tools.push(ListDirTool::new(root));
    }
    AgentSpec {
        options: options.clone(),
        tools,
        hooks: hooks.clone(),
        ..AgentSpec::default()
    }
}
