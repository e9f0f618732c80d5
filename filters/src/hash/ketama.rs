//! Twemproxy's ketama continuum (`distribution: ketama`, `src/hashkit/nc_ketama.c`), which is
//! libmemcached's.
//!
//! Build:
//!
//! 1. Per shard, in config order: `pct = (float)w / (float)Σw` and
//!    `points = floorf((float)(pct * 160 / 4 * (float)n + 1e-10)) * 4`, all in **float32** as
//!    twemproxy does (160 points per shard at equal weights).
//! 2. For `i in 0..points/4`, one MD5 of `"<name>-<i>"` gives four points: the little-endian
//!    `u32`s of digest bytes 0..4, 4..8, 8..12 and 12..16.
//! 3. Sort the points by value.
//!
//! Lookup: one shard always wins; otherwise the key is hashtag'd (twemproxy rule: at least one
//! byte between the delimiters, else the whole key), an empty key hashes to 0, anything else
//! goes through the pool's [`KeyHash`]; the shard is the first point `>= hash`, wrapping to the
//! first point.

use md5::{Digest, Md5};

use crate::hash::hashtag::tagged;
use crate::hash::keyhash::key_hash;
use crate::hash::{
    check_unique_hash_keys, validate_shards, HashBuildError, ShardInput, ShardPicker,
};
use crate::model::{HashTag, KeyHash};

/// Most buckets of the lookup table over the 32-bit hash space (16 KiB per continuum). A
/// continuum gets about one bucket per point (512 for 3 shards: 2 KiB): lookups of random
/// keys touch the whole table, and one that stays in the L1 cache with the points is what
/// makes a lookup cheap (with 4096 buckets at 3 shards, a cache miss on the table was most
/// of the time of `pick`).
const LUT_MAX: usize = 4096;

/// Points per shard at equal weights.
pub const POINTS_PER_SERVER: u32 = 160;
/// Twemproxy formats `"<name>-<index>"` into a buffer of this size (`KETAMA_MAX_HOSTLEN`).
const MAX_HOSTLEN: usize = 86;

/// A built ketama continuum: parallel arrays of point values (sorted) and shard indexes.
pub struct Ketama {
    /// Point values, ascending.
    points: Box<[u32]>,
    /// Shard index of each point.
    shards: Box<[u32]>,
    /// `starts[b]`: the index of the first point at or above `b << shift` (and the last
    /// entry = the number of points), so a lookup searches only the points of its hash's
    /// bucket (about one) instead of the whole continuum.
    starts: Box<[u32]>,
    /// `32 - log2(buckets)`.
    shift: u32,
    /// Number of shards (one shard short-circuits the lookup, as in twemproxy).
    nshards: usize,
    /// The pool's key hash.
    key_hash: KeyHash,
    /// Hashtag rule (twemproxy: an empty tag hashes the whole key).
    hashtag: Option<HashTag>,
}

impl std::fmt::Debug for Ketama {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ketama")
            .field("points", &self.points.len())
            .field("shards", &self.nshards)
            .field("key_hash", &self.key_hash)
            .field("hashtag", &self.hashtag)
            .finish_non_exhaustive()
    }
}

/// Twemproxy's `ketama_hash`: the `alignment`-th little-endian `u32` (0..4) of MD5(`data`).
pub fn ketama_point(data: &[u8], alignment: usize) -> u32 {
    let digest = Md5::digest(data);
    let b = &digest[alignment * 4..alignment * 4 + 4];
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// The number of continuum points twemproxy gives a shard of `weight` out of `total_weight`
/// among `nshards` live shards (a multiple of 4), computed in float32 like twemproxy.
pub fn points_for(weight: u32, total_weight: u32, nshards: u32) -> u32 {
    let pct = weight as f32 / total_weight as f32;
    let per = pct * POINTS_PER_SERVER as f32 / 4.0 * nshards as f32;
    // C adds the double literal 1e-10 (so the sum is a double), then casts back for floorf.
    let per = (f64::from(per) + 0.000_000_000_1) as f32;
    (per.floor() as u32) * 4
}

/// Number of decimal digits of `n`.
fn decimal_len(mut n: u32) -> usize {
    let mut len = 1;
    while n >= 10 {
        n /= 10;
        len += 1;
    }
    len
}

impl Ketama {
    /// Builds the continuum for `shards` (config order); `hash_key` is the twemproxy server name
    /// (its explicit name, else `host:port`, just `host` for port 11211).
    ///
    /// # Errors
    ///
    /// No shards, a weight of 0, a weight sum above `u32::MAX`, duplicate names, or a name so long
    /// that `"<name>-<index>"` overflows twemproxy's 86-byte buffer (where twemproxy's placement
    /// is undefined).
    pub fn build(
        shards: &[ShardInput<'_>],
        key_hash: KeyHash,
        hashtag: Option<HashTag>,
    ) -> Result<Self, HashBuildError> {
        validate_shards(shards)?;
        check_unique_hash_keys(shards)?;
        let total: u64 = shards.iter().map(|s| u64::from(s.weight)).sum();
        let total = u32::try_from(total).map_err(|_| HashBuildError::WeightOverflow {
            total,
            max: u64::from(u32::MAX),
        })?;
        let nshards = shards.len() as u32;

        let mut continuum: Vec<(u32, u32)> =
            Vec::with_capacity(shards.len() * POINTS_PER_SERVER as usize);
        let mut buf = Vec::with_capacity(MAX_HOSTLEN);
        for (shard, s) in shards.iter().enumerate() {
            let hashes = points_for(s.weight, total, nshards) / 4;
            if hashes == 0 {
                continue;
            }
            let max_name = MAX_HOSTLEN - 1 - 1 - decimal_len(hashes - 1);
            if s.hash_key.len() > max_name {
                return Err(HashBuildError::KetamaNameTooLong {
                    shard,
                    hash_key: s.hash_key.to_owned(),
                    max: max_name,
                });
            }
            for i in 0..hashes {
                buf.clear();
                buf.extend_from_slice(s.hash_key.as_bytes());
                buf.push(b'-');
                buf.extend_from_slice(i.to_string().as_bytes());
                let digest = Md5::digest(&buf);
                for word in digest.chunks_exact(4) {
                    let value = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
                    continuum.push((value, shard as u32));
                }
            }
        }
        // Twemproxy uses qsort, whose order for equal values is unspecified; we keep config order.
        continuum.sort_by_key(|&(value, _)| value);
        let (points, owners): (Vec<u32>, Vec<u32>) = continuum.into_iter().unzip();
        let buckets = points.len().next_power_of_two().clamp(16, LUT_MAX);
        let shift = 32 - buckets.trailing_zeros();
        let starts = (0..=buckets)
            .map(|b| match u32::try_from(b << shift) {
                Ok(low) => points.partition_point(|&p| p < low) as u32,
                Err(_) => points.len() as u32,
            })
            .collect();
        Ok(Ketama {
            points: points.into_boxed_slice(),
            shards: owners.into_boxed_slice(),
            starts,
            shift,
            nshards: shards.len(),
            key_hash,
            hashtag,
        })
    }

    /// The shard for an already computed 32-bit key hash (`ketama_dispatch`).
    #[inline]
    pub fn pick_hash(&self, hash: u32) -> usize {
        // The first point >= hash lies between the first points of this bucket and the next.
        let b = (hash >> self.shift) as usize;
        let (lo, hi) = (self.starts[b] as usize, self.starts[b + 1] as usize);
        let i = lo + self.points[lo..hi].partition_point(|&p| p < hash);
        let i = if i == self.points.len() { 0 } else { i };
        self.shards[i] as usize
    }

    /// The key hash twemproxy computes for `key` (after its hashtag, 0 for an empty key).
    #[inline]
    pub fn hash_key(&self, key: &[u8]) -> u32 {
        let key = tagged(key, self.hashtag, false);
        if key.is_empty() {
            0
        } else {
            key_hash(self.key_hash, key)
        }
    }

    /// The sorted continuum as `(point, shard index)` pairs.
    pub fn points(&self) -> impl Iterator<Item = (u32, usize)> + '_ {
        self.points
            .iter()
            .zip(self.shards.iter())
            .map(|(&p, &s)| (p, s as usize))
    }
}

impl ShardPicker for Ketama {
    fn pick(&self, key: &[u8]) -> usize {
        if self.nshards == 1 {
            return 0;
        }
        self.pick_hash(self.hash_key(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_table_finds_what_a_search_of_the_whole_continuum_finds() {
        let names: Vec<String> = (0..7).map(|i| format!("10.0.0.{i}:6379")).collect();
        let shards: Vec<ShardInput<'_>> = names
            .iter()
            .enumerate()
            .map(|(i, n)| ShardInput {
                hash_key: n,
                weight: 1 + i as u32 % 3,
                slots: &[],
            })
            .collect();
        let k = Ketama::build(&shards, KeyHash::Fnv1a64, None).unwrap();
        let plain = |h: u32| {
            let i = k.points.partition_point(|&p| p < h);
            k.shards[if i == k.points.len() { 0 } else { i }] as usize
        };
        let mut hashes = vec![0, 1, u32::MAX, u32::MAX - 1];
        for &p in k.points.iter() {
            hashes.extend([p, p.wrapping_add(1), p.wrapping_sub(1)]);
        }
        assert_eq!(k.starts.len() - 1, k.points.len().next_power_of_two());
        for b in 0..k.starts.len() as u64 {
            let low = (b << k.shift) as u32;
            hashes.extend([low, low.wrapping_sub(1)]);
        }
        let mut x: u32 = 12345;
        for _ in 0..100_000 {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            hashes.push(x);
        }
        for h in hashes {
            assert_eq!(k.pick_hash(h), plain(h), "hash {h}");
        }
    }

    /// The twitter/util `KetamaDistributorTest` node set (from libmemcached's test data): bare IPs
    /// (twemproxy's port-11211 naming) with these weights.
    const NODES: [(&str, u32); 8] = [
        ("10.0.1.1", 600),
        ("10.0.1.2", 300),
        ("10.0.1.3", 200),
        ("10.0.1.4", 350),
        ("10.0.1.5", 1000),
        ("10.0.1.6", 800),
        ("10.0.1.7", 950),
        ("10.0.1.8", 100),
    ];

    fn util_ketama() -> Ketama {
        let shards: Vec<ShardInput<'_>> = NODES
            .iter()
            .map(|&(name, weight)| ShardInput {
                hash_key: name,
                weight,
                slots: &[],
            })
            .collect();
        Ketama::build(&shards, KeyHash::Md5, None).unwrap()
    }

    /// Rows of twitter/util `util-hashing/src/test/resources/ketama_results` (every fifth row plus
    /// both rows for 10.0.1.3): key, md5 key hash, continuum point chosen, node index.
    const KETAMA_RESULTS: [(&[u8], u32, u32, usize); 22] = [
        (br"SVa_]_V41)", 443691461, 445379617, 6),
        (br"]VG<`I*Z8)", 1103544263, 1104827657, 4),
        (br"726bW=9*a4", 4213440020, 4213950705, 6),
        (br"D[HE+cFXDK", 2117036136, 2117124014, 2),
        (br"P1L?NAB[)K", 2129972569, 2132542634, 0),
        (br"\39DKW^)N_", 3548879868, 3550704865, 2),
        (br"`,SS]NBP,b", 1883545960, 1884847278, 0),
        (br"U))Fb-(`,.", 4128682289, 4136854163, 6),
        (br"2TLRL/UL;:", 1086800909, 1095659802, 6),
        (br"HZAU*;P*N]", 2564670474, 2565697267, 6),
        (br"XY\X::LX50", 1749241099, 1752196488, 5),
        (br"8*6a;Sc*X+", 4223431086, 4230156966, 1),
        (br"QR(a+Q=1FU", 3238535074, 3238996435, 5),
        (br"ZY16KQ<ICD", 1831153193, 1838563516, 3),
        (br"2;M;ES>J5/", 2776949824, 2784182515, 6),
        (br"`@L+W;a,O[", 1512157148, 1522285852, 5),
        (br"0OZH^9BKM[", 3682518606, 3686781297, 7),
        (br"A(`KF:[RH8", 3292979676, 3294849139, 5),
        (br"\R^7=9UCG`", 126218373, 129199837, 4),
        (br"WS/3H*)7F;", 419488232, 422140585, 4),
        (br"4*=.SPR[AV", 3928582722, 3928853792, 0),
        (br"[1ZXONX2]a", 4108881567, 4109865744, 3),
    ];

    /// Twemproxy `src/test_all.c`: `ketama_hash("server1-8", 0/3)`.
    #[test]
    fn twemproxy_ketama_hash_vectors() {
        assert_eq!(ketama_point(b"server1-8", 0), 3853726576);
        assert_eq!(ketama_point(b"server1-8", 3), 2667054752);
    }

    /// Key hash, continuum point and node for the ketama_results rows.
    #[test]
    fn util_ketama_results() {
        let ketama = util_ketama();
        for (key, hash, point, node) in KETAMA_RESULTS {
            let shown = String::from_utf8_lossy(key);
            assert_eq!(ketama.hash_key(key), hash, "hash of {shown}");
            let i = ketama.points.partition_point(|&p| p < hash);
            assert_eq!(
                ketama.points[i % ketama.points.len()],
                point,
                "point of {shown}"
            );
            assert_eq!(ketama.pick(key), node, "node of {shown}");
        }
    }

    /// All 99 ketama_results rows, when the file is available: set `KETAMA_RESULTS` to its path
    /// (the file is twitter/util's test resource; it is not in this repository). Skipped
    /// otherwise.
    #[test]
    fn util_ketama_results_full_file() {
        let Some(path) = std::env::var_os("KETAMA_RESULTS") else {
            return;
        };
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("KETAMA_RESULTS={}: {e}", path.to_string_lossy()));
        let ketama = util_ketama();
        let mut rows = 0;
        for line in text.lines().filter(|l| !l.is_empty()) {
            let fields: Vec<&str> = line.split(' ').collect();
            assert_eq!(fields.len(), 4, "line {line:?}");
            let key = fields[0].as_bytes();
            let hash: u32 = fields[1].parse().unwrap();
            let point: u32 = fields[2].parse().unwrap();
            let node = NODES.iter().position(|&(ip, _)| ip == fields[3]).unwrap();
            assert_eq!(ketama.hash_key(key), hash, "hash {line}");
            let i = ketama.points.partition_point(|&p| p < hash);
            assert_eq!(
                ketama.points[i % ketama.points.len()],
                point,
                "point {line}"
            );
            assert_eq!(ketama.pick(key), node, "node {line}");
            rows += 1;
        }
        assert_eq!(rows, 99);
    }

    /// Per-node hashes (points / 4) for the util node set: 44/22/14/26/74/59/70/7.
    #[test]
    fn util_points_per_node() {
        let total = NODES.iter().map(|&(_, w)| w).sum();
        let per: Vec<u32> = NODES
            .iter()
            .map(|&(_, w)| points_for(w, total, 8) / 4)
            .collect();
        assert_eq!(per, [44, 22, 14, 26, 74, 59, 70, 7]);
        let ketama = util_ketama();
        assert_eq!(ketama.points.len() as u32, per.iter().sum::<u32>() * 4);
    }

    /// Equal weights give 160 points per shard.
    #[test]
    fn equal_weights_160_points() {
        for n in 1..=20u32 {
            assert_eq!(points_for(1, n, n), 160, "n = {n}");
            assert_eq!(points_for(7, 7 * n, n), 160, "n = {n}");
        }
    }

    /// One shard always wins, whatever the key; an empty key hashes to 0.
    #[test]
    fn single_shard_and_empty_key() {
        let one = [ShardInput {
            hash_key: "a",
            weight: 1,
            slots: &[],
        }];
        let k = Ketama::build(&one, KeyHash::Fnv1a64, None).unwrap();
        assert_eq!(k.pick(b"anything"), 0);
        let ketama = util_ketama();
        assert_eq!(ketama.hash_key(b""), 0);
        assert_eq!(ketama.pick(b""), ketama.shards[0] as usize);
    }

    /// Twemproxy's hashtag: at least one byte between the delimiters.
    #[test]
    fn hashtag_rule() {
        let shards: Vec<ShardInput<'_>> = NODES
            .iter()
            .map(|&(name, weight)| ShardInput {
                hash_key: name,
                weight,
                slots: &[],
            })
            .collect();
        let k = Ketama::build(&shards, KeyHash::Fnv1a64, Some(HashTag::default())).unwrap();
        assert_eq!(
            k.hash_key(b"{user1000}.following"),
            key_hash(KeyHash::Fnv1a64, b"user1000")
        );
        assert_eq!(k.hash_key(b"{}abc"), key_hash(KeyHash::Fnv1a64, b"{}abc"));
        assert_eq!(k.hash_key(b"{abc"), key_hash(KeyHash::Fnv1a64, b"{abc"));
    }

    /// Lookup wraps past the last point to the first.
    #[test]
    fn wraps_to_first_point() {
        let ketama = util_ketama();
        let last = *ketama.points.last().unwrap();
        assert!(last < u32::MAX);
        assert_eq!(ketama.pick_hash(last + 1), ketama.shards[0] as usize);
        assert_eq!(ketama.pick_hash(u32::MAX), ketama.shards[0] as usize);
        assert_eq!(ketama.pick_hash(0), ketama.shards[0] as usize);
        assert_eq!(
            ketama.pick_hash(last),
            *ketama.shards.last().unwrap() as usize
        );
    }

    #[test]
    fn long_names_are_refused() {
        let name = "n".repeat(84);
        let shards = [
            ShardInput {
                hash_key: &name,
                weight: 1,
                slots: &[],
            },
            ShardInput {
                hash_key: "b",
                weight: 1,
                slots: &[],
            },
        ];
        let err = Ketama::build(&shards, KeyHash::Md5, None).unwrap_err();
        assert_eq!(
            err,
            HashBuildError::KetamaNameTooLong {
                shard: 0,
                hash_key: name.clone(),
                max: 82,
            }
        );
        let fits = "n".repeat(82);
        let shards = [
            ShardInput {
                hash_key: &fits,
                weight: 1,
                slots: &[],
            },
            shards[1],
        ];
        Ketama::build(&shards, KeyHash::Md5, None).unwrap();
    }

    #[test]
    fn decimal_lengths() {
        assert_eq!(decimal_len(0), 1);
        assert_eq!(decimal_len(9), 1);
        assert_eq!(decimal_len(10), 2);
        assert_eq!(decimal_len(u32::MAX), 10);
    }
}
