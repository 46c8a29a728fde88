//! Helpers shared by this crate's test suites.

use lineage_agent::{CreateAgent, Seed};
use lineage_log::SessionId;
use lineage_testkit::agent::fresh_with_id;

/// The creation of agent `id` (see [`fresh_with_id`]) whose log starts as a copy of all of
/// `parent`'s, at delegation depth `depth`.
pub fn fork_of(id: SessionId, parent: SessionId, depth: u32) -> CreateAgent {
    let mut create = fresh_with_id(id);
    create.seed = Seed::Fork {
        parent,
        boundary: None,
        delegation_depth: depth,
    };
    create
}
