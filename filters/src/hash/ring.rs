//! Envoy's ring hash (`load_balancing_policies/ring_hash`), with keys hashed like Envoy's
//! `redis_proxy` does for it.
//!
//! Build:
//!
//! 1. Normalize the weights: `w / Σw` in double precision; `min_w` is the smallest.
//! 2. `scale = min(ceil(min_w * minimum_ring_size) / min_w, maximum_ring_size)`.
//! 3. Walk the shards in **config order** keeping two running sums across all of them:
//!    `target += scale * w`, and while `current < target` add the point
//!    `hash("<hash_key>_<i>")` (i = 0, 1, … per shard) and `current += 1`. The running sums decide
//!    which shard gets a fractional extra point, so shard order matters only for that.
//!    `hash` is xxHash64 (seed 0) or murmur2_64 (seed `0xc70f6907`).
//! 4. Sort the points by hash.
//!
//! Lookup: the first point with `hash >= h`, wrapping to the first point, where
//! `h = murmur2_64(hashtag(key))`.

use std::fmt::Write as _;

use crate::hash::envoy_hash::{std_hash, xxhash64};
use crate::hash::hashtag::tagged;
use crate::hash::{
    check_unique_hash_keys, envoy_normalized_weights, validate_shards, HashBuildError, ShardInput,
    ShardPicker,
};
use crate::model::{HashTag, RingHashFunction};

/// Envoy's default `minimum_ring_size`.
pub const DEFAULT_MIN_RING_SIZE: u64 = 1024;
/// Envoy's default `maximum_ring_size`, which is also the largest value it accepts.
pub const MAX_RING_SIZE: u64 = 8 * 1024 * 1024;

/// A built hash ring: parallel arrays of point hashes (sorted) and their shard indexes.
pub struct RingHash {
    /// Point hashes, ascending.
    hashes: Box<[u64]>,
    /// Shard index of each point.
    shards: Box<[u32]>,
    /// Hashtag rule (Redis rule: an empty tag hashes the whole key).
    hashtag: Option<HashTag>,
}

impl std::fmt::Debug for RingHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingHash")
            .field("points", &self.hashes.len())
            .field("hashtag", &self.hashtag)
            .finish_non_exhaustive()
    }
}

impl RingHash {
    /// Builds the ring for `shards` (config order).
    ///
    /// # Errors
    ///
    /// No shards, a weight of 0, a weight sum above `u32::MAX`, duplicate hash keys,
    /// `minimum_ring_size > maximum_ring_size`, a bound above [`MAX_RING_SIZE`], or bounds that
    /// leave the ring empty (`maximum_ring_size` 0).
    pub fn build(
        shards: &[ShardInput<'_>],
        minimum_ring_size: u64,
        maximum_ring_size: u64,
        function: RingHashFunction,
        hashtag: Option<HashTag>,
    ) -> Result<Self, HashBuildError> {
        validate_shards(shards)?;
        for (field, size) in [
            ("minimum_ring_size", minimum_ring_size),
            ("maximum_ring_size", maximum_ring_size),
        ] {
            if size > MAX_RING_SIZE {
                return Err(HashBuildError::RingSizeTooLarge {
                    field,
                    size,
                    max: MAX_RING_SIZE,
                });
            }
        }
        if minimum_ring_size > maximum_ring_size {
            return Err(HashBuildError::RingSizeBounds {
                min: minimum_ring_size,
                max: maximum_ring_size,
            });
        }
        check_unique_hash_keys(shards)?;
        let (weights, min_weight, _) = envoy_normalized_weights(shards)?;

        let scale = ((min_weight * minimum_ring_size as f64).ceil() / min_weight)
            .min(maximum_ring_size as f64);
        let capacity = scale.ceil() as usize;

        let mut points: Vec<(u64, u32)> = Vec::with_capacity(capacity);
        let mut buf = String::new();
        let mut current = 0.0f64;
        let mut target = 0.0f64;
        for (shard, (s, &weight)) in shards.iter().zip(&weights).enumerate() {
            buf.clear();
            buf.push_str(s.hash_key);
            buf.push('_');
            let prefix = buf.len();
            target += scale * weight;
            let mut i: u64 = 0;
            while current < target {
                buf.truncate(prefix);
                // Writing to a String cannot fail.
                let _ = write!(buf, "{i}");
                let hash = match function {
                    RingHashFunction::XxHash => xxhash64(buf.as_bytes(), 0),
                    RingHashFunction::MurmurHash2 => std_hash(buf.as_bytes()),
                };
                points.push((hash, shard as u32));
                i += 1;
                current += 1.0;
            }
        }
        if points.is_empty() {
            return Err(HashBuildError::EmptyRing {
                min: minimum_ring_size,
                max: maximum_ring_size,
            });
        }
        // Envoy's std::sort is not stable; equal 64-bit hashes would need equal strings, which
        // the unique-hash-key check rules out.
        points.sort_unstable_by_key(|&(hash, _)| hash);
        let (hashes, shards): (Vec<u64>, Vec<u32>) = points.into_iter().unzip();
        Ok(RingHash {
            hashes: hashes.into_boxed_slice(),
            shards: shards.into_boxed_slice(),
            hashtag,
        })
    }

    /// The shard for an already computed 64-bit hash (Envoy `Ring::chooseHost`, first attempt):
    /// the first point with `hash >= h`, wrapping to the first point.
    #[inline]
    pub fn pick_hash(&self, hash: u64) -> usize {
        let i = self.hashes.partition_point(|&p| p < hash);
        let i = if i == self.hashes.len() { 0 } else { i };
        self.shards[i] as usize
    }

    /// Number of points on the ring (Envoy's `ring_hash_lb.size` stat).
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    /// Always false: building refuses an empty ring.
    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// The sorted ring as `(hash, shard index)` pairs.
    pub fn points(&self) -> impl Iterator<Item = (u64, usize)> + '_ {
        self.hashes
            .iter()
            .zip(self.shards.iter())
            .map(|(&h, &s)| (h, s as usize))
    }
}

impl ShardPicker for RingHash {
    fn pick(&self, key: &[u8]) -> usize {
        self.pick_hash(std_hash(tagged(key, self.hashtag, false)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::test_util::{ports, shards};

    fn xx(keys: &[String], weights: &[u32], min: u64, max: u64) -> RingHash {
        RingHash::build(
            &shards(keys, weights),
            min,
            max,
            RingHashFunction::XxHash,
            None,
        )
        .unwrap()
    }

    /// `n` hashes spread evenly over u64 as Envoy's histogram tests do, counted per shard.
    fn histogram(ring: &RingHash, n: u64, shards: usize) -> Vec<u32> {
        let mut counts = vec![0u32; shards];
        for i in 0..n {
            counts[ring.pick_hash(i * (u64::MAX / n))] += 1;
        }
        counts
    }

    /// Envoy `ring_hash_lb_test.cc` `RingHashLoadBalancerTest.Basic`: 6 hosts :90..:95,
    /// minimum_ring_size 12 — exact ring positions and lookups.
    #[test]
    fn envoy_basic_xx() {
        let keys = ports(90..=95);
        let ring = xx(&keys, &[1; 6], 12, MAX_RING_SIZE);
        let expected: [(u64, usize); 12] = [
            (833437586790550860, 4),
            (928266305478181108, 2),
            (1033482794131418490, 0),
            (3551244743356806947, 5),
            (3851675632748031481, 3),
            (5583722120771150861, 1),
            (6311230543546372928, 1),
            (7700377290971790572, 3),
            (13144177310400110813, 5),
            (13444792449719432967, 2),
            (15516499411664133160, 4),
            (16117243373044804889, 0),
        ];
        assert_eq!(ring.points().collect::<Vec<_>>(), expected);
        assert_eq!(ring.pick_hash(0), 4);
        assert_eq!(ring.pick_hash(u64::MAX), 4);
        assert_eq!(ring.pick_hash(3551244743356806947), 5);
        assert_eq!(ring.pick_hash(3551244743356806948), 3);
        assert_eq!(ring.pick_hash(16117243373044804880), 0);
    }

    /// Envoy `BasicWithMurmur2`: hosts :80..:85, MURMUR_HASH_2, minimum_ring_size 12.
    #[test]
    fn envoy_basic_murmur2() {
        let keys = ports(80..=85);
        let ring = RingHash::build(
            &shards(&keys, &[1; 6]),
            12,
            MAX_RING_SIZE,
            RingHashFunction::MurmurHash2,
            None,
        )
        .unwrap();
        let expected: [(u64, usize); 12] = [
            (1358027074129602068, 5),
            (4361834613929391114, 3),
            (7224494972555149682, 4),
            (7701421856454313576, 1),
            (8649315368077433379, 2),
            (8739448859063030639, 4),
            (9887544217113020895, 1),
            (10150910876324007731, 2),
            (15168472011420622455, 3),
            (15427156902705414897, 0),
            (16375050414328759093, 5),
            (17613279263364193813, 0),
        ];
        assert_eq!(ring.points().collect::<Vec<_>>(), expected);
        assert_eq!(ring.pick_hash(0), 5);
        assert_eq!(ring.pick_hash(u64::MAX), 5);
        assert_eq!(ring.pick_hash(1358027074129602068), 5);
        assert_eq!(ring.pick_hash(1358027074129602069), 3);
        assert_eq!(ring.pick_hash(10150910876324007730), 2);
    }

    /// Envoy `BasicWithHostname` / `BasicWithMetadataHashKey`: hash keys "90".."95".
    #[test]
    fn envoy_hostname_keys() {
        let keys: Vec<String> = (90..=95).map(|p: u16| p.to_string()).collect();
        let ring = xx(&keys, &[1; 6], 12, MAX_RING_SIZE);
        let expected: [(u64, usize); 12] = [
            (1975508444536362413, 5),
            (2376063919839173711, 5),
            (2386806903309390596, 3),
            (6749904478991551885, 4),
            (6803900775736438537, 3),
            (7225015537174310577, 2),
            (8787465352164086522, 0),
            (11282020843382717940, 2),
            (13723418369486627818, 1),
            (13776502110861797421, 0),
            (14338313586354474791, 1),
            (15364271037087512980, 4),
        ];
        assert_eq!(ring.points().collect::<Vec<_>>(), expected);
        assert_eq!(ring.pick_hash(0), 5);
        assert_eq!(ring.pick_hash(u64::MAX), 5);
        assert_eq!(ring.pick_hash(7225015537174310577), 2);
        assert_eq!(ring.pick_hash(6803900775736438537), 3);
    }

    /// Envoy `UnevenHosts`: 2 hosts, minimum_ring_size 3 → 4 points; then a changed host set.
    #[test]
    fn envoy_uneven_hosts() {
        let keys = ports(80..=81);
        let ring = xx(&keys, &[1, 1], 3, MAX_RING_SIZE);
        let expected: [(u64, usize); 4] = [
            (5454692015285649509, 0),
            (7859399908942313493, 1),
            (13838424394637650569, 0),
            (16064866803292627174, 1),
        ];
        assert_eq!(ring.points().collect::<Vec<_>>(), expected);
        assert_eq!(ring.pick_hash(0), 0);

        let keys = ports(81..=82);
        let ring = xx(&keys, &[1, 1], 3, MAX_RING_SIZE);
        let expected: [(u64, usize); 4] = [
            (7859399908942313493, 0),
            (8241336090459785962, 1),
            (12882406409176325258, 1),
            (16064866803292627174, 0),
        ];
        assert_eq!(ring.points().collect::<Vec<_>>(), expected);
        assert_eq!(ring.pick_hash(0), 0);
    }

    /// Envoy `HostWeightedTinyRing`: weights 1/2/3, ring exactly 6.
    #[test]
    fn envoy_host_weighted_tiny_ring() {
        let keys = ports(90..=92);
        let ring = xx(&keys, &[1, 2, 3], 6, 6);
        assert_eq!(ring.len(), 6);
        for (hash, shard) in [
            (928266305478181108, 2),
            (4443673547860492590, 2),
            (5583722120771150861, 1),
            (6311230543546372928, 1),
            (13444792449719432967, 2),
            (16117243373044804889, 0),
        ] {
            assert_eq!(ring.pick_hash(hash), shard, "hash {hash}");
        }
    }

    /// Envoy `HostWeightedLargeRing`: weights 1/2/3, minimum_ring_size 6144 → the exact
    /// histogram 987/1932/3081 over 6000 evenly spread hashes. (`LocalityWeightedLargeRing`,
    /// locality weights 1/2/3/0 with one host each, normalizes to the same doubles.)
    #[test]
    fn envoy_host_weighted_large_ring() {
        let keys = ports(90..=92);
        let ring = xx(&keys, &[1, 2, 3], 6144, MAX_RING_SIZE);
        assert_eq!(ring.len(), 6144);
        assert_eq!(histogram(&ring, 6000, 3), [987, 1932, 3081]);
    }

    /// Envoy `HostAndLocalityWeightedTinyRing` / `…LargeRing`: hosts :90..:93 with effective
    /// weights 1/9, 2/9, 2/9, 4/9.
    #[test]
    fn envoy_host_and_locality_weighted() {
        let keys = ports(90..=93);
        let ring = xx(&keys, &[1, 2, 2, 4], 9, 9);
        assert_eq!(ring.len(), 9);
        for (hash, shard) in [
            (928266305478181108, 2),
            (3851675632748031481, 3),
            (5583722120771150861, 1),
            (6311230543546372928, 1),
            (7700377290971790572, 3),
            (12559126875973811811, 3),
            (13444792449719432967, 2),
            (13784988426630141778, 3),
            (16117243373044804889, 0),
        ] {
            assert_eq!(ring.pick_hash(hash), shard, "hash {hash}");
        }
        let ring = xx(&keys, &[1, 2, 2, 4], 9216, MAX_RING_SIZE);
        assert_eq!(ring.len(), 9216);
        assert_eq!(histogram(&ring, 9000, 4), [924, 2009, 2053, 4014]);
    }

    /// Envoy `SmallFractionalScale`: 4 hosts, ring exactly 2 → two hosts get all the traffic.
    #[test]
    fn envoy_small_fractional_scale() {
        let keys = ports(90..=93);
        let ring = xx(&keys, &[1; 4], 2, 2);
        assert_eq!(ring.len(), 2);
        let counts = histogram(&ring, 1024, 4);
        assert_eq!(counts.iter().filter(|&&c| c == 0).count(), 2);
        assert_eq!(counts.iter().sum::<u32>(), 1024);
    }

    /// Envoy `LargeFractionalScale`: 2 hosts, ring exactly 1023 → 512/511 points and the exact
    /// histogram 526/497.
    #[test]
    fn envoy_large_fractional_scale() {
        let keys = ports(90..=91);
        let ring = xx(&keys, &[1, 1], 1023, 1023);
        assert_eq!(ring.len(), 1023);
        let per_host = ring.points().filter(|&(_, s)| s == 0).count();
        assert_eq!((per_host, 1023 - per_host), (512, 511));
        assert_eq!(histogram(&ring, 1023, 2), [526, 497]);
    }

    /// Envoy `LopsidedWeightSmallScale`: 1024 hosts :0..:1023, :0 with 127/128 of the weight
    /// (host weights 127·1023 / 1 give the same doubles as locality weights 127 / 1), ring
    /// exactly 1024: :0 gets 1016 points and every 128th light host one.
    #[test]
    fn envoy_lopsided_weight_small_scale() {
        let keys = ports(0..=1023);
        let mut weights = vec![1u32; 1024];
        weights[0] = 127 * 1023;
        let ring = xx(&keys, &weights, 1024, 1024);
        assert_eq!(ring.len(), 1024);
        assert_eq!(ring.points().filter(|&(_, s)| s == 0).count(), 1016);
        for (hash, shard) in [
            (11664790346325243808, 1),
            (15894554872961148518, 128),
            (13958138884277627155, 256),
            (15803774069438192949, 384),
            (3829253010855396576, 512),
            (17918147347826565154, 640),
            (6442769608292299103, 768),
            (5881074926069334434, 896),
        ] {
            assert_eq!(ring.pick_hash(hash), shard, "hash {hash}");
        }
    }

    /// Envoy `BadRingSizeBounds`, plus our other bounds checks.
    #[test]
    fn bad_bounds() {
        let keys = ports(90..=91);
        let s = shards(&keys, &[1, 1]);
        let err = RingHash::build(&s, 20, 10, RingHashFunction::XxHash, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "ring hash: minimum_ring_size (20) > maximum_ring_size (10)"
        );
        let err = RingHash::build(&s, 1024, MAX_RING_SIZE + 1, RingHashFunction::XxHash, None)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "ring hash: maximum_ring_size 8388609 exceeds the maximum 8388608"
        );
        let err = RingHash::build(&s, 0, 0, RingHashFunction::XxHash, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "ring hash: minimum_ring_size 0 / maximum_ring_size 0 give an empty ring"
        );
    }

    /// Keys go through `std::hash` (murmur2_64) of the hashtag'd key; points through xxHash.
    #[test]
    fn key_lookup_uses_murmur_and_redis_hashtag() {
        let keys = ports(90..=95);
        let ring = RingHash::build(
            &shards(&keys, &[1; 6]),
            12,
            MAX_RING_SIZE,
            RingHashFunction::XxHash,
            Some(HashTag::default()),
        )
        .unwrap();
        assert_eq!(ring.pick(b"foo"), ring.pick_hash(9631199822919835226));
        assert_eq!(ring.pick(b"{foo}.bar"), ring.pick(b"foo"));
        assert_eq!(
            ring.pick(b"foo{}{bar}"),
            ring.pick_hash(std_hash(b"foo{}{bar}"))
        );
    }

    /// A single shard owns every point.
    #[test]
    fn single_shard() {
        let keys = ports(90..=90);
        let ring = xx(&keys, &[3], DEFAULT_MIN_RING_SIZE, MAX_RING_SIZE);
        assert_eq!(ring.len(), 1024);
        assert_eq!(ring.pick(b"x"), 0);
    }
}
