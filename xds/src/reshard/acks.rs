//! The gate between phases: every sidecar the server knows holds an applied generation.

use std::time::{Duration, Instant};

use crate::admin::{self, AdminAuth};
use crate::server::{NodeStatus, ServerStatus};
use crate::LISTENER_TYPE_URL;

/// One node's state for a generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeAck {
    /// It holds the generation: its listeners as of then are ACKed.
    Acked,
    /// Not yet, and why.
    Pending(String),
    /// It refused the listeners sent for that generation, with its message.
    Nacked(String),
}

/// Where node `n` is with generation `generation` (its listener type: the routes live there).
pub fn node_ack(n: &NodeStatus, generation: u64) -> NodeAck {
    if !n.connected {
        return NodeAck::Pending("not connected".to_string());
    }
    let lds = n.types.get(LISTENER_TYPE_URL).cloned().unwrap_or_default();
    if n.generation < generation {
        return NodeAck::Pending(format!(
            "has caught up with generation {} only",
            n.generation
        ));
    }
    if let Some(nack) = &lds.nack {
        if nack.version.is_some() && nack.version == lds.sent {
            return NodeAck::Nacked(nack.message.clone());
        }
    }
    match (&lds.sent, &lds.acked) {
        (None, _) => NodeAck::Pending("no listener sent yet".to_string()),
        (Some(s), Some(a)) if s == a => NodeAck::Acked,
        (Some(s), a) => NodeAck::Pending(format!(
            "listeners {s} sent, {} ACKed",
            a.as_deref().unwrap_or("none")
        )),
    }
}

/// Every node's state for `generation`, by id; nodes in `ignore` and connected nodes the
/// server serves nothing are left out.
pub fn acks(s: &ServerStatus, generation: u64, ignore: &[String]) -> Vec<(String, NodeAck)> {
    s.nodes
        .iter()
        .filter(|n| !ignore.contains(&n.id))
        .filter(|n| !(n.connected && n.unserved.is_some()))
        .map(|n| (n.id.clone(), node_ack(n, generation)))
        .collect()
}

/// Why a wait ended before every node ACKed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitError {
    /// A node NACKed: `(node, message)`.
    Nacked(String, String),
    /// The timeout passed; the nodes that had not ACKed, with why.
    Timeout(Vec<(String, String)>),
    /// The admin endpoint failed.
    Admin(String),
}

impl std::fmt::Display for WaitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WaitError::Nacked(node, msg) => write!(
                f,
                "sidecar {node} NACKed the configuration (it keeps its previous one): {msg}"
            ),
            WaitError::Timeout(nodes) => {
                write!(f, "not every sidecar ACKed in time; waiting for:")?;
                for (id, why) in nodes {
                    write!(f, "\n  {id}: {why}")?;
                }
                write!(
                    f,
                    "\n(a node that is gone for good can be left out with --ignore-node ID)"
                )
            }
            WaitError::Admin(e) => write!(f, "{e}"),
        }
    }
}

/// Polls `GET /status` until every node holds `generation`; returns how many did.
///
/// # Errors
/// A NACK (at once), the timeout, or the admin endpoint failing for the whole timeout.
pub async fn wait(
    addr: &str,
    auth: &AdminAuth,
    generation: u64,
    timeout: Duration,
    ignore: &[String],
) -> Result<usize, WaitError> {
    let deadline = Instant::now() + timeout;
    loop {
        let last = match admin::fetch_status(addr, auth).await {
            Ok(s) => {
                let all = acks(&s, generation, ignore);
                if let Some((id, NodeAck::Nacked(m))) =
                    all.iter().find(|(_, a)| matches!(a, NodeAck::Nacked(_)))
                {
                    return Err(WaitError::Nacked(id.clone(), m.clone()));
                }
                let pending: Vec<(String, String)> = all
                    .iter()
                    .filter_map(|(id, a)| match a {
                        NodeAck::Pending(why) => Some((id.clone(), why.clone())),
                        _ => None,
                    })
                    .collect();
                if pending.is_empty() {
                    return Ok(all.len());
                }
                WaitError::Timeout(pending)
            }
            Err(e) => WaitError::Admin(e.to_string()),
        };
        if Instant::now() >= deadline {
            return Err(last);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::server::{Nack, TypeStatus};

    fn node(id: &str, connected: bool, generation: u64, lds: TypeStatus) -> NodeStatus {
        NodeStatus {
            id: id.into(),
            zone: None,
            connected,
            unserved: None,
            generation,
            types: BTreeMap::from([(LISTENER_TYPE_URL.to_string(), lds)]),
            admin: None,
            replica: None,
        }
    }

    fn lds(sent: &str, acked: &str) -> TypeStatus {
        TypeStatus {
            sent: Some(sent.into()),
            acked: Some(acked.into()),
            nack: None,
        }
    }

    #[test]
    fn a_node_holds_a_generation_once_caught_up_and_acked() {
        assert_eq!(
            node_ack(&node("a", true, 5, lds("x", "x")), 5),
            NodeAck::Acked
        );
        assert_eq!(
            node_ack(&node("a", true, 6, lds("x", "x")), 5),
            NodeAck::Acked
        );
        assert_eq!(
            node_ack(&node("a", true, 4, lds("x", "x")), 5),
            NodeAck::Pending("has caught up with generation 4 only".into())
        );
        assert_eq!(
            node_ack(&node("a", true, 5, lds("y", "x")), 5),
            NodeAck::Pending("listeners y sent, x ACKed".into())
        );
        assert_eq!(
            node_ack(&node("a", false, 5, lds("x", "x")), 5),
            NodeAck::Pending("not connected".into())
        );
    }

    #[test]
    fn a_nack_of_the_version_sent_stops_an_older_one_does_not() {
        let mut t = lds("y", "x");
        t.nack = Some(Nack {
            version: Some("y".into()),
            nonce: "1-3".into(),
            message: "listener \"main\": no".into(),
        });
        assert_eq!(
            node_ack(&node("a", true, 5, t.clone()), 5),
            NodeAck::Nacked("listener \"main\": no".into())
        );
        t.nack.as_mut().unwrap().version = Some("w".into());
        assert!(matches!(
            node_ack(&node("a", true, 5, t), 5),
            NodeAck::Pending(_)
        ));
    }

    #[test]
    fn ignored_and_unserved_nodes_are_not_waited_for() {
        let mut unserved = node("u", true, 1, TypeStatus::default());
        unserved.unserved = Some("no listener".into());
        let s = ServerStatus {
            version: 5,
            files: vec![],
            errors: vec![],
            unserved: vec![],
            nodes: vec![
                node("a", true, 5, lds("x", "x")),
                node("gone", false, 1, lds("x", "x")),
                unserved,
            ],
            refusals: vec![],
            admin: Default::default(),
            ads_accept_errors: 0,
            store: None,
        };
        assert_eq!(acks(&s, 5, &["gone".to_string()]).len(), 1);
        assert_eq!(acks(&s, 5, &[]).len(), 2);
    }
}
