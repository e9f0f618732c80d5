//! Where a command's keys are in its arguments: [`CommandInfo::key_indices`], from the
//! command's [`KeySpec`] (a fixed range for most commands, and one finder per shape of
//! movable keys, mirroring Redis's own), with Redis's errors when the arguments cannot name
//! keys.

use bytes::Bytes;

use super::learned::{Begin, Find, LearnedSpec};
use super::{CommandInfo, KeySpec, NO_MANDATORY_KEYS};
use crate::resp::parse_i64;

const NOT_AN_INTEGER: &str = "value is not an integer or out of range";
const SYNTAX_ERROR: &str = "syntax error";
const WRONG_ARGS: &str = "wrong number of arguments";
pub(super) const UNBALANCED_STREAMS: &str =
    "Unbalanced XREAD list of streams: for each stream key an ID or '$' must be specified.";
/// [`KeySpec::Asked`] where the session does not ask (inside `MULTI`).
pub const ASKED_KEYS: &str =
    "respway: this command's keys are found by asking a shard (COMMAND GETKEYS), which respway does only outside MULTI";
pub(super) const MIGRATE_KEYS_NOT_EMPTY: &str =
    "When using MIGRATE KEYS option, the key argument must be set to the empty string";

impl CommandInfo {
    /// Writes the index in `args` (`args[0]` is the command name) of every key into `out`,
    /// which is cleared first, in ascending order (for `ZUNIONSTORE`: the destination,
    /// then the counted keys). Allocates only when `out`'s capacity is too small, so a
    /// reused vector never allocates for a bounded number of keys.
    ///
    /// Expects [`arity_ok`](Self::arity_ok) to hold. Errors, in Redis's words without the
    /// `ERR ` prefix, when the arguments cannot name keys: a malformed, negative or too
    /// large numkeys (`Number of keys can't be greater than number of args`, `numkeys
    /// should be greater than 0`, ...), `MSET` without a value for its last key, `XREAD`
    /// without `STREAMS` or with unbalanced streams/IDs.
    pub fn key_indices(&self, args: &[Bytes], out: &mut Vec<usize>) -> Result<(), &'static str> {
        out.clear();
        let argc = args.len();
        match self.keys {
            KeySpec::None => Ok(()),
            KeySpec::Range { first, last, step } => {
                let first = usize::from(first);
                let step = usize::from(step.max(1));
                if argc <= first {
                    return Ok(());
                }
                let last = if last >= 0 {
                    usize::from(last.unsigned_abs()).min(argc - 1)
                } else {
                    let back = usize::from(last.unsigned_abs());
                    if !(argc - first).is_multiple_of(step) {
                        // MSET/MSETNX: a key without its value.
                        return Err(wrong_arity(self.name));
                    }
                    match argc.checked_sub(back) {
                        Some(l) => l,
                        None => return Ok(()),
                    }
                };
                if last >= first {
                    out.reserve((last - first) / step + 1);
                    out.extend((first..=last).step_by(step));
                }
                Ok(())
            }
            KeySpec::NumKeys {
                numkeys_index,
                first_offset,
                extra_first_key,
            } => self.numkeys_indices(args, numkeys_index, first_offset, extra_first_key, out),
            KeySpec::StoreOption { search_from } => {
                store_option_indices(args, search_from, out);
                Ok(())
            }
            KeySpec::Sort => {
                sort_indices(args, out);
                Ok(())
            }
            KeySpec::Streams => stream_indices(args, out),
            KeySpec::Migrate => migrate_indices(args, out),
            KeySpec::Asked => Err(ASKED_KEYS),
            KeySpec::Learned(specs) => {
                for spec in specs {
                    learned_indices(spec, args, out)?;
                }
                out.sort_unstable();
                out.dedup();
                Ok(())
            }
        }
    }

    /// [`KeySpec::NumKeys`]: `numkeys` at `numkeys_index`, the keys `first_offset` after it
    /// (and the first argument too when `extra_first_key`).
    fn numkeys_indices(
        &self,
        args: &[Bytes],
        numkeys_index: u8,
        first_offset: u8,
        extra_first_key: bool,
        out: &mut Vec<usize>,
    ) -> Result<(), &'static str> {
        let argc = args.len();
        let idx = usize::from(numkeys_index);
        let Some(raw) = args.get(idx) else {
            return Err(WRONG_ARGS);
        };
        let errors = NumkeysErrors::of(self.name);
        let n = parse_i64(raw).ok_or(errors.not_integer)?;
        let zero_ok = self.has_flag(NO_MANDATORY_KEYS);
        if n < 0 || (n == 0 && !zero_ok) {
            return Err(errors.not_positive);
        }
        let start = idx + usize::from(first_offset);
        let avail = argc.saturating_sub(start);
        if n as u64 > avail as u64 {
            return Err(errors.too_many);
        }
        let n = n as usize;
        out.reserve(n + usize::from(extra_first_key));
        if extra_first_key {
            out.push(1);
        }
        out.extend(start..start + n);
        Ok(())
    }
}

/// [`KeySpec::StoreOption`] (`GEORADIUS ... STORE key`): the first argument, and the one
/// after each `STORE` / `STOREDIST` from `search_from` on.
fn store_option_indices(args: &[Bytes], search_from: u8, out: &mut Vec<usize>) {
    let argc = args.len();
    if argc > 1 {
        out.push(1);
    }
    let from = usize::from(search_from).max(2);
    // The option's argument must follow it, so the last argument is no option.
    let options = args.get(from..argc.saturating_sub(1)).unwrap_or_default();
    for (i, a) in (from..).zip(options) {
        if a.eq_ignore_ascii_case(b"store") || a.eq_ignore_ascii_case(b"storedist") {
            out.push(i + 1);
        }
    }
}

/// [`KeySpec::Sort`]: the sorted key and the last `STORE` destination (`BY` / `GET`
/// patterns are not keys here; `sort_patterns` checks them).
fn sort_indices(args: &[Bytes], out: &mut Vec<usize>) {
    let argc = args.len();
    if argc > 1 {
        out.push(1);
    }
    let mut store = None;
    let mut i = 2;
    while i < argc {
        let a = &args[i][..];
        if a.eq_ignore_ascii_case(b"limit") {
            i += 2;
        } else if a.eq_ignore_ascii_case(b"get") || a.eq_ignore_ascii_case(b"by") {
            i += 1;
        } else if a.eq_ignore_ascii_case(b"store") && i + 1 < argc {
            // The last STORE wins, as in SORT itself.
            store = Some(i + 1);
        }
        i += 1;
    }
    out.extend(store);
}

/// [`KeySpec::Streams`] (`XREAD` / `XREADGROUP`): the first half of what follows `STREAMS`.
fn stream_indices(args: &[Bytes], out: &mut Vec<usize>) -> Result<(), &'static str> {
    let argc = args.len();
    let mut streams = None;
    let mut i = 1;
    while i < argc {
        let a = &args[i][..];
        if a.eq_ignore_ascii_case(b"block") || a.eq_ignore_ascii_case(b"count") {
            i += 2;
        } else if a.eq_ignore_ascii_case(b"group") {
            i += 3;
        } else if a.eq_ignore_ascii_case(b"noack") {
            i += 1;
        } else if a.eq_ignore_ascii_case(b"streams") {
            streams = Some(i);
            break;
        } else {
            break;
        }
    }
    let Some(pos) = streams else {
        return Err(SYNTAX_ERROR);
    };
    let rest = argc - pos - 1;
    if rest == 0 {
        return Err(SYNTAX_ERROR);
    }
    if !rest.is_multiple_of(2) {
        return Err(UNBALANCED_STREAMS);
    }
    out.reserve(rest / 2);
    out.extend(pos + 1..pos + 1 + rest / 2);
    Ok(())
}

/// [`KeySpec::Migrate`]: the key argument, or everything after `KEYS` (then the key
/// argument must be empty).
fn migrate_indices(args: &[Bytes], out: &mut Vec<usize>) -> Result<(), &'static str> {
    let argc = args.len();
    let mut i = 6;
    while i < argc {
        let a = &args[i][..];
        if a.eq_ignore_ascii_case(b"keys") {
            if !args[3].is_empty() {
                return Err(MIGRATE_KEYS_NOT_EMPTY);
            }
            out.reserve(argc - i - 1);
            out.extend(i + 1..argc);
            return Ok(());
        } else if a.eq_ignore_ascii_case(b"auth") {
            i += 1;
        } else if a.eq_ignore_ascii_case(b"auth2") {
            i += 2;
        }
        i += 1;
    }
    if argc > 3 {
        out.push(3);
    }
    Ok(())
}

/// Redis's arity error for the commands whose key/value pairs can be unbalanced.
/// The keys one learned key spec finds, as Redis's own key finder does: where the search
/// begins (an index, or the argument after a keyword), then a range or a counted run.
fn learned_indices(
    spec: &LearnedSpec,
    args: &[Bytes],
    out: &mut Vec<usize>,
) -> Result<(), &'static str> {
    let argc = args.len() as i64;
    let first = match spec.begin {
        Begin::Index(i) => i64::from(i),
        Begin::Keyword { keyword, startfrom } => {
            let from = i64::from(startfrom);
            let hit = |i: &i64| {
                args.get(*i as usize)
                    .is_some_and(|a| a.eq_ignore_ascii_case(keyword.as_bytes()))
            };
            let found = if from >= 0 {
                (from.max(1)..argc).find(hit)
            } else {
                (1..=(argc + from)).rev().find(hit)
            };
            match found {
                Some(i) => i + 1,
                None => return Ok(()),
            }
        }
    };
    if first < 1 || first >= argc {
        return Ok(());
    }
    let (start, last, step) = match spec.find {
        Find::Range {
            lastkey,
            keystep,
            limit,
        } => {
            let last = if lastkey >= 0 {
                first + i64::from(lastkey)
            } else if limit <= 1 {
                argc + i64::from(lastkey)
            } else {
                let modlast = argc + i64::from(lastkey);
                first + (modlast - first) / i64::from(limit)
            };
            (first, last.min(argc - 1), i64::from(keystep.max(1)))
        }
        Find::Keynum {
            keynumidx,
            firstkey,
            keystep,
        } => {
            let at = first + i64::from(keynumidx);
            let Some(n) = usize::try_from(at).ok().and_then(|i| args.get(i)) else {
                return Err(WRONG_ARGS);
            };
            let n = parse_i64(n).ok_or(NOT_AN_INTEGER)?;
            if n < 0 {
                return Err(NOT_AN_INTEGER);
            }
            let step = i64::from(keystep.max(1));
            let start = first + i64::from(firstkey);
            if n == 0 {
                return Ok(());
            }
            // The count is the client's: as large as i64 goes, it must not overflow.
            match (n - 1).checked_mul(step).and_then(|d| start.checked_add(d)) {
                Some(last) if last < argc => (start, last, step),
                _ => return Err("Number of keys can't be greater than number of args"),
            }
        }
    };
    let mut i = start;
    while i <= last {
        out.push(i as usize);
        i += step;
    }
    Ok(())
}

fn wrong_arity(name: &str) -> &'static str {
    match name {
        "mset" => "wrong number of arguments for 'mset' command",
        "msetnx" => "wrong number of arguments for 'msetnx' command",
        _ => WRONG_ARGS,
    }
}

/// The error texts of one command's numkeys checks (they differ between command families).
struct NumkeysErrors {
    not_integer: &'static str,
    not_positive: &'static str,
    too_many: &'static str,
}

impl NumkeysErrors {
    fn of(name: &str) -> Self {
        const POSITIVE: &str = "numkeys should be greater than 0";
        const GREATER: &str = "Number of keys can't be greater than number of args";
        let zset = |not_positive| NumkeysErrors {
            not_integer: NOT_AN_INTEGER,
            not_positive,
            too_many: SYNTAX_ERROR,
        };
        match name {
            "lmpop" | "blmpop" | "zmpop" | "bzmpop" => NumkeysErrors {
                not_integer: POSITIVE,
                not_positive: POSITIVE,
                too_many: SYNTAX_ERROR,
            },
            "sintercard" => NumkeysErrors {
                not_integer: POSITIVE,
                not_positive: POSITIVE,
                too_many: GREATER,
            },
            "zunionstore" => zset("at least 1 input key is needed for 'zunionstore' command"),
            "zinterstore" => zset("at least 1 input key is needed for 'zinterstore' command"),
            "zdiffstore" => zset("at least 1 input key is needed for 'zdiffstore' command"),
            "zunion" => zset("at least 1 input key is needed for 'zunion' command"),
            "zinter" => zset("at least 1 input key is needed for 'zinter' command"),
            "zdiff" => zset("at least 1 input key is needed for 'zdiff' command"),
            "zintercard" => zset("at least 1 input key is needed for 'zintercard' command"),
            // EVAL, EVALSHA, EVAL_RO, EVALSHA_RO, FCALL, FCALL_RO.
            _ => NumkeysErrors {
                not_integer: NOT_AN_INTEGER,
                not_positive: "Number of keys can't be negative",
                too_many: GREATER,
            },
        }
    }
}

// Numkeys arguments are parsed as strictly as Redis's `string2ll`, by the codec's parser.
