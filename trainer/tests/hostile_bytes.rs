//! Any bytes from storage or a peer, into the trainer's decoders: an error, never a panic,
//! and no allocation beyond the decoder's limit. Checkpoint tensors (safetensors) and
//! metadata (`meta.json`), the state broadcast at an elastic restart, TensorBoard event
//! files, the node's control lines. Plain bytes go through the `checkpoint_meta` `cargo fuzz`
//! target's own body (`node/fuzz/bodies/`), every decoder at once.

use proptest::prelude::*;
use trainer::{
    elastic,
    observe::{crc32c::masked_crc32c, event_file},
    TrainState,
};

#[path = "../../node/fuzz/bodies/checkpoint_meta.rs"]
mod checkpoint_meta;

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

/// A safetensors header (length, then JSON) naming one tensor with any shape and offsets,
/// then `data` bytes.
fn safetensors_shaped(shape: &[u64], start: u64, end: u64, dtype: &str, data: usize) -> Vec<u8> {
    let header = format!(
        "{{\"t\":{{\"dtype\":\"{dtype}\",\"shape\":{shape:?},\"data_offsets\":[{start},{end}]}}}}"
    );
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.resize(out.len() + data, 0);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Checkpoint tensors and metadata, the state broadcast, event files and records,
    /// control lines.
    #[test]
    fn any_bytes(b in bytes(2048)) {
        checkpoint_meta::run(&b);
    }

    /// Past the magic: the three section lengths take any values.
    #[test]
    fn state_broadcast_with_magic(lens in any::<[u64; 3]>(), tail in bytes(256)) {
        let mut b = b"RLSTATE1".to_vec();
        for len in lens {
            b.extend_from_slice(&len.to_le_bytes());
        }
        b.extend(tail);
        prop_assert!(elastic::decode_state(&b).is_err());
    }

    /// Shapes whose element count overflows, or disagrees with the offsets: an error.
    #[test]
    fn safetensors_shaped_noise(
        shape in proptest::collection::vec(prop_oneof![0u64..8, any::<u64>()], 0..4),
        start in prop_oneof![0u64..64, any::<u64>()],
        end in prop_oneof![0u64..64, any::<u64>()],
        dtype in prop_oneof![Just("F32"), Just("F16"), Just("U8"), Just("X")],
        data in 0usize..64,
    ) {
        let _ = TrainState::decode_tensors(&safetensors_shaped(&shape, start, end, dtype, data), "hostile");
    }

    /// Records with good CRCs around any bytes, so the event decoder sees them.
    #[test]
    fn event_records(records in proptest::collection::vec(bytes(256), 0..4)) {
        let mut file = Vec::new();
        for r in &records {
            event_file::append_record(&mut file, r);
        }
        let _ = event_file::decode_file(&file);
    }

    /// A record that announces a huge length: an error before any allocation.
    #[test]
    fn event_record_lengths(len in any::<u64>(), tail in bytes(64)) {
        let head = len.to_le_bytes();
        let mut file = head.to_vec();
        file.extend_from_slice(&masked_crc32c(&head).to_le_bytes());
        file.extend(tail);
        let _ = event_file::decode_file(&file);
    }

    #[test]
    fn control_lines(line in ".{0,600}") {
        let _ = elastic::parse_control_line(&line);
    }

    #[test]
    fn control_lines_shaped(json in ".{0,200}") {
        let line = format!("{} {json}", elastic::GENERATION_LINE_PREFIX);
        let _ = elastic::parse_control_line(&line);
    }
}
