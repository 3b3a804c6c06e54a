//! Real-process tests of GPU discovery and exclusive allocation, with the test-only fake
//! devices of `RINGLEADER_TEST_GPUS` (no GPU needed): members advertise their devices,
//! `--gpus` restricts them, and each rank gets its own devices as `CUDA_VISIBLE_DEVICES`,
//! never another running rank's. Bounded waits; every process is stopped by PID when its
//! cluster is dropped.

mod common;

use std::time::{Duration, Instant};

use common::{exe, wait_job, POLL};
use ringleader::cli::local::LocalCluster;

const WAIT: Duration = Duration::from_secs(40);

/// A command job of `workers` ranks of one gpu each, packed on one member, printing its
/// rank and `CUDA_VISIBLE_DEVICES`, then sleeping (cancelled by the test).
fn spec(name: &str, workers: u32) -> String {
    format!(
        r#"name = "{name}"
kind = "command"
workers = {workers}
placement = "pack"
command = ["sh", "-c", "echo rank=$RANK CVD=$CUDA_VISIBLE_DEVICES; exec sleep 30"]
[resources]
gpus_per_worker = 1
"#
    )
}

/// Polls until job `id`'s logs hold `n` lines starting with `rank=`; returns them sorted.
fn rank_lines(c: &LocalCluster, id: &str, n: usize) -> Vec<String> {
    let deadline = Instant::now() + WAIT;
    loop {
        let mut lines = c.job_log_lines(id, "rank=");
        lines.sort();
        if lines.len() >= n {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "job {id}: {n} rank lines not within {WAIT:?}; got {lines:?}"
        );
        std::thread::sleep(POLL);
    }
}

fn cancel(c: &LocalCluster, id: &str) {
    let _: serde_json::Value = c.nodes[0]
        .client()
        .post(&format!("/v1/jobs/{id}/cancel"), "")
        .expect("cancel");
}

#[test]
fn fake_gpus_are_advertised_restricted_and_given_to_one_rank_each() {
    let root = tempfile::Builder::new()
        .prefix("rl-gpus-")
        .tempdir()
        .unwrap();
    let mut c = LocalCluster::new(exe(), root.path());
    let cpus = ["--cpus".to_string(), "8".to_string()];

    // Phase 1: g0 has four fake H100s; g1 has two A100s of which `--gpus 1` offers one; an
    // index the host lacks stops a node at start, naming it.
    c.env = vec![(
        "RINGLEADER_TEST_GPUS".into(),
        "H100:81559,H100:81559,H100:81559,H100:81559".into(),
    )];
    c.start("g0", &cpus).unwrap();
    c.env = vec![(
        "RINGLEADER_TEST_GPUS".into(),
        "A100:40536,A100:40536".into(),
    )];
    let restricted = [&cpus[..], &["--gpus".to_string(), "1".to_string()]].concat();
    c.start_joining("g1", &restricted).unwrap();
    let missing = [&cpus[..], &["--gpus".to_string(), "0,5".to_string()]].concat();
    let err = c.start_joining("bad", &missing).unwrap_err().to_string();
    assert!(
        err.contains("--gpus: no GPU 5 on this host (it has 0, 1)"),
        "{err}"
    );
    c.wait_all(WAIT, "two alive members and a chief", |s| {
        s.names_in("alive").len() == 2 && s.chief.is_some()
    })
    .unwrap();

    // `status --json` shows each member's devices.
    let out = c.cli(1).args(["status", "--json"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let gpus_of = |name: &str| {
        doc["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("no member {name}: {doc}"))["gpus"]
            .clone()
    };
    let h100 = |i: u32| serde_json::json!({"index": i, "model": "H100", "memory_mb": 81559, "uuid": format!("GPU-test-{i}")});
    assert_eq!(
        gpus_of("g0"),
        serde_json::json!([h100(0), h100(1), h100(2), h100(3)])
    );
    assert_eq!(
        gpus_of("g1"),
        serde_json::json!([{"index": 1, "model": "A100", "memory_mb": 40536, "uuid": "GPU-test-1"}])
    );

    // Phase 2: two jobs of two one-gpu ranks, packed on g0, get disjoint devices.
    let client = c.nodes[0].client();
    let first = client.submit(&spec("first", 2)).unwrap();
    // A command job's ranks on a host all see its devices there, as torchrun's do.
    assert_eq!(
        rank_lines(&c, &first, 2),
        ["rank=0 CVD=0,1", "rank=1 CVD=0,1"]
    );
    let second = client.submit(&spec("second", 2)).unwrap();
    assert_eq!(
        rank_lines(&c, &second, 2),
        ["rank=0 CVD=2,3", "rank=1 CVD=2,3"]
    );

    // Phase 3: no member has two free devices now: a third waits, saying why; a one-rank
    // job gets g1's only device, which is device 1.
    let third = client.submit(&spec("third", 2)).unwrap();
    let doc = wait_job(&c, 0, &third, "unplaceable", WAIT, |d| {
        d.pending_reason.is_some()
    });
    assert_eq!(doc.state, "pending");
    assert_eq!(
        doc.pending_reason.as_deref(),
        Some("gang of 2: at most 1 fit now")
    );
    let single = client.submit(&spec("single", 1)).unwrap();
    assert_eq!(rank_lines(&c, &single, 1), ["rank=0 CVD=1"]);
    let doc = wait_job(&c, 0, &single, "running on g1", WAIT, |d| {
        d.state == "running"
    });
    assert_eq!(doc.ring, ["g1"]);

    // Phase 4: the first ends (cancelled): its devices go to the third.
    cancel(&c, &first);
    wait_job(&c, 0, &third, "placed", WAIT, |d| d.state == "running");
    assert_eq!(
        rank_lines(&c, &third, 2),
        ["rank=0 CVD=0,1", "rank=1 CVD=0,1"]
    );

    for id in [&second, &third, &single] {
        cancel(&c, id);
        wait_job(&c, 0, id, "cancelled", WAIT, |d| d.state == "cancelled");
    }

    // Phase 5: a train job of two one-gpu ranks computes on its (fake) devices: the ranks
    // run the GPU engine's path through the staged CPU twin, agree that not every rank has
    // CUDA (gradients over TCP), and the job trains to the end.
    let train = client
        .submit(
            r#"name = "train-on-gpus"
kind = "train"
workers = 2
placement = "pack"
[resources]
gpus_per_worker = 1
[model]
arch = "cnn"
channels = [4, 8]
fc = 16
[data]
dataset = "digits"
[train]
epochs = 1
max_steps = 20
batch_per_worker = 16
"#,
        )
        .unwrap();
    let doc = wait_job(&c, 0, &train, "succeeded", WAIT, |d| {
        matches!(d.state.as_str(), "succeeded" | "failed")
    });
    assert_eq!(doc.state, "succeeded", "{doc:?}");
    let mut devices = c.job_log_lines(&train, "rank=");
    devices.retain(|l| l.contains(" device="));
    devices.sort();
    assert_eq!(
        devices,
        [
            r#"rank=0 device="cpu (fake gpu, staged like a device)""#,
            r#"rank=1 device="cpu (fake gpu, staged like a device)""#
        ]
    );
    c.stop_all();
}

/// A one-node cluster of 4 cpus under `root`, started with `env`, once it has a chief.
fn one_node(root: &std::path::Path, env: Vec<(String, String)>) -> LocalCluster {
    let mut c = LocalCluster::new(exe(), root);
    c.env = env;
    c.start("g0", &["--cpus".to_string(), "4".to_string()])
        .unwrap();
    c.wait_all(WAIT, "a chief", |s| s.chief.is_some()).unwrap();
    c
}

/// A command job of one rank with `gpus` devices that prints what it was given.
fn env_spec(name: &str, gpus: u32) -> String {
    format!(
        r#"name = "{name}"
kind = "command"
workers = 1
command = ["sh", "-c", "echo rank=$RANK ORDER=$CUDA_DEVICE_ORDER LIBS=$LD_LIBRARY_PATH; exec sleep 30"]
[resources]
gpus_per_worker = {gpus}
"#
    )
}

#[test]
fn ranks_given_gpus_load_the_cuda_libraries_in_pci_order() {
    let root = tempfile::Builder::new()
        .prefix("rl-gpu-libs-")
        .tempdir()
        .unwrap();
    let root_path = root.path().canonicalize().unwrap();
    // Phase 1: a host whose CUDA 13 libraries (fake: empty files, only linked) are in the
    // toolkit at CUDA_HOME, searched before any real one outside the loader's own places,
    // started with a library path of its own and the driver's default order.
    let toolkit = root_path.join("toolkit/lib64");
    std::fs::create_dir_all(&toolkit).unwrap();
    let libs = [
        "libcuda.so.1",
        "libcublas.so.13",
        "libcublasLt.so.13",
        "libnvrtc.so.13",
        "libnccl.so.2",
    ];
    for lib in libs {
        std::fs::write(toolkit.join(lib), b"").unwrap();
    }
    let inherited = root_path.join("inherited");
    std::fs::create_dir_all(&inherited).unwrap();
    let mut c = one_node(
        &root_path,
        vec![
            ("RINGLEADER_TEST_GPUS".into(), "H100:81559".into()),
            (
                "CUDA_HOME".into(),
                root_path.join("toolkit").display().to_string(),
            ),
            ("LD_LIBRARY_PATH".into(), inherited.display().to_string()),
            ("CUDA_DEVICE_ORDER".into(), "FASTEST_FIRST".into()),
        ],
    );
    let links = c.nodes[0].dir.join("cuda-libs");
    for lib in libs {
        let name = lib.rsplit_once(".so").unwrap().0;
        assert_eq!(
            std::fs::read_link(links.join(format!("{name}.so"))).unwrap(),
            toolkit.join(lib)
        );
    }
    let log = c.nodes[0].log();
    assert!(log.contains("cuda libraries found"), "{log}");

    // Phase 2: a command rank given a GPU numbers devices in PCI order and loads the
    // libraries through the link directory alone (never the toolkit's directory: a
    // PyTorch wheel brings its own), then the node's own path.
    let client = c.nodes[0].client();
    let gpu = client.submit(&env_spec("gpu", 1)).unwrap();
    let [line] = rank_lines(&c, &gpu, 1).try_into().unwrap();
    assert_eq!(
        line,
        format!(
            "rank=0 ORDER=PCI_BUS_ID LIBS={}:{}",
            links.display(),
            inherited.display()
        )
    );
    cancel(&c, &gpu);

    // Phase 3: a rank without one keeps the node's library path; its order is the node's
    // own, which the binary set to PCI order at start.
    let cpu = client.submit(&env_spec("cpu", 0)).unwrap();
    assert_eq!(
        rank_lines(&c, &cpu, 1),
        [format!(
            "rank=0 ORDER=PCI_BUS_ID LIBS={}",
            inherited.display()
        )]
    );
    cancel(&c, &cpu);
    c.stop_all();
}

/// A command job of `workers` ranks with `gpus` devices each, packed, printing what a
/// torchrun-style script reads.
fn local_rank_spec(name: &str, workers: u32, gpus: u32) -> String {
    format!(
        r#"name = "{name}"
kind = "command"
workers = {workers}
placement = "pack"
command = ["sh", "-c", "echo rank=$RANK local=$LOCAL_RANK CVD=[${{CUDA_VISIBLE_DEVICES-unset}}] GPUS=$RINGLEADER_GPUS IF=$NCCL_SOCKET_IFNAME,$GLOO_SOCKET_IFNAME; exec sleep 30"]
[resources]
gpus_per_worker = {gpus}
"#
    )
}

#[test]
fn command_ranks_see_their_jobs_devices_in_local_rank_order_and_others_none() {
    let root = tempfile::Builder::new()
        .prefix("rl-gpu-local-")
        .tempdir()
        .unwrap();
    let mut c = one_node(
        root.path(),
        vec![(
            "RINGLEADER_TEST_GPUS".into(),
            "H100:81559,H100:81559".into(),
        )],
    );
    let client = c.nodes[0].client();

    // Phase 1: two ranks of one GPU each on the node's two: both see both, local rank 0's
    // first, so `torch.cuda.set_device(LOCAL_RANK)` is each one's own; the interface of
    // the node's data-plane address (loopback here) goes to NCCL and gloo.
    let pair = client.submit(&local_rank_spec("pair", 2, 1)).unwrap();
    assert_eq!(
        rank_lines(&c, &pair, 2),
        [
            "rank=0 local=0 CVD=[0,1] GPUS=1 IF=lo,lo",
            "rank=1 local=1 CVD=[0,1] GPUS=1 IF=lo,lo"
        ]
    );

    // Phase 2: a second job's rank given no GPU sees none (empty), not the pair's.
    let cpu = client.submit(&local_rank_spec("cpu", 1, 0)).unwrap();
    assert_eq!(
        rank_lines(&c, &cpu, 1),
        ["rank=0 local=0 CVD=[] GPUS=0 IF=lo,lo"]
    );

    // Phase 3: a spec may not pick its own devices.
    let own = format!(
        "{}[env]\nCUDA_VISIBLE_DEVICES = \"1\"\n",
        local_rank_spec("own", 1, 0)
    );
    let err = client.submit(&own).unwrap_err().to_string();
    assert!(err.contains("env.CUDA_VISIBLE_DEVICES: reserved"), "{err}");

    for id in [&pair, &cpu] {
        cancel(&c, id);
    }
    c.stop_all();
}
