//! CRC-16/XMODEM, the Redis Cluster key slot CRC (polynomial 0x1021, initial value 0, no
//! reflection, no final xor). Also Envoy's `Crc16::crc16` for `envoy.clusters.redis`.

/// Byte-at-a-time lookup table, built at compile time.
const TABLE: [u16; 256] = build_table();

/// Builds the table for polynomial 0x1021, MSB first.
const fn build_table() -> [u16; 256] {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
}

/// CRC-16/XMODEM of `data`. Check value: `"123456789"` → `0x31C3`.
pub fn crc16_xmodem(data: &[u8]) -> u16 {
    data.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ TABLE[usize::from((crc >> 8) as u8 ^ b)]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Redis `src/crc16.c` check value.
    #[test]
    fn check_value() {
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
    }

    /// Envoy `test/extensions/clusters/redis/crc16_test.cc`.
    #[test]
    fn envoy_vectors() {
        assert_eq!(crc16_xmodem(b"foo"), 44950);
        assert_eq!(crc16_xmodem(b"bar"), 37829);
        assert_eq!(crc16_xmodem(b"foo\nbar"), 3951);
        assert_eq!(crc16_xmodem(b"lyft"), 53222);
        assert_eq!(crc16_xmodem(b""), 0);
    }

    /// The table matches the bit-by-bit definition.
    #[test]
    fn table_matches_bitwise() {
        fn bitwise(data: &[u8]) -> u16 {
            let mut crc = 0u16;
            for &b in data {
                crc ^= u16::from(b) << 8;
                for _ in 0..8 {
                    crc = if crc & 0x8000 != 0 {
                        (crc << 1) ^ 0x1021
                    } else {
                        crc << 1
                    };
                }
            }
            crc
        }
        let data: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
        for len in [0, 1, 2, 7, 100, 512] {
            assert_eq!(crc16_xmodem(&data[..len]), bitwise(&data[..len]));
        }
    }
}
