//! A real Redis Cluster on loopback: `redis-server --cluster-enabled yes` nodes joined by
//! `redis-cli --cluster create`, for the tests of respway's Redis Cluster upstream.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{free_port, Proc};
use crate::resp::{raw_command, RespConn};
use crate::servers::redis_with;

/// Cluster nodes: `primaries` primaries with `replicas` replicas each (in `redis-cli`'s order:
/// the first `primaries` nodes are the primaries). Every node is stopped on drop.
pub struct RedisCluster {
    pub nodes: Vec<Proc>,
    pub primaries: usize,
}

/// The node arguments: cluster mode, a node timeout of 2 s (failovers in a few seconds), no
/// full coverage required (a slot whose node is down fails alone).
pub const NODE_ARGS: &[&str] = &[
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "2000",
    "--cluster-require-full-coverage",
    "no",
];

/// One cluster node, its bus port (`--cluster-port`) chosen like its port, below the
/// kernel's ephemeral range: by default the bus is the port + 10000, which lands in that
/// range, where any outgoing connection of the machine can hold it (the node then exits and
/// the start fails after its attempts: seen in full test runs as "could not start
/// redis-server").
fn node() -> Proc {
    let bus = free_port().to_string();
    let mut args = NODE_ARGS.to_vec();
    args.extend(["--cluster-port", &bus]);
    redis_with(&args)
}

impl RedisCluster {
    /// Starts the nodes, creates the cluster, and waits (30 s at most) until every node says
    /// `cluster_state:ok` and every replica is linked to its primary.
    pub fn start(primaries: usize, replicas: usize) -> RedisCluster {
        let n = primaries * (1 + replicas);
        let nodes: Vec<Proc> = (0..n).map(|_| node()).collect();
        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(nodes.iter().map(|p| p.addr.to_string()));
        args.extend([
            "--cluster-replicas".into(),
            replicas.to_string(),
            "--cluster-yes".into(),
        ]);
        let out = Command::new("redis-cli")
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli must be installed (apt-get install redis-tools)");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let c = RedisCluster { nodes, primaries };
        c.wait_ok(Duration::from_secs(30));
        c
    }

    /// Starts one more node and joins it to the cluster as a primary without slots
    /// (`redis-cli --cluster add-node`); its address.
    pub fn add_node(&mut self) -> SocketAddr {
        let p = node();
        let addr = p.addr;
        self.nodes.push(p);
        let out = Command::new("redis-cli")
            .args([
                "--cluster",
                "add-node",
                &addr.to_string(),
                &self.nodes[0].addr.to_string(),
            ])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli");
        assert!(
            out.status.success(),
            "redis-cli --cluster add-node failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        self.wait_ok(Duration::from_secs(30));
        // Gossip introduces the new node to the others one by one: until each knows it, a
        // slot move to it fails there with `ERR Unknown node`.
        let id = raw_command(addr, &["CLUSTER", "MYID"]).expect("CLUSTER MYID");
        // A bulk string: `$40`, then the id.
        let id = id.lines().nth(1).unwrap_or_default().trim().to_string();
        assert_eq!(id.len(), 40, "CLUSTER MYID of {addr}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.nodes.iter().all(|p| {
            raw_command(p.addr, &["CLUSTER", "NODES"]).is_ok_and(|t| t.contains(id.as_str()))
        }) {
            assert!(
                Instant::now() < deadline,
                "not every node knows the new node {addr} after 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // Knowing its id is not yet agreeing on the slots: until the new node has learned
        // every primary's slots, `redis-cli --cluster reshard` refuses with "Nodes don't
        // agree about configuration!" (it happened in a test). Wait for its own check.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = Command::new("redis-cli")
                .args(["--cluster", "check", &self.nodes[0].addr.to_string()])
                .stdin(Stdio::null())
                .output()
                .expect("redis-cli");
            let text = String::from_utf8_lossy(&out.stdout);
            if out.status.success() && !text.contains("[ERR]") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the nodes do not agree on the configuration 30 s after {addr} joined: {text}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        addr
    }

    /// Every node's address.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(|p| p.addr).collect()
    }

    /// Waits until every running node says `cluster_state:ok` and each node's replicas are
    /// linked; panics after `max`.
    pub fn wait_ok(&self, max: Duration) {
        let deadline = Instant::now() + max;
        loop {
            let ok = self.nodes.iter().all(|p| {
                raw_command(p.addr, &["CLUSTER", "INFO"])
                    .is_ok_and(|t| t.contains("cluster_state:ok"))
                    && raw_command(p.addr, &["INFO", "replication"]).is_ok_and(|t| {
                        t.contains("role:master") || t.contains("master_link_status:up")
                    })
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the Redis Cluster did not come up within {max:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The address of the node serving `slot` as its primary, as `node` says it.
    pub fn owner(node: SocketAddr, slot: u16) -> Option<SocketAddr> {
        let text = RespConn::connect(node).call(&["CLUSTER", "SLOTS"]);
        if let crate::resp::Resp::Array(Some(ranges)) = text {
            for r in ranges {
                if let crate::resp::Resp::Array(Some(parts)) = r {
                    let (Some(crate::resp::Resp::Int(a)), Some(crate::resp::Resp::Int(b))) =
                        (parts.first(), parts.get(1))
                    else {
                        continue;
                    };
                    if (*a..=*b).contains(&i64::from(slot)) {
                        if let Some(crate::resp::Resp::Array(Some(p))) = parts.get(2) {
                            if let (
                                Some(crate::resp::Resp::Bulk(Some(ip))),
                                Some(crate::resp::Resp::Int(port)),
                            ) = (p.first(), p.get(1))
                            {
                                let ip = String::from_utf8_lossy(ip);
                                return format!("{ip}:{port}").parse().ok();
                            }
                        }
                    }
                }
            }
        }
        None
    }
}
