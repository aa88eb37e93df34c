"""Per-example gradients clipped and summed exactly in torch operations, for a GPU.

The CPU path (``_grads``, ``_kernels``) runs compiled loops over numpy views of the records,
which tensors on an accelerator do not have; copying them to the host every step would cost
more than the step. Here the same exact sum is computed where the tensors are, in a few
batched operations, and only the integer sum meets the noise (drawn on the host from the
secure source, ahead of time, while the device computes: ``DPOptimizer``).

Why the sum is exact and one example moves it by at most C: the *materialized* case of the
argument in ``_grads`` (points 1 to 4), which does not depend on where it is computed.

- Example i's gradient g_i is materialized as a row of a (B, d) tensor, a function of its
  records (a_i, b_i) alone: a linear layer's outer product b_i [a_i, 1]^T in float64 (the
  products of two float32 values are exact), a convolution's from its unfolded input by a
  batched matrix product, any other layer's by ``torch.func`` (vmap over grad).
- Its squared norm is a float64 sum of float64 squares in whatever order the device sums:
  within a relative d 2^-53 of the exact one, which the clipping bound's margin
  (``CLIP_MARGIN``) absorbs, as on the CPU.
- z_ij = trunc(float64(g_ij) f_i) with f_i = c_i 2^40 / C: truncation toward zero never
  increases a magnitude, so |z_i| <= 2^40 (that is, C). An example whose factor is not
  positive and finite (a gradient with an infinity or a NaN) contributes exact zeros, chosen
  before any conversion to integers, so no NaN is ever converted.
- The entries, integers of magnitude at most 2^40 in float64, convert to int64 exactly, and
  the batch is summed in int64: exact in any order, below 2^62 for the at most ``MAX_BATCH``
  examples of a batch.

Assumed, as on the CPU: the device's kernels compute example i's records and gradient from
example i alone (a batched product computes each batch entry apart).

On a GPU the same computation is captured once per batch shape and replayed as a CUDA graph
(``ClippingGraphs``): the records are copied into static buffers padded with zero rows, and a
zero row's gradient is zero (or not finite, and then dropped), so it adds exactly nothing.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpcurator.learn._grads import (
    CLIP_MARGIN,
    Floats,
    Ints,
    PerExample,
    Records,
    Workspace,
    _functorch_per_example,
    _Layer,
    _tappable_conv,
    _Use,
)
from dpcurator.learn._kernels import ROWS

__all__ = ["ClippingGraphs", "DeviceOuter", "DevicePart", "OnDevice", "clip_factors",
           "device_per_example", "fill_padded", "padded_records"]

#: Entries converted to float64 at once when summing (bounds the scratch memory, 2 GiB).
_CHUNK_ENTRIES = 1 << 28
#: The loss reduction's batch size (or 1): a number, or a device scalar that a replayed CUDA
#: graph reads (``ClippingGraphs``). Multiplying by 1.0 is exact, so both give the same bits.
Scale = float | Tensor


def _scaled(scale: Scale) -> bool:
    """Whether to multiply by ``scale``: always for a tensor (its value is not read here)."""
    return isinstance(scale, Tensor) or scale != 1.0


def clip_factors(squared: Tensor, bound: float) -> Tensor:
    """min(1, bound * CLIP_MARGIN / norm) per example, float64, where ``squared`` is: 1 for a
    zero gradient, 0 for an infinite norm and NaN for a NaN (as ``_grads.clip_factors``)."""
    return ((bound * CLIP_MARGIN) / torch.sqrt(squared)).clamp_(max=1.0)  # keeps NaN


class DevicePart(PerExample):
    """Per-example gradients of one unit on a device: the device interface that the
    optimizer uses, and PerExample's host interface (the same values, for tests and tools)."""

    @property
    def device(self) -> torch.device:
        raise NotImplementedError

    def device_squared_norms(self) -> Tensor:
        """(B,) float64 on the device: each example's squared norm (see the docstring)."""
        raise NotImplementedError

    def device_add_clipped_sum(self, factors: Tensor, total: Tensor) -> None:
        """total (int64, on the device) += the exact sum of the examples' clipped gradients
        on the grid, the parameters' entries in order; ``factors`` is c_i 2^GRID_BITS / C."""
        raise NotImplementedError

    def squared_norms(self) -> Floats:
        result: Floats = self.device_squared_norms().cpu().numpy()
        return result

    def add_clipped_sum(self, factors: Floats, total: Ints, work: Workspace | None = None
                        ) -> None:
        part = torch.zeros(self.size, dtype=torch.int64, device=self.device)
        f = torch.from_numpy(np.asarray(factors, dtype=np.float64)).to(self.device)
        self.device_add_clipped_sum(f, part)
        total += part.cpu().numpy()


@dataclass
class OnDevice(DevicePart):
    """``scale`` times a (B, d) tensor whose rows hold the unit's parameters' entries in order:
    z_ij = trunc(float64(g_ij) f_i)."""

    params: tuple[nn.Parameter, ...]
    grads: Tensor
    scale: Scale = 1.0

    @property
    def device(self) -> torch.device:
        return self.grads.device

    def device_squared_norms(self) -> Tensor:
        flat = self.grads.reshape(self.grads.shape[0], -1)
        squared = torch.empty(flat.shape[0], dtype=torch.float64, device=flat.device)
        for rows in _row_chunks(flat):
            part = flat[rows].to(torch.float64)
            torch.sum(part * part, dim=1, out=squared[rows])
        if _scaled(self.scale):
            squared *= self.scale * self.scale
        return squared

    def device_add_clipped_sum(self, factors: Tensor, total: Tensor) -> None:
        flat = self.grads.reshape(self.grads.shape[0], -1)
        if _scaled(self.scale):
            factors = factors * self.scale
        usable = (factors > 0.0) & (factors < math.inf)  # False for NaN too
        factors = torch.where(usable, factors, 0.0)
        for rows in _row_chunks(flat):
            scaled = torch.trunc(flat[rows].to(torch.float64) * factors[rows, None])
            scaled = torch.where(usable[rows, None], scaled, 0.0)
            total += scaled.to(torch.int64).sum(dim=0)

    def gradients(self) -> list[Tensor]:
        flat = self.grads.reshape(self.grads.shape[0], -1).to(torch.float64) * self.scale
        sizes = [p.numel() for p in self.params]
        return [g.reshape(-1, *p.shape)
                for p, g in zip(self.params, torch.split(flat, sizes, dim=1), strict=True)]


class DeviceOuter(DevicePart):
    """A linear layer's weight (and bias) gradients scale b_i [a_i, 1]^T, never materialized:
    ``_grads.OuterProduct``'s construction, in torch operations on the device.

    Squared norm |[a_i, 1]|^2 |b_i|^2 scale^2 (float64 sums of exact squares). With
    t_i = sqrt(f_i |g_i|): u_i = trunc([a_i, 1] t_i / |[a_i, 1]|), v_i = trunc(b_i t_i / |b_i|)
    (zeros for an example whose t_i is not positive and finite), so that |v_i| |u_i| <= 2^40;
    the integer matrix sum_i v_i u_i^T is one float64 matrix product per 2^13 examples, exact
    because its every term and partial sum is an integer below 2^53 (``_grads``, point 3),
    whatever blocking and order the device's product takes.
    """

    def __init__(self, params: tuple[nn.Parameter, ...], activations: Tensor,
                 backprops: Tensor, scale: Scale) -> None:
        self.params = params
        self.scale = scale
        self._a = activations.to(torch.float64)
        self._b = backprops.to(torch.float64)
        self._squares: tuple[Tensor, Tensor] | None = None

    @property
    def device(self) -> torch.device:
        return self._a.device

    def _factor_squares(self) -> tuple[Tensor, Tensor]:
        """|[a_i, 1]|^2 and |b_i|^2 (unscaled), computed once."""
        if self._squares is None:
            a2 = torch.sum(self._a * self._a, dim=1)
            if len(self.params) == 2:
                a2 += 1.0
            self._squares = (a2, torch.sum(self._b * self._b, dim=1))
        return self._squares

    def device_squared_norms(self) -> Tensor:
        a2, b2 = self._factor_squares()
        return a2 * b2 * (self.scale * self.scale)

    def device_add_clipped_sum(self, factors: Tensor, total: Tensor) -> None:
        a2, b2 = self._factor_squares()
        na, nb = torch.sqrt(a2), torch.sqrt(b2)
        t2 = factors * (na * nb * self.scale)
        # t2 > 0 implies na, nb > 0 (their product cannot underflow: each is at least the
        # smallest float32). An unusable example's u and v, NaN or not, become exact zeros.
        usable = ((t2 > 0.0) & (t2 < math.inf))[:, None]
        t = torch.sqrt(t2)
        ta, tb = (t / na)[:, None], (t / nb)[:, None]
        u = self._a * ta
        if len(self.params) == 2:
            u = torch.cat([u, ta], dim=1)
        u = torch.where(usable, torch.trunc(u), 0.0)
        v = torch.where(usable, torch.trunc(self._b * tb), 0.0)
        n_in, n_out = self._a.shape[1], self._b.shape[1]
        for start in range(0, u.shape[0], ROWS):  # exact integers: ROWS examples at a time
            rows = slice(start, start + ROWS)
            product = (v[rows].T @ u[rows]).to(torch.int64)  # (out, in [+ 1])
            total[:n_out * n_in] += product[:, :n_in].reshape(-1)
            if product.shape[1] > n_in:
                total[n_out * n_in:] += product[:, n_in]

    def gradients(self) -> list[Tensor]:
        b = self._b * self.scale
        grads = [torch.einsum("bo,bi->boi", b, self._a)]
        if len(self.params) == 2:
            grads.append(b)
        return grads


def _row_chunks(flat: Tensor) -> list[slice]:
    rows = max(1, _CHUNK_ENTRIES // max(1, flat.shape[1]))
    return [slice(start, start + rows) for start in range(0, flat.shape[0], rows)]


def _unfold(x: Tensor, module: nn.Conv2d, padding: tuple[int, ...]) -> Tensor:
    """torch's F.unfold (B, C k k, L), (c, ki, kj) order, from strided views and one copy:
    on a GPU F.unfold launches a kernel per example, which costs more than the step."""
    (kh, kw), (sh, sw), (dh, dw) = module.kernel_size, module.stride, module.dilation
    ph, pw = padding
    if ph or pw:
        x = F.pad(x, (pw, pw, ph, ph))
    windows = x.unfold(2, (kh - 1) * dh + 1, sh).unfold(3, (kw - 1) * dw + 1, sw)
    windows = windows[..., ::dh, ::dw]  # (B, C, out_h, out_w, kh, kw)
    n, c, out_h, out_w = windows.shape[:4]
    return windows.permute(0, 1, 4, 5, 2, 3).reshape(n, c * kh * kw, out_h * out_w)


def device_per_example(layer: _Layer, use: _Use, scale: Scale, fuse: bool
                       ) -> list[DevicePart]:
    """One layer call's per-example gradients, materialized with torch operations."""
    assert use.backprop is not None
    module, a, b = layer.module, use.activation, use.backprop
    weight, bias = layer.params.get("weight"), layer.params.get("bias")
    n = a.shape[0] if a.dim() else 0
    parts: list[DevicePart] = []
    if isinstance(module, nn.Linear) and a.dim() == 2:
        if weight is not None and bias is not None and fuse:
            return [DeviceOuter((weight, bias), a, b, scale)]
        if weight is not None:
            parts.append(DeviceOuter((weight,), a, b, scale))
        if bias is not None:
            parts.append(OnDevice((bias,), b, scale))
        return parts
    if isinstance(module, nn.Linear) and a.dim() > 2:
        # (B, T, in) and (B, T, out): the sum over positions T of b_t a_t^T, (B, out, in)
        a3 = a.reshape(n, -1, a.shape[-1]).to(torch.float64)
        b3 = b.reshape(n, -1, b.shape[-1]).to(torch.float64)
        outer = torch.bmm(b3.transpose(1, 2), a3)
        bias_grads = b3.sum(dim=1)
        if weight is not None and bias is not None and fuse:
            return [OnDevice((weight, bias), torch.cat([outer.reshape(n, -1), bias_grads], 1),
                             scale)]
        if weight is not None:
            parts.append(OnDevice((weight,), outer.reshape(n, -1), scale))
        if bias is not None:
            parts.append(OnDevice((bias,), bias_grads, scale))
        return parts
    if isinstance(module, nn.Conv2d) and _tappable_conv(module) and a.dim() == 4:
        padding = module.padding
        assert isinstance(padding, tuple)  # _tappable_conv
        out_c = b.shape[1]
        backprops = b.reshape(n, out_c, -1)
        if weight is not None:
            columns = _unfold(a.to(backprops.dtype), module, padding)
            grads = torch.bmm(backprops, columns.transpose(1, 2))  # (B, C_out, C_in k k)
            if bias is not None and fuse:
                flat = torch.cat([grads.reshape(n, -1), backprops.sum(dim=2)], 1)
                return [OnDevice((weight, bias), flat, scale)]
            parts.append(OnDevice((weight,), grads.reshape(n, -1), scale))
        if bias is not None:
            parts.append(OnDevice((bias,), backprops.sum(dim=2), scale))
        return parts
    grads_list = _functorch_per_example(layer, a, b)
    return [OnDevice((p,), g.reshape(n, -1), scale)
            for p, g in zip(layer.params.values(), grads_list, strict=True)]


# --- CUDA graphs ----------------------------------------------------------------------------


@dataclass
class _Graph:
    graph: Any  # torch.cuda.CUDAGraph
    records: Records  # static copies of the records, padded with zero rows
    scale: Tensor
    out: Tensor
    scale_now: float = 1.0  # the value ``scale`` holds (it is set only when it changes)


class ClippingGraphs:
    """Replays the clipping and exact sum of a batch as one CUDA graph.

    On a GPU a step of these small operations is bound by the host launching some twenty
    kernels a layer, not by the device. A graph launches them in one call. Its inputs are
    static buffers: the records are copied in, padded with zero rows up to a multiple of
    ``bucket`` (Poisson sampling varies the batch size, and a zero row contributes exactly
    nothing: its gradient is zero, or not finite and then dropped), and the loss reduction's
    batch size is a device scalar. The kernels and their arithmetic are the ones the eager
    path runs (``tests/test_learn_device.py`` checks the sums bit for bit on a GPU). A shape
    is captured the second time it is seen; at most ``max_graphs`` are kept (each holds its
    own scratch memory).
    """

    def __init__(self, compute: Callable[[int, Records, Scale], Tensor], *, mean: bool,
                 bucket: int = 32, max_graphs: int = 4) -> None:
        self._compute = compute
        self.mean = mean
        self._bucket = bucket
        self._max = max_graphs
        self._graphs: OrderedDict[Any, _Graph] = OrderedDict()
        self._seen: dict[Any, int] = {}

    def run(self, batch: int, records: Records, settings: Any = None) -> Tensor | None:
        """The exact sum's increment for this batch (a static buffer: use it before the next
        call), or None where it is to be computed eagerly (a shape seen once). ``settings``
        holds every number the computation reads besides the records (the clipping bounds):
        a graph bakes them in, so a change must select another graph."""
        if batch < 1:
            return None
        padded = -(-batch // self._bucket) * self._bucket
        key = (padded, settings, tuple(
            (layer.name, tuple((u.activation.shape[1:], u.activation.dtype,
                                _backprop(u).shape[1:], _backprop(u).dtype) for u in uses))
            for layer, uses in records))
        entry = self._graphs.get(key)
        if entry is None:
            self._seen[key] = self._seen.get(key, 0) + 1
            if self._seen[key] < 2:
                return None
            entry = self._capture(padded, records)
            self._graphs[key] = entry
            if len(self._graphs) > self._max:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(key)
        fill_padded(entry.records, records, batch)
        scale = float(batch) if self.mean else 1.0
        if scale != entry.scale_now:  # each call is a launch: the step is bound by them
            entry.scale.fill_(scale)
            entry.scale_now = scale
        entry.graph.replay()
        return entry.out

    def _capture(self, padded: int, records: Records) -> _Graph:
        device = records[0][1][0].activation.device
        static = padded_records(records, padded)
        scale = torch.ones((), dtype=torch.float64, device=device)
        side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up off the capture (lazy initialisations)
            for _ in range(2):
                self._compute(padded, static, scale)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self._compute(padded, static, scale)
        return _Graph(graph, static, scale, out)


def padded_records(records: Records, padded: int) -> Records:
    """Zero buffers shaped as ``records`` with ``padded`` rows (a graph's static inputs)."""
    static: Records = []
    for layer, uses in records:
        held = []
        for use in uses:
            a, b = use.activation, _backprop(use)
            a_static = torch.zeros((padded, *a.shape[1:]), dtype=a.dtype, device=a.device)
            b_static = torch.zeros((padded, *b.shape[1:]), dtype=b.dtype, device=b.device)
            held.append(_Use(a_static, a_static._version, b_static))
        static.append((layer, held))
    return static


def fill_padded(static: Records, records: Records, batch: int) -> None:
    """Copy ``records`` (``batch`` rows) into ``static``; the rows after them become zeros."""
    for (_, uses), (_, held) in zip(records, static, strict=True):
        for use, target in zip(uses, held, strict=True):
            for source, buffer in ((use.activation, target.activation),
                                   (_backprop(use), _backprop(target))):
                buffer[:batch].copy_(source)
                if batch < len(buffer):
                    buffer[batch:].zero_()


def _backprop(use: _Use) -> Tensor:
    assert use.backprop is not None
    return use.backprop
