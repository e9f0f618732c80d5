//! Twemproxy's 32-bit key hash functions (its `hashkit`, which follows libmemcached).
//!
//! Quirks kept on purpose, because they decide where keys land:
//!
//! - **Signed `char`.** Twemproxy reads key bytes through a plain `char`, which is signed on x86,
//!   and widens them to `uint32_t`. So in [`fnv1_64`], [`fnv1a_64`], [`fnv1_32`], [`fnv1a_32`] and
//!   [`one_at_a_time`] a byte `>= 0x80` enters as `0xFFFF_FF80 | b`. We emulate x86 (ARM builds of
//!   twemproxy, where `char` is unsigned, place non-ASCII keys differently). [`murmur`] reads
//!   `unsigned char` and the CRCs mask to 8 bits, so they have no such quirk.
//! - **`fnv1_64` / `fnv1a_64` are 32-bit.** They return the low 32 bits of the 64-bit FNV
//!   (`fnv1a_64` even keeps a 32-bit state with the truncated offset basis `0x84222325` and prime
//!   `0x1b3`). Both are the same as the low 32 bits of the real 64-bit FNV-1/FNV-1a.
//! - **`crc32`** is libmemcached's: the top half of the IEEE CRC-32, masked to 15 bits.
//!   [`crc32a`] is the plain IEEE CRC-32.
//! - **`md5`** is the little-endian `u32` of the first four digest bytes.

use md5::{Digest, Md5};

use crate::model::KeyHash;

/// FNV-1 32-bit offset basis.
const FNV_32_INIT: u32 = 2_166_136_261;
/// FNV-1 32-bit prime.
const FNV_32_PRIME: u32 = 16_777_619;
/// The 64-bit FNV offset basis `0xcbf29ce484222325` truncated to 32 bits.
const FNV_64_INIT_LOW: u32 = 0x8422_2325;
/// The 64-bit FNV prime `0x100000001b3` truncated to 32 bits.
const FNV_64_PRIME_LOW: u32 = 0x0000_01b3;

/// A key byte as twemproxy sees it on x86: `(uint32_t)(char)b`, sign-extended.
#[inline]
fn signed_char(b: u8) -> u32 {
    b as i8 as i32 as u32
}

/// Hashes `key` with the given twemproxy key hash.
///
/// This is the whole function; callers apply the hashtag and the empty-key rule first.
pub fn key_hash(kind: KeyHash, key: &[u8]) -> u32 {
    match kind {
        KeyHash::Fnv1a64 => fnv1a_64(key),
        KeyHash::Fnv1a32 => fnv1a_32(key),
        KeyHash::Fnv1_64 => fnv1_64(key),
        KeyHash::Fnv1_32 => fnv1_32(key),
        KeyHash::Md5 => md5(key),
        KeyHash::Crc32a => crc32a(key),
        KeyHash::Crc32 => crc32(key),
        KeyHash::OneAtATime => one_at_a_time(key),
        KeyHash::Murmur => murmur(key),
    }
}

/// Twemproxy `fnv1_64`: FNV-1 with the 64-bit parameters, returning the low 32 bits.
///
/// The low 32 bits of a 64-bit multiply or xor depend only on the low 32 bits of the operands,
/// so a 32-bit state with truncated parameters gives the same result.
pub fn fnv1_64(key: &[u8]) -> u32 {
    key.iter().fold(FNV_64_INIT_LOW, |h, &b| {
        h.wrapping_mul(FNV_64_PRIME_LOW) ^ signed_char(b)
    })
}

/// Twemproxy `fnv1a_64` (its default): FNV-1a with a 32-bit state and the truncated 64-bit
/// parameters.
pub fn fnv1a_64(key: &[u8]) -> u32 {
    key.iter().fold(FNV_64_INIT_LOW, |h, &b| {
        (h ^ signed_char(b)).wrapping_mul(FNV_64_PRIME_LOW)
    })
}

/// Twemproxy `fnv1_32`: 32-bit FNV-1.
pub fn fnv1_32(key: &[u8]) -> u32 {
    key.iter().fold(FNV_32_INIT, |h, &b| {
        h.wrapping_mul(FNV_32_PRIME) ^ signed_char(b)
    })
}

/// Twemproxy `fnv1a_32`: 32-bit FNV-1a.
pub fn fnv1a_32(key: &[u8]) -> u32 {
    key.iter().fold(FNV_32_INIT, |h, &b| {
        (h ^ signed_char(b)).wrapping_mul(FNV_32_PRIME)
    })
}

/// Twemproxy `md5`: the first four MD5 digest bytes as a little-endian `u32`.
pub fn md5(key: &[u8]) -> u32 {
    let digest = Md5::digest(key);
    u32::from_le_bytes([digest[0], digest[1], digest[2], digest[3]])
}

/// Twemproxy `crc32a`: the IEEE CRC-32 (zlib's `crc32`).
pub fn crc32a(key: &[u8]) -> u32 {
    crc32fast::hash(key)
}

/// Twemproxy `crc32` (libmemcached's): bits 16..31 of the IEEE CRC-32, masked to 15 bits.
pub fn crc32(key: &[u8]) -> u32 {
    (crc32fast::hash(key) >> 16) & 0x7fff
}

/// Twemproxy `one_at_a_time`: Bob Jenkins' one-at-a-time hash.
pub fn one_at_a_time(key: &[u8]) -> u32 {
    let mut h = key.iter().fold(0u32, |mut h, &b| {
        h = h.wrapping_add(signed_char(b));
        h = h.wrapping_add(h << 10);
        h ^ (h >> 6)
    });
    h = h.wrapping_add(h << 3);
    h ^= h >> 11;
    h.wrapping_add(h << 15)
}

/// Twemproxy `murmur`: 32-bit MurmurHash2 with seed `0xdeadbeef * len` (libmemcached's).
///
/// Reads unsigned bytes and little-endian 4-byte words.
pub fn murmur(key: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = key.len() as u32;
    let seed = 0xdead_beef_u32.wrapping_mul(len);
    let mut h = seed ^ len;
    let mut words = key.chunks_exact(4);
    for word in &mut words {
        let mut k = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        for (i, &b) in tail.iter().enumerate() {
            h ^= u32::from(b) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^ (h >> 15)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Twemproxy `src/test_all.c` `test_hash_algorithms` (libmemcached `tests/hash_results.h`).
    #[test]
    fn twemproxy_apple_vectors() {
        assert_eq!(one_at_a_time(b"apple"), 2297466611);
        assert_eq!(md5(b"apple"), 3195025439);
        assert_eq!(crc32(b"apple"), 10542);
        assert_eq!(crc32a(b"apple"), 2838417488);
        assert_eq!(fnv1_32(b"apple"), 67176023);
        assert_eq!(fnv1a_32(b"apple"), 280767167);
        assert_eq!(fnv1_64(b"apple"), 473199127);
        assert_eq!(fnv1a_64(b"apple"), 1488911807);
        assert_eq!(murmur(b"apple"), 4142305122);
    }

    #[test]
    fn key_hash_dispatches() {
        assert_eq!(key_hash(KeyHash::OneAtATime, b"apple"), 2297466611);
        assert_eq!(key_hash(KeyHash::Md5, b"apple"), 3195025439);
        assert_eq!(key_hash(KeyHash::Crc32, b"apple"), 10542);
        assert_eq!(key_hash(KeyHash::Crc32a, b"apple"), 2838417488);
        assert_eq!(key_hash(KeyHash::Fnv1_32, b"apple"), 67176023);
        assert_eq!(key_hash(KeyHash::Fnv1a32, b"apple"), 280767167);
        assert_eq!(key_hash(KeyHash::Fnv1_64, b"apple"), 473199127);
        assert_eq!(key_hash(KeyHash::Fnv1a64, b"apple"), 1488911807);
        assert_eq!(key_hash(KeyHash::Murmur, b"apple"), 4142305122);
    }

    /// CRC-32 check value.
    #[test]
    fn crc32a_check_value() {
        assert_eq!(crc32a(b"123456789"), 0xCBF4_3926);
    }

    /// The FNV reference test strings, ASCII rows only (non-ASCII rows differ by the signed-char
    /// quirk), with values from twitter/util `util-hashing/src/test/resources/*_hashes`. The 64-bit
    /// rows are compared on their low 32 bits, which is what twemproxy returns.
    #[test]
    fn fnv_reference_vectors() {
        /// key, fnv1_32, fnv1a_32, fnv1_64, fnv1a_64, crc32 (IEEE).
        type Row = (&'static [u8], u32, u32, u64, u64, u32);
        let rows: [Row; 6] = [
            // key, fnv1_32, fnv1a_32, fnv1_64, fnv1a_64, crc32 (IEEE)
            (
                b"curds a",
                2860606647,
                885788323,
                4633066549644060503,
                410884947093010499,
                2987222506,
            ),
            (
                b"http://www.isthe.com/chongo/tech/comp/calc/index.html",
                1146920024,
                2961013842,
                7771342888142612152,
                13173357477882173522,
                2015271059,
            ),
            (
                b"JNQ@",
                712950950,
                565041912,
                14758722031919712934,
                6946763845996827736,
                2056645130,
            ),
            (
                b"curd",
                3783589783,
                2360939651,
                2049948715728916119,
                5518741951276603139,
                222008191,
            ),
            (
                b"foob",
                3031504779,
                1062237935,
                250092161292133835,
                15929810745020453551,
                1029409986,
            ),
            (
                b"chongo ",
                590883859,
                1809669223,
                776662990174241843,
                17535472964312440711,
                2543709848,
            ),
        ];
        for (key, f1_32, f1a_32, f1_64, f1a_64, crc) in rows {
            assert_eq!(fnv1_32(key), f1_32, "fnv1_32 {key:?}");
            assert_eq!(fnv1a_32(key), f1a_32, "fnv1a_32 {key:?}");
            assert_eq!(fnv1_64(key), f1_64 as u32, "fnv1_64 {key:?}");
            assert_eq!(fnv1a_64(key), f1a_64 as u32, "fnv1a_64 {key:?}");
            assert_eq!(crc32a(key), crc, "crc32 {key:?}");
        }
    }

    /// Bytes >= 0x80 enter sign-extended (x86 `char`), so they differ from an unsigned reading.
    #[test]
    fn signed_char_quirk() {
        let step = |h: u32, v: u32| (h ^ v).wrapping_mul(FNV_64_PRIME_LOW);
        let signed = step(step(step(FNV_64_INIT_LOW, 0x61), 0xFFFF_FFE9), 0x62);
        let unsigned = step(step(step(FNV_64_INIT_LOW, 0x61), 0xE9), 0x62);
        assert_eq!(fnv1a_64(&[b'a', 0xE9, b'b']), signed);
        assert_ne!(signed, unsigned);
        assert_eq!(signed_char(b'a'), 0x61);
        assert_eq!(signed_char(0x80), 0xFFFF_FF80);
        assert_eq!(signed_char(0xFF), 0xFFFF_FFFF);
    }

    /// Murmur covers every tail length.
    #[test]
    fn murmur_tail_lengths_distinct() {
        let data = b"abcdefgh";
        let mut seen = std::collections::HashSet::new();
        for len in 0..=data.len() {
            assert!(seen.insert(murmur(&data[..len])));
        }
    }
}
