//! The side threads that follow something outside the configuration (the Sentinels' masters,
//! the Redis Clusters' topologies): one task per thing the current configuration names, started
//! when a configuration names it, stopped when none does any more.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::{AbortHandle, JoinSet};

use crate::discovery::Handle;
use crate::lifecycle::Stop;

/// What a kind of watcher needs: what the configuration names (`wanted`), how to follow one
/// (`watch`, which says on its `oneshot` when its first round is over), and what to forget
/// when one is no longer named.
pub(crate) trait Watch: Send + 'static {
    /// A watched thing and how it is reached: a change of either starts a new watcher.
    type Key: Hash + Eq + Clone + Send + 'static;
    /// What the watcher needs besides its key.
    type Value: Send + 'static;
    fn wanted(handle: &Handle) -> HashMap<Self::Key, Self::Value>;
    fn watch(
        handle: Handle,
        key: Self::Key,
        value: Self::Value,
        first: oneshot::Sender<()>,
    ) -> impl Future<Output = ()> + Send + 'static;
    fn forget(handle: &Handle, key: &Self::Key);
}

/// Starts the thread `name` keeping the watchers of `W` for every configuration applied
/// through `handle`, until `stop` says to stop. Returns once the first round of the watchers
/// of the current configuration is over (or `wait` passed).
pub(crate) fn start<W: Watch>(
    name: &str,
    handle: Handle,
    stop: watch::Receiver<Stop>,
    wait: Duration,
) -> std::io::Result<()> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    crate::lifecycle::side_thread(name, move || run::<W>(handle, stop, ready_tx))?;
    let _ = ready_rx.recv_timeout(wait);
    Ok(())
}

async fn run<W: Watch>(
    handle: Handle,
    mut stop: watch::Receiver<Stop>,
    ready: std::sync::mpsc::Sender<()>,
) {
    let mut changed = handle.subscribe();
    let mut watchers: HashMap<W::Key, AbortHandle> = HashMap::new();
    let mut tasks = JoinSet::new();
    let mut ready = Some(ready);
    loop {
        let wanted = W::wanted(&handle);
        watchers.retain(|k, h| {
            let keep = wanted.contains_key(k);
            if !keep {
                h.abort();
                W::forget(&handle, k);
            }
            keep
        });
        let mut first = Vec::new();
        for (k, v) in wanted {
            if watchers.contains_key(&k) {
                continue;
            }
            let (tx, rx) = oneshot::channel();
            first.push(rx);
            let h = tasks.spawn(W::watch(handle.clone(), k.clone(), v, tx));
            watchers.insert(k, h);
        }
        if let Some(r) = ready.take() {
            for rx in first {
                let _ = rx.await;
            }
            let _ = r.send(());
        }
        tokio::select! {
            r = changed.changed() => if r.is_err() { return },
            r = stop.changed() => {
                if r.is_err() || *stop.borrow() != Stop::Run {
                    return;
                }
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
}
