//! `acp serve --script`: answers from a file instead of a model, for tests and demonstrations
//! without a network. Each element of the file's JSON array answers one model request, in
//! order, whichever agent asks; `{"refuse": true}` is taken by the step's pre-step hook instead,
//! which refuses the step as a host's policy would.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};

use lineage_agent::{
    BoxFuture, ChunkStream, HookError, Hooks, Model, ModelRequest, PreStep, PreStepDecision,
    Response, SCRIPT_EXHAUSTED, ScriptedCall, ScriptedModel,
};
use serde::Deserialize;

/// One scripted answer.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum Entry {
    Text(String),
    MaxTokens(String),
    ToolCall {
        name: String,
        #[serde(default)]
        arguments: serde_json::Value,
    },
    Error {
        code: String,
        message: String,
    },
    Hang(bool),
    Refuse(bool),
}

/// The script: a model and a pre-step hook over one queue of answers.
pub struct Script {
    entries: Mutex<VecDeque<Entry>>,
    calls: Mutex<u32>,
}

impl Script {
    /// Reads the script at `path`; the error names the file and what is wrong with it.
    pub fn load(path: &Path) -> Result<Arc<Script>, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the script {}: {e}", path.display()))?;
        Script::parse(&text).map_err(|e| format!("the script {}: {e}", path.display()))
    }

    fn parse(text: &str) -> Result<Arc<Script>, String> {
        let entries: VecDeque<Entry> = serde_json::from_str(text).map_err(|e| e.to_string())?;
        Ok(Arc::new(Script {
            entries: Mutex::new(entries),
            calls: Mutex::new(0),
        }))
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next answer to a model request.
    fn next_response(&self) -> Response {
        let entry = Script::lock(&self.entries).pop_front();
        match entry {
            Some(Entry::Text(text)) => Response::text(&text),
            Some(Entry::MaxTokens(text)) => Response::max_tokens(&text),
            Some(Entry::ToolCall { name, arguments }) => {
                let id = {
                    let mut calls = Script::lock(&self.calls);
                    *calls += 1;
                    format!("call-{calls}")
                };
                let arguments = if arguments.is_null() {
                    "{}".to_owned()
                } else {
                    arguments.to_string()
                };
                let call: ScriptedCall<'_> = (&id, &name, &arguments);
                Response::tool_calls(None, &[call])
            }
            Some(Entry::Error { code, message }) => Response::error(&code, &message),
            Some(Entry::Hang(_)) => Response::hang(),
            Some(Entry::Refuse(_)) => Response::error(
                "SCRIPT_OUT_OF_ORDER",
                "the script refuses here, but a step is already open",
            ),
            None => Response::error(SCRIPT_EXHAUSTED, "the script has no answer left"),
        }
    }
}

impl Model for Script {
    fn stream(&self, request: ModelRequest) -> ChunkStream {
        ScriptedModel::new([self.next_response()]).stream(request)
    }
}

impl Hooks for Script {
    fn pre_step(&self, step: PreStep) -> BoxFuture<'_, Result<PreStepDecision, HookError>> {
        let refuse = {
            let mut entries = Script::lock(&self.entries);
            let refuse = matches!(entries.front(), Some(Entry::Refuse(true)));
            if refuse {
                entries.pop_front();
            }
            refuse
        };
        Box::pin(async move {
            Ok(if refuse {
                PreStepDecision::Reject
            } else {
                PreStepDecision::Enter(step.messages)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_entry_parses() {
        let script = Script::parse(
            r#"[{"text": "a"}, {"max_tokens": "b"}, {"tool_call": {"name": "t", "arguments": {"x": 1}}},
                {"error": {"code": "SERVER", "message": "m"}}, {"hang": true}, {"refuse": true}]"#,
        )
        .unwrap();
        assert_eq!(Script::lock(&script.entries).len(), 6);
    }

    #[test]
    fn a_bad_script_says_what_is_wrong() {
        let error = Script::parse(r#"[{"txt": "a"}]"#).err().unwrap();
        assert!(error.contains("unknown variant `txt`"), "{error}");
        assert!(Script::parse("{}").is_err());
    }
}
