//! Control RPCs (JSON), both directions.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringleader::{
    cluster::wire,
    control::protocol::{RpcRequest, RpcResponse},
};

fuzz_target!(|data: &[u8]| {
    let _ = wire::decode_json::<RpcRequest>(data);
    let _ = wire::decode_json::<RpcResponse>(data);
});
