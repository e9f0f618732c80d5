//! `PUBSUB CHANNELS / SHARDCHANNELS / NUMSUB / SHARDNUMSUB / NUMPAT`: asked of every
//! primary, the replies merged (a channel lives on one shard; patterns on every one).

use std::collections::HashSet;

use respway_filters::resp::{parse_reply, Frame};

use super::{items, merged, Outcome};
use crate::upstream::UpstreamFuture;

/// `PUBSUB CHANNELS` / `SHARDCHANNELS`: the union of every primary's names.
pub(super) fn channels(futs: Vec<UpstreamFuture>) -> Outcome {
    Outcome::Wait {
        fut: merged(async move {
            let replies = crate::session::fanout::join_ok(futs).await?;
            let mut seen = HashSet::new();
            let mut all = Vec::new();
            for r in &replies {
                for f in items(r)? {
                    if let Frame::Bulk(b) = &f {
                        if seen.insert(b.clone()) {
                            all.push(f);
                        }
                    }
                }
            }
            Ok(Frame::Array(all).to_bytes())
        }),
        confirms: false,
    }
}

/// `PUBSUB NUMSUB` / `SHARDNUMSUB`: each name's subscribers summed over the primaries.
pub(super) fn numsub(futs: Vec<UpstreamFuture>, names: Vec<bytes::Bytes>) -> Outcome {
    Outcome::Wait {
        fut: merged(async move {
            let replies = crate::session::fanout::join_ok(futs).await?;
            let mut counts = vec![0i64; names.len()];
            for r in &replies {
                let it = items(r)?;
                let mut parts = Vec::new();
                let mut it = it.into_iter();
                while let (Some(_), Some(n)) = (it.next(), it.next()) {
                    parts.push(match n {
                        Frame::Integer(n) => n,
                        _ => 0,
                    });
                }
                for (c, n) in counts.iter_mut().zip(parts) {
                    *c += n;
                }
            }
            let mut out = Vec::with_capacity(2 * names.len());
            for (name, n) in names.into_iter().zip(counts) {
                out.push(Frame::Bulk(name));
                out.push(Frame::Integer(n));
            }
            Ok(Frame::Array(out).to_bytes())
        }),
        confirms: false,
    }
}

/// `PUBSUB NUMPAT`: the largest count (every primary holds every pattern of the links).
pub(super) fn numpat(futs: Vec<UpstreamFuture>) -> Outcome {
    Outcome::Wait {
        fut: merged(async move {
            let replies = crate::session::fanout::join_ok(futs).await?;
            let mut max = 0;
            for r in &replies {
                if let Ok(Frame::Integer(n)) = parse_reply(r) {
                    max = max.max(n);
                }
            }
            Ok(Frame::Integer(max).to_bytes())
        }),
        confirms: false,
    }
}
