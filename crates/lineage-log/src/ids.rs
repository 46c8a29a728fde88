//! Identifiers.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::Text;

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(Uuid);

        impl $name {
            /// The id with this exact UUID.
            pub const fn from_uuid(uuid: Uuid) -> Self {
                Self(uuid)
            }

            /// The UUID.
            pub const fn as_uuid(&self) -> Uuid {
                self.0
            }

            /// The id as a big-endian integer: numeric order is byte order.
            pub const fn as_u128(&self) -> u128 {
                self.0.as_u128()
            }

            /// The id whose big-endian integer form is `value`.
            pub const fn from_u128(value: u128) -> Self {
                Self(Uuid::from_u128(value))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0.hyphenated(), f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0.hyphenated())
            }
        }

        impl FromStr for $name {
            type Err = uuid::Error;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s).map(Self)
            }
        }
    };
}

uuid_id!(
    /// A session's id: a UUIDv7, so that key order in the store is creation order.
    SessionId
);
uuid_id!(
    /// A message's id: a UUIDv7, unique within a session.
    MessageId
);
uuid_id!(
    /// One one-shot run or one activation epoch of a continuable child: a UUIDv4.
    RunId
);

impl SessionId {
    /// A fresh, time-ordered session id.
    pub fn new() -> Self {
        Self(Uuid::now_v7())
    }

    /// A deterministic UUIDv7 for a session created at `created_at_ms` that is known elsewhere by
    /// `parts` (for example a session imported from another tool's files): the same inputs always
    /// give the same id, and ids still sort by creation time. The bits a UUIDv7 leaves random
    /// come from a hash of `parts`.
    pub fn derived(created_at_ms: u64, parts: &[&[u8]]) -> Self {
        let mut hasher = blake3::Hasher::new_derive_key("lineage 2026 derived session id");
        for part in parts {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
        let mut bytes = [0u8; 10];
        bytes.copy_from_slice(&hasher.finalize().as_bytes()[..10]);
        Self(uuid::Builder::from_unix_timestamp_millis(created_at_ms, &bytes).into_uuid())
    }
}

impl Default for SessionId {
    fn default() -> Self {
        Self::new()
    }
}

impl MessageId {
    /// A fresh, time-ordered message id.
    pub fn new() -> Self {
        Self(Uuid::now_v7())
    }

    /// A deterministic id derived from `parts`, for messages that a pure function synthesizes
    /// (crash-repair results): the same inputs always give the same id.
    pub fn derived(parts: &[&[u8]]) -> Self {
        let mut hasher = blake3::Hasher::new_derive_key("lineage 2026 derived message id");
        for part in parts {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&hasher.finalize().as_bytes()[..16]);
        Self(uuid::Builder::from_custom_bytes(bytes).into_uuid())
    }
}

impl Default for MessageId {
    fn default() -> Self {
        Self::new()
    }
}

impl RunId {
    /// A fresh random run id.
    pub fn new() -> Self {
        Self(Uuid::new_v4())
    }
}

impl Default for RunId {
    fn default() -> Self {
        Self::new()
    }
}

/// A tool call's id, as the model chose it.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CallId(Text);

impl CallId {
    /// The call id `id`.
    pub fn new(id: impl Into<Text>) -> Self {
        Self(id.into())
    }

    /// The id as the model wrote it.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl<T: Into<Text>> From<T> for CallId {
    fn from(id: T) -> Self {
        Self(id.into())
    }
}

impl fmt::Display for CallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for CallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CallId({:?})", self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_sort_by_creation() {
        let a = SessionId::new();
        let b = SessionId::new();
        assert!(a.as_u128() < b.as_u128());
        assert_eq!(SessionId::from_u128(a.as_u128()), a);
    }

    #[test]
    fn derived_message_ids_are_deterministic_and_distinct() {
        let a = MessageId::derived(&[b"call-1", &7u64.to_le_bytes()]);
        assert_eq!(a, MessageId::derived(&[b"call-1", &7u64.to_le_bytes()]));
        assert_ne!(a, MessageId::derived(&[b"call-1", &8u64.to_le_bytes()]));
        // Length prefixes keep ("ab", "c") apart from ("a", "bc").
        assert_ne!(
            MessageId::derived(&[b"ab", b"c"]),
            MessageId::derived(&[b"a", b"bc"])
        );
    }

    #[test]
    fn derived_session_ids_are_deterministic_v7_ids_of_their_time() {
        let a = SessionId::derived(1_750_000_000_000, &[b"upstream", b"session-1"]);
        assert_eq!(
            a,
            SessionId::derived(1_750_000_000_000, &[b"upstream", b"session-1"])
        );
        assert_ne!(
            a,
            SessionId::derived(1_750_000_000_000, &[b"upstream", b"session-2"])
        );
        assert_eq!(a.as_uuid().get_version_num(), 7);
        let later = SessionId::derived(1_750_000_000_001, &[b"upstream", b"session-1"]);
        assert!(a < later, "ids sort by creation time");
    }

    #[test]
    fn ids_parse_their_display_form() {
        let id = SessionId::new();
        assert_eq!(id.to_string().parse::<SessionId>().unwrap(), id);
        assert!("not-a-uuid".parse::<SessionId>().is_err());
    }
}
