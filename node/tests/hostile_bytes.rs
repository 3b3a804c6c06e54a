//! Any bytes from outside, into every decoder the node has for them: an error, never a
//! panic, and never an allocation beyond the decoder's limit. The real message types go
//! in: membership frames (`Message<PeerId, NodeMeta>` in the wire codec), control RPCs
//! (JSON, then what the RPC server checks before Raft sees them: snapshot chunks' offsets,
//! forwarded commands), the dataset transport's headers and manifests, job specs.
//! (`cargo fuzz` targets with the same bodies live in `fuzz/`.)

use libp2p::PeerId;
use proptest::prelude::*;
use ringleader::{
    cluster::{membership::Message, meta::NodeMeta, wire},
    control::{
        protocol::{RpcRequest, RpcResponse, SnapshotRequest},
        rpc,
        store::SNAPSHOT_BYTES_MAX,
    },
    datasets::{
        transport::{Reply, Request},
        Manifest,
    },
    domain::ControlState,
    jobs,
};

type Membership = Message<PeerId, NodeMeta>;

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn membership_frames(b in bytes(2048)) {
        let _ = wire::decode::<Membership>(&b);
    }

    #[test]
    fn control_rpcs(b in bytes(2048)) {
        after_decoding(wire::decode_json::<RpcRequest>(&b));
        let _ = wire::decode_json::<RpcResponse>(&b);
    }

    /// Snapshot chunks with any offset and length, as a peer sends them: refused past the
    /// snapshot limit, before openraft grows its buffer to the offset.
    #[test]
    fn snapshot_chunks(offset in prop_oneof![any::<u64>(), 0u64..1 << 30], len in 0usize..64) {
        let sent = SnapshotRequest {
            vote: Default::default(),
            meta: Default::default(),
            offset,
            data: vec![0xab; len],
            done: false,
        };
        let bytes = wire::encode_json(&RpcRequest::InstallSnapshot(sent.into())).unwrap();
        let Ok(RpcRequest::InstallSnapshot(chunk)) = wire::decode_json::<RpcRequest>(&bytes) else {
            return Err(TestCaseError::fail("not a snapshot chunk"));
        };
        let fits = offset.checked_add(len as u64).is_some_and(|e| e <= SNAPSHOT_BYTES_MAX as u64);
        prop_assert_eq!(SnapshotRequest::try_from(chunk).is_ok(), fits);
    }

    #[test]
    fn dataset_headers_and_manifests(b in bytes(2048)) {
        let _ = wire::decode::<Request>(&b);
        let _ = wire::decode::<Reply>(&b);
        let _ = Manifest::decode(&b);
    }

    #[test]
    fn job_specs(text in ".{0,600}") {
        let _ = ringleader::jobs::admit_text(&text);
    }

    /// Structured noise: JSON that looks like a manifest, with any values.
    #[test]
    fn manifest_shaped_json(chunk in any::<u32>(), size in any::<u64>(), path in ".{0,40}", hashes in 0usize..4) {
        let hash = "\"".to_string() + &"ab".repeat(32) + "\"";
        let chunks = vec![hash; hashes].join(",");
        let text = format!(
            "{{\"chunk_bytes\":{chunk},\"files\":[{{\"path\":{},\"size\":{size},\"chunks\":[{chunks}]}}]}}",
            serde_json::to_string(&path).unwrap()
        );
        let _ = Manifest::decode(text.as_bytes());
    }
}

/// What the RPC server does with a decoded request before it reaches Raft or the state
/// machine (the pure steps): a snapshot chunk's conversion, a forwarded command's checks.
fn after_decoding(req: Result<RpcRequest, wire::WireError>) {
    match req {
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
}

/// A peer that announces a frame at the limit and then sends nothing (or a little) leaves
/// the reader with an error and a small buffer, not a 4 MiB one.
#[test]
fn an_announced_frame_that_never_comes_is_an_error() {
    let mut io = futures::io::Cursor::new({
        let mut v = (wire::FRAME_BYTES_MAX as u32).to_le_bytes().to_vec();
        v.extend_from_slice(b"only a few bytes");
        v
    });
    let err =
        futures::executor::block_on(wire::read_frame(&mut io, wire::FRAME_BYTES_MAX)).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
}
