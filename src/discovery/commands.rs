//! Commands learned from the shards (`respway_filters::command::learned`): one task per
//! endpoint of the current snapshot asks it, on a connection of its own (opened and prepared
//! as the pools open theirs), which commands it has (`COMMAND LIST`; `COMMAND` on a server
//! before 7.0), and for those the built-in table does not hold, `COMMAND INFO`; with its
//! version (`INFO server`). The table is learned again whenever that connection is lost and
//! opened again (a restarted or upgraded shard), and when the configuration changes the
//! endpoint's settings; between, the task only watches the connection (a close is seen at
//! once, and `PING` every [`KEEPALIVE`]).
//!
//! Sessions look the union of every endpoint's table up when the built-in table has no
//! entry; `/commands` on the admin port shows each endpoint's table.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use respway_filters::command::{self, learned};
use respway_filters::resp::Frame;
use tokio::sync::watch;

use crate::discovery::Handle;
use crate::lifecycle::Stop;
use crate::upstream::{Control, EndpointConfig};

/// How often a learned endpoint's connection is checked (a lost one is learned again).
const KEEPALIVE: Duration = Duration::from_secs(2);
/// How long one round of learning may take.
const LEARN_TIMEOUT: Duration = Duration::from_secs(5);
/// After a failed attempt, then doubling up to [`RETRY_MAX`] (a learned table resets it).
const RETRY: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

struct Task {
    cfg: EndpointConfig,
    handle: tokio::task::JoinHandle<()>,
}

/// Starts the learner thread; it ends when `stop` leaves [`Stop::Run`]. Returns once every
/// endpoint of the first snapshot was asked once (or after `first_wait`), so that the first
/// clients find the shards' commands known.
pub(crate) fn start(
    shared: Handle,
    stop: watch::Receiver<Stop>,
    first_wait: Duration,
) -> std::io::Result<()> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    crate::lifecycle::side_thread("respway-commands", move || run(shared, stop, ready_tx))?;
    let _ = ready_rx.recv_timeout(first_wait);
    Ok(())
}

async fn run(shared: Handle, mut stop: watch::Receiver<Stop>, ready: std::sync::mpsc::Sender<()>) {
    let mut changed = shared.subscribe();
    let mut tasks: HashMap<(String, SocketAddr), Task> = HashMap::new();
    let (first_tx, mut first_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut first = Some((first_tx, ready));
    loop {
        let started = reconcile(&shared, &mut tasks, first.as_ref().map(|f| &f.0));
        if let Some((tx, ready)) = first.take() {
            drop(tx);
            // Every task of the first snapshot sends once, then the channel closes.
            let mut left = started;
            while left > 0 && first_rx.recv().await.is_some() {
                left -= 1;
            }
            let _ = ready.send(());
        }
        tokio::select! {
            r = changed.changed() => if r.is_err() { break },
            r = stop.changed() => if r.is_err() || *stop.borrow() != Stop::Run { break },
        }
    }
    for t in tasks.into_values() {
        t.handle.abort();
    }
}

/// Starts and stops tasks to match the current snapshot; the number started.
fn reconcile(
    shared: &Handle,
    tasks: &mut HashMap<(String, SocketAddr), Task>,
    first: Option<&tokio::sync::mpsc::UnboundedSender<()>>,
) -> usize {
    let snap = shared.serving();
    let mut want: HashMap<(String, SocketAddr), EndpointConfig> = HashMap::new();
    for (ci, c) in snap.config().clusters.iter().enumerate() {
        let tls = snap.upstream_tls(ci);
        for s in &c.shards {
            for e in &s.endpoints {
                if e.address == respway_filters::model::NO_ENDPOINT {
                    continue;
                }
                let cfg =
                    crate::discovery::endpoints::endpoint_config(c, s, e.address, tls.clone());
                want.insert((c.name.clone(), e.address), cfg);
            }
        }
    }
    tasks.retain(|k, t| {
        let keep = want.get(k) == Some(&t.cfg);
        if !keep {
            t.handle.abort();
        }
        keep
    });
    let learned = shared.learned().clone();
    learned.retain(|c, e| {
        e.parse()
            .is_ok_and(|a: SocketAddr| want.contains_key(&(c.to_string(), a)))
    });
    let mut started = 0;
    for (k, cfg) in want {
        if tasks.contains_key(&k) {
            continue;
        }
        started += 1;
        let handle = tokio::spawn(learn_loop(
            learned.clone(),
            k.0.clone(),
            cfg.clone(),
            first.cloned(),
        ));
        tasks.insert(k, Task { cfg, handle });
    }
    started
}

/// Learns from one endpoint, again after every reconnect, until aborted.
async fn learn_loop(
    learned: Arc<learned::Learned>,
    cluster: String,
    cfg: EndpointConfig,
    mut first: Option<tokio::sync::mpsc::UnboundedSender<()>>,
) {
    let endpoint = cfg.address.to_string();
    let mut backoff = RETRY;
    loop {
        let attempt = tokio::time::timeout(LEARN_TIMEOUT, async {
            let mut c = Control::open(&cfg).await?;
            let table = learn(&mut c).await?;
            Ok::<_, String>((c, table))
        })
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {LEARN_TIMEOUT:?}")));
        let conn = match attempt {
            Ok((c, table)) => {
                tracing::debug!(
                    "{}: learned {} commands the built-in table does not hold",
                    cfg.label,
                    table.commands.len()
                );
                learned.set(&cluster, &endpoint, table);
                backoff = RETRY;
                Some(c)
            }
            Err(e) => {
                tracing::debug!("{}: cannot learn its commands: {e}", cfg.label);
                learned.failed(&cluster, &endpoint, e);
                None
            }
        };
        if let Some(tx) = first.take() {
            let _ = tx.send(());
        }
        match conn {
            Some(mut c) => loop {
                // A closed connection (a restarting shard) is seen at once; a silent one
                // within two keepalives.
                tokio::select! {
                    _ = tokio::time::sleep(KEEPALIVE) => {}
                    _ = c.next() => break,
                }
                let alive = tokio::time::timeout(KEEPALIVE, c.call(&["PING"])).await;
                if !matches!(alive, Ok(Ok(Frame::Simple(_)))) {
                    break;
                }
            },
            None => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RETRY_MAX);
            }
        }
    }
}

/// One round: the server's version and the commands it has that the built-in table does not.
async fn learn(c: &mut Control) -> Result<learned::EndpointTable, String> {
    let info = c.call(&["INFO", "server"]).await?;
    let version = match &info {
        Frame::Bulk(t) | Frame::Verbatim(t) => version_of(&String::from_utf8_lossy(t)),
        _ => String::new(),
    };
    let names: Vec<String> = match c.call(&["COMMAND", "LIST"]).await? {
        Frame::Array(items) | Frame::Set(items) => items.iter().filter_map(text).collect(),
        Frame::Error(_) | Frame::BlobError(_) => {
            // A server before 7.0: every command's entry at once.
            return Ok(learned::EndpointTable {
                version,
                commands: entries(&c.call(&["COMMAND"]).await?)?,
                error: None,
            });
        }
        other => return Err(format!("unexpected reply to COMMAND LIST: {other:?}")),
    };
    let missing: Vec<&str> = names
        .iter()
        .map(String::as_str)
        // `container|sub` names: a learned container brings its subcommands along (a
        // subcommand the built-in table lacks under a built-in container is not learned).
        .filter(|n| !n.contains('|') && command::lookup(n.as_bytes()).is_none())
        .collect();
    let commands = if missing.is_empty() {
        Vec::new()
    } else {
        let mut args = vec!["COMMAND", "INFO"];
        args.extend(missing);
        entries(&c.call(&args).await?)?
    };
    Ok(learned::EndpointTable {
        version,
        commands,
        error: None,
    })
}

/// The learned entries of a `COMMAND` or `COMMAND INFO` reply (built-in commands left out).
fn entries(reply: &Frame) -> Result<Vec<learned::LearnedCommand>, String> {
    match reply {
        Frame::Array(items) => Ok(items
            .iter()
            .filter_map(learned::parse_command)
            .filter(|c| command::lookup(c.info.name.as_bytes()).is_none())
            .collect()),
        Frame::Error(e) | Frame::BlobError(e) => Err(String::from_utf8_lossy(e).into_owned()),
        other => Err(format!("unexpected reply to COMMAND INFO: {other:?}")),
    }
}

fn text(f: &Frame) -> Option<String> {
    match f {
        Frame::Bulk(b) | Frame::Simple(b) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
}

/// `redis_version` (or Valkey's `valkey_version`) of an `INFO server` reply.
fn version_of(info: &str) -> String {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_string())
    };
    match (field("valkey_version"), field("redis_version")) {
        (Some(v), _) => format!("valkey {v}"),
        (None, Some(v)) => format!("redis {v}"),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(
            version_of("# Server\r\nredis_version:7.0.15\r\n"),
            "redis 7.0.15"
        );
        assert_eq!(
            version_of("redis_version:7.2.4\r\nvalkey_version:8.0.1\r\n"),
            "valkey 8.0.1"
        );
        assert_eq!(version_of(""), "");
    }
}
