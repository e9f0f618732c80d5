//! The two sides compared (source and target clusters) and the connection to each shard.

use super::*;
use crate::report::show_frame;
use crate::scope::Scope;

// === Side ===

/// One cluster: its picker, the keys its walks look at and a connection to each shard's
/// primary.
pub(super) struct Side {
    pub(super) cluster: Cluster,
    pub(super) picker: Arc<dyn ShardPicker>,
    /// The keys [`Side::scan`] returns (`--prefix`, `--skip-prefix`).
    pub(super) scope: Arc<Scope>,
    pub(super) conns: Vec<Conn>,
}

/// A side before it is connected: the cluster, its picker and the scope.
pub(super) struct Plan {
    pub(super) cluster: Cluster,
    pub(super) picker: Arc<dyn ShardPicker>,
    pub(super) scope: Arc<Scope>,
}

impl Plan {
    /// Finds `name` in `config` and builds its picker the way the data plane does
    /// (`routing.rs` `compile_cluster`). `flag` names the option in errors.
    pub(super) fn new(config: &Config, name: &str, flag: &str) -> Result<Plan, String> {
        let Some(cluster) = config.cluster(name) else {
            let known: Vec<&str> = config.clusters.iter().map(|c| c.name.as_str()).collect();
            return Err(format!(
                "{flag}: no cluster \"{name}\" in the configuration (clusters: {})",
                known.join(", ")
            ));
        };
        let picker = cluster_picker(cluster).map_err(|e| format!("cluster \"{name}\": {e}"))?;
        Ok(Plan {
            cluster: cluster.clone(),
            picker,
            scope: Arc::default(),
        })
    }

    /// The same side, its walks limited to `scope`.
    pub(super) fn scoped(self, scope: Arc<Scope>) -> Plan {
        Plan { scope, ..self }
    }

    /// Connects to every shard primary.
    pub(super) async fn connect(self) -> Result<Side, String> {
        let mut conns = Vec::with_capacity(self.cluster.shards.len());
        for shard in &self.cluster.shards {
            let conn = Conn::connect(
                shard.primary().address,
                self.cluster.connect_timeout,
                self.cluster.auth.as_ref(),
                self.cluster.db,
            )
            .await
            .map_err(|e| {
                format!(
                    "cluster \"{}\" shard \"{}\": {e}",
                    self.cluster.name, shard.name
                )
            })?;
            conns.push(conn);
        }
        Ok(Side {
            cluster: self.cluster,
            picker: self.picker,
            scope: self.scope,
            conns,
        })
    }
}

impl Side {
    /// `shard name (address)`, for messages.
    pub(super) fn shard_label(&self, shard: usize) -> String {
        let s = &self.cluster.shards[shard];
        format!("{} ({})", s.name, s.primary().address)
    }

    /// One `SCAN cursor [MATCH pattern] COUNT count` page of shard `shard`: the next cursor
    /// and the keys in scope (the pattern of `--prefix` lets the server skip most others; the
    /// rest are left out here).
    pub(super) async fn scan(
        &mut self,
        shard: usize,
        cursor: &Bytes,
        count: &Bytes,
    ) -> Result<(Bytes, Vec<Bytes>), String> {
        let mut scan = vec![Bytes::from_static(b"SCAN"), cursor.clone()];
        if let Some(pattern) = self.scope.pattern() {
            scan.extend([Bytes::from_static(b"MATCH"), pattern]);
        }
        scan.extend([Bytes::from_static(b"COUNT"), count.clone()]);
        let reply = self.run(&[(shard, scan)]).await?;
        let (next, mut keys) = crate::diff::scan_reply(reply.into_iter().next())
            .map_err(|e| format!("SCAN on {}: {e}", self.shard_label(shard)))?;
        if !self.scope.is_all() {
            keys.retain(|k| self.scope.contains(k));
        }
        Ok((next, keys))
    }

    /// Sends each command to its shard (pipelined per shard) and returns the replies in the
    /// order of `cmds`.
    pub(super) async fn run(&mut self, cmds: &[(usize, Vec<Bytes>)]) -> Result<Vec<Frame>, String> {
        let mut out: Vec<Option<Frame>> = (0..cmds.len()).map(|_| None).collect();
        for (shard, conn) in self.conns.iter_mut().enumerate() {
            let idx: Vec<usize> = (0..cmds.len()).filter(|&i| cmds[i].0 == shard).collect();
            if idx.is_empty() {
                continue;
            }
            let batch: Vec<&[Bytes]> = idx.iter().map(|&i| cmds[i].1.as_slice()).collect();
            let replies = conn.pipeline(&batch).await.map_err(|e| {
                format!(
                    "cluster \"{}\" shard \"{}\": {e}",
                    self.cluster.name, self.cluster.shards[shard].name
                )
            })?;
            for (i, r) in idx.into_iter().zip(replies) {
                out[i] = Some(r);
            }
        }
        Ok(out.into_iter().map(|r| r.unwrap_or(Frame::Null)).collect())
    }
}

// === Conn ===

/// A plain RESP connection to one Redis server.
pub(super) struct Conn {
    pub(super) addr: SocketAddr,
    pub(super) stream: TcpStream,
    pub(super) buf: BytesMut,
    pub(super) out: BytesMut,
    pub(super) scanner: ReplyScanner,
}

impl Conn {
    /// Connects, then authenticates and selects the database as the proxy's pools do.
    pub(super) async fn connect(
        addr: SocketAddr,
        connect_timeout: Duration,
        auth: Option<&UpstreamAuth>,
        db: u32,
    ) -> Result<Conn, String> {
        let stream = timeout(connect_timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| format!("{addr}: connect timed out after {connect_timeout:?}"))?
            .map_err(|e| format!("{addr}: connect: {e}"))?;
        stream.set_nodelay(true).ok();
        let mut conn = Conn {
            addr,
            stream,
            buf: BytesMut::with_capacity(64 * 1024),
            out: BytesMut::with_capacity(16 * 1024),
            scanner: ReplyScanner::new(),
        };
        if let Some(auth) = auth {
            let mut cmd = vec![Bytes::from_static(b"AUTH")];
            if let Some(user) = &auth.username {
                cmd.push(Bytes::from(user.clone()));
            }
            cmd.push(Bytes::from(auth.password.clone()));
            conn.expect_ok(&cmd, "AUTH").await?;
        }
        if db != 0 {
            let cmd = [Bytes::from_static(b"SELECT"), Bytes::from(db.to_string())];
            conn.expect_ok(&cmd, "SELECT").await?;
        }
        Ok(conn)
    }

    pub(super) async fn expect_ok(&mut self, cmd: &[Bytes], what: &str) -> Result<(), String> {
        match self.pipeline(&[cmd]).await?.pop() {
            Some(Frame::Simple(s)) if &s[..] == b"OK" => Ok(()),
            Some(other) => Err(format!(
                "{}: {what} failed: {}",
                self.addr,
                show_frame(&other)
            )),
            None => Err(format!("{}: {what}: no reply", self.addr)),
        }
    }

    /// Writes every command in one write, then reads one reply per command.
    pub(super) async fn pipeline(&mut self, cmds: &[&[Bytes]]) -> Result<Vec<Frame>, String> {
        self.out.clear();
        for cmd in cmds {
            encode_command(cmd, &mut self.out);
        }
        timeout(IO_TIMEOUT, self.stream.write_all(&self.out))
            .await
            .map_err(|_| format!("{}: write timed out", self.addr))?
            .map_err(|e| format!("{}: write: {e}", self.addr))?;
        let mut replies = Vec::with_capacity(cmds.len());
        while replies.len() < cmds.len() {
            replies.push(self.read_reply().await?);
        }
        Ok(replies)
    }

    pub(super) async fn read_reply(&mut self) -> Result<Frame, String> {
        loop {
            let cut = self
                .scanner
                .scan(&self.buf, &REPLY_LIMITS)
                .map_err(|e| format!("{}: {e}", self.addr))?;
            if let Some(len) = cut {
                let reply = self.buf.split_to(len).freeze();
                return parse_reply(&reply).map_err(|e| format!("{}: {e}", self.addr));
            }
            self.buf.reserve(64 * 1024);
            let n = timeout(IO_TIMEOUT, self.stream.read_buf(&mut self.buf))
                .await
                .map_err(|_| format!("{}: no reply within {IO_TIMEOUT:?}", self.addr))?
                .map_err(|e| format!("{}: read: {e}", self.addr))?;
            if n == 0 {
                return Err(format!("{}: connection closed", self.addr));
            }
        }
    }
}
