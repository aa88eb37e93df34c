"""The private optimizer: clip, sum exactly, add secure discrete Gaussian noise, then step.

One step of DP-SGD (Abadi et al., "Deep learning with differential privacy", CCS 2016):
each example's gradient is clipped to L2 norm C, the clipped gradients of a Poisson-sampled
batch are summed, Gaussian noise of standard deviation sigma C is added to every coordinate,
and the result, divided by the expected batch size, is the gradient the wrapped optimizer
uses. Guarantee of one step: the Poisson-subsampled Gaussian mechanism with noise multiplier
sigma, under add/remove of one example (``dpcurator.accounting.dpsgd``).

Floating-point safety (``_grads``): the clipped sum is exact, on a grid of step g = C 2^-40,
with L2 sensitivity C in grid units 2^40. The noise is the exact discrete Gaussian on that
grid, Z ~ N_Z(0, s^2) per coordinate with s >= sqrt((sigma 2^40)^2 + 8^2)
(``_noise.sample_wide_discrete_gaussian``, from the secure source), added in int64: the
mechanism's output is the integer vector sum + Z, and every float computed from it afterwards
is post-processing. For a model on a GPU the sum is computed there (``_device``, the same
argument) and Z, drawn on the host one step ahead while the device computes, is copied over
and added in int64. Why the continuous accountant is sound for it: with tau = 8 and
s'^2 = s^2 - tau^2, the law of N_Z(mu, s^2) for any integer mu is within a factor e^(+-eta)
(eta = 4 sum_{k>=1} e^(-2 pi^2 k^2 tau^2) < 10^-500) of a post-processing of the continuous
N(mu, s'^2): round x to y with probability phi_tau(y - x) / sum_z phi_tau(z - x) (Poisson
summation bounds that sum within 1 +- eta / 2). Per coordinate and step, then, the discrete
mechanism is, up to that factor, a post-processing of the continuous Gaussian mechanism with
noise multiplier s' / 2^40 >= sigma, which the accountant analyses. Over T steps of d
coordinates the stated epsilon and delta hold up to a factor e^(2 T d eta) (below
1 + 10^-480 for any T d < 10^20), far below the accountant's own upward rounding.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from fractions import Fraction
from typing import Any

import numpy as np
import torch
from torch.optim import Optimizer

from dpcurator.errors import InternalError, UserError
from dpcurator.learn import _kernels
from dpcurator.learn._device import ClippingGraphs, DevicePart, Scale
from dpcurator.learn._device import clip_factors as device_clip_factors
from dpcurator.learn._grads import (
    GRID_BITS,
    MAX_BATCH,
    MAX_ENTRIES,
    Ints,
    PerExample,
    Records,
    Workspace,
    clip_factors,
)
from dpcurator.learn._noise import WideGaussian
from dpcurator.learn._sampler import GradSampler
from dpcurator.noise import RandomSource

__all__ = ["DPOptimizer", "grid_sigma"]

#: The smoothing width, in grid steps, of the argument above.
TAU = 8
#: A device's noise from the secure source: threads drawing parts of at least this many.
_NOISE_THREADS = min(8, max(1, (os.cpu_count() or 1) // 2))
_NOISE_PART = 1 << 16


def grid_sigma(noise_multiplier: float) -> Fraction:
    """s >= sqrt((noise_multiplier 2^40)^2 + TAU^2), in grid steps (rounded up, 2^-20)."""
    target = (Fraction(noise_multiplier) * (1 << GRID_BITS)) ** 2 + TAU**2
    scale = 1 << 20
    return Fraction(math.isqrt(math.ceil(target * scale * scale)) + 1, scale)


class DPOptimizer(Optimizer):
    """Wraps a PyTorch optimizer; ``step()`` replaces each gradient with its private version.

    Use it as the optimizer it wraps: ``zero_grad()``, ``loss.backward()``, ``step()``. With
    virtual steps (``max_physical_batch_size``), ``step()`` after a chunk that is not its
    batch's last only adds the chunk's clipped gradients to the running sum. After a step,
    each parameter's ``.grad`` is the released gradient, a view of one buffer that the next
    step overwrites (as ``backward()`` overwrites a plain model's after
    ``zero_grad(set_to_none=False)``): copy it to keep it.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        sampler: GradSampler,
        noise_multiplier: float,
        max_grad_norm: float | list[float],
        expected_batch_size: float,
        last_chunk: Callable[[], bool],
        on_step: Callable[[], None],
        source: RandomSource | None = None,
    ) -> None:
        # The wrapped optimizer owns the state; Optimizer.__init__ is deliberately not called.
        self.original_optimizer = optimizer
        self.sampler = sampler
        self.params = list(sampler.parameters())
        self.noise_multiplier = float(noise_multiplier)
        if isinstance(max_grad_norm, list):
            if len(max_grad_norm) != len(self.params):
                raise UserError(
                    f"max_grad_norm has {len(max_grad_norm)} bounds for "
                    f"{len(self.params)} trainable parameters (per-layer clipping needs one "
                    "bound per parameter, in module.parameters() order)"
                )
            self.bounds: list[float] | None = [float(c) for c in max_grad_norm]
            self.max_grad_norm = math.sqrt(sum(c * c for c in self.bounds))
        else:
            self.bounds = None
            self.max_grad_norm = float(max_grad_norm)
        self.expected_batch_size = expected_batch_size
        self.grid_sigma = grid_sigma(self.noise_multiplier)
        self._last_chunk = last_chunk
        self._on_step = on_step
        self._source = source
        self._noise = WideGaussian(self.grid_sigma, source)
        self._sizes = [p.numel() for p in self.params]
        self._size = sum(self._sizes)
        if self._size >= MAX_ENTRIES:
            raise UserError(f"the model has {self._size} trainable parameters; the exact "
                            f"clipped sum is proved for fewer than {MAX_ENTRIES}")
        self._sum: Ints | torch.Tensor | None = None
        self._examples = 0
        self._batch: int | None = None  # the loader's batch the open sum holds chunks of
        self._consumed = -1  # the last loader chunk summed (``_sampling.Chunk.serial``)
        self._private = {id(p) for p in self.params}
        self._work = Workspace()
        self._grads: list[torch.Tensor] = []  # views of one flat buffer, reused every step
        # as _grads, on the model's device: the flat buffer and its views
        self._device_grads: tuple[torch.Tensor, list[torch.Tensor]] | None = None
        self._executor: ThreadPoolExecutor | None = None  # draws a device's noise ahead
        self._noise_pool: ThreadPoolExecutor | None = None  # its parts, on several threads
        #: On a GPU, replay each batch shape's clipping as a CUDA graph (``ClippingGraphs``).
        self.cuda_graphs = True
        self._graphs: ClippingGraphs | None = None
        self._pending_noise: Future[torch.Tensor] | None = None
        #: Draw a device's noise a step ahead, in a background thread: None for the default
        #: (the secure source only; ``_step_noise``), True or False to force it.
        self.prefetch_noise: bool | None = None

    # The wrapped optimizer's state, shared (LR schedulers and checkpoints see the same).
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.original_optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.original_optimizer.param_groups = value

    @property
    def state(self) -> Any:
        return self.original_optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.original_optimizer.state = value

    @property
    def defaults(self) -> dict[str, Any]:
        return self.original_optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.original_optimizer.defaults = value

    def state_dict(self) -> dict[str, Any]:
        return self.original_optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.original_optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        raise UserError("parameters cannot be added to a private optimizer after make_private")

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.original_optimizer.zero_grad(set_to_none)

    def __repr__(self) -> str:
        return (f"DPOptimizer({self.original_optimizer!r}, noise_multiplier="
                f"{self.noise_multiplier!r}, max_grad_norm={self.max_grad_norm!r})")

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Clip and sum this (chunk of the) batch; after its last chunk, add noise and step."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._accumulate(released_next=None):
            return loss
        self._add_noise()
        self.original_optimizer.step()
        self._on_step()
        return loss

    def _accumulate(self, *, released_next: bool | None) -> bool:
        """Add the recorded chunk's clipped per-example gradients to the running exact sum,
        and say whether the sum is to be released now: ``released_next``, or where it is None
        whether the chunk is its batch's last (the chunk's own flag where it was recorded,
        else the loader's). The sum never spans two of the loader's batches."""
        self._check_trainable()
        batch, records = self.sampler.records()
        chunk = self.sampler.chunk
        if chunk is None and self.sampler.chunk_of is not None and released_next is None:
            self.sampler.clear()
            raise UserError(
                "optimizer.step() needs gradients computed on a batch of the data loader that "
                "make_private returned: its Poisson sampling is what the accountant assumes "
                "(batches of another loader, or other tensors, are not accounted for)")
        if chunk is not None:
            if chunk.serial <= self._consumed:  # each Poisson sample is used once
                self.sampler.clear()
                raise UserError(
                    "this batch of the data loader was already used in a step: each batch "
                    "is a fresh Poisson sample, and stepping twice on one is not the "
                    "accounted mechanism; take the next batch from the loader")
            if self._sum is not None and self._batch is not None and chunk.batch != self._batch:
                self.sampler.clear()
                raise UserError(
                    "this step's gradients come from another batch than the chunks summed "
                    "before it: call optimizer.step() after every chunk the data loader gives")
            self._consumed, self._batch = chunk.serial, chunk.batch
        if released_next is None:
            released_next = chunk.last if chunk is not None else self._last_chunk()
        self.sampler.clear()
        self._accumulate_records(batch, records, released_next)
        return released_next

    def _check_trainable(self) -> None:
        """Refuse a step where the wrapped optimizer holds a trainable parameter that is not
        clipped and noised (a bug hunt: a layer frozen at make_private and unfrozen later was
        stepped on its raw gradient)."""
        for group in self.original_optimizer.param_groups:
            for param in group["params"]:
                if param.requires_grad and id(param) not in self._private:
                    raise UserError(
                        "the optimizer holds a trainable parameter that was not trainable when "
                        "the model was made private: its gradient would be used without "
                        "clipping or noise; unfreeze layers before make_private, or freeze "
                        "this one again")

    def _accumulate_records(self, batch: int, records: Records, released_next: bool) -> None:
        """``_accumulate`` of records taken from the sampler."""
        if self.sampler.uses_device(records):
            self._accumulate_on_device(batch, records, released_next)
            return
        per_example = self.sampler.parts(batch, records, self._work)
        self._check_coverage(per_example)
        if isinstance(self._sum, torch.Tensor):
            raise UserError("the model moved between devices within one batch")
        if self._sum is None:
            total = self._work.get("sum", (self._size,), torch.int64)[1]
            total.fill(0)
        else:
            total = self._sum
        if batch:
            unit = float(1 << GRID_BITS) / self.max_grad_norm
            if self.bounds is None:  # flat: one clip factor per example, from the total norm
                squared = per_example[0].squared_norms()
                for pe in per_example[1:]:
                    squared += pe.squared_norms()
                factors = [clip_factors(squared, self.max_grad_norm) * unit] * len(per_example)
            else:
                factors = [clip_factors(pe.squared_norms(), bound) * unit
                           for pe, bound in zip(per_example, self.bounds, strict=True)]
            offset = 0
            for pe, f in zip(per_example, factors, strict=True):
                size = pe.size
                pe.add_clipped_sum(f, total[offset:offset + size], self._work)
                offset += size
        self._sum = total
        self._count(batch)

    def _count(self, batch: int) -> None:
        self._examples += batch
        if self._examples > MAX_BATCH:
            raise UserError(f"a batch of more than {MAX_BATCH} examples cannot be summed "
                            "exactly; lower the expected batch size")

    def _check_coverage(self, per_example: list[PerExample]) -> None:
        covered = [p for pe in per_example for p in pe.params]
        if len(covered) != len(self.params) or any(
                a is not b for a, b in zip(covered, self.params, strict=True)):
            raise InternalError("per-example gradients do not cover the parameters; "
                                "this is a bug in dpcurator")

    def _accumulate_on_device(self, batch: int, records: Records, released_next: bool
                              ) -> None:
        """``accumulate`` where the gradients are: the same clipping and exact sum in torch
        operations (``_device``), into an int64 sum on the device; on a GPU replayed as a
        CUDA graph (``ClippingGraphs``; ``cuda_graphs = False`` computes it eagerly). A
        graph's output buffer becomes the sum itself only if the sum is released before the
        graph is replayed again (``released_next``); else it is copied."""
        device = records[0][1][0].activation.device
        total: torch.Tensor | None = None
        if isinstance(self._sum, torch.Tensor) and self._sum.device == device:
            total = self._sum
        elif self._sum is not None:
            raise UserError("the model moved between devices within one batch")
        if batch:
            delta = None
            if self.cuda_graphs and device.type == "cuda":
                if self._graphs is None or self._graphs.mean != (
                        self.sampler.loss_reduction == "mean"):
                    self._graphs = ClippingGraphs(
                        self._clip_and_sum, mean=self.sampler.loss_reduction == "mean")
                settings = (self.max_grad_norm, tuple(self.bounds or ()), self.sampler.fuse,
                            self.sampler.loss_reduction)
                delta = self._graphs.run(batch, records, settings)
            kept = delta is None or released_next  # else the next replay overwrites it
            if delta is None:
                delta = self._clip_and_sum(batch, records, None)
            if total is None:  # the batch's first chunk (no zeros and add: each is a launch)
                total = delta if kept else delta.clone()
            else:
                total += delta
        if total is None:
            total = torch.zeros(self._size, dtype=torch.int64, device=device)
        self._sum = total
        self._count(batch)

    def _clip_and_sum(self, batch: int, records: Records, scale: Scale | None) -> torch.Tensor:
        """The exact sum of this batch's clipped gradients (int64, on the device)."""
        per_example = self.sampler.parts(batch, records, scale=scale)
        self._check_coverage(per_example)
        parts = [pe for pe in per_example if isinstance(pe, DevicePart)]
        if len(parts) != len(per_example):
            raise InternalError("a layer's gradients are not on the device; this is a bug")
        delta = torch.zeros(self._size, dtype=torch.int64, device=parts[0].device)
        unit = float(1 << GRID_BITS) / self.max_grad_norm
        if self.bounds is None:
            squared = parts[0].device_squared_norms()
            for pe in parts[1:]:
                squared = squared + pe.device_squared_norms()
            factors = [device_clip_factors(squared, self.max_grad_norm) * unit] * len(parts)
        else:
            factors = [device_clip_factors(pe.device_squared_norms(), bound) * unit
                       for pe, bound in zip(parts, self.bounds, strict=True)]
        offset = 0
        for pe, f in zip(parts, factors, strict=True):
            pe.device_add_clipped_sum(f, delta[offset:offset + pe.size])
            offset += pe.size
        return delta

    def _add_noise(self) -> None:
        """Set each parameter's gradient to (exact sum + discrete Gaussian noise) g / E[B].
        Internal: ``step`` releases, and counts the step."""
        exact = self._sum
        if exact is None:
            raise UserError("optimizer.step() was called before any batch was processed")
        self._sum, self._examples, self._batch = None, 0, None
        if isinstance(exact, torch.Tensor):
            self._release_on_device(exact)
            return
        # Drawn here: a background draw on the CPU measured slower (the threads contend for
        # the GIL; MLP step 0.91 -> 1.09 ms, benchmarks/dpsgd.py).
        noise = self._noise.sample(self._size)
        # The release is the integer vector exact + noise; the floats are post-processing.
        grads = self._grad_views()
        _kernels.release(exact, noise, self._release_scale(),
                         self._work.get("grad", (self._size,), grads[0].dtype)[1])
        self._set_grads(grads)

    def _release_scale(self) -> float:
        """Real units of one grid step of the released sum, over E[B] for a mean loss."""
        scale = self.max_grad_norm / float(1 << GRID_BITS)
        if self.sampler.loss_reduction == "mean":
            scale /= self.expected_batch_size
        return scale

    def _grad_dtype(self) -> torch.dtype:
        """The released gradients' dtype: the parameters' if they share float32 or float64."""
        dtype = self.params[0].dtype
        if dtype not in (torch.float32, torch.float64) or any(
                p.dtype != dtype for p in self.params):
            return torch.float64
        return dtype

    def _set_grads(self, grads: list[torch.Tensor]) -> None:
        """Each parameter's .grad: its view of the released buffer (a copy in its dtype)."""
        for param, grad in zip(self.params, grads, strict=True):
            if param.dtype != grad.dtype:
                param.grad = grad.to(param.dtype)
            elif param.grad is not grad:
                param.grad = grad

    def _release_on_device(self, exact: torch.Tensor) -> None:
        """``add_noise`` for a sum on a device: the noise, drawn on the host while the device
        computed, is copied over and added in int64; the floats are post-processing."""
        noise = self._step_noise(exact.device).to(exact.device, non_blocking=True)
        exact += noise
        flat, grads = self._device_grad_views(exact.device)
        # One kernel: the int64 release times a float64 scalar is computed in float64 (a
        # zero-dimensional tensor of a higher category sets the type) and rounded once into
        # the gradients' dtype, as the CPU path's release does.
        torch.mul(exact, torch.tensor(self._release_scale(), dtype=torch.float64), out=flat)
        self._set_grads(grads)

    def _device_grad_views(self, device: torch.device
                           ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """One flat gradient buffer on the device and its views, one per parameter (as
        ``_grad_views`` on the CPU)."""
        dtype = self._grad_dtype()
        held = self._device_grads
        if held is None or held[0].dtype != dtype or held[0].device != device:
            flat = torch.empty(self._size, dtype=dtype, device=device)
            held = self._device_grads = (flat, [
                g.view(p.shape) for p, g in
                zip(self.params, torch.split(flat, self._sizes), strict=True)])
        return held

    def _step_noise(self, device: torch.device) -> torch.Tensor:
        """This step's noise vector for a device (int64, on the host; pinned for a GPU).

        From the secure source it was drawn during the step, in a background thread (the
        sampler releases the GIL, so the draw overlaps the device's work), and the next
        step's is started now. A seeded source draws here, on the calling thread: the data
        loader draws its batches from the same source, and a draw in the background would
        interleave with them in an order that changes from run to run. ``prefetch_noise``
        overrides the choice (tests force it to check the prefetch with a seeded source).
        """
        prefetch = self._source is None if self.prefetch_noise is None else self.prefetch_noise
        if not prefetch:
            return self._draw_noise(device)
        return self._prefetched_noise(device)

    def _prefetched_noise(self, device: torch.device) -> torch.Tensor:
        """This step's noise vector (int64, on the host), and the next step's drawn in a
        background thread. Drawn in order from one source, as without the thread; a vector
        drawn for a step that never comes is dropped unused (never released)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="dpcurator-noise")
        pending = self._pending_noise
        noise = pending.result() if pending is not None else self._draw_noise(device)
        self._pending_noise = self._executor.submit(self._draw_noise, device)
        return noise

    def _draw_noise(self, device: torch.device) -> torch.Tensor:
        """One step's noise. From the secure source (no seed, so no order to keep), a large
        vector is drawn in parts on several threads (the sampler releases the GIL): on a GPU
        the draw would otherwise take longer than the step. The parts are independent draws
        of the same law, so the vector is too. A seeded source draws in one piece, in order."""
        parts = min(_NOISE_THREADS, max(1, self._size // _NOISE_PART))
        if self._source is not None or parts < 2:
            noise = torch.from_numpy(self._noise.sample(self._size))
        else:
            if self._noise_pool is None:
                self._noise_pool = ThreadPoolExecutor(parts, thread_name_prefix="dpcurator-noise")
            cuts = [self._size * i // parts for i in range(parts + 1)]
            drawn = self._noise_pool.map(self._noise.sample,
                                         [b - a for a, b in itertools.pairwise(cuts)])
            noise = torch.from_numpy(np.concatenate(list(drawn)))
        return noise.pin_memory() if device.type == "cuda" else noise

    def _grad_views(self) -> list[torch.Tensor]:
        """Views of one flat gradient buffer, one per parameter (made again if a parameter's
        dtype changed). A step overwrites the buffer, as zero_grad(set_to_none=False) and
        backward() overwrite a plain model's gradients."""
        dtype = self._grad_dtype()
        if not self._grads or self._grads[0].dtype != dtype:
            flat = self._work.get("grad", (self._size,), dtype)[0]
            self._grads = [g.view(p.shape) for p, g in
                           zip(self.params, torch.split(flat, self._sizes), strict=True)]
        return self._grads
