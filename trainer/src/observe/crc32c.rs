//! CRC-32C (Castagnoli), the checksum of TFRecord framing, and TensorFlow's masked form.
//!
//! Written by hand with a 256-entry table built at compile time: the records are small and
//! written every few seconds, so a table-driven byte loop is fast enough.

/// The reflected Castagnoli polynomial.
const POLY: u32 = 0x82F6_3B78;
/// Added after rotating in [`masked_crc32c`] (TensorFlow's `kMaskDelta`).
pub const CRC_MASK_DELTA: u32 = 0xa282_ead8;

/// The byte table of the reflected polynomial.
const TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// CRC-32C of `data` (initial value and final xor `0xFFFF_FFFF`, reflected):
/// `crc32c(b"123456789") == 0xE306_9283`.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc = TABLE[((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8);
    }
    !crc
}

/// TensorFlow's masked CRC-32C of `data` (a CRC stored next to the bytes it covers is
/// rotated and offset, so that the CRC of a CRC is not trivially zero):
/// `((crc >> 15) | (crc << 17)) + 0xa282ead8`, wrapping.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c(data);
    crc.rotate_right(15).wrapping_add(CRC_MASK_DELTA)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
        // RFC 3720 (iSCSI) B.4: 32 bytes of zeros, of 0xFF, and ascending.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xFFu8; 32]), 0x62A8_AB43);
        let ascending: Vec<u8> = (0u8..32).collect();
        assert_eq!(crc32c(&ascending), 0x46DD_794E);
    }

    #[test]
    #[allow(clippy::manual_rotate)] // The formula as TensorFlow states it.
    fn mask_rotates_then_adds() {
        let crc = crc32c(b"123456789");
        let want = ((crc >> 15) | (crc << 17)).wrapping_add(0xa282_ead8);
        assert_eq!(masked_crc32c(b"123456789"), want);
        // Both as TensorBoard's own `pywrap_tensorflow.masked_crc32c` computes them; the
        // second is the length field of an empty record.
        assert_eq!(masked_crc32c(b"123456789"), 0xc78a_b0e5);
        assert_eq!(masked_crc32c(&0u64.to_le_bytes()), 0x0798_0329);
    }
}
