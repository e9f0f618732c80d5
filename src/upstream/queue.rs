//! The request queue between a worker's sessions and one upstream connection task.
//!
//! A bounded multi-producer, single-consumer queue, as `tokio::sync::mpsc` is, but built for
//! how a connection task consumes: it takes every waiting request at once (up to a limit),
//! and it is woken once per batch, not once per request. A send is one uncontended lock and
//! a push (the lock is per connection, and only this worker's sessions take it, so it is
//! never waited on in practice; the admin thread reads the length rarely). tokio's bounded
//! channel spends several atomic operations per request instead, and its receiver takes the
//! semaphore's lock for every request it receives, to give the permit back.
//!
//! There is one [`Sender`] per queue: it lives in the endpoint's pool (or a transaction's
//! dedicated connection), and the sessions send through a reference to it.
//!
//! Semantics kept from `mpsc`: a full queue refuses a send at once ([`TrySendError::Full`]);
//! a queue whose receiver is gone refuses with [`TrySendError::Closed`]; the receiver sees
//! the end (`None`, 0) once the sender is gone and the queue is empty.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

struct Shared<T> {
    state: Mutex<State<T>>,
    cap: usize,
}

struct State<T> {
    items: VecDeque<T>,
    /// The receiver's task, parked on an empty queue (taken by the send that wakes it).
    waker: Option<Waker>,
    /// The sender is gone.
    sender_gone: bool,
    /// The receiver is gone.
    closed: bool,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // Nothing runs user code under the lock, so a poisoned one holds consistent state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<T> State<T> {
    /// Keeps the receiver's waker, to be woken by the next send (or the sender's drop).
    fn park(&mut self, cx: &Context<'_>) {
        match &mut self.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            w => *w = Some(cx.waker().clone()),
        }
    }
}

/// A queue holding at most `cap` items (at least 1).
pub(crate) fn channel<T>(cap: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            items: VecDeque::new(),
            waker: None,
            sender_gone: false,
            closed: false,
        }),
        cap: cap.max(1),
    });
    (Sender(shared.clone()), Receiver(shared))
}

/// Why a send was refused; the item comes back.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum TrySendError<T> {
    /// `cap` items wait already.
    Full(T),
    /// The receiver is gone.
    Closed(T),
}

/// The sending side (one per queue).
pub(crate) struct Sender<T>(Arc<Shared<T>>);

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender").field("cap", &self.0.cap).finish()
    }
}

impl<T> Sender<T> {
    /// Queues `item`, or gives it back at once when the queue is full or closed.
    #[inline]
    pub(crate) fn try_send(&self, item: T) -> Result<(), TrySendError<T>> {
        let mut s = self.0.lock();
        if s.closed {
            return Err(TrySendError::Closed(item));
        }
        if s.items.len() >= self.0.cap {
            return Err(TrySendError::Full(item));
        }
        s.items.push_back(item);
        let waker = s.waker.take();
        drop(s);
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }

    /// True once the receiver is gone.
    pub(crate) fn is_closed(&self) -> bool {
        self.0.lock().closed
    }

    /// Items waiting now.
    pub(crate) fn len(&self) -> usize {
        self.0.lock().items.len()
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.sender_gone = true;
        let waker = s.waker.take();
        drop(s);
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// The receiving side.
pub(crate) struct Receiver<T>(Arc<Shared<T>>);

impl<T> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("cap", &self.0.cap)
            .finish()
    }
}

impl<T> Receiver<T> {
    /// Moves up to `limit` waiting items into `buf` and returns how many; 0 once the sender
    /// is gone and nothing is left. Pending (with the task's waker kept) while the
    /// queue is empty and a sender remains.
    pub(crate) fn poll_recv_many(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut Vec<T>,
        limit: usize,
    ) -> Poll<usize> {
        let mut s = self.0.lock();
        if s.items.is_empty() {
            if s.sender_gone || limit == 0 {
                return Poll::Ready(0);
            }
            s.park(cx);
            return Poll::Pending;
        }
        let n = s.items.len().min(limit);
        buf.extend(s.items.drain(..n));
        Poll::Ready(n)
    }

    /// Moves up to `limit` items waiting now into `buf` without waiting; how many.
    pub(crate) fn try_recv_many(&mut self, buf: &mut Vec<T>, limit: usize) -> usize {
        let mut s = self.0.lock();
        let n = s.items.len().min(limit);
        buf.extend(s.items.drain(..n));
        n
    }

    /// The next item; `None` once the sender is gone and nothing is left.
    pub(crate) async fn recv(&mut self) -> Option<T> {
        poll_fn(|cx| {
            let mut s = self.0.lock();
            if let Some(item) = s.items.pop_front() {
                return Poll::Ready(Some(item));
            }
            if s.sender_gone {
                return Poll::Ready(None);
            }
            s.park(cx);
            Poll::Pending
        })
        .await
    }

    /// The next item waiting now, if any.
    pub(crate) fn try_recv(&mut self) -> Option<T> {
        self.0.lock().items.pop_front()
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.closed = true;
        let items = std::mem::take(&mut s.items);
        drop(s);
        // Dropped outside the lock: an item's drop may wake its sender's task.
        drop(items);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn waker() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        (c.clone(), Waker::from(c))
    }

    #[test]
    fn a_full_queue_refuses_and_gives_the_item_back() {
        let (tx, mut rx) = channel(2);
        assert_eq!(tx.try_send(1), Ok(()));
        assert_eq!(tx.try_send(2), Ok(()));
        assert_eq!(tx.try_send(3), Err(TrySendError::Full(3)));
        assert_eq!(tx.len(), 2);
        assert_eq!(rx.try_recv(), Some(1));
        assert_eq!(tx.try_send(3), Ok(()));
        let mut buf = Vec::new();
        assert_eq!(rx.try_recv_many(&mut buf, 8), 2);
        assert_eq!(buf, [2, 3]);
    }

    #[test]
    fn a_parked_receiver_is_woken_once_per_batch_and_takes_at_most_its_limit() {
        let (tx, mut rx) = channel(100);
        let (count, w) = waker();
        let mut cx = Context::from_waker(&w);
        let mut buf = Vec::new();
        assert_eq!(rx.poll_recv_many(&mut cx, &mut buf, 2), Poll::Pending);
        for i in 0..5 {
            tx.try_send(i).unwrap();
        }
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
        assert_eq!(rx.poll_recv_many(&mut cx, &mut buf, 2), Poll::Ready(2));
        assert_eq!(rx.poll_recv_many(&mut cx, &mut buf, 8), Poll::Ready(3));
        assert_eq!(buf, [0, 1, 2, 3, 4]);
        // Not parked again yet: a send wakes nobody.
        tx.try_send(5).unwrap();
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn the_receiver_sees_the_end_after_the_sender_and_the_last_item() {
        let (tx, mut rx) = channel(4);
        let (count, w) = waker();
        let mut cx = Context::from_waker(&w);
        let mut buf = Vec::new();
        tx.try_send(7).unwrap();
        assert_eq!(rx.poll_recv_many(&mut cx, &mut buf, 8), Poll::Ready(1));
        assert_eq!(rx.poll_recv_many(&mut cx, &mut buf, 8), Poll::Pending);
        drop(tx);
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
        assert_eq!(rx.poll_recv_many(&mut cx, &mut buf, 8), Poll::Ready(0));
    }

    #[test]
    fn senders_see_a_dropped_receiver_and_its_items_are_dropped() {
        let (tx, rx) = channel(4);
        let item = Arc::new(());
        tx.try_send(item.clone()).unwrap();
        assert!(!tx.is_closed());
        drop(rx);
        assert!(tx.is_closed());
        assert_eq!(Arc::strong_count(&item), 1);
        assert!(matches!(tx.try_send(item), Err(TrySendError::Closed(_))));
    }
}
