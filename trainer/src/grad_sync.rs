//! Gradient averaging across the ranks through the collective's [`Bucketer`].

use std::time::{Duration, Instant};

use candle_core::Tensor;
use collective::{bf16, BucketConfig, Bucketer, Communicator, ReduceOp};

use crate::error::TrainError;
use crate::spec::GradCompression;

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
///
/// With [`GradCompression::Bf16`] the gradients and the extras are rounded to bf16 (to
/// nearest even) before packing, allreduced as bf16 (the collective reduces through f32
/// and rounds each partial sum back to bf16), and widened to f32 afterwards: half the
/// bytes on the wire, about 3 significant digits per value. Every rank still ends with the
/// same bits (an allreduce leaves the same result on every rank), so ranks stay identical.
pub struct GradSync {
    buckets: Buckets,
    world: usize,
}

/// The bucketer in the element type that goes over the wire.
enum Buckets {
    F32(Bucketer<f32>),
    /// With the reused bf16 staging buffer (one step's gradients and extras, unpacked).
    Bf16(Bucketer<bf16>, Vec<bf16>),
}

impl std::fmt::Debug for GradSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GradSync")
            .field("world", &self.world)
            .finish()
    }
}

impl GradSync {
    /// Takes over `comm`. Needs a tokio runtime (the bucket task is spawned on it). Bucket
    /// sizes are in bytes of the wire type (so a bf16 bucket holds twice the values).
    pub fn new(
        comm: Communicator,
        bucket_bytes: usize,
        first_bucket_bytes: usize,
        compression: GradCompression,
    ) -> Result<Self, TrainError> {
        let world = comm.world();
        let cfg = BucketConfig {
            bucket_bytes,
            first_bucket_bytes,
            op: ReduceOp::Avg,
            ..BucketConfig::default()
        };
        let buckets = match compression {
            GradCompression::None => Buckets::F32(Bucketer::new(comm, cfg)?),
            GradCompression::Bf16 => Buckets::Bf16(Bucketer::new(comm, cfg)?, Vec::new()),
        };
        Ok(GradSync { buckets, world })
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
            match &mut self.buckets {
                Buckets::F32(b) => b.push(&v).await?,
                Buckets::Bf16(b, stage) => {
                    stage.clear();
                    stage.extend(v.iter().map(|&x| bf16::from_f32(x)));
                    b.push(stage).await?;
                }
            }
            flat.push(v);
        }
        let t1 = match &mut self.buckets {
            Buckets::F32(b) => {
                b.push(extras).await?;
                let t1 = Instant::now();
                let mut outs: Vec<&mut [f32]> = flat.iter_mut().map(|v| v.as_mut_slice()).collect();
                outs.push(extras);
                b.finish(&mut outs).await?;
                t1
            }
            Buckets::Bf16(b, stage) => {
                stage.clear();
                stage.extend(extras.iter().map(|&x| bf16::from_f32(x)));
                b.push(stage).await?;
                let t1 = Instant::now();
                // Unpack the whole step into the staging buffer, then widen to f32.
                stage.clear();
                stage.resize(sizes.iter().sum::<usize>() + extras.len(), bf16::ZERO);
                {
                    let mut outs: Vec<&mut [bf16]> = Vec::with_capacity(sizes.len() + 1);
                    let mut rest = stage.as_mut_slice();
                    for &n in sizes.iter().chain([&extras.len()]) {
                        let (head, tail) = rest.split_at_mut(n);
                        outs.push(head);
                        rest = tail;
                    }
                    b.finish(&mut outs).await?;
                }
                let mut src = stage.iter();
                for d in flat
                    .iter_mut()
                    .flat_map(|v| v.iter_mut())
                    .chain(extras.iter_mut())
                {
                    *d = src.next().map_or(0.0, |x| x.to_f32());
                }
                t1
            }
        };
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
        Ok(match self.buckets {
            Buckets::F32(b) => b.into_communicator().await?,
            Buckets::Bf16(b, _) => b.into_communicator().await?,
        })
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}
