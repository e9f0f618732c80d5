//! Slot tables: Redis Cluster (`crc16(tag) & 16383`) and Codis (`crc32(tag) % slots`).
//!
//! A key's slot is computed from its hashtag, then a slot → shard table gives the owner:
//!
//! - **Redis Cluster** ([`SlotHash::Crc16`]): CRC-16/XMODEM of the tag, 16384 slots; an empty
//!   tag (`"{}abc"`) hashes the whole key.
//! - **Codis** ([`SlotHash::Crc32`]): IEEE CRC-32 of the tag modulo the slot count (Codis uses
//!   1024); an empty tag hashes the empty string, so `"{}abc"` is slot 0.
//!
//! The table comes from each shard's inclusive slot ranges, which must cover every slot exactly
//! once. When no shard lists any slot, the slots are split evenly into contiguous ranges in
//! config order, as `redis-cli --cluster create` does (float cursor, `lround`): 3 shards get
//! 0-5460 / 5461-10922 / 10923-16383.

use crate::hash::crc16::crc16_xmodem;
use crate::hash::hashtag::tagged;
use crate::hash::{validate_shards, HashBuildError, ShardInput, ShardPicker};
use crate::model::HashTag;

/// Redis Cluster's slot count.
pub const REDIS_CLUSTER_SLOTS: u32 = 16384;
/// Codis's slot count (`MaxSlotNum`).
pub const CODIS_SLOTS: u32 = 1024;

/// How a key becomes a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotHash {
    /// Codis: `crc32_ieee(tag) % slots`, empty tags allowed.
    Crc32 {
        /// Number of slots (Codis: 1024).
        slots: u32,
    },
    /// Redis Cluster: `crc16_xmodem(tag) & 16383`, empty tags hash the whole key.
    Crc16,
}

impl SlotHash {
    /// Number of slots.
    pub fn slots(self) -> u32 {
        match self {
            SlotHash::Crc32 { slots } => slots,
            SlotHash::Crc16 => REDIS_CLUSTER_SLOTS,
        }
    }

    /// The slot of `key` under the hashtag rule `tag` (`None` hashes the whole key).
    #[inline]
    pub fn slot(self, key: &[u8], tag: Option<HashTag>) -> u32 {
        match self {
            SlotHash::Crc32 { slots } => codis_slot(key, tag, slots),
            SlotHash::Crc16 => redis_cluster_slot(key, tag),
        }
    }
}

/// Redis Cluster `CLUSTER KEYSLOT`: `crc16_xmodem(hashtag(key)) & 16383`, Redis hashtag rule
/// (an empty tag hashes the whole key). `tag: None` hashes the whole key.
#[inline]
pub fn redis_cluster_slot(key: &[u8], tag: Option<HashTag>) -> u32 {
    u32::from(crc16_xmodem(tagged(key, tag, false))) & (REDIS_CLUSTER_SLOTS - 1)
}

/// Codis: `crc32_ieee(hashtag(key)) % slots`, Codis hashtag rule (an empty tag is used as is).
/// `tag: None` hashes the whole key. `slots` must not be 0.
#[inline]
pub fn codis_slot(key: &[u8], tag: Option<HashTag>, slots: u32) -> u32 {
    crc32fast::hash(tagged(key, tag, true)) % slots
}

/// `redis-cli --cluster create`'s split of `slots` over `n` masters: a float cursor advancing by
/// `slots / n`, each range ending at `lround(cursor + per - 1)`, the last one at `slots - 1`.
/// Returns inclusive `(first, last)` ranges; `n` must be between 1 and `slots`.
pub fn even_split(slots: u32, n: usize) -> Vec<(u32, u32)> {
    let per = f64::from(slots) / n as f64;
    let mut cursor = 0.0f64;
    let mut first: u32 = 0;
    let mut ranges = Vec::with_capacity(n);
    for i in 0..n {
        // f64::round is round-half-away-from-zero, like C's lround.
        let mut last = (cursor + per - 1.0).round() as i64;
        if last > i64::from(slots) || i == n - 1 {
            last = i64::from(slots) - 1;
        }
        let last = (last.max(i64::from(first))) as u32;
        ranges.push((first, last));
        first = last + 1;
        cursor += per;
    }
    ranges
}

/// A built slot table: contiguous slot ranges sorted by start, each with its owner.
pub struct SlotTable {
    /// How keys become slots.
    hash: SlotHash,
    /// First slot of each range, ascending; the first is 0.
    starts: Box<[u32]>,
    /// Owner (shard index) of each range.
    owners: Box<[u32]>,
    /// Hashtag rule.
    hashtag: Option<HashTag>,
}

impl std::fmt::Debug for SlotTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotTable")
            .field("hash", &self.hash)
            .field("ranges", &self.starts.len())
            .field("hashtag", &self.hashtag)
            .finish_non_exhaustive()
    }
}

impl SlotTable {
    /// Builds the table from each shard's `slots` (config order), or an even split when no shard
    /// lists any.
    ///
    /// # Errors
    ///
    /// No shards, a weight of 0, zero slots, more shards than slots (even split), a shard without
    /// slots while others have some, a reversed range, a slot past the last one, a slot owned
    /// twice, or a slot owned by nobody. Each error names the shard and the slot.
    pub fn build(
        hash: SlotHash,
        shards: &[ShardInput<'_>],
        hashtag: Option<HashTag>,
    ) -> Result<Self, HashBuildError> {
        validate_shards(shards)?;
        let nslots = hash.slots();
        if nslots == 0 {
            return Err(HashBuildError::ZeroSlots);
        }

        // (start, end, shard), inclusive.
        let mut ranges: Vec<(u32, u32, usize)> = Vec::new();
        if shards.iter().all(|s| s.slots.is_empty()) {
            if shards.len() > nslots as usize {
                return Err(HashBuildError::TooManyShards {
                    slots: nslots,
                    shards: shards.len(),
                });
            }
            ranges.extend(
                even_split(nslots, shards.len())
                    .into_iter()
                    .enumerate()
                    .map(|(shard, (start, end))| (start, end, shard)),
            );
        } else {
            for (shard, s) in shards.iter().enumerate() {
                if s.slots.is_empty() {
                    return Err(HashBuildError::MissingSlots {
                        shard,
                        hash_key: s.hash_key.to_owned(),
                    });
                }
                for &(start, end) in s.slots {
                    if start > end {
                        return Err(HashBuildError::ReversedSlotRange {
                            shard,
                            hash_key: s.hash_key.to_owned(),
                            start,
                            end,
                        });
                    }
                    if end >= nslots {
                        return Err(HashBuildError::SlotOutOfRange {
                            shard,
                            hash_key: s.hash_key.to_owned(),
                            slot: start.max(nslots),
                            max: nslots - 1,
                        });
                    }
                    ranges.push((start, end, shard));
                }
            }
        }

        ranges.sort_by_key(|&(start, end, shard)| (start, end, shard));
        let mut starts: Vec<u32> = Vec::with_capacity(ranges.len());
        let mut owners: Vec<u32> = Vec::with_capacity(ranges.len());
        // The next slot that must be covered; u64 so that `end + 1` cannot overflow.
        let mut next: u64 = 0;
        let mut prev_owner = usize::MAX;
        for &(start, end, shard) in &ranges {
            if u64::from(start) > next {
                return Err(HashBuildError::SlotUncovered { slot: next as u32 });
            }
            if u64::from(start) < next {
                // Sorted and contiguous so far: the range before this one covers `start`.
                let (first, second) = (prev_owner.min(shard), prev_owner.max(shard));
                return Err(HashBuildError::SlotOwnedTwice {
                    slot: start,
                    first,
                    first_key: shards[first].hash_key.to_owned(),
                    second,
                    second_key: shards[second].hash_key.to_owned(),
                });
            }
            if shard != prev_owner {
                starts.push(start);
                owners.push(shard as u32);
            }
            prev_owner = shard;
            next = u64::from(end) + 1;
        }
        if next < u64::from(nslots) {
            return Err(HashBuildError::SlotUncovered { slot: next as u32 });
        }
        Ok(SlotTable {
            hash,
            starts: starts.into_boxed_slice(),
            owners: owners.into_boxed_slice(),
            hashtag,
        })
    }

    /// The slot of `key` under this table's hash and hashtag rule.
    #[inline]
    pub fn slot(&self, key: &[u8]) -> u32 {
        self.hash.slot(key, self.hashtag)
    }

    /// The shard owning `slot` (`slot` must be below the slot count).
    #[inline]
    pub fn owner(&self, slot: u32) -> usize {
        let i = self.starts.partition_point(|&s| s <= slot);
        self.owners[i - 1] as usize
    }

    /// The owner of every slot as merged `(first, last, shard)` ranges, in slot order.
    pub fn ranges(&self) -> Vec<(u32, u32, usize)> {
        let n = self.starts.len();
        (0..n)
            .map(|i| {
                let last = if i + 1 < n {
                    self.starts[i + 1] - 1
                } else {
                    self.hash.slots() - 1
                };
                (self.starts[i], last, self.owners[i] as usize)
            })
            .collect()
    }
}

impl ShardPicker for SlotTable {
    fn pick(&self, key: &[u8]) -> usize {
        self.owner(self.slot(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BRACES: Option<HashTag> = Some(HashTag {
        open: b'{',
        close: b'}',
    });

    fn inputs<'a>(slots: &[&'a [(u32, u32)]]) -> Vec<ShardInput<'a>> {
        const KEYS: [&str; 6] = ["s0", "s1", "s2", "s3", "s4", "s5"];
        slots
            .iter()
            .enumerate()
            .map(|(i, s)| ShardInput {
                hash_key: KEYS[i],
                weight: 1,
                slots: s,
            })
            .collect()
    }

    /// redis.io `CLUSTER KEYSLOT` examples.
    #[test]
    fn redis_keyslot_examples() {
        assert_eq!(redis_cluster_slot(b"somekey", BRACES), 11058);
        assert_eq!(redis_cluster_slot(b"foo{hash_tag}", BRACES), 2515);
        assert_eq!(redis_cluster_slot(b"bar{hash_tag}", BRACES), 2515);
    }

    /// Envoy `redis_cluster_lb_test.cc` `RedisLoadBalancerContextImplTest`: "foo" and
    /// "{foo}bar" both hash to crc16 44950 (slot 44950 % 16384).
    #[test]
    fn envoy_redis_cluster_context() {
        assert_eq!(crc16_xmodem(b"foo"), 44950);
        assert_eq!(redis_cluster_slot(b"{foo}bar", BRACES), 44950 % 16384);
        assert_eq!(redis_cluster_slot(b"foo", BRACES), 44950 % 16384);
    }

    /// Hashing-facts section 7 slot columns.
    #[test]
    fn demo_slots() {
        for (key, rc, codis) in [
            ("foo", 12182, 289),
            ("{user1000}.following", 3443, 870),
            ("{user1000}.followers", 3443, 870),
            ("{}abc", 5980, 0),
        ] {
            assert_eq!(redis_cluster_slot(key.as_bytes(), BRACES), rc, "{key}");
            assert_eq!(
                codis_slot(key.as_bytes(), BRACES, CODIS_SLOTS),
                codis,
                "{key}"
            );
        }
    }

    /// Codis `mapper_test.go` `TestHashSlot` pairs hash alike; `"{}abc"` is slot 0.
    #[test]
    fn codis_hash_equalities() {
        for (key, same) in crate::hash::hashtag::tests::CODIS_CASES {
            assert_eq!(
                codis_slot(key.as_bytes(), BRACES, CODIS_SLOTS),
                codis_slot(same.as_bytes(), BRACES, CODIS_SLOTS),
                "{key}"
            );
        }
        assert_eq!(codis_slot(b"{}abc", BRACES, CODIS_SLOTS), 0);
    }

    /// IEEE CRC-32 check value, which Codis uses.
    #[test]
    fn crc32_check_value() {
        assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
    }

    /// `redis-cli --cluster create` with 3 masters.
    #[test]
    fn redis_cli_three_master_split() {
        assert_eq!(
            even_split(16384, 3),
            [(0, 5460), (5461, 10922), (10923, 16383)]
        );
        assert_eq!(even_split(16384, 1), [(0, 16383)]);
        assert_eq!(
            even_split(16384, 4),
            [(0, 4095), (4096, 8191), (8192, 12287), (12288, 16383)]
        );
        assert_eq!(even_split(1024, 3), [(0, 340), (341, 682), (683, 1023)]);
        assert_eq!(even_split(3, 3), [(0, 0), (1, 1), (2, 2)]);
    }

    /// Every even split covers all slots once, in order, for many shard counts.
    #[test]
    fn even_split_always_covers() {
        for slots in [1, 2, 7, 1024, 16384] {
            for n in 1..=slots.min(300) as usize {
                let ranges = even_split(slots, n);
                assert_eq!(ranges.len(), n);
                assert_eq!(ranges[0].0, 0);
                assert_eq!(ranges[n - 1].1, slots - 1);
                for w in ranges.windows(2) {
                    assert_eq!(w[0].1 + 1, w[1].0, "{slots} over {n}");
                }
                assert!(ranges.iter().all(|&(a, b)| a <= b));
            }
        }
    }

    #[test]
    fn even_split_table() {
        let shards = inputs(&[&[], &[], &[]]);
        let t = SlotTable::build(SlotHash::Crc16, &shards, BRACES).unwrap();
        assert_eq!(
            t.ranges(),
            [(0, 5460, 0), (5461, 10922, 1), (10923, 16383, 2)]
        );
        assert_eq!(t.owner(0), 0);
        assert_eq!(t.owner(5460), 0);
        assert_eq!(t.owner(5461), 1);
        assert_eq!(t.owner(16383), 2);
        assert_eq!(t.pick(b"somekey"), 2); // 11058
        assert_eq!(t.pick(b"foo{hash_tag}"), 0); // 2515
    }

    #[test]
    fn explicit_ranges_fragmented() {
        let a: &[(u32, u32)] = &[(0, 99), (200, 1023)];
        let b: &[(u32, u32)] = &[(100, 199)];
        let shards = inputs(&[a, b]);
        let t = SlotTable::build(SlotHash::Crc32 { slots: 1024 }, &shards, BRACES).unwrap();
        assert_eq!(t.ranges(), [(0, 99, 0), (100, 199, 1), (200, 1023, 0)]);
        for slot in 0..1024 {
            let want = usize::from((100..200).contains(&slot));
            assert_eq!(t.owner(slot), want, "slot {slot}");
        }
        assert_eq!(t.pick(b"{}abc"), 0);
        assert_eq!(t.slot(b"foo"), 289);
        assert_eq!(t.pick(b"foo"), 0);
    }

    #[test]
    fn adjacent_ranges_of_one_owner_merge() {
        let a: &[(u32, u32)] = &[(0, 3), (4, 7)];
        let b: &[(u32, u32)] = &[(8, 9)];
        let shards = inputs(&[a, b]);
        let t = SlotTable::build(SlotHash::Crc32 { slots: 10 }, &shards, None).unwrap();
        assert_eq!(t.ranges(), [(0, 7, 0), (8, 9, 1)]);
    }

    #[test]
    fn errors_name_shard_and_slot() {
        let err = |slots: &[&[(u32, u32)]], n: u32| {
            SlotTable::build(SlotHash::Crc32 { slots: n }, &inputs(slots), None)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err(&[&[(0, 511)], &[]], 1024),
            "shard 1 (\"s1\") has no slots while other shards do; give every shard its slots, or \
             none for an even split"
        );
        assert_eq!(
            err(&[&[(0, 511)], &[(512, 1024)]], 1024),
            "shard 1 (\"s1\") lists slot 1024, but slots only go up to 1023"
        );
        assert_eq!(
            err(&[&[(0, 511)], &[(2000, 3000)]], 1024),
            "shard 1 (\"s1\") lists slot 2000, but slots only go up to 1023"
        );
        assert_eq!(
            err(&[&[(0, 511)], &[(600, 512)]], 1024),
            "shard 1 (\"s1\") has reversed slot range 600-512"
        );
        assert_eq!(
            err(&[&[(0, 511)], &[(500, 1023)]], 1024),
            "slot 500 is owned twice: by shard 0 (\"s0\") and shard 1 (\"s1\")"
        );
        assert_eq!(
            err(&[&[(0, 511)], &[(0, 0), (512, 1023)]], 1024),
            "slot 0 is owned twice: by shard 0 (\"s0\") and shard 1 (\"s1\")"
        );
        assert_eq!(
            err(&[&[(0, 510)], &[(512, 1023)]], 1024),
            "slot 511 is not owned by any shard"
        );
        assert_eq!(
            err(&[&[(1, 511)], &[(512, 1023)]], 1024),
            "slot 0 is not owned by any shard"
        );
        assert_eq!(
            err(&[&[(0, 511)], &[(512, 1022)]], 1024),
            "slot 1023 is not owned by any shard"
        );
        assert_eq!(err(&[&[], &[]], 0), "slot count must be at least 1");
        assert_eq!(
            err(&[&[], &[], &[]], 2),
            "cannot split 2 slots over 3 shards"
        );
    }

    /// `hashtag: None` hashes whole keys, for both rules.
    #[test]
    fn no_hashtag_rule_hashes_whole_key() {
        assert_eq!(
            redis_cluster_slot(b"{user1000}.following", None),
            u32::from(crc16_xmodem(b"{user1000}.following")) & 16383
        );
        assert_eq!(
            codis_slot(b"{}abc", None, 1024),
            crc32fast::hash(b"{}abc") % 1024
        );
    }
}
