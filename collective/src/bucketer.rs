//! Gradient buckets (fusion): many small tensors packed into a few large allreduces that
//! overlap with the filling of later buckets.

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::communicator::Communicator;
use crate::element::Element;
use crate::error::{CollectiveError, ReduceOp};

/// How a [`Bucketer`] packs tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketConfig {
    /// Size of every bucket but the first, bytes. Default 25 MiB (as PyTorch DDP).
    pub bucket_bytes: usize,
    /// Size of the first bucket, bytes: small so that the first allreduce starts early.
    /// Default 1 MiB.
    pub first_bucket_bytes: usize,
    /// Buckets handed to the communicator and not yet collected; a push waits beyond this.
    /// Default 64.
    pub in_flight_buckets_max: usize,
    /// The reduction. Default [`ReduceOp::Avg`] (gradient averaging).
    pub op: ReduceOp,
}

impl Default for BucketConfig {
    fn default() -> Self {
        BucketConfig {
            bucket_bytes: 25 * 1024 * 1024,
            first_bucket_bytes: 1024 * 1024,
            in_flight_buckets_max: 64,
            op: ReduceOp::Avg,
        }
    }
}

/// Work for the background task, in the order every rank hands it over.
#[derive(Debug)]
enum Work<T> {
    /// A bucket to allreduce.
    Reduce(Vec<T>),
    /// An allgather buffer (`world` equal segments, this rank's filled).
    Gather(Vec<T>),
}

type Done<T> = (Work<T>, Result<(), CollectiveError>);

/// What [`Bucketer::finish_each`] hands to its callback.
#[derive(Debug)]
pub enum Ready<'a, T> {
    /// Tensor `i` of the step (in push order) is whole: its reduced values.
    Tensor(usize, &'a mut [T]),
    /// The `i`-th gather of the step ([`Bucketer::push_gather`]) is back: every rank's
    /// contribution, rank after rank.
    Gathered(usize, &'a [T]),
}

/// Packs tensors into buckets and allreduces each bucket as soon as it is full, in a
/// background task that owns the [`Communicator`], while the caller goes on pushing.
///
/// Per step: [`Bucketer::push`] every tensor in a fixed order (the same on every rank), then
/// [`Bucketer::finish`] with the same tensors in the same order to wait for the last bucket
/// and unpack the reduced values in place. Bucket buffers are reused from step to step.
/// [`Bucketer::push_gather`] queues an allgather among the buckets (for values that are
/// cheaper to gather than to reduce), in the same ordered stream of operations.
///
/// Invariant: the concatenation of the pushed tensors is cut into buckets of
/// `first_bucket_bytes`, then `bucket_bytes`, …, and where [`Bucketer::send_partial`] is
/// called; bucket `i` is reduced by the `i`-th allreduce on every rank, so ranks that push
/// the same sizes and cut at the same points run the same operations.
pub struct Bucketer<T: Element> {
    cfg: BucketConfig,
    to_worker: mpsc::Sender<Work<T>>,
    from_worker: mpsc::Receiver<Done<T>>,
    worker: JoinHandle<Communicator>,
    current: Vec<T>,
    /// Work of this step already done (buckets reduced, gathers gathered), in order.
    done: Vec<Work<T>>,
    /// Buckets sent and not yet received back.
    in_flight: usize,
    /// Index of the bucket being filled.
    index: usize,
    /// Reusable empty buffers.
    free: Vec<Vec<T>>,
    pushed_elems: usize,
    error: Option<CollectiveError>,
    rank: usize,
    world: usize,
}

impl<T: Element> Bucketer<T> {
    /// Starts the background task that owns `comm`. Needs a tokio runtime.
    pub fn new(comm: Communicator, cfg: BucketConfig) -> Result<Self, CollectiveError> {
        let size = std::mem::size_of::<T>();
        if cfg.bucket_bytes < size
            || cfg.first_bucket_bytes < size
            || cfg.in_flight_buckets_max == 0
        {
            return Err(CollectiveError::Invalid(
                "bucket sizes below one element".into(),
            ));
        }
        let (rank, world) = (comm.rank(), comm.world());
        let (to_worker, mut rx) = mpsc::channel::<Work<T>>(cfg.in_flight_buckets_max);
        let (tx, from_worker) = mpsc::channel(cfg.in_flight_buckets_max);
        let op = cfg.op;
        let worker = tokio::spawn(async move {
            let mut comm = comm;
            while let Some(mut work) = rx.recv().await {
                let r = match &mut work {
                    Work::Reduce(bucket) => comm.allreduce(bucket, op).await,
                    Work::Gather(buf) => comm.allgather(buf).await,
                };
                if tx.send((work, r)).await.is_err() {
                    break;
                }
            }
            comm
        });
        Ok(Bucketer {
            current: Vec::new(),
            cfg,
            to_worker,
            from_worker,
            worker,
            done: Vec::new(),
            in_flight: 0,
            index: 0,
            free: Vec::new(),
            pushed_elems: 0,
            error: None,
            rank,
            world,
        })
    }

    fn capacity(&self, index: usize) -> usize {
        let bytes = if index == 0 {
            self.cfg.first_bucket_bytes
        } else {
            self.cfg.bucket_bytes
        };
        bytes / std::mem::size_of::<T>()
    }

    /// Appends a tensor (copied); every bucket that fills up is handed to the allreduce
    /// task at once. Waits only when `in_flight_buckets_max` buckets are outstanding.
    pub async fn push(&mut self, mut tensor: &[T]) -> Result<(), CollectiveError> {
        self.pushed_elems += tensor.len();
        while !tensor.is_empty() {
            let cap = self.capacity(self.index);
            if self.current.capacity() < cap {
                self.current.reserve_exact(cap - self.current.len());
            }
            let k = (cap - self.current.len()).min(tensor.len());
            self.current.extend_from_slice(&tensor[..k]);
            tensor = &tensor[k..];
            if self.current.len() == cap {
                self.flush().await?;
            }
        }
        Ok(())
    }

    /// Values in the bucket being filled.
    pub fn pending(&self) -> usize {
        self.current.len()
    }

    /// Hands the bucket being filled to the allreduce task now, full or not (nothing if it
    /// is empty): for a caller that knows no more values come for a while, such as a
    /// backward pass between layers. Ranks must call it at the same points of the push
    /// sequence, so that they cut the same buckets.
    pub async fn send_partial(&mut self) -> Result<(), CollectiveError> {
        if self.current.is_empty() {
            return Ok(());
        }
        self.flush().await
    }

    async fn flush(&mut self) -> Result<(), CollectiveError> {
        if self.in_flight >= self.cfg.in_flight_buckets_max {
            self.collect_one().await?;
        }
        let next = self.free.pop().unwrap_or_default();
        let bucket = std::mem::replace(&mut self.current, next);
        self.send(Work::Reduce(bucket)).await?;
        self.index += 1;
        Ok(())
    }

    async fn send(&mut self, work: Work<T>) -> Result<(), CollectiveError> {
        self.to_worker
            .send(work)
            .await
            .map_err(|_| CollectiveError::Aborted)?;
        self.in_flight += 1;
        Ok(())
    }

    /// Queues an allgather of `local` (as long on every rank) behind the buckets handed over
    /// so far; the bucket being filled stays open. Its result, every rank's `local` in rank
    /// order, comes to [`Bucketer::finish_each`]'s callback as [`Ready::Gathered`]. Ranks
    /// must queue the same gathers at the same points of the push sequence.
    pub async fn push_gather(&mut self, local: &[T]) -> Result<(), CollectiveError> {
        if self.in_flight >= self.cfg.in_flight_buckets_max {
            self.collect_one().await?;
        }
        let mut buf = self.free.pop().unwrap_or_default();
        buf.clear();
        buf.resize(local.len() * self.world, T::default());
        buf[local.len() * self.rank..local.len() * (self.rank + 1)].copy_from_slice(local);
        self.send(Work::Gather(buf)).await
    }

    async fn collect_one(&mut self) -> Result<(), CollectiveError> {
        let (work, r) = self
            .from_worker
            .recv()
            .await
            .ok_or(CollectiveError::Aborted)?;
        self.in_flight -= 1;
        self.done.push(work);
        if let Err(e) = r {
            self.error.get_or_insert(e);
        }
        Ok(())
    }

    /// Sends the last, partial bucket, waits for every bucket of the step, and writes the
    /// reduced values back into `tensors` (the pushed tensors, same order and lengths).
    /// The bucketer is then ready for the next step.
    pub async fn finish(&mut self, tensors: &mut [&mut [T]]) -> Result<(), CollectiveError> {
        self.finish_each(tensors, |_| {}).await
    }

    /// [`Bucketer::finish`] that unpacks each bucket as soon as it is back and calls `ready`
    /// with [`Ready::Tensor`] as soon as every value of a tensor is in, and with
    /// [`Ready::Gathered`] for each gather as it comes back: the caller's per-tensor work (an
    /// optimizer update) overlaps the operations still in flight. After an error `ready` is
    /// not called again, and the error is returned once all work of the step is back.
    pub async fn finish_each(
        &mut self,
        tensors: &mut [&mut [T]],
        mut ready: impl FnMut(Ready<'_, T>),
    ) -> Result<(), CollectiveError> {
        if !self.current.is_empty() {
            self.flush().await?;
        }
        let pushed = std::mem::take(&mut self.pushed_elems);
        self.index = 0;
        if self.error.is_none() && tensors.iter().map(|t| t.len()).sum::<usize>() != pushed {
            self.error = Some(CollectiveError::Invalid(format!(
                "finish with other tensors than the {pushed} elements pushed"
            )));
        }
        // Unpack cursor: tensor `t`, value `at` within it.
        let (mut t, mut at) = (0, 0);
        let mut gathers = 0;
        let mut unpacked = 0;
        loop {
            while unpacked < self.done.len() {
                if self.error.is_none() {
                    match &self.done[unpacked] {
                        Work::Gather(buf) => {
                            ready(Ready::Gathered(gathers, buf));
                            gathers += 1;
                        }
                        Work::Reduce(bucket) => {
                            let mut src = bucket.as_slice();
                            while !src.is_empty() && t < tensors.len() {
                                let dst = &mut tensors[t][at..];
                                let k = dst.len().min(src.len());
                                dst[..k].copy_from_slice(&src[..k]);
                                src = &src[k..];
                                at += k;
                                if at == tensors[t].len() {
                                    ready(Ready::Tensor(t, tensors[t]));
                                    t += 1;
                                    at = 0;
                                }
                            }
                        }
                    }
                }
                unpacked += 1;
            }
            if self.in_flight == 0 {
                break;
            }
            self.collect_one().await?;
        }
        if self.error.is_none() {
            // Empty tensors at the end.
            while t < tensors.len() {
                ready(Ready::Tensor(t, tensors[t]));
                t += 1;
            }
        }
        for w in self.done.drain(..) {
            let (Work::Reduce(mut b) | Work::Gather(mut b)) = w;
            b.clear();
            self.free.push(b);
        }
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Stops the background task and returns the communicator.
    pub async fn into_communicator(self) -> Result<Communicator, CollectiveError> {
        drop(self.to_worker);
        drop(self.from_worker);
        self.worker
            .await
            .map_err(|e| CollectiveError::Invalid(format!("bucket task failed: {e}")))
    }
}
