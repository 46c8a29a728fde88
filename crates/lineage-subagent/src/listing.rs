//! Listing a parent's delegated children and a root's whole delegation tree, straight from the
//! store's headers and the live registry: no agent is loaded or resumed, and no provider is
//! asked, so children of removed providers list too.

use std::collections::{HashMap, HashSet};

use lineage_log::{DescriptorMode, EventBody, Header, Origin, SessionId, Text};

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
    /// Its log does not say what it is (no descriptor, or one that disagrees with its header).
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

impl SubagentRuntime {
    /// The delegated children of `parent`, oldest first. The parent need not be live.
    pub async fn list_children(&self, parent: SessionId) -> Result<Vec<ListingRow>, SubagentError> {
        let corpus = self.corpus().await?;
        let candidates = corpus
            .children_of(parent)
            .into_iter()
            .filter(|h| h.origin == Some(Origin::Subagent))
            .map(|h| (h.id, parent, 1, h.clone()))
            .collect();
        self.resolve_rows(candidates, &corpus).await
    }

    /// Every delegated descendant of `root`, in stable pre-order (each child before its own
    /// children, siblings oldest first), with its parent and depth. Sessions that are not
    /// delegated children (plain forks) are walked through but not listed.
    pub async fn list_descendants(
        &self,
        root: SessionId,
    ) -> Result<Vec<ListingRow>, SubagentError> {
        let corpus = self.corpus().await?;
        let mut candidates = Vec::new();
        let mut visited = HashSet::from([root]);
        let mut stack: Vec<(SessionId, u32)> = vec![(root, 0)];
        while let Some((node, depth)) = stack.pop() {
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
        self.resolve_rows(candidates, &corpus).await
    }

    /// Every stored header, with live agents' headers in place of stored ones.
    async fn corpus(&self) -> Result<Corpus, SubagentError> {
        let store = self.agents().store().clone();
        let stored = tokio::task::spawn_blocking(move || store.list())
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|reason| {
                SubagentError::new(
                    ErrorCode::AgentFailure,
                    format!("listing subagents failed: {reason}"),
                )
            })?;
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
        candidates: Vec<Candidate>,
        corpus: &Corpus,
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
        let store = self.agents().store().clone();
        let resolved = tokio::task::spawn_blocking(move || {
            cold.into_iter()
                .map(|(at, id, parent, depth, header, has_children)| {
                    let row = match store.read_from(id, header.seed_len) {
                        Err(error) => diagnostic(
                            id,
                            parent,
                            depth,
                            DiagnosticReason::Unavailable,
                            error.to_string(),
                        ),
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
                    (at, row)
                })
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|e| {
            SubagentError::new(
                ErrorCode::AgentFailure,
                format!("listing subagents failed: {e}"),
            )
        })?;
        for (at, row) in resolved {
            rows[at] = Some(row);
        }
        Ok(rows.into_iter().flatten().collect())
    }
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
