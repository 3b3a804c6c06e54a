//! Gradient averaging across the ranks through the collective's [`Bucketer`].

use std::time::{Duration, Instant};

use candle_core::Tensor;
use collective::{BucketConfig, Bucketer, Communicator, ReduceOp};

use crate::error::TrainError;

/// Time spent in one [`GradSync::average`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SyncTimes {
    /// Copying gradients out of candle and into buckets; full buckets are already being
    /// allreduced meanwhile (overlap), s.
    pub pack_s: f64,
    /// Waiting for the last buckets after packing, plus unpacking, s.
    pub wait_s: f64,
}

/// Averages gradients (and a few scalars riding along, such as the loss) over all ranks.
///
/// One background task owns the communicator (inside the [`Bucketer`]); gradients are
/// pushed in parameter order, so every rank runs the same sequence of allreduces.
pub struct GradSync {
    bucketer: Bucketer<f32>,
    world: usize,
}

impl std::fmt::Debug for GradSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GradSync")
            .field("world", &self.world)
            .finish()
    }
}

impl GradSync {
    /// Takes over `comm`. Needs a tokio runtime (the bucket task is spawned on it).
    pub fn new(
        comm: Communicator,
        bucket_bytes: usize,
        first_bucket_bytes: usize,
    ) -> Result<Self, TrainError> {
        let world = comm.world();
        let cfg = BucketConfig {
            bucket_bytes,
            first_bucket_bytes,
            op: ReduceOp::Avg,
            ..BucketConfig::default()
        };
        Ok(GradSync {
            bucketer: Bucketer::new(comm, cfg)?,
            world,
        })
    }

    /// World size.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Averages `grads` (one per parameter, in parameter order; `None` for a parameter the
    /// loss does not reach, taken as zeros of `sizes[i]`) and `extras` in place across ranks.
    /// Returns the averaged gradients as flat buffers.
    pub async fn average(
        &mut self,
        grads: &[Option<Tensor>],
        sizes: &[usize],
        extras: &mut [f32],
    ) -> Result<(Vec<Vec<f32>>, SyncTimes), TrainError> {
        let t0 = Instant::now();
        let mut flat = Vec::with_capacity(grads.len());
        for (g, &n) in grads.iter().zip(sizes) {
            let v = match g {
                Some(t) => t.flatten_all()?.to_vec1::<f32>()?,
                None => vec![0.0; n],
            };
            if v.len() != n {
                return Err(TrainError::StateMismatch(format!(
                    "gradient of {} values for {n}",
                    v.len()
                )));
            }
            self.bucketer.push(&v).await?;
            flat.push(v);
        }
        self.bucketer.push(extras).await?;
        let t1 = Instant::now();
        {
            let mut outs: Vec<&mut [f32]> = flat.iter_mut().map(|v| v.as_mut_slice()).collect();
            outs.push(extras);
            self.bucketer.finish(&mut outs).await?;
        }
        let t2 = Instant::now();
        Ok((
            flat,
            SyncTimes {
                pack_s: secs(t1 - t0),
                wait_s: secs(t2 - t1),
            },
        ))
    }

    /// Stops the bucket task and returns the communicator (for the next generation or a
    /// barrier).
    pub async fn into_communicator(self) -> Result<Communicator, TrainError> {
        Ok(self.bucketer.into_communicator().await?)
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}
