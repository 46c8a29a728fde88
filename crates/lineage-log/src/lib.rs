//! The Lineage session log: the data model and its rules, as pure functions.
//!
//! A session is an append-only sequence of [`Event`]s whose seqs are their indexes. This crate
//! defines the vocabulary ([`EventBody`]), the contracts a log keeps ([`check_append`],
//! [`check_seed`], [`Log`]), crash repair ([`interrupted_turn_closers`]), forking
//! ([`fork_session`]), the folds that derive a session's facts from its own suffix, and the record
//! codec with its running digest ([`Encoder`], [`decode_record`], [`Chain`]).
//!
//! It does no I/O and has no async: `lineage-store` persists logs, the runtime crates run agents.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod codec;
mod error;
mod event;
mod fold;
mod fork;
mod header;
mod ids;
mod json;
mod json_form;
mod message;
mod meta;
mod rules;
mod text;

pub use codec::{
    Chain, Digest, Encoder, FLAG_IGNORABLE, RawRecord, Records, decode_record, decode_records,
    encode_record, put_varint, split_record, take_varint,
};
pub use error::LogError;
pub use event::{
    AbortCause, ApprovalPolicy, AssistantChunk, AssistantMessage, BlockType, BudgetLimit,
    BudgetReached, Custom, DescriptorMode, Event, EventBody, EventKind, FinishReason, InboxSpliced,
    InboxTarget, ModelFailure, Opaque, PolicySource, SandboxMode, SessionLineage, StepEnd, StepNo,
    StepStart, StreamChunk, SubagentDescriptor, ToolCall, ToolCallDelta, ToolError, ToolFilter,
    ToolResult, TurnEnd, TurnEndReason, TurnError, TurnNo, TurnStart, Usage,
};
pub use fold::{
    PolicyOverrides, final_output, fold_delegation_depth, fold_descriptor, fold_header,
    fold_lineage, fold_policy, model_history, own_suffix, seed_len, with_log_facts,
};
pub use fork::{
    ForkSpec, Forked, child_header, fork_session, fork_session_with_setup, origin_of, setup_events,
};
pub use header::{FORMAT_VERSION, Header, Origin, check_format_version};
pub use ids::{CallId, MessageId, RunId, SessionId};
pub use json::check_strict_json;
pub use json_form::{
    JSON_FORM_VERSION, JsonFormError, JsonSession, SESSION_LINE_TYPE, SessionReader,
    body_from_json, digest_from_hex, event_from_json, event_line, event_to_json, from_hex,
    session_from_json_lines, session_line, session_to_json_lines, to_hex,
};
pub use message::{ContentBlock, MAX_NESTING, Message, MessageSource, Role};
pub use meta::{
    MAX_META_VALUE_BYTES, MAX_TAG_KEY_BYTES, MetaError, MetaUpdate, SESSION_META_EVENT,
    SessionMeta, check_tag_key, fold_session_meta,
};
pub use rules::{
    Log, Structure, TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN, TurnMarker, check_append,
    check_append_before_descriptor_contract, check_descriptor, check_seed, check_shape,
    completed_turn_prefix, interrupted_turn_closers, is_balanced, last_turn_marker,
    resolve_fork_boundary,
};
pub use text::Text;
