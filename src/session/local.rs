//! Commands the proxy answers itself: PING, ECHO, QUIT, SELECT, HELLO (2 and 3), CLIENT
//! SETNAME/GETNAME/ID/INFO/LIST/SETINFO/NO-EVICT/NO-TOUCH/TRACKING off, INFO (with a proxy
//! section; the keyspace section is summed over the shards by the session), AUTH (when a
//! downstream password or ACL users are configured), ACL WHOAMI/LIST/USERS, RESET,
//! READONLY/READWRITE and TIME (`CLUSTER` and `ASKING` of an emulating listener: in
//! `cluster_emulation.rs`). COMMAND is
//! forwarded to a shard (its reply describes the same Redis the command table came from).
//! Every reply is in the client's protocol (RESP2, or RESP3 after `HELLO 3`).

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use respway_filters::command::ProxyCommand;
use respway_filters::model::Listener;
use respway_filters::request::{error_reply, Reply};
use respway_filters::resp::{write_integer, Frame};

use crate::session::listener::ListenerCtx;
use crate::session::state::SessionState;
use crate::stack::acl::Acl;
use crate::stats;

/// What a local command does.
#[derive(Debug)]
pub(crate) enum Local {
    /// Answer.
    Reply(Reply),
    /// Answer, then close the connection (QUIT).
    ReplyAndClose(Reply),
    /// Answer `delay` late, reading nothing more meanwhile (a failed `AUTH` past the
    /// process's rate of failures), then close if `close`.
    Late {
        reply: Reply,
        delay: std::time::Duration,
        close: bool,
    },
    /// Send the command as it is to one shard and hand its reply on (COMMAND ...).
    Forward,
    /// INFO text of the proxy's sections; the session adds the shards' summed `# Keyspace`
    /// and encodes it.
    InfoWithKeyspace(String),
}

fn ok() -> Reply {
    Bytes::from_static(b"+OK\r\n")
}

fn bulk(b: &[u8]) -> Reply {
    let mut out = BytesMut::with_capacity(b.len() + 16);
    Frame::Bulk(Bytes::copy_from_slice(b)).encode(&mut out);
    out.freeze()
}

fn lower(b: &[u8]) -> Vec<u8> {
    b.to_ascii_lowercase()
}

/// `-ERR unknown command ...`, in Redis's words.
pub(crate) fn unknown_command(args: &[Bytes]) -> Reply {
    let mut msg = format!(
        "ERR unknown command '{}', with args beginning with: ",
        String::from_utf8_lossy(&args[0])
    );
    for a in args.iter().skip(1).take(8) {
        msg.push_str(&format!("'{}' ", String::from_utf8_lossy(a)));
    }
    error_reply(&msg)
}

/// True for the script and function calls whose keys are declared by a count.
pub(crate) fn is_script(name: &str) -> bool {
    matches!(
        name,
        "eval" | "evalsha" | "eval_ro" | "evalsha_ro" | "fcall" | "fcall_ro"
    )
}

/// Answers one locally served command.
pub(crate) fn handle(
    cmd: ProxyCommand,
    args: &[Bytes],
    state: &mut SessionState,
    ctx: &ListenerCtx,
    listener: &Listener,
    acl: Option<&Acl>,
    databases: u32,
) -> Local {
    let resp3 = state.resp3;
    let reply = match cmd {
        ProxyCommand::Ping => match args.len() {
            1 => Bytes::from_static(b"+PONG\r\n"),
            2 => bulk(&args[1]),
            _ => error_reply("ERR wrong number of arguments for 'ping' command"),
        },
        ProxyCommand::Echo => bulk(&args[1]),
        ProxyCommand::Quit => return Local::ReplyAndClose(ok()),
        ProxyCommand::Select => match std::str::from_utf8(&args[1]).ok().map(str::parse::<i64>) {
            Some(Ok(n)) if (0..i64::from(databases.min(256))).contains(&n) => {
                state.db = n as u8;
                ok()
            }
            Some(Ok(_)) => error_reply("ERR DB index is out of range"),
            _ => error_reply("ERR value is not an integer or out of range"),
        },
        ProxyCommand::Reset => {
            state.resp3 = false;
            state.db = 0;
            state.name = None;
            state.lib = (None, None);
            state.tracking = None;
            state.start_as_default(acl);
            Bytes::from_static(b"+RESET\r\n")
        }
        ProxyCommand::ReadMode => ok(),
        ProxyCommand::Slowlog => slowlog(args, ctx, listener),
        ProxyCommand::Latency => latency(args, ctx, listener, resp3),
        ProxyCommand::Time => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            let frame = Frame::Array(vec![
                Frame::Bulk(Bytes::from(now.as_secs().to_string())),
                Frame::Bulk(Bytes::from(now.subsec_micros().to_string())),
            ]);
            encode(&frame)
        }
        ProxyCommand::Auth => {
            let before = state.auth_failures;
            let r = auth(&args[1..], state, acl);
            return after_auth(r, before, state, ctx, listener);
        }
        ProxyCommand::Hello => {
            let before = state.auth_failures;
            let r = hello(args, state, listener, acl);
            return after_auth(r, before, state, ctx, listener);
        }
        ProxyCommand::Client => client(args, state),
        ProxyCommand::Command => return Local::Forward,
        ProxyCommand::Info => return info(args, ctx, listener, resp3),
    };
    Local::Reply(reply)
}

fn encode(f: &Frame) -> Reply {
    let mut out = BytesMut::new();
    f.encode(&mut out);
    out.freeze()
}

/// Counts a failed AUTH (`auth` counted it in `state` when the failures are above `before`),
/// and closes the connection after `max_auth_failures` of them.
fn after_auth(
    r: Reply,
    before: u32,
    state: &SessionState,
    ctx: &ListenerCtx,
    listener: &Listener,
) -> Local {
    if state.auth_failures == before {
        return Local::Reply(r);
    }
    ctx.stats.auth_failures.inc();
    let close = state.auth_failures >= listener.client.max_auth_failures;
    if close {
        tracing::warn!(
            client_id = state.id,
            failures = state.auth_failures,
            "too many failed AUTH attempts: connection closed"
        );
    }
    match ctx.auth_limiter.failed(std::time::Instant::now()) {
        Some(delay) => {
            if ctx.stats.auth_tarpitted.get() == 0 {
                tracing::warn!(
                    rate = crate::stack::acl::FAILURES_PER_SECOND,
                    delay_ms = delay.as_millis() as u64,
                    "failed AUTH attempts past the rate: their replies are delayed (tarpit)"
                );
            }
            ctx.stats.auth_tarpitted.inc();
            Local::Late {
                reply: r,
                delay,
                close,
            }
        }
        None if close => Local::ReplyAndClose(r),
        None => Local::Reply(r),
    }
}

/// `AUTH [user] password` against the listener's users (SHA-256 digests compared in
/// constant time).
fn auth(args: &[Bytes], state: &mut SessionState, acl: Option<&Acl>) -> Reply {
    let no_password = || {
        error_reply(
            "ERR AUTH <password> called without any password configured for the default user. \
             Are you sure your configuration is correct?",
        )
    };
    let Some(acl) = acl else {
        return no_password();
    };
    // AUTH password | AUTH user password
    let (user, pass) = match args {
        [p] => (None, p),
        [u, p] => (Some(&u[..]), p),
        _ => return error_reply("ERR syntax error"),
    };
    if user.is_none() && acl.implicit_default().is_some() {
        return no_password();
    }
    match acl.authenticate(user, pass) {
        Some(u) => {
            state.authenticated = true;
            state.set_user(Some(u));
            ok()
        }
        None => {
            state.auth_failures += 1;
            error_reply("WRONGPASS invalid username-password pair or user is disabled.")
        }
    }
}

/// `ACL WHOAMI | LIST | USERS` (users are defined in the configuration, so nothing else).
pub(crate) fn acl(args: &[Bytes], state: &SessionState, acl: Option<&Acl>) -> Reply {
    let sub = args.get(1).map(|a| lower(a)).unwrap_or_default();
    let lines = |v: Vec<String>| {
        encode(&Frame::Array(
            v.into_iter().map(|l| Frame::Bulk(Bytes::from(l))).collect(),
        ))
    };
    match (sub.as_slice(), args.len()) {
        (b"whoami", 2) => bulk(state.user_name().as_bytes()),
        (b"list", 2) => lines(match acl {
            Some(a) => a.list(),
            None => vec![crate::stack::acl::unrestricted_default_line()],
        }),
        (b"users", 2) => lines(match acl {
            Some(a) => a.names().iter().map(|n| n.to_string()).collect(),
            None => vec!["default".to_string()],
        }),
        _ => error_reply(&format!(
            "ERR respway: ACL {} is not supported: users are defined in respway's configuration \
             (ACL WHOAMI, ACL LIST and ACL USERS are answered)",
            String::from_utf8_lossy(&sub).to_ascii_uppercase()
        )),
    }
}

fn hello(
    args: &[Bytes],
    state: &mut SessionState,
    listener: &Listener,
    acl: Option<&Acl>,
) -> Reply {
    use respway_filters::model::ProtocolMode;
    let mut i = 1;
    let mut proto = if state.resp3 { 3 } else { 2 };
    if let Some(v) = args.get(1) {
        match std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
        {
            Some(v @ (2 | 3)) => {
                let allowed = match listener.resp.protocol {
                    ProtocolMode::Auto => true,
                    ProtocolMode::Resp2 => v == 2,
                    ProtocolMode::Resp3 => v == 3,
                };
                if !allowed {
                    return error_reply(
                        "NOPROTO sorry, this protocol version is not supported by this listener.",
                    );
                }
                proto = v;
                i = 2;
            }
            Some(_) => {
                return error_reply("NOPROTO sorry, this protocol version is not supported.")
            }
            None => return error_reply("ERR Protocol version is not an integer or out of range"),
        }
    }
    let mut name = None;
    while i < args.len() {
        match (lower(&args[i]).as_slice(), args.len() - i) {
            (b"auth", n) if n >= 3 => {
                let r = auth(&args[i + 1..i + 3], state, acl);
                if r.first() == Some(&b'-') {
                    return r;
                }
                i += 3;
            }
            (b"setname", n) if n >= 2 => {
                name = Some(args[i + 1].clone());
                i += 2;
            }
            _ => {
                return error_reply(&format!(
                    "ERR Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(&args[i])
                ))
            }
        }
    }
    if !state.authenticated {
        return error_reply("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time");
    }
    if let Some(n) = name {
        state.name = (!n.is_empty()).then_some(n);
    }
    state.resp3 = proto == 3;
    let s = |v: &'static str| Frame::Bulk(Bytes::from_static(v.as_bytes()));
    encode(&Frame::map(
        state.resp3,
        vec![
            (s("server"), s("redis")),
            (
                s("version"),
                Frame::Bulk(Bytes::from(listener.resp.advertised_version.clone())),
            ),
            (s("proto"), Frame::Integer(proto)),
            (s("id"), Frame::Integer(state.id as i64)),
            (
                s("mode"),
                s(crate::session::cluster_emulation::mode(listener)),
            ),
            (s("role"), s("master")),
            (s("modules"), Frame::Array(vec![])),
        ],
    ))
}

/// `LATENCY HISTOGRAM [command ...]` from the per-command latency counters (power-of-two
/// µs buckets, cumulative, as Redis 7 reports them); `LATEST` (no events: respway runs no
/// latency monitor), `RESET` (0), `HELP`.
fn latency(args: &[Bytes], ctx: &ListenerCtx, listener: &Listener, resp3: bool) -> Reply {
    let sub = lower(&args[1]);
    let b = |s: &str| Frame::Bulk(Bytes::from(s.to_string()));
    match sub.as_slice() {
        b"histogram" => {
            let wanted: Vec<Vec<u8>> = args[2..].iter().map(|a| lower(a)).collect();
            let cmds = ctx.registry.command_totals(Some(&listener.name));
            let mut out = Vec::new();
            for c in cmds {
                if !wanted.is_empty() && !wanted.iter().any(|w| w == c.name.as_bytes()) {
                    continue;
                }
                let mut buckets = Vec::new();
                let mut cum = 0;
                let mut i = 0;
                for p in 0..40u32 {
                    let edge = 1u64 << p;
                    while i < c.hist.len() && stats::bucket_upper_us(i) < edge {
                        cum += c.hist[i];
                        i += 1;
                    }
                    if cum > 0 {
                        buckets.push((Frame::Integer(edge as i64), Frame::Integer(cum as i64)));
                    }
                    if cum == c.calls {
                        break;
                    }
                }
                out.push((
                    b(c.name),
                    Frame::map(
                        resp3,
                        vec![
                            (b("calls"), Frame::Integer(c.calls as i64)),
                            (b("histogram_usec"), Frame::map(resp3, buckets)),
                        ],
                    ),
                ));
            }
            encode(&Frame::map(resp3, out))
        }
        b"latest" if args.len() == 2 => Bytes::from_static(b"*0\r\n"),
        b"reset" => Bytes::from_static(b":0\r\n"),
        b"help" if args.len() == 2 => encode(&Frame::Array(
            [
                "LATENCY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "HISTOGRAM [COMMAND ...]",
                "    Return a cumulative distribution of latencies in the format of a histogram for the specified command names.",
                "LATEST",
                "    Return the latest latency samples (respway runs no latency monitor: none).",
                "RESET",
                "    Reset latency data (respway: nothing to reset).",
            ]
            .iter()
            .map(|l| Frame::Simple(Bytes::from_static(l.as_bytes())))
            .collect(),
        )),
        _ => error_reply(&format!(
            "ERR command 'latency|{}' is not supported by respway",
            String::from_utf8_lossy(&sub)
        )),
    }
}

/// When the process started (for INFO's uptime), and its run id.
static STARTED: std::sync::OnceLock<(std::time::Instant, String)> = std::sync::OnceLock::new();

/// Records the process start (called when the data plane starts).
pub(crate) fn mark_start() {
    STARTED.get_or_init(|| {
        // 40 random hex digits, from the standard library's randomly seeded hasher.
        use std::hash::{BuildHasher, Hasher};
        let part = |i: u64| {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(i);
            h.finish()
        };
        let id = format!("{:016x}{:016x}{:08x}", part(1), part(2), part(3) as u32);
        (std::time::Instant::now(), id)
    });
}

/// `SLOWLOG GET [count] | LEN | RESET | HELP`, over every worker's log of this listener.
fn slowlog(args: &[Bytes], ctx: &ListenerCtx, listener: &Listener) -> Reply {
    let sub = lower(&args[1]);
    let r = &ctx.registry;
    match (sub.as_slice(), args.len()) {
        (b"get", 2 | 3) => {
            let count = match args.get(2).map(|a| {
                std::str::from_utf8(a)
                    .ok()
                    .and_then(|s| s.parse::<i64>().ok())
            }) {
                None => 10,
                Some(Some(n)) if n >= -1 => n,
                Some(_) => return error_reply("ERR count should be greater than or equal to -1"),
            };
            let n = if count < 0 {
                usize::MAX
            } else {
                count as usize
            };
            let frames = r
                .slowlog(&listener.name, n)
                .into_iter()
                .map(|e| {
                    Frame::Array(vec![
                        Frame::Integer(e.id as i64),
                        Frame::Integer(e.time as i64),
                        Frame::Integer(e.duration_us as i64),
                        Frame::Array(e.args.into_iter().map(Frame::Bulk).collect()),
                        Frame::Bulk(Bytes::from(
                            e.client.map(|a| a.to_string()).unwrap_or_default(),
                        )),
                        Frame::Bulk(e.name.unwrap_or_default()),
                    ])
                })
                .collect();
            encode(&Frame::Array(frames))
        }
        (b"len", 2) => {
            let mut out = BytesMut::with_capacity(24);
            write_integer(&mut out, b':', r.slowlog_len(&listener.name) as i64);
            out.freeze()
        }
        (b"reset", 2) => {
            r.slowlog_reset(&listener.name);
            ok()
        }
        (b"help", 2) => encode(&Frame::Array(
            [
                "SLOWLOG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "GET [<count>]",
                "    Return top <count> entries from the slowlog (default: 10, -1 mean all).",
                "    Entries are made of:",
                "    id, timestamp, time in microseconds, arguments array, client IP and port,",
                "    client name",
                "LEN",
                "    Return the length of the slowlog.",
                "RESET",
                "    Reset the slowlog.",
            ]
            .iter()
            .map(|l| Frame::Simple(Bytes::from_static(l.as_bytes())))
            .collect(),
        )),
        _ => error_reply(&format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'. Try SLOWLOG HELP.",
            String::from_utf8_lossy(&args[1])
        )),
    }
}

/// This client's `CLIENT INFO` / `CLIENT LIST` line (the fields clients and tools read).
fn client_line(state: &SessionState) -> String {
    fn text(b: &Option<Bytes>) -> String {
        b.as_deref()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    }
    format!(
        "id={} name={} db={} resp={} lib-name={} lib-ver={}\n",
        state.id,
        text(&state.name),
        state.db,
        if state.resp3 { 3 } else { 2 },
        text(&state.lib.0),
        text(&state.lib.1),
    )
}

fn client(args: &[Bytes], state: &mut SessionState) -> Reply {
    let sub = lower(&args[1]);
    match (sub.as_slice(), args.len()) {
        (b"setname", 3) => {
            if args[2].iter().any(|&b| b == b' ' || b == b'\n') {
                return error_reply(
                    "ERR Client names cannot contain spaces, newlines or special characters.",
                );
            }
            state.name = if args[2].is_empty() {
                None
            } else {
                Some(args[2].clone())
            };
            ok()
        }
        (b"getname", 2) => match &state.name {
            Some(n) => bulk(n),
            None => encode(&Frame::null(state.resp3)),
        },
        (b"info", 2) => encode(&Frame::text(state.resp3, client_line(state).as_bytes())),
        // The sidecar's view: this client (other sessions live on other workers' tasks).
        (b"list", 2) => encode(&Frame::text(state.resp3, client_line(state).as_bytes())),
        (b"no-evict" | b"no-touch", 3) => match lower(&args[2]).as_slice() {
            b"on" | b"off" => ok(),
            _ => error_reply("ERR syntax error"),
        },
        (b"tracking", n) if n >= 3 => crate::session::tracking::tracking(args, state),
        (b"caching", 3) => crate::session::tracking::caching(&args[2], state),
        (b"trackinginfo", 2) => crate::session::tracking::info(state),
        (b"getredir", 2) => crate::session::tracking::getredir(state),
        (b"id", 2) => {
            let mut out = BytesMut::with_capacity(24);
            write_integer(&mut out, b':', state.id as i64);
            out.freeze()
        }
        // Client libraries announce themselves (shown by CLIENT INFO).
        (b"setinfo", 4) => match lower(&args[2]).as_slice() {
            b"lib-name" => {
                state.lib.0 = Some(args[3].clone());
                ok()
            }
            b"lib-ver" => {
                state.lib.1 = Some(args[3].clone());
                ok()
            }
            _ => error_reply(&format!(
                "ERR Unrecognized option '{}'",
                String::from_utf8_lossy(&args[2])
            )),
        },
        // A subcommand the advertised Redis does not know (CLIENT MAINT_NOTIFICATIONS, sent
        // on connect by redis-py 8.1 and node-redis 6.3) gets that Redis's own answer: the
        // clients then go on without maintenance notifications, which respway never pushes.
        _ if respway_filters::command::lookup(b"client")
            .and_then(|c| c.subcommand(&args[1]))
            .is_none() =>
        {
            error_reply(&format!(
                "ERR unknown subcommand '{}'. Try CLIENT HELP.",
                // Redis shows at most 128 bytes of it.
                String::from_utf8_lossy(&args[1][..args[1].len().min(128)])
            ))
        }
        _ => error_reply(&format!(
            "ERR command 'client|{}' is not supported by respway",
            String::from_utf8_lossy(&sub)
        )),
    }
}

/// `# Mirror` (copies per receiving cluster), `# Nearcache` (per cluster with a near cache)
/// and `# Hotkeys` (per rule), summed over workers and over every configuration served (a
/// push does not reset them).
fn info_filters(
    s: &mut String,
    ctx: &ListenerCtx,
    listener: &Listener,
    wants: &dyn Fn(&str) -> bool,
) {
    let Some(index) = ctx.registry.listener_index(&listener.name) else {
        return;
    };
    if wants("mirror") {
        s.push_str("# Mirror\r\n");
        for (name, c) in ctx.registry.mirror_totals(index) {
            if c.mirrored + c.dropped + c.failed + c.moved + c.absent + c.move_failed == 0 {
                continue;
            }
            s.push_str(&format!(
                "mirror_{name}:mirrored={},dropped={},failed={},moved={},absent={},move_failed={},applied={}\r\n",
                c.mirrored, c.dropped, c.failed, c.moved, c.absent, c.move_failed, c.applied
            ));
        }
    }
    if wants("nearcache") {
        info_near_cache(s, ctx);
    }
    if wants("hotkeys") {
        s.push_str("# Hotkeys\r\n");
        for r in ctx.registry.hot_key_rule_totals(index) {
            let reads: Vec<String> = r.reads_per_shard.iter().map(u64::to_string).collect();
            let copy = ctx.registry.copy_progress(&r.cluster, &r.prefix);
            s.push_str(&format!(
                "hotkey_{}_{}:fanned_out_writes={},partial_failures={},reads_per_shard={},read_fallbacks={},copy_retries={},copies_dropped={},copy={},copied_keys={}\r\n",
                r.cluster,
                r.prefix,
                r.fanned_out_writes,
                r.partial_failures,
                reads.join("/"),
                r.read_fallbacks,
                r.copy_retries,
                r.copies_dropped,
                copy.as_ref().map_or("none", |p| p.state.name()),
                copy.as_ref().map_or(0, |p| p.keys),
            ));
            if let Some(p) = copy.filter(|p| !p.error.is_empty()) {
                s.push_str(&format!(
                    "hotkey_{}_{}_copy_error:{}\r\n",
                    r.cluster,
                    r.prefix,
                    p.error.replace(['\r', '\n'], " ")
                ));
            }
        }
    }
}

/// `INFO nearcache`: per cluster with a near cache, its counters summed over workers.
fn info_near_cache(s: &mut String, ctx: &ListenerCtx) {
    s.push_str("# Nearcache\r\n");
    let parts = ctx.slot.parts.load();
    let clusters: Vec<&str> = parts
        .routing
        .clusters
        .iter()
        .zip(parts.caches.iter())
        .filter(|(_, cache)| cache.is_some())
        .map(|(c, _)| c.name.as_str())
        .collect();
    for (name, t) in ctx.registry.cache_totals(&clusters) {
        let fields: Vec<String> = t
            .fields()
            .iter()
            .map(|(n, v, _)| format!("{n}={v}"))
            .collect();
        s.push_str(&format!("nearcache_{name}:{}\r\n", fields.join(",")));
    }
}

fn info(args: &[Bytes], ctx: &ListenerCtx, listener: &Listener, resp3: bool) -> Local {
    // INFO [section ...]: `server`, `proxy`, `mirror`, `nearcache` and `hotkeys` exist; no argument, all,
    // default or everything give them all; any other section is empty, as in Redis.
    let wants = |name: &str| {
        args.len() == 1
            || args[1..].iter().any(|a| {
                let a = lower(a);
                a == name.as_bytes() || matches!(&a[..], b"all" | b"default" | b"everything")
            })
    };
    let mut s = String::with_capacity(512);
    if wants("server") {
        s.push_str(&format!(
            "# Server\r\nredis_version:{}\r\nredis_mode:{}\r\n",
            listener.resp.advertised_version,
            crate::session::cluster_emulation::mode(listener)
        ));
        s.push_str(&format!("process_id:{}\r\n", std::process::id()));
        mark_start();
        if let Some((t, id)) = STARTED.get() {
            s.push_str(&format!("run_id:{id}\r\n"));
            s.push_str(&format!("tcp_port:{}\r\n", listener.address.port()));
            let up = t.elapsed().as_secs();
            s.push_str(&format!(
                "uptime_in_seconds:{up}\r\nuptime_in_days:{}\r\n",
                up / 86400
            ));
        }
    }
    // The fields monitoring tools (redis_exporter, ...) read, from the proxy's own counters:
    // the listener's here, the whole process's in `# Proxy`; both written from the table of
    // metric families, so INFO and /metrics name one quantity from one definition.
    for (section, title) in [("clients", "# Clients\r\n"), ("stats", "# Stats\r\n")] {
        if wants(section) {
            let p = stats::Process {
                totals: ctx.registry.listener_totals(&listener.name),
                ..Default::default()
            };
            s.push_str(title);
            stats::write_info(&mut s, section, &p);
        }
    }
    if wants("replication") {
        s.push_str("# Replication\r\nrole:master\r\nconnected_slaves:0\r\n");
    }
    // Only an emulating listener says it is a cluster (as a cluster node's INFO does).
    if wants("cluster") && listener.cluster_emulation.is_some() {
        s.push_str("# Cluster\r\ncluster_enabled:1\r\n");
    }
    if wants("proxy") {
        s.push_str("# Proxy\r\nproxy:respway\r\n");
        s.push_str(&format!(
            "respway_version:{}\r\n",
            env!("CARGO_PKG_VERSION")
        ));
        s.push_str(&format!("listener:{}\r\n", listener.name));
        let p = stats::Process {
            workers: ctx.workers as u64,
            config_version: ctx.slot.parts.load().config_version,
            totals: ctx.registry.totals(),
            upstream: ctx.registry.upstream_totals(),
        };
        stats::write_info(&mut s, "proxy", &p);
    }
    info_filters(&mut s, ctx, listener, &wants);
    // Not in the default sections (as in Redis): only when named, or with all / everything.
    let named = |name: &str| {
        args[1..].iter().any(|a| {
            let a = lower(a);
            a == name.as_bytes() || matches!(&a[..], b"all" | b"everything")
        })
    };
    if named("commandstats") || named("latencystats") {
        let cmds = ctx.registry.command_totals(Some(&listener.name));
        if named("commandstats") {
            s.push_str("# Commandstats\r\n");
            for c in &cmds {
                s.push_str(&format!(
                    "cmdstat_{}:calls={},usec={},usec_per_call={:.2},rejected_calls=0,failed_calls={}\r\n",
                    c.name,
                    c.calls,
                    c.usec,
                    c.usec as f64 / c.calls.max(1) as f64,
                    c.failed
                ));
            }
        }
        if named("latencystats") {
            s.push_str("# Latencystats\r\n");
            for c in &cmds {
                s.push_str(&format!(
                    "latency_percentiles_usec_{}:p50={:.3},p99={:.3},p99.9={:.3}\r\n",
                    c.name,
                    c.percentile_us(0.5) as f64,
                    c.percentile_us(0.99) as f64,
                    c.percentile_us(0.999) as f64
                ));
            }
        }
    }
    if wants("keyspace") {
        return Local::InfoWithKeyspace(s);
    }
    Local::Reply(encode(&Frame::text(resp3, s.as_bytes())))
}
