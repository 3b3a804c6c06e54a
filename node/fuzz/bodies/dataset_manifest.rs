//! Dataset manifests as a peer or a store hands them over.

use ringleader::datasets::Manifest;

pub fn run(data: &[u8]) {
    let _ = Manifest::decode(data);
}
