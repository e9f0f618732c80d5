//! The two 64-bit hashes Envoy uses for consistent hashing:
//!
//! - [`xxhash64`]: plain XXH64, Envoy's `HashUtil::xxHash64`. Maglev places hosts with it (seeds 0
//!   and 1) and ring hash places its points with it by default.
//! - [`murmur2_64`]: the 64-bit MurmurHash2 variant that libstdc++ uses for
//!   `std::hash<std::string>`, Envoy's `MurmurHash::murmurHash2`. With [`STD_HASH_SEED`] it is what
//!   Envoy's `redis_proxy` hashes keys with before asking a maglev or ring hash cluster for a host,
//!   and what ring hash's `MURMUR_HASH_2` option places points with.

/// The seed libstdc++ passes to its 64-bit murmur for `std::hash<std::string>`
/// (Envoy `MurmurHash::STD_HASH_SEED`).
pub const STD_HASH_SEED: u64 = 0xc70f_6907;

/// The murmur multiplier: `0xc6a4a793 << 32 | 0x5bd1e995`.
const MUR_MUL: u64 = 0xc6a4_a793_5bd1_e995;

/// Mixes the high bits down into the low ones.
#[inline]
fn shift_mix(v: u64) -> u64 {
    v ^ (v >> 47)
}

/// 64-bit MurmurHash2 as in libstdc++'s `_Hash_bytes` (little-endian loads).
///
/// The input is consumed in 8-byte little-endian words; a trailing group of 1 to 7 bytes is read
/// as a little-endian integer of that many bytes. Never allocates.
pub fn murmur2_64(data: &[u8], seed: u64) -> u64 {
    let mut hash = seed ^ (data.len() as u64).wrapping_mul(MUR_MUL);
    let mut words = data.chunks_exact(8);
    for word in &mut words {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(word);
        let k = shift_mix(u64::from_le_bytes(bytes).wrapping_mul(MUR_MUL)).wrapping_mul(MUR_MUL);
        hash ^= k;
        hash = hash.wrapping_mul(MUR_MUL);
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        let k = tail
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
        hash ^= k;
        hash = hash.wrapping_mul(MUR_MUL);
    }
    hash = shift_mix(hash).wrapping_mul(MUR_MUL);
    shift_mix(hash)
}

/// `std::hash<std::string>` on Linux/libstdc++: [`murmur2_64`] with [`STD_HASH_SEED`].
///
/// This is the key hash of Envoy's `redis_proxy` for maglev and ring hash clusters.
#[inline]
pub fn std_hash(data: &[u8]) -> u64 {
    murmur2_64(data, STD_HASH_SEED)
}

/// XXH64 of `data` with `seed` (Envoy `HashUtil::xxHash64(input, seed)`).
#[inline]
pub fn xxhash64(data: &[u8], seed: u64) -> u64 {
    xxhash_rust::xxh64::xxh64(data, seed)
}

/// Envoy's `HashUtil::xxHash64(span)`: each part is hashed with the previous part's hash as its
/// seed, starting from seed 0. An empty span hashes to 0.
pub fn xxhash64_chain(parts: &[&[u8]]) -> u64 {
    parts.iter().fold(0, |seed, part| xxhash64(part, seed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Envoy `test/common/common/hash_test.cc`, `TEST(Hash, xxHash)`.
    #[test]
    fn xxhash64_envoy_vectors() {
        assert_eq!(xxhash64(b"foo", 0), 3728699739546630719);
        assert_eq!(xxhash64(b"bar", 0), 5234164152756840025);
        assert_eq!(xxhash64(b"foo\nbar", 0), 8917841378505826757);
        assert_eq!(xxhash64(b"lyft", 0), 4400747396090729504);
        assert_eq!(xxhash64(b"", 0), 17241709254077376921);
    }

    /// Envoy `hash_test.cc`, `TEST(Hash, xxHashWithVector)`: the seed-chained span.
    #[test]
    fn xxhash64_chain_envoy_vector() {
        assert_eq!(xxhash64_chain(&[b"foo", b"bar"]), 17745830980996999794);
    }

    /// Envoy `hash_test.cc`, `TEST(Hash, murmurHash2)` (default seed = STD_HASH_SEED).
    #[test]
    fn murmur2_64_envoy_vectors() {
        assert_eq!(std_hash(b"foo"), 9631199822919835226);
        assert_eq!(std_hash(b"bar"), 11474628671133349555);
        assert_eq!(std_hash(b"foo\nbar"), 16306510975912980159);
        assert_eq!(std_hash(b"lyft"), 12847078931730529320);
        assert_eq!(std_hash(b""), 6142509188972423790);
    }

    /// Every tail length (0..=7 extra bytes) goes through both paths without panicking and gives
    /// distinct values for distinct inputs.
    #[test]
    fn murmur2_64_all_tail_lengths() {
        let data = b"0123456789abcdefXYZ";
        let mut seen = std::collections::HashSet::new();
        for len in 0..=data.len() {
            assert!(seen.insert(std_hash(&data[..len])));
        }
    }
}
