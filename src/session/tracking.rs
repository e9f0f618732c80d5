//! The `CLIENT TRACKING`, `CLIENT CACHING`, `CLIENT TRACKINGINFO` and `CLIENT GETREDIR`
//! commands of a session, with Redis's checks and texts. What a tracking session is told
//! (its inbox, the announcements, the registry publishers look at) is the cache's
//! ([`crate::cache::near_cache::clients`]).

use bytes::{Bytes, BytesMut};
use respway_filters::request::{error_reply, Reply};
use respway_filters::resp::Frame;

use crate::cache::near_cache::clients::*;
use crate::session::state::SessionState;

fn ok() -> Reply {
    Bytes::from_static(b"+OK\r\n")
}

/// `CLIENT TRACKING on|off [REDIRECT id] [BCAST] [PREFIX p ...] [OPTIN] [OPTOUT] [NOLOOP]`,
/// with Redis's checks and texts, for RESP3 clients (respway announces on the client's own
/// connection: RESP2 and `REDIRECT` are refused).
pub(crate) fn tracking(args: &[Bytes], state: &mut SessionState) -> Reply {
    let on = match args[2].to_ascii_lowercase().as_slice() {
        b"on" => true,
        b"off" => false,
        _ => return error_reply("ERR syntax error"),
    };
    let mut opts = Options::default();
    let mut redirect = false;
    let mut i = 3;
    while i < args.len() {
        let more = i + 1 < args.len();
        match args[i].to_ascii_lowercase().as_slice() {
            b"redirect" if more => {
                if std::str::from_utf8(&args[i + 1])
                    .ok()
                    .and_then(|t| t.parse::<i64>().ok())
                    .is_none()
                {
                    return error_reply("ERR value is not an integer or out of range");
                }
                redirect = true;
                i += 1;
            }
            b"bcast" => opts.bcast = true,
            b"optin" => opts.optin = true,
            b"optout" => opts.optout = true,
            b"noloop" => opts.noloop = true,
            b"prefix" if more => {
                opts.prefixes.push(args[i + 1].clone());
                i += 1;
            }
            _ => return error_reply("ERR syntax error"),
        }
        i += 1;
    }
    if !on {
        state.tracking = None;
        return ok();
    }
    let old = state.tracking.as_ref().map(|t| &t.opts);
    if !opts.bcast && !opts.prefixes.is_empty() {
        return error_reply("ERR PREFIX option requires BCAST mode to be enabled");
    }
    if old.is_some_and(|o| o.bcast != opts.bcast) {
        return error_reply(
            "ERR You can't switch BCAST mode on/off before disabling tracking for this \
             client, and then re-enabling it with a different mode.",
        );
    }
    if opts.bcast && (opts.optin || opts.optout) {
        return error_reply("ERR OPTIN and OPTOUT are not compatible with BCAST");
    }
    if opts.optin && opts.optout {
        return error_reply("ERR You can't specify both OPTIN mode and OPTOUT mode");
    }
    if old.is_some_and(|o| (opts.optin && o.optout) || (opts.optout && o.optin)) {
        return error_reply(
            "ERR You can't switch OPTIN/OPTOUT mode before disabling tracking for this \
             client, and then re-enabling it with a different mode.",
        );
    }
    let have: &[Bytes] = old.map_or(&[], |o| &o.prefixes);
    for (n, p) in opts.prefixes.iter().enumerate() {
        let text = |b: &Bytes| String::from_utf8_lossy(b).into_owned();
        if let Some(q) = have.iter().find(|q| q != &p && overlap(p, q)) {
            return error_reply(&format!(
                "ERR Prefix '{}' overlaps with an existing prefix '{}'. Prefixes for a single \
                 client must not overlap.",
                text(p),
                text(q)
            ));
        }
        if let Some(q) = opts.prefixes[n + 1..].iter().find(|q| overlap(p, q)) {
            return error_reply(&format!(
                "ERR Prefix '{}' overlaps with another provided prefix '{}'. Prefixes for a \
                 single client must not overlap.",
                text(p),
                text(q)
            ));
        }
    }
    if redirect {
        return error_reply(
            "ERR respway: CLIENT TRACKING REDIRECT is not supported: respway sends \
             invalidations as RESP3 push messages on the client's own connection (HELLO 3, \
             then CLIENT TRACKING on)",
        );
    }
    if !state.resp3 {
        return error_reply(
            "ERR respway: CLIENT TRACKING needs RESP3 (HELLO 3): respway sends invalidations \
             as push messages on the client's own connection",
        );
    }
    match &mut state.tracking {
        Some(t) => t.update(opts),
        None => state.tracking = Some(ClientTracking::start(state.id, opts)),
    }
    ok()
}

/// True when one prefix starts the other.
fn overlap(a: &[u8], b: &[u8]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// `CLIENT CACHING yes|no`: whether the next command's keys are followed (`OPTIN`, `OPTOUT`).
pub(crate) fn caching(arg: &Bytes, state: &mut SessionState) -> Reply {
    const NOT_OPT: &str = "ERR CLIENT CACHING can be called only when the client is in \
                           tracking mode with OPTIN or OPTOUT mode enabled";
    let Some(t) = state
        .tracking
        .as_mut()
        .filter(|t| t.opts.optin || t.opts.optout)
    else {
        return error_reply(NOT_OPT);
    };
    match arg.to_ascii_lowercase().as_slice() {
        b"yes" if t.opts.optin => t.caching = Some(true),
        b"yes" => {
            return error_reply(
                "ERR CLIENT CACHING YES is only valid when tracking is enabled in OPTIN mode.",
            )
        }
        b"no" if t.opts.optout => t.caching = Some(false),
        b"no" => {
            return error_reply(
                "ERR CLIENT CACHING NO is only valid when tracking is enabled in OPTOUT mode.",
            )
        }
        _ => return error_reply("ERR syntax error"),
    }
    ok()
}

/// `CLIENT GETREDIR`: -1 without tracking, 0 with it (respway never redirects).
pub(crate) fn getredir(state: &SessionState) -> Reply {
    Bytes::from_static(if state.tracking.is_some() {
        b":0\r\n"
    } else {
        b":-1\r\n"
    })
}

/// `CLIENT TRACKINGINFO`: flags, redirect (-1 off, 0 none) and prefixes, as Redis gives them.
pub(crate) fn info(state: &SessionState) -> Reply {
    let resp3 = state.resp3;
    let s = |t: &'static str| Frame::Bulk(Bytes::from_static(t.as_bytes()));
    let (flags, redirect, prefixes) = match &state.tracking {
        None => (vec![s("off")], -1, Vec::new()),
        Some(t) => {
            let o = &t.opts;
            let mut f = vec![s("on")];
            for (set, name) in [
                (o.bcast, "bcast"),
                (o.optin, "optin"),
                (o.optout, "optout"),
                (t.caching == Some(true), "caching-yes"),
                (t.caching == Some(false), "caching-no"),
                (o.noloop, "noloop"),
            ] {
                if set {
                    f.push(s(name));
                }
            }
            (f, 0, o.prefixes.iter().cloned().map(Frame::Bulk).collect())
        }
    };
    let mut out = BytesMut::with_capacity(128);
    Frame::map(
        resp3,
        vec![
            (s("flags"), Frame::set(resp3, flags)),
            (s("redirect"), Frame::Integer(redirect)),
            (s("prefixes"), Frame::Array(prefixes)),
        ],
    )
    .encode(&mut out);
    out.freeze()
}
