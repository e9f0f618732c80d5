//! Shard pickers (being written).
