//! Cluster emulation (a listener's `cluster_emulation`): the listener answers as a Redis
//! Cluster whose every slot it owns, so cluster-aware clients (redis-py `RedisCluster`,
//! ioredis `Cluster`, go-redis `ClusterClient`, JedisCluster) connect through the sidecar
//! unchanged. respway still routes every key itself: a client's slot map only decides which
//! announced sidecar it sends a command to, and no `MOVED` or `ASK` is ever answered.
//!
//! The nodes are the announced addresses that are **live**, the 16384 slots split evenly over
//! them in the order announced (as `redis-cli --cluster create` splits them), or one node, the
//! local address of the client's connection, owning them all. An announced sidecar is live
//! unless its checks took it out (`discovery::peers`: three failed `PING`s in a row, back after
//! two answered); the node of the connection's own address is always live (a sidecar answering
//! is alive). Every sidecar that sees the same live set gives the same map; when none is live
//! (a connection to an address not announced, every announced one out) every announced node
//! is in it. Every node is a primary without replicas; its id is 40 hex digits derived from its
//! address alone, and its config epoch its position in the announce list plus one, so a node
//! keeps both whoever else is out. Replies are in the client's protocol, shaped as Redis 7's.
//!
//! Answered: `CLUSTER SLOTS`, `SHARDS`, `NODES`, `INFO`, `KEYSLOT`, `MYID`, `MYSHARDID`,
//! `REPLICAS`/`SLAVES` (none), `LINKS` (none: no cluster bus), `HELP`, and `ASKING` (`+OK`).
//! Refused by name: `COUNTKEYSINSLOT` / `GETKEYSINSLOT` (the shards keep no slots) and the
//! subcommands that change a cluster.
//!
//! The same map says which keys a node's keyspace-wide commands cover: [`owned_slots`] is the
//! range of the connection's node when it owns some slots but not all, which `keyspace.rs`
//! filters `SCAN`, `KEYS`, `DBSIZE` and `RANDOMKEY` by, so that a client walking the cluster
//! node by node (redis-py `scan_iter`, `redis-cli --cluster info`) sees each key once.

use std::net::SocketAddr;

use bytes::Bytes;
use respway_filters::command::CommandInfo;
use respway_filters::hash::slots::{even_split, redis_cluster_slot, REDIS_CLUSTER_SLOTS};
use respway_filters::model::{HashTag, Listener};
use respway_filters::request::{error_reply, Reply};
use respway_filters::resp::Frame;

use crate::discovery::peers::Announced;

/// One node of the emulated cluster.
struct Node {
    addr: SocketAddr,
    /// First and last slot it owns.
    slots: (u32, u32),
    /// Its config epoch: its position in the announce list plus one (as a cluster created
    /// in that order), whichever nodes are out.
    epoch: usize,
}

impl Node {
    /// Its node id: 40 hex digits of a SHA-256 of its address.
    fn id(&self) -> String {
        hex_id("node", self.addr)
    }

    /// Its shard's id (each node is a shard of its own).
    fn shard_id(&self) -> String {
        hex_id("shard", self.addr)
    }
}

fn hex_id(kind: &str, addr: SocketAddr) -> String {
    let d = respway_filters::acl::sha256(format!("respway cluster {kind} {addr}").as_bytes());
    respway_filters::acl::digest_to_hex(&d)[..40].to_string()
}

/// The emulated cluster as one connection sees it.
struct View {
    nodes: Vec<Node>,
    /// The node that is this sidecar for this connection: the one at its local address.
    myself: Option<usize>,
    /// The connection's local address (the node of `MYID` when no announced one is it).
    local: SocketAddr,
    /// TLS listener: SHARDS shows `tls-port`.
    tls: bool,
    /// The highest config epoch: the number of nodes announced.
    current_epoch: usize,
}

impl View {
    /// The map for a connection whose local address is `local`; `announced`: the listener's
    /// announced sidecars with their checks (`None`: every announced one is live).
    fn new(listener: &Listener, announced: Option<&Announced>, local: Option<SocketAddr>) -> View {
        let local = local.unwrap_or(listener.address);
        let announce: &[SocketAddr] = listener
            .cluster_emulation
            .as_ref()
            .map_or(&[], |e| e.announce.as_slice());
        // Out: a sidecar its checks took out, but never the one this connection reached.
        let out = |i: usize, addr: SocketAddr| {
            addr != local
                && announced
                    .and_then(|a| a.nodes.get(i))
                    .is_some_and(|(a, check)| *a == addr && !check.is_up())
        };
        let mut live: Vec<(usize, SocketAddr)> = announce
            .iter()
            .enumerate()
            .filter(|&(i, &a)| !out(i, a))
            .map(|(i, &a)| (i, a))
            .collect();
        if live.is_empty() {
            live = announce.iter().copied().enumerate().collect();
        }
        if live.is_empty() {
            live.push((0, local));
        }
        let nodes: Vec<Node> = even_split(REDIS_CLUSTER_SLOTS, live.len())
            .into_iter()
            .zip(live)
            .map(|(slots, (i, addr))| Node {
                addr,
                slots,
                epoch: i + 1,
            })
            .collect();
        let myself = nodes.iter().position(|n| n.addr == local);
        View {
            nodes,
            myself,
            local,
            tls: listener.tls.is_some(),
            current_epoch: announce.len().max(1),
        }
    }

    /// `MYID`: this sidecar's node.
    fn my_id(&self) -> String {
        match self.myself {
            Some(i) => self.nodes[i].id(),
            None => hex_id("node", self.local),
        }
    }
}

fn bulk(s: impl Into<String>) -> Frame {
    Frame::Bulk(Bytes::from(s.into()))
}

fn int(n: impl TryInto<i64>) -> Frame {
    Frame::Integer(n.try_into().unwrap_or(i64::MAX))
}

/// The slots the node of a connection whose local address is `local` owns in the map, when
/// it owns some but not all: the keys its `SCAN`, `KEYS`, `DBSIZE` and `RANDOMKEY` cover.
/// `None` (every key) without emulation, with one node, on a connection to an address not
/// announced, or when every other node is out. Allocates only on a listener that announces
/// two sidecars or more.
pub(crate) fn owned_slots(
    listener: &Listener,
    announced: Option<&Announced>,
    local: Option<SocketAddr>,
) -> Option<(u32, u32)> {
    let e = listener.cluster_emulation.as_ref()?;
    if e.announce.len() < 2 {
        return None;
    }
    let view = View::new(listener, announced, local);
    let slots = view.nodes[view.myself?].slots;
    (slots != (0, REDIS_CLUSTER_SLOTS - 1)).then_some(slots)
}

/// Answers `CLUSTER ...` or `ASKING` (`cmd` as resolved, `args` as sent) on a listener with
/// cluster emulation; `announced`: its announced sidecars with their checks; `local`: the
/// local address of the client's connection.
pub(crate) fn answer(
    cmd: &CommandInfo,
    args: &[Bytes],
    listener: &Listener,
    announced: Option<&Announced>,
    local: Option<SocketAddr>,
    resp3: bool,
) -> Reply {
    if cmd.name == "asking" {
        return Frame::ok().to_bytes();
    }
    let sub = args
        .get(1)
        .map(|a| String::from_utf8_lossy(a).to_ascii_lowercase())
        .unwrap_or_default();
    let view = View::new(listener, announced, local);
    let frame = match sub.as_str() {
        "slots" => slots(&view, resp3),
        "shards" => shards(&view, resp3),
        "nodes" => Frame::text(resp3, nodes(&view).as_bytes()),
        "info" => Frame::text(resp3, info(&view).as_bytes()),
        "myid" => bulk(view.my_id()),
        "myshardid" if args.len() == 2 => bulk(match view.myself {
            Some(i) => view.nodes[i].shard_id(),
            None => hex_id("shard", view.local),
        }),
        "myshardid" => {
            return error_reply("ERR wrong number of arguments for 'cluster|myshardid' command")
        }
        "keyslot" => int(redis_cluster_slot(&args[2], Some(HashTag::default()))),
        "replicas" | "slaves" => {
            let id = String::from_utf8_lossy(&args[2]);
            if !view.nodes.iter().any(|n| n.id() == id) {
                return error_reply(&format!("ERR Unknown node {id}"));
            }
            Frame::Array(Vec::new())
        }
        "links" => Frame::Array(Vec::new()),
        "help" => help(),
        "countkeysinslot" | "getkeysinslot" => {
            return error_reply(&format!(
                "ERR respway: CLUSTER {} is not supported: respway emulates the cluster (its \
                 shards keep no slots; respway routes every key itself)",
                sub.to_ascii_uppercase()
            ))
        }
        // Not a subcommand of the command table: Redis's own answer.
        _ if cmd.name == "cluster" => {
            return error_reply(&format!(
                "ERR unknown subcommand '{}'. Try CLUSTER HELP.",
                String::from_utf8_lossy(&args[1][..args[1].len().min(128)])
            ))
        }
        _ => {
            return error_reply(&format!(
                "ERR respway: CLUSTER {} is not supported: respway emulates the cluster (it \
                 answers CLUSTER SLOTS, SHARDS, NODES, INFO, KEYSLOT, MYID, MYSHARDID, \
                 REPLICAS, LINKS and HELP)",
                sub.to_ascii_uppercase()
            ))
        }
    };
    frame.to_bytes()
}

/// `CLUSTER SLOTS`: per node, its range and `[ip, port, id, {}]` (no replicas).
fn slots(v: &View, resp3: bool) -> Frame {
    Frame::Array(
        v.nodes
            .iter()
            .map(|n| {
                Frame::Array(vec![
                    int(n.slots.0),
                    int(n.slots.1),
                    Frame::Array(vec![
                        bulk(n.addr.ip().to_string()),
                        int(n.addr.port()),
                        bulk(n.id()),
                        Frame::map(resp3, Vec::new()),
                    ]),
                ])
            })
            .collect(),
    )
}

/// `CLUSTER SHARDS`: per node, a shard of its range and itself, a healthy primary.
fn shards(v: &View, resp3: bool) -> Frame {
    let port = if v.tls { "tls-port" } else { "port" };
    Frame::Array(
        v.nodes
            .iter()
            .map(|n| {
                let ip = n.addr.ip().to_string();
                let node = Frame::map(
                    resp3,
                    vec![
                        (bulk("id"), bulk(n.id())),
                        (bulk(port), int(n.addr.port())),
                        (bulk("ip"), bulk(ip.clone())),
                        (bulk("endpoint"), bulk(ip)),
                        (bulk("role"), bulk("master")),
                        (bulk("replication-offset"), int(0)),
                        (bulk("health"), bulk("online")),
                    ],
                );
                Frame::map(
                    resp3,
                    vec![
                        (
                            bulk("slots"),
                            Frame::Array(vec![int(n.slots.0), int(n.slots.1)]),
                        ),
                        (bulk("nodes"), Frame::Array(vec![node])),
                    ],
                )
            })
            .collect(),
    )
}

/// `CLUSTER NODES`: a line per node, Redis's fields (no cluster bus: its port shows as 0).
fn nodes(v: &View) -> String {
    let mut out = String::new();
    for (i, n) in v.nodes.iter().enumerate() {
        let flags = if v.myself == Some(i) {
            "myself,master"
        } else {
            "master"
        };
        out.push_str(&format!(
            "{} {}:{}@0 {flags} - 0 0 {} connected {}-{}\n",
            n.id(),
            n.addr.ip(),
            n.addr.port(),
            n.epoch,
            n.slots.0,
            n.slots.1
        ));
    }
    out
}

/// `CLUSTER INFO`: a healthy cluster of the live nodes, every slot assigned.
fn info(v: &View) -> String {
    let n = v.nodes.len();
    let fields = [
        ("cluster_state", "ok".to_string()),
        ("cluster_slots_assigned", REDIS_CLUSTER_SLOTS.to_string()),
        ("cluster_slots_ok", REDIS_CLUSTER_SLOTS.to_string()),
        ("cluster_slots_pfail", "0".into()),
        ("cluster_slots_fail", "0".into()),
        ("cluster_known_nodes", n.to_string()),
        ("cluster_size", n.to_string()),
        ("cluster_current_epoch", v.current_epoch.to_string()),
        (
            "cluster_my_epoch",
            v.myself.map_or(0, |i| v.nodes[i].epoch).to_string(),
        ),
        ("cluster_stats_messages_sent", "0".into()),
        ("cluster_stats_messages_received", "0".into()),
        ("total_cluster_links_buffer_limit_exceeded", "0".into()),
    ];
    fields.iter().map(|(k, v)| format!("{k}:{v}\r\n")).collect()
}

fn help() -> Frame {
    Frame::Array(
        [
            "CLUSTER <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
            "SLOTS, SHARDS, NODES",
            "    The emulated cluster: the live announced sidecars (or this one), every slot owned.",
            "INFO",
            "    A healthy cluster of those nodes.",
            "KEYSLOT <key>",
            "    The hash slot of <key>.",
            "MYID, MYSHARDID",
            "    This sidecar's node and shard ids.",
            "REPLICAS <node-id>, LINKS",
            "    None: every node is a primary, and there is no cluster bus.",
            "HELP",
            "    Prints this help.",
        ]
        .iter()
        .map(|l| Frame::simple(l))
        .collect(),
    )
}

/// The `mode` of `HELLO` and `redis_mode` of `INFO`: `cluster` when the listener emulates one.
pub(crate) fn mode(listener: &Listener) -> &'static str {
    match listener.cluster_emulation {
        Some(_) => "cluster",
        None => "standalone",
    }
}

#[cfg(test)]
mod tests {
    use respway_filters::model::{ClusterEmulation, ListenerTls};
    use respway_filters::resp::parse_reply;

    use super::*;

    /// A listener on 127.0.0.1:6380 announcing `announce`, with TLS when `tls`.
    fn listener(announce: &[&str], tls: bool) -> Listener {
        let mut l = respway_xds::default_config().listeners.remove(0);
        l.cluster_emulation = Some(ClusterEmulation {
            announce: announce.iter().map(|a| a.parse().unwrap()).collect(),
        });
        l.tls = tls.then(|| ListenerTls {
            cert: "c.pem".into(),
            key: "k.pem".into(),
            client_ca: None,
            require_client_cert: false,
        });
        l
    }

    fn call(l: &Listener, local: &str, args: &[&str], resp3: bool) -> Frame {
        let args: Vec<Bytes> = args.iter().map(|a| Bytes::from(a.to_string())).collect();
        let cmd = respway_filters::command::lookup(&args[0])
            .unwrap()
            .resolve(&args);
        let reply = answer(cmd, &args, l, None, Some(local.parse().unwrap()), resp3);
        parse_reply(&reply).unwrap()
    }

    /// `CLUSTER NODES` of `l` on a connection to `local`, with the announced addresses in
    /// `out` taken out by their checks: per node, its address, flags, epoch and slots.
    fn nodes_with_out(l: &Listener, local: &str, out: &[&str]) -> Vec<[String; 4]> {
        let peers = crate::discovery::peers::Peers::default();
        let announced = peers.announced(l).expect("two or more announced");
        for (addr, check) in announced.nodes.iter() {
            if out.contains(&addr.to_string().as_str()) {
                check.take_out_for_test();
            }
        }
        let args: Vec<Bytes> = ["CLUSTER", "NODES"]
            .iter()
            .map(|a| Bytes::from(*a))
            .collect();
        let cmd = respway_filters::command::lookup(&args[0])
            .unwrap()
            .resolve(&args);
        let local = Some(local.parse().unwrap());
        let reply = answer(cmd, &args, l, Some(&announced), local, false);
        let owned = owned_slots(l, Some(&announced), local);
        let text = text(&parse_reply(&reply).unwrap());
        let lines: Vec<[String; 4]> = text
            .lines()
            .map(|line| {
                let f: Vec<&str> = line.split(' ').collect();
                [f[1], f[2], f[6], f[8]].map(str::to_string)
            })
            .collect();
        // The keyspace-wide commands cover the slots NODES gives this connection's node.
        let mine = lines.iter().find(|l| l[1].starts_with("myself"));
        let want = mine
            .map(|l| l[3].split_once('-').unwrap())
            .map(|(a, b)| (a.parse::<u32>().unwrap(), b.parse::<u32>().unwrap()))
            .filter(|&r| r != (0, 16383));
        assert_eq!(owned, want, "{text}");
        lines
    }

    fn text(f: &Frame) -> String {
        match f {
            Frame::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn three_nodes_split_the_slots_as_redis_cli_does_and_each_is_myself_at_its_address() {
        let announce = ["10.0.0.5:6379", "10.0.0.6:6379", "10.0.0.7:6379"];
        let l = listener(&announce, false);
        let nodes = text(&call(&l, "10.0.0.6:6379", &["CLUSTER", "NODES"], false));
        let lines: Vec<Vec<&str>> = nodes.lines().map(|l| l.split(' ').collect()).collect();
        let want = [
            ("10.0.0.5:6379@0", "master", "1", "0-5460"),
            ("10.0.0.6:6379@0", "myself,master", "2", "5461-10922"),
            ("10.0.0.7:6379@0", "master", "3", "10923-16383"),
        ];
        for (l, w) in lines.iter().zip(want) {
            assert_eq!((l[1], l[2], l[6], l[8]), w, "{nodes}");
        }
        let info = text(&call(&l, "10.0.0.6:6379", &["CLUSTER", "INFO"], false));
        assert!(
            info.contains("cluster_size:3\r\ncluster_current_epoch:3\r\ncluster_my_epoch:2\r\n")
        );
        let id = text(&call(&l, "10.0.0.6:6379", &["CLUSTER", "MYID"], false));
        assert_eq!(id, lines[1][0]);
        assert_eq!(id, hex_id("node", "10.0.0.6:6379".parse().unwrap()));
    }

    /// A node its checks took out leaves the map; its slots are split over the live ones in
    /// the order announced, each keeping its epoch; the connection's own node is always live.
    #[test]
    fn nodes_taken_out_leave_the_map_to_the_live_ones() {
        let announce = ["10.0.0.5:6379", "10.0.0.6:6379", "10.0.0.7:6379"];
        let l = listener(&announce, false);
        let row = |a: &str, f: &str, e: &str, s: &str| [a, f, e, s].map(str::to_string);
        assert_eq!(
            nodes_with_out(&l, "10.0.0.6:6379", &["10.0.0.5:6379"]),
            [
                row("10.0.0.6:6379@0", "myself,master", "2", "0-8191"),
                row("10.0.0.7:6379@0", "master", "3", "8192-16383"),
            ]
        );
        assert_eq!(
            nodes_with_out(&l, "10.0.0.6:6379", &["10.0.0.5:6379", "10.0.0.7:6379"]),
            [row("10.0.0.6:6379@0", "myself,master", "2", "0-16383")]
        );
        // This sidecar is live for its own connections, whatever its check says.
        assert_eq!(
            nodes_with_out(&l, "10.0.0.6:6379", &["10.0.0.6:6379", "10.0.0.7:6379"]),
            [
                row("10.0.0.5:6379@0", "master", "1", "0-8191"),
                row("10.0.0.6:6379@0", "myself,master", "2", "8192-16383"),
            ]
        );
        // Every node live: the even split, as without checks.
        assert_eq!(nodes_with_out(&l, "10.0.0.7:6379", &[]).len(), 3);
        // A connection to an address not announced, every announced one out: all of them.
        assert_eq!(nodes_with_out(&l, "127.0.0.1:6380", &announce).len(), 3);
        assert_eq!(
            nodes_with_out(&l, "127.0.0.1:6380", &["10.0.0.7:6379"]),
            [
                row("10.0.0.5:6379@0", "master", "1", "0-8191"),
                row("10.0.0.6:6379@0", "master", "2", "8192-16383"),
            ]
        );
        let info = |out: &[&str]| {
            let peers = crate::discovery::peers::Peers::default();
            let announced = peers.announced(&l).unwrap();
            for (addr, check) in announced.nodes.iter() {
                if out.contains(&addr.to_string().as_str()) {
                    check.take_out_for_test();
                }
            }
            let v = View::new(&l, Some(&announced), Some("10.0.0.7:6379".parse().unwrap()));
            super::info(&v)
        };
        let two = info(&["10.0.0.6:6379"]);
        assert!(
            two.contains("cluster_known_nodes:2\r\ncluster_size:2\r\ncluster_current_epoch:3\r\ncluster_my_epoch:3\r\n"),
            "{two}"
        );
    }

    #[test]
    fn a_connection_to_an_address_not_announced_has_no_myself() {
        let l = listener(&["10.0.0.5:6379", "10.0.0.6:6379"], false);
        let local = "127.0.0.1:6380";
        let nodes = text(&call(&l, local, &["CLUSTER", "NODES"], false));
        assert!(!nodes.contains("myself"), "{nodes}");
        let info = text(&call(&l, local, &["CLUSTER", "INFO"], false));
        assert!(info.contains("cluster_my_epoch:0\r\n"), "{info}");
        let id = text(&call(&l, local, &["CLUSTER", "MYID"], false));
        assert_eq!(id, hex_id("node", local.parse().unwrap()));
        assert!(!nodes.contains(&id));
    }

    #[test]
    fn ipv6_nodes_are_shown_as_redis_shows_them() {
        let l = listener(&["[fd00::6]:6379"], false);
        let local = "[fd00::6]:6379";
        let nodes = text(&call(&l, local, &["CLUSTER", "NODES"], false));
        assert!(nodes.contains(" fd00::6:6379@0 myself,master "), "{nodes}");
        let Frame::Array(slots) = call(&l, local, &["CLUSTER", "SLOTS"], false) else {
            panic!()
        };
        let Frame::Array(range) = &slots[0] else {
            panic!()
        };
        let Frame::Array(node) = &range[2] else {
            panic!()
        };
        assert_eq!(text(&node[0]), "fd00::6");
        assert_eq!(node[1], Frame::Integer(6379));
    }

    #[test]
    fn a_tls_listener_shows_its_port_as_tls_port() {
        for (tls, key) in [(false, "port"), (true, "tls-port")] {
            let l = listener(&[], tls);
            let Frame::Array(shards) = call(&l, "127.0.0.1:6380", &["CLUSTER", "SHARDS"], true)
            else {
                panic!()
            };
            let Frame::Map(shard) = &shards[0] else {
                panic!()
            };
            let Frame::Array(nodes) = &shard[1].1 else {
                panic!()
            };
            let Frame::Map(node) = &nodes[0] else {
                panic!()
            };
            assert_eq!(node[1], (Frame::bulk(key), Frame::Integer(6380)));
        }
    }
}
