//! Bytes waiting to be written to a socket, in order: small frames copied into one buffer
//! (many per write), large ones (≥ [`BIG`]) kept as the `Bytes` they arrived in — a slice of a
//! read buffer — so a 1 MiB value or reply is never copied in user space between the read that
//! brought it and the write that sends it on.

use std::collections::VecDeque;

use bytes::{Buf, Bytes, BytesMut};
use respway_filters::resp::{write_array_header, write_bulk_header};

/// Frames (or arguments) at least this long are queued by reference instead of copied: above
/// it a copy costs more than the extra write call a separate piece may take.
pub(crate) const BIG: usize = 32 * 1024;

/// The write queue of one connection: `segs` go out first, then `buf`. Everything pushed goes
/// after everything already queued.
#[derive(Debug, Default)]
pub(crate) struct OutQueue {
    /// Pieces queued before `buf`'s bytes, oldest first.
    segs: VecDeque<Bytes>,
    /// Bytes in `segs`.
    queued: usize,
    /// Small frames, copied, after every piece in `segs`.
    pub(crate) buf: BytesMut,
}

impl OutQueue {
    /// An empty queue whose buffer holds `cap` bytes before it grows.
    pub(crate) fn with_capacity(cap: usize) -> Self {
        OutQueue {
            segs: VecDeque::new(),
            queued: 0,
            buf: BytesMut::with_capacity(cap),
        }
    }

    /// Bytes waiting.
    pub(crate) fn len(&self) -> usize {
        self.queued + self.buf.len()
    }

    /// Nothing waiting.
    pub(crate) fn is_empty(&self) -> bool {
        self.queued == 0 && self.buf.is_empty()
    }

    /// Appends an encoded frame: copied when small, queued as it is when large.
    pub(crate) fn push(&mut self, b: &Bytes) {
        if b.len() >= BIG {
            self.push_big(b.clone());
        } else {
            self.buf.extend_from_slice(b);
        }
    }

    fn push_big(&mut self, b: Bytes) {
        if !self.buf.is_empty() {
            let head = self.buf.split().freeze();
            self.queued += head.len();
            self.segs.push_back(head);
        }
        self.queued += b.len();
        self.segs.push_back(b);
    }

    /// Appends `args` as a RESP command (as [`respway_filters::resp::encode_command`] does),
    /// with each large argument queued as it is.
    pub(crate) fn push_command(&mut self, args: &[Bytes]) {
        if args.iter().all(|a| a.len() < BIG) {
            respway_filters::resp::encode_command(args, &mut self.buf);
            return;
        }
        write_array_header(&mut self.buf, args.len());
        for a in args {
            write_bulk_header(&mut self.buf, a.len());
            if a.len() >= BIG {
                self.push_big(a.clone());
            } else {
                self.buf.extend_from_slice(a);
            }
            self.buf.extend_from_slice(b"\r\n");
        }
    }

    /// The next bytes to write (empty when nothing waits).
    pub(crate) fn front(&self) -> &[u8] {
        match self.segs.front() {
            Some(s) => s,
            None => &self.buf,
        }
    }

    /// `n` bytes of [`front`](Self::front) were written.
    pub(crate) fn advance(&mut self, n: usize) {
        match self.segs.front_mut() {
            Some(s) => {
                s.advance(n);
                self.queued -= n;
                if s.is_empty() {
                    self.segs.pop_front();
                }
            }
            None => self.buf.advance(n),
        }
    }

    /// Replaces the buffer by a new one of `cap` bytes once it is empty and grew past `max`.
    pub(crate) fn shrink(&mut self, max: usize, cap: usize) {
        if self.buf.is_empty() && self.buf.capacity() > max {
            self.buf = BytesMut::with_capacity(cap);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(q: &mut OutQueue, step: usize) -> Vec<u8> {
        let mut out = Vec::new();
        while !q.is_empty() {
            let n = q.front().len().min(step);
            assert!(n > 0);
            out.extend_from_slice(&q.front()[..n]);
            q.advance(n);
        }
        out
    }

    #[test]
    fn outq_keeps_order_and_encodes_like_encode_command() {
        let big = Bytes::from(vec![b'v'; BIG + 5]);
        let cmds: Vec<Vec<Bytes>> = vec![
            vec![Bytes::from_static(b"GET"), Bytes::from_static(b"k")],
            vec![
                Bytes::from_static(b"SET"),
                Bytes::from_static(b"k"),
                big.clone(),
            ],
            vec![Bytes::from_static(b"PING")],
            vec![
                Bytes::from_static(b"MSET"),
                big.clone(),
                Bytes::from_static(b"x"),
                big.clone(),
            ],
        ];
        let mut want = BytesMut::new();
        let mut q = OutQueue::default();
        for c in &cmds {
            respway_filters::resp::encode_command(c, &mut want);
            q.push_command(c);
        }
        let frame = Bytes::from(vec![b'r'; BIG]);
        want.extend_from_slice(&frame);
        q.push(&frame);
        want.extend_from_slice(b"+OK\r\n");
        q.push(&Bytes::from_static(b"+OK\r\n"));
        assert_eq!(q.len(), want.len());
        for step in [1, 7, 4096, usize::MAX] {
            let mut q2 = OutQueue::default();
            for c in &cmds {
                q2.push_command(c);
            }
            q2.push(&frame);
            q2.push(&Bytes::from_static(b"+OK\r\n"));
            assert_eq!(drain(&mut q2, step), &want[..], "step {step}");
        }
        // The large argument is the caller's memory, not a copy.
        assert!(q.segs.iter().any(|s| s.as_ptr() == big.as_ptr()));
    }
}
