//! Commands the proxy answers itself: PING, ECHO, QUIT, SELECT 0, HELLO 2, COMMAND,
//! CLIENT SETNAME/GETNAME/ID, INFO (with a proxy section), AUTH (when a downstream password is
//! configured) and TIME.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use respway_filters::command::{self, ProxyCommand};
use respway_filters::hot_key::HotKeyRuleStats;
use respway_filters::mirror::MirrorCounts;
use respway_filters::model::Listener;
use respway_filters::request::{error_reply, Reply};
use respway_filters::resp::{write_integer, Frame};

use crate::conn::ListenerCtx;

static NEXT_CLIENT_ID: AtomicU64 = AtomicU64::new(1);

/// Per-connection state the local commands read and change.
#[derive(Debug)]
pub struct SessionState {
    /// AUTH done, or no password configured.
    pub authenticated: bool,
    /// CLIENT SETNAME.
    pub name: Option<Bytes>,
    /// CLIENT ID (taken once per connection, not per request).
    pub id: u64,
    /// Failed AUTH attempts on this connection.
    pub auth_failures: u32,
    /// A MULTI was refused: every command up to EXEC/DISCARD is refused and not forwarded, so
    /// a client's transaction never runs piecemeal outside one.
    pub refused_multi: bool,
}

impl SessionState {
    /// State of a new connection.
    pub fn new(authenticated: bool) -> Self {
        SessionState {
            authenticated,
            name: None,
            id: NEXT_CLIENT_ID.fetch_add(1, Ordering::Relaxed),
            refused_multi: false,
            auth_failures: 0,
        }
    }
}

/// What a local command does.
#[derive(Debug)]
pub enum Local {
    /// Answer.
    Reply(Reply),
    /// Answer, then close the connection (QUIT).
    ReplyAndClose(Reply),
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
pub fn unknown_command(args: &[Bytes]) -> Reply {
    let mut msg = format!(
        "ERR unknown command '{}', with args beginning with: ",
        String::from_utf8_lossy(&args[0])
    );
    for a in args.iter().skip(1).take(8) {
        msg.push_str(&format!("'{}' ", String::from_utf8_lossy(a)));
    }
    error_reply(&msg)
}

/// Inside a refused MULTI (see [`SessionState::refused_multi`]): the reply for `cmd`, or
/// `None` for commands handled as usual (QUIT, RESET).
pub fn in_refused_multi(name: &str, state: &mut SessionState) -> Option<Reply> {
    Some(match name {
        "exec" => {
            state.refused_multi = false;
            error_reply("EXECABORT Transaction discarded because of previous errors.")
        }
        "discard" => {
            state.refused_multi = false;
            ok()
        }
        "multi" => error_reply("ERR MULTI calls can not be nested"),
        "watch" => error_reply("ERR WATCH inside MULTI is not allowed"),
        "quit" => return None,
        "reset" => {
            state.refused_multi = false;
            return None;
        }
        _ => error_reply(
            "ERR respway: transactions are not supported: command not run, the MULTI before \
             it was refused (EXEC will abort)",
        ),
    })
}

/// True for the script and function calls whose keys are declared by a count.
pub fn is_script(name: &str) -> bool {
    matches!(
        name,
        "eval" | "evalsha" | "eval_ro" | "evalsha_ro" | "fcall" | "fcall_ro"
    )
}

/// Answers one locally served command.
pub fn handle(
    cmd: ProxyCommand,
    args: &[Bytes],
    state: &mut SessionState,
    ctx: &ListenerCtx,
    listener: &Listener,
) -> Local {
    let reply = match cmd {
        ProxyCommand::Ping => match args.len() {
            1 => Bytes::from_static(b"+PONG\r\n"),
            _ => bulk(&args[1]),
        },
        ProxyCommand::Echo => bulk(&args[1]),
        ProxyCommand::Quit => return Local::ReplyAndClose(ok()),
        ProxyCommand::Select => match std::str::from_utf8(&args[1]).ok().map(str::parse::<i64>) {
            Some(Ok(0)) => ok(),
            Some(Ok(_)) => error_reply("ERR DB index is out of range"),
            _ => error_reply("ERR value is not an integer or out of range"),
        },
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
            let r = auth(&args[1..], state, listener);
            return after_auth(r, before, state, ctx, listener);
        }
        ProxyCommand::Hello => {
            let before = state.auth_failures;
            let r = hello(args, state, listener);
            return after_auth(r, before, state, ctx, listener);
        }
        ProxyCommand::Client => client(args, state),
        ProxyCommand::Command => command_reply(args),
        ProxyCommand::Info => info(args, ctx, listener),
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
    if state.auth_failures >= listener.client.max_auth_failures {
        tracing::warn!(
            client_id = state.id,
            failures = state.auth_failures,
            "too many failed AUTH attempts: connection closed"
        );
        return Local::ReplyAndClose(r);
    }
    Local::Reply(r)
}

/// Compares in time that depends only on the lengths, not on where the bytes differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u64;
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= u64::from(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

fn auth(args: &[Bytes], state: &mut SessionState, listener: &Listener) -> Reply {
    let Some(expected) = listener.downstream_password.as_deref() else {
        return error_reply(
            "ERR AUTH <password> called without any password configured for the default user. \
             Are you sure your configuration is correct?",
        );
    };
    // AUTH password | AUTH default password
    let (user, pass) = match args {
        [p] => (None, p),
        [u, p] => (Some(u), p),
        _ => return error_reply("ERR syntax error"),
    };
    let user_ok = user.is_none_or(|u| &u[..] == b"default");
    let pass_ok = constant_time_eq(pass, expected.as_bytes());
    if user_ok && pass_ok {
        state.authenticated = true;
        ok()
    } else {
        state.auth_failures += 1;
        error_reply("WRONGPASS invalid username-password pair or user is disabled.")
    }
}

fn hello(args: &[Bytes], state: &mut SessionState, listener: &Listener) -> Reply {
    let mut i = 1;
    if let Some(v) = args.get(1) {
        match std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
        {
            Some(2) => i = 2,
            Some(_) => {
                return error_reply("NOPROTO sorry, this protocol version is not supported.")
            }
            None => return error_reply("ERR Protocol version is not an integer or out of range"),
        }
    }
    while i < args.len() {
        match (lower(&args[i]).as_slice(), args.len() - i) {
            (b"auth", n) if n >= 3 => {
                let r = auth(&args[i + 1..i + 3], state, listener);
                if r.first() == Some(&b'-') {
                    return r;
                }
                i += 3;
            }
            (b"setname", n) if n >= 2 => {
                state.name = Some(args[i + 1].clone());
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
    let s = |v: &'static str| Frame::Bulk(Bytes::from_static(v.as_bytes()));
    encode(&Frame::Array(vec![
        s("server"),
        s("respway"),
        s("version"),
        s(env!("CARGO_PKG_VERSION")),
        s("proto"),
        Frame::Integer(2),
        s("id"),
        Frame::Integer(state.id as i64),
        s("mode"),
        s("standalone"),
        s("role"),
        s("master"),
        s("modules"),
        Frame::Array(vec![]),
    ]))
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
            None => Bytes::from_static(b"$-1\r\n"),
        },
        (b"id", 2) => {
            let mut out = BytesMut::with_capacity(24);
            write_integer(&mut out, b':', state.id as i64);
            out.freeze()
        }
        // Client libraries announce themselves; accept and ignore.
        (b"setinfo", 4) => ok(),
        _ => error_reply(&format!(
            "ERR command 'client|{}' is not supported by respway",
            String::from_utf8_lossy(&sub)
        )),
    }
}

fn command_entry(c: &command::CommandInfo) -> Frame {
    let (first, last, step) = c.legacy_range;
    Frame::Array(vec![
        Frame::Bulk(Bytes::from_static(c.name.as_bytes())),
        Frame::Integer(c.arity as i64),
        Frame::Array(
            c.flag_names
                .iter()
                .map(|f| Frame::Simple(Bytes::from_static(f.as_bytes())))
                .collect(),
        ),
        Frame::Integer(first as i64),
        Frame::Integer(last as i64),
        Frame::Integer(step as i64),
    ])
}

fn command_reply(args: &[Bytes]) -> Reply {
    let sub = args.get(1).map(|a| lower(a));
    match sub.as_deref() {
        None => encode(&Frame::Array(
            command::all().iter().map(command_entry).collect(),
        )),
        Some(b"count") => {
            let mut out = BytesMut::new();
            write_integer(&mut out, b':', command::all().len() as i64);
            out.freeze()
        }
        Some(b"info") => encode(&Frame::Array(
            args[2..]
                .iter()
                .map(|n| match command::lookup(n) {
                    Some(c) => command_entry(c),
                    None => Frame::NullArray,
                })
                .collect(),
        )),
        // redis-cli asks for docs to show hints; we have none to give.
        Some(b"docs") => Bytes::from_static(b"*0\r\n"),
        Some(other) => error_reply(&format!(
            "ERR command 'command|{}' is not supported by respway",
            String::from_utf8_lossy(other)
        )),
    }
}

/// `# Mirror` (copies per receiving cluster) and `# Hotkeys` (per rule) sections, summed over
/// workers, for the current configuration.
fn info_filters(
    s: &mut String,
    ctx: &ListenerCtx,
    _listener: &Listener,
    wants: &dyn Fn(&str) -> bool,
) {
    let filters = ctx.registry.filters();
    let routing = ctx.slot.parts.load().routing.clone();
    if wants("mirror") {
        let snaps: Vec<Vec<MirrorCounts>> = filters.iter().map(|(m, _)| m.snapshot()).collect();
        let sum = MirrorCounts::sum(snaps.iter().map(Vec::as_slice));
        s.push_str("# Mirror\r\n");
        for (i, c) in sum.iter().enumerate() {
            if c.mirrored + c.dropped + c.failed == 0 {
                continue;
            }
            let name = routing
                .clusters
                .get(i)
                .map(|c| c.name.as_str())
                .unwrap_or("?");
            s.push_str(&format!(
                "mirror_{name}:mirrored={},dropped={},failed={}\r\n",
                c.mirrored, c.dropped, c.failed
            ));
        }
    }
    if wants("hotkeys") {
        let snaps: Vec<Vec<HotKeyRuleStats>> = filters.iter().map(|(_, h)| h.snapshot()).collect();
        s.push_str("# Hotkeys\r\n");
        for r in HotKeyRuleStats::sum(snaps.iter().map(Vec::as_slice)) {
            let reads: Vec<String> = r.reads_per_shard.iter().map(u64::to_string).collect();
            s.push_str(&format!(
                "hotkey_{}_{}:fanned_out_writes={},partial_failures={},reads_per_shard={}\r\n",
                r.cluster,
                r.prefix,
                r.fanned_out_writes,
                r.partial_failures,
                reads.join("/")
            ));
        }
    }
}

fn info(args: &[Bytes], ctx: &ListenerCtx, listener: &Listener) -> Reply {
    // INFO [section ...]: `server`, `proxy`, `mirror` and `hotkeys` exist; no argument, all,
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
        s.push_str("# Server\r\nredis_version:7.0.0\r\nredis_mode:standalone\r\n");
    }
    if wants("proxy") {
        let t = ctx.registry.totals();
        s.push_str("# Proxy\r\nproxy:respway\r\n");
        s.push_str(&format!(
            "respway_version:{}\r\n",
            env!("CARGO_PKG_VERSION")
        ));
        s.push_str(&format!("listener:{}\r\n", listener.name));
        s.push_str(&format!(
            "config_version:{}\r\n",
            ctx.slot.version.load(std::sync::atomic::Ordering::Relaxed) + 1
        ));
        s.push_str(&format!("workers:{}\r\n", ctx.workers));
        s.push_str(&format!("connected_clients:{}\r\n", t.active));
        s.push_str(&format!("total_connections_received:{}\r\n", t.connections));
        s.push_str(&format!("total_commands_processed:{}\r\n", t.commands));
        s.push_str(&format!("protocol_errors:{}\r\n", t.protocol_errors));
        s.push_str(&format!("unsupported_commands:{}\r\n", t.unsupported));
        s.push_str(&format!("upstream_timeouts:{}\r\n", t.timeouts));
        s.push_str(&format!(
            "client_output_buffer_limit_disconnections:{}\r\n",
            t.output_limit_closes
        ));
        s.push_str(&format!("auth_failures:{}\r\n", t.auth_failures));
        let u = ctx.registry.upstream_totals();
        for (kind, n) in &u.errors {
            s.push_str(&format!("upstream_errors_{}:{n}\r\n", kind.name()));
        }
        s.push_str(&format!("upstream_connects:{}\r\n", u.connects));
        s.push_str(&format!(
            "upstream_connect_failures:{}\r\n",
            u.connect_failures
        ));
        s.push_str(&format!("upstream_stuck_connections:{}\r\n", u.stuck));
        s.push_str(&format!(
            "upstream_protocol_errors:{}\r\n",
            u.protocol_errors
        ));
    }
    info_filters(&mut s, ctx, listener, &wants);
    bulk(s.as_bytes())
}
