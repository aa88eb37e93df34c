"""Poisson sampling of training examples, and a data loader that keeps it (empty batches too).

Each step's batch holds every example independently with probability q (Poisson sampling),
the sampling that the subsampled-Gaussian accountant analyses; batch sizes vary, and a batch
may be empty. The coins are exact Bernoulli(q) draws from the secure source
(``dpcurator.noise.sample_bernoulli``), so neither the batch's size nor its members can be
guessed from earlier batches. An epoch is ``steps`` such batches.

Virtual steps: when a batch is larger than ``max_physical_batch_size`` it is delivered in
chunks of at most that many examples; the optimizer sums the chunks' clipped gradients and
adds noise once, after the last chunk (``DPDataLoader.last_chunk`` tells it which one that is).
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data._utils.collate import default_collate

from dpcurator.errors import UserError
from dpcurator.noise import RandomSource, sample_bernoulli

__all__ = ["Chunk", "DPDataLoader", "PoissonBatchSampler"]


@dataclass(frozen=True)
class Chunk:
    """One chunk the loader delivered: its number (counted over the loader's life), its
    Poisson batch's number, how many examples it holds, and whether it is its batch's last.
    The optimizer checks each step's recorded gradients against it (``GradSampler.records``:
    one chunk, one row per example) and never sums chunks of two batches."""

    serial: int
    batch: int
    size: int
    last: bool


class PoissonBatchSampler(Sampler[list[int]]):
    """``steps`` batches of indices in range(n), each index kept with probability q."""

    def __init__(self, n: int, sampling_rate: float, steps: int,
                 source: RandomSource | None = None, *,
                 max_physical_batch_size: int | None = None) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise UserError(f"the dataset must hold at least one example, got {n!r}")
        if not (isinstance(sampling_rate, float | int) and 0 < sampling_rate <= 1):
            raise UserError(f"sampling_rate must lie in (0, 1], got {sampling_rate!r}")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise UserError(f"steps must be an integer >= 1, got {steps!r}")
        if max_physical_batch_size is not None and (
            isinstance(max_physical_batch_size, bool)
            or not isinstance(max_physical_batch_size, int) or max_physical_batch_size < 1
        ):
            raise UserError("max_physical_batch_size must be a positive integer or None, got "
                            f"{max_physical_batch_size!r}")
        self.n = n
        self.sampling_rate = float(sampling_rate)
        self.steps = steps
        self.source = source
        self.max_physical_batch_size = max_physical_batch_size
        #: One entry per chunk yielded and not yet consumed: (its batch's number, its size,
        #: whether it is its batch's last chunk)
        self.last_flags: collections.deque[tuple[int, int, bool]] = collections.deque()
        self._batches = itertools.count()  # numbered over the sampler's life, not per epoch

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.steps):
            keep = sample_bernoulli(self.sampling_rate, self.n, self.source)
            batch = np.flatnonzero(keep).tolist()
            size = self.max_physical_batch_size or max(len(batch), 1)
            chunks = [batch[i:i + size] for i in range(0, len(batch), size)] or [[]]
            number = next(self._batches)
            for j, chunk in enumerate(chunks):
                self.last_flags.append((number, len(chunk), j == len(chunks) - 1))
                yield chunk


class _EmptySafeCollate:
    """The loader's collate function, plus empty batches shaped like the dataset's examples."""

    def __init__(self, dataset: Dataset[Any], collate: Callable[[list[Any]], Any]) -> None:
        self.dataset = dataset
        self.collate = collate
        try:  # a collate function that builds an empty batch itself is used as it is
            collate([])
            self.own_empty = True
        except Exception:
            self.own_empty = False
            self._check_example()

    def _check_example(self) -> None:
        """An empty batch is shaped from example 0's collated batch, its tensors cut to no
        rows; any other value in it (a string, say) would carry example 0 into the batch (a
        bug hunt: the empty batch of a dataset of strings was example 0's string), so such
        loaders are refused when they are made private."""
        leaves = torch.utils._pytree.tree_leaves(self.collate([self.dataset[0]]))
        other = sorted({type(v).__name__ for v in leaves
                        if v is not None and not isinstance(v, torch.Tensor)})
        if other:
            raise UserError(
                f"data_loader's batches hold values that are not tensors ({', '.join(other)}): "
                "an empty Poisson batch, which every loader must be able to give, cannot be "
                "built from them without showing one example; give the loader a collate_fn "
                "that returns a batch for an empty list, or turn the values into tensors")

    def __call__(self, batch: list[Any]) -> Any:
        if batch or self.own_empty:
            return self.collate(batch)
        # Shapes come from example 0; no value of it reaches the batch (``_check_example``).
        one = self.collate([self.dataset[0]])
        return torch.utils._pytree.tree_map(
            lambda t: t[:0] if isinstance(t, torch.Tensor) else t, one
        )


class DPDataLoader(DataLoader[Any]):
    """A ``DataLoader`` over the same dataset whose batches are Poisson samples.

    Built by ``PrivacyEngine.make_private`` from the user's loader: its dataset, collate
    function, workers and pinning are kept; its batch size sets the sampling rate
    q = 1 / len(data_loader) (the expected batch size over the dataset's size) and its length
    the number of steps in an epoch.
    """

    batch_sampler: PoissonBatchSampler

    def __init__(self, loader: DataLoader[Any], *, source: RandomSource | None,
                 max_physical_batch_size: int | None,
                 on_epoch_end: Callable[[], None] | None = None) -> None:
        dataset = loader.dataset
        try:
            n = len(dataset)  # type: ignore[arg-type]
        except TypeError:
            raise UserError("data_loader's dataset must have a length (a map-style dataset); "
                            "iterable datasets cannot be Poisson-sampled") from None
        if n < 1:
            raise UserError("data_loader's dataset is empty")
        steps = len(loader)
        sampler = PoissonBatchSampler(n, 1 / steps, steps, source,
                                      max_physical_batch_size=max_physical_batch_size)
        collate = loader.collate_fn or default_collate
        super().__init__(
            dataset, batch_sampler=sampler, collate_fn=_EmptySafeCollate(dataset, collate),
            num_workers=loader.num_workers, pin_memory=loader.pin_memory,
            timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
            multiprocessing_context=loader.multiprocessing_context,
            generator=loader.generator, persistent_workers=loader.persistent_workers,
        )
        self.sampling_rate = sampler.sampling_rate
        self.expected_batch_size = n * sampler.sampling_rate
        self.last_chunk = True
        #: The chunk delivered last (None before the first): the optimizer checks each step
        #: against it (``Chunk``).
        self.chunk: Chunk | None = None
        self._serials = itertools.count()
        self._on_epoch_end = on_epoch_end

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self.batch_sampler.last_flags.clear()
        for batch in super().__iter__():
            number, size, self.last_chunk = self.batch_sampler.last_flags.popleft()
            self.chunk = Chunk(next(self._serials), number, size, self.last_chunk)
            yield batch
        if self._on_epoch_end is not None:
            self._on_epoch_end()


def steps_for(epochs: float, steps_per_epoch: int) -> int:
    """Training steps in ``epochs`` epochs (rounded up)."""
    return max(1, math.ceil(epochs * steps_per_epoch - 1e-9))


def check_loader(data_loader: Any) -> DataLoader[Any]:
    """The user's loader, if it can be Poisson-sampled."""
    if not isinstance(data_loader, DataLoader):
        raise UserError("data_loader must be a torch.utils.data.DataLoader, got "
                        f"{type(data_loader).__name__}")
    try:
        steps = len(data_loader)
    except TypeError:
        raise UserError("data_loader must have a length (a map-style dataset)") from None
    if steps < 1:
        raise UserError("data_loader yields no batches")
    return data_loader
