//! What the trainer reads back from storage or a peer: checkpoint tensors (safetensors),
//! checkpoint metadata (`meta.json`), the state broadcast at an elastic restart, TensorBoard
//! event files, and the node's control lines.

use trainer::{elastic, observe::event_file, StateMeta, TrainState};

pub fn run(data: &[u8]) {
    let _ = TrainState::decode_tensors(data, "fuzz");
    let _ = serde_json::from_slice::<StateMeta>(data);
    let _ = elastic::decode_state(data);
    let _ = event_file::decode_file(data);
    // Past the records' CRCs, which random bytes rarely get right.
    let _ = event_file::decode_event(data);
    let _ = elastic::parse_control_line(&String::from_utf8_lossy(data));
}
