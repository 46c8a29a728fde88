//! [`SubagentError`]: every refusal and failure of the delegation layer, with a stable code.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

use lineage_agent::AgentError;
use lineage_log::{AbortCause, SessionId};

/// What went wrong, for programs. The string form ([`ErrorCode::as_str`]) is stable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// A provider with that name is already registered.
    DuplicateProvider,
    /// No provider is registered under the name.
    NoProvider,
    /// The provider does not support an option the request uses.
    UnsupportedCapability,
    /// The request itself is malformed (an output schema outside the supported subset, a tool
    /// filter that names nothing, a child depth out of range).
    InvalidRequest,
    /// The child would be deeper than the request's maximum depth (see [`DepthExceeded`]).
    DepthExceeded,
    /// The child's id is already taken.
    DuplicateChild,
    /// The delegating parent is not the live agent under its id, or is being disposed.
    ParentUnavailable,
    /// The caller cancelled before the child was published.
    Cancelled,
    /// The agent runtime or the store failed underneath the delegation.
    AgentFailure,
    /// Admission is closed: the runtime, or the part of the tree the caller is in, is draining.
    Draining,
    /// The caller lacks the authority: not the exact live parent or ancestor, not a live
    /// continuable child, or not related to the target.
    Unauthorized,
    /// The child's activation (or its parent's) is being torn down.
    ActivationClosing,
    /// The child cannot be resumed: it cannot be read, or it is not a continuable child. Do not
    /// retry with the same id.
    NotResumable,
    /// Tearing down one or more activations failed (each failure is named in the message).
    ActivationTeardownFailed,
    /// The store could not say whether a follow-up was delivered (its mail was posted, then the
    /// database stopped answering): the follow-up may or may not be delivered. Retry with the
    /// same message id, which delivers it at most once.
    OutcomeUnknown,
    /// A follow-up's caller-chosen message id names a message the child holds already with
    /// other content: an id is one message. Send new content under a new id.
    MessageIdReused,
}

impl ErrorCode {
    /// The stable string form, for example `NO_PROVIDER`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::DuplicateProvider => "DUPLICATE_PROVIDER",
            ErrorCode::NoProvider => "NO_PROVIDER",
            ErrorCode::UnsupportedCapability => "UNSUPPORTED_CAPABILITY",
            ErrorCode::InvalidRequest => "INVALID_REQUEST",
            ErrorCode::DepthExceeded => "DEPTH_EXCEEDED",
            ErrorCode::DuplicateChild => "DUPLICATE_CHILD",
            ErrorCode::ParentUnavailable => "PARENT_UNAVAILABLE",
            ErrorCode::Cancelled => "CANCELLED",
            ErrorCode::AgentFailure => "AGENT_FAILURE",
            ErrorCode::Draining => "DRAINING",
            ErrorCode::Unauthorized => "UNAUTHORIZED",
            ErrorCode::ActivationClosing => "ACTIVATION_CLOSING",
            ErrorCode::NotResumable => "NOT_RESUMABLE",
            ErrorCode::ActivationTeardownFailed => "ACTIVATION_TEARDOWN_FAILED",
            ErrorCode::OutcomeUnknown => "OUTCOME_UNKNOWN",
            ErrorCode::MessageIdReused => "MESSAGE_ID_REUSED",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refusal or failure of the delegation layer: a code for programs, a sentence for people, and
/// the underlying error when there is one. Cloning shares the source.
#[derive(Clone, Debug)]
pub struct SubagentError {
    code: ErrorCode,
    message: String,
    source: Option<Arc<dyn Error + Send + Sync>>,
}

impl SubagentError {
    /// An error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        SubagentError {
            code,
            message: message.into(),
            source: None,
        }
    }

    /// The same error, caused by `source`.
    pub fn with_source(mut self, source: impl Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// The code.
    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// The sentence, without the source.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The cause of the caller's cancellation, when that is what stopped the operation (an
    /// [`ErrorCode::Cancelled`] error that says who cancelled).
    pub fn cancel_cause(&self) -> Option<&AbortCause> {
        self.source
            .as_deref()?
            .downcast_ref::<CancelledBy>()
            .map(|c| &c.cause)
    }

    /// The attempted and allowed depths, when the error is [`ErrorCode::DepthExceeded`].
    pub fn depth_exceeded(&self) -> Option<&DepthExceeded> {
        self.source.as_deref()?.downcast_ref()
    }

    /// The error of a failed agent operation on `agent`, classified.
    pub(crate) fn agent(agent: SessionId, source: AgentError) -> Self {
        let code = match &source {
            AgentError::AlreadyLive { .. } => ErrorCode::DuplicateChild,
            AgentError::UnknownTool { .. }
            | AgentError::DuplicateTool { .. }
            | AgentError::InvalidOption { .. } => ErrorCode::InvalidRequest,
            AgentError::Cancelled { .. } => ErrorCode::Cancelled,
            _ => ErrorCode::AgentFailure,
        };
        let message = match code {
            ErrorCode::DuplicateChild => format!("subagent {agent} already exists"),
            _ => format!("subagent {agent}: {source}"),
        };
        SubagentError::new(code, message).with_source(source)
    }
}

impl fmt::Display for SubagentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error for SubagentError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

/// Who cancelled an operation: the source of an [`ErrorCode::Cancelled`] error raised by the
/// caller's cancellation (see [`SubagentError::cancel_cause`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cancelled {}", describe_cause(.cause))]
pub struct CancelledBy {
    /// The cause the cancellation fired with.
    pub cause: AbortCause,
}

/// Who cancelled, as the end of "cancelled …".
pub(crate) fn describe_cause(cause: &AbortCause) -> String {
    match cause {
        AbortCause::User => "by the user".to_owned(),
        AbortCause::Parent => "by the delegating parent".to_owned(),
        AbortCause::Hook { reason } => format!("by a hook ({reason})"),
        AbortCause::Disposed => "because the agent was disposed".to_owned(),
        other => format!("for a cause this build does not know ({other:?})"),
    }
}

/// A child that would be deeper than its request allows: the source of a
/// [`ErrorCode::DepthExceeded`] error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("subagent depth {attempted} exceeds the maximum depth {max}")]
pub struct DepthExceeded {
    /// The depth the child would have had.
    pub attempted: u32,
    /// The deepest the request allows.
    pub max: u32,
}

impl From<DepthExceeded> for SubagentError {
    fn from(depth: DepthExceeded) -> Self {
        SubagentError::new(ErrorCode::DepthExceeded, depth.to_string()).with_source(depth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_have_stable_names_and_depth_errors_keep_their_numbers() {
        assert_eq!(ErrorCode::NoProvider.as_str(), "NO_PROVIDER");
        assert_eq!(ErrorCode::OutcomeUnknown.as_str(), "OUTCOME_UNKNOWN");
        assert_eq!(
            ErrorCode::UnsupportedCapability.to_string(),
            "UNSUPPORTED_CAPABILITY"
        );
        let error = SubagentError::from(DepthExceeded {
            attempted: 4,
            max: 3,
        });
        assert_eq!(error.code(), ErrorCode::DepthExceeded);
        assert_eq!(
            error.to_string(),
            "subagent depth 4 exceeds the maximum depth 3"
        );
        assert_eq!(
            error.depth_exceeded(),
            Some(&DepthExceeded {
                attempted: 4,
                max: 3
            })
        );
        assert!(
            SubagentError::new(ErrorCode::NoProvider, "x")
                .depth_exceeded()
                .is_none()
        );
    }
}
