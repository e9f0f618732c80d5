//! Bytes on sockets, below every feature: TLS on listeners and to shards, the bytes waiting
//! to be written to a socket, and the buffers handed from one session to the next.
//!
//! - `tls`: TLS configurations per snapshot, the stream type of a TLS or plain socket;
//! - `outq`: bytes waiting to be written, in order, large frames kept uncopied;
//! - `spare`: read and write buffers handed from one idle session to the next.

pub(crate) mod outq;
pub(crate) mod spare;
pub(crate) mod tls;
