//! The process's threads, below every feature that runs one: the signal every worker and
//! side thread watches ([`Stop`]), and the spawner of side threads ([`side_thread`]).

use std::io;
use std::thread::JoinHandle;

/// What the workers are told to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Serve.
    Run,
    /// Drain for at most this long, then stop.
    Drain(std::time::Duration),
    /// Stop now.
    Now,
}

/// Runs `task` on a thread of its own named `name`, on a current-thread runtime (the admin
/// endpoint, Sentinel discovery, health checks: work kept off the workers).
pub(crate) fn side_thread<F, Fut>(name: &str, task: F) -> io::Result<JoinHandle<()>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let what = name.to_string();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt.block_on(task()),
                Err(e) => tracing::error!(thread = %what, error = %e, "cannot build its runtime"),
            }
        })
}
