//! `DBSIZE` and `RANDOMKEY` on a connection to a node of an emulated cluster that owns some
//! slots but not all ([`Call::owned`]): counted and picked among the keys of its slots, which
//! no shard can say, by walking the shards with `SCAN` (see the parent module).

use rand::Rng;

use super::*;

/// One `SCAN cursor COUNT` [`COUNT_PAGE`] page of shard `s`: its next cursor and the keys of
/// `owned`'s slots, as the client names them (a hot key from its home shard only).
async fn owned_page(
    parts: &Parts,
    s: &Shard,
    cursor: u64,
    c: &Call,
    owned: (u32, u32),
    deadline: Instant,
) -> Result<(u64, Vec<Frame>), Answer> {
    let args = vec![
        Bytes::from_static(b"SCAN"),
        Bytes::from(cursor.to_string()),
        Bytes::from_static(b"COUNT"),
        Bytes::from_static(COUNT_PAGE.as_bytes()),
    ];
    let r = send(parts, s, args, c.flavor, c.conn, deadline).await;
    let frame = parse(&r, "SCAN", &parts.routing, s)?;
    let Some((next, items)) = scan_reply(frame) else {
        return Err(Err(unexpected("SCAN", &parts.routing, s)));
    };
    let mut keys = Vec::new();
    let filter = KeyFilter {
        routing: &parts.routing,
        local: None,
        owned: Some(owned),
    };
    filter.push(s, items, &mut keys);
    Ok((next, keys))
}

/// `DBSIZE` of a node that owns some slots: every shard walked at once, the keys of `owned`'s
/// slots counted, each page with the listener's `op_timeout`, the whole by `until`.
pub(super) fn count_owned(
    shards: Vec<Shard>,
    parts: &Parts,
    c: &Call,
    owned: (u32, u32),
    until: Instant,
) -> BoxReply {
    let parts = parts.clone();
    let c = *c;
    Box::pin(async move {
        let op = parts.listener.op_timeout;
        let parts = &parts;
        let walks = shards.iter().map(|s| async move {
            let (mut n, mut cursor) = (0i64, 0u64);
            loop {
                let now = Instant::now();
                if now >= until {
                    return Err(Err(Failure::message(format!(
                        "ERR respway: DBSIZE could not count the keys of this node's slots \
                         within {:?} (it walks every shard)",
                        COUNT_WALK.max(op)
                    ))));
                }
                let page = owned_page(parts, s, cursor, &c, owned, until.min(now + op));
                let (next, keys) = page.await?;
                n = n.saturating_add(keys.len() as i64);
                if next == 0 {
                    return Ok(n);
                }
                cursor = next;
            }
        });
        match futures_util::future::try_join_all(walks).await {
            Ok(counts) => Ok(Frame::Integer(counts.iter().sum()).to_bytes()),
            Err(e) => e,
        }
    })
}

/// `RANDOMKEY` of a node that owns some slots: random shards' `RANDOMKEY` until one is of
/// `owned`'s slots, at most [`RANDOM_TRIES`] times; then, from a random shard on, a random key
/// of the first page that holds one; nil when none does.
pub(super) fn random_owned_key(
    args: Vec<Bytes>,
    shards: Vec<Shard>,
    parts: &Parts,
    c: &Call,
    owned: (u32, u32),
) -> BoxReply {
    let parts = parts.clone();
    let c = *c;
    Box::pin(async move {
        let routing = &parts.routing;
        let nil = || Ok(Frame::null(c.flavor.resp3).to_bytes());
        let mut empty = vec![false; shards.len()];
        for _ in 0..RANDOM_TRIES {
            let left: Vec<usize> = (0..shards.len()).filter(|&i| !empty[i]).collect();
            if left.is_empty() {
                return nil();
            }
            let i = left[rand::rng().random_range(0..left.len())];
            let s = &shards[i];
            let r = send(&parts, s, args.clone(), c.flavor, c.conn, c.deadline).await;
            match parse(&r, "RANDOMKEY", routing, s) {
                Ok(Frame::Null | Frame::Nil) => empty[i] = true,
                Ok(Frame::Bulk(key)) => {
                    let named = with_prefix(s.prefix.as_ref(), key);
                    if owns(owned, &named) {
                        return Ok(Frame::Bulk(named).to_bytes());
                    }
                }
                Ok(_) => return Err(unexpected("RANDOMKEY", routing, s)),
                Err(e) => return e,
            }
        }
        // Few keys (or none) are of the node's slots: walk for one.
        let start = rand::rng().random_range(0..shards.len());
        for k in 0..shards.len() {
            let i = (start + k) % shards.len();
            if empty[i] {
                continue;
            }
            let s = &shards[i];
            let mut cursor = 0;
            loop {
                let page = owned_page(&parts, s, cursor, &c, owned, c.deadline);
                let (next, mut keys) = match page.await {
                    Ok(page) => page,
                    Err(e) => return e,
                };
                if !keys.is_empty() {
                    let j = rand::rng().random_range(0..keys.len());
                    return Ok(keys.swap_remove(j).to_bytes());
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        nil()
    })
}
