//! `reshard start|resume|abort --metrics ADDR`: while the run lasts, `GET /metrics` on ADDR
//! answers the reshard's figures in Prometheus's text format (0.0.4), so that a dashboard
//! follows the mover's progress as its terminal does: the phase reached, the plan's keys, and
//! the counters of the mover's last progress line (since its checkpoint began).
//!
//! The driver writes the figures from its state ([`Metrics::track`], after every step and
//! every progress line) into one [`Figures`] behind a mutex; each scrape copies them out and
//! renders them, on the runtime's own tasks (a reshard is one process, not a hot path).

use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::progress::Progress;
use super::state::{Mode, Phase, State};

/// Connections served at once; a further one waits for a free slot.
const MAX_CONNECTIONS: usize = 16;

/// How long a connection may take to send its request's head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// What `/metrics` shows: the last state the driver tracked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Figures {
    /// The route's listener.
    pub listener: String,
    /// The route's prefix; `None`: the catch-all route.
    pub route: Option<String>,
    /// The cluster keys leave now (`--to` while aborting).
    pub from: String,
    /// The cluster keys go to now.
    pub to: String,
    /// The phase reached, 0 to 4 (as `status` numbers it).
    pub phase: u8,
    /// Every phase done.
    pub done: bool,
    /// The mover runs.
    pub running: bool,
    /// The plan's `move` count (0 without a plan).
    pub planned: u64,
    /// The mover's last progress line (every counter 0 before the first).
    pub progress: Progress,
}

impl Figures {
    /// The figures of `st`.
    pub fn of(st: &State) -> Figures {
        let (from, to) = st.direction();
        Figures {
            listener: st.listener.clone(),
            route: st.route.clone(),
            from: from.to_string(),
            to: to.to_string(),
            phase: phase_number(st.phase),
            done: st.phase == Phase::Done,
            running: st.mover_pid.is_some(),
            planned: st.plan.as_ref().map_or(0, |p| p.keys),
            progress: st
                .progress
                .as_deref()
                .and_then(Progress::parse)
                .unwrap_or_default(),
        }
    }

    /// The Prometheus text exposition (format 0.0.4) of the figures.
    pub fn render(&self) -> String {
        let mut labels = format!("listener=\"{}\"", escape(&self.listener));
        if let Some(r) = &self.route {
            let _ = write!(labels, ",route=\"{}\"", escape(r));
        }
        let _ = write!(
            labels,
            ",from=\"{}\",to=\"{}\"",
            escape(&self.from),
            escape(&self.to)
        );
        let p = &self.progress;
        let mut out = String::new();
        for (name, kind, help, value) in [
            (
                "respway_reshard_phase",
                "gauge",
                "The phase the reshard reached: 0 plan, 1 prepare_move, 2 move mode, 3 the mover, 4 the final configuration (as reshard status numbers them).",
                u64::from(self.phase),
            ),
            (
                "respway_reshard_done",
                "gauge",
                "1 once every phase is done (every sidecar ACKed the final configuration), else 0.",
                u64::from(self.done),
            ),
            (
                "respway_reshard_running",
                "gauge",
                "1 while the mover (respway-compare --move) runs, else 0.",
                u64::from(self.running),
            ),
            (
                "respway_reshard_keys_planned",
                "gauge",
                "Keys the plan (the mover's --plan) found to move; 0 without a plan.",
                self.planned,
            ),
            (
                "respway_reshard_keys_scanned_total",
                "counter",
                "Keys the mover scanned on the old shards, since its checkpoint began (its last progress line).",
                p.scanned,
            ),
            (
                "respway_reshard_keys_sent_total",
                "counter",
                "Keys the mover moved (sent in MIGRATEs answered OK), since its checkpoint began.",
                p.sent,
            ),
            (
                "respway_reshard_keys_kept_total",
                "counter",
                "Keys the mover scanned whose owner stays, since its checkpoint began.",
                p.kept,
            ),
            (
                "respway_reshard_bytes_sent_total",
                "counter",
                "MEMORY USAGE total of the keys the mover moved, since its checkpoint began.",
                p.bytes,
            ),
            (
                "respway_reshard_batches_failed_total",
                "counter",
                "MIGRATE batches that failed (BUSYKEY, IOERR, ...), since the mover's checkpoint began.",
                p.failed,
            ),
            (
                "respway_reshard_batches_absent_total",
                "counter",
                "MIGRATE batches whose keys were gone from the old shard (NOKEY), since the mover's checkpoint began.",
                p.absent,
            ),
            (
                "respway_reshard_keys_big_total",
                "counter",
                "Keys the mover left where they are for being above --max-key-bytes, since its checkpoint began.",
                p.big,
            ),
        ] {
            let _ = write!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {value}\n"
            );
        }
        out
    }
}

/// The phase of `status`'s `N/4` (its [`Phase::describe`]).
fn phase_number(p: Phase) -> u8 {
    match p {
        Phase::Planned => 0,
        Phase::PreparePushed | Phase::PrepareAcked => 1,
        Phase::MovePushed => 2,
        Phase::MoveAcked | Phase::Moved => 3,
        Phase::FinalPushed | Phase::Done => 4,
    }
}

/// A label value escaped as the text format wants it: `\`, `"` and newlines.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The endpoint while it serves; it stops when dropped.
#[derive(Debug)]
pub struct Metrics {
    figures: Arc<Mutex<Option<Figures>>>,
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Metrics {
    /// Binds `addr` (`IP:PORT`, port 0: any free one) and serves `GET /metrics` on it.
    ///
    /// # Errors
    /// `addr` is not an address, or cannot be bound.
    pub async fn serve(addr: &str) -> Result<Metrics, String> {
        let parsed: SocketAddr = addr
            .parse()
            .map_err(|e| format!("--metrics {addr}: not an IP:PORT address ({e})"))?;
        let listener = TcpListener::bind(parsed)
            .await
            .map_err(|e| format!("--metrics {addr}: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("--metrics {addr}: {e}"))?;
        let figures = Arc::new(Mutex::new(None));
        let task = tokio::spawn(accept(listener, figures.clone()));
        Ok(Metrics {
            figures,
            addr,
            task,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Shows the figures of `st` from now on. Copy mode has none of these phases: nothing
    /// changes then.
    pub fn track(&self, st: &State) {
        if st.mode != Mode::Move {
            return;
        }
        let f = Figures::of(st);
        *self.figures.lock().unwrap_or_else(PoisonError::into_inner) = Some(f);
    }
}

impl Drop for Metrics {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts connections, each served on a task of its own.
async fn accept(listener: TcpListener, figures: Arc<Mutex<Option<Figures>>>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::debug!(error = %e, "metrics: accept failed");
                // Out of descriptors, say: not a busy loop.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let figures = figures.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |req| {
                let figures = figures.clone();
                async move { Ok::<_, Infallible>(answer(&req, &figures)) }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            if let Err(e) = builder
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "metrics connection closed");
            }
        });
    }
}

/// `GET /metrics`: the figures; anything else: 404.
fn answer<B>(
    req: &hyper::Request<B>,
    figures: &Mutex<Option<Figures>>,
) -> hyper::Response<Full<Bytes>> {
    let (status, kind, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            let f = figures
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            (
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                f.map(|f| f.render()).unwrap_or_default(),
            )
        }
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "endpoints: GET /metrics\n".to_string(),
        ),
    };
    hyper::Response::builder()
        .status(status)
        .header("content-type", kind)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_render_with_help_type_and_escaped_labels() {
        let f = Figures {
            listener: "main".into(),
            route: Some("p\"\\:".into()),
            from: "old".into(),
            to: "new".into(),
            phase: 3,
            done: false,
            running: true,
            planned: 1669,
            progress: Progress::parse(
                "progress scanned=3000 sent=1200 kept=1331 absent=1 failed=2 big=3 bytes=4096 shard=2/2 elapsed_ms=1000",
            )
            .unwrap(),
        };
        let text = f.render();
        let labels = "{listener=\"main\",route=\"p\\\"\\\\:\",from=\"old\",to=\"new\"}";
        for (name, kind, value) in [
            ("respway_reshard_phase", "gauge", 3),
            ("respway_reshard_done", "gauge", 0),
            ("respway_reshard_running", "gauge", 1),
            ("respway_reshard_keys_planned", "gauge", 1669),
            ("respway_reshard_keys_scanned_total", "counter", 3000),
            ("respway_reshard_keys_sent_total", "counter", 1200),
            ("respway_reshard_keys_kept_total", "counter", 1331),
            ("respway_reshard_bytes_sent_total", "counter", 4096),
            ("respway_reshard_batches_failed_total", "counter", 2),
            ("respway_reshard_batches_absent_total", "counter", 1),
            ("respway_reshard_keys_big_total", "counter", 3),
        ] {
            assert!(text.contains(&format!("# HELP {name} ")), "{name}\n{text}");
            assert!(
                text.contains(&format!("# TYPE {name} {kind}\n")),
                "{name}\n{text}"
            );
            assert!(
                text.contains(&format!("\n{name}{labels} {value}\n")),
                "{name}\n{text}"
            );
        }
        // The catch-all route has no route label.
        let catch_all = Figures { route: None, ..f };
        assert!(catch_all
            .render()
            .contains("respway_reshard_phase{listener=\"main\",from=\"old\",to=\"new\"} 3\n"));
    }

    #[test]
    fn phases_are_numbered_as_status_numbers_them() {
        for p in [
            Phase::Planned,
            Phase::PreparePushed,
            Phase::PrepareAcked,
            Phase::MovePushed,
            Phase::MoveAcked,
            Phase::Moved,
            Phase::FinalPushed,
        ] {
            let n = p.describe().split('/').next().unwrap();
            assert_eq!(phase_number(p).to_string(), n, "{p:?}");
        }
        assert_eq!(phase_number(Phase::Done), 4);
    }
}
