//! File formats TensorFlow's tools read and write, below the kernels and the trainer that use
//! them: TensorFlow's V2 checkpoints ([`checkpoint`]); TFRecord framing ([`tfrecord`]), which TensorBoard's event files and TensorFlow users'
//! training data share; TensorBoard's event files and summaries ([`events`]); the masked
//! CRC32C that TFRecords and the checkpoint bundle's table use; and [`files`], the paths a
//! task's kernels may touch.

pub mod checkpoint;
pub mod events;
pub mod files;
pub mod tfrecord;

/// The delta LevelDB adds to rotated CRCs so that a CRC of data holding CRCs stays strong.
const CRC_MASK_DELTA: u32 = 0xa282_ead8;

/// Masks a CRC32C as LevelDB, TFRecord files and TensorFlow's checkpoints store it.
pub fn mask_crc(crc: u32) -> u32 {
    crc.rotate_right(15).wrapping_add(CRC_MASK_DELTA)
}

/// Undoes [`mask_crc`].
pub fn unmask_crc(masked: u32) -> u32 {
    masked.wrapping_sub(CRC_MASK_DELTA).rotate_left(15)
}

/// The masked CRC32C of `bytes`.
pub fn masked_crc32c(bytes: &[u8]) -> u32 {
    mask_crc(crc32c::crc32c(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masking_round_trips_and_matches_tensorflow() {
        for crc in [0, 1, 0xdead_beef, u32::MAX] {
            assert_eq!(unmask_crc(mask_crc(crc)), crc);
        }
        // TensorFlow's crc32c::Mask(crc32c::Value("")) — the empty string's CRC is 0.
        assert_eq!(masked_crc32c(b""), 0xa282_ead8);
    }
}
