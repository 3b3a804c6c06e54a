use super::*;
use crate::Trans;

#[test]
fn the_gemm_plan_computes_the_row_major_product() {
    let (m, n, k) = (5, 3, 4);
    let a: Vec<f32> = (0..m * k).map(|i| i as f32 * 0.5 - 2.0).collect();
    let b: Vec<f32> = (0..k * n).map(|i| 1.0 - i as f32 * 0.25).collect();
    let transpose = |x: &[f32], r: usize, c: usize| {
        let mut t = vec![0.0; r * c];
        for i in 0..r {
            for j in 0..c {
                t[j * r + i] = x[i * c + j];
            }
        }
        t
    };
    let (at, bt) = (transpose(&a, m, k), transpose(&b, k, n));
    let mut want = vec![0.0; m * n];
    crate::kernels::matmul(&mut want, (m, n, k), &a, Trans::No, &b, Trans::No, false);
    for (aa, ta) in [(&a, Trans::No), (&at, Trans::Yes)] {
        for (bb, tb) in [(&b, Trans::No), (&bt, Trans::Yes)] {
            let plan = gemm_plan((m, n, k), ta, tb);
            // cuBLAS's first operand is B, its second A.
            let mut got = vec![f32::NAN; m * n];
            super::kernels_on_cpu::sgemm_reference(plan, false, bb, aa, &mut got);
            assert_eq!(got, want, "{ta:?} {tb:?}: {plan:?}");
        }
    }
}

/// A blocking wait runs on a current-thread runtime (where `block_in_place` panics), on
/// a multi-threaded one (where it lets the other tasks run meanwhile), and outside any.
#[test]
fn a_blocking_wait_runs_on_every_kind_of_runtime() {
    assert_eq!(blocking(|| 1), 1);
    let current = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    assert_eq!(current.block_on(async { blocking(|| 2) }), 2);
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let seen = multi.block_on(async {
        let (tx, rx) = std::sync::mpsc::channel();
        // Another task runs while this one blocks: it answers the blocked one.
        tokio::spawn(async move { tx.send(3).unwrap() });
        blocking(|| rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap())
    });
    assert_eq!(seen, 3);
}

/// Ranks that all compute on CUDA but cannot load libnccl (this machine has neither
/// libcuda nor libnccl) agree to average over TCP instead of failing at NCCL's
/// bootstrap; and ranks of which one is on the CPU do so without trying NCCL at all.
#[test]
fn without_libnccl_every_rank_falls_back_to_tcp() {
    if collective::nccl_available() {
        eprintln!("SKIPPED: libnccl loads here (the fallback is for hosts without it)");
        return;
    }
    let cfg = GroupConfig {
        rank: 0,
        world: 2,
        group_id: 7,
        generation: 1,
        addrs: vec!["127.0.0.1:9".parse().unwrap(); 2],
        secret: vec![1; 32],
        limits: collective::Limits::default(),
    };
    for on_cuda in [[true, true], [true, false]] {
        let comms = Communicator::in_memory(2, collective::Limits::default()).unwrap();
        let handles: Vec<_> = comms
            .into_iter()
            .zip(on_cuda)
            .map(|(mut c, cuda)| {
                let cfg = cfg.clone();
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    rt.block_on(async { connect_nccl(&mut c, &cfg, cuda).await })
                })
            })
            .collect();
        for h in handles {
            let got = h.join().unwrap().expect("no error: gradients go over TCP");
            assert!(got.is_none(), "{on_cuda:?}: no NCCL communicator");
        }
    }
}

#[test]
fn the_device_follows_the_count_and_fakes_stay_on_the_cpu() {
    assert!(matches!(Device::choose(0, false), Ok(Device::Cpu)));
    assert!(matches!(Device::choose(0, true), Ok(Device::Cpu)));
    assert!(matches!(Device::choose(2, true), Ok(Device::Staged)));
    // A real device: opens on a GPU host with the feature, else a clear error.
    match Device::choose(1, false) {
        Ok(d) => assert!(d.describe().starts_with("cuda:0"), "{}", d.describe()),
        Err(e) => {
            eprintln!("SKIPPED: no usable GPU here ({e})");
            let msg = e.to_string();
            assert!(
                msg.contains("cuda") || msg.contains("libcuda") || msg.contains("device"),
                "{msg}"
            );
        }
    }
}
