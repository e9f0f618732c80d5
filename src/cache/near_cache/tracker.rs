//! The near cache's trackers: one connection per worker and endpoint that receives Redis's
//! invalidations (see the module above).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use respway_filters::model::{NearCache, NearCacheMode};
use respway_filters::resp::Frame;

use super::{bump, invalidate, CacheStats, TRACKER_MISSES, TRACKER_PING};
use crate::upstream::{Control, EndpointConfig};

/// One worker's tracker of one endpoint: its connection's `CLIENT ID` while it is up.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    id: AtomicU64,
}

impl Tracker {
    /// The tracker connection's client id, while it is subscribed.
    pub(crate) fn id(&self) -> Option<u64> {
        match self.id.load(Ordering::Acquire) {
            0 => None,
            id => Some(id),
        }
    }
}

/// What a tracker is asked to follow.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Follow {
    /// The keys read over connections that redirect their tracking to it.
    Reads,
    /// Every key under these prefixes (none: every key).
    Prefixes(Vec<String>),
}

impl Follow {
    /// What the cluster's cache needs from a tracker (`None`: no tracker).
    pub(crate) fn of(c: Option<&NearCache>) -> Option<Follow> {
        match c?.mode {
            NearCacheMode::Tracked => Some(Follow::Reads),
            NearCacheMode::Bcast => Some(Follow::Prefixes(shortest(&c?.prefixes))),
            NearCacheMode::Ttl => None,
        }
    }
}

/// `prefixes` without those that another one starts (Redis refuses overlapping `BCAST`
/// prefixes on one connection; the shorter one covers the longer).
pub(super) fn shortest(prefixes: &[String]) -> Vec<String> {
    prefixes
        .iter()
        .filter(|p| {
            !prefixes
                .iter()
                .any(|q| q.len() < p.len() && p.starts_with(q.as_str()))
        })
        .cloned()
        .collect()
}

/// Follows one endpoint's invalidations for one worker until `tracker` is dropped by every
/// holder but this task.
pub(crate) async fn run_tracker(
    cfg: EndpointConfig,
    follow: Follow,
    tracker: Arc<Tracker>,
    epoch: Arc<AtomicU64>,
    stats: Arc<CacheStats>,
) {
    let mut backoff = Duration::from_millis(100);
    while Arc::strong_count(&tracker) > 1 {
        let up = Instant::now();
        let reason = track(&cfg, &follow, &tracker, &epoch, &stats).await;
        if tracker.id.swap(0, Ordering::AcqRel) != 0 {
            stats.trackers_up.fetch_sub(1, Ordering::Relaxed);
        }
        epoch.fetch_add(1, Ordering::AcqRel);
        bump(&stats.flushes);
        super::clients::flush(0);
        if Arc::strong_count(&tracker) <= 1 {
            return;
        }
        tracing::warn!(endpoint = %cfg.label, error = %reason, "near cache: tracker lost; the endpoint's entries are dropped");
        if up.elapsed() > Duration::from_secs(5) {
            backoff = Duration::from_millis(100);
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// One tracker connection's life: why it ended.
async fn track(
    cfg: &EndpointConfig,
    follow: &Follow,
    tracker: &Arc<Tracker>,
    epoch: &AtomicU64,
    stats: &CacheStats,
) -> String {
    let mut link = match Control::open(cfg).await {
        Ok(l) => l,
        Err(e) => return e,
    };
    let id = match ask(&mut link, &[b"CLIENT", b"ID"]).await {
        Ok(Frame::Integer(id)) if id > 0 => id as u64,
        Ok(f) => return format!("CLIENT ID answered {f:?}"),
        Err(e) => return e,
    };
    if let Follow::Prefixes(prefixes) = follow {
        let id_text = id.to_string();
        let mut cmd: Vec<&[u8]> = vec![
            b"CLIENT",
            b"TRACKING",
            b"on",
            b"REDIRECT",
            id_text.as_bytes(),
            b"BCAST",
        ];
        for p in prefixes {
            cmd.push(b"PREFIX");
            cmd.push(p.as_bytes());
        }
        match ask(&mut link, &cmd).await {
            Ok(Frame::Simple(_)) => {}
            Ok(f) => return format!("CLIENT TRACKING ... BCAST answered {f:?}"),
            Err(e) => return e,
        }
    }
    match ask(&mut link, &[b"SUBSCRIBE", b"__redis__:invalidate"]).await {
        Ok(Frame::Array(_)) => {}
        Ok(f) => return format!("SUBSCRIBE answered {f:?}"),
        Err(e) => return e,
    }
    // Up: entries filled from now on are served (those of before were dropped with the
    // epoch bump that ended the previous tracker).
    epoch.fetch_add(1, Ordering::AcqRel);
    super::clients::flush(0);
    tracker.id.store(id, Ordering::Release);
    stats.trackers_up.fetch_add(1, Ordering::Relaxed);
    let mut tick = tokio::time::interval(TRACKER_PING);
    tick.tick().await;
    let mut unanswered = 0u32;
    loop {
        tokio::select! {
            frame = link.next() => match frame {
                Ok(f) => {
                    if is_pong(&f) {
                        unanswered = 0;
                    } else if let Some(keys) = invalidated(&f) {
                        match keys {
                            Some(keys) => {
                                for k in keys {
                                    invalidate(k);
                                    super::clients::changed(k, 0);
                                    bump(&stats.invalidations);
                                }
                            }
                            None => {
                                // Every worker's entries go before any tracking client is
                                // told: the other workers' trackers hear of this flush on
                                // their own links, maybe after a client read through them.
                                epoch.fetch_add(1, Ordering::AcqRel);
                                super::flush_all();
                                super::clients::flush(0);
                                bump(&stats.flushes);
                            }
                        }
                    }
                }
                Err(e) => return e,
            },
            _ = tick.tick() => {
                if Arc::strong_count(tracker) <= 1 {
                    return "the endpoint left the configuration".into();
                }
                unanswered += 1;
                if unanswered > TRACKER_MISSES {
                    return format!("no answer to {TRACKER_MISSES} PINGs");
                }
                if let Err(e) = link.send(&[&[b"PING"]]).await {
                    return e;
                }
            }
        }
    }
}

/// Sends one command on a link and waits for its reply.
async fn ask(link: &mut Control, cmd: &[&[u8]]) -> Result<Frame, String> {
    link.send(&[cmd]).await?;
    tokio::time::timeout(Duration::from_secs(2), link.next())
        .await
        .map_err(|_| "no answer within 2 s".to_string())?
}

/// A subscribed connection's `PING` answer: `*2 pong ""`.
pub(super) fn is_pong(f: &Frame) -> bool {
    match f {
        Frame::Array(a) => {
            matches!(a.first(), Some(Frame::Bulk(b)) if b.eq_ignore_ascii_case(b"pong"))
        }
        Frame::Simple(s) => s.eq_ignore_ascii_case(b"pong"),
        _ => false,
    }
}

/// The keys of an invalidation message (`Some(None)`: a flush, every key).
pub(super) fn invalidated(f: &Frame) -> Option<Option<Vec<&Bytes>>> {
    let Frame::Array(a) = f else { return None };
    match a.as_slice() {
        [Frame::Bulk(kind), Frame::Bulk(channel), keys]
            if kind.as_ref() == b"message" && channel.as_ref() == b"__redis__:invalidate" =>
        {
            match keys {
                Frame::Array(keys) => Some(Some(
                    keys.iter()
                        .filter_map(|k| match k {
                            Frame::Bulk(b) => Some(b),
                            _ => None,
                        })
                        .collect(),
                )),
                _ => Some(None),
            }
        }
        _ => None,
    }
}
