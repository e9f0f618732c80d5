//! ACL users' permissions, as Redis's `ACL SETUSER` rules: command rules (`+cmd`, `-cmd`,
//! `+cmd|sub`, `+@category`, `-@category`, `allcommands`, `nocommands`), key patterns
//! (`~pattern`, `allkeys`, `resetkeys`) and pub/sub channel patterns (`&pattern`,
//! `allchannels`, `resetchannels`), applied left to right from nothing; password digests
//! (SHA-256, compared in constant time); and Redis's glob matcher for the patterns.
//!
//! The rules are compiled once per configuration into [`Permissions`]: a bit per command
//! and subcommand of the command table, and the pattern lists. A check is then one bit test
//! and, for users without `allkeys`, one glob match per key.

use std::sync::OnceLock;

use bytes::Bytes;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq;

use crate::command::{self, CommandInfo, NO_AUTH};

/// A SHA-256 digest of a password.
pub type Digest = [u8; 32];

/// The SHA-256 digest of `password`.
pub fn sha256(password: &[u8]) -> Digest {
    Sha256::digest(password).into()
}

/// Reads a digest written as 64 hexadecimal digits (as Redis's `#<hex>` rule); either case.
pub fn digest_from_hex(hex: &str) -> Option<Digest> {
    let b = hex.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = (nibble(b[2 * i])? << 4) | nibble(b[2 * i + 1])?;
    }
    Some(out)
}

/// A digest as 64 lowercase hexadecimal digits.
pub fn digest_to_hex(d: &Digest) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether the SHA-256 of `given` is one of `digests`. Every digest is compared, each in
/// constant time, so the time taken says nothing of which one matched or where one differed.
pub fn password_matches(digests: &[Digest], given: &[u8]) -> bool {
    let d = sha256(given);
    let mut ok = subtle::Choice::from(0);
    for x in digests {
        ok |= x.ct_eq(&d);
    }
    bool::from(ok)
}

/// Redis's glob match (`KEYS`, ACL key and channel patterns): `*` any run of bytes, `?` one
/// byte, `[abc]`, `[^abc]`, `[a-z]` a class, `\x` the byte `x`. Case-sensitive. Runs in
/// `O(pattern × subject)` at worst (one backtracking point: the last `*`).
pub fn glob_match(pattern: &[u8], subject: &[u8]) -> bool {
    let (p, s) = (pattern, subject);
    let (mut pi, mut si) = (0, 0);
    // Where to resume after the last `*`: (pattern index after it, subject index).
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() {
            match p[pi] {
                b'*' => {
                    while pi < p.len() && p[pi] == b'*' {
                        pi += 1;
                    }
                    if pi == p.len() {
                        return true;
                    }
                    star = Some((pi, si));
                    continue;
                }
                b'?' => {
                    pi += 1;
                    si += 1;
                    continue;
                }
                b'[' => {
                    let (matched, next) = class(p, pi + 1, s[si]);
                    if matched {
                        pi = next;
                        si += 1;
                        continue;
                    }
                }
                b'\\' if pi + 1 < p.len() => {
                    if p[pi + 1] == s[si] {
                        pi += 2;
                        si += 1;
                        continue;
                    }
                }
                c => {
                    if c == s[si] {
                        pi += 1;
                        si += 1;
                        continue;
                    }
                }
            }
        }
        match star {
            Some((sp, ss)) => {
                pi = sp;
                si = ss + 1;
                star = Some((sp, ss + 1));
            }
            None => return false,
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

/// Matches `c` against the class starting at `p[j]` (just after `[`): whether it matched,
/// and the pattern index after the closing `]` (the end, when it is missing).
fn class(p: &[u8], mut j: usize, c: u8) -> (bool, usize) {
    let not = p.get(j) == Some(&b'^');
    if not {
        j += 1;
    }
    let mut matched = false;
    while j < p.len() {
        if p[j] == b'\\' && j + 1 < p.len() {
            j += 1;
            matched |= p[j] == c;
        } else if p[j] == b']' {
            return (matched != not, j + 1);
        } else if j + 2 < p.len() && p[j + 1] == b'-' {
            let (a, b) = (p[j].min(p[j + 2]), p[j].max(p[j + 2]));
            matched |= (a..=b).contains(&c);
            j += 2;
        } else {
            matched |= p[j] == c;
        }
        j += 1;
    }
    (matched != not, j)
}

/// Why a rule cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// `+name` / `-name` names no command of the table.
    #[error("unknown command {0:?} in rule {1:?}")]
    UnknownCommand(String, String),
    /// `+@name` / `-@name` names no category.
    #[error("unknown category {0:?} in rule {1:?} (expected one of: {2})")]
    UnknownCategory(String, String, String),
    /// A user attribute written as a rule (`on`, `>password`, `nopass`, ...).
    #[error("{0:?} is not a permission rule: set it with the user's `enabled`, `password`, `password_sha256` or `nopass`")]
    NotAPermission(String),
    /// Redis 7 selectors and read/write key permissions (`%R~`, `(...)`), not supported.
    #[error("{0:?}: selectors and %R~/%W~ key permissions are not supported by respway")]
    Unsupported(String),
    /// Anything else.
    #[error("unknown rule {0:?} (expected ~pattern, allkeys, resetkeys, &pattern, allchannels, resetchannels, +command, -command, +command|subcommand, +@category, -@category, allcommands or nocommands)")]
    Unknown(String),
}

/// Key or channel patterns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Patterns {
    all: bool,
    list: Vec<Box<[u8]>>,
}

impl Patterns {
    fn add(&mut self, p: &[u8]) {
        if p == b"*" {
            self.all = true;
            self.list.clear();
        } else if !self.all && !self.list.iter().any(|x| &x[..] == p) {
            self.list.push(p.into());
        }
    }

    fn reset(&mut self) {
        *self = Patterns::default();
    }

    fn matches(&self, s: &[u8]) -> bool {
        self.all || self.list.iter().any(|p| glob_match(p, s))
    }

    fn describe(&self, sigil: char, out: &mut Vec<String>) {
        if self.all {
            out.push(format!("{sigil}*"));
        } else {
            for p in &self.list {
                out.push(format!("{sigil}{}", String::from_utf8_lossy(p)));
            }
        }
    }
}

/// Every command and subcommand of the table, with the bit index of each.
struct Universe {
    /// By bit index.
    commands: Vec<&'static CommandInfo>,
    /// `(address of the first entry, entries, bit index of the first)` of each static slice
    /// (the top-level table and every subcommand table), sorted by address.
    slices: Vec<(usize, usize, usize)>,
    /// Every category name without its `@`, sorted.
    categories: Vec<&'static str>,
    /// A bit per command a read-only script may call (neither `write` nor `noscript`).
    script_reads: Vec<u64>,
}

fn universe() -> &'static Universe {
    static U: OnceLock<Universe> = OnceLock::new();
    U.get_or_init(|| {
        let mut u = Universe {
            commands: Vec::new(),
            slices: Vec::new(),
            categories: vec!["all"],
            script_reads: Vec::new(),
        };
        let add = |u: &mut Universe, slice: &'static [CommandInfo]| {
            if slice.is_empty() {
                return;
            }
            u.slices
                .push((slice.as_ptr() as usize, slice.len(), u.commands.len()));
            for c in slice {
                u.commands.push(c);
                for cat in c.acl_categories {
                    let cat = cat.trim_start_matches('@');
                    if !u.categories.contains(&cat) {
                        u.categories.push(cat);
                    }
                }
            }
        };
        let all = command::all();
        add(&mut u, all);
        for c in all {
            add(&mut u, c.subcommands);
        }
        u.slices.sort_unstable();
        u.categories.sort_unstable();
        u.script_reads = vec![0; u.commands.len().div_ceil(64)];
        for (i, c) in u.commands.iter().enumerate() {
            if !c.has_flag(command::WRITE) && !c.has_flag(command::NOSCRIPT) {
                u.script_reads[i / 64] |= 1 << (i % 64);
            }
        }
        u
    })
}

impl Universe {
    /// The bit index of `cmd` (an entry of the static table).
    fn index(&self, cmd: &'static CommandInfo) -> Option<usize> {
        let at = cmd as *const CommandInfo as usize;
        let size = std::mem::size_of::<CommandInfo>();
        let i = self.slices.partition_point(|&(start, _, _)| start <= at);
        let &(start, len, base) = self.slices.get(i.checked_sub(1)?)?;
        let off = (at - start) / size;
        (off < len).then_some(base + off)
    }
}

/// What one user may do, compiled from its rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permissions {
    /// One bit per command and subcommand ([`Universe`] order).
    commands: Vec<u64>,
    keys: Patterns,
    channels: Patterns,
    /// The command rules as applied, for `ACL LIST`.
    command_rules: Vec<String>,
    /// The category rules in order (on or off, the category without `@`): what decides for a
    /// command learned from the shards, which is in no bit set.
    category_rules: Vec<(bool, String)>,
}

/// Why a command is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// The command (or subcommand) itself.
    Command,
    /// One of its keys.
    Key,
    /// One of its channels.
    Channel,
    /// `SORT ... BY <pattern>` for a user without `allkeys` (the pattern reads any key).
    SortBy,
    /// `SORT ... GET <pattern>` for a user without `allkeys`.
    SortGet,
    /// A script (`EVAL`, `EVALSHA`, `FCALL`, their `_RO` forms): it runs on the shard with
    /// the upstream user's rights, so the user's rules cannot hold inside it. Refused to
    /// every restricted user, but for `_RO` scripts of a user who may read every key with
    /// every command a read-only script can call (Redis refuses writes in those).
    Script,
}

impl Permissions {
    /// Nothing allowed (a new Redis user).
    pub fn none() -> Permissions {
        let n = universe().commands.len();
        Permissions {
            commands: vec![0; n.div_ceil(64)],
            keys: Patterns::default(),
            channels: Patterns::default(),
            command_rules: Vec::new(),
            category_rules: Vec::new(),
        }
    }

    /// Applies `rules` left to right from nothing, then `-@write` when `read_only`.
    ///
    /// # Errors
    /// The first rule that is not one of the supported forms, or names an unknown command
    /// or category.
    pub fn compile<S: AsRef<str>>(rules: &[S], read_only: bool) -> Result<Permissions, RuleError> {
        let mut p = Permissions::none();
        for r in rules {
            p.apply(r.as_ref())?;
        }
        if read_only {
            p.apply("-@write")?;
        }
        Ok(p)
    }

    /// Checks one rule without applying it anywhere.
    ///
    /// # Errors
    /// As [`Permissions::compile`].
    pub fn check_rule(rule: &str) -> Result<(), RuleError> {
        Permissions::none().apply(rule)
    }

    fn set(&mut self, i: usize, on: bool) {
        let (w, b) = (i / 64, 1u64 << (i % 64));
        if on {
            self.commands[w] |= b;
        } else {
            self.commands[w] &= !b;
        }
    }

    fn apply(&mut self, rule: &str) -> Result<(), RuleError> {
        let u = universe();
        let lower = rule.to_ascii_lowercase();
        match lower.as_str() {
            "allkeys" => {
                self.keys.add(b"*");
                return Ok(());
            }
            "resetkeys" => {
                self.keys.reset();
                return Ok(());
            }
            "allchannels" => {
                self.channels.add(b"*");
                return Ok(());
            }
            "resetchannels" => {
                self.channels.reset();
                return Ok(());
            }
            "allcommands" => return self.apply("+@all"),
            "nocommands" => return self.apply("-@all"),
            "on"
            | "off"
            | "nopass"
            | "resetpass"
            | "reset"
            | "skip-sanitize-payload"
            | "sanitize-payload" => return Err(RuleError::NotAPermission(rule.to_string())),
            _ => {}
        }
        let (first, rest) = rule.split_at(rule.chars().next().map_or(0, char::len_utf8));
        match first {
            "~" => {
                self.keys.add(rest.as_bytes());
                Ok(())
            }
            "&" => {
                self.channels.add(rest.as_bytes());
                Ok(())
            }
            ">" | "<" | "#" | "!" => Err(RuleError::NotAPermission(rule.to_string())),
            "%" | "(" => Err(RuleError::Unsupported(rule.to_string())),
            "+" | "-" => {
                let on = first == "+";
                let name = rest.to_ascii_lowercase();
                if let Some(cat) = name.strip_prefix('@') {
                    if !u.categories.contains(&cat) {
                        return Err(RuleError::UnknownCategory(
                            cat.to_string(),
                            rule.to_string(),
                            u.categories.join(", "),
                        ));
                    }
                    self.category_rules.push((on, cat.to_string()));
                    let tag = format!("@{cat}");
                    for (i, c) in u.commands.iter().enumerate() {
                        if cat == "all" || c.acl_categories.contains(&tag.as_str()) {
                            self.set(i, on);
                        }
                    }
                } else {
                    let unknown = || RuleError::UnknownCommand(rest.to_string(), rule.to_string());
                    let (top, sub) = match name.split_once('|') {
                        Some((t, s)) => (t, Some(s)),
                        None => (name.as_str(), None),
                    };
                    let top = command::lookup(top.as_bytes()).ok_or_else(unknown)?;
                    match sub {
                        Some(s) => {
                            let sc = top.subcommand(s.as_bytes()).ok_or_else(unknown)?;
                            self.set(u.index(sc).ok_or_else(unknown)?, on);
                        }
                        None => {
                            self.set(u.index(top).ok_or_else(unknown)?, on);
                            for sc in top.subcommands {
                                self.set(u.index(sc).ok_or_else(unknown)?, on);
                            }
                        }
                    }
                }
                let norm = format!("{first}{name}");
                if norm == "+@all" || norm == "-@all" {
                    self.command_rules.clear();
                }
                self.command_rules.push(norm);
                Ok(())
            }
            _ => Err(RuleError::Unknown(rule.to_string())),
        }
    }

    /// Every command, key and channel allowed: such a user is checked for nothing.
    pub fn unrestricted(&self) -> bool {
        let n = universe().commands.len();
        let full = (0..self.commands.len()).all(|w| {
            let bits = (n - w * 64).min(64);
            let mask = if bits == 64 {
                u64::MAX
            } else {
                (1u64 << bits) - 1
            };
            self.commands[w] & mask == mask
        });
        full && self.keys.all && self.channels.all
    }

    /// Whether the user may run `cmd` (a command or a resolved subcommand), by name only.
    #[inline]
    pub fn allows_command(&self, cmd: &'static CommandInfo) -> bool {
        match universe().index(cmd) {
            Some(i) => self.commands[i / 64] & (1 << (i % 64)) != 0,
            // Learned from the shards: the category rules, in order, by its categories.
            None => self
                .category_rules
                .iter()
                .fold(false, |allowed, (on, cat)| {
                    let named = cat == "all"
                        || (cmd.acl_categories.iter()).any(|c| c.strip_prefix('@') == Some(cat));
                    if named {
                        *on
                    } else {
                        allowed
                    }
                }),
        }
    }

    /// Whether every key is allowed (`allkeys`, `~*`).
    pub fn all_keys(&self) -> bool {
        self.keys.all
    }

    /// Whether `key` matches one of the user's key patterns.
    pub fn allows_key(&self, key: &[u8]) -> bool {
        self.keys.matches(key)
    }

    /// Whether `channel` (of `SUBSCRIBE`, `PUBLISH`, ...) matches one of the channel
    /// patterns.
    pub fn allows_channel(&self, channel: &[u8]) -> bool {
        self.channels.matches(channel)
    }

    /// Whether `PSUBSCRIBE pattern` is allowed: `allchannels`, or the pattern is literally
    /// one of the user's channel patterns (as Redis checks it).
    pub fn allows_channel_pattern(&self, pattern: &[u8]) -> bool {
        self.channels.all || self.channels.list.iter().any(|p| &p[..] == pattern)
    }

    /// Checks a command with its arguments: the command itself, then its keys (`keys`: the
    /// positions the caller found once with [`CommandInfo::key_indices`], or its error), or
    /// for pub/sub its channels. Commands
    /// Redis serves before authentication (`AUTH`, `HELLO`) are always allowed. Arguments
    /// whose keys cannot be found (a bad numkeys) pass here: the command is refused for
    /// them later, before anything is sent.
    ///
    /// # Errors
    /// What was refused.
    pub fn check(
        &self,
        cmd: &'static CommandInfo,
        args: &[Bytes],
        keys: Result<&[usize], &'static str>,
    ) -> Result<(), Denied> {
        if cmd.has_flag(NO_AUTH) {
            return Ok(());
        }
        if !self.allows_command(cmd) {
            return Err(Denied::Command);
        }
        match cmd.name {
            "subscribe" | "ssubscribe" => {
                return match args[1..].iter().all(|c| self.allows_channel(c)) {
                    true => Ok(()),
                    false => Err(Denied::Channel),
                }
            }
            "psubscribe" => {
                return match args[1..].iter().all(|c| self.allows_channel_pattern(c)) {
                    true => Ok(()),
                    false => Err(Denied::Channel),
                }
            }
            "publish" | "spublish" => {
                return match args.get(1).is_none_or(|c| self.allows_channel(c)) {
                    true => Ok(()),
                    false => Err(Denied::Channel),
                }
            }
            _ => {}
        }
        if self.keys.all {
            return Ok(());
        }
        // Keys that cannot be found (a bad numkeys, ...) are Redis's error to give, later.
        if keys.is_ok_and(|keys| !keys.iter().all(|&i| self.allows_key(&args[i]))) {
            return Err(Denied::Key);
        }
        if matches!(cmd.name, "sort" | "sort_ro") {
            sort_patterns(args)?;
        }
        Ok(())
    }

    /// Whether the user may run the script command `cmd` (`EVAL`, `FCALL`, ...; any other
    /// command: true). A script can call any command on any key with the shard's rights,
    /// so only a read-only script (`EVAL_RO`, `EVALSHA_RO`, `FCALL_RO`, in which Redis
    /// refuses every write) of a user with every key and every command such a script may
    /// call is safe. [`check`](Self::check) leaves this to the caller, which may opt out
    /// (the listener's `allow_restricted_scripts`).
    pub fn allows_script(&self, cmd: &'static CommandInfo) -> bool {
        match cmd.name {
            "eval" | "evalsha" | "fcall" => false,
            "eval_ro" | "evalsha_ro" | "fcall_ro" => {
                self.keys.all
                    && self
                        .commands
                        .iter()
                        .zip(&universe().script_reads)
                        .all(|(have, need)| have & need == *need)
            }
            _ => true,
        }
    }

    /// The permission part of the user's `ACL LIST` line: key patterns, channel patterns,
    /// command rules.
    pub fn describe(&self) -> String {
        let mut out = Vec::new();
        if !self.keys.all && self.keys.list.is_empty() {
            out.push("resetkeys".to_string());
        }
        self.keys.describe('~', &mut out);
        if !self.channels.all {
            out.push("resetchannels".to_string());
        }
        self.channels.describe('&', &mut out);
        if self.command_rules.first().map(String::as_str) != Some("+@all") {
            out.push("-@all".to_string());
        }
        out.extend(
            self.command_rules
                .iter()
                .filter(|r| r.as_str() != "-@all")
                .cloned(),
        );
        out.join(" ")
    }
}

/// `SORT key [BY pattern] [LIMIT offset count] [GET pattern ...] ...`: a `BY` pattern with
/// a `*`, or any `GET`, reads keys the user's patterns cannot vouch for.
fn sort_patterns(args: &[Bytes]) -> Result<(), Denied> {
    let mut j = 2;
    while j < args.len() {
        let a = &args[j];
        let left = args.len() - j - 1;
        if a.eq_ignore_ascii_case(b"by") && left >= 1 {
            if args[j + 1].contains(&b'*') {
                return Err(Denied::SortBy);
            }
            j += 1;
        } else if a.eq_ignore_ascii_case(b"get") && left >= 1 {
            return Err(Denied::SortGet);
        } else if a.eq_ignore_ascii_case(b"limit") && left >= 2 {
            j += 2;
        } else if a.eq_ignore_ascii_case(b"store") && left >= 1 {
            j += 1;
        }
        j += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
