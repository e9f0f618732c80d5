//! The real servers tests run against: `redis-server` and nutcracker (twemproxy).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{free_port, loopback, scratch_dir, Proc, Spawn};
use crate::resp::raw_command;

/// Starts `redis-server` on a free loopback port, without persistence.
pub fn redis() -> Proc {
    redis_with(&[])
}

/// Starts `redis-server` with extra arguments (`--requirepass`, `--appendonly yes`, ...).
pub fn redis_with(extra: &[&str]) -> Proc {
    for _ in 0..5 {
        if let Some(p) = try_redis(free_port(), extra) {
            return p;
        }
    }
    panic!("could not start redis-server");
}

/// Starts `redis-server` on this port (a shard coming back after a crash).
pub fn redis_on(port: u16) -> Proc {
    redis_on_with(port, &[])
}

/// Starts `redis-server` on this port with extra arguments, in the same directory as the
/// one before it on this port (so an AOF written there is loaded).
pub fn redis_on_with(port: u16, extra: &[&str]) -> Proc {
    try_redis(port, extra).unwrap_or_else(|| panic!("could not start redis-server on {port}"))
}

/// `redis-server` started on `port` in the same directory as the one before it on this port,
/// returned at once: while it loads its AOF it answers `-LOADING` (a shard restarting).
pub fn redis_starting_on(port: u16, extra: &[&str]) -> Proc {
    spawn_redis(port, extra)
}

/// `redis-server` on `port` in the scratch directory of that port, once it answers PING
/// (`+PONG`, or `-NOAUTH` with a password); `None` if it exits first (the port was taken)
/// or does not answer within 10 s.
fn try_redis(port: u16, extra: &[&str]) -> Option<Proc> {
    let mut p = spawn_redis(port, extra);
    let addr = p.addr;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = p.child.try_wait() {
            break; // port taken
        }
        if raw_command(addr, &["PING"])
            .map(|r| r.starts_with("+PONG") || r.starts_with("-NOAUTH"))
            .unwrap_or(false)
        {
            return Some(p);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    p.kill();
    None
}

fn spawn_redis(port: u16, extra: &[&str]) -> Proc {
    let dir = scratch_dir("redis", port);
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .args(["--dir", dir.to_str().expect("utf8 path")])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server must be installed (apt-get install redis-server)");
    Proc {
        child,
        addr: loopback(port),
        dir: Some(dir),
        config: None,
    }
}

/// A Sentinel (`redis-server CONF --sentinel`) on `port` watching `primary` as `master` with
/// quorum 2, a primary declared down after 1 s of silence, and a failover timeout of 10 s.
/// Started again on the same port (after a kill), it reads the configuration it rewrote,
/// which holds what it learned (the current primary, the replicas, the other Sentinels).
pub fn sentinel_on(port: u16, master: &str, primary: std::net::SocketAddr) -> Proc {
    let dir = scratch_dir("sentinel", port);
    let conf = dir.join("sentinel.conf");
    if !conf.exists() {
        let text = format!(
            "port {port}\nbind 127.0.0.1\ndir {}\n\
             sentinel monitor {master} {} {} 2\n\
             sentinel down-after-milliseconds {master} 1000\n\
             sentinel failover-timeout {master} 10000\n\
             sentinel parallel-syncs {master} 1\n",
            dir.display(),
            primary.ip(),
            primary.port()
        );
        std::fs::write(&conf, text).expect("sentinel.conf");
    }
    let log = std::fs::File::create(dir.join("log")).expect("log file");
    let child = Command::new("redis-server")
        .arg(&conf)
        .arg("--sentinel")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("redis-server must be installed (apt-get install redis-server)");
    let p = Proc {
        child,
        addr: loopback(port),
        dir: None,
        config: None,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if raw_command(p.addr, &["PING"]).is_ok_and(|r| r.starts_with("+PONG")) {
            return p;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("Sentinel on port {port} did not start");
}

/// The nutcracker binary: `nutcracker` in `PATH`, else `/usr/sbin/nutcracker` (where the
/// Debian package puts it, outside a normal user's `PATH`); `None` when neither is there.
pub fn nutcracker_bin() -> Option<PathBuf> {
    if crate::process::have("nutcracker") {
        return Some("nutcracker".into());
    }
    let sbin = PathBuf::from("/usr/sbin/nutcracker");
    sbin.is_file().then_some(sbin)
}

/// Starts nutcracker on `conf`, a pool configuration whose `listen:` address is
/// `127.0.0.1:0` (replaced by a free port), with its stats on another free loopback port;
/// waits for its listener. Its log is [`Proc::log`].
pub fn nutcracker(conf: &str) -> Proc {
    let bin = nutcracker_bin().expect("nutcracker must be installed (apt-get install nutcracker)");
    Spawn::new(bin)
        .config("-c", "nutcracker.yml", conf)
        .args(["-s", &free_port().to_string(), "-a", "127.0.0.1"])
        .start()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::{Resp, RespConn};

    #[test]
    fn a_redis_restarted_on_its_port_loads_its_aof() {
        let aof = ["--appendonly", "yes", "--appendfsync", "always"];
        let mut a = redis_with(&aof);
        let port = a.addr.port();
        let mut c = RespConn::connect(a.addr);
        assert_eq!(c.call(&["SET", "k", "v"]), Resp::Simple("OK".into()));
        // Killed without its directory going away (a crash), then back on the same port.
        a.child.kill().unwrap();
        a.child.wait().unwrap();
        let b = redis_on_with(port, &aof);
        assert_eq!(RespConn::connect(b.addr).get("k"), Some(b"v".to_vec()));
    }

    #[test]
    fn a_redis_with_a_password_counts_as_started() {
        let r = redis_with(&["--requirepass", "pw"]);
        let mut c = RespConn::connect(r.addr);
        assert!(c.call(&["GET", "k"]).error().unwrap().starts_with("NOAUTH"));
        assert_eq!(c.call(&["AUTH", "pw"]), Resp::Simple("OK".into()));
    }

    #[test]
    fn nutcracker_listens_on_the_port_of_its_config() {
        if nutcracker_bin().is_none() {
            eprintln!("nutcracker not installed: skipped");
            return;
        }
        let r = redis();
        let nc = nutcracker(&format!(
            "alpha:\n  listen: 127.0.0.1:0\n  redis: true\n  servers:\n   - {}:1\n",
            r.addr
        ));
        let mut c = RespConn::connect(nc.addr);
        assert_eq!(c.call(&["SET", "k", "v"]), Resp::Simple("OK".into()));
        assert_eq!(RespConn::connect(r.addr).get("k"), Some(b"v".to_vec()));
    }
}
