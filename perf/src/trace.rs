//! Recorded traffic: `redis-cli MONITOR` captures and respway's own trace format.
//!
//! Both become a [`Trace`]: commands in arrival order, each with its offset from the first
//! one, the client that sent it and the database it ran in. Replay ([`crate::replay`]) keeps
//! each client's commands in order on one connection and can keep their timing.
//!
//! ## `MONITOR` output
//!
//! ```text
//! OK
//! 1700000000.123456 [0 127.0.0.1:54321] "SET" "user:1" "\x00\xffhello"
//! 1700000000.123789 [2 lua] "incr" "ctr"
//! ```
//!
//! The first line (`OK`, printed by `redis-cli` itself) and anything else that does not look
//! like a command line are skipped and counted. Commands run by Lua scripts (`[db lua]`) are
//! skipped by default: replaying the `EVAL` already runs them.
//!
//! ## respway trace format (`respway-trace v1`)
//!
//! A text file, one command per line, with `#` comment lines; the first line is the header:
//!
//! ```text
//! # respway-trace v1
//! # offset_us client db args...
//! 0 0 0 "SET" "user:1" "\x00\xffhello"
//! 333 1 0 "GET" "user:1"
//! ```
//!
//! `offset_us` is microseconds since the first command, `client` a small integer naming the
//! connection, `db` the database; arguments are quoted the way `MONITOR` quotes them
//! ([`crate::quote`]). `respway-perf record` writes it from a live `MONITOR` stream,
//! `respway-perf convert` from a `MONITOR` capture and `respway-perf generate` from a workload.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, BufRead, Write};
use std::path::Path;

use crate::quote::{split_args, write_quoted};
use crate::Error;

/// The header line that starts a respway trace file.
pub const TRACE_HEADER: &str = "# respway-trace v1";

/// Commands never replayed: they change the connection's protocol (subscriptions,
/// replication, `MONITOR`) or end it. Counted as skipped.
pub const NEVER_REPLAYED: &[&str] = &[
    "monitor",
    "subscribe",
    "psubscribe",
    "ssubscribe",
    "unsubscribe",
    "punsubscribe",
    "sunsubscribe",
    "sync",
    "psync",
    "replconf",
    "replicaof",
    "slaveof",
    "shutdown",
    "quit",
    "reset",
    "hello",
    "auth",
    "failover",
];

/// One recorded command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Microseconds since the trace's first command.
    pub offset_us: u64,
    /// The client (connection) that sent it, numbered from 0 in order of first appearance.
    pub client: u32,
    /// The database it ran in.
    pub db: u32,
    /// The command and its arguments.
    pub args: Vec<Vec<u8>>,
}

/// A recorded run of commands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    /// The commands, by offset (ties keep file order).
    pub events: Vec<Event>,
    /// How many distinct clients sent them.
    pub clients: u32,
    /// Lines or commands left out, by reason (`not a command line`, `lua`, `never replayed: sync`, ...).
    pub skipped: BTreeMap<String, u64>,
}

/// Which text format a capture is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// `redis-cli MONITOR` output.
    Monitor,
    /// respway's trace format.
    Trace,
}

/// Options for reading a capture.
#[derive(Debug, Clone)]
pub struct ReadOptions {
    /// Keep commands run by Lua scripts (`[db lua]`); off by default.
    pub include_lua: bool,
    /// Stop after this many commands.
    pub max_events: usize,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            include_lua: false,
            max_events: usize::MAX,
        }
    }
}

/// One parsed `MONITOR` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonitorLine {
    /// The Unix time Redis stamped the command with, in microseconds.
    pub unix_us: u64,
    /// The database.
    pub db: u32,
    /// `127.0.0.1:54321`, `lua`, `unix:/tmp/redis.sock`, ...
    pub client: String,
    /// The command and its arguments.
    pub args: Vec<Vec<u8>>,
}

/// Parses one `MONITOR` line (`1700000000.123456 [0 127.0.0.1:54321] "GET" "k"`). A leading
/// `+` (the raw RESP simple string) is accepted. Returns `Ok(None)` for a line that is not a
/// command line (`OK`, blank), an error for a command line that is malformed.
pub fn parse_monitor_line(line: &[u8]) -> Result<Option<MonitorLine>, String> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = line.strip_prefix(b"+").unwrap_or(line);
    let Some(sp) = line.iter().position(|&b| b == b' ') else {
        return Ok(None);
    };
    let (ts, rest) = line.split_at(sp);
    let Some(unix_us) = parse_timestamp(ts) else {
        return Ok(None);
    };
    let rest = &rest[1..];
    let Some(rest) = rest.strip_prefix(b"[") else {
        return Err("missing [db client] after the timestamp".into());
    };
    let Some(close) = rest.iter().position(|&b| b == b']') else {
        return Err("unterminated [db client]".into());
    };
    let inner = std::str::from_utf8(&rest[..close]).map_err(|_| "non-UTF-8 client field")?;
    let (db, client) = inner
        .split_once(' ')
        .ok_or("missing client in [db client]")?;
    let db: u32 = db.parse().map_err(|_| format!("bad db {db:?}"))?;
    let args = split_args(&rest[close + 1..]).map_err(|e| e.to_string())?;
    if args.is_empty() {
        return Err("no command after [db client]".into());
    }
    Ok(Some(MonitorLine {
        unix_us,
        db,
        client: client.to_string(),
        args,
    }))
}

/// `1700000000.123456` → microseconds. The fraction has 1 to 6 digits.
fn parse_timestamp(ts: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(ts).ok()?;
    let (secs, frac) = s.split_once('.')?;
    if secs.is_empty()
        || frac.is_empty()
        || frac.len() > 6
        || !secs.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let secs: u64 = secs.parse().ok()?;
    let scale = 10u64.pow(6 - u32::try_from(frac.len()).ok()?);
    let frac: u64 = frac.parse().ok()?;
    secs.checked_mul(1_000_000)?.checked_add(frac * scale)
}

/// Whether a command (any case) is one [`NEVER_REPLAYED`] names.
pub fn never_replayed(name: &[u8]) -> Option<&'static str> {
    NEVER_REPLAYED
        .iter()
        .find(|n| n.as_bytes().eq_ignore_ascii_case(name))
        .copied()
}

/// Builds a trace event by event, numbering clients and skipping what is not replayed.
#[derive(Debug, Default)]
pub struct TraceBuilder {
    trace: Trace,
    clients: HashMap<String, u32>,
    first_us: Option<u64>,
    include_lua: bool,
}

impl TraceBuilder {
    /// A builder; `include_lua` keeps commands sent by Lua scripts.
    pub fn new(include_lua: bool) -> Self {
        TraceBuilder {
            include_lua,
            ..Default::default()
        }
    }

    /// Counts a skipped line or command under `reason`.
    pub fn skip(&mut self, reason: impl Into<String>) {
        *self.trace.skipped.entry(reason.into()).or_default() += 1;
    }

    /// Adds one `MONITOR` line's command; returns whether it was kept.
    pub fn push_monitor(&mut self, m: MonitorLine) -> bool {
        if m.client == "lua" && !self.include_lua {
            self.skip("lua");
            return false;
        }
        if let Some(name) = never_replayed(&m.args[0]) {
            self.skip(format!("never replayed: {name}"));
            return false;
        }
        let first = *self.first_us.get_or_insert(m.unix_us);
        let next = u32::try_from(self.clients.len()).unwrap_or(u32::MAX);
        let client = *self.clients.entry(m.client).or_insert(next);
        self.trace.events.push(Event {
            offset_us: m.unix_us.saturating_sub(first),
            client,
            db: m.db,
            args: m.args,
        });
        true
    }

    /// How many commands were kept so far.
    pub fn len(&self) -> usize {
        self.trace.events.len()
    }

    /// Whether no command was kept yet.
    pub fn is_empty(&self) -> bool {
        self.trace.events.is_empty()
    }

    /// The trace, sorted by offset (a capture's clock can step back by a few µs between
    /// lines of different clients; ties keep file order).
    pub fn finish(mut self) -> Trace {
        self.trace.clients = u32::try_from(self.clients.len()).unwrap_or(u32::MAX);
        self.trace.events.sort_by_key(|e| e.offset_us);
        self.trace
    }
}

/// Reads `redis-cli MONITOR` output.
pub fn read_monitor(input: impl BufRead, opts: &ReadOptions) -> Result<Trace, Error> {
    let mut b = TraceBuilder::new(opts.include_lua);
    for (no, line) in input.split(b'\n').enumerate() {
        if b.len() >= opts.max_events {
            break;
        }
        let line = line?;
        match parse_monitor_line(&line) {
            Ok(Some(m)) => {
                b.push_monitor(m);
            }
            Ok(None) => {
                if !line.iter().all(u8::is_ascii_whitespace) {
                    b.skip("not a command line");
                }
            }
            Err(e) => return Err(Error::Input(format!("MONITOR line {}: {e}", no + 1))),
        }
    }
    Ok(b.finish())
}

/// Reads a respway trace (see the module docs).
pub fn read_trace(input: impl BufRead, opts: &ReadOptions) -> Result<Trace, Error> {
    let mut trace = Trace::default();
    let mut max_client = None;
    let mut header = false;
    for (no, line) in input.split(b'\n').enumerate() {
        if trace.events.len() >= opts.max_events {
            break;
        }
        let line = line?;
        let line = line.strip_suffix(b"\r").unwrap_or(&line);
        if no == 0 {
            header = line == TRACE_HEADER.as_bytes();
        }
        if line.first() == Some(&b'#') || line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if !header {
            return Err(Error::Input(format!(
                "not a respway trace: the first line is not {TRACE_HEADER:?}"
            )));
        }
        let bad = |what: &str| Error::Input(format!("trace line {}: {what}", no + 1));
        let mut fields = split_args(line).map_err(|e| bad(&e.to_string()))?;
        if fields.len() < 4 {
            return Err(bad("expected: offset_us client db args..."));
        }
        let args = fields.split_off(3);
        let num = |f: &[u8]| {
            std::str::from_utf8(f)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
        };
        let offset_us = num(&fields[0]).ok_or_else(|| bad("bad offset_us"))?;
        let client = num(&fields[1])
            .and_then(|c| u32::try_from(c).ok())
            .ok_or_else(|| bad("bad client"))?;
        let db = num(&fields[2])
            .and_then(|c| u32::try_from(c).ok())
            .ok_or_else(|| bad("bad db"))?;
        if let Some(name) = never_replayed(&args[0]) {
            *trace
                .skipped
                .entry(format!("never replayed: {name}"))
                .or_default() += 1;
            continue;
        }
        max_client = max_client.max(Some(client));
        trace.events.push(Event {
            offset_us,
            client,
            db,
            args,
        });
    }
    trace.clients = max_client.map_or(0, |c| c.saturating_add(1));
    trace.events.sort_by_key(|e| e.offset_us);
    Ok(trace)
}

/// Writes one event as a trace line.
pub fn write_event(out: &mut Vec<u8>, e: &Event) {
    use std::io::Write as _;
    let _ = write!(out, "{} {} {}", e.offset_us, e.client, e.db);
    for a in &e.args {
        out.push(b' ');
        write_quoted(out, a);
    }
    out.push(b'\n');
}

/// Writes the trace header lines.
pub fn write_header(out: &mut impl Write) -> io::Result<()> {
    writeln!(out, "{TRACE_HEADER}")?;
    writeln!(out, "# offset_us client db args...")
}

/// Writes a whole trace in the respway trace format.
pub fn write_trace(out: &mut impl Write, trace: &Trace) -> io::Result<()> {
    write_header(out)?;
    let mut line = Vec::with_capacity(256);
    for e in &trace.events {
        line.clear();
        write_event(&mut line, e);
        out.write_all(&line)?;
    }
    Ok(())
}

/// Guesses the format of a capture from its first non-blank line.
pub fn detect(first_line: &[u8]) -> Format {
    if first_line.starts_with(b"# respway-trace") {
        Format::Trace
    } else {
        Format::Monitor
    }
}

/// Loads a capture file; `format` `None` detects it from the first line.
pub fn load(path: &Path, format: Option<Format>, opts: &ReadOptions) -> Result<Trace, Error> {
    let open = || {
        std::fs::File::open(path)
            .map(io::BufReader::new)
            .map_err(|e| Error::Input(format!("{}: {e}", path.display())))
    };
    let format = match format {
        Some(f) => f,
        None => {
            let mut first = Vec::new();
            open()?.read_until(b'\n', &mut first)?;
            detect(&first)
        }
    };
    match format {
        Format::Monitor => read_monitor(open()?, opts),
        Format::Trace => read_trace(open()?, opts),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitor_line_with_quoting_and_binary() {
        let m = parse_monitor_line(
            br#"1700000000.123456 [3 127.0.0.1:54321] "SET" "a \"b\"" "\x00\xff\r\n" "#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(m.unix_us, 1_700_000_000_123_456);
        assert_eq!(m.db, 3);
        assert_eq!(m.client, "127.0.0.1:54321");
        assert_eq!(
            m.args,
            vec![b"SET".to_vec(), b"a \"b\"".to_vec(), vec![0, 0xff, 13, 10]]
        );
        assert_eq!(parse_monitor_line(b"OK").unwrap(), None);
        assert_eq!(parse_monitor_line(b"").unwrap(), None);
        assert!(parse_monitor_line(b"1700000000.1 0 x").is_err());
        let raw = parse_monitor_line(b"+1.5 [0 unix:/tmp/r.sock] \"PING\"\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(raw.unix_us, 1_500_000);
        assert_eq!(raw.client, "unix:/tmp/r.sock");
    }

    #[test]
    fn monitor_capture_numbers_clients_and_skips() {
        let text = b"OK\n\
            100.000010 [0 127.0.0.1:1] \"SET\" \"k\" \"v\"\n\
            100.000020 [0 lua] \"incr\" \"x\"\n\
            100.000030 [0 127.0.0.1:2] \"GET\" \"k\"\n\
            100.000025 [1 127.0.0.1:1] \"subscribe\" \"c\"\n\
            100.000040 [1 127.0.0.1:1] \"GET\" \"k\"\n";
        let t = read_monitor(&text[..], &ReadOptions::default()).unwrap();
        assert_eq!(t.clients, 2);
        let got: Vec<(u64, u32, u32)> = t
            .events
            .iter()
            .map(|e| (e.offset_us, e.client, e.db))
            .collect();
        assert_eq!(got, vec![(0, 0, 0), (20, 1, 0), (30, 0, 1)]);
        assert_eq!(t.skipped["lua"], 1);
        assert_eq!(t.skipped["not a command line"], 1);
        assert_eq!(t.skipped["never replayed: subscribe"], 1);
    }

    #[test]
    fn trace_round_trips() {
        let t = Trace {
            events: vec![
                Event {
                    offset_us: 0,
                    client: 0,
                    db: 0,
                    args: vec![b"SET".to_vec(), b"k 1".to_vec(), vec![0, 1, 255, b'"']],
                },
                Event {
                    offset_us: 7,
                    client: 2,
                    db: 5,
                    args: vec![b"GET".to_vec(), Vec::new()],
                },
            ],
            clients: 3,
            skipped: BTreeMap::new(),
        };
        let mut out = Vec::new();
        write_trace(&mut out, &t).unwrap();
        assert_eq!(detect(&out), Format::Trace);
        let back = read_trace(&out[..], &ReadOptions::default()).unwrap();
        assert_eq!(back, t);
        assert!(read_trace(&b"0 0 0 \"GET\" \"k\"\n"[..], &ReadOptions::default()).is_err());
    }
}
