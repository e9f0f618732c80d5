//! Command table (being written).
