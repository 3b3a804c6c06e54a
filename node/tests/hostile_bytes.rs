//! Any bytes from outside, into every decoder the node has for them: an error, never a
//! panic, and never an allocation beyond the decoder's limit. The real message types go
//! in: membership frames (`Message<PeerId, NodeMeta>` in the wire codec), control RPCs
//! (JSON, then what the RPC server checks before Raft sees them: snapshot chunks' offsets,
//! forwarded commands), the dataset transport's headers and manifests, job specs.
//!
//! The plain-bytes bodies are the `cargo fuzz` targets' own (`fuzz/bodies/`), so they
//! compile and run here in CI; the targets are one line each around them, checked by
//! [`every_fuzz_target_is_a_body_that_runs_here`].

use proptest::prelude::*;
use ringleader::{
    cluster::wire,
    control::{
        protocol::{RpcRequest, SnapshotRequest},
        store::SNAPSHOT_BYTES_MAX,
    },
    datasets::Manifest,
};

#[path = "../fuzz/bodies/dataset_headers.rs"]
mod dataset_headers;
#[path = "../fuzz/bodies/dataset_manifest.rs"]
mod dataset_manifest;
#[path = "../fuzz/bodies/job_spec.rs"]
mod job_spec;
#[path = "../fuzz/bodies/membership.rs"]
mod membership;
#[path = "../fuzz/bodies/rpc.rs"]
mod rpc;

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn membership_frames(b in bytes(2048)) {
        membership::run(&b);
    }

    #[test]
    fn control_rpcs(b in bytes(2048)) {
        rpc::run(&b);
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
        dataset_headers::run(&b);
        dataset_manifest::run(&b);
    }

    #[test]
    fn job_specs(text in ".{0,600}") {
        job_spec::run(text.as_bytes());
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

/// Every `cargo fuzz` target is the one line around its body, and every body is compiled
/// and run by one of the `hostile_bytes` tests (here, the collective's or the trainer's):
/// what CI builds is what `scripts/fuzz.sh` fuzzes, without building the fuzz workspace.
#[test]
fn every_fuzz_target_is_a_body_that_runs_here() {
    let node = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let fuzz = node.join("fuzz");
    let names = |dir: &str| -> std::collections::BTreeSet<String> {
        std::fs::read_dir(fuzz.join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "rs"))
            .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
            .collect()
    };
    let (targets, bodies) = (names("fuzz_targets"), names("bodies"));
    assert!(!targets.is_empty());
    assert_eq!(targets, bodies, "a target for each body");
    let manifest = std::fs::read_to_string(fuzz.join("Cargo.toml")).unwrap();
    let tests: String = ["node", "collective", "trainer"]
        .iter()
        .map(|c| {
            std::fs::read_to_string(node.join("..").join(c).join("tests/hostile_bytes.rs")).unwrap()
        })
        .collect();
    for name in &targets {
        let target = std::fs::read_to_string(fuzz.join(format!("fuzz_targets/{name}.rs"))).unwrap();
        for line in [
            format!("#[path = \"../bodies/{name}.rs\"]"),
            "libfuzzer_sys::fuzz_target!(|data: &[u8]| body::run(data));".to_string(),
        ] {
            assert!(target.contains(&line), "fuzz target {name} lacks `{line}`");
        }
        assert!(
            manifest.contains(&format!("path = \"fuzz_targets/{name}.rs\"")),
            "fuzz target {name} is not a bin of node/fuzz/Cargo.toml"
        );
        assert!(
            tests.contains(&format!("fuzz/bodies/{name}.rs\"]"))
                && tests.contains(&format!("{name}::run(")),
            "no hostile_bytes test runs fuzz/bodies/{name}.rs"
        );
    }
}
