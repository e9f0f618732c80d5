//! Read and write buffers of a worker's sessions, handed from one session to the next.
//!
//! A client connection needs a read buffer only while it has bytes to decode, and a write
//! buffer only while replies wait to be written. Sessions on one worker run one at a time, so
//! a session that ends its turn with an empty buffer gives it back here and the next one to
//! read or write takes it: an idle connection holds no buffer (10,000 idle clients cost their
//! sockets and sessions, not 10,000 buffers), and a busy worker allocates no more than before.
//! A few buffers are kept per worker thread, none larger than [`MAX_KEPT`].

use std::cell::RefCell;

use bytes::BytesMut;

/// Buffers kept per worker thread.
const KEPT: usize = 8;

/// A buffer that grew past this (a burst of large commands or replies) is freed, not kept.
pub(crate) const MAX_KEPT: usize = 64 * 1024;

thread_local! {
    static SPARE: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
}

/// An empty buffer: a kept one (with room), else one without capacity.
pub(crate) fn take() -> BytesMut {
    SPARE.with(|s| s.borrow_mut().pop()).unwrap_or_default()
}

/// Gives back `buf` (emptied) for the worker's next session; freed when it is large or
/// enough are kept.
pub(crate) fn give(mut buf: BytesMut) {
    let cap = buf.capacity();
    if cap == 0 || cap > MAX_KEPT {
        return;
    }
    buf.clear();
    SPARE.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < KEPT {
            s.push(buf);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_go_round_and_large_ones_are_freed() {
        let mut b = take();
        assert_eq!(b.capacity(), 0, "nothing kept yet");
        b.reserve(1024);
        b.extend_from_slice(b"leftover");
        give(b);
        let b = take();
        assert!(
            b.is_empty() && b.capacity() >= 1024,
            "the kept one, emptied"
        );
        give(BytesMut::with_capacity(MAX_KEPT + 1));
        assert_eq!(take().capacity(), 0, "a large one is not kept");
        for _ in 0..KEPT + 4 {
            give(BytesMut::with_capacity(16));
        }
        assert_eq!(SPARE.with(|s| s.borrow().len()), KEPT);
    }
}
