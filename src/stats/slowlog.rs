//! The slow log: commands slower than a threshold, per worker and listener in a bounded ring,
//! merged (newest first) when read by `SLOWLOG GET` or the admin endpoint's `/slowlog`.
//!
//! An entry holds when the command finished, how long it took (dispatch to reply ready:
//! respway plus upstream), the command and its first argument — its first `INLINE_ARG`
//! bytes, which every command in flight carries as a copy; nothing of `AUTH`, `HELLO` or
//! `MIGRATE` is kept — the client's address and name, and the cluster and shard its key routes
//! to (when the key fit whole). Only slow commands take the ring's lock (the worker's own).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use bytes::Bytes;

/// Bytes of an argument kept (Redis keeps 128 characters).
pub(crate) const MAX_ARG: usize = 128;
/// Default threshold, µs (Redis's `slowlog-log-slower-than`).
pub const DEFAULT_THRESHOLD_US: u64 = 10_000;
/// Default entries kept per worker and listener (Redis's `slowlog-max-len`).
pub const DEFAULT_MAX_LEN: usize = 128;

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// One slow command.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// Increasing over the process.
    pub(crate) id: u64,
    /// Unix time (s) it finished.
    pub(crate) time: u64,
    /// Duration, µs.
    pub(crate) duration_us: u64,
    /// The command name and its first argument (truncated).
    pub(crate) args: Vec<Bytes>,
    /// The client's address.
    pub(crate) client: Option<SocketAddr>,
    /// The client's name (`CLIENT SETNAME`).
    pub(crate) name: Option<Bytes>,
    /// `cluster/shard` the command's key routes to, if it has one.
    pub(crate) target: Option<String>,
    /// The endpoint that answered and how long it took (from the write of the batch to the
    /// read of the reply, µs), when known: see [`note_upstream`].
    pub(crate) upstream: Option<(SocketAddr, u64)>,
}

/// Replies kept for the slow log's upstream split, per worker thread.
const UPSTREAM_NOTES: usize = 64;

/// A reply that was slow upstream: where its bytes are, when it was read, from where, and how
/// long the endpoint took.
struct UpstreamNote {
    ptr: usize,
    at: Instant,
    endpoint: SocketAddr,
    us: u64,
}

thread_local! {
    /// Replies at least this slow upstream (µs) are noted; `u64::MAX` = none.
    static UPSTREAM_MIN: Cell<u64> = const { Cell::new(u64::MAX) };
    static UPSTREAM: RefCell<VecDeque<UpstreamNote>> = const { RefCell::new(VecDeque::new()) };
}

/// Sets, for this worker thread, how slow upstream a reply must be to be noted: an eighth of
/// the slow-log threshold, so that a slow command whose endpoint took less than that was slow
/// in respway (or waiting for its client), and one that took more finds its note. `None`: no
/// slow log on this thread, nothing noted.
pub(crate) fn set_upstream_min(threshold_us: Option<u64>) {
    let min = threshold_us.map_or(u64::MAX, |t| t / 8);
    UPSTREAM_MIN.with(|m| m.set(min));
}

/// How slow upstream a reply must be to be noted on this thread.
pub(crate) fn upstream_min() -> u64 {
    UPSTREAM_MIN.with(Cell::get)
}

/// Notes a reply that took `us` at `endpoint` (called by the upstream connection task, which
/// runs on the same worker thread as the client's session). The session finds it by the
/// address of the reply's bytes, which it holds until it writes them.
#[cold]
pub(crate) fn note_upstream(reply: &[u8], at: Instant, endpoint: SocketAddr, us: u64) {
    UPSTREAM.with(|n| {
        let mut n = n.borrow_mut();
        if n.len() == UPSTREAM_NOTES {
            n.pop_front();
        }
        n.push_back(UpstreamNote {
            ptr: reply.as_ptr() as usize,
            at,
            endpoint,
            us,
        });
    });
}

/// The note of `reply` if its endpoint was slow: one whose bytes are at the same address and
/// that was read after the command was dispatched (`since`), newest first. A reply merged
/// from several (MGET over shards) or made by respway has none.
pub(crate) fn take_upstream(reply: &[u8], since: Instant) -> Option<(SocketAddr, u64)> {
    let ptr = reply.as_ptr() as usize;
    UPSTREAM.with(|n| {
        let mut n = n.borrow_mut();
        let i = n.iter().rposition(|u| u.ptr == ptr && u.at >= since)?;
        n.remove(i).map(|u| (u.endpoint, u.us))
    })
}

/// One worker's slow log for one listener.
#[derive(Debug)]
pub(crate) struct SlowLog {
    /// Commands at least this slow are logged (µs; `u64::MAX` = off); a configuration push
    /// may change it, and `max_len`.
    threshold_us: AtomicU64,
    max_len: AtomicUsize,
    ring: Mutex<VecDeque<Entry>>,
}

impl Default for SlowLog {
    fn default() -> Self {
        SlowLog::new(DEFAULT_THRESHOLD_US, DEFAULT_MAX_LEN)
    }
}

impl SlowLog {
    /// A log of commands of at least `threshold_us`, keeping `max_len`.
    pub(crate) fn new(threshold_us: u64, max_len: usize) -> SlowLog {
        SlowLog {
            threshold_us: AtomicU64::new(threshold_us),
            max_len: AtomicUsize::new(max_len),
            ring: Mutex::new(VecDeque::new()),
        }
    }

    /// Commands at least this slow (µs) are logged.
    #[inline]
    pub(crate) fn threshold_us(&self) -> u64 {
        self.threshold_us.load(Ordering::Relaxed)
    }

    /// Logs commands of at least `threshold_us` from now on, keeping `max_len` (the oldest
    /// entries past it are dropped now).
    pub(crate) fn set(&self, threshold_us: u64, max_len: usize) {
        self.threshold_us.store(threshold_us, Ordering::Relaxed);
        self.max_len.store(max_len, Ordering::Relaxed);
        let mut r = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        while r.len() > max_len {
            r.pop_front();
        }
    }

    /// Adds an entry (the id and time are filled in here).
    #[cold]
    pub(crate) fn push(&self, mut e: Entry) {
        let max_len = self.max_len.load(Ordering::Relaxed);
        if max_len == 0 {
            return;
        }
        e.id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        e.time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut r = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        while r.len() >= max_len {
            r.pop_front();
        }
        r.push_back(e);
    }

    /// Appends every entry to `into`.
    pub(crate) fn add_into(&self, into: &mut Vec<Entry>) {
        into.extend(
            self.ring
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .cloned(),
        );
    }

    /// Entries kept.
    pub(crate) fn len(&self) -> usize {
        self.ring.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Forgets every entry.
    pub(crate) fn reset(&self) {
        self.ring.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// Bytes of a command's first argument carried with it in case it turns out slow (copied,
/// so that keeping it costs no reference count per command).
pub(crate) const INLINE_ARG: usize = 30;

/// Copies the first `min(src.len(), INLINE_ARG)` bytes of `src` into `dst` with fixed-size
/// copies (two overlapping ones per size class), which compile to a few moves: a
/// variable-length `copy_from_slice` is a `memcpy` call, ~30 instructions per command.
#[inline]
fn copy_small(dst: &mut [u8; INLINE_ARG], src: &[u8]) {
    let n = src.len().min(INLINE_ARG);
    fn two<const K: usize>(dst: &mut [u8; INLINE_ARG], src: &[u8], n: usize) {
        dst[..K].copy_from_slice(&src[..K]);
        dst[n - K..n].copy_from_slice(&src[n - K..n]);
    }
    match n {
        16.. => two::<16>(dst, src, n),
        8..=15 => two::<8>(dst, src, n),
        4..=7 => two::<4>(dst, src, n),
        // 0 to 3 bytes, one at a time.
        _ => {
            if n > 0 {
                dst[0] = src[0];
                dst[n / 2] = src[n / 2];
                dst[n - 1] = src[n - 1];
            }
        }
    }
}

/// The first argument of a command in flight, as the slow log would show it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FirstArg {
    /// Bytes the argument has (0 with `present` false: none).
    len: u32,
    present: bool,
    buf: [u8; INLINE_ARG],
}

impl FirstArg {
    /// Copies up to [`INLINE_ARG`] bytes of `arg`.
    #[inline]
    pub(crate) fn of(arg: Option<&Bytes>) -> FirstArg {
        let mut f = FirstArg {
            len: 0,
            present: arg.is_some(),
            buf: [0; INLINE_ARG],
        };
        if let Some(a) = arg {
            copy_small(&mut f.buf, a);
            f.len = a.len().min(u32::MAX as usize) as u32;
        }
        f
    }

    /// None.
    pub(crate) const NONE: FirstArg = FirstArg {
        len: 0,
        present: false,
        buf: [0; INLINE_ARG],
    };

    /// The whole argument, when it fit.
    pub(crate) fn whole(&self) -> Option<&[u8]> {
        (self.present && self.len as usize <= INLINE_ARG).then(|| &self.buf[..self.len as usize])
    }

    /// The argument, or its first [`INLINE_ARG`] bytes and how many more it had.
    #[allow(clippy::wrong_self_convention)] // `&self` as before: clippy spares only exported API
    pub(crate) fn to_bytes(&self) -> Option<Bytes> {
        if !self.present {
            return None;
        }
        let len = self.len as usize;
        let kept = len.min(INLINE_ARG);
        let mut v = self.buf[..kept].to_vec();
        if len > kept {
            v.extend_from_slice(format!("... ({} more bytes)", len - kept).as_bytes());
        }
        Some(Bytes::from(v))
    }
}

/// The arguments an entry keeps for `name` (lowercase) and its first argument.
pub fn kept_args(name: &str, first: Option<&Bytes>) -> Vec<Bytes> {
    let mut v = vec![Bytes::copy_from_slice(name.to_ascii_uppercase().as_bytes())];
    if matches!(name, "auth" | "hello" | "migrate") {
        return v;
    }
    if let Some(a) = first {
        if a.len() > MAX_ARG {
            let mut t = a[..MAX_ARG].to_vec();
            t.extend_from_slice(format!("... ({} more bytes)", a.len() - MAX_ARG).as_bytes());
            v.push(Bytes::from(t));
        } else {
            v.push(a.clone());
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_arg_keeps_the_first_bytes_at_every_length() {
        let src: Vec<u8> = (1..=40).collect();
        for len in 0..=40 {
            let a = Bytes::copy_from_slice(&src[..len]);
            let f = FirstArg::of(Some(&a));
            let kept = len.min(INLINE_ARG);
            assert_eq!(&f.buf[..kept], &src[..kept], "length {len}");
            assert!(f.buf[kept..].iter().all(|&b| b == 0), "length {len}");
            assert_eq!(f.whole().is_some(), len <= INLINE_ARG, "length {len}");
        }
        assert!(FirstArg::of(None).to_bytes().is_none());
    }
}
