//! Helpers shared by the integration tests: in-process groups over the in-memory backend.

#![allow(dead_code)]

use collective::{Communicator, Limits};
use trainer::{TrainError, TrainSpec, Trainer};

/// Runs `f` on every rank of an in-memory group of `world`, one thread (with its own tokio
/// runtime) per rank, and returns the results in rank order.
pub fn on_group<T, F, Fut>(world: usize, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(Communicator) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = T>,
{
    let comms = Communicator::in_memory(world, Limits::default()).expect("in-memory group");
    let handles: Vec<_> = comms
        .into_iter()
        .map(|c| {
            let f = f.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(f(c))
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread"))
        .collect()
}

/// Trains `steps` steps on every rank of a group of `world` and returns each rank's
/// parameters.
pub fn train_params(spec: &TrainSpec, world: usize, steps: u64) -> Vec<Vec<Vec<f32>>> {
    let spec = spec.clone();
    on_group(world, move |c| {
        let spec = spec.clone();
        async move {
            let mut t = Trainer::new(&spec, c)?;
            for _ in 0..steps {
                t.step().await?;
            }
            Ok::<_, TrainError>(t.params()?.to_vec())
        }
    })
    .into_iter()
    .map(|r| r.expect("training"))
    .collect()
}

/// Largest absolute difference between two parameter sets, and the largest magnitude.
pub fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> (f32, f32) {
    let mut d = 0.0f32;
    let mut m = 0.0f32;
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.len(), y.len());
        for (p, q) in x.iter().zip(y) {
            d = d.max((p - q).abs());
            m = m.max(p.abs());
        }
    }
    (d, m)
}

/// Waits until every child exited successfully; kills them all and panics when one fails or
/// `within` passes first.
pub fn wait_success(children: &mut [std::process::Child], within: std::time::Duration) {
    let deadline = std::time::Instant::now() + within;
    loop {
        let states: Vec<_> = children.iter_mut().map(|c| c.try_wait().unwrap()).collect();
        let failed = states.iter().any(|s| matches!(s, Some(s) if !s.success()));
        if failed || std::time::Instant::now() > deadline {
            for c in children.iter_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
            panic!("worker failed or deadline passed: {states:?}");
        }
        if states.iter().all(Option::is_some) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A tokio runtime: multi-threaded with two workers (where waits block in place, as a GPU
/// or device group's do, while other tasks must go on), or current-thread.
pub fn runtime(multi_thread: bool) -> tokio::runtime::Runtime {
    if multi_thread {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    }
    .expect("runtime")
}
