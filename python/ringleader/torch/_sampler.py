"""`ElasticSampler`: a batch sampler whose sharding follows the ring's membership.

Each epoch `e` is one permutation of the `n` samples, the same on every rank (drawn from
`seed + e`). The sampler keeps one position in it, the samples consumed so far by the
whole group; each step takes the next `world × b` samples and this rank takes its `b`
(`b` = `batch_size`, less at the epoch's end so that every rank gets as many; the last
fewer-than-`world` samples of an epoch are dropped). The position is part of the
optimizer's commit: after a re-form the group goes back to the agreed commit's position and
shares out the *remaining* samples of the epoch over the new world, so each sample is seen
once per epoch across the re-form (the lost step's samples again, the rest once).

Batches are made when asked for, so give the sampler to a `DataLoader` with
`num_workers=0` for that guarantee (worker processes prefetch batches drawn for the old
membership).
"""

from collections.abc import Iterator

import torch

from ._session import session


class ElasticSampler:
    """See the module doc: `DataLoader(dataset, batch_sampler=ElasticSampler(len(dataset),
    batch_size, seed))`, epochs through `for epoch in sampler.epochs(k)`."""

    def __init__(self, n: int, batch_size: int, seed: int = 0) -> None:
        if n < 1 or batch_size < 1:
            raise ValueError(f"ElasticSampler: n {n} and batch_size {batch_size} must be ≥ 1")
        self.n = int(n)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.epoch = 0
        self.offset = 0
        self._perm: tuple[int, list[int]] | None = None

    # -- state (the optimizer commits and restores it) ---------------------------------

    def state(self) -> tuple[int, int]:
        return (self.epoch, self.offset)

    def set_state(self, state: tuple[int, int] | list[int]) -> None:
        self.epoch, self.offset = int(state[0]), int(state[1])

    def normalize(self) -> None:
        """After a step: when no batch is left in the epoch, move to the next one's start
        (so a commit never sits at an epoch's end)."""
        if self._per_rank() == 0:
            self.epoch += 1
            self.offset = 0

    # -- iteration ---------------------------------------------------------------------

    def _per_rank(self) -> int:
        world = max(session().world, 1)
        return min(self.batch_size, (self.n - self.offset) // world)

    def _permutation(self, epoch: int) -> list[int]:
        if self._perm is None or self._perm[0] != epoch:
            g = torch.Generator()
            g.manual_seed(self.seed + epoch)
            self._perm = (epoch, torch.randperm(self.n, generator=g).tolist())
        return self._perm[1]

    def epochs(self, k: int) -> Iterator[int]:
        """Yields the epochs to run, up to `k` (from where the group is: a joiner starts
        at the restored epoch)."""
        while self.epoch < k:
            e = self.epoch
            yield e
            if self.epoch == e:
                # The loop left the epoch early (or without steps): go on to the next.
                self.epoch, self.offset = e + 1, 0

    def __iter__(self) -> Iterator[list[int]]:
        epoch = self.epoch
        while self.epoch == epoch:
            b = self._per_rank()
            if b == 0:
                self.epoch, self.offset = epoch + 1, 0
                return
            s = session()
            start = self.offset + s.rank * b
            batch = self._permutation(epoch)[start:start + b]
            self.offset += s.world * b
            yield batch

    def __len__(self) -> int:
        """Batches left in this epoch for this rank at the current world size."""
        world = max(session().world, 1)
        left = self.n - self.offset
        full, rest = divmod(left, world * self.batch_size)
        return full + (1 if rest // world > 0 else 0)
