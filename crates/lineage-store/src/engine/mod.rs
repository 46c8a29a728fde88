//! The engine seam: the little a storage engine does for the store.
//!
//! Everything that gives the store its meaning (validation, encoding, digests, cutting blocks,
//! crash repair, fork, verify) is the same on every engine. Beside the store's `meta` (its magic,
//! format version and id), an engine stores three kinds of opaque values: session rows keyed by
//! session, blocks keyed by `(session, first_seq)`, and the children index `(parent, child)`. It
//! gives consistent read views of them ([`View`]), commits rounds of
//! writes ([`Engine::commit`]), each session's write conditional on where its log ends, and reads
//! back a round whose commit is in doubt ([`Engine::resolve`]). So every engine holds
//! byte-identical blocks with the same digests. How the hosts sharing a store keep out of each
//! other's way (leases, the mailbox) is apart from storage: [`Coordination`].

#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod redb;

use lineage_log::SessionId;

use crate::Result;
use crate::error::EngineError;

/// A stored value as its engine lends it (a page of the embedded file, a column of a row),
/// read in place.
pub(crate) struct Bytes(Box<dyn AsRef<[u8]> + Send>);

impl Bytes {
    pub fn new(value: impl AsRef<[u8]> + Send + 'static) -> Bytes {
        Bytes(Box::new(value))
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        (*self.0).as_ref()
    }
}

/// One session's blocks in seq order, as `(first_seq, value)`.
pub(crate) type Blocks = Box<dyn Iterator<Item = Result<(u64, Bytes)>> + Send>;

/// A consistent read view: every call sees the same committed state.
pub(crate) trait View: Send {
    /// A session's row.
    fn row(&self, session: SessionId) -> Result<Option<Bytes>>;

    /// Every row, in id order.
    fn rows(&self) -> Result<Vec<(SessionId, Bytes)>>;

    /// The session's blocks whose first seq is at least `start`, in seq order.
    fn blocks(&self, session: SessionId, start: u64) -> Result<Blocks>;

    /// The first seq of the block that holds `seq`: the last block starting at or before it (0
    /// when there is none).
    fn block_start(&self, session: SessionId, seq: u64) -> Result<u64>;

    /// The children `parent`'s index entries name, in id order.
    fn children(&self, parent: SessionId) -> Result<Vec<SessionId>>;

    /// The whole children index, in `(parent, child)` order.
    fn child_index(&self) -> Result<Vec<(SessionId, SessionId)>>;

    /// Every descendant of `root`, breadth first.
    fn descendants(&self, root: SessionId) -> Result<Vec<SessionId>> {
        let mut out = self.children(root)?;
        let mut next = 0;
        while next < out.len() {
            let more = self.children(out[next])?;
            out.extend(more);
            next += 1;
        }
        Ok(out)
    }
}

/// One session's share of a commit round.
#[derive(Debug)]
pub(crate) struct SessionWrite {
    pub session: SessionId,
    /// Whether the session has no row yet: then no row may exist, and a child gets its
    /// `(parent, child)` index entry.
    pub new: bool,
    /// The parent a new session's header names.
    pub parent: Option<SessionId>,
    /// Where the stored log must end for this write to apply: the first seq of its first block.
    pub expected: u64,
    /// The session's new row.
    pub row: Vec<u8>,
    /// Block values keyed by first seq, contiguous, ending where the new row does. They start at
    /// `expected`, or earlier where they rewrite stored blocks.
    pub blocks: Vec<(u64, Vec<u8>)>,
    /// First seqs of stored blocks (before `expected`) that `blocks` replace: removed, unless a
    /// new block has the same key, which then overwrites it.
    pub replaced: Vec<u64>,
    /// The fencing token of the lease this store holds on the session, if it holds one: the
    /// write applies only while that lease has not been taken over. Without one, the write
    /// applies only while no other holder's lease on the session is live.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub fence: Option<u64>,
}

impl SessionWrite {
    /// This write again, once it is in the store: the same blocks and row at the same keys,
    /// conditional on the log ending where this write left it. Applying it changes no value.
    pub fn rewritten(&self) -> SessionWrite {
        let end = self
            .blocks
            .last()
            .map_or(self.expected, |(first, value)| first + block_count(value));
        SessionWrite {
            session: self.session,
            new: false,
            parent: self.parent,
            expected: end,
            row: self.row.clone(),
            blocks: self.blocks.clone(),
            replaced: Vec::new(),
            fence: self.fence,
        }
    }
}

/// What became of one session's write in a committed round.
#[derive(Debug)]
pub(crate) enum Written {
    Applied,
    /// The stored log did not end where the write expected: another writer got there first (or
    /// the session was created, or removed, elsewhere). Nothing of the write was applied.
    Conflict {
        /// The stored session's next seq, or `None` when no row is stored.
        found: Option<u64>,
    },
    /// The session's lease forbade the write: the lease this store held was taken over (or
    /// released), or, for a write without a lease, another holder's lease is live. Nothing of
    /// the write was applied.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Fenced {
        /// The lease as it stands, if any.
        lease: Option<LeaseState>,
    },
    /// The engine refused this session's write alone; nothing of it was applied, and the rest of
    /// the round was committed without it.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Failed(EngineError),
}

/// A committed round: each write's fate (in the order given) and each deletion's answer.
pub(crate) struct Committed {
    pub writes: Vec<Written>,
    pub deletions: Vec<(u64, Result<Deleted>)>,
}

/// A round that did not commit, or whose outcome the engine could not learn.
pub(crate) struct CommitError {
    pub error: EngineError,
    /// Set when the failure came at the commit point itself (the durable write, the answer to
    /// `COMMIT`): the round may be in the store after all, and then it did what this says. `None`
    /// means nothing of the round was committed.
    pub in_doubt: Option<Committed>,
}

impl CommitError {
    /// A failure before the commit point: nothing was committed.
    pub fn before(error: EngineError) -> CommitError {
        CommitError {
            error,
            in_doubt: None,
        }
    }
}

/// What a deletion removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deleted {
    /// The deleted sessions: the one asked for first, then its descendants breadth first.
    pub sessions: Vec<SessionId>,
    /// How many events they held.
    pub events: u64,
    /// How many stored blocks they took.
    pub blocks: u64,
    /// How many bytes of blocks they took.
    pub bytes: u64,
}

/// A deletion to commit in a round. What it removes is decided above the seam (the delete rule,
/// owned and leased sessions), inside the round's transaction, through the engine's [`Removal`].
pub(crate) trait Deletion: Send + Sync {
    /// Matches the answer to its caller.
    fn id(&self) -> u64;

    /// Decides and removes, inside the transaction: the deletion's answer, or the engine's
    /// failure, which fails the round.
    fn run(&self, removal: &mut dyn Removal) -> std::result::Result<Result<Deleted>, EngineError>;
}

/// A storage engine under a [`crate::Store`].
pub(crate) trait Engine: Send + Sync {
    /// A consistent read view of the latest commit.
    fn view(&self) -> Result<Box<dyn View>>;

    /// Commits `writes` and then `deletions` as one round: every write applied or refused alone
    /// ([`Written`]), the whole round durable when this returns `Ok`. An error says whether
    /// nothing was committed or the outcome is unknown ([`CommitError::in_doubt`]), which
    /// [`Engine::resolve`] then settles.
    fn commit(
        &self,
        writes: &[SessionWrite],
        deletions: &[&dyn Deletion],
    ) -> std::result::Result<Committed, CommitError>;

    /// Settles a round whose commit is in doubt (`writes`, which would have done `in_doubt`),
    /// reading back what the store holds: `true` when the round is in the store, and durable
    /// (an engine that cannot trust a write whose sync failed makes it durable again first);
    /// `false` when nothing of it is. A round commits whole, so one write found in the store (its
    /// row, byte for byte) proves the round, as one found where it was expected disproves it; a
    /// round that changed nothing either way is settled as in the store. An error means the
    /// store could not be read: the round stays in doubt.
    fn resolve(
        &self,
        writes: &[SessionWrite],
        in_doubt: &Committed,
    ) -> std::result::Result<bool, EngineError>;

    /// Whether the engine only reads.
    fn read_only(&self) -> bool;

    /// Makes a later commit possible after a failed one (a redb handle that saw an I/O failure is
    /// refused until it is reopened).
    fn recover(&self) {}

    /// Whether the storage awaits recovery by its next writer (see [`crate::Store::awaits_recovery`]).
    fn awaits_recovery(&self) -> bool {
        false
    }

    /// Releases the storage when the store closes; a failure is logged.
    fn release(&self) {}
}

/// How the hosts sharing a store coordinate: a lease per session with a fencing token, so that
/// one host at a time writes it, and a mailbox for delivering to sessions another host keeps.
/// Apart from storage ([`Engine`]): an embedded file has one writer process, and says what that
/// means in its own implementation.
pub(crate) trait Coordination: Send + Sync {
    /// Whether other hosts may write the same sessions, so that leases mean something.
    fn shared(&self) -> bool;

    /// The id this store handle holds leases under.
    fn holder(&self) -> uuid::Uuid;

    /// Takes `session`'s lease for this store's holder for `ttl`: free, released, expired, or
    /// this holder's own (a release that failed). Each acquisition starts a tenure and raises the
    /// fencing token (an engine with one writer grants token 0 every time).
    fn acquire(
        &self,
        session: SessionId,
        ttl: std::time::Duration,
    ) -> std::result::Result<Acquired, EngineError>;

    /// Extends the leases `held` (session and token) by `ttl`; returns those that were lost
    /// (taken over or released), which are not extended.
    fn renew(
        &self,
        held: &[(SessionId, u64)],
        ttl: std::time::Duration,
    ) -> std::result::Result<Vec<SessionId>, EngineError>;

    /// Gives the lease up if this holder still holds it with `fence`. The token is kept, so the
    /// next holder's is larger.
    fn release_lease(&self, session: SessionId, fence: u64)
    -> std::result::Result<(), EngineError>;

    /// The session's lease as it stands (`None`: never leased).
    fn lease(&self, session: SessionId) -> std::result::Result<Option<LeaseState>, EngineError>;

    /// Puts `mail` in the mailbox unless mail with its id is there; says whether it was put.
    fn post(&self, mail: &Mail) -> std::result::Result<bool, EngineError>;

    /// The mail waiting for any of `recipients`, in the order it was posted.
    fn mail_for(&self, recipients: &[SessionId]) -> std::result::Result<Vec<Mail>, EngineError>;

    /// Removes the mail with these ids; returns the ids it removed (mail another caller removed
    /// first is not among them).
    fn take_mail(&self, ids: &[uuid::Uuid]) -> std::result::Result<Vec<uuid::Uuid>, EngineError>;

    /// Claims mail for this holder, about to deliver it in its tenure of the recipient's lease
    /// with the fencing token `fence`: says whether it may (that lease is live and this
    /// holder's; an earlier claimant no longer holds it).
    fn claim_mail(&self, id: uuid::Uuid, fence: u64) -> std::result::Result<bool, EngineError>;

    /// Removes mail unless a host has claimed it; says whether it was removed.
    fn withdraw_mail(&self, id: uuid::Uuid) -> std::result::Result<bool, EngineError>;

    /// Calls `wake` whenever the mailbox may have changed (mail posted or taken by any host),
    /// from the engine's own thread, so it must return at once. Says whether wake-ups come at
    /// all; a watcher told `false` only polls.
    fn watch_mail(&self, wake: MailWake) -> bool {
        let _ = wake;
        false
    }
}

/// What a mailbox watcher is called with nothing: the mailbox may have changed, look again.
pub type MailWake = std::sync::Arc<dyn Fn() + Send + Sync>;

/// A message in a shared store's mailbox, for the host that keeps its recipient resident: how
/// hosts deliver to sessions another host holds. The store keeps it opaque.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mail {
    /// The mail's id: posting mail with an id already waiting posts nothing.
    pub id: uuid::Uuid,
    /// The session it is for.
    pub recipient: SessionId,
    /// The session it is from.
    pub sender: SessionId,
    /// What it says, in the poster's encoding.
    pub body: Vec<u8>,
}

/// The answer to [`Coordination::acquire`].
#[derive(Clone, Debug)]
pub(crate) enum Acquired {
    Granted {
        fence: u64,
    },
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    HeldElsewhere(LeaseState),
}

/// A session's lease as the store holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseState {
    /// The holder: a store handle's id ([`crate::Store::holder`]); `None` once released.
    pub holder: Option<uuid::Uuid>,
    /// The fencing token: raised by every takeover, never lowered.
    pub fence: u64,
    /// How long the lease has left by the database's clock (zero once expired or released).
    pub expires_in: std::time::Duration,
}

impl LeaseState {
    /// Whether a holder still holds it.
    pub fn is_live(&self) -> bool {
        self.holder.is_some() && !self.expires_in.is_zero()
    }

    /// Whether a holder other than `me` still holds it.
    pub fn held_by_other(&self, me: uuid::Uuid) -> bool {
        self.is_live() && self.holder != Some(me)
    }
}

/// Whether a round in doubt (`writes`, which would have done `in_doubt`) is in the store as `view`
/// sees it; see [`Engine::resolve`]. The first applied write decides: its row byte for byte (the
/// row carries the head digest and the revision, so no other write leaves the same bytes) proves
/// the round, any other row disproves it. Without one, a removed session proves it.
pub(crate) fn round_in_store(
    view: &dyn View,
    writes: &[SessionWrite],
    in_doubt: &Committed,
) -> std::result::Result<bool, EngineError> {
    let read = |error: crate::StoreError| match error {
        crate::StoreError::Storage(error) => error,
        crate::StoreError::Unavailable { reason } => {
            EngineError::new(crate::EngineErrorKind::Io, reason)
        }
        other => EngineError::new(crate::EngineErrorKind::Other, other.to_string()),
    };
    let applied = writes
        .iter()
        .zip(&in_doubt.writes)
        .find(|(_, written)| matches!(written, Written::Applied));
    if let Some((write, _)) = applied {
        let row = view.row(write.session).map_err(read)?;
        return Ok(row.is_some_and(|row| *row == write.row[..]));
    }
    for (_, answer) in &in_doubt.deletions {
        if let Ok(deleted) = answer
            && let Some(&session) = deleted.sessions.first()
        {
            return Ok(view.row(session).map_err(read)?.is_none());
        }
    }
    // The round changed nothing: it is settled either way.
    Ok(true)
}

/// What removing one session took.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Removed {
    pub blocks: u64,
    pub events: u64,
    pub bytes: u64,
}

/// The operations a deletion needs inside an engine's write transaction.
pub(crate) trait Removal {
    fn is_stored(&mut self, session: SessionId) -> std::result::Result<bool, EngineError>;
    fn children(&mut self, parent: SessionId) -> std::result::Result<Vec<SessionId>, EngineError>;
    /// Removes the session's row, blocks and index entries (as a child and as a parent).
    fn remove(&mut self, session: SessionId) -> std::result::Result<Removed, EngineError>;
    /// The session's lease if another holder's is live (on a shared store): it is not this
    /// store's to delete.
    fn held_elsewhere(
        &mut self,
        session: SessionId,
    ) -> std::result::Result<Option<LeaseState>, EngineError>;
}

/// The record count a block value's header states (0 for a header too short to say).
pub(crate) fn block_count(value: &[u8]) -> u64 {
    value
        .get(..4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map_or(0, |b| u64::from(u32::from_le_bytes(b)))
}

/// Whether a store's location (a path, as [`crate::Store::open`] takes it) names a PostgreSQL
/// database rather than a file.
pub fn is_database_url(location: &std::path::Path) -> bool {
    location.to_str().is_some_and(is_url)
}

/// A store's location as messages show it: a file's path, or a database URL with its password
/// masked.
pub fn display_location(location: &std::path::Path) -> String {
    match location.to_str().filter(|l| is_url(l)) {
        Some(url) => redact(url),
        None => location.display().to_string(),
    }
}

/// Whether a store's location names a PostgreSQL database rather than a file.
pub(crate) fn is_url(location: &str) -> bool {
    location.starts_with("postgres://") || location.starts_with("postgresql://")
}

/// A database URL with its password, if any, masked: errors and logs name the database, never
/// the secret.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((user, host)) if user.contains(':') => {
            let name = user.split_once(':').map_or(user, |(name, _)| name);
            format!("{scheme}://{name}:***@{host}{tail}")
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_their_password() {
        assert_eq!(
            redact("postgres://ann:secret@db.example:5432/lineage?sslmode=disable"),
            "postgres://ann:***@db.example:5432/lineage?sslmode=disable"
        );
        assert_eq!(
            redact("postgres://ann@db/lineage"),
            "postgres://ann@db/lineage"
        );
        assert_eq!(redact("postgresql://db/lineage"), "postgresql://db/lineage");
        assert!(is_url("postgresql://db/x") && is_url("postgres://db/x"));
        assert!(!is_url("/var/lib/lineage/store.redb"));
    }
}
