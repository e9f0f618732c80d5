//! Move mode (issue 29) against real redis-servers: the order of one connection's commands
//! while keys move, and the proof under load that nothing is lost, applied twice or read
//! out of order.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;

use respway_filters::hash::{cluster_picker, ShardPicker};
use support::*;

fn shard(name: &str, addr: SocketAddr) -> String {
    format!(
        "      - name: {name}\n        endpoints: [ {{ address: \"{addr}\", role: primary }} ]\n"
    )
}

fn cluster(name: &str, shards: &[(&str, SocketAddr)]) -> String {
    let mut y = format!("  - name: {name}\n    hash: {{ policy: ketama }}\n    shards:\n");
    for (n, a) in shards {
        y.push_str(&shard(n, *a));
    }
    y
}

/// The listener's YAML: `catch_all` with optional mirrors, over the clusters given.
fn yaml(catch_all: &str, mirrors: &str, clusters: &str) -> String {
    format!(
        "listeners:\n  - name: l\n    address: 127.0.0.1:0\n    routes:\n      catch_all: {catch_all}\n{mirrors}clusters:\n{clusters}"
    )
}

const MOVE: &str = "      catch_all_mirrors:\n        - { cluster: new, mode: move }\n";

/// The shard pickers of the config's clusters, by name.
fn picker(yaml: &str, name: &str) -> Arc<dyn ShardPicker> {
    let resources = respway_xds::parse_yaml(yaml).expect("yaml");
    let config = respway_xds::translate(&resources).expect("config");
    let c = config
        .clusters
        .iter()
        .find(|c| c.name == name)
        .expect("cluster");
    cluster_picker(c).expect("picker")
}

/// Commands of one connection run in the order they were sent, also while a command waits
/// for its keys to move: a pipelined `GET` of a key that does not move ran before the `MSET`
/// sent ahead of it (which waited for the `MIGRATE` of its other key), and read the value from
/// before the `MSET`.
#[test]
fn a_pipeline_runs_in_order_while_its_keys_move() {
    let shards: Vec<Proc> = (0..4).map(|_| redis()).collect();
    let a: Vec<SocketAddr> = shards.iter().map(|p| p.addr).collect();
    let old = cluster("old", &[("a", a[0]), ("b", a[1])]);
    let new = cluster("new", &[("a", a[0]), ("b", a[1]), ("c", a[2]), ("d", a[3])]);
    let clusters = format!("{old}{new}");
    let config = yaml("old", MOVE, &clusters);
    let (po, pn) = (picker(&config, "old"), picker(&config, "new"));
    let moves = |k: &str| pn.pick(k.as_bytes()) >= 2;
    let keys: Vec<String> = (0..400).map(|i| format!("k:{i}")).collect();
    let moving: Vec<&String> = keys.iter().filter(|k| moves(k)).collect();
    let staying: Vec<&String> = keys.iter().filter(|k| !moves(k)).collect();
    assert!(moving.len() > 50 && staying.len() > 50);

    // The keys that move are on their old owners, with a value.
    for k in &moving {
        let mut d = sync_client(a[po.pick(k.as_bytes())]);
        let _: () = redis::cmd("SET").arg(*k).arg("old").query(&mut d).unwrap();
    }
    let rw = respway(&config, 1);
    let mut c = sync_client(rw.addr);
    let mut out_of_order = Vec::new();
    for (m, s) in moving.iter().zip(&staying) {
        let (ok, got, moved): (String, Option<String>, Option<String>) = redis::pipe()
            .cmd("MSET")
            .arg(*m)
            .arg("new")
            .arg(*s)
            .arg("new")
            .cmd("GET")
            .arg(*s)
            .cmd("GET")
            .arg(*m)
            .query(&mut c)
            .unwrap();
        assert_eq!(ok, "OK");
        if got.as_deref() != Some("new") || moved.as_deref() != Some("new") {
            out_of_order.push(format!("{s}: {got:?}, {m}: {moved:?}"));
        }
    }
    assert!(
        out_of_order.is_empty(),
        "{} of {} pipelines read before their MSET ran: {:?}",
        out_of_order.len(),
        moving.len().min(staying.len()),
        &out_of_order[..out_of_order.len().min(5)]
    );
}

/// Sidecars do not switch at the same instant. A sidecar still on the old placement writes a
/// key on its old owner even after another sidecar, already in move mode, moved it: that
/// write is acknowledged and then hidden (the key is on two shards, the moved copy answers).
/// So every sidecar first goes through `prepare_move`, where a command that names a key whose
/// owner changes is refused (not run anywhere) and every other command is served as before,
/// and only when every sidecar is there does any go to `move`. Each neighbouring pair of
/// phases (old and `prepare_move`, `prepare_move` and `move`) agrees on where every key it
/// serves lives.
#[test]
fn prepare_move_lets_sidecars_switch_one_by_one() {
    let shards: Vec<Proc> = (0..4).map(|_| redis()).collect();
    let a: Vec<SocketAddr> = shards.iter().map(|p| p.addr).collect();
    let old = cluster("old", &[("a", a[0]), ("b", a[1])]);
    let new = cluster("new", &[("a", a[0]), ("b", a[1]), ("c", a[2]), ("d", a[3])]);
    let clusters = format!("{old}{new}");
    let before = yaml("old", "", &clusters);
    let prepare = yaml(
        "old",
        "      catch_all_mirrors:\n        - { cluster: new, mode: prepare_move }\n",
        &clusters,
    );
    let moving = yaml("old", MOVE, &clusters);
    let pn = picker(&moving, "new");
    let moves = |k: &str| pn.pick(k.as_bytes()) >= 2;
    let (m, s) = {
        let keys: Vec<String> = (0..100).map(|i| format!("n:{i}")).collect();
        (
            keys.iter().find(|k| moves(k)).unwrap().clone(),
            keys.iter().find(|k| !moves(k)).unwrap().clone(),
        )
    };
    let incr = |c: &mut redis::Connection, k: &str| redis::cmd("INCR").arg(k).query::<i64>(c);

    // Old and prepare_move side by side: the key that will move is served by the old sidecar
    // only; the prepared one refuses it (and runs it nowhere) and serves the other keys.
    let s1 = respway(&prepare, 1);
    let s2 = respway(&before, 1);
    let (mut c1, mut c2) = (sync_client(s1.addr), sync_client(s2.addr));
    assert_eq!(incr(&mut c2, &m).unwrap(), 1);
    let err = incr(&mut c1, &m).unwrap_err();
    assert!(err.to_string().contains("about to move"), "{err}");
    assert_eq!(incr(&mut c1, &s).unwrap(), 1);
    assert_eq!(incr(&mut c2, &s).unwrap(), 2);
    let err = redis::cmd("MSET")
        .arg(&m)
        .arg(7)
        .arg(&s)
        .arg(7)
        .query::<()>(&mut c1)
        .unwrap_err();
    assert!(err.to_string().contains("about to move"), "{err}");
    assert_eq!(incr(&mut c2, &s).unwrap(), 3, "a refused MSET ran nowhere");
    drop((c2, s2));

    // prepare_move and move side by side: the moving sidecar moves the key and serves it; the
    // prepared one still refuses it.
    let s2 = respway(&moving, 1);
    let mut c2 = sync_client(s2.addr);
    assert_eq!(incr(&mut c2, &m).unwrap(), 2);
    assert!(incr(&mut c1, &m).is_err());
    assert_eq!(incr(&mut c1, &s).unwrap(), 4);
    drop((c1, s1));

    // Both in move mode: every increment is there, each once.
    let s1 = respway(&moving, 1);
    let mut c1 = sync_client(s1.addr);
    assert_eq!(incr(&mut c1, &m).unwrap(), 3);
    assert_eq!(incr(&mut c2, &s).unwrap(), 5);
    assert_eq!(dbsize(a[0]) + dbsize(a[1]) + dbsize(a[2]) + dbsize(a[3]), 2);
}
