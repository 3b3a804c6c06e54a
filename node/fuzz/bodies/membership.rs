//! Membership frames: the real `Message<PeerId, NodeMeta>` through the wire codec.

use ringleader::cluster::{membership::Message, meta::NodeMeta, wire};

pub fn run(data: &[u8]) {
    let _ = wire::decode::<Message<libp2p::PeerId, NodeMeta>>(data);
}
