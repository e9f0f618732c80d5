//! Learned commands whose key specs say they may miss keys ([`KeySpec::Asked`]): a shard
//! names their keys (`COMMAND GETKEYS`, as Redis Cluster clients do) before they are
//! dispatched. While it is asked nothing after the command is decoded, so nothing passes it;
//! the command is then dispatched with those keys like any other (ACL key patterns, near
//! cache, client tracking, placement with the same-shard rule). A shard that does not know
//! the command (a rolling upgrade) is passed over for the next; when none names the keys, the
//! command is answered with why and runs nowhere.
//!
//! [`KeySpec::Asked`]: respway_filters::command::KeySpec::Asked

use respway_filters::command::{CommandInfo, KeySpec};
use respway_filters::error::Failure;
use respway_filters::resp::{parse_reply, Frame};

use super::*;

/// A command waiting for a shard to name its keys.
pub(super) struct Lookup {
    fut: BoxReply,
    args: Vec<Bytes>,
    frame: Option<Bytes>,
    name: &'static str,
}

impl Session {
    /// Whether `cmd` waits for a shard to name its keys: a [`KeySpec::Asked`] command not
    /// yet asked for, outside `MULTI` (queued, it is refused: `ASKED_KEYS`), from a client
    /// that may send it at all (otherwise dispatch refuses it as it refuses any command).
    #[inline(always)]
    pub(super) fn must_ask(&self, cmd: &CommandInfo, args: &[Bytes]) -> bool {
        matches!(cmd.keys, KeySpec::Asked) && self.must_ask_now(cmd, args)
    }

    #[cold]
    fn must_ask_now(&self, cmd: &CommandInfo, args: &[Bytes]) -> bool {
        self.asked.is_none()
            && !self.tx.as_ref().is_some_and(|t| t.multi)
            && self.state.authenticated
            && cmd.arity_ok(args.len())
    }

    /// Starts asking the shards for the keys of `args`; the command waits in the lookup.
    pub(super) fn ask_keys(
        &mut self,
        cmd: &'static CommandInfo,
        args: Vec<Bytes>,
        frame: Option<Bytes>,
        live: &Live,
    ) {
        let (deadline, _) = dispatch::times(live);
        let mut ask = Vec::with_capacity(args.len() + 2);
        ask.push(Bytes::from_static(b"COMMAND"));
        ask.push(Bytes::from_static(b"GETKEYS"));
        ask.extend(args.iter().cloned());
        let fut = getkeys(
            ask,
            live.parts.clone(),
            self.state.flavor(),
            live.conn,
            deadline,
        );
        self.lookup = Some(Box::new(Lookup {
            fut,
            args,
            frame,
            name: cmd.name,
        }));
    }

    /// The keys a shard named for the command being dispatched, into `keys`; or the reply
    /// saying why there are none.
    #[cold]
    pub(super) fn take_asked(&mut self) -> Result<(), Reply> {
        match self.asked.take() {
            Some(Ok(keys)) => {
                self.keys = keys;
                Ok(())
            }
            Some(Err(reply)) => Err(reply),
            // Not reached: dispatch calls this only with `asked` set.
            None => Ok(()),
        }
    }

    /// Polls the lookup; once answered, the command is stashed with its keys (or with the
    /// reply saying why there are none) and dispatched next. Whether it was answered.
    #[cold]
    pub(super) fn poll_lookup(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(l) = self.lookup.as_mut() else {
            return false;
        };
        let Poll::Ready(answer) = l.fut.as_mut().poll(cx) else {
            return false;
        };
        let Some(l) = self.lookup.take() else {
            return false;
        };
        let found = match answer {
            Ok(r) => positions(&l.args, &r),
            Err(f) => Err(f.to_string().trim_start_matches("ERR ").to_string()),
        };
        self.asked = Some(found.map_err(|why| {
            error_reply(&format!(
                "ERR respway: the keys of '{}' could not be found: {why}",
                l.name
            ))
        }));
        self.stashed = Some((l.args, l.frame));
        true
    }
}

/// `COMMAND GETKEYS ...` to the primaries of the routed clusters, one after the other until
/// one answers with keys (a shard without the command answers with an error): that answer,
/// or the last error.
fn getkeys(
    ask: Vec<Bytes>,
    parts: Arc<Parts>,
    flavor: Flavor,
    conn: usize,
    deadline: Instant,
) -> BoxReply {
    Box::pin(async move {
        let mut last = Err(Failure::message("no shard to ask"));
        for c in parts.routing.routed_clusters() {
            let shards = parts.routing.clusters.get(c).map_or(0, |c| c.shards.len());
            for s in 0..shards {
                let Some(ep) = parts.primary(c, s) else {
                    continue;
                };
                let answer = ep.send(ask.clone(), flavor, conn, deadline).await;
                if matches!(&answer, Ok(r) if !is_error(r)) {
                    return answer;
                }
                last = answer;
            }
        }
        last
    })
}

/// The positions in `args` of the keys a `COMMAND GETKEYS` reply names (each key the first
/// argument equal to it not taken by an earlier one), ascending; or why there are none.
fn positions(args: &[Bytes], reply: &Bytes) -> Result<Vec<usize>, String> {
    let keys = match parse_reply(reply) {
        Ok(Frame::Array(keys) | Frame::Set(keys)) => keys,
        Ok(Frame::Error(e) | Frame::BlobError(e)) => {
            return Err(format!(
                "the shards answered {}",
                String::from_utf8_lossy(&e)
            ))
        }
        _ => return Err("the shards' answer is not a list of keys".to_string()),
    };
    let mut taken = vec![false; args.len()];
    let mut out = Vec::with_capacity(keys.len());
    for k in &keys {
        let Frame::Bulk(k) = k else {
            return Err("the shards' answer is not a list of keys".to_string());
        };
        let i = (1..args.len())
            .find(|&i| !taken[i] && args[i] == *k)
            .ok_or("a shard named a key that is not one of its arguments")?;
        taken[i] = true;
        out.push(i);
    }
    if out.is_empty() {
        return Err("a shard named no key to route it by".to_string());
    }
    out.sort_unstable();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keys_a_shard_names_become_positions() {
        let a = [b"KS.ODD" as &[u8], b"k", b"1", b"v", b"k", b"x"].map(Bytes::from_static);
        let r = Bytes::from_static(b"*2\r\n$1\r\nx\r\n$1\r\nk\r\n");
        assert_eq!(positions(&a, &r), Ok(vec![1, 5]));
        // A key named twice is two arguments.
        let r = Bytes::from_static(b"*2\r\n$1\r\nk\r\n$1\r\nk\r\n");
        assert_eq!(positions(&a, &r), Ok(vec![1, 4]));
        let r = Bytes::from_static(b"*1\r\n$1\r\nz\r\n");
        assert!(positions(&a, &r)
            .unwrap_err()
            .contains("not one of its arguments"));
        let r = Bytes::from_static(b"*0\r\n");
        assert!(positions(&a, &r).unwrap_err().contains("no key"));
        let r = Bytes::from_static(b"-ERR Invalid command specified\r\n");
        assert!(positions(&a, &r).unwrap_err().contains("Invalid command"));
    }
}
