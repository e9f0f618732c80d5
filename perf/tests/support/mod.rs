//! What the tests of respway-perf's one test binary (`tests/it.rs`) may not share, now that the
//! tests of every file run at the same time in one process.

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// `compare`'s tests count this process's children by name (`redis-server`, `nutcracker`,
/// `respway`, `respway-xds`) before and after a topology starts and stops, so they run one at a
/// time and apart from any test that starts such a child ([`counting_children`]); a test that
/// starts one holds [`starting_children`] for as long as the child may live (tests holding it
/// run together).
static CHILDREN: RwLock<()> = RwLock::new(());

/// This process's children to this test alone, until the guard is dropped.
pub fn counting_children() -> RwLockWriteGuard<'static, ()> {
    CHILDREN.write().unwrap_or_else(PoisonError::into_inner)
}

/// Leave to start children (`redis-server`, ...) while no test counts them, until the guard
/// is dropped.
pub fn starting_children() -> RwLockReadGuard<'static, ()> {
    CHILDREN.read().unwrap_or_else(PoisonError::into_inner)
}
