//! A one-member etcd (Debian's `etcd-server`) on loopback ports, the shared store of several
//! respway-xds replicas.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::process::{free_port, have, Proc, Spawn};

/// A one-member etcd; its data directory is removed when it is dropped.
pub struct Etcd {
    /// The process (its address is the client URL's).
    pub proc: Proc,
    peer: u16,
    data: PathBuf,
}

impl Etcd {
    /// Starts one on free loopback ports (client and peer).
    pub fn start() -> Etcd {
        assert!(
            have("etcd"),
            "etcd is missing: install Debian's etcd-server (tests/run.sh --deps-only)"
        );
        let (client, peer) = (free_port(), free_port());
        let data =
            std::env::temp_dir().join(format!("respway-etcd-data-{client}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&data);
        let proc = Etcd::spawn(client, peer, &data);
        Etcd { proc, peer, data }
    }

    /// Its client address (`etcd://ADDR/...`).
    pub fn addr(&self) -> SocketAddr {
        self.proc.addr
    }

    /// Kills it (`SIGKILL`); [`Etcd::restart`] starts it again.
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// Stops it without closing anything (`SIGSTOP`): its connections stay open, silent.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Resumes it after [`Etcd::freeze`] (`SIGCONT`).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self.proc.pid().to_string();
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    }

    /// Starts it again on the same ports and data, after [`Etcd::kill`].
    pub fn restart(&mut self) {
        self.proc = Etcd::spawn(self.proc.addr.port(), self.peer, &self.data);
    }

    fn spawn(client: u16, peer: u16, data: &std::path::Path) -> Proc {
        let peer_url = format!("http://127.0.0.1:{peer}");
        let client_url = format!("http://127.0.0.1:{client}");
        Spawn::new("etcd")
            .on_port(client)
            .args(["--name", "t", "--data-dir"])
            .args([data.display().to_string()])
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("t={peer_url}")])
            .start()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.proc.kill();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}
