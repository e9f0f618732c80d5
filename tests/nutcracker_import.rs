//! Coming from twemproxy: the `respway` binary runs on a nutcracker YAML file as it is
//! (`--config`), and `respway import-nutcracker FILE` converts one, with keys placed exactly
//! where a real nutcracker places them. What respway cannot do as nutcracker does is refused,
//! naming the pool and the key.
//!
//! The placement test starts real redis-server shards and nutcracker, then the `respway`
//! binary on the same file; every process is stopped when the test ends, also when it fails.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};

use crate::support::*;

/// Keys written per pool.
const KEYS: usize = 5_000;

/// The password of pool alpha's servers (its `redis_auth`).
const PASSWORD: &str = "alpha-secret";

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_respway"))
}

/// Key `i`: mostly plain keys, every tenth one with a hashtag, some with an empty one (which
/// twemproxy hashes whole).
fn key_of(i: usize) -> String {
    match i % 50 {
        5 => format!("{{}}:e{i}"),
        n if n % 10 == 0 => format!("{{tag{}}}:k{i}", i % 37),
        _ => format!("user:{i}"),
    }
}

/// One pool as the test sees it: its listen port, its servers, and what a client and a
/// direct reader of its servers must send first.
struct Pool {
    port: u16,
    servers: Vec<Proc>,
    auth: Option<&'static str>,
    db: u32,
}

impl Pool {
    /// A connection to `addr` authenticated (and, on a server, in the pool's database).
    fn conn(&self, addr: SocketAddr, select: bool) -> RespConn {
        let mut c = RespConn::connect(addr);
        if let Some(pw) = self.auth {
            assert_eq!(c.call(&["AUTH", pw]), Resp::Simple("OK".into()));
        }
        if select && self.db != 0 {
            let db = self.db.to_string();
            assert_eq!(c.call(&["SELECT", &db]), Resp::Simple("OK".into()));
        }
        c
    }

    /// Sends `cmds` in one pipeline through the proxy listening for this pool and returns the
    /// replies (raw RESP: nutcracker closes connections that send CLIENT SETINFO, as the
    /// redis crate does on connect).
    fn pipeline(&self, cmds: impl Iterator<Item = Vec<String>>) -> Vec<Resp> {
        let mut c = self.conn(loopback(self.port), false);
        let mut out = Vec::new();
        let mut n = 0;
        for cmd in cmds {
            let args: Vec<&[u8]> = cmd.iter().map(|a| a.as_bytes()).collect();
            encode_cmd(&mut out, &args);
            n += 1;
        }
        c.write_raw(&out).unwrap();
        (0..n).map(|_| c.read().expect("a reply")).collect()
    }

    /// `SET key_of(i) <tag>-i` for every key through the proxy; every reply is OK.
    fn write_all(&self, tag: &str) {
        let replies =
            self.pipeline((0..KEYS).map(|i| vec!["SET".into(), key_of(i), format!("{tag}-{i}")]));
        let failed = replies
            .iter()
            .filter(|r| **r != Resp::Simple("OK".into()))
            .count();
        assert_eq!(
            failed,
            0,
            "{failed} SETs failed, e.g. {:?}",
            replies.first()
        );
    }

    /// Which server (config index) holds each key, read from the servers themselves.
    fn placement(&self) -> HashMap<String, usize> {
        let mut at = HashMap::new();
        for (i, s) in self.servers.iter().enumerate() {
            let mut c = self.conn(s.addr, true);
            let Resp::Array(Some(keys)) = c.call(&["KEYS", "*"]) else {
                panic!("KEYS on {}", s.addr)
            };
            assert!(
                !keys.is_empty(),
                "server {i} got no keys: the test would not tell placements apart"
            );
            for k in keys {
                assert!(at.insert(k.text(), i).is_none(), "a key is on two servers");
            }
        }
        assert_eq!(at.len(), KEYS, "every key is on some server");
        at
    }

    /// Empties the pool's database on every server.
    fn flush(&self) {
        for s in &self.servers {
            assert_eq!(
                self.conn(s.addr, true).call(&["FLUSHDB"]),
                Resp::Simple("OK".into())
            );
        }
    }
}

/// Pool alpha: ketama + fnv1a_64, named and unnamed servers out of name order with unequal
/// weights, no hash_tag, redis_auth. Pool beta: modula + murmur, unnamed servers, hash_tag
/// `{}`, redis_db 2.
fn nutcracker_yaml(alpha: &Pool, beta: &Pool) -> String {
    let s = |p: &Pool, i: usize| p.servers[i].addr;
    format!(
        "alpha:
  listen: 127.0.0.1:{ap}
  hash: fnv1a_64
  distribution: ketama
  timeout: 2000
  redis: true
  redis_auth: {PASSWORD}
  server_connections: 2
  auto_eject_hosts: false
  servers:
   - {a0}:1 s10
   - {a1}:3 s2
   - {a2}:2
   - {a3}:1 bb
beta:
  listen: 127.0.0.1:{bp}
  hash: murmur
  distribution: modula
  hash_tag: \"{{}}\"
  timeout: 2000
  redis: true
  redis_db: 2
  preconnect: true
  servers:
   - {b0}:2
   - {b1}:1
   - {b2}:3
",
        ap = alpha.port,
        bp = beta.port,
        a0 = s(alpha, 0),
        a1 = s(alpha, 1),
        a2 = s(alpha, 2),
        a3 = s(alpha, 3),
        b0 = s(beta, 0),
        b1 = s(beta, 1),
        b2 = s(beta, 2),
    )
}

/// Keys written through a real nutcracker are read through respway running on the same file,
/// and keys written through respway land on the servers nutcracker put them on: 0 keys differ,
/// in both pools.
#[test]
fn respway_on_a_nutcracker_file_places_every_key_where_nutcracker_does() {
    let Some(nc_bin) = nutcracker_bin() else {
        eprintln!("nutcracker not installed: skipped");
        return;
    };
    let alpha = Pool {
        port: free_port(),
        servers: (0..4)
            .map(|_| redis_with(&["--requirepass", PASSWORD]))
            .collect(),
        auth: Some(PASSWORD),
        db: 0,
    };
    let beta = Pool {
        port: free_port(),
        servers: (0..3).map(|_| redis()).collect(),
        auth: None,
        db: 2,
    };
    let yaml = nutcracker_yaml(&alpha, &beta);

    let nc = Spawn::new(nc_bin)
        .config("-c", "nutcracker.yml", &yaml)
        .args(["-s", &free_port().to_string(), "-a", "127.0.0.1"])
        .on_port(alpha.port)
        .start();
    wait_port(loopback(beta.port), "nutcracker's second pool");
    for p in [&alpha, &beta] {
        p.write_all("nc");
    }
    drop(nc);
    let placed: Vec<HashMap<String, usize>> = [&alpha, &beta].map(Pool::placement).into();

    // The same file, as it is.
    let rw = Spawn::new(env!("CARGO_BIN_EXE_respway"))
        .config("--config", "nutcracker.yml", &yaml)
        .args(["--workers", "1"])
        .on_port(alpha.port)
        .start();
    wait_port(loopback(beta.port), "respway's second listener");
    for (name, p) in [("alpha", &alpha), ("beta", &beta)] {
        let got = p.pipeline((0..KEYS).map(|i| vec!["GET".into(), key_of(i)]));
        let missing = (0..KEYS)
            .filter(|&i| got[i] != Resp::bulk(format!("nc-{i}")))
            .count();
        assert_eq!(
            missing, 0,
            "pool {name}: {missing} of {KEYS} keys written through nutcracker not found \
             through respway"
        );
    }
    for (name, p, before) in [("alpha", &alpha, &placed[0]), ("beta", &beta, &placed[1])] {
        p.flush();
        p.write_all("rw");
        let after = p.placement();
        let moved = before.iter().filter(|(k, i)| after[*k] != **i).count();
        assert_eq!(
            moved, 0,
            "pool {name}: {moved} of {KEYS} keys written through respway are not on the \
             server nutcracker put them on"
        );
    }
    drop(rw);
}

/// A scratch directory, removed on drop.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "respway-nc-import-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn write_file(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `respway import-nutcracker FILE` prints YAML that `--check` accepts as respway's own.
#[test]
fn import_nutcracker_prints_yaml_that_respway_loads() {
    let dir = Scratch::new();
    let nc = write_file(
        dir.path(),
        "nutcracker.yml",
        "cache:\n  listen: 127.0.0.1:22121\n  hash: md5\n  distribution: ketama\n  redis: true\n  \
         backlog: 512\n  servers:\n   - 10.0.0.1:6379:1 one\n   - 10.0.0.2:6379:1 two\n",
    );
    let out = bin().arg("import-nutcracker").arg(&nc).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let yaml = String::from_utf8(out.stdout).unwrap();
    assert!(
        yaml.contains("hash: { policy: ketama, key_hash: md5 }"),
        "{yaml}"
    );
    assert!(yaml.contains("# backlog: 512 is ignored"), "{yaml}");
    let converted = write_file(dir.path(), "respway.yaml", &yaml);
    let check = bin()
        .arg("--config")
        .arg(&converted)
        .arg("--check")
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", stderr(&check));
    assert_eq!(
        String::from_utf8_lossy(&check.stdout),
        "config OK: 1 listener, 1 cluster, 2 endpoints\n"
    );
    // A file that is not nutcracker's is said to be so.
    let out = bin()
        .arg("import-nutcracker")
        .arg(&converted)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("not a nutcracker configuration"),
        "{}",
        stderr(&out)
    );
}

/// What respway cannot do as nutcracker does is refused, each error naming the file, the pool
/// and the key; `import-nutcracker` exits 1, `--config` exits 2 as for any invalid file.
#[test]
fn refused_nutcracker_settings_name_the_pool_and_the_key() {
    let dir = Scratch::new();
    let server = "  servers:\n   - 127.0.0.1:7001:1\n";
    let cases = [
        (
            "auto_eject_hosts: true",
            format!("eject:\n  listen: 127.0.0.1:22121\n  redis: true\n  auto_eject_hosts: true\n{server}"),
            "pool \"eject\": auto_eject_hosts: true is refused",
        ),
        (
            "distribution: random",
            format!("rand:\n  listen: 127.0.0.1:22121\n  redis: true\n  distribution: random\n{server}"),
            "pool \"rand\": distribution: random is refused",
        ),
        (
            "a unix listen socket",
            format!("sock:\n  listen: /var/run/nutcracker.sock 0666\n  redis: true\n{server}"),
            "pool \"sock\": listen: \"/var/run/nutcracker.sock 0666\" is a unix socket",
        ),
        (
            "an unknown key",
            format!("odd:\n  listen: 127.0.0.1:22121\n  redis: true\n  tcpkeepalive: true\n{server}"),
            "pool \"odd\": tcpkeepalive: unknown nutcracker key",
        ),
    ];
    for (what, text, expect) in cases {
        let path = write_file(dir.path(), "nutcracker.yml", &text);
        let want = format!("{}: {expect}", path.display());
        let out = bin().arg("import-nutcracker").arg(&path).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{what}");
        assert!(out.stdout.is_empty(), "{what}: printed YAML");
        assert!(
            stderr(&out).starts_with(&want),
            "{what}: {:?} does not start with {want:?}",
            stderr(&out)
        );
        let out = bin()
            .arg("--config")
            .arg(&path)
            .arg("--check")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{what}");
        assert!(stderr(&out).contains(&want), "{what}: {}", stderr(&out));
    }
}
