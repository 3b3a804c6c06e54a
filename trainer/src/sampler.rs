//! Which samples each rank trains on at each step.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

/// Position in the training data: the epoch and how many samples of that epoch's
/// permutation the whole group has consumed. It does not depend on the world size, so a
/// state saved by N workers resumes on M.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataCursor {
    /// Epoch, from 0.
    pub epoch: u64,
    /// Samples of this epoch already consumed by all ranks together.
    pub offset: usize,
}

/// Shuffles seeded by (seed, epoch) and shards every global batch by rank.
///
/// Invariant: at a given cursor the global batch is `perm[offset .. offset + world · b]` of the
/// epoch's permutation, and rank `r` takes its `r`-th block of `b`. So N ranks with batch
/// `b` see exactly the samples one rank with batch `N · b` sees, in the same order: the
/// equivalence the data-parallel test relies on. The incomplete last global batch of an
/// epoch is dropped.
#[derive(Debug, Clone)]
pub struct Sampler {
    len: usize,
    seed: u64,
    cached: Option<(u64, Vec<usize>)>,
}

impl Sampler {
    /// A sampler over `len` samples.
    pub fn new(len: usize, seed: u64) -> Self {
        Sampler {
            len,
            seed,
            cached: None,
        }
    }

    /// Full global batches per epoch.
    pub fn steps_per_epoch(&self, global_batch: usize) -> u64 {
        (self.len / global_batch.max(1)) as u64
    }

    /// The permutation of epoch `epoch` (a pure function of seed and epoch).
    pub fn permutation(&mut self, epoch: u64) -> &[usize] {
        if self.cached.as_ref().map(|c| c.0) != Some(epoch) {
            let mut perm: Vec<usize> = (0..self.len).collect();
            let mix = self.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)
                ^ epoch.wrapping_add(1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            perm.shuffle(&mut StdRng::seed_from_u64(mix));
            self.cached = Some((epoch, perm));
        }
        &self.cached.as_ref().expect("just filled").1
    }

    /// Rank `rank`'s sample indices for the global batch at `cursor`, with `batch` per rank.
    pub fn indices(
        &mut self,
        cursor: DataCursor,
        rank: usize,
        world: usize,
        batch: usize,
    ) -> Vec<usize> {
        let start = cursor.offset + rank * batch;
        assert!(
            cursor.offset + world * batch <= self.len,
            "cursor past the last full batch"
        );
        self.permutation(cursor.epoch)[start..start + batch].to_vec()
    }

    /// The cursor after one global batch of `global_batch` samples (next epoch when the
    /// following batch would not be full).
    pub fn advance(&self, cursor: DataCursor, global_batch: usize) -> DataCursor {
        let offset = cursor.offset + global_batch;
        if offset + global_batch > self.len {
            DataCursor {
                epoch: cursor.epoch + 1,
                offset: 0,
            }
        } else {
            DataCursor {
                epoch: cursor.epoch,
                offset,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn ranks_partition_the_single_worker_batch(len in 8usize..200, world in 1usize..5, b in 1usize..8, seed: u64, epoch in 0u64..4) {
            prop_assume!(world * b <= len);
            let mut s = Sampler::new(len, seed);
            let cursor = DataCursor { epoch, offset: 0 };
            let single = s.indices(cursor, 0, 1, world * b);
            let joined: Vec<usize> = (0..world).flat_map(|r| s.indices(cursor, r, world, b)).collect();
            prop_assert_eq!(single, joined);
            let mut perm = s.permutation(epoch).to_vec();
            perm.sort();
            prop_assert_eq!(perm, (0..len).collect::<Vec<_>>());
        }
    }

    #[test]
    fn epochs_shuffle_differently_and_advance_drops_the_tail() {
        let mut s = Sampler::new(10, 3);
        let e0 = s.permutation(0).to_vec();
        let e1 = s.permutation(1).to_vec();
        assert_ne!(e0, e1);
        assert_eq!(s.permutation(0), &e0[..]);
        let c = s.advance(
            DataCursor {
                epoch: 0,
                offset: 4,
            },
            4,
        );
        assert_eq!(
            c,
            DataCursor {
                epoch: 1,
                offset: 0
            }
        );
        assert_eq!(s.steps_per_epoch(4), 2);
    }
}
