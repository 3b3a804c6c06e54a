//! Control RPCs (JSON), both directions; a request goes on through what the server does with
//! it before Raft or the state machine sees it: a snapshot chunk's conversion (its offset and
//! length checked), a forwarded command's checks.

use ringleader::{
    cluster::wire,
    control::{
        protocol::{RpcRequest, RpcResponse, SnapshotRequest},
        rpc,
    },
    domain::ControlState,
    jobs,
};

pub fn run(data: &[u8]) {
    match wire::decode_json::<RpcRequest>(data) {
        Ok(RpcRequest::InstallSnapshot(chunk)) => {
            let _ = SnapshotRequest::try_from(chunk);
        }
        Ok(RpcRequest::Propose(cmd)) if cmd.check().is_ok() => {
            let _ = rpc::authorize(
                "peer",
                &cmd,
                &ControlState::default(),
                jobs::admit_forwarded,
            );
        }
        _ => {}
    }
    let _ = wire::decode_json::<RpcResponse>(data);
}
