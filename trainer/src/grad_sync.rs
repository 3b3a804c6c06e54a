//! Gradient averaging across the ranks through the collective's [`Bucketer`].

use std::time::{Duration, Instant};

use collective::{bf16, BucketConfig, Bucketer, Communicator, Ready, ReduceOp};

use crate::error::TrainError;
use crate::kernels::{column_sums, matmul, Trans};
use crate::spec::GradCompression;

/// Time spent in one step's gradient averaging.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SyncTimes {
    /// Copying gradients into buckets ([`GradSync::push`]); full buckets are already being
    /// allreduced meanwhile (overlap), s.
    pub pack_s: f64,
    /// Waiting for the last buckets after the last push, plus unpacking
    /// ([`GradSync::finish`]), s.
    pub wait_s: f64,
    /// Bytes this rank sent over the collective in the step, by the ring's schedule:
    /// 2·(n−1)/n of every allreduced bucket, (n−1)× its own gathered factors.
    pub sent_bytes: u64,
}

/// What a push carried: a parameter's gradient or the extras.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Param(usize),
    Extras,
}

/// A dense layer whose gradients travel as sufficient factors ([`GradSync::push_factors`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Factors {
    /// Weight `[n_out, n_in]` and bias `[n_out]` parameter indices.
    w: usize,
    b: usize,
    batch: usize,
    n_in: usize,
    n_out: usize,
}

/// Averages gradients (and a few scalars riding along, such as the loss) over all ranks.
///
/// One background task owns the communicator (inside the [`Bucketer`]). Per step:
/// [`GradSync::push_extras`] and [`GradSync::push`] for every parameter as soon as its
/// gradient is ready (full buckets go on the wire at once, while the caller computes the
/// next gradients), then [`GradSync::finish`], which waits for the rest and writes the
/// averages back in place. The push order is the caller's, and must be the same on every
/// rank (it is: the same model runs the same backward), so every rank runs the same
/// sequence of allreduces.
///
/// With one rank the values are already their averages and nothing is copied; with
/// [`GradCompression::Bf16`] the gradients and the extras are rounded to bf16 (to
/// nearest even) before packing, allreduced as bf16 (the collective reduces through f32
/// and rounds each partial sum back to bf16), and widened to f32 afterwards: half the
/// bytes on the wire, about 3 significant digits per value. Every rank still ends with the
/// same bits (an allreduce leaves the same result on every rank), so ranks stay identical.
pub struct GradSync {
    buckets: Buckets,
    world: usize,
    /// This step's pushes, in order.
    slots: Vec<Slot>,
    /// This step's factor gathers, in order.
    factors: Vec<Factors>,
    /// Staging buffer of one rank's factors.
    factor_stage: Vec<f32>,
    times: SyncTimes,
}

/// The bucketer in the element type that goes over the wire.
enum Buckets {
    F32(Bucketer<f32>),
    /// With the reused bf16 staging buffer.
    Bf16(Bucketer<bf16>, Vec<bf16>),
}

impl Buckets {
    /// Bytes of one value on the wire.
    fn elem_bytes(&self) -> usize {
        match self {
            Buckets::F32(_) => 4,
            Buckets::Bf16(..) => 2,
        }
    }
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
        Ok(GradSync {
            buckets,
            world,
            slots: Vec::new(),
            factors: Vec::new(),
            factor_stage: Vec::new(),
            times: SyncTimes::default(),
        })
    }

    /// World size.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Averages a few `values` across ranks now, outside any step (between steps only): a
    /// step of no parameters with `values` as its extras.
    pub async fn average_now(&mut self, values: &mut [f32]) -> Result<(), TrainError> {
        if !self.slots.is_empty() || !self.factors.is_empty() {
            return Err(TrainError::StateMismatch(
                "average_now inside a step".into(),
            ));
        }
        self.push_extras(values).await?;
        self.finish(&mut [], values, |_, _| {}).await?;
        Ok(())
    }

    /// Queues the gradient of parameter `param` (every parameter once per step).
    pub async fn push(&mut self, param: usize, grad: &[f32]) -> Result<(), TrainError> {
        self.push_slot(Slot::Param(param), grad).await
    }

    /// Queues a dense layer's gradients as its sufficient factors: `out_grad`, the gradient
    /// of the layer's pre-activation output (`[batch, n_out]`), and `input` (`[batch, n_in]`),
    /// for weight `w` (`[n_out, n_in]`) and bias `b`. They are allgathered, and
    /// [`GradSync::finish`] forms the averages `(1/n)·Σ_r out_gradᵣᵀ·inputᵣ` and
    /// `(1/n)·Σ_r Σ_rows out_gradᵣ`, the same on every rank (with bf16 compression the
    /// factors travel as bf16). More than one rank.
    pub async fn push_factors(
        &mut self,
        (w, b): (usize, usize),
        out_grad: &[f32],
        input: &[f32],
        (n_in, n_out): (usize, usize),
    ) -> Result<(), TrainError> {
        let t0 = Instant::now();
        let batch = out_grad.len() / n_out.max(1);
        if self.world == 1
            || out_grad.len() != batch * n_out
            || input.len() != batch * n_in
            || self.slots.contains(&Slot::Param(w))
            || self.factors.iter().any(|f| f.w == w)
        {
            return Err(TrainError::StateMismatch(format!(
                "sufficient factors of parameter {w}: {} and {} values for {n_out} × {n_in}, world {}",
                out_grad.len(),
                input.len(),
                self.world
            )));
        }
        match &mut self.buckets {
            Buckets::F32(bucketer) => {
                self.factor_stage.clear();
                self.factor_stage.extend_from_slice(out_grad);
                self.factor_stage.extend_from_slice(input);
                bucketer.push_gather(&self.factor_stage).await?;
            }
            Buckets::Bf16(bucketer, stage) => {
                narrow(stage, out_grad.iter().chain(input));
                bucketer.push_gather(stage).await?;
            }
        }
        let own = ((out_grad.len() + input.len()) * self.buckets.elem_bytes()) as u64;
        self.times.sent_bytes += own * (self.world as u64 - 1);
        self.factors.push(Factors {
            w,
            b,
            batch,
            n_in,
            n_out,
        });
        self.times.pack_s += secs(t0.elapsed());
        Ok(())
    }

    /// Queues the extras (once per step).
    pub async fn push_extras(&mut self, extras: &[f32]) -> Result<(), TrainError> {
        self.push_slot(Slot::Extras, extras).await
    }

    /// Marks a point where the caller pauses pushing (between layers of the backward pass):
    /// the bucket being filled goes on the wire now if it holds at least `min_bytes` (of the
    /// wire type), rather than waiting to fill up.
    pub async fn pause(&mut self, min_bytes: usize) -> Result<(), TrainError> {
        match &mut self.buckets {
            _ if self.world == 1 => {}
            Buckets::F32(b) => {
                if b.pending() * 4 >= min_bytes {
                    b.send_partial().await?;
                }
            }
            Buckets::Bf16(b, _) => {
                if b.pending() * 2 >= min_bytes {
                    b.send_partial().await?;
                }
            }
        }
        Ok(())
    }

    async fn push_slot(&mut self, slot: Slot, values: &[f32]) -> Result<(), TrainError> {
        let t0 = Instant::now();
        let factored = |i: usize| self.factors.iter().any(|f| f.w == i || f.b == i);
        if self.slots.contains(&slot) || matches!(slot, Slot::Param(i) if factored(i)) {
            return Err(TrainError::StateMismatch(format!(
                "{slot:?} pushed twice in a step"
            )));
        }
        self.slots.push(slot);
        if self.world == 1 {
            // The average over one rank is the value itself: nothing to copy or send.
            return Ok(());
        }
        match &mut self.buckets {
            Buckets::F32(b) => b.push(values).await?,
            Buckets::Bf16(b, stage) => {
                narrow(stage, values);
                b.push(stage).await?;
            }
        }
        let n = self.world as u64;
        let bytes = (values.len() * self.buckets.elem_bytes()) as u64;
        self.times.sent_bytes += 2 * (n - 1) * bytes / n;
        self.times.pack_s += secs(t0.elapsed());
        Ok(())
    }

    /// Waits for every bucket of the step and overwrites the pushed gradients (`grads`,
    /// indexed by parameter, each as long as pushed) and `extras` with the averages across
    /// ranks, calling `ready(i, average)` for parameter `i` as soon as its bucket(s) are
    /// back and unpacked, so that work on it (the optimizer update) overlaps the allreduce
    /// of later buckets. Every parameter must have been pushed. Returns the step's times
    /// (`wait_s` includes the time spent in `ready`).
    pub async fn finish(
        &mut self,
        grads: &mut [Vec<f32>],
        extras: &mut [f32],
        mut ready: impl FnMut(usize, &[f32]),
    ) -> Result<SyncTimes, TrainError> {
        let t0 = Instant::now();
        let slots = std::mem::take(&mut self.slots);
        let factors = std::mem::take(&mut self.factors);
        let mut params: Vec<Option<&mut [f32]>> =
            grads.iter_mut().map(|g| Some(g.as_mut_slice())).collect();
        let mut factor_outs: Vec<(&mut [f32], &mut [f32])> = Vec::with_capacity(factors.len());
        for f in &factors {
            let w = params.get_mut(f.w).and_then(Option::take);
            let b = params.get_mut(f.b).and_then(Option::take);
            match (w, b) {
                (Some(w), Some(b)) if w.len() == f.n_out * f.n_in && b.len() == f.n_out => {
                    factor_outs.push((w, b))
                }
                _ => {
                    return Err(TrainError::StateMismatch(format!(
                    "sufficient factors for parameters {} and {}: out of range or of another shape",
                    f.w, f.b
                )))
                }
            }
        }
        let mut extras = Some(extras);
        let mut outs: Vec<&mut [f32]> = Vec::with_capacity(slots.len());
        for s in &slots {
            let out = match *s {
                Slot::Param(i) => params.get_mut(i).and_then(Option::take),
                Slot::Extras => extras.take(),
            };
            outs.push(out.ok_or_else(|| TrainError::StateMismatch(format!("{s:?} out of range")))?);
        }
        if params.iter().any(Option::is_some) {
            return Err(TrainError::StateMismatch(
                "a parameter's gradient was not pushed this step".into(),
            ));
        }
        let param_of = |k: usize| match slots[k] {
            Slot::Param(i) => Some(i),
            Slot::Extras => None,
        };
        match &mut self.buckets {
            _ if self.world == 1 => {
                for (k, o) in outs.iter().enumerate() {
                    if let Some(i) = param_of(k) {
                        ready(i, o);
                    }
                }
            }
            Buckets::F32(b) => {
                let n = self.world;
                b.finish_each(&mut outs, |r| match r {
                    Ready::Tensor(k, v) => {
                        if let Some(i) = param_of(k) {
                            ready(i, v);
                        }
                    }
                    Ready::Gathered(j, all) => {
                        let (f, (dw, db)) = (&factors[j], &mut factor_outs[j]);
                        average_from_factors(all, n, f, dw, db);
                        ready(f.w, dw);
                        ready(f.b, db);
                    }
                })
                .await?
            }
            Buckets::Bf16(b, stage) => {
                // Unpack into the staging buffer, widening each tensor to f32 as it is in.
                stage.clear();
                stage.resize(outs.iter().map(|o| o.len()).sum(), bf16::ZERO);
                let mut views: Vec<&mut [bf16]> = Vec::with_capacity(outs.len());
                let mut rest = stage.as_mut_slice();
                for o in &outs {
                    let (head, tail) = rest.split_at_mut(o.len());
                    views.push(head);
                    rest = tail;
                }
                let (n, wide) = (self.world, &mut self.factor_stage);
                b.finish_each(&mut views, |r| match r {
                    Ready::Tensor(k, v) => {
                        for (d, s) in outs[k].iter_mut().zip(v.iter()) {
                            *d = s.to_f32();
                        }
                        if let Some(i) = param_of(k) {
                            ready(i, outs[k]);
                        }
                    }
                    Ready::Gathered(j, all) => {
                        wide.clear();
                        wide.extend(all.iter().map(|x| x.to_f32()));
                        let (f, (dw, db)) = (&factors[j], &mut factor_outs[j]);
                        average_from_factors(wide, n, f, dw, db);
                        ready(f.w, dw);
                        ready(f.b, db);
                    }
                })
                .await?;
            }
        }
        self.times.wait_s = secs(t0.elapsed());
        Ok(std::mem::take(&mut self.times))
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

/// Replaces `stage` with `values` rounded to bf16 (to nearest even).
fn narrow<'a>(stage: &mut Vec<bf16>, values: impl IntoIterator<Item = &'a f32>) {
    stage.clear();
    stage.extend(values.into_iter().map(|&x| bf16::from_f32(x)));
}

/// The average over ranks of a dense layer's gradients from every rank's sufficient factors
/// (`all`: rank after rank, each `[out_grad | input]`): `dw = (1/n)·Σ_r out_gradᵣᵀ·inputᵣ`,
/// `db = (1/n)·Σ_r Σ_rows out_gradᵣ`. Every rank computes it from the same values in the
/// same order, so every rank gets the same bits.
fn average_from_factors(all: &[f32], n: usize, f: &Factors, dw: &mut [f32], db: &mut [f32]) {
    let (g_len, x_len) = (f.batch * f.n_out, f.batch * f.n_in);
    for (r, part) in all.chunks_exact(g_len + x_len).enumerate() {
        let (g, x) = part.split_at(g_len);
        matmul(
            dw,
            (f.n_out, f.n_in, f.batch),
            g,
            Trans::Yes,
            x,
            Trans::No,
            r > 0,
        );
        column_sums(g, db, r > 0);
    }
    let scale = 1.0 / n as f32;
    for v in dw.iter_mut().chain(db.iter_mut()) {
        *v *= scale;
    }
}
