//! Twemproxy's modula distribution (`src/hashkit/nc_modula.c`).
//!
//! Twemproxy builds a continuum in which each server appears `weight` times, in config order,
//! and picks `continuum[hash % Σweight]`. We keep only the running weight sums and binary-search
//! them, which gives the same answer without a table of Σweight entries.
//!
//! The key hash is as for ketama: one shard always wins, the key is hashtag'd (at least one byte
//! between the delimiters), an empty key hashes to 0, anything else goes through the
//! [`KeyHash`].

use crate::hash::hashtag::tagged;
use crate::hash::keyhash::key_hash;
use crate::hash::{validate_shards, HashBuildError, ShardInput, ShardPicker};
use crate::model::{HashTag, KeyHash};

/// A built modula picker.
#[derive(Debug)]
pub struct Modula {
    /// `ends[i]` = weights of shards `0..=i` summed; the last is Σweight.
    ends: Box<[u32]>,
    /// The pool's key hash.
    key_hash: KeyHash,
    /// Hashtag rule (twemproxy: an empty tag hashes the whole key).
    hashtag: Option<HashTag>,
}

impl Modula {
    /// Builds the picker for `shards` (config order).
    ///
    /// # Errors
    ///
    /// No shards, a weight of 0, or a weight sum above `u32::MAX` (twemproxy's continuum size is a
    /// `uint32_t`).
    pub fn build(
        shards: &[ShardInput<'_>],
        key_hash: KeyHash,
        hashtag: Option<HashTag>,
    ) -> Result<Self, HashBuildError> {
        validate_shards(shards)?;
        let total: u64 = shards.iter().map(|s| u64::from(s.weight)).sum();
        if total > u64::from(u32::MAX) {
            return Err(HashBuildError::WeightOverflow {
                total,
                max: u64::from(u32::MAX),
            });
        }
        let ends: Vec<u32> = shards
            .iter()
            .scan(0u32, |sum, s| {
                *sum += s.weight;
                Some(*sum)
            })
            .collect();
        Ok(Modula {
            ends: ends.into_boxed_slice(),
            key_hash,
            hashtag,
        })
    }

    /// The shard for an already computed 32-bit key hash (`modula_dispatch`).
    #[inline]
    pub fn pick_hash(&self, hash: u32) -> usize {
        let total = self.ends[self.ends.len() - 1];
        let slot = hash % total;
        self.ends.partition_point(|&end| end <= slot)
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
}

impl ShardPicker for Modula {
    fn pick(&self, key: &[u8]) -> usize {
        if self.ends.len() == 1 {
            return 0;
        }
        self.pick_hash(self.hash_key(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(weights: &[u32], tag: Option<HashTag>) -> Modula {
        let names: Vec<String> = (0..weights.len()).map(|i| format!("s{i}")).collect();
        let shards: Vec<ShardInput<'_>> = names
            .iter()
            .zip(weights)
            .map(|(n, &w)| ShardInput {
                hash_key: n,
                weight: w,
                slots: &[],
            })
            .collect();
        Modula::build(&shards, KeyHash::Fnv1a64, tag).unwrap()
    }

    /// The continuum twemproxy would build: each shard `weight` times in order.
    fn continuum(weights: &[u32]) -> Vec<usize> {
        weights
            .iter()
            .enumerate()
            .flat_map(|(i, &w)| std::iter::repeat_n(i, w as usize))
            .collect()
    }

    #[test]
    fn matches_repeated_continuum() {
        for weights in [&[1u32, 1, 1, 1][..], &[3, 1, 2], &[1, 5], &[2, 2, 7, 1, 1]] {
            let m = build(weights, None);
            let c = continuum(weights);
            for hash in (0..200u32).chain([u32::MAX, u32::MAX - 1, 1 << 31]) {
                assert_eq!(
                    m.pick_hash(hash),
                    c[(hash % c.len() as u32) as usize],
                    "{weights:?} {hash}"
                );
            }
        }
    }

    /// Demo column tw_modula (fnv1a_64, hash_tag `{}`, 4 equal shards): hash % 4.
    #[test]
    fn demo_keys() {
        let m = build(&[1, 1, 1, 1], Some(HashTag::default()));
        assert_eq!(m.pick(b"foo"), 3);
        assert_eq!(m.pick(b"{user1000}.following"), 3);
        assert_eq!(m.pick(b"{user1000}.followers"), 3);
        assert_eq!(m.pick(b"{}abc"), 3);
        assert_eq!(
            m.pick(b"foo"),
            (key_hash(KeyHash::Fnv1a64, b"foo") % 4) as usize
        );
    }

    #[test]
    fn single_shard_and_empty_key() {
        let m = build(&[5], None);
        assert_eq!(m.pick(b"anything"), 0);
        let m = build(&[2, 3], None);
        assert_eq!(m.hash_key(b""), 0);
        assert_eq!(m.pick(b""), 0);
    }

    #[test]
    fn weight_overflow() {
        let shards = [
            ShardInput {
                hash_key: "a",
                weight: u32::MAX,
                slots: &[],
            },
            ShardInput {
                hash_key: "b",
                weight: 1,
                slots: &[],
            },
        ];
        let err = Modula::build(&shards, KeyHash::Md5, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "total shard weight 4294967296 exceeds the maximum 4294967295"
        );
    }
}
