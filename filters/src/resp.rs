//! RESP2 codec (being written).
