//! Shard pickers: which shard of a cluster owns a key.
//!
//! Each [`crate::model::HashPolicy`] has a picker that places keys exactly where the system it
//! emulates would, so a cluster can move behind respway without moving its data:
//!
//! | policy | emulates | module |
//! |---|---|---|
//! | `Maglev` | Envoy maglev + `redis_proxy` key hash | [`maglev`] |
//! | `RingHash` | Envoy ring hash + `redis_proxy` key hash | [`ring`] |
//! | `Ketama` | twemproxy `distribution: ketama` | [`ketama`] |
//! | `Modula` | twemproxy `distribution: modula` | [`modula`] |
//! | `Crc32Slots` | Codis (`crc32(tag) % 1024`) | [`slots`] |
//! | `Crc16Slots` | Redis Cluster (`crc16(tag) & 16383`) | [`slots`] |
//!
//! A picker is built once per configuration with [`build_picker`] (all validation happens there)
//! and then only looked up: [`ShardPicker::pick`] never allocates and is O(1) or O(log n).
//!
//! Shards are always identified by their index in the cluster's shard list (config order). The
//! hash functions themselves live in [`envoy_hash`] (xxHash64, murmur2_64), [`keyhash`]
//! (twemproxy's key hashes) and [`crc16`]; hashtag rules in [`hashtag`].

pub mod crc16;
pub mod envoy_hash;
pub mod hashtag;
pub mod ketama;
pub mod keyhash;
pub mod maglev;
pub mod modula;
pub mod ring;
pub mod slots;

use std::sync::Arc;

use crate::model::{HashPolicy, HashTag};

pub use hashtag::hashtag_slice;

/// Maps a key to the shard that owns it. Built once per configuration, shared by all
/// connections.
pub trait ShardPicker: Send + Sync + std::fmt::Debug {
    /// Index into the cluster's shard list (config order) for this key (the key as the client
    /// sent it, after any route prefix removal). Applies the cluster's hashtag rule itself.
    ///
    /// Never allocates; the result is always `< shards.len()` of the build input.
    fn pick(&self, key: &[u8]) -> usize;
}

/// Input per shard, in config order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardInput<'a> {
    /// The string the shard is hashed by (Envoy: the primary's `ip:port` or the metadata
    /// `hash_key`; twemproxy ketama and modula: the server name, else `host:port`, just `host`
    /// for port 11211; modula only sorts the shards by it, as twemproxy does). Unused by the slot
    /// policies.
    pub hash_key: &'a str,
    /// Relative weight, at least 1. Unused by the slot policies (but still must not be 0).
    pub weight: u32,
    /// Owned slots as inclusive ranges, for the slot policies; empty on every shard means an even
    /// split in config order. Ignored by the other policies.
    pub slots: &'a [(u32, u32)],
}

/// Why a picker could not be built. Every variant names the offending value; shards are named by
/// their index in the cluster's shard list and their hash key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HashBuildError {
    /// The cluster has no shards.
    #[error("cluster has no shards")]
    NoShards,
    /// A shard has weight 0.
    #[error("shard {shard} ({hash_key:?}) has weight 0; weights must be at least 1")]
    ZeroWeight {
        /// Shard index.
        shard: usize,
        /// Its hash key.
        hash_key: String,
    },
    /// The weights add up to more than the emulated system can count.
    #[error("total shard weight {total} exceeds the maximum {max}")]
    WeightOverflow {
        /// Sum of all weights.
        total: u64,
        /// The largest allowed sum.
        max: u64,
    },
    /// Two shards hash by the same key, so their placement would be undefined.
    #[error("shards {first} and {second} have the same hash key {hash_key:?}")]
    DuplicateHashKey {
        /// First shard index.
        first: usize,
        /// Second shard index.
        second: usize,
        /// The shared hash key.
        hash_key: String,
    },
    /// Maglev's table size must be prime.
    #[error("maglev table_size {0} is not prime")]
    TableSizeNotPrime(u64),
    /// Maglev's table size is above Envoy's limit.
    #[error("maglev table_size {size} exceeds the maximum {max}")]
    TableSizeTooLarge {
        /// Configured size.
        size: u64,
        /// Envoy's limit.
        max: u64,
    },
    /// Ring hash bounds are inverted.
    #[error("ring hash: minimum_ring_size ({min}) > maximum_ring_size ({max})")]
    RingSizeBounds {
        /// `minimum_ring_size`.
        min: u64,
        /// `maximum_ring_size`.
        max: u64,
    },
    /// A ring hash bound is above Envoy's limit.
    #[error("ring hash: {field} {size} exceeds the maximum {max}")]
    RingSizeTooLarge {
        /// Which bound.
        field: &'static str,
        /// Configured value.
        size: u64,
        /// Envoy's limit.
        max: u64,
    },
    /// The ring hash bounds leave no room for any point.
    #[error("ring hash: minimum_ring_size {min} / maximum_ring_size {max} give an empty ring")]
    EmptyRing {
        /// `minimum_ring_size`.
        min: u64,
        /// `maximum_ring_size`.
        max: u64,
    },
    /// A ketama server name is too long for twemproxy's 86-byte point buffer.
    #[error(
        "ketama: shard {shard} name {hash_key:?} is too long: twemproxy hashes \"<name>-<index>\" \
         in an 86-byte buffer, so the name may have at most {max} bytes here"
    )]
    KetamaNameTooLong {
        /// Shard index.
        shard: usize,
        /// Its name (hash key).
        hash_key: String,
        /// Longest name that fits for this shard's point count.
        max: usize,
    },
    /// A slot policy with zero slots.
    #[error("slot count must be at least 1")]
    ZeroSlots,
    /// An even split needs at least one slot per shard.
    #[error("cannot split {slots} slots over {shards} shards")]
    TooManyShards {
        /// Slot count.
        slots: u32,
        /// Shard count.
        shards: usize,
    },
    /// Some shards list slots and this one does not.
    #[error(
        "shard {shard} ({hash_key:?}) has no slots while other shards do; give every shard its \
         slots, or none for an even split"
    )]
    MissingSlots {
        /// Shard index.
        shard: usize,
        /// Its hash key.
        hash_key: String,
    },
    /// A slot range whose start is after its end.
    #[error("shard {shard} ({hash_key:?}) has reversed slot range {start}-{end}")]
    ReversedSlotRange {
        /// Shard index.
        shard: usize,
        /// Its hash key.
        hash_key: String,
        /// Range start.
        start: u32,
        /// Range end.
        end: u32,
    },
    /// A slot range reaching past the last slot.
    #[error("shard {shard} ({hash_key:?}) lists slot {slot}, but slots only go up to {max}")]
    SlotOutOfRange {
        /// Shard index.
        shard: usize,
        /// Its hash key.
        hash_key: String,
        /// The offending slot.
        slot: u32,
        /// The last valid slot (`slots - 1`).
        max: u32,
    },
    /// Two shards (or two ranges of one shard) claim the same slot.
    #[error("slot {slot} is owned twice: by shard {first} ({first_key:?}) and shard {second} ({second_key:?})")]
    SlotOwnedTwice {
        /// The first doubly owned slot.
        slot: u32,
        /// One owner's index.
        first: usize,
        /// Its hash key.
        first_key: String,
        /// The other owner's index.
        second: usize,
        /// Its hash key.
        second_key: String,
    },
    /// A slot no shard owns.
    #[error("slot {slot} is not owned by any shard")]
    SlotUncovered {
        /// The first unowned slot.
        slot: u32,
    },
}

/// The shard picker of a model cluster (its policy, hashtag and shards), as the data plane
/// builds it: the one place that turns a [`Cluster`](crate::model::Cluster) into
/// [`ShardInput`]s (the route compiler, config validation and `respway-compare` all use it).
pub fn cluster_picker(
    cluster: &crate::model::Cluster,
) -> Result<Arc<dyn ShardPicker>, HashBuildError> {
    let inputs: Vec<ShardInput<'_>> = cluster
        .shards
        .iter()
        .map(|s| ShardInput {
            hash_key: &s.hash_key,
            weight: s.weight,
            slots: &s.slots,
        })
        .collect();
    build_picker(&cluster.hash, cluster.hashtag, &inputs)
}

/// Builds the picker for a cluster.
///
/// `shards` is the cluster's shard list in config order; [`ShardPicker::pick`] returns indexes
/// into it. `hashtag` is the cluster's hashtag rule (`None` hashes whole keys); each policy
/// applies it the way its emulated system does (see [`hashtag`]).
///
/// # Errors
///
/// An empty shard list, a weight of 0, and every policy-specific problem listed in
/// [`HashBuildError`].
pub fn build_picker(
    policy: &HashPolicy,
    hashtag: Option<HashTag>,
    shards: &[ShardInput<'_>],
) -> Result<Arc<dyn ShardPicker>, HashBuildError> {
    Ok(match *policy {
        HashPolicy::Maglev { table_size } => {
            Arc::new(maglev::Maglev::build(shards, table_size, hashtag)?)
        }
        HashPolicy::RingHash {
            minimum_ring_size,
            maximum_ring_size,
            function,
        } => Arc::new(ring::RingHash::build(
            shards,
            minimum_ring_size,
            maximum_ring_size,
            function,
            hashtag,
        )?),
        HashPolicy::Ketama { key_hash } => {
            Arc::new(ketama::Ketama::build(shards, key_hash, hashtag)?)
        }
        HashPolicy::Modula { key_hash } => {
            Arc::new(modula::Modula::build(shards, key_hash, hashtag)?)
        }
        HashPolicy::Crc32Slots { slots } => Arc::new(slots::SlotTable::build(
            slots::SlotHash::Crc32 { slots },
            shards,
            hashtag,
        )?),
        HashPolicy::Crc16Slots => Arc::new(slots::SlotTable::build(
            slots::SlotHash::Crc16,
            shards,
            hashtag,
        )?),
    })
}

/// Checks what every policy needs: at least one shard, no weight of 0.
pub(crate) fn validate_shards(shards: &[ShardInput<'_>]) -> Result<(), HashBuildError> {
    if shards.is_empty() {
        return Err(HashBuildError::NoShards);
    }
    if let Some((shard, s)) = shards.iter().enumerate().find(|(_, s)| s.weight == 0) {
        return Err(HashBuildError::ZeroWeight {
            shard,
            hash_key: s.hash_key.to_owned(),
        });
    }
    Ok(())
}

/// Rejects two shards with the same hash key: their points or permutations would tie, and the
/// emulated systems break ties in an undefined order.
pub(crate) fn check_unique_hash_keys(shards: &[ShardInput<'_>]) -> Result<(), HashBuildError> {
    let mut order: Vec<usize> = (0..shards.len()).collect();
    order.sort_by(|&a, &b| shards[a].hash_key.cmp(shards[b].hash_key).then(a.cmp(&b)));
    for pair in order.windows(2) {
        if shards[pair[0]].hash_key == shards[pair[1]].hash_key {
            return Err(HashBuildError::DuplicateHashKey {
                first: pair[0],
                second: pair[1],
                hash_key: shards[pair[0]].hash_key.to_owned(),
            });
        }
    }
    Ok(())
}

/// Envoy's normalized host weights (`thread_aware_lb_impl.cc` `normalizeHostWeights`, one
/// locality, no locality weighting): `weight * 1.0 / sum` in double precision, in host order,
/// plus the smallest and largest of them.
///
/// Envoy refuses a weight sum above `u32::MAX`.
pub(crate) fn envoy_normalized_weights(
    shards: &[ShardInput<'_>],
) -> Result<(Vec<f64>, f64, f64), HashBuildError> {
    let sum: u64 = shards.iter().map(|s| u64::from(s.weight)).sum();
    if sum > u64::from(u32::MAX) {
        return Err(HashBuildError::WeightOverflow {
            total: sum,
            max: u64::from(u32::MAX),
        });
    }
    let sum = sum as f64;
    let weights: Vec<f64> = shards
        .iter()
        .map(|s| f64::from(s.weight) * 1.0 / sum)
        .collect();
    let min = weights.iter().copied().fold(f64::INFINITY, f64::min);
    let max = weights.iter().copied().fold(0.0, f64::max);
    Ok((weights, min, max))
}

/// Inputs shared by the hashers' unit tests.
#[cfg(test)]
pub(crate) mod test_util {
    use super::ShardInput;

    /// Shards named by `keys`, with `weights`, no slot ranges.
    pub(crate) fn shards<'a>(keys: &'a [String], weights: &[u32]) -> Vec<ShardInput<'a>> {
        keys.iter()
            .zip(weights)
            .map(|(k, &w)| ShardInput {
                hash_key: k,
                weight: w,
                slots: &[],
            })
            .collect()
    }

    /// `127.0.0.1:PORT` for each port of `range`.
    pub(crate) fn ports(range: std::ops::RangeInclusive<u16>) -> Vec<String> {
        range.map(|p| format!("127.0.0.1:{p}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{KeyHash, RingHashFunction};

    const DEMO_HOSTS: [&str; 4] = [
        "127.0.0.1:7001",
        "127.0.0.1:7002",
        "127.0.0.1:7003",
        "127.0.0.1:7004",
    ];

    fn demo_shards() -> Vec<ShardInput<'static>> {
        DEMO_HOSTS
            .iter()
            .map(|h| ShardInput {
                hash_key: h,
                weight: 1,
                slots: &[],
            })
            .collect()
    }

    fn port(picker: &dyn ShardPicker, key: &str) -> u16 {
        7001 + picker.pick(key.as_bytes()) as u16
    }

    /// The demo table of the reference implementation (hosts
    /// 127.0.0.1:7001..7004, weight 1; Envoy without hashtagging, twemproxy fnv1a_64 with
    /// hash_tag `{}`), driven through the public API.
    #[test]
    fn demo_table() {
        let shards = demo_shards();
        let tag = Some(HashTag::default());
        let ring = build_picker(
            &HashPolicy::RingHash {
                minimum_ring_size: 1024,
                maximum_ring_size: 8_388_608,
                function: RingHashFunction::XxHash,
            },
            None,
            &shards,
        )
        .unwrap();
        let maglev =
            build_picker(&HashPolicy::Maglev { table_size: 65537 }, None, &shards).unwrap();
        let ketama = build_picker(
            &HashPolicy::Ketama {
                key_hash: KeyHash::Fnv1a64,
            },
            tag,
            &shards,
        )
        .unwrap();
        let modula = build_picker(
            &HashPolicy::Modula {
                key_hash: KeyHash::Fnv1a64,
            },
            tag,
            &shards,
        )
        .unwrap();
        // key, ring, maglev, tw_ketama, tw_modula, rc_slot, codis_slot
        let table: [(&str, u16, u16, u16, u16, u32, u32); 4] = [
            ("foo", 7002, 7001, 7003, 7004, 12182, 289),
            ("{user1000}.following", 7004, 7004, 7004, 7004, 3443, 870),
            ("{user1000}.followers", 7001, 7004, 7004, 7004, 3443, 870),
            ("{}abc", 7001, 7004, 7002, 7004, 5980, 0),
        ];
        for (key, r, m, k, mo, rc, codis) in table {
            assert_eq!(port(&*ring, key), r, "ring {key}");
            assert_eq!(port(&*maglev, key), m, "maglev {key}");
            assert_eq!(port(&*ketama, key), k, "ketama {key}");
            assert_eq!(port(&*modula, key), mo, "modula {key}");
            assert_eq!(
                slots::redis_cluster_slot(key.as_bytes(), tag),
                rc,
                "rc_slot {key}"
            );
            assert_eq!(
                slots::codis_slot(key.as_bytes(), tag, 1024),
                codis,
                "codis_slot {key}"
            );
        }
    }

    /// The slot columns through the public API: each key's shard owns its slot.
    #[test]
    fn demo_slots_through_build_picker() {
        let shards = demo_shards();
        let tag = Some(HashTag::default());
        let rc = build_picker(&HashPolicy::Crc16Slots, tag, &shards).unwrap();
        let codis = build_picker(&HashPolicy::Crc32Slots { slots: 1024 }, tag, &shards).unwrap();
        // Even split of 16384 over 4: 0-4095 / 4096-8191 / 8192-12287 / 12288-16383.
        assert_eq!(rc.pick(b"foo"), 2); // slot 12182
        assert_eq!(rc.pick(b"{user1000}.following"), 0); // slot 3443
        assert_eq!(rc.pick(b"{}abc"), 1); // slot 5980
                                          // Even split of 1024 over 4: 256 each.
        assert_eq!(codis.pick(b"foo"), 1); // slot 289
        assert_eq!(codis.pick(b"{user1000}.followers"), 3); // slot 870
        assert_eq!(codis.pick(b"{}abc"), 0); // slot 0
    }

    #[test]
    fn empty_shard_list_is_an_error() {
        for policy in [
            HashPolicy::Maglev { table_size: 65537 },
            HashPolicy::RingHash {
                minimum_ring_size: 1024,
                maximum_ring_size: 8_388_608,
                function: RingHashFunction::XxHash,
            },
            HashPolicy::Ketama {
                key_hash: KeyHash::Md5,
            },
            HashPolicy::Modula {
                key_hash: KeyHash::Md5,
            },
            HashPolicy::Crc32Slots { slots: 1024 },
            HashPolicy::Crc16Slots,
        ] {
            let err = build_picker(&policy, None, &[]).unwrap_err();
            assert_eq!(err, HashBuildError::NoShards, "{policy:?}");
            assert_eq!(err.to_string(), "cluster has no shards");
        }
    }

    #[test]
    fn zero_weight_is_an_error() {
        let mut shards = demo_shards();
        shards[2].weight = 0;
        for policy in [
            HashPolicy::Maglev { table_size: 65537 },
            HashPolicy::Ketama {
                key_hash: KeyHash::Md5,
            },
            HashPolicy::Modula {
                key_hash: KeyHash::Md5,
            },
            HashPolicy::Crc16Slots,
        ] {
            let err = build_picker(&policy, None, &shards).unwrap_err();
            assert_eq!(
                err.to_string(),
                "shard 2 (\"127.0.0.1:7003\") has weight 0; weights must be at least 1"
            );
        }
    }

    #[test]
    fn duplicate_hash_keys_are_an_error_for_hashed_placement() {
        let mut shards = demo_shards();
        shards[3].hash_key = "127.0.0.1:7002";
        let err =
            build_picker(&HashPolicy::Maglev { table_size: 65537 }, None, &shards).unwrap_err();
        assert_eq!(
            err.to_string(),
            "shards 1 and 3 have the same hash key \"127.0.0.1:7002\""
        );
        // Modula and slots never hash the shard keys.
        build_picker(
            &HashPolicy::Modula {
                key_hash: KeyHash::Md5,
            },
            None,
            &shards,
        )
        .unwrap();
        build_picker(&HashPolicy::Crc16Slots, None, &shards).unwrap();
    }

    /// Pickers are shareable across threads as the trait requires.
    #[test]
    fn pickers_are_send_sync() {
        fn assert_send_sync<T: Send + Sync + ?Sized>() {}
        assert_send_sync::<dyn ShardPicker>();
    }
}
