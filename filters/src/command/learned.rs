//! Commands learned from the shards: the ones a shard knows that the built-in table
//! (`command_table.rs`) does not hold — a newer Redis or Valkey, a module — read from the
//! shard's own `COMMAND INFO` reply and turned into a [`CommandInfo`] the rest of the proxy
//! uses as it uses a built-in one: arity, flags, ACL categories and, from the key
//! specifications, where the keys are ([`KeySpec::Learned`]).
//!
//! How a learned command is classed (the built-in table's rules, from what the reply says):
//! - `admin`, `pubsub` or `blocking` flag: [`CommandClass::Unsupported`] (a blocking command
//!   would hold a pooled connection; the built-in blocking commands have handlers of their
//!   own);
//! - a key spec that says it may miss keys (`incomplete`): [`KeySpec::Asked`], class
//!   [`CommandClass::SameShard`]: before it is placed, a shard names its keys (`COMMAND
//!   GETKEYS`, as Redis Cluster clients do), and they must all be on one shard;
//! - a key spec the proxy cannot follow otherwise (an `unknown` begin or find type):
//!   unsupported, with that reason (the proxy will not guess where the keys are);
//! - no key spec (a key-less command): unsupported, as a built-in key-less command is;
//! - exactly one key spec that finds one key: [`CommandClass::Single`];
//! - otherwise [`CommandClass::SameShard`]: every key must hash to one shard (the spec does
//!   not say how the replies of a split command would be merged).
//!
//! Entries are built once per distinct reply and kept for the life of the process (a
//! learned command is a `&'static CommandInfo`, as a built-in one is): the same reply learned
//! again (a reconnect, another endpoint, another worker) gives the same entry, so what is kept
//! is bounded by the distinct command definitions the shards ever reported.
//!
//! [`Learned`] is the registry a sidecar keeps: per endpoint what it learned (with the
//! server's version), and the union of every endpoint's commands by name, read by sessions
//! on a built-in lookup's miss only (one atomic load and one hash probe, no allocation).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use arc_swap::ArcSwap;
use bytes::Bytes;

use super::{
    CommandClass, CommandInfo, KeySpec, ADMIN, ALLOW_BUSY, ASKING, BLOCKING, DENYOOM, FAST,
    LOADING, MODULE, MOVABLE_KEYS, NOSCRIPT, NO_ASYNC_LOADING, NO_AUTH, NO_MANDATORY_KEYS,
    NO_MULTI, PUBSUB, READONLY, SKIP_MONITOR, SKIP_SLOWLOG, STALE, WRITE,
};
use crate::resp::Frame;

/// Where a key spec's search begins.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Begin {
    /// At this argument (`args[0]` is the command name).
    Index(i32),
    /// After the first argument equal to `keyword` (ignoring ASCII case), searched from
    /// `startfrom` on, or backwards from the end when `startfrom` is negative.
    Keyword {
        /// The keyword, as the spec names it.
        keyword: &'static str,
        /// Where the search starts.
        startfrom: i32,
    },
}

/// How a key spec finds its keys from where the search began.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Find {
    /// Keys from the beginning to `lastkey` (relative to it; negative: from the end, `-1` the
    /// last argument), every `keystep`; with a negative `lastkey`, `limit` > 1 keeps only
    /// that fraction of the remaining arguments.
    Range {
        /// The last key.
        lastkey: i32,
        /// Arguments from one key to the next.
        keystep: i32,
        /// A fraction of the rest (0 or 1: all).
        limit: i32,
    },
    /// A key count at `keynumidx` (relative to the beginning), then that many keys from
    /// `firstkey` (relative to the beginning), every `keystep`.
    Keynum {
        /// Where the count is.
        keynumidx: i32,
        /// Where the first key is.
        firstkey: i32,
        /// Arguments from one key to the next.
        keystep: i32,
    },
}

/// One key specification of a learned command.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LearnedSpec {
    /// Where the search begins.
    pub begin: Begin,
    /// How the keys are found.
    pub find: Find,
    /// The spec only reads the keys it finds (`RO`).
    pub read_only: bool,
}

/// The `key value ...` pairs of a RESP2 flat array or a RESP3 map.
fn pairs(f: &Frame) -> Vec<(String, Frame)> {
    match f {
        Frame::Array(items) => items
            .chunks_exact(2)
            .map(|kv| (text(&kv[0]).unwrap_or_default(), kv[1].clone()))
            .collect(),
        Frame::Map(kvs) => kvs
            .iter()
            .map(|(k, v)| (text(k).unwrap_or_default(), v.clone()))
            .collect(),
        _ => Vec::new(),
    }
}

fn field<'a>(kv: &'a [(String, Frame)], name: &str) -> Option<&'a Frame> {
    kv.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v)
}

fn text(f: &Frame) -> Option<String> {
    match f {
        Frame::Simple(b) | Frame::Bulk(b) | Frame::Verbatim(b) => {
            Some(String::from_utf8_lossy(b).into_owned())
        }
        Frame::Integer(n) => Some(n.to_string()),
        _ => None,
    }
}

fn int(f: Option<&Frame>) -> Option<i32> {
    match f? {
        Frame::Integer(n) => i32::try_from(*n).ok(),
        other => text(other)?.parse().ok(),
    }
}

fn names(f: &Frame) -> Vec<String> {
    match f {
        Frame::Array(items) | Frame::Set(items) => items.iter().filter_map(text).collect(),
        _ => Vec::new(),
    }
}

/// Whether a key spec's `flags` hold `name` (ignoring ASCII case).
fn spec_flag(kv: &[(String, Frame)], name: &str) -> bool {
    field(kv, "flags")
        .map(names)
        .unwrap_or_default()
        .iter()
        .any(|f| f.eq_ignore_ascii_case(name))
}

/// One key spec of a `COMMAND INFO` reply, or why it cannot be followed.
fn parse_spec(f: &Frame) -> Result<Option<LearnedSpec>, String> {
    let kv = pairs(f);
    let flag = |n: &str| spec_flag(&kv, n);
    if flag("not_key") {
        // An argument that is not a key in the keyspace (a shard channel): not routed by.
        return Ok(None);
    }
    let begin = pairs(field(&kv, "begin_search").ok_or("a key spec without begin_search")?);
    let begin_spec = pairs(field(&begin, "spec").unwrap_or(&Frame::Nil));
    let begin = match field(&begin, "type").and_then(text).as_deref() {
        Some("index") => Begin::Index(int(field(&begin_spec, "index")).ok_or("no index")?),
        Some("keyword") => Begin::Keyword {
            keyword: leak_str(
                &field(&begin_spec, "keyword")
                    .and_then(text)
                    .ok_or("no keyword")?,
            ),
            startfrom: int(field(&begin_spec, "startfrom")).ok_or("no startfrom")?,
        },
        other => {
            return Err(format!(
                "its key specs begin with {:?}",
                other.unwrap_or("")
            ))
        }
    };
    let find = pairs(field(&kv, "find_keys").ok_or("a key spec without find_keys")?);
    let find_spec = pairs(field(&find, "spec").unwrap_or(&Frame::Nil));
    let get = |n: &str| int(field(&find_spec, n)).ok_or(format!("no {n}"));
    let find = match field(&find, "type").and_then(text).as_deref() {
        Some("range") => Find::Range {
            lastkey: get("lastkey")?,
            keystep: get("keystep")?,
            limit: get("limit")?,
        },
        Some("keynum") => Find::Keynum {
            keynumidx: get("keynumidx")?,
            firstkey: get("firstkey")?,
            keystep: get("keystep")?,
        },
        other => {
            return Err(format!(
                "its key specs find keys by {:?}",
                other.unwrap_or("")
            ))
        }
    };
    Ok(Some(LearnedSpec {
        begin,
        find,
        read_only: flag("RO"),
    }))
}

fn leak_str(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

const FLAG_NAMES: &[(&str, u32)] = &[
    ("write", WRITE),
    ("readonly", READONLY),
    ("denyoom", DENYOOM),
    ("module", MODULE),
    ("admin", ADMIN),
    ("pubsub", PUBSUB),
    ("noscript", NOSCRIPT),
    ("blocking", BLOCKING),
    ("loading", LOADING),
    ("stale", STALE),
    ("skip_monitor", SKIP_MONITOR),
    ("skip_slowlog", SKIP_SLOWLOG),
    ("asking", ASKING),
    ("fast", FAST),
    ("no_auth", NO_AUTH),
    ("no_mandatory_keys", NO_MANDATORY_KEYS),
    ("no_async_loading", NO_ASYNC_LOADING),
    ("no_multi", NO_MULTI),
    ("movablekeys", MOVABLE_KEYS),
    ("allow_busy", ALLOW_BUSY),
];

/// A learned command and, when the proxy refuses it, why.
#[derive(Debug, Clone, Copy)]
pub struct LearnedCommand {
    /// The entry sessions use.
    pub info: &'static CommandInfo,
    /// Why it is refused (its class is [`CommandClass::Unsupported`]), or `None`.
    pub refused: Option<&'static str>,
}

/// Whether one key spec of a `COMMAND INFO` reply says it may miss keys (`incomplete`).
fn incomplete(f: &Frame) -> bool {
    spec_flag(&pairs(f), "incomplete")
}

/// The class of a learned command, its key positions, and why it is refused; `asked`: its
/// key specs are incomplete, so a shard names its keys ([`KeySpec::Asked`]).
fn classify(
    flags: u32,
    specs: Result<Vec<LearnedSpec>, String>,
    asked: bool,
) -> (CommandClass, KeySpec, Option<String>) {
    let specs = match specs {
        Ok(s) => s,
        // A shard names the keys: its other specs do not matter.
        Err(_) if asked => Vec::new(),
        Err(why) => return (CommandClass::Unsupported, KeySpec::None, Some(why)),
    };
    let keys = if asked {
        KeySpec::Asked
    } else if specs.is_empty() {
        KeySpec::None
    } else {
        KeySpec::Learned(Box::leak(specs.clone().into_boxed_slice()))
    };
    // A refused command is never asked for keys (its keys are not followed).
    let refused = |why: &str| {
        let keys = if asked { KeySpec::None } else { keys };
        (CommandClass::Unsupported, keys, Some(why.to_string()))
    };
    if flags & ADMIN != 0 {
        return refused("an admin command");
    }
    if flags & PUBSUB != 0 {
        return refused("a pub/sub command");
    }
    if flags & BLOCKING != 0 {
        return refused("a blocking command (it would hold a pooled connection)");
    }
    if asked {
        // Its keys, as a shard names them, must all be on one shard.
        return (CommandClass::SameShard, keys, None);
    }
    match specs.as_slice() {
        [] => refused("it has no keys to route it by"),
        [LearnedSpec {
            begin: Begin::Index(_),
            find: Find::Range { lastkey: 0, .. },
            ..
        }] => (CommandClass::Single, keys, None),
        _ => (CommandClass::SameShard, keys, None),
    }
}

/// Learned top-level commands counted under their own name in the per-command statistics
/// (the first [`COUNTED`] names learned in the process; later ones count as `other`).
pub const COUNTED: usize = 64;

static COUNTED_NAMES: [OnceLock<&'static str>; COUNTED] = [const { OnceLock::new() }; COUNTED];

/// The name counted in statistics slot `i` (`None`: no learned command has it yet).
#[inline]
pub fn counted_name(i: usize) -> Option<&'static str> {
    COUNTED_NAMES.get(i)?.get().copied()
}

/// The statistics slot of the learned command `c` (by name), or `None` (not one of the
/// first [`COUNTED`] names learned).
pub fn counted_slot(c: &CommandInfo) -> Option<usize> {
    COUNTED_NAMES
        .iter()
        .map_while(|n| n.get())
        .position(|n| std::ptr::eq(*n, c.name) || *n == c.name)
}

/// Gives `name` a statistics slot when it has none and one is free (under the interning
/// lock: one writer).
fn count(name: &'static str) {
    for slot in &COUNTED_NAMES {
        match slot.get() {
            Some(n) if *n == name => return,
            Some(_) => continue,
            None => {
                let _ = slot.set(name);
                return;
            }
        }
    }
}

/// The entries built so far, by the reply they were built from: the same reply gives the
/// same `&'static` entry.
fn interned() -> &'static Mutex<HashMap<Bytes, LearnedCommand>> {
    static SEEN: OnceLock<Mutex<HashMap<Bytes, LearnedCommand>>> = OnceLock::new();
    SEEN.get_or_init(Default::default)
}

/// A learned command's entry by name (the first built with that name), for what counts by
/// name (statistics); never on a request's path.
pub fn interned_by_name(name: &str) -> Option<&'static CommandInfo> {
    let seen = interned().lock().unwrap_or_else(|e| e.into_inner());
    seen.values().map(|c| c.info).find(|i| i.name == name)
}

/// One command of a `COMMAND INFO` reply (`[name, arity, flags, first, last, step, acl
/// categories, tips, key specs, subcommands]`), or `None` for a null entry (a name the
/// server does not know) or a malformed one.
pub fn parse_command(f: &Frame) -> Option<LearnedCommand> {
    let key = f.to_bytes();
    let mut seen = interned().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = seen.get(&key) {
        return Some(*c);
    }
    let (info, refused) = build(f)?;
    count(info.name);
    let out = LearnedCommand {
        info: Box::leak(Box::new(info)),
        refused: refused.map(|r| leak_str(&r)),
    };
    seen.insert(key, out);
    Some(out)
}

fn leak_names(list: &[String]) -> &'static [&'static str] {
    Box::leak(
        list.iter()
            .map(|n| leak_str(n))
            .collect::<Vec<_>>()
            .into_boxed_slice(),
    )
}

/// The ACL categories a command's flags imply, added to those the server named (Redis 7.0
/// names none for a module's commands): `@write`, `@read`, `@admin` and `@dangerous`,
/// `@pubsub`, `@blocking`, and `@fast` or `@slow`, as Redis gives its own commands.
fn implied(flags: u32, mut acl: Vec<String>) -> Vec<String> {
    let speed = if flags & FAST != 0 { "@fast" } else { "@slow" };
    let by_flag = [
        (WRITE, "@write"),
        (READONLY, "@read"),
        (ADMIN, "@admin"),
        (ADMIN, "@dangerous"),
        (PUBSUB, "@pubsub"),
        (BLOCKING, "@blocking"),
    ];
    let wanted = (by_flag.iter())
        .filter(|(f, _)| flags & f != 0)
        .map(|(_, c)| *c)
        .chain((!acl.iter().any(|c| c == "@fast" || c == "@slow")).then_some(speed));
    for c in wanted.collect::<Vec<_>>() {
        if !acl.iter().any(|a| a == c) {
            acl.push(c.to_string());
        }
    }
    acl
}

/// A command's (or subcommand's) entry and why it is refused.
fn build(f: &Frame) -> Option<(CommandInfo, Option<String>)> {
    let Frame::Array(items) = f else { return None };
    let name = text(items.first()?)?.to_ascii_lowercase();
    let arity = int(items.get(1))?;
    let flag_list = names(items.get(2)?);
    let flags = flag_list.iter().fold(0, |acc, n| {
        acc | FLAG_NAMES
            .iter()
            .find(|(f, _)| f.eq_ignore_ascii_case(n))
            .map_or(0, |(_, b)| *b)
    });
    let legacy = (
        int(items.get(3)).unwrap_or(0),
        int(items.get(4)).unwrap_or(0),
        int(items.get(5)).unwrap_or(0),
    );
    let asked = matches!(items.get(8), Some(Frame::Array(specs) | Frame::Set(specs))
        if specs.iter().any(incomplete));
    let specs: Result<Vec<LearnedSpec>, String> = match items.get(8) {
        Some(Frame::Array(specs) | Frame::Set(specs)) => specs
            .iter()
            .filter_map(|s| parse_spec(s).transpose())
            .collect(),
        // A server before key specs (Redis 6): the legacy range.
        None if flags & MOVABLE_KEYS != 0 => {
            Err("its keys are movable and it has no key specs".into())
        }
        None if legacy.0 > 0 => Ok(vec![LearnedSpec {
            begin: Begin::Index(legacy.0),
            find: Find::Range {
                lastkey: if legacy.1 < 0 {
                    legacy.1
                } else {
                    legacy.1 - legacy.0
                },
                keystep: legacy.2.max(1),
                limit: 0,
            },
            read_only: flags & READONLY != 0,
        }]),
        _ => Ok(Vec::new()),
    };
    let mut subs: Vec<CommandInfo> = match items.get(9) {
        Some(Frame::Array(subs) | Frame::Set(subs)) => {
            subs.iter().filter_map(|s| Some(build(s)?.0)).collect()
        }
        _ => Vec::new(),
    };
    subs.sort_by(|a, b| a.name.cmp(b.name));
    let (class, keys, refused) = classify(flags, specs, asked);
    let info = CommandInfo {
        name: leak_str(&name),
        arity,
        flags,
        flag_names: leak_names(&flag_list),
        legacy_range: legacy,
        acl_categories: leak_names(&implied(flags, items.get(6).map(names).unwrap_or_default())),
        keys,
        class,
        subcommands: Box::leak(subs.into_boxed_slice()),
    };
    Some((info, refused))
}

/// What one endpoint taught.
#[derive(Debug, Clone, Default)]
pub struct EndpointTable {
    /// The server's version (`redis_version` of `INFO server`; Valkey's `valkey_version`
    /// when it has one).
    pub version: String,
    /// The commands it knows that the built-in table does not hold.
    pub commands: Vec<LearnedCommand>,
    /// Why the last attempt to learn failed (the last good table is kept), or `None`.
    pub error: Option<String>,
}

/// The union of every endpoint's learned commands, by lowercase name.
#[derive(Default)]
struct Union {
    by_name: HashMap<Box<[u8]>, &'static CommandInfo>,
    /// Why each refused one is refused.
    refused: HashMap<&'static str, &'static str>,
    longest: usize,
}

/// The learned commands of a running sidecar: per cluster and endpoint, and their union
/// (what sessions look up).
#[derive(Default)]
pub struct Learned {
    union: ArcSwap<Union>,
    per: Mutex<BTreeMap<(String, String), EndpointTable>>,
}

impl std::fmt::Debug for Learned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Learned").finish_non_exhaustive()
    }
}

/// Longest name looked up without allocating (longer ones are never learned).
const MAX_NAME: usize = 64;

impl Learned {
    /// A learned top-level command by `argv[0]`, ignoring ASCII case; no allocation.
    #[inline]
    pub fn lookup(&self, name: &[u8]) -> Option<&'static CommandInfo> {
        let union = self.union.load();
        if name.is_empty() || name.len() > union.longest {
            return None;
        }
        let mut buf = [0u8; MAX_NAME];
        let lower = &mut buf[..name.len()];
        lower.copy_from_slice(name);
        lower.make_ascii_lowercase();
        union.by_name.get(&*lower).copied()
    }

    /// Why the learned command `name` (lowercase) is refused, or `None` (not learned, or
    /// not refused).
    pub fn refusal(&self, name: &str) -> Option<&'static str> {
        self.union.load().refused.get(name).copied()
    }

    /// Records what `endpoint` of `cluster` taught (replacing what it taught before).
    pub fn set(&self, cluster: &str, endpoint: &str, table: EndpointTable) {
        let mut per = self.per.lock().unwrap_or_else(|e| e.into_inner());
        per.insert((cluster.to_string(), endpoint.to_string()), table);
        self.rebuild(&per);
    }

    /// Records that learning from `endpoint` failed: its last table stays.
    pub fn failed(&self, cluster: &str, endpoint: &str, error: String) {
        let mut per = self.per.lock().unwrap_or_else(|e| e.into_inner());
        per.entry((cluster.to_string(), endpoint.to_string()))
            .or_default()
            .error = Some(error);
    }

    /// Forgets the endpoints `keep` does not hold (they left the configuration).
    pub fn retain(&self, keep: impl Fn(&str, &str) -> bool) {
        let mut per = self.per.lock().unwrap_or_else(|e| e.into_inner());
        per.retain(|(c, e), _| keep(c, e));
        self.rebuild(&per);
    }

    /// Every endpoint's table, by (cluster, endpoint).
    pub fn tables(&self) -> Vec<((String, String), EndpointTable)> {
        let per = self.per.lock().unwrap_or_else(|e| e.into_inner());
        per.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    fn rebuild(&self, per: &BTreeMap<(String, String), EndpointTable>) {
        let mut union = Union::default();
        for t in per.values() {
            for c in &t.commands {
                if c.info.name.len() > MAX_NAME {
                    continue;
                }
                union.longest = union.longest.max(c.info.name.len());
                union
                    .by_name
                    .entry(c.info.name.as_bytes().into())
                    .or_insert(c.info);
                if let Some(why) = c.refused {
                    union.refused.entry(c.info.name).or_insert(why);
                }
            }
        }
        self.union.store(Arc::new(union));
    }
}

#[cfg(test)]
mod tests;
