//! Test harness: real `redis-server` processes on free loopback ports, started by the test
//! and always killed (on drop, also when the test panics). Separate from the root package's
//! `tests/support/` on purpose: this crate's tests stand alone.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use respway_filters::codec_limits::Limits;
use respway_filters::resp::{encode_command, parse_reply, reply_len, Frame};

/// A redis-server child process, killed on drop.
pub struct Redis {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    dir: PathBuf,
}

impl Redis {
    /// Starts `redis-server` on a free loopback port without persistence and waits until it
    /// answers PING (10 s at most).
    pub fn start() -> Redis {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let dir =
            std::env::temp_dir().join(format!("respway-perf-test-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        let r = Redis {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Frame::Simple(s)) = r.try_cmd(&[b"PING"]) {
                if &s[..] == b"PONG" {
                    return r;
                }
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not start on {}",
                r.addr
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn try_cmd(&self, args: &[&[u8]]) -> std::io::Result<Frame> {
        let mut s = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut out = BytesMut::new();
        encode_command(args, &mut out);
        s.write_all(&out)?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        let limits = Limits::default();
        loop {
            if let Some(n) = reply_len(&buf, &limits).expect("valid RESP") {
                return Ok(parse_reply(&Bytes::copy_from_slice(&buf[..n])).expect("valid reply"));
            }
            let k = s.read(&mut chunk)?;
            if k == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            buf.extend_from_slice(&chunk[..k]);
        }
    }

    /// Sends one command and returns its reply.
    pub fn cmd(&self, args: &[&[u8]]) -> Frame {
        self.try_cmd(args).expect("command")
    }

    /// `GET key` as bytes (`None` for nil).
    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        match self.cmd(&[b"GET", key]) {
            Frame::Bulk(b) => Some(b.to_vec()),
            Frame::Null => None,
            other => panic!("GET {key:?}: {other:?}"),
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
