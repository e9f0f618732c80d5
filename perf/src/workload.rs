//! Generated traffic: a described model of keys, commands and values, turned into encoded
//! requests ahead of time.
//!
//! A [`Workload`] names the keyspace size, the key distribution (uniform or zipf), a share of
//! hot keys under a prefix, a weighted command mix (optionally rescaled to a read/write
//! ratio), the value-size distribution and the shape of multi-key and collection commands.
//! A [`Generator`] draws commands from it; the same workload, seed and stream number always
//! give the same bytes, so a run can be repeated and two targets get exactly the same
//! requests. Drivers never generate while measuring: [`generate_pools`] fills one
//! [`RequestPool`] per connection first and the drivers cycle through them.
//!
//! Keys of each data type live in their own namespace so a mix never hits `WRONGTYPE`:
//! strings `<prefix><n>` (GET, SET, MGET, MSET, EXPIRE, DEL, EXISTS), counters
//! `<prefix>ctr:<n>` (INCR), hashes `<prefix>h:<n>` (HSET, HGET), lists `<prefix>l:<n>`
//! (LPUSH, LRANGE) and sorted sets `<prefix>z:<n>` (ZADD, ZRANGE). A hot key uses the hot
//! prefix instead of the key prefix (`HIGH_FREQ_3`, `HIGH_FREQ_h:3`), which is what respway's
//! `hot_keys` rules match.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use bytes::BytesMut;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use respway_filters::resp::encode_command;
use serde::{Deserialize, Serialize};

use crate::Error;

/// A command the generator can emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cmd {
    /// `GET key`
    Get,
    /// `SET key value`
    Set,
    /// `MGET key...` (`multi_keys` keys)
    Mget,
    /// `MSET key value...` (`multi_keys` pairs)
    Mset,
    /// `INCR ctr:key`
    Incr,
    /// `HSET h:key field value`
    Hset,
    /// `HGET h:key field`
    Hget,
    /// `LPUSH l:key value`
    Lpush,
    /// `LRANGE l:key 0 range-1`
    Lrange,
    /// `ZADD z:key score member`
    Zadd,
    /// `ZRANGE z:key 0 range-1`
    Zrange,
    /// `EXPIRE key ttl_secs`
    Expire,
    /// `DEL key`
    Del,
    /// `EXISTS key`
    Exists,
    /// `PING` (no key)
    Ping,
}

impl Cmd {
    /// Every command, in kind-index order.
    pub const ALL: [Cmd; 15] = [
        Cmd::Get,
        Cmd::Set,
        Cmd::Mget,
        Cmd::Mset,
        Cmd::Incr,
        Cmd::Hset,
        Cmd::Hget,
        Cmd::Lpush,
        Cmd::Lrange,
        Cmd::Zadd,
        Cmd::Zrange,
        Cmd::Expire,
        Cmd::Del,
        Cmd::Exists,
        Cmd::Ping,
    ];

    /// The Redis command name, upper case.
    pub fn name(self) -> &'static str {
        match self {
            Cmd::Get => "GET",
            Cmd::Set => "SET",
            Cmd::Mget => "MGET",
            Cmd::Mset => "MSET",
            Cmd::Incr => "INCR",
            Cmd::Hset => "HSET",
            Cmd::Hget => "HGET",
            Cmd::Lpush => "LPUSH",
            Cmd::Lrange => "LRANGE",
            Cmd::Zadd => "ZADD",
            Cmd::Zrange => "ZRANGE",
            Cmd::Expire => "EXPIRE",
            Cmd::Del => "DEL",
            Cmd::Exists => "EXISTS",
            Cmd::Ping => "PING",
        }
    }

    /// Whether the command only reads.
    pub fn is_read(self) -> bool {
        matches!(
            self,
            Cmd::Get | Cmd::Mget | Cmd::Hget | Cmd::Lrange | Cmd::Zrange | Cmd::Exists | Cmd::Ping
        )
    }

    /// Index into [`Cmd::ALL`] (the request pool's kind).
    pub fn index(self) -> u16 {
        Cmd::ALL.iter().position(|&c| c == self).unwrap_or(0) as u16
    }

    /// Parses a lower- or upper-case command name.
    pub fn parse(s: &str) -> Option<Cmd> {
        Cmd::ALL
            .iter()
            .copied()
            .find(|c| c.name().eq_ignore_ascii_case(s))
    }
}

/// How keys are picked from the keyspace. In YAML: `uniform` or `{ zipf: 0.99 }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "DistRepr", into = "DistRepr")]
pub enum KeyDistribution {
    /// Every key equally likely.
    Uniform,
    /// Zipf with this exponent: key `n` (from 0) is picked with weight `1 / (n+1)^s`.
    Zipf(f64),
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum DistRepr {
    Name(String),
    Zipf { zipf: f64 },
}

impl TryFrom<DistRepr> for KeyDistribution {
    type Error = String;
    fn try_from(r: DistRepr) -> Result<Self, String> {
        match r {
            DistRepr::Name(n) if n == "uniform" => Ok(KeyDistribution::Uniform),
            DistRepr::Name(n) => Err(format!(
                "unknown distribution {n:?}: expected uniform or {{ zipf: EXPONENT }}"
            )),
            DistRepr::Zipf { zipf } => Ok(KeyDistribution::Zipf(zipf)),
        }
    }
}

impl From<KeyDistribution> for DistRepr {
    fn from(d: KeyDistribution) -> Self {
        match d {
            KeyDistribution::Uniform => DistRepr::Name("uniform".into()),
            KeyDistribution::Zipf(zipf) => DistRepr::Zipf { zipf },
        }
    }
}

/// A share of the traffic that goes to a few hot keys under their own prefix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HotKeys {
    /// Prefix of the hot keys (respway's `hot_keys` rules match it).
    #[serde(default = "default_hot_prefix")]
    pub prefix: String,
    /// Fraction (0 to 1) of all key picks that go to a hot key.
    pub share: f64,
    /// How many distinct hot keys (picked uniformly among them).
    #[serde(default = "default_hot_keys")]
    pub keys: u64,
}

fn default_hot_prefix() -> String {
    "HIGH_FREQ_".into()
}

fn default_hot_keys() -> u64 {
    10
}

/// Sizes of written values, in bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ValueSize {
    /// Always this size (`value_size: 64`).
    Fixed(usize),
    /// Uniform between the two bounds, inclusive (`value_size: { uniform: [16, 512] }`).
    Uniform {
        /// `[min, max]`
        uniform: [usize; 2],
    },
    /// One of the sizes, by weight (`value_size: { choice: [[64, 9], [4096, 1]] }`).
    Choice {
        /// `[size, weight]` pairs.
        choice: Vec<(usize, f64)>,
    },
}

/// A described traffic model. Every field has a default, so a file names only what differs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Workload {
    /// Seed of every random choice.
    pub seed: u64,
    /// Number of distinct keys per data type.
    pub keyspace: u64,
    /// Prefix of every (non-hot) key.
    pub key_prefix: String,
    /// How keys are picked.
    pub distribution: KeyDistribution,
    /// Hot keys, if any.
    pub hot: Option<HotKeys>,
    /// The command mix: relative weights (`{ get: 9, set: 1 }`).
    pub commands: BTreeMap<Cmd, f64>,
    /// If set, the read commands' weights are scaled to sum to this fraction and the writes'
    /// to the rest (needs both reads and writes in the mix).
    pub read_ratio: Option<f64>,
    /// Sizes of the values written by SET, MSET, HSET and LPUSH.
    pub value_size: ValueSize,
    /// Keys per MGET and pairs per MSET.
    pub multi_keys: usize,
    /// Fields per hash and members per sorted set (HSET/HGET/ZADD pick among them).
    pub fields: u64,
    /// LRANGE and ZRANGE fetch elements `0 .. range-1`.
    pub range: u64,
    /// EXPIRE sets this TTL, in seconds.
    pub ttl_secs: u64,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            seed: 1,
            keyspace: 100_000,
            key_prefix: "key:".into(),
            distribution: KeyDistribution::Uniform,
            hot: None,
            commands: BTreeMap::from([(Cmd::Get, 1.0), (Cmd::Set, 1.0)]),
            read_ratio: None,
            value_size: ValueSize::Fixed(64),
            multi_keys: 10,
            fields: 100,
            range: 10,
            ttl_secs: 3600,
        }
    }
}

impl Workload {
    /// Checks every field; all problems at once, one per line.
    pub fn validate(&self) -> Result<(), Error> {
        let mut errs = Vec::new();
        if self.keyspace == 0 {
            errs.push("keyspace: must be at least 1".to_string());
        }
        if let KeyDistribution::Zipf(s) = self.distribution {
            if !(s.is_finite() && s > 0.0) {
                errs.push(format!("distribution: zipf exponent {s} must be > 0"));
            }
        }
        if let Some(h) = &self.hot {
            if !(0.0..=1.0).contains(&h.share) {
                errs.push(format!("hot.share: {} is not between 0 and 1", h.share));
            }
            if h.keys == 0 {
                errs.push("hot.keys: must be at least 1".into());
            }
            if h.prefix.is_empty() {
                errs.push("hot.prefix: must not be empty".into());
            }
        }
        if self.commands.is_empty() || self.commands.values().all(|&w| w <= 0.0) {
            errs.push("commands: needs at least one command with a weight > 0".into());
        }
        for (c, w) in &self.commands {
            if !(w.is_finite() && *w >= 0.0) {
                errs.push(format!("commands.{}: weight {w} must be >= 0", c.name()));
            }
        }
        if let Some(r) = self.read_ratio {
            let (reads, writes) = self.split_weights();
            if !(0.0..=1.0).contains(&r) {
                errs.push(format!("read_ratio: {r} is not between 0 and 1"));
            } else if (r > 0.0 && reads <= 0.0) || (r < 1.0 && writes <= 0.0) {
                errs.push(format!(
                    "read_ratio: {r} needs both read and write commands in the mix"
                ));
            }
        }
        match &self.value_size {
            ValueSize::Fixed(_) => {}
            ValueSize::Uniform { uniform: [lo, hi] } => {
                if lo > hi {
                    errs.push(format!("value_size.uniform: {lo} > {hi}"));
                }
            }
            ValueSize::Choice { choice } => {
                if choice.is_empty() || choice.iter().all(|(_, w)| *w <= 0.0) {
                    errs.push("value_size.choice: needs a size with a weight > 0".into());
                }
                if choice.iter().any(|(_, w)| !(w.is_finite() && *w >= 0.0)) {
                    errs.push("value_size.choice: weights must be >= 0".into());
                }
            }
        }
        if self.value_size_max() > 64 << 20 {
            errs.push("value_size: values above 64 MiB are not supported".into());
        }
        if self.multi_keys == 0 {
            errs.push("multi_keys: must be at least 1".into());
        }
        if self.fields == 0 {
            errs.push("fields: must be at least 1".into());
        }
        if self.range == 0 {
            errs.push("range: must be at least 1".into());
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(Error::Config(errs.join("\n")))
        }
    }

    fn split_weights(&self) -> (f64, f64) {
        let mut reads = 0.0;
        let mut writes = 0.0;
        for (c, w) in &self.commands {
            if c.is_read() {
                reads += w.max(0.0);
            } else {
                writes += w.max(0.0);
            }
        }
        (reads, writes)
    }

    /// The effective probability of each command after `read_ratio`, summing to 1.
    pub fn mix(&self) -> Vec<(Cmd, f64)> {
        let (reads, writes) = self.split_weights();
        let total = reads + writes;
        self.commands
            .iter()
            .filter(|(_, &w)| w > 0.0)
            .map(|(&c, &w)| {
                let p = match self.read_ratio {
                    Some(r) if c.is_read() => w / reads * r,
                    Some(r) => w / writes * (1.0 - r),
                    None => w / total,
                };
                (c, p)
            })
            .collect()
    }

    /// The largest value this workload writes.
    pub fn value_size_max(&self) -> usize {
        match &self.value_size {
            ValueSize::Fixed(n) => *n,
            ValueSize::Uniform { uniform: [_, hi] } => *hi,
            ValueSize::Choice { choice } => choice.iter().map(|(s, _)| *s).max().unwrap_or(0),
        }
    }

    /// A one-line description for tables and logs.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        for (c, p) in self.mix() {
            let _ = write!(s, "{} {:.0}% ", c.name(), p * 100.0);
        }
        let dist = match self.distribution {
            KeyDistribution::Uniform => "uniform".to_string(),
            KeyDistribution::Zipf(e) => format!("zipf {e}"),
        };
        let _ = write!(s, "| {} keys {dist}", self.keyspace);
        if let Some(h) = &self.hot {
            let _ = write!(
                s,
                ", {:.0}% to {} hot keys {}*",
                h.share * 100.0,
                h.keys,
                h.prefix
            );
        }
        let vs = match &self.value_size {
            ValueSize::Fixed(n) => format!("{n} B"),
            ValueSize::Uniform { uniform: [a, b] } => format!("{a}-{b} B"),
            ValueSize::Choice { choice } => format!("{} sizes", choice.len()),
        };
        let _ = write!(s, " | values {vs}");
        s
    }
}

/// Encoded requests for one connection, back to back, with where each ends and its kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestPool {
    bytes: Vec<u8>,
    ends: Vec<usize>,
    kinds: Vec<u16>,
}

impl RequestPool {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends one encoded request of the given kind.
    pub fn push(&mut self, encoded: &[u8], kind: u16) {
        self.bytes.extend_from_slice(encoded);
        self.ends.push(self.bytes.len());
        self.kinds.push(kind);
    }

    /// Appends a command given as arguments.
    pub fn push_args<B: AsRef<[u8]>>(&mut self, args: &[B], kind: u16) {
        let mut buf = BytesMut::new();
        encode_command(args, &mut buf);
        self.push(&buf, kind);
    }

    /// Number of requests.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether the pool holds no request.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    fn start(&self, i: usize) -> usize {
        if i == 0 {
            0
        } else {
            self.ends[i - 1]
        }
    }

    /// The bytes of requests `a..b` (contiguous, ready for one write).
    pub fn range(&self, a: usize, b: usize) -> &[u8] {
        if a >= b {
            return &[];
        }
        &self.bytes[self.start(a)..self.ends[b - 1]]
    }

    /// The bytes of request `i`.
    pub fn request(&self, i: usize) -> &[u8] {
        self.range(i, i + 1)
    }

    /// The kind of request `i`.
    pub fn kind(&self, i: usize) -> u16 {
        self.kinds[i]
    }

    /// All the bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Total size in bytes.
    pub fn byte_len(&self) -> usize {
        self.bytes.len()
    }
}

/// Draws commands from a [`Workload`]. Deterministic: the same workload (including its seed)
/// and `stream` always produce the same sequence.
#[derive(Debug)]
pub struct Generator {
    w: Workload,
    rng: StdRng,
    zipf: Option<Zipf<f64>>,
    cmds: Vec<(Cmd, f64)>,
    sizes: Vec<(usize, f64)>,
    values: Vec<u8>,
}

const VALUE_BLOCK: usize = 64 * 1024;

impl Generator {
    /// A generator for one stream (e.g. one connection) of `w`.
    pub fn new(w: &Workload, stream: u64) -> Result<Self, Error> {
        w.validate()?;
        // The values are the same bytes for every stream: drawn from the seed alone.
        let mut vrng = StdRng::seed_from_u64(w.seed ^ 0x05ee_d0f7_a1e5);
        let block = VALUE_BLOCK.max(w.value_size_max());
        const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        let values = (0..block)
            .map(|_| ALNUM[vrng.random_range(0..ALNUM.len())])
            .collect();
        let zipf = match w.distribution {
            KeyDistribution::Uniform => None,
            KeyDistribution::Zipf(s) => Some(
                Zipf::new(w.keyspace as f64, s)
                    .map_err(|e| Error::Config(format!("distribution: {e}")))?,
            ),
        };
        let mut acc = 0.0;
        let cmds = w
            .mix()
            .into_iter()
            .map(|(c, p)| {
                acc += p;
                (c, acc)
            })
            .collect();
        let sizes = match &w.value_size {
            ValueSize::Choice { choice } => {
                let total: f64 = choice.iter().map(|(_, w)| w.max(0.0)).sum();
                let mut acc = 0.0;
                choice
                    .iter()
                    .map(|&(s, wt)| {
                        acc += wt.max(0.0) / total;
                        (s, acc)
                    })
                    .collect()
            }
            _ => Vec::new(),
        };
        // Streams are independent: mix the stream number into the seed with a large odd
        // constant (splitmix-style) so streams 0, 1, 2 do not start from related states.
        let seed = w
            .seed
            .wrapping_add(stream.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        Ok(Generator {
            w: w.clone(),
            rng: StdRng::seed_from_u64(seed),
            zipf,
            cmds,
            sizes,
            values,
        })
    }

    fn pick_cmd(&mut self) -> Cmd {
        let x: f64 = self.rng.random();
        for &(c, acc) in &self.cmds {
            if x < acc {
                return c;
            }
        }
        self.cmds.last().map_or(Cmd::Ping, |&(c, _)| c)
    }

    /// Appends a key of the given type namespace (`""`, `ctr:`, `h:`, `l:`, `z:`) to `out`.
    fn key(&mut self, ns: &str, out: &mut Vec<u8>) {
        if let Some(h) = &self.w.hot {
            if h.share > 0.0 && self.rng.random::<f64>() < h.share {
                let n = self.rng.random_range(0..h.keys);
                out.extend_from_slice(h.prefix.as_bytes());
                out.extend_from_slice(ns.as_bytes());
                push_num(out, n);
                return;
            }
        }
        let n = match &self.zipf {
            None => self.rng.random_range(0..self.w.keyspace),
            Some(z) => (z.sample(&mut self.rng) as u64)
                .saturating_sub(1)
                .min(self.w.keyspace - 1),
        };
        out.extend_from_slice(self.w.key_prefix.as_bytes());
        out.extend_from_slice(ns.as_bytes());
        push_num(out, n);
    }

    fn value(&mut self) -> Vec<u8> {
        let len = match &self.w.value_size {
            ValueSize::Fixed(n) => *n,
            ValueSize::Uniform { uniform: [lo, hi] } => self.rng.random_range(*lo..=*hi),
            ValueSize::Choice { .. } => {
                let x: f64 = self.rng.random();
                self.sizes
                    .iter()
                    .find(|&&(_, acc)| x < acc)
                    .or(self.sizes.last())
                    .map_or(0, |&(s, _)| s)
            }
        };
        let off = self.rng.random_range(0..=self.values.len() - len);
        self.values[off..off + len].to_vec()
    }

    fn field(&mut self, tag: u8) -> Vec<u8> {
        let mut f = vec![tag];
        push_num(&mut f, self.rng.random_range(0..self.w.fields));
        f
    }

    /// The next command and its arguments.
    pub fn next_args(&mut self) -> (Cmd, Vec<Vec<u8>>) {
        let cmd = self.pick_cmd();
        let mut args = vec![cmd.name().as_bytes().to_vec()];
        let key = |g: &mut Self, ns: &str| {
            let mut k = Vec::with_capacity(24);
            g.key(ns, &mut k);
            k
        };
        match cmd {
            Cmd::Get | Cmd::Del | Cmd::Exists => args.push(key(self, "")),
            Cmd::Set => {
                args.push(key(self, ""));
                args.push(self.value());
            }
            Cmd::Mget => {
                for _ in 0..self.w.multi_keys {
                    args.push(key(self, ""));
                }
            }
            Cmd::Mset => {
                for _ in 0..self.w.multi_keys {
                    args.push(key(self, ""));
                    args.push(self.value());
                }
            }
            Cmd::Incr => args.push(key(self, "ctr:")),
            Cmd::Hset => {
                args.push(key(self, "h:"));
                args.push(self.field(b'f'));
                args.push(self.value());
            }
            Cmd::Hget => {
                args.push(key(self, "h:"));
                args.push(self.field(b'f'));
            }
            Cmd::Lpush => {
                args.push(key(self, "l:"));
                args.push(self.value());
            }
            Cmd::Lrange | Cmd::Zrange => {
                args.push(key(self, if cmd == Cmd::Lrange { "l:" } else { "z:" }));
                args.push(b"0".to_vec());
                let mut hi = Vec::new();
                push_num(&mut hi, self.w.range - 1);
                args.push(hi);
            }
            Cmd::Zadd => {
                args.push(key(self, "z:"));
                let mut score = Vec::new();
                push_num(&mut score, self.rng.random_range(0..1_000_000));
                args.push(score);
                args.push(self.field(b'm'));
            }
            Cmd::Expire => {
                args.push(key(self, ""));
                let mut ttl = Vec::new();
                push_num(&mut ttl, self.w.ttl_secs);
                args.push(ttl);
            }
            Cmd::Ping => {}
        }
        (cmd, args)
    }

    /// Appends the next command, encoded, to `pool`.
    pub fn push_next(&mut self, pool: &mut RequestPool) -> Cmd {
        let (cmd, args) = self.next_args();
        pool.push_args(&args, cmd.index());
        cmd
    }
}

fn push_num(out: &mut Vec<u8>, n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut n = n;
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// The kind names of generated pools, in kind-index order (see [`Cmd::index`]).
pub fn kind_names() -> Vec<String> {
    Cmd::ALL.iter().map(|c| c.name().to_string()).collect()
}

/// One pool of `per_conn` requests for each of `connections` connections (stream `i` for
/// connection `i`), rounded up to a whole number of `batch`-sized batches.
pub fn generate_pools(
    w: &Workload,
    connections: usize,
    per_conn: usize,
    batch: usize,
) -> Result<Vec<RequestPool>, Error> {
    let batch = batch.max(1);
    let n = per_conn.max(1).div_ceil(batch) * batch;
    (0..connections)
        .map(|c| {
            let mut g = Generator::new(w, c as u64)?;
            let mut pool = RequestPool::new();
            for _ in 0..n {
                g.push_next(&mut pool);
            }
            Ok(pool)
        })
        .collect()
}

/// Requests that write every string key the workload's GET/MGET/EXISTS can read (and every
/// hot string key), each with a value of the workload's size distribution, spread over
/// `connections` pools. Running these first makes reads hit.
pub fn preload_pools(w: &Workload, connections: usize) -> Result<Vec<RequestPool>, Error> {
    let mut g = Generator::new(w, u64::MAX)?;
    let connections = connections.max(1);
    let mut pools = vec![RequestPool::new(); connections];
    let mut keys: Vec<Vec<u8>> = Vec::new();
    for n in 0..w.keyspace {
        let mut k = w.key_prefix.as_bytes().to_vec();
        push_num(&mut k, n);
        keys.push(k);
    }
    if let Some(h) = &w.hot {
        for n in 0..h.keys {
            let mut k = h.prefix.as_bytes().to_vec();
            push_num(&mut k, n);
            keys.push(k);
        }
    }
    for (i, k) in keys.into_iter().enumerate() {
        let v = g.value();
        pools[i % connections].push_args(&[&b"SET"[..], &k, &v], Cmd::Set.index());
    }
    Ok(pools)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w() -> Workload {
        Workload {
            keyspace: 1000,
            commands: Cmd::ALL.iter().map(|&c| (c, 1.0)).collect(),
            value_size: ValueSize::Uniform { uniform: [1, 100] },
            ..Workload::default()
        }
    }

    #[test]
    fn same_seed_same_bytes_other_seed_other_bytes() {
        let a = generate_pools(&w(), 3, 500, 16).unwrap();
        let b = generate_pools(&w(), 3, 500, 16).unwrap();
        assert_eq!(a, b);
        assert_eq!(a[0].len(), 512);
        assert_ne!(a[0], a[1], "streams differ");
        let other = Workload { seed: 2, ..w() };
        assert_ne!(generate_pools(&other, 3, 500, 16).unwrap(), a);
    }

    #[test]
    fn mix_follows_weights_and_read_ratio() {
        let wl = Workload {
            commands: BTreeMap::from([(Cmd::Get, 1.0), (Cmd::Mget, 1.0), (Cmd::Set, 2.0)]),
            read_ratio: Some(0.9),
            ..Workload::default()
        };
        let mix = wl.mix();
        let want = [(Cmd::Get, 0.45), (Cmd::Set, 0.1), (Cmd::Mget, 0.45)];
        assert_eq!(mix.len(), 3);
        for ((c, p), (wc, wp)) in mix.iter().zip(want) {
            assert_eq!(*c, wc);
            assert!((p - wp).abs() < 1e-9, "{c:?} {p}");
        }
        let mut g = Generator::new(&wl, 0).unwrap();
        let mut counts = BTreeMap::new();
        for _ in 0..20_000 {
            *counts.entry(g.next_args().0).or_insert(0u32) += 1;
        }
        let reads = counts[&Cmd::Get] + counts[&Cmd::Mget];
        assert!((17_600..18_400).contains(&reads), "{counts:?}");
    }

    #[test]
    fn zipf_concentrates_and_hot_share_holds() {
        let count_top = |dist: KeyDistribution| {
            let wl = Workload {
                keyspace: 10_000,
                distribution: dist,
                commands: BTreeMap::from([(Cmd::Get, 1.0)]),
                hot: Some(HotKeys {
                    prefix: "HOT_".into(),
                    share: 0.2,
                    keys: 5,
                }),
                ..Workload::default()
            };
            let mut g = Generator::new(&wl, 7).unwrap();
            let (mut top, mut hot) = (0, 0);
            for _ in 0..20_000 {
                let (_, args) = g.next_args();
                if args[1] == b"key:0" {
                    top += 1;
                }
                if args[1].starts_with(b"HOT_") {
                    hot += 1;
                }
            }
            (top, hot)
        };
        let (top_u, hot_u) = count_top(KeyDistribution::Uniform);
        let (top_z, hot_z) = count_top(KeyDistribution::Zipf(1.0));
        assert!(top_u < 20, "uniform key:0 picked {top_u} times");
        // zipf(1) over 10k keys: key 0 has ~10% of the non-hot picks (16k)
        assert!(top_z > 1000, "zipf key:0 picked {top_z} times");
        for hot in [hot_u, hot_z] {
            assert!((3_600..4_400).contains(&hot), "hot picks {hot}");
        }
    }

    #[test]
    fn commands_are_well_formed() {
        let mut g = Generator::new(&w(), 1).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..2000 {
            let (c, a) = g.next_args();
            seen.insert(c);
            let expect = match c {
                Cmd::Ping => 1,
                Cmd::Get | Cmd::Del | Cmd::Exists | Cmd::Incr => 2,
                Cmd::Set | Cmd::Hget | Cmd::Lpush | Cmd::Expire => 3,
                Cmd::Hset | Cmd::Lrange | Cmd::Zrange | Cmd::Zadd => 4,
                Cmd::Mget => 11,
                Cmd::Mset => 21,
            };
            assert_eq!(a.len(), expect, "{c:?}");
            assert_eq!(a[0], c.name().as_bytes());
        }
        assert_eq!(seen.len(), Cmd::ALL.len());
    }

    #[test]
    fn validate_reports_everything() {
        let bad = Workload {
            keyspace: 0,
            distribution: KeyDistribution::Zipf(0.0),
            commands: BTreeMap::from([(Cmd::Get, 1.0)]),
            read_ratio: Some(0.5),
            multi_keys: 0,
            ..Workload::default()
        };
        let e = bad.validate().unwrap_err().to_string();
        assert_eq!(
            e,
            "keyspace: must be at least 1\n\
             distribution: zipf exponent 0 must be > 0\n\
             read_ratio: 0.5 needs both read and write commands in the mix\n\
             multi_keys: must be at least 1"
        );
    }

    #[test]
    fn yaml_forms() {
        let wl: Workload = serde_yaml_ng::from_str(
            "keyspace: 10\ndistribution: { zipf: 0.99 }\ncommands: { get: 9, set: 1 }\n\
             value_size: { choice: [[64, 9], [4096, 1]] }\nhot: { share: 0.1 }\n",
        )
        .unwrap();
        assert_eq!(wl.distribution, KeyDistribution::Zipf(0.99));
        assert_eq!(wl.hot.as_ref().unwrap().prefix, "HIGH_FREQ_");
        assert_eq!(
            wl.value_size,
            ValueSize::Choice {
                choice: vec![(64, 9.0), (4096, 1.0)]
            }
        );
        let wl: Workload =
            serde_yaml_ng::from_str("value_size: { uniform: [1, 2] }\ndistribution: uniform\n")
                .unwrap();
        assert_eq!(wl.value_size, ValueSize::Uniform { uniform: [1, 2] });
        assert!(serde_yaml_ng::from_str::<Workload>("nope: 1").is_err());
    }
}
