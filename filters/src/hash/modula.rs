//! Twemproxy's modula distribution (`src/hashkit/nc_modula.c`).
//!
//! Twemproxy first sorts a pool's servers by name (`nc_conf.c` `conf_validate_server` sorts the
//! server array with `conf_server_name_cmp`, i.e. `string_compare`: the shorter name first, names
//! of equal length bytewise as `strncmp`), and the pool keeps that order. The name is the one
//! written after the weight (`host:port:weight name`), else `host:port`, or just `host` on port
//! 11211 (`conf_add_server`); here it is the shard's [`ShardInput::hash_key`].
//! `modula_update` then builds a continuum in which each server appears `weight` times, in
//! that sorted order, and `modula_dispatch` picks `continuum[hash % Σweight]`.
//!
//! We keep only the running weight sums in sorted order and binary-search them, which gives the
//! same answer without a table of Σweight entries, and map the sorted position back to the
//! shard's index in config order.
//!
//! The key hash is as for ketama: one shard always wins, the key is hashtag'd (at least one byte
//! between the delimiters), an empty key hashes to 0, anything else goes through the
//! [`KeyHash`].

use std::cmp::Ordering;

use crate::hash::hashtag::tagged;
use crate::hash::keyhash::key_hash;
use crate::hash::{validate_shards, HashBuildError, ShardInput, ShardPicker};
use crate::model::{HashTag, KeyHash};

/// A built modula picker.
#[derive(Debug)]
pub struct Modula {
    /// `ends[i]` = weights of the shards at sorted positions `0..=i` summed; the last is Σweight.
    ends: Box<[u32]>,
    /// `order[i]` = config index of the shard at sorted position `i`.
    order: Box<[u32]>,
    /// The pool's key hash.
    key_hash: KeyHash,
    /// Hashtag rule (twemproxy: an empty tag hashes the whole key).
    hashtag: Option<HashTag>,
}

/// Twemproxy's server order (`string_compare`): the shorter name first, equal lengths bytewise
/// (unsigned bytes, as `strncmp`).
fn twemproxy_name_cmp(a: &str, b: &str) -> Ordering {
    a.len()
        .cmp(&b.len())
        .then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

impl Modula {
    /// Builds the picker for `shards` (config order); `hash_key` is the twemproxy server name,
    /// which only orders the shards (see the module docs). Twemproxy refuses two servers with
    /// the same name; here such shards keep their config order among themselves.
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
        let mut order: Vec<u32> = (0..shards.len() as u32).collect();
        // Stable: equal names (which twemproxy rejects) stay in config order.
        order.sort_by(|&a, &b| {
            twemproxy_name_cmp(shards[a as usize].hash_key, shards[b as usize].hash_key)
        });
        let ends: Vec<u32> = order
            .iter()
            .scan(0u32, |sum, &i| {
                *sum += shards[i as usize].weight;
                Some(*sum)
            })
            .collect();
        Ok(Modula {
            ends: ends.into_boxed_slice(),
            order: order.into_boxed_slice(),
            key_hash,
            hashtag,
        })
    }

    /// The shard (config index) for an already computed 32-bit key hash (`modula_dispatch`).
    #[inline]
    pub fn pick_hash(&self, hash: u32) -> usize {
        let total = self.ends[self.ends.len() - 1];
        let slot = hash % total;
        self.order[self.ends.partition_point(|&end| end <= slot)] as usize
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

    /// Shards named `names` with `weights`, in that (config) order.
    fn named(names: &[&'static str], weights: &[u32]) -> Modula {
        let shards: Vec<ShardInput<'_>> = names
            .iter()
            .zip(weights)
            .map(|(&n, &w)| ShardInput {
                hash_key: n,
                weight: w,
                slots: &[],
            })
            .collect();
        Modula::build(&shards, KeyHash::Fnv1a64, None).unwrap()
    }

    /// The shard (config index) of each continuum slot, `0..Σweight`.
    fn slots(m: &Modula) -> Vec<usize> {
        (0..*m.ends.last().unwrap())
            .map(|h| m.pick_hash(h))
            .collect()
    }

    /// `conf_server_name_cmp`: length first, so "s10" comes after "s2" and "a" before "bb".
    #[test]
    fn sorts_shorter_names_first() {
        let m = named(&["s10", "s2", "a", "bb"], &[1, 1, 1, 1]);
        // Sorted: a (2), bb (3), s2 (1), s10 (0).
        assert_eq!(slots(&m), [2, 3, 1, 0]);
        // Unnamed servers are named "host:port": a shorter address sorts first.
        let m = named(
            &["127.0.0.1:6379", "10.0.0.2:6379", "10.0.0.10:6379"],
            &[1, 1, 1],
        );
        assert_eq!(slots(&m), [1, 2, 0]);
    }

    /// Equal lengths compare as unsigned bytes (`strncmp`), not by Unicode or case rules.
    #[test]
    fn equal_length_names_sort_bytewise() {
        let m = named(&["b", "a", "C", "c"], &[1, 1, 1, 1]);
        // 'C' (0x43) < 'a' < 'b' < 'c'.
        assert_eq!(slots(&m), [2, 1, 0, 3]);
        // "é" is two bytes, 0xc3 0xa9, above any ASCII byte.
        let m = named(&["é", "zz", "ab"], &[1, 1, 1]);
        assert_eq!(slots(&m), [2, 1, 0]);
        let m = named(
            &["127.0.0.1:7003", "127.0.0.1:7001", "127.0.0.1:7002"],
            &[1, 1, 1],
        );
        assert_eq!(slots(&m), [1, 2, 0]);
    }

    /// Each server takes `weight` consecutive slots, in the sorted order; picks are config
    /// indexes.
    #[test]
    fn weights_repeat_in_sorted_order() {
        let m = named(&["s10", "s2", "a", "bb", "s1"], &[1, 3, 2, 1, 2]);
        // Continuum: a a bb s1 s1 s2 s2 s2 s10.
        let expect = [2, 2, 3, 4, 4, 1, 1, 1, 0];
        assert_eq!(slots(&m), expect);
        for hash in [9, 17, 1 << 31, u32::MAX - 1, u32::MAX] {
            assert_eq!(m.pick_hash(hash), expect[(hash % 9) as usize], "{hash}");
        }
        let h = m.hash_key(b"foo");
        assert_eq!(m.pick(b"foo"), expect[(h % 9) as usize]);
    }

    /// Twemproxy refuses servers with the same name; respway keeps them in config order.
    #[test]
    fn duplicate_names_keep_config_order() {
        let m = named(&["b", "a", "b", "a"], &[1, 2, 3, 1]);
        assert_eq!(slots(&m), [1, 1, 3, 0, 2, 2, 2]);
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
