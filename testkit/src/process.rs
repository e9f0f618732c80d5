//! Child processes on free loopback ports, killed on drop.

use std::ffi::{OsStr, OsString};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long a started process has to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A free loopback port (bound and released; the caller binds it right away).
pub fn free_port() -> u16 {
    // Below Linux's ephemeral range (32768-60999 by default): a port there can be taken by
    // any outgoing connection on the machine between this check and the child's bind (seen in
    // CI: "Address already in use"). The start differs per process; the count moves on, so
    // one process never hands out the same port twice.
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    static START: OnceLock<u32> = OnceLock::new();
    let start = *START.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        (std::process::id().wrapping_mul(7919) ^ nanos) % SPAN
    });
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOW + (start + n) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port")
}

/// `127.0.0.1:port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Waits (10 s at most) until something accepts on `addr`; panics naming `what` otherwise.
pub fn wait_port(addr: SocketAddr, what: &str) {
    let deadline = Instant::now() + START_TIMEOUT;
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{what} did not start listening on {addr}");
}

/// True when `cmd` is an executable file in one of the `PATH` directories.
pub fn have(cmd: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(cmd).is_file()))
}

/// A scratch directory of this test process: `$TMP/respway-<what>-<port>-<pid>`, created.
pub(crate) fn scratch_dir(what: &str, port: u16) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("respway-{what}-{port}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

/// A child process, killed (and reaped) on drop; its scratch directory, if any, is removed
/// then too.
pub struct Proc {
    pub child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its scratch directory (its config file and `log`).
    pub dir: Option<PathBuf>,
    /// The config file it was started on (see [`Spawn::config`]).
    pub config: Option<PathBuf>,
}

impl Proc {
    /// Kills the process now (a shard dying mid-run).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal with `kill` (`sig` as `kill` takes it: `-HUP`, `-STOP`, `-TERM`...);
    /// panics if `kill` fails.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {sig}");
    }

    /// What the process wrote to stderr so far (a process started with [`Spawn`] writes it
    /// to `log` in its directory); empty when there is none.
    pub fn log(&self) -> String {
        self.dir
            .as_ref()
            .and_then(|d| std::fs::read_to_string(d.join("log")).ok())
            .unwrap_or_default()
    }

    /// Waits until something accepts on its address; panics with the end of its log if it
    /// exits first or does not listen within 10 s.
    fn wait_listening(&mut self, what: &str) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "{what} exited before listening on {} ({status}); its log ends with:\n{}",
                    self.addr,
                    log_tail(&self.log())
                );
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(100)).is_ok() {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "{what} did not start listening on {}; its log ends with:\n{}",
                    self.addr,
                    log_tail(&self.log())
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn log_tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Starts any binary on a loopback port and waits until it listens: the generic launcher
/// behind the `respway` binary in the tests, nutcracker and the odd helper server.
///
/// The process gets a scratch directory of its own; its stdout is dropped and its stderr
/// goes to `log` there ([`Proc::log`]).
///
/// ```no_run
/// # let yaml = "listeners: ...";
/// use respway_testkit::Spawn;
/// // In a test of the respway package: Spawn::new(env!("CARGO_BIN_EXE_respway")).
/// let rw = Spawn::new("target/debug/respway")
///     .config("--config", "respway.yaml", yaml)
///     .args(["--workers", "1"])
///     .start();
/// assert!(rw.addr.ip().is_loopback());
/// ```
pub struct Spawn {
    bin: OsString,
    what: String,
    args: Vec<OsString>,
    envs: Vec<(OsString, OsString)>,
    config: Option<(OsString, String, String)>,
    port: Option<u16>,
}

impl Spawn {
    /// The binary to start (a path, or a name looked up in `PATH`).
    pub fn new(bin: impl AsRef<OsStr>) -> Spawn {
        let bin = bin.as_ref().to_os_string();
        let what = Path::new(&bin)
            .file_name()
            .map_or_else(|| "process".into(), |n| n.to_string_lossy().into_owned());
        Spawn {
            bin,
            what,
            args: Vec::new(),
            envs: Vec::new(),
            config: None,
            port: None,
        }
    }

    /// Runs it on a config file: `text`, with its first `127.0.0.1:0` replaced by the
    /// process's port, is written as `file_name` in its scratch directory and passed as
    /// `flag PATH` before the other arguments.
    pub fn config(mut self, flag: impl AsRef<OsStr>, file_name: &str, text: &str) -> Spawn {
        self.config = Some((
            flag.as_ref().to_os_string(),
            file_name.to_string(),
            text.to_string(),
        ));
        self
    }

    /// The port it listens on, when the caller chose it (default: a free port, which only a
    /// config file can tell the process).
    pub fn on_port(mut self, port: u16) -> Spawn {
        self.port = Some(port);
        self
    }

    /// One more argument.
    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Spawn {
        self.args.push(a.as_ref().to_os_string());
        self
    }

    /// More arguments.
    pub fn args<I, S>(mut self, args: I) -> Spawn
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    /// An environment variable.
    pub fn env(mut self, k: impl AsRef<OsStr>, v: impl AsRef<OsStr>) -> Spawn {
        self.envs
            .push((k.as_ref().to_os_string(), v.as_ref().to_os_string()));
        self
    }

    /// Starts it and waits (10 s at most) until it accepts on its port; panics with the end
    /// of its log if it exits first or never listens.
    pub fn start(self) -> Proc {
        let port = self.port.unwrap_or_else(free_port);
        let dir = scratch_dir(&self.what, port);
        let mut cmd = Command::new(&self.bin);
        let mut config = None;
        if let Some((flag, file_name, text)) = &self.config {
            let path = dir.join(file_name);
            let text = text.replacen("127.0.0.1:0", &format!("127.0.0.1:{port}"), 1);
            std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            cmd.arg(flag).arg(&path);
            config = Some(path);
        }
        let log = std::fs::File::create(dir.join("log")).expect("log file");
        let child = cmd
            .args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("could not start {:?}: {e}", self.bin));
        let mut p = Proc {
            child,
            addr: loopback(port),
            dir: Some(dir),
            config,
        };
        p.wait_listening(&self.what);
        p
    }
}

/// The resident set size of process `pid`, in bytes (Linux; 0 when it cannot be read).
pub fn rss_of(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap_or_default();
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_below_the_ephemeral_range_and_never_repeat() {
        // A released port in the kernel's ephemeral range can be taken by any outgoing
        // connection before the child binds it.
        let mut seen = std::collections::HashSet::new();
        for _ in 0..500 {
            let port = free_port();
            assert!(port < 32_768, "{port} is in the ephemeral range");
            assert!(seen.insert(port), "{port} handed out twice");
        }
    }

    #[test]
    fn a_config_gets_the_port_and_everything_goes_on_drop() {
        // The config file is the program: a Python listener on the port written into it.
        let script = "import socket, sys, time\n\
                      host, port = '127.0.0.1:0'.split(':')\n\
                      s = socket.socket()\n\
                      s.bind((host, int(port)))\n\
                      s.listen()\n\
                      print('listening', file=sys.stderr, flush=True)\n\
                      time.sleep(60)\n";
        let p = Spawn::new("python3")
            .config("-u", "serve.py", script)
            .start();
        let dir = p.dir.clone().unwrap();
        let text = std::fs::read_to_string(p.config.as_ref().unwrap()).unwrap();
        assert!(
            text.contains(&format!("'127.0.0.1:{}'", p.addr.port())),
            "{text}"
        );
        assert!(TcpStream::connect(p.addr).is_ok());
        let deadline = Instant::now() + Duration::from_secs(5);
        while !p.log().contains("listening") {
            assert!(Instant::now() < deadline, "stderr is not in the log");
            std::thread::sleep(Duration::from_millis(10));
        }
        let pid = p.pid();
        drop(p);
        assert!(!dir.exists(), "scratch directory removed");
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "killed and reaped"
        );
    }

    #[test]
    fn an_early_exit_is_reported_with_the_log() {
        let err = std::panic::catch_unwind(|| {
            Spawn::new("sh")
                .args(["-c", "echo 'bad config: nope' >&2; exit 3"])
                .on_port(free_port())
                .start()
        })
        .err()
        .expect("start panics");
        let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(
            msg.contains("sh exited before listening") && msg.contains("bad config: nope"),
            "{msg}"
        );
    }
}
