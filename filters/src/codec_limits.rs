//! Limits applied by the RESP decoder, like Redis's own (`proto-max-bulk-len` and friends).

/// Decoder limits. A stream that exceeds one gets `-ERR Protocol error: ...` and is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest bulk string accepted (Redis `proto-max-bulk-len`, default 512 MiB).
    pub max_bulk_len: usize,
    /// Largest multibulk element count (Redis: 1024*1024 for unauthenticated... we use 1M).
    pub max_multibulk_len: usize,
    /// Longest inline command line (Redis: 64 KiB).
    pub max_inline_len: usize,
}

impl Limits {
    /// For replies from Redis, which are trusted to be well formed (upstream connections, the
    /// pub/sub link, merges of replies already framed): only absurd sizes are refused.
    pub const REPLIES: Limits = Limits {
        max_bulk_len: usize::MAX >> 1,
        max_multibulk_len: usize::MAX >> 1,
        max_inline_len: usize::MAX >> 1,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bulk_len: 512 * 1024 * 1024,
            max_multibulk_len: 1024 * 1024,
            max_inline_len: 64 * 1024,
        }
    }
}
