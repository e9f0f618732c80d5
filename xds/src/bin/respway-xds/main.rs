//! `respway-xds`: the management server and its CLI.
//!
//! - `respway-xds serve --resources DIR --listen ADDR [--admin ADDR]` serves the YAML resource
//!   files of DIR over ADS and pushes every valid edit (see `xds/SCHEMA.md`).
//! - `respway-xds apply FILE --admin ADDR` validates FILE on the server and writes it into DIR.
//! - `respway-xds status --admin ADDR` prints the served version, the files' state and what
//!   each node has ACKed or NACKed.
//! - `respway-xds reshard start|status|pause|resume|abort` moves a route's keys to another
//!   cluster online, phase by phase, waiting for every sidecar's ACK (`respway_xds::reshard`).
#![allow(
    clippy::print_stdout,
    reason = "a CLI: `status` and `apply` print their results on stdout"
)]

mod reshard;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use respway_xds::admin;
use respway_xds::cache::ResourceType;
use respway_xds::server::{Server, ServerStatus};

/// respway's xDS management server: serves YAML resource files to respway sidecars over ADS.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the resource files of a directory over ADS, pushing every valid edit.
    Serve {
        /// The directory of `*.yaml` resource files.
        #[arg(long)]
        resources: PathBuf,
        /// The gRPC (ADS) listen address.
        #[arg(long, default_value = "127.0.0.1:18000")]
        listen: SocketAddr,
        /// The admin HTTP listen address (`GET /status`, `POST /apply`); none when left out.
        #[arg(long)]
        admin: Option<SocketAddr>,
        /// How often the directory is scanned, in milliseconds (not with --store).
        #[arg(long, default_value_t = 200)]
        poll_ms: u64,
        /// Keep the resource files in etcd, shared by every replica started with the same
        /// URL: `etcd://HOST:PORT[,HOST:PORT...]/PREFIX` (the --resources directory then holds
        /// this replica's copy; give each replica its own).
        #[arg(long, value_name = "etcd://HOST:PORT[,...]/PREFIX")]
        store: Option<String>,
        /// This replica's name in the store (no `/`); default HOSTNAME:PORT of --listen.
        #[arg(long, requires = "store")]
        replica: Option<String>,
        /// Admin connections open at once; more wait in the kernel's accept queue.
        #[arg(long, default_value_t = admin::DEFAULT_MAX_CONNECTIONS, value_parser = clap::value_parser!(usize))]
        admin_max_connections: usize,
        /// An admin connection idle this long (no byte, no request in progress) is closed, in
        /// milliseconds; an HTTP/1.1 request's headers must arrive within it too.
        #[arg(long, default_value_t = 10_000)]
        admin_idle_timeout_ms: u64,
        #[command(flatten)]
        security: ServeSecurity,
    },
    /// Validate a resource file on the server and write it into its directory (pushed at once).
    Apply {
        /// The YAML resource file.
        file: PathBuf,
        /// The server's admin address.
        #[arg(long, default_value = "127.0.0.1:18001")]
        admin: String,
        /// The name to store it under in the directory (default: FILE's name).
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        client: AdminClient,
    },
    /// Print the served version, the files' state and each node's ACK/NACK state.
    Status {
        /// The server's admin address.
        #[arg(long, default_value = "127.0.0.1:18001")]
        admin: String,
        /// Print the raw JSON of `GET /status`.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: AdminClient,
    },
    /// Move a route's keys to another cluster online: plan, move mode, the mover, the final
    /// route; each push waits for every sidecar's ACK; resumable from --state.
    Reshard {
        #[command(subcommand)]
        action: reshard::Reshard,
    },
}

/// TLS and credentials of `serve`.
#[derive(Debug, clap::Args)]
struct ServeSecurity {
    /// PEM certificate chain: serve ADS and the admin API over TLS only.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// PEM CA certificates that sign client certificates (sidecars' and admins').
    #[arg(long, requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Refuse TLS clients without a valid client certificate (mTLS).
    #[arg(long, requires = "tls_client_ca")]
    require_client_cert: bool,
    /// A file holding the bearer token `POST /apply` accepts (trailing newline trimmed).
    #[arg(long, env = "RESPWAY_XDS_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<PathBuf>,
    /// A client-certificate name (DNS subjectAltName) allowed to `POST /apply` without a
    /// token; repeatable.
    #[arg(long, requires = "tls_client_ca")]
    admin_identity: Vec<String>,
    /// Serve resources carrying secrets (inline passwords) to nodes that did not present a
    /// client certificate for their node id. Unsafe beyond one trusted host.
    #[arg(long)]
    secrets_to_unauthenticated_nodes: bool,
}

/// How `apply` and `status` reach the admin API.
#[derive(Debug, clap::Args)]
pub(crate) struct AdminClient {
    /// A file holding the admin bearer token (trailing newline trimmed).
    #[arg(long, env = "RESPWAY_XDS_ADMIN_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// PEM CA certificates of the admin API's TLS certificate: connect over TLS.
    #[arg(long)]
    ca: Option<PathBuf>,
    /// PEM client certificate (an admin identity), with --key.
    #[arg(long, requires = "ca", requires = "key")]
    cert: Option<PathBuf>,
    /// PEM private key of --cert.
    #[arg(long, requires = "cert")]
    key: Option<PathBuf>,
    /// The name the server's certificate must be valid for (default: the --admin host).
    #[arg(long, requires = "ca")]
    server_name: Option<String>,
}

/// Reads a secret from a file: its content without the trailing newline; an error naming
/// `flag` when it cannot be read or is empty.
fn read_secret(flag: &str, path: &PathBuf) -> Result<String, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    let t = text.trim_end_matches(['\n', '\r']).to_string();
    if t.is_empty() {
        return Err(format!("{flag} {}: the file is empty", path.display()));
    }
    Ok(t)
}

impl ServeSecurity {
    fn load(&self) -> Result<respway_xds::secure::Security, String> {
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                let files = respway_tls::ServerFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: self.tls_client_ca.clone(),
                    require_client_cert: self.require_client_cert,
                };
                let tls =
                    respway_tls::ServerTls::server("respway-xds", &files, &[b"h2", b"http/1.1"])
                        .map_err(|e| format!("--tls-cert/--tls-key: {e}"))?;
                respway_tls::watch(&tls, respway_xds::secure::RELOAD_PERIOD);
                Some(tls)
            }
            _ => None,
        };
        let admin_token = self
            .admin_token_file
            .as_ref()
            .map(|p| read_secret("--admin-token-file", p))
            .transpose()?;
        if self.secrets_to_unauthenticated_nodes {
            tracing::warn!(
                "--secrets-to-unauthenticated-nodes: any client that names a node id gets that node's passwords"
            );
        }
        Ok(respway_xds::secure::Security {
            tls,
            admin_token,
            admin_identities: self.admin_identity.clone(),
            secrets_to_unauthenticated: self.secrets_to_unauthenticated_nodes,
        })
    }
}

impl AdminClient {
    pub(crate) fn load(&self) -> Result<admin::AdminAuth, String> {
        let token = self
            .token_file
            .as_ref()
            .map(|p| read_secret("--token-file", p))
            .transpose()?;
        let tls = match &self.ca {
            Some(ca) => {
                let files = respway_tls::ClientFiles {
                    ca: Some(ca.clone()),
                    cert: self.cert.clone(),
                    key: self.key.clone(),
                    server_name: self.server_name.clone(),
                    insecure_skip_verify: false,
                };
                let tls =
                    respway_tls::ClientTls::client("respway-xds admin", &files, &[b"http/1.1"])
                        .map_err(|e| format!("--ca/--cert/--key: {e}"))?;
                Some(respway_xds::secure::ClientTlsRef {
                    tls,
                    server_name: self.server_name.clone(),
                })
            }
            None => None,
        };
        Ok(admin::AdminAuth { token, tls })
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        match args.command {
            Command::Serve {
                resources,
                listen,
                admin,
                poll_ms,
                store,
                replica,
                admin_max_connections,
                admin_idle_timeout_ms,
                security,
            } => match security.load() {
                Ok(security) => {
                    let limits = admin::AdminLimits {
                        max_connections: admin_max_connections.max(1),
                        idle_timeout: Duration::from_millis(admin_idle_timeout_ms.max(1)),
                    };
                    let store = match store.map(|s| respway_xds::store::EtcdUrl::parse(&s)) {
                        None => None,
                        Some(Ok(url)) => Some(url),
                        Some(Err(e)) => {
                            eprintln!("--store {e}");
                            return ExitCode::from(2);
                        }
                    };
                    let store = store.map(|url| {
                        let name = replica.unwrap_or_else(|| default_replica(listen));
                        (url, name)
                    });
                    serve(resources, listen, admin, poll_ms, store, limits, security).await
                }
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::from(2)
                }
            },
            Command::Apply {
                file,
                admin,
                name,
                client,
            } => match client.load() {
                Ok(auth) => apply(file, &admin, &auth, name).await,
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::from(2)
                }
            },
            Command::Status {
                admin,
                json,
                client,
            } => match client.load() {
                Ok(auth) => status(&admin, &auth, json).await,
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::from(2)
                }
            },
            Command::Reshard { action } => reshard::run(action).await,
        }
    })
}

async fn serve(
    resources: PathBuf,
    listen: SocketAddr,
    admin: Option<SocketAddr>,
    poll_ms: u64,
    store: Option<(respway_xds::store::EtcdUrl, String)>,
    limits: admin::AdminLimits,
    security: respway_xds::secure::Security,
) -> ExitCode {
    respway_xds::raise_open_files_limit();
    if !resources.is_dir() {
        eprintln!("--resources {}: not a directory", resources.display());
        return ExitCode::from(2);
    }
    let grpc = match tokio::net::TcpListener::bind(listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cannot listen on {listen}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let admin_listener = match admin {
        Some(addr) => match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!("cannot listen on {addr} (admin): {e}");
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    // A shared store: its files are copied into the directory before the first load.
    let (store, replica) = match store {
        None => (None, None),
        Some((url, name)) => (
            Some(respway_xds::store::EtcdStore::open(url, &resources).await),
            Some(name),
        ),
    };
    // With a store, the directory changes only when the store writes it, and the store scans
    // it then: no poll, so no scan sees half of a change.
    let poll = match store {
        Some(_) => NO_POLL,
        None => Duration::from_millis(poll_ms.max(10)),
    };
    let dir = resources.clone();
    let server = match tokio::task::spawn_blocking(move || Server::new(dir)).await {
        Ok(s) => s
            .with_poll_interval(poll)
            .with_admin_limits(limits)
            .with_security(security),
        Err(e) => {
            eprintln!("loading {}: {e}", resources.display());
            return ExitCode::FAILURE;
        }
    };
    let mut fleet = None;
    if let (Some(store), Some(replica)) = (store, replica) {
        server.cache().set_store(store.clone());
        tokio::spawn(store.clone().follow(server.cache().clone()));
        match respway_xds::store::fleet::FleetView::new(store, &replica) {
            Ok(f) => {
                server.set_fleet(f.clone());
                tokio::spawn(f.clone().run(server.clone()));
                fleet = Some(f);
            }
            Err(e) => {
                eprintln!("--replica {e}");
                return ExitCode::from(2);
            }
        }
    }
    tracing::info!(
        grpc = %listen,
        admin = ?admin,
        resources = %resources.display(),
        version = server.cache().snapshot().version,
        tls = server.security().tls.is_some(),
        "respway-xds serving"
    );
    let result = server.serve(grpc, admin_listener, shutdown_signal()).await;
    if let Some(f) = fleet {
        // Its nodes leave the store now rather than when the lease ends.
        f.revoke().await;
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ADS server failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A replica's default name in the store: the host's name and the ADS port.
fn default_replica(listen: SocketAddr) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().replace('/', "_"))
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "respway-xds".to_string());
    format!("{host}:{}", listen.port())
}

/// The directory "poll" of a replica with a shared store: a day (its store scans instead).
const NO_POLL: Duration = Duration::from_secs(86_400);

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("shutting down");
}

async fn apply(
    file: PathBuf,
    admin: &str,
    auth: &admin::AdminAuth,
    name: Option<String>,
) -> ExitCode {
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            return ExitCode::from(2);
        }
    };
    let name = name.unwrap_or_else(|| {
        file.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    match admin::apply(admin, auth, &name, &text).await {
        Ok(version) => {
            println!("applied {name}: serving version {version}");
            ExitCode::SUCCESS
        }
        Err(admin::AdminError::Refused(errors)) => {
            for e in errors {
                eprintln!("{e}");
            }
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn status(admin: &str, auth: &admin::AdminAuth, json: bool) -> ExitCode {
    let status = match admin::fetch_status(admin, auth).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    if json {
        match serde_json::to_string_pretty(&status) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", table(&status));
    }
    ExitCode::SUCCESS
}

/// The status as text tables: files, then one row per node and type.
fn table(s: &ServerStatus) -> String {
    let mut out = format!("serving version {}\n", s.version);
    let mut rows = vec![vec!["FILE".to_string(), "STATE".to_string()]];
    for f in &s.files {
        let state = match (&f.error, f.serving_previous) {
            (None, _) => "ok".to_string(),
            (Some(e), true) => format!("invalid (previous version served): {}", first_line(e)),
            (Some(e), false) => format!("invalid (not served): {}", first_line(e)),
        };
        rows.push(vec![f.name.clone(), state]);
    }
    out.push_str(&columns(&rows));
    for e in &s.errors {
        out.push_str(&format!(
            "snapshot error (those nodes keep their previous snapshot): {e}\n"
        ));
    }
    for u in &s.unserved {
        out.push_str(&format!("not served: {u}\n"));
    }
    if let Some(st) = &s.store {
        match (&st.error, st.connected) {
            (_, true) => out.push_str(&format!("store {} at revision {}\n", st.url, st.revision)),
            (e, false) => out.push_str(&format!(
                "store {} LOST (serving its copy of revision {}): {}\n",
                st.url,
                st.revision,
                e.as_deref().unwrap_or("not reached yet")
            )),
        }
    }
    if s.admin.accept_errors + s.ads_accept_errors > 0 {
        out.push_str(&format!(
            "failed accepts (out of file descriptors?): admin {}, ADS {}\n",
            s.admin.accept_errors, s.ads_accept_errors
        ));
    }
    out.push('\n');
    let mut rows = vec![[
        "NODE",
        "ZONE",
        "CONNECTED",
        "TYPE",
        "SENT",
        "ACKED",
        "LAST NACK",
    ]
    .map(str::to_string)
    .to_vec()];
    for n in &s.nodes {
        for (i, t) in ResourceType::PUSH_ORDER.into_iter().enumerate() {
            let ts = n.types.get(t.type_url()).cloned().unwrap_or_default();
            let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_string());
            let nack = match &ts.nack {
                Some(nack) => format!(
                    "{}{}",
                    nack.version
                        .as_ref()
                        .map(|v| format!("v{v}: "))
                        .unwrap_or_default(),
                    first_line(&nack.message)
                ),
                None => "-".to_string(),
            };
            let (id, zone, conn) = if i == 0 {
                (
                    n.id.clone(),
                    dash(&n.zone),
                    // With a shared store: the replica its stream is on.
                    match (n.connected, &n.replica) {
                        (true, Some(r)) => format!("yes, on {r}"),
                        (true, None) => "yes".to_string(),
                        (false, _) => "no".to_string(),
                    },
                )
            } else {
                Default::default()
            };
            rows.push(vec![
                id,
                zone,
                conn,
                t.short_name().to_string(),
                dash(&ts.sent),
                dash(&ts.acked),
                nack,
            ]);
        }
    }
    out.push_str(&columns(&rows));
    for r in &s.refusals {
        let cert = match &r.certificate {
            Some(names) if !names.is_empty() => format!("certificate {}", names.join(", ")),
            Some(_) => "a certificate without DNS names".to_string(),
            None => "no certificate".to_string(),
        };
        out.push_str(&format!(
            "refused stream from {} ({cert}) claiming node {:?}: {}\n",
            r.peer.as_deref().unwrap_or("?"),
            r.claimed_node,
            r.message
        ));
    }
    for n in &s.nodes {
        if let Some(why) = n.unserved.as_ref().filter(|_| n.connected) {
            out.push_str(&format!("not served {}: {}\n", n.id, why));
        }
    }
    out
}

fn first_line(s: &str) -> String {
    let mut lines = s.lines();
    let first = lines.next().unwrap_or_default().to_string();
    let more = lines.count();
    if more > 0 {
        format!("{first} (+{more} more)")
    } else {
        first
    }
}

/// Left-aligned columns separated by two spaces.
fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|i| {
            rows.iter()
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(c);
            } else {
                line.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use respway_xds::server::{FileStatus, Nack, NodeStatus, TypeStatus};

    use super::*;

    #[test]
    fn status_table() {
        let acked = |v: &str| TypeStatus {
            sent: Some(v.to_string()),
            acked: Some(v.to_string()),
            nack: None,
        };
        let types: BTreeMap<String, TypeStatus> = [
            (respway_xds::CLUSTER_TYPE_URL, acked("2")),
            (respway_xds::ENDPOINT_TYPE_URL, acked("3")),
            (
                respway_xds::LISTENER_TYPE_URL,
                TypeStatus {
                    sent: Some("3".into()),
                    acked: Some("2".into()),
                    nack: Some(Nack {
                        version: Some("3".into()),
                        nonce: "1-6".into(),
                        message: "listener \"main\": address: in use\nmore".into(),
                    }),
                },
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let status = ServerStatus {
            version: 3,
            files: vec![
                FileStatus {
                    name: "base.yaml".into(),
                    ok: true,
                    error: None,
                    serving_previous: false,
                },
                FileStatus {
                    name: "z1.yaml".into(),
                    ok: false,
                    error: Some("z1.yaml: clusters[0].name: required".into()),
                    serving_previous: true,
                },
            ],
            errors: vec![],
            unserved: vec![],
            refusals: vec![],
            admin: Default::default(),
            ads_accept_errors: 0,
            store: None,
            nodes: vec![NodeStatus {
                id: "sidecar-1".into(),
                zone: Some("z1".into()),
                connected: true,
                unserved: None,
                generation: 3,
                types,
                admin: None,
                replica: None,
            }],
        };
        assert_eq!(
            table(&status),
            "serving version 3\n\
             FILE       STATE\n\
             base.yaml  ok\n\
             z1.yaml    invalid (previous version served): z1.yaml: clusters[0].name: required\n\
             \n\
             NODE       ZONE  CONNECTED  TYPE  SENT  ACKED  LAST NACK\n\
             sidecar-1  z1    yes        CDS   2     2      -\n\
             \x20                           EDS   3     3      -\n\
             \x20                           LDS   3     2      v3: listener \"main\": address: in use (+1 more)\n"
        );
    }

    #[test]
    fn status_table_lists_refusals_unserved_classes_and_failed_accepts() {
        let status = ServerStatus {
            version: 1,
            files: vec![],
            errors: vec![],
            unserved: vec![
                "no listener: nothing is served to other nodes, as to a node no file is for".into(),
            ],
            nodes: vec![],
            refusals: vec![respway_xds::server::Refusal {
                at: 0,
                peer: Some("127.0.0.1:4000".into()),
                certificate: Some(vec!["sidecar-2".into()]),
                claimed_node: "sidecar-1".into(),
                message: "node \"sidecar-1\": ...".into(),
            }],
            admin: respway_xds::admin::AdminStats {
                open_connections: 1,
                max_connections: 64,
                accept_errors: 3,
            },
            ads_accept_errors: 0,
            store: None,
        };
        let text = table(&status);
        for line in [
            "not served: no listener: nothing is served to other nodes, as to a node no file is for",
            "failed accepts (out of file descriptors?): admin 3, ADS 0",
            "refused stream from 127.0.0.1:4000 (certificate sidecar-2) claiming node \"sidecar-1\": node \"sidecar-1\": ...",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}\n{text}");
        }
    }
}
