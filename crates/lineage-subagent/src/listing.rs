//! Listing a parent's delegated children and a root's whole delegation tree, straight from the
//! store's headers and the live registry: no agent is loaded or resumed, and no provider is
//! asked, so children of removed providers list too.
//!
//! A listing takes its caller's cancellation and checks it before the store is read, between the
//! reads of one child and the next, while it walks the tree and once everything is read: when it
//! has fired the listing stops with [`ErrorCode::Cancelled`], never with a partial list.

use std::collections::{HashMap, HashSet};

use lineage_agent::Cancellation;
use lineage_log::{DescriptorMode, Event, EventBody, Header, Origin, SessionId, Text};

use crate::{ErrorCode, SubagentError, SubagentRuntime};

/// One delegated child in a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildRow {
    /// The child's id.
    pub id: SessionId,
    /// Its durable direct parent.
    pub parent: SessionId,
    /// Edges from the listing's root (direct children are at 1).
    pub depth: u32,
    /// One-shot or continuable.
    pub mode: DescriptorMode,
    /// Its label.
    pub label: Option<Text>,
    /// Whether it is a live agent now.
    pub live: bool,
    /// Whether it has delegated children of its own.
    pub has_children: bool,
}

/// Why a child could not be listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DiagnosticReason {
    /// Its log does not say what it is (no descriptor, one that breaks the descriptor contract,
    /// or a lineage that disagrees with its header).
    Corrupt,
    /// Its log could not be read.
    Unavailable,
}

impl DiagnosticReason {
    /// The reason's name.
    pub const fn as_str(self) -> &'static str {
        match self {
            DiagnosticReason::Corrupt => "corrupt",
            DiagnosticReason::Unavailable => "unavailable",
        }
    }
}

/// A child that could not be read, kept in place so it does not hide its siblings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiagnosticRow {
    /// The child's id.
    pub id: SessionId,
    /// Its durable direct parent.
    pub parent: SessionId,
    /// Edges from the listing's root.
    pub depth: u32,
    /// Why.
    pub reason: DiagnosticReason,
    /// What went wrong, for people.
    pub detail: String,
}

/// A row of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListingRow {
    /// A child.
    Child(ChildRow),
    /// A child that could not be read.
    Diagnostic(DiagnosticRow),
}

impl ListingRow {
    /// The child's id.
    pub fn id(&self) -> SessionId {
        match self {
            ListingRow::Child(row) => row.id,
            ListingRow::Diagnostic(row) => row.id,
        }
    }
}

/// A node to resolve: id, parent, depth, header.
type Candidate = (SessionId, SessionId, u32, Header);

/// Reads a session's own events, from a seq on (blocking).
trait Reader: FnMut(SessionId, u64) -> Result<Vec<Event>, String> + Send + 'static {}

impl<R: FnMut(SessionId, u64) -> Result<Vec<Event>, String> + Send + 'static> Reader for R {}

/// A child to read from the store: its place in the listing, id, parent, depth, header and
/// whether it has delegated children.
type Cold = (usize, SessionId, SessionId, u32, Header, bool);

/// What a listing is of, to name it when it is cancelled.
#[derive(Clone, Copy)]
enum Listing {
    Children(SessionId),
    Descendants(SessionId),
}

impl Listing {
    /// Refuses to go on once `cancel` has fired.
    fn check(self, cancel: &Cancellation) -> Result<(), SubagentError> {
        if cancel.is_cancelled() {
            Err(self.cancelled())
        } else {
            Ok(())
        }
    }

    fn cancelled(self) -> SubagentError {
        let what = match self {
            Listing::Children(parent) => format!("the delegated children of {parent}"),
            Listing::Descendants(root) => format!("the delegation tree below {root}"),
        };
        SubagentError::new(
            ErrorCode::Cancelled,
            format!("listing {what} was cancelled"),
        )
    }

    /// Runs `read` (blocking) on its own thread, returning as soon as `cancel` fires instead of
    /// waiting for a read under way (which stops at its own next check).
    async fn blocking<T: Send + 'static>(
        self,
        cancel: &Cancellation,
        read: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, SubagentError> {
        let read = tokio::task::spawn_blocking(read);
        tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(self.cancelled()),
            done = read => done.map_err(|e| {
                SubagentError::new(
                    ErrorCode::AgentFailure,
                    format!("listing subagents failed: {e}"),
                )
            }),
        }
    }
}

impl SubagentRuntime {
    /// The delegated children of `parent`, oldest first. The parent need not be live.
    ///
    /// Stops with [`ErrorCode::Cancelled`] when `cancel` has fired before the listing is done.
    pub async fn list_children(
        &self,
        parent: SessionId,
        cancel: &Cancellation,
    ) -> Result<Vec<ListingRow>, SubagentError> {
        let listing = Listing::Children(parent);
        let corpus = self.corpus(listing, cancel).await?;
        let candidates = corpus
            .children_of(parent)
            .into_iter()
            .filter(|h| h.origin == Some(Origin::Subagent))
            .map(|h| (h.id, parent, 1, h.clone()))
            .collect();
        self.resolve_rows(listing, candidates, &corpus, cancel, self.store_reader())
            .await
    }

    /// Every delegated descendant of `root`, in stable pre-order (each child before its own
    /// children, siblings oldest first), with its parent and depth. Sessions that are not
    /// delegated children (plain forks) are walked through but not listed.
    ///
    /// Stops with [`ErrorCode::Cancelled`] when `cancel` has fired before the listing is done.
    pub async fn list_descendants(
        &self,
        root: SessionId,
        cancel: &Cancellation,
    ) -> Result<Vec<ListingRow>, SubagentError> {
        self.descendants(root, cancel, self.store_reader()).await
    }

    /// [`Self::list_descendants`], reading the children that are not live through `read`.
    async fn descendants(
        &self,
        root: SessionId,
        cancel: &Cancellation,
        read: impl Reader,
    ) -> Result<Vec<ListingRow>, SubagentError> {
        let listing = Listing::Descendants(root);
        let corpus = self.corpus(listing, cancel).await?;
        let mut candidates = Vec::new();
        let mut visited = HashSet::from([root]);
        let mut stack: Vec<(SessionId, u32)> = vec![(root, 0)];
        while let Some((node, depth)) = stack.pop() {
            listing.check(cancel)?;
            let children = corpus.children_of(node);
            // Pushed in reverse so the oldest child is visited first.
            for header in children.iter().rev() {
                if visited.insert(header.id) {
                    stack.push((header.id, depth + 1));
                }
            }
            if node != root
                && let Some(header) = corpus.headers.get(&node)
                && header.origin == Some(Origin::Subagent)
                && let Some(parent) = header.parent
            {
                candidates.push((node, parent, depth, header.clone()));
            }
        }
        self.resolve_rows(listing, candidates, &corpus, cancel, read)
            .await
    }

    /// Reads a session's own events from a seq, out of the store.
    fn store_reader(&self) -> impl Reader {
        let store = self.agents().store().clone();
        move |id, from| store.read_from(id, from).map_err(|e| e.to_string())
    }

    /// Every stored header, with live agents' headers in place of stored ones.
    async fn corpus(
        &self,
        listing: Listing,
        cancel: &Cancellation,
    ) -> Result<Corpus, SubagentError> {
        listing.check(cancel)?;
        let store = self.agents().store().clone();
        let stored = listing
            .blocking(cancel, move || store.list())
            .await?
            .map_err(|reason| {
                SubagentError::new(
                    ErrorCode::AgentFailure,
                    format!("listing subagents failed: {reason}"),
                )
            })?;
        listing.check(cancel)?;
        let mut headers: HashMap<SessionId, Header> = stored
            .into_iter()
            .map(|info| (info.header.id, info.header))
            .collect();
        for agent in self.agents().list() {
            headers.insert(agent.id(), agent.header().clone());
        }
        let mut children: HashMap<SessionId, Vec<SessionId>> = HashMap::new();
        for header in headers.values() {
            if let Some(parent) = header.parent {
                children.entry(parent).or_default().push(header.id);
            }
        }
        for siblings in children.values_mut() {
            siblings.sort_by_key(|id| (headers[id].created_at_ms, *id));
        }
        Ok(Corpus { headers, children })
    }

    /// One row per candidate, in order: live children from memory, the others from the store.
    async fn resolve_rows(
        &self,
        listing: Listing,
        candidates: Vec<Candidate>,
        corpus: &Corpus,
        cancel: &Cancellation,
        read: impl Reader,
    ) -> Result<Vec<ListingRow>, SubagentError> {
        let subagent_parents: HashSet<SessionId> = corpus
            .headers
            .values()
            .filter(|h| h.origin == Some(Origin::Subagent))
            .filter_map(|h| h.parent)
            .collect();
        let mut rows = Vec::with_capacity(candidates.len());
        let mut cold = Vec::new();
        for (at, (id, parent, depth, header)) in candidates.into_iter().enumerate() {
            let has_children = subagent_parents.contains(&id);
            match self.agents().get(id) {
                Some(agent) => {
                    let descriptor =
                        agent.with_events(|e| lineage_log::fold_descriptor(e).cloned());
                    rows.push(Some(row(id, parent, depth, descriptor, true, has_children)));
                }
                None => {
                    rows.push(None);
                    cold.push((at, id, parent, depth, header, has_children));
                }
            }
        }
        let checked = cancel.clone();
        let resolved = listing
            .blocking(cancel, move || read_cold(listing, cold, &checked, read))
            .await??;
        // Whatever was read, a listing cancelled before it returns does not succeed.
        listing.check(cancel)?;
        for (at, row) in resolved {
            rows[at] = Some(row);
        }
        Ok(rows.into_iter().flatten().collect())
    }
}

/// The rows of the children that are not live, read one by one through `read` (a session's own
/// events from a seq), checking `cancel` before each read.
fn read_cold(
    listing: Listing,
    cold: Vec<Cold>,
    cancel: &Cancellation,
    mut read: impl Reader,
) -> Result<Vec<(usize, ListingRow)>, SubagentError> {
    let mut rows = Vec::with_capacity(cold.len());
    for (at, id, parent, depth, header, has_children) in cold {
        listing.check(cancel)?;
        let row = match read(id, header.seed_len) {
            Err(error) => diagnostic(id, parent, depth, DiagnosticReason::Unavailable, error),
            Ok(own) => {
                let agrees = matches!(own.first().map(|e| &e.body),
                    Some(EventBody::SessionLineage(l))
                        if Some(l.parent) == header.parent
                            && l.delegation_depth == header.delegation_depth);
                if agrees {
                    let descriptor = own.iter().find_map(|e| match &e.body {
                        EventBody::SubagentDescriptor(d) => Some((**d).clone()),
                        _ => None,
                    });
                    row(id, parent, depth, descriptor, false, has_children)
                } else {
                    diagnostic(
                        id,
                        parent,
                        depth,
                        DiagnosticReason::Corrupt,
                        "its header and its own lineage disagree".into(),
                    )
                }
            }
        };
        rows.push((at, row));
    }
    Ok(rows)
}

struct Corpus {
    headers: HashMap<SessionId, Header>,
    /// Children of each session, oldest first.
    children: HashMap<SessionId, Vec<SessionId>>,
}

impl Corpus {
    fn children_of(&self, parent: SessionId) -> Vec<&Header> {
        self.children
            .get(&parent)
            .map(|ids| ids.iter().map(|id| &self.headers[id]).collect())
            .unwrap_or_default()
    }
}

fn row(
    id: SessionId,
    parent: SessionId,
    depth: u32,
    descriptor: Option<lineage_log::SubagentDescriptor>,
    live: bool,
    has_children: bool,
) -> ListingRow {
    if let Some(d) = &descriptor
        && let Err(problem) = lineage_log::check_descriptor(d)
    {
        return diagnostic(
            id,
            parent,
            depth,
            DiagnosticReason::Corrupt,
            format!("its subagent descriptor breaks the descriptor contract: {problem}"),
        );
    }
    match descriptor {
        Some(d) => ListingRow::Child(ChildRow {
            id,
            parent,
            depth,
            mode: d.mode,
            label: d.label,
            live,
            has_children,
        }),
        None => diagnostic(
            id,
            parent,
            depth,
            DiagnosticReason::Corrupt,
            "it has no subagent descriptor".into(),
        ),
    }
}

fn diagnostic(
    id: SessionId,
    parent: SessionId,
    depth: u32,
    reason: DiagnosticReason,
    detail: String,
) -> ListingRow {
    ListingRow::Diagnostic(DiagnosticRow {
        id,
        parent,
        depth,
        reason,
        detail,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use lineage_agent::{Agents, ScriptedModel};
    use lineage_log::{AbortCause, Digest, SessionLineage, SubagentDescriptor, with_log_facts};
    use lineage_store::Store;

    use super::*;

    /// Stores a one-shot child of `parent` at `depth` and returns its id.
    fn stored_child(store: &Store, parent: SessionId, depth: u32) -> SessionId {
        let id = SessionId::new();
        let lineage = SessionLineage {
            parent,
            seed_len: 0,
            seed_digest: Digest::of_empty(),
            delegation_depth: depth,
        };
        let descriptor = SubagentDescriptor::new(DescriptorMode::OneShot, "spawn");
        let header = with_log_facts(&Header::new(id, 1), Some(&lineage), true);
        store
            .import(
                header,
                &[
                    Event::new(0, 0, lineage),
                    Event::new(1, 0, EventBody::SubagentDescriptor(Box::new(descriptor))),
                ],
            )
            .expect("the child is stored");
        id
    }

    #[tokio::test]
    async fn a_cancellation_fired_during_the_reads_of_a_tree_stops_the_listing_there() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = Store::open(dir.path().join("agents.lineage")).expect("the store opens");
        let runtime = SubagentRuntime::new(Agents::new(store.clone(), ScriptedModel::new([])));
        // Three levels under the root: two children, each with two children, each with one.
        let root = SessionId::new();
        store
            .import(Header::new(root, 0), &[])
            .expect("the root is stored");
        let mut stored = 0;
        for _ in 0..2 {
            let child = stored_child(&store, root, 1);
            for _ in 0..2 {
                let grandchild = stored_child(&store, child, 2);
                stored_child(&store, grandchild, 3);
                stored += 2;
            }
            stored += 1;
        }
        assert_eq!(stored, 10);

        // Uncancelled, every one is read and listed.
        let reads = Arc::new(AtomicUsize::new(0));
        let counting = |reads: Arc<AtomicUsize>, store: Store, fire: Option<Cancellation>| {
            move |id, from| {
                let read = reads.fetch_add(1, Ordering::SeqCst) + 1;
                let own = store.read_from(id, from).map_err(|e| e.to_string());
                // The third read is the last: the cancellation fires while it is under way.
                if read == 3
                    && let Some(cancel) = &fire
                {
                    cancel.cancel(AbortCause::User);
                }
                own
            }
        };
        let rows = runtime
            .descendants(
                root,
                &Cancellation::new(),
                counting(reads.clone(), store.clone(), None),
            )
            .await
            .unwrap();
        assert_eq!(rows.len(), stored);
        assert!(
            rows.iter().all(|r| matches!(r, ListingRow::Child(_))),
            "{rows:?}"
        );
        assert_eq!(reads.load(Ordering::SeqCst), stored);

        // Cancelled during the third read: the listing is cancelled and reads nothing after it.
        let cancel = Cancellation::new();
        let reads = Arc::new(AtomicUsize::new(0));
        let listed = runtime
            .descendants(
                root,
                &cancel,
                counting(reads.clone(), store.clone(), Some(cancel.clone())),
            )
            .await;
        let error = listed.expect_err("a listing cancelled during its reads does not succeed");
        assert_eq!(error.code(), ErrorCode::Cancelled, "{error}");
        assert!(error.to_string().contains(&root.to_string()), "{error}");
        assert_eq!(reads.load(Ordering::SeqCst), 3);

        // Cancelled while a read is held up: the listing does not wait for that read to return.
        let cancel = Cancellation::new();
        let (release, held) = std::sync::mpsc::channel::<()>();
        let fire = cancel.clone();
        let listing = runtime.descendants(root, &cancel, move |id, from| {
            fire.cancel(AbortCause::User);
            let _ = held.recv();
            store.read_from(id, from).map_err(|e| e.to_string())
        });
        // Only a listing that waits for the held read runs into this bound.
        let bound = std::time::Duration::from_secs(10);
        let Ok(listed) = tokio::time::timeout(bound, listing).await else {
            let _ = release.send(());
            panic!("the listing waited for a read its cancellation had overtaken");
        };
        let error = listed.expect_err("a listing cancelled during a read does not succeed");
        assert_eq!(error.code(), ErrorCode::Cancelled, "{error}");
        release.send(()).expect("the held read is released");
    }
}
