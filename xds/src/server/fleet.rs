//! The fleet of a shared store: the nodes connected to the other replicas, as [`Server::status`]
//! shows them next to this replica's own.

use super::*;

/// What a shared store tells a replica about the others (see `crate::store`).
pub trait Fleet: Send + Sync {
    /// This replica's name in the store.
    fn replica(&self) -> &str;
    /// The nodes connected to the other replicas, each with its `replica` set; empty while
    /// the store is lost.
    fn others(&self) -> Vec<NodeStatus>;
}

/// The fleet slot of a [`Server`] (set once, after the server is built).
#[derive(Default)]
pub(super) struct FleetSlot(pub(super) std::sync::OnceLock<Arc<dyn Fleet>>);

impl std::fmt::Debug for FleetSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("FleetSlot")
            .field(&self.0.get().map(|f| f.replica().to_string()))
            .finish()
    }
}

/// This replica's nodes (`own`, each marked with `replica`) merged with the other replicas'
/// (`others`), by id: a node connected here keeps its row; otherwise another replica's row of
/// it replaces it (of two, the one of the later generation: a dead replica's row lingers until
/// its lease ends).
pub(super) fn merge(
    own: Vec<NodeStatus>,
    replica: &str,
    others: Vec<NodeStatus>,
) -> Vec<NodeStatus> {
    let mut by_id: BTreeMap<String, NodeStatus> = own
        .into_iter()
        .map(|mut n| {
            n.replica = Some(replica.to_string());
            (n.id.clone(), n)
        })
        .collect();
    for n in others {
        match by_id.get(&n.id) {
            Some(had) if had.connected && had.replica.as_deref() == Some(replica) => {}
            Some(had) if had.connected && had.generation >= n.generation => {}
            _ => {
                by_id.insert(n.id.clone(), n);
            }
        }
    }
    by_id.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, connected: bool, replica: Option<&str>) -> NodeStatus {
        NodeStatus {
            id: id.to_string(),
            zone: None,
            connected,
            unserved: None,
            generation: 0,
            types: BTreeMap::new(),
            admin: None,
            replica: replica.map(str::to_string),
        }
    }

    #[test]
    fn a_node_connected_here_keeps_its_row_and_others_fill_in() {
        let own = vec![node("a", true, None), node("b", false, None)];
        let others = vec![
            node("a", true, Some("r2")),
            node("b", true, Some("r2")),
            node("c", true, Some("r3")),
        ];
        let merged = merge(own, "r1", others);
        let rows: Vec<(&str, bool, Option<&str>)> = merged
            .iter()
            .map(|n| (n.id.as_str(), n.connected, n.replica.as_deref()))
            .collect();
        assert_eq!(
            rows,
            [
                ("a", true, Some("r1")),
                ("b", true, Some("r2")),
                ("c", true, Some("r3"))
            ]
        );
    }
}
