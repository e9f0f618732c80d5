//! `PUBSUB CHANNELS / SHARDCHANNELS / NUMSUB / SHARDNUMSUB / NUMPAT`: asked of every
//! primary, the replies merged (a channel lives on one shard; patterns on every one).

use std::collections::HashSet;
use std::ops::ControlFlow::{Break, Continue};

use respway_filters::resp::{parse_reply, Frame};

use super::{items, Outcome};
use crate::session::scatter;
use crate::upstream::UpstreamFuture;

/// The primaries asked, each with its reply's future.
type Asked = ((), UpstreamFuture);

/// `PUBSUB CHANNELS` / `SHARDCHANNELS`: the union of every primary's names.
pub(super) fn channels(asked: impl Iterator<Item = Asked>) -> Outcome {
    Outcome::Wait {
        fut: scatter::gather_ok(
            asked,
            (HashSet::new(), Vec::new()),
            |(seen, all), _, r| {
                let names = match items(&r) {
                    Ok(names) => names,
                    Err(e) => return Break(e),
                };
                for f in names {
                    if let Frame::Bulk(b) = &f {
                        if seen.insert(b.clone()) {
                            all.push(f);
                        }
                    }
                }
                Continue(())
            },
            |(_, all)| Ok(Frame::Array(all).to_bytes()),
        ),
        confirms: false,
    }
}

/// `PUBSUB NUMSUB` / `SHARDNUMSUB`: each name's subscribers summed over the primaries.
pub(super) fn numsub(asked: impl Iterator<Item = Asked>, names: Vec<bytes::Bytes>) -> Outcome {
    let counts = vec![0i64; names.len()];
    Outcome::Wait {
        fut: scatter::gather_ok(
            asked,
            counts,
            |counts, _, r| {
                let it = match items(&r) {
                    Ok(it) => it,
                    Err(e) => return Break(e),
                };
                // `[name, count, name, count, ...]`, in the order asked.
                let mut it = it.into_iter();
                let mut c = counts.iter_mut();
                while let (Some(_), Some(n), Some(c)) = (it.next(), it.next(), c.next()) {
                    *c += match n {
                        Frame::Integer(n) => n,
                        _ => 0,
                    };
                }
                Continue(())
            },
            move |counts| {
                let mut out = Vec::with_capacity(2 * names.len());
                for (name, n) in names.into_iter().zip(counts) {
                    out.push(Frame::Bulk(name));
                    out.push(Frame::Integer(n));
                }
                Ok(Frame::Array(out).to_bytes())
            },
        ),
        confirms: false,
    }
}

/// `PUBSUB NUMPAT`: the largest count (every primary holds every pattern of the links).
pub(super) fn numpat(asked: impl Iterator<Item = Asked>) -> Outcome {
    Outcome::Wait {
        fut: scatter::gather_ok(
            asked,
            0,
            |max, _, r| {
                if let Ok(Frame::Integer(n)) = parse_reply(&r) {
                    *max = (*max).max(n);
                }
                Continue(())
            },
            |max| Ok(Frame::Integer(max).to_bytes()),
        ),
        confirms: false,
    }
}
