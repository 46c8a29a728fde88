//! The session header: a cache of facts the log also holds, plus creation facts.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Digest, LogError, SessionId, Text};

/// The version of the log format (the record codec and the header) this build reads and writes.
///
/// It is stamped into every header; the store's layout has its own version in its `meta` table. A
/// reader refuses any other version: a newer one needs a newer Lineage, an older one has no upgrade
/// path yet.
pub const FORMAT_VERSION: u32 = 1;

/// Why a session exists, when it is not a top-level session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Origin {
    /// A delegated child of another agent.
    Subagent,
}

/// A session's header.
///
/// `parent`, `seed_len`, `seed_digest` and `delegation_depth` repeat what the session's
/// `session/lineage` event says, and `origin` what its `subagent/descriptor` says; the log is the
/// truth and `verify` reports any difference.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// The log format version the session was written in.
    pub format_version: u32,
    /// The session's id.
    pub id: SessionId,
    /// When the session was created, in milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// The working directory the session ran in: an absolute path, when known.
    pub cwd: Option<Text>,
    /// The session whose history this one inherited.
    pub parent: Option<SessionId>,
    /// How many leading events were inherited from `parent` (0 for a fresh session).
    pub seed_len: u64,
    /// Set for delegated children.
    pub origin: Option<Origin>,
    /// How deep in a delegation chain the session sits (0 at top level).
    pub delegation_depth: u32,
    /// The agent composition the session was built from.
    pub agent_preset: Option<Text>,
    /// The parent's running digest at `seed_len - 1`, proving the inherited prefix is the parent's.
    pub seed_digest: Option<Digest>,
}

impl Header {
    /// The header of a fresh top-level session.
    pub fn new(id: SessionId, created_at_ms: u64) -> Self {
        Header {
            format_version: FORMAT_VERSION,
            id,
            created_at_ms,
            cwd: None,
            parent: None,
            seed_len: 0,
            origin: None,
            delegation_depth: 0,
            agent_preset: None,
            seed_digest: None,
        }
    }

    /// The same header with `cwd` set.
    pub fn with_cwd(mut self, cwd: impl Into<Text>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// Checks the header's own rules: a supported format version and an absolute `cwd`.
    pub fn validate(&self) -> Result<(), LogError> {
        check_format_version(self.format_version)?;
        if let Some(cwd) = &self.cwd
            && !Path::new(cwd.as_str()).is_absolute()
        {
            return Err(LogError::InvalidHeader {
                field: "cwd",
                reason: format!("must be an absolute path, got {cwd:?}"),
            });
        }
        if self.parent.is_none() && (self.seed_len != 0 || self.seed_digest.is_some()) {
            return Err(LogError::InvalidHeader {
                field: "parent",
                reason: "a session with a seed must name its parent".into(),
            });
        }
        Ok(())
    }
}

/// Refuses a format version other than [`FORMAT_VERSION`], saying which way it differs.
pub fn check_format_version(found: u32) -> Result<(), LogError> {
    match found {
        FORMAT_VERSION => Ok(()),
        v if v > FORMAT_VERSION => Err(LogError::NewerFormat {
            found: v,
            supported: FORMAT_VERSION,
        }),
        v => Err(LogError::OlderFormat {
            found: v,
            supported: FORMAT_VERSION,
        }),
    }
}
