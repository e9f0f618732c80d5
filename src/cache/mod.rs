//! Caching and copies of data near the client.
//!
//! - `near_cache`: read replies kept per worker and ended by writes through the sidecar and by
//!   Redis's invalidations (a tracker per worker and endpoint), the `admit: hot` set, and the
//!   registry of client-side caching through the sidecar (`CLIENT TRACKING on`);
//! - `hotcopy`: the copy pass of hot-key rules (existing keys copied to every shard when a
//!   rule is added, the copies deleted when it is removed), on a thread of its own.

pub(crate) mod hotcopy;
pub(crate) mod near_cache;
