//! Envoy's Maglev table (`load_balancing_policies/maglev`), with keys hashed like Envoy's
//! `redis_proxy` does for it.
//!
//! Build, as Envoy ≥ 1.27 does it:
//!
//! 1. Normalize the weights: `w / Σw` in double precision, as Envoy's `normalizeHostWeights`
//!    does; remember the largest, `max_w`.
//! 2. Sort the shards by hash key bytes. Each gets `offset = xxh64(key, 0) % M` and
//!    `skip = xxh64(key, 1) % (M - 1) + 1`; its permutation is `(offset + next * skip) % M`.
//! 3. For `iteration = 1, 2, …`, walk the shards in sorted order. A shard whose
//!    `iteration * w < target` sits this round out. Otherwise `target += max_w`, and the shard takes
//!    the first free slot along its permutation. Stop as soon as all `M` slots are taken.
//!
//! Lookup is `table[h % M]` with `h = murmur2_64(hashtag(key))` (seed `0xc70f6907`, i.e.
//! libstdc++'s `std::hash<std::string>`). A single shard always wins, whatever `M` is (Envoy's
//! degenerate table).

use crate::hash::envoy_hash::{std_hash, xxhash64};
use crate::hash::hashtag::tagged;
use crate::hash::{
    check_unique_hash_keys, envoy_normalized_weights, validate_shards, HashBuildError, ShardInput,
    ShardPicker,
};
use crate::model::HashTag;

/// Envoy's default (and recommended) table size.
pub const DEFAULT_TABLE_SIZE: u64 = 65537;
/// Envoy's upper bound on `table_size` (`maglev.proto`).
pub const MAX_TABLE_SIZE: u64 = 5_000_011;

/// A built Maglev lookup table.
pub struct Maglev {
    /// Shard index per table slot; a single entry for the degenerate one-shard table.
    table: Box<[u32]>,
    /// The configured table size (also for the degenerate table).
    table_size: u64,
    /// Hashtag rule (Redis rule: an empty tag hashes the whole key).
    hashtag: Option<HashTag>,
}

impl std::fmt::Debug for Maglev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Maglev")
            .field("table_size", &self.table_size)
            .field("hashtag", &self.hashtag)
            .finish_non_exhaustive()
    }
}

/// Per-shard state while filling the table.
struct Entry {
    /// Shard index in config order.
    shard: u32,
    /// Start of the permutation.
    offset: u64,
    /// Step of the permutation.
    skip: u64,
    /// Normalized weight.
    weight: f64,
    /// Weight credit to reach before the next turn.
    target: f64,
    /// Next position in the permutation to try.
    next: u64,
}

impl Maglev {
    /// Builds the table for `shards` (config order) with `table_size` slots.
    ///
    /// # Errors
    ///
    /// No shards, a weight of 0, a weight sum above `u32::MAX`, duplicate hash keys, a table
    /// size that is not prime or is above [`MAX_TABLE_SIZE`].
    pub fn build(
        shards: &[ShardInput<'_>],
        table_size: u64,
        hashtag: Option<HashTag>,
    ) -> Result<Self, HashBuildError> {
        validate_shards(shards)?;
        if table_size > MAX_TABLE_SIZE {
            return Err(HashBuildError::TableSizeTooLarge {
                size: table_size,
                max: MAX_TABLE_SIZE,
            });
        }
        if !is_prime(table_size) {
            return Err(HashBuildError::TableSizeNotPrime(table_size));
        }
        check_unique_hash_keys(shards)?;
        let (weights, _, max_weight) = envoy_normalized_weights(shards)?;
        if shards.len() == 1 {
            return Ok(Maglev {
                table: Box::new([0]),
                table_size,
                hashtag,
            });
        }

        let m = table_size;
        let mut entries: Vec<Entry> = shards
            .iter()
            .zip(&weights)
            .enumerate()
            .map(|(i, (s, &weight))| Entry {
                shard: i as u32,
                offset: xxhash64(s.hash_key.as_bytes(), 0) % m,
                skip: xxhash64(s.hash_key.as_bytes(), 1) % (m - 1) + 1,
                weight,
                target: 0.0,
                next: 0,
            })
            .collect();
        entries.sort_by(|a, b| {
            shards[a.shard as usize]
                .hash_key
                .as_bytes()
                .cmp(shards[b.shard as usize].hash_key.as_bytes())
        });

        const FREE: u32 = u32::MAX;
        let mut table = vec![FREE; m as usize];
        let mut filled: u64 = 0;
        let mut iteration: u64 = 1;
        'fill: loop {
            for e in entries.iter_mut() {
                if (iteration as f64) * e.weight < e.target {
                    continue;
                }
                e.target += max_weight;
                let mut slot = (e.offset + e.next * e.skip) % m;
                while table[slot as usize] != FREE {
                    e.next += 1;
                    slot = (e.offset + e.next * e.skip) % m;
                }
                table[slot as usize] = e.shard;
                e.next += 1;
                filled += 1;
                if filled == m {
                    break 'fill;
                }
            }
            iteration += 1;
        }

        Ok(Maglev {
            table: table.into_boxed_slice(),
            table_size,
            hashtag,
        })
    }

    /// The shard for an already computed 64-bit hash (Envoy `MaglevTable::chooseHost` on the
    /// first attempt).
    #[inline]
    pub fn pick_hash(&self, hash: u64) -> usize {
        self.table[(hash % self.table.len() as u64) as usize] as usize
    }

    /// The configured table size.
    pub fn table_size(&self) -> u64 {
        self.table_size
    }
}

impl ShardPicker for Maglev {
    fn pick(&self, key: &[u8]) -> usize {
        self.pick_hash(std_hash(tagged(key, self.hashtag, false)))
    }
}

/// Whether `n` is prime (a Maglev table size must be). Trial division; table sizes are at
/// most [`MAX_TABLE_SIZE`].
pub fn is_prime(n: u64) -> bool {
    if n < 2 {
        return false;
    }
    if n.is_multiple_of(2) {
        return n == 2;
    }
    let mut d = 3;
    while d * d <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 2;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::test_util::{ports, shards};

    /// `table[i]` for every slot, via hashes 0..M.
    fn assignments(m: &Maglev) -> Vec<usize> {
        (0..m.table_size()).map(|h| m.pick_hash(h)).collect()
    }

    /// Envoy `maglev_lb_test.cc` `MaglevLoadBalancerTest.Basic` (and `BasicStability`,
    /// `BasicWithRetryHostPredicate` first attempt): 6 hosts 127.0.0.1:90..95, M = 7.
    #[test]
    fn envoy_basic_m7() {
        let keys = ports(90..=95);
        let m = Maglev::build(&shards(&keys, &[1; 6]), 7, None).unwrap();
        assert_eq!(assignments(&m), [2, 4, 0, 1, 5, 0, 3]);
        // Hash 10 lands on slot 3 → :91.
        assert_eq!(m.pick_hash(10), 1);
    }

    /// Envoy `BasicWithHostName` / `BasicWithMetadataHashKey`: hash keys "90".."95", M = 7.
    #[test]
    fn envoy_hostname_keys_m7() {
        let keys: Vec<String> = (90..=95).map(|p: u16| p.to_string()).collect();
        let m = Maglev::build(&shards(&keys, &[1; 6]), 7, None).unwrap();
        assert_eq!(assignments(&m), [2, 5, 0, 3, 4, 1, 0]);
    }

    /// Envoy `BasicStability`: the table only depends on the set of hash keys, not their order.
    #[test]
    fn envoy_stability_under_shuffle() {
        let keys = ports(90..=95);
        let shuffled: Vec<String> = [3, 0, 5, 1, 4, 2]
            .iter()
            .map(|&i| keys[i].clone())
            .collect();
        let m = Maglev::build(&shards(&shuffled, &[1; 6]), 7, None).unwrap();
        let by_port: Vec<usize> = assignments(&m)
            .into_iter()
            .map(|i| keys.iter().position(|k| *k == shuffled[i]).unwrap())
            .collect();
        assert_eq!(by_port, [2, 4, 0, 1, 5, 0, 3]);
    }

    /// Envoy `Weighted`: :90 weight 1, :91 weight 2, M = 17 (6 and 11 entries).
    #[test]
    fn envoy_weighted_m17() {
        let keys = ports(90..=91);
        let m = Maglev::build(&shards(&keys, &[1, 2]), 17, None).unwrap();
        assert_eq!(
            assignments(&m),
            [1, 0, 0, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 0, 1]
        );
    }

    /// Envoy `LocalityWeightedSameLocalityWeights` and `LocalityWeightedGlobalPanic`: one host
    /// per locality with equal locality weights normalizes to 0.5 / 0.5, the same doubles as
    /// host weights 1 / 1.
    #[test]
    fn envoy_equal_weights_m17() {
        let keys = ports(90..=91);
        let m = Maglev::build(&shards(&keys, &[1, 1]), 17, None).unwrap();
        assert_eq!(
            assignments(&m),
            [1, 0, 0, 1, 0, 1, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 1]
        );
    }

    /// Envoy `LocalityWeightedDifferentLocalityWeights`: locality weights 8 / 0 / 2 leave :90 at
    /// 0.8 and :91 at 0.2 (:92's locality has weight 0), the same doubles as host weights 4 / 1.
    /// Envoy's stats: 4 and 13 entries.
    #[test]
    fn envoy_four_to_one_m17() {
        let keys = ports(90..=91);
        let m = Maglev::build(&shards(&keys, &[4, 1]), 17, None).unwrap();
        let table = assignments(&m);
        assert_eq!(table, [1, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0]);
        assert_eq!(table.iter().filter(|&&s| s == 1).count(), 4);
    }

    /// Envoy `LocalityWeightedLopsided`: 1024 hosts 127.0.0.1:0..1023 where :0 carries 127/128 of
    /// the weight (host weights 127·1023 and 1 give the same doubles as locality weights 127 / 1),
    /// default table: each light host appears once, :0 fills the other 65537 − 1023 slots.
    #[test]
    fn envoy_lopsided_default_table() {
        let keys = ports(0..=1023);
        let mut weights = vec![1u32; 1024];
        weights[0] = 127 * 1023;
        let m = Maglev::build(&shards(&keys, &weights), DEFAULT_TABLE_SIZE, None).unwrap();
        let mut counts = vec![0u32; 1024];
        for s in assignments(&m) {
            counts[s] += 1;
        }
        assert_eq!(counts[0], 65537 - 1023);
        assert!(counts[1..].iter().all(|&c| c == 1));
    }

    /// Envoy `SingleHost` / `WeightedSingleHost`: the degenerate table.
    #[test]
    fn single_host_always_wins() {
        let keys = ports(90..=90);
        let m = Maglev::build(&shards(&keys, &[7]), 17, None).unwrap();
        for h in 0..100 {
            assert_eq!(m.pick_hash(h), 0);
        }
        assert_eq!(m.pick(b"anything"), 0);
    }

    /// Envoy `NoPrimeNumber`.
    #[test]
    fn table_size_must_be_prime() {
        let keys = ports(90..=91);
        for size in [0, 1, 8, 65536, 65535] {
            let err = Maglev::build(&shards(&keys, &[1, 1]), size, None).unwrap_err();
            assert_eq!(err, HashBuildError::TableSizeNotPrime(size));
        }
        assert_eq!(
            Maglev::build(&shards(&keys, &[1, 1]), 65536, None)
                .unwrap_err()
                .to_string(),
            "maglev table_size 65536 is not prime"
        );
        assert_eq!(
            Maglev::build(&shards(&keys, &[1, 1]), 5_000_023, None)
                .unwrap_err()
                .to_string(),
            "maglev table_size 5000023 exceeds the maximum 5000011"
        );
        Maglev::build(&shards(&keys, &[1, 1]), 2, None).unwrap();
        Maglev::build(&shards(&keys, &[1, 1]), MAX_TABLE_SIZE, None).unwrap();
    }

    /// Keys go through `std::hash` (murmur2_64) of the hashtag'd key.
    #[test]
    fn key_lookup_uses_murmur_and_redis_hashtag() {
        let keys = ports(90..=95);
        let tag = Some(HashTag::default());
        let m = Maglev::build(&shards(&keys, &[1; 6]), 7, tag).unwrap();
        assert_eq!(m.pick(b"foo"), m.pick_hash(9631199822919835226));
        assert_eq!(m.pick(b"{foo}.bar"), m.pick(b"foo"));
        assert_eq!(m.pick(b"{}foo"), m.pick_hash(std_hash(b"{}foo")));
        let untagged = Maglev::build(&shards(&keys, &[1; 6]), 7, None).unwrap();
        assert_eq!(
            untagged.pick(b"{foo}.bar"),
            untagged.pick_hash(std_hash(b"{foo}.bar"))
        );
    }

    #[test]
    fn primes() {
        let small: Vec<u64> = (0..30).filter(|&n| is_prime(n)).collect();
        assert_eq!(small, [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]);
        assert!(is_prime(65537));
        assert!(is_prime(5_000_011));
        assert!(!is_prime(65539 * 3));
        assert!(!is_prime(65536));
    }
}
