//! `lineage tree`: sessions under their parents.
//!
//! The tree follows each session's header (`parent`); with a ROOT it starts from the children
//! index (`Store::descendants`). A child's mode and label come from the `subagent/descriptor` of
//! its own suffix; a child without one is a plain fork.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;

use lineage_log::{EventBody, SessionId, SubagentDescriptor};
use lineage_store::SessionInfo;
use serde_json::{Value, json};

use super::{id_json, unreadable_sessions, write_json};
use crate::cli::TreeArgs;
use crate::error::CliError;
use crate::open::{Opened, open};
use crate::render::{Table, mode_label};
use crate::time::iso_seconds_u64;

/// One session of the tree and what the tree shows of it.
struct Node {
    info: SessionInfo,
    descriptor: Option<SubagentDescriptor>,
}

impl Node {
    /// `root` for a top-level session, the descriptor's mode for a delegated child, `fork` for a
    /// child without a descriptor.
    fn mode(&self) -> &'static str {
        match (&self.descriptor, self.info.header.parent) {
            (Some(d), _) => mode_label(d.mode),
            (None, Some(_)) => "fork",
            (None, None) => "root",
        }
    }
}

/// Prints the tree of every root session, or of ROOT.
pub fn run(args: &TreeArgs, out: &mut dyn Write) -> Result<u8, CliError> {
    let opened = open(&args.store)?;
    let mut unreadable = Vec::new();
    let (infos, roots) = match &args.root {
        Some(root) => {
            let root = opened.resolve(root)?;
            let id = root.header.id;
            let mut infos = vec![root];
            for child in opened.store.descendants(id).map_err(|e| opened.fail(e))? {
                infos.push(opened.store.info(child).map_err(|e| opened.fail(e))?);
            }
            (infos, vec![id])
        }
        None => {
            let (infos, damaged) = opened.list_readable()?;
            unreadable = damaged;
            let stored: HashSet<SessionId> = infos.iter().map(|i| i.header.id).collect();
            // Roots: top-level sessions, and children whose parent is not in this store.
            let roots = infos
                .iter()
                .filter(|i| i.header.parent.is_none_or(|p| !stored.contains(&p)))
                .map(|i| i.header.id)
                .collect();
            (infos, roots)
        }
    };

    let mut children: BTreeMap<SessionId, Vec<SessionId>> = BTreeMap::new();
    let mut nodes: BTreeMap<SessionId, Node> = BTreeMap::new();
    for info in infos {
        let id = info.header.id;
        if let Some(parent) = info.header.parent {
            children.entry(parent).or_default().push(id);
        }
        let descriptor = descriptor_of(&opened, &info)?;
        nodes.insert(id, Node { info, descriptor });
    }
    for list in children.values_mut() {
        list.sort();
    }

    let tree = Tree {
        nodes: &nodes,
        children: &children,
    };
    if args.output.json {
        let mut visited = HashSet::new();
        let items: Vec<Value> = roots
            .iter()
            .filter_map(|id| tree.json(*id, &mut visited))
            .collect();
        write_json(out, &Value::Array(items))?;
    } else {
        let mut table = Table::new(
            &[
                "SESSION", "MODE", "LABEL", "PROVIDER", "DEPTH", "EVENTS", "CREATED",
            ],
            &["DEPTH", "EVENTS"],
        );
        let mut visited = HashSet::new();
        for id in &roots {
            tree.rows(*id, "", "", &mut table, &mut visited);
        }
        table.write(out)?;
    }
    unreadable_sessions(unreadable)
}

/// The descriptor of a child's own suffix: the first `subagent/descriptor` at or after its seed
/// length, read up to it. Top-level sessions are not read.
fn descriptor_of(
    opened: &Opened,
    info: &SessionInfo,
) -> Result<Option<SubagentDescriptor>, CliError> {
    let header = &info.header;
    if header.parent.is_none() && header.origin.is_none() {
        return Ok(None);
    }
    let own = opened
        .store
        .scan_unchecked(header.id, header.seed_len)
        .map_err(|e| opened.fail(e))?;
    for event in own {
        if let EventBody::SubagentDescriptor(d) = event.map_err(|e| opened.fail(e))?.body {
            return Ok(Some(*d));
        }
    }
    Ok(None)
}

/// The sessions and their parent links.
struct Tree<'a> {
    nodes: &'a BTreeMap<SessionId, Node>,
    children: &'a BTreeMap<SessionId, Vec<SessionId>>,
}

impl Tree<'_> {
    /// The children of `id` that are in the tree.
    fn kids(&self, id: SessionId) -> Vec<SessionId> {
        self.children
            .get(&id)
            .map(|list| {
                list.iter()
                    .copied()
                    .filter(|c| self.nodes.contains_key(c))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Adds `id` and its descendants to `table`, drawn with `lead` before the node and `indent`
    /// before its children's lines. A session already drawn (a damaged store can link in a
    /// cycle) is not drawn again.
    fn rows(
        &self,
        id: SessionId,
        lead: &str,
        indent: &str,
        table: &mut Table,
        visited: &mut HashSet<SessionId>,
    ) {
        let Some(node) = self.nodes.get(&id) else {
            return;
        };
        if !visited.insert(id) {
            return;
        }
        let h = &node.info.header;
        let mut name = format!("{lead}{id}");
        if let Some(parent) = h.parent
            && !self.nodes.contains_key(&parent)
        {
            name.push_str(&format!(" (parent {parent} not in the store)"));
        }
        let d = node.descriptor.as_ref();
        table.row(vec![
            name,
            node.mode().to_owned(),
            d.and_then(|d| d.label.as_deref()).unwrap_or("-").to_owned(),
            d.map_or("-".to_owned(), |d| d.provider.to_string()),
            h.delegation_depth.to_string(),
            node.info.len.to_string(),
            iso_seconds_u64(h.created_at_ms),
        ]);
        let kids = self.kids(id);
        for (i, kid) in kids.iter().enumerate() {
            let last = i + 1 == kids.len();
            let (branch, next) = if last {
                ("└─ ", "   ")
            } else {
                ("├─ ", "│  ")
            };
            self.rows(
                *kid,
                &format!("{indent}{branch}"),
                &format!("{indent}{next}"),
                table,
                visited,
            );
        }
    }

    /// `id` and its descendants as nested JSON objects.
    fn json(&self, id: SessionId, visited: &mut HashSet<SessionId>) -> Option<Value> {
        let node = self.nodes.get(&id)?;
        if !visited.insert(id) {
            return None;
        }
        let h = &node.info.header;
        let d = node.descriptor.as_ref();
        let children: Vec<Value> = self
            .kids(id)
            .into_iter()
            .filter_map(|kid| self.json(kid, visited))
            .collect();
        Some(json!({
            "id": id.to_string(),
            "parent": id_json(h.parent),
            "mode": node.mode(),
            "label": d.and_then(|d| d.label.as_deref()),
            "provider": d.map(|d| d.provider.as_str()),
            "endpoint": d.and_then(|d| d.endpoint.as_deref()),
            "model": d.and_then(|d| d.model.as_deref()),
            "delegation_depth": h.delegation_depth,
            "seed_len": h.seed_len,
            "events": node.info.len,
            "created_at_ms": h.created_at_ms,
            "children": children,
        }))
    }
}
