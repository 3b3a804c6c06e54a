//! Membership frames: the real `Message<PeerId, NodeMeta>` through the wire codec.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringleader::cluster::{membership::Message, meta::NodeMeta, wire};

fuzz_target!(|data: &[u8]| {
    let _ = wire::decode::<Message<libp2p::PeerId, NodeMeta>>(data);
});
