//! Each step reports the bytes this rank sent over the collective, by the ring's schedule:
//! 2·(n−1)/n of the allreduced gradients (plus the few extras), nothing on one rank.

mod common;

use common::on_group;
use trainer::{SufficientFactors, TrainError, TrainParams, TrainSpec, Trainer};

#[test]
fn a_step_reports_the_ring_allreduce_bytes_it_sent() {
    for world in [1usize, 2, 3] {
        let spec = TrainSpec {
            train: TrainParams {
                sufficient_factors: SufficientFactors::Never,
                ..TrainParams::default()
            },
            ..TrainSpec::default()
        };
        let results = on_group(world, move |c| {
            let spec = spec.clone();
            async move {
                let mut t = Trainer::new(&spec, c)?;
                let m = t.step().await?;
                let params: usize = t.params().unwrap().iter().map(Vec::len).sum();
                Ok::<_, TrainError>((m.sent_bytes, params))
            }
        });
        for r in results {
            let (sent, params) = r.unwrap();
            let n = world as u64;
            let grads = 2 * (n - 1) * (params as u64 * 4) / n;
            assert!(
                sent >= grads && sent <= grads + 2 * 64 * 4,
                "world {world}: sent {sent}, gradients alone {grads}"
            );
            if world == 1 {
                assert_eq!(sent, 0);
            }
        }
    }
}
