"""Per-example gradients, clipped and summed exactly in fixed point.

``GradSampler`` (in ``_sampler``) attaches to a module and records, for every call of a
trainable layer in a forward pass, the layer's input and the gradient of the loss with respect
to its output:

- ``nn.Linear`` and ``nn.Conv2d`` (ungrouped, zero padding) are *tapped*: their class is
  swapped for a subclass (as ``torch.nn.utils.parametrize`` does; ``remove()`` swaps it
  back) whose forward, while gradients are recorded, computes with detached parameters and
  records its output's gradient (``_tap``). Autograd then computes the input's gradient
  only: the summed weight gradient that ordinary training computes, and DP-SGD would throw
  away, is never computed, and the parameters' ``.grad`` stay unset until ``step()``.
- every other layer is hooked: a forward hook keeps its input, a tensor hook its output's
  gradient (autograd then also computes its summed gradient, unused).

A recorded input changed in place before the step (its version counter moved) is refused.

At the optimizer's step the records become each example's gradient, one unit at a time (a
parameter, or a linear layer's weight and bias together), in the cheapest form:

- ``nn.Linear`` on a batch of vectors: example i's gradient is the outer product
  b_i [a_i, 1]^T of its output gradient and its input (with a 1 for the bias), of norm
  |b_i| |[a_i, 1]|; it is never materialized, and the clipped sum is one matrix product;
- ``nn.Linear`` on sequences: one batched product over the positions;
- ``nn.Conv2d``: the input unfolded into columns (a compiled im2col), one batched product;
- every other layer: ``torch.func.vmap`` over ``torch.func.grad`` of the layer's own function
  (``functional_call`` with the recorded input), for any layer whose output row i depends
  only on input row i.

Clipping (Abadi et al. 2016): example i's gradient is scaled by c_i = min(1, C / |g_i|), its
norm taken over all parameters ("flat") or per parameter with bounds C_p, sum of C_p^2 = C^2
("per-layer"). The clipped gradient is put on the grid of step C 2^-40 as an integer vector
z_i (``_kernels``: f_i = c_i 2^40 / C), and the batch's sum S = sum_i z_i is computed exactly.

Why one example moves S by at most C (the L2 sensitivity under add/remove of one example):

1. z_i is a function of example i's records (a_i, b_i) and the bounds alone: so are its norm
   and clip factor.
2. |z_i| <= 2^40 (in grid units, that is C). Squared norms are sums of squares computed in
   float64 (exact squares for float32 values), in any order: within a relative d 2^-53 of
   the exact ones for d terms. With the few roundings after them (the clip factor, the grid
   unit, the scaled entries, each within 2^-53), every ratio between what is computed and
   the exact value stays within 1 + (d + 32) 2^-53, and the bound used, C (1 - 2^-16),
   absorbs that for models of fewer than 2^32 entries (``DPOptimizer`` refuses larger ones).
   Two forms of z_i:
   - materialized gradients: z_ij = trunc(g_ij f_i); truncation toward zero never increases
     a magnitude, so |z_i| <= f_i |g_i| up to those roundings, at most 2^40;
   - outer products: z_i = v_i u_i^T with u_i = trunc([a_i, 1] t_i / |[a_i, 1]|) and
     v_i = trunc(b_i t_i / |b_i|), t_i^2 = f_i |g_i|: a rank-one integer matrix of norm
     |v_i| |u_i| <= t_i^2 <= 2^40 up to those roundings (truncating a factor never
     increases its norm; each factor carries about 20 bits).
   Per-layer clipping bounds each unit by 2^40 C_p / C; their root sum of squares is 2^40.
3. S is exact. Integers are added in float64, at most 2^13 examples at a time: every entry
   of every z_i is at most 2^40 in magnitude, so every partial sum, in any order, is an
   integer below 2^53 and exactly representable; for outer products the entries of
   sum_i v_i u_i^T come from one float64 matrix product (torch.mm) whose every term
   v_io u_ik is an integer of magnitude at most |v_i| |u_i| <= 2^40 and whose every partial
   sum (any blocking, any order, fused multiply-adds or not) stays below 2^53, so the
   product is exact. Blocks of 2^13 examples are then added in int64 (a batch is at most
   2^22 examples: below 2^62).
4. An example whose gradient is not finite (an infinity or a NaN: its norm is not finite)
   contributes exactly nothing, a function of itself alone.

So S(D + x) - S(D) = z_x, of norm at most C, with no floating-point inflation. What is
assumed: PyTorch computes example i's records (a_i, b_i) from example i alone (row-wise
kernels; layers that mix examples, such as batch normalization, are refused). This is not
checked: a kernel may round a row differently at another batch size, and under
``loss_reduction="mean"`` each b_i is computed divided by the batch size and multiplied back.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from dpcurator.errors import UserError
from dpcurator.learn import _kernels
from dpcurator.learn._kernels import GRID_BITS, ROWS

__all__ = [
    "CLIP_MARGIN", "GRID_BITS", "MAX_BATCH", "MAX_ENTRIES", "PerExample",
    "Workspace", "clip_factors",
]

#: The clipping bound used, as a fraction of the stated one: covers rounding in the norms.
CLIP_MARGIN = 1.0 - 2.0**-16
#: Examples in one logical batch: their int64 sum stays below 2^62 (the noise fits on top).
MAX_BATCH = 1 << (62 - GRID_BITS)
#: Trainable entries of a model: CLIP_MARGIN covers the rounding of norms of fewer terms.
MAX_ENTRIES = 1 << 32

_MIXING_LAYERS = (
    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm,
    nn.LazyBatchNorm1d, nn.LazyBatchNorm2d, nn.LazyBatchNorm3d,
)

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
#: Each trainable layer with its calls recorded since the last step.
Records = list[tuple["_Layer", list["_Use"]]]


def clip_factors(squared: Floats, bound: float) -> Floats:
    """min(1, bound * CLIP_MARGIN / norm) per example, in float64 (1 for a zero gradient;
    0 or NaN, so that the example contributes nothing, for a norm that is not finite)."""
    factors = np.empty_like(squared)
    _kernels.clip(squared, bound * CLIP_MARGIN, factors)
    return factors


def _array(t: Tensor) -> npt.NDArray[Any]:
    """A C-contiguous float32 or float64 numpy view (or copy) of a CPU tensor."""
    if t.dtype not in (torch.float32, torch.float64):
        t = t.to(torch.float32)
    return np.ascontiguousarray(t.detach().numpy())


class Workspace:
    """Scratch arrays kept from step to step, so that a step does not allocate (and fault
    in) megabytes of fresh memory.

    ``get(key, shape, dtype)`` returns a tensor of that shape, and a numpy view of it: the
    first rows of one buffer per key, trailing shape and dtype, which grows (by a quarter at
    least) when a batch is larger than any before. Its contents are whatever the last user
    left; it is valid until the next ``get`` with the same key.
    """

    def __init__(self) -> None:
        # per (key, trailing shape, dtype): the buffer, and the views last handed out (a
        # step of a fixed batch size then makes no new views: each costs microseconds)
        self._held: dict[tuple[Any, ...], tuple[Tensor, npt.NDArray[Any]]] = {}
        self._views: dict[tuple[Any, ...], tuple[int, Tensor, npt.NDArray[Any]]] = {}

    def get(self, key: Any, shape: tuple[int, ...], dtype: torch.dtype
            ) -> tuple[Tensor, npt.NDArray[Any]]:
        rows, rest = shape[0], shape[1:]
        name = (key, rest, dtype)
        last = self._views.get(name)
        if last is not None and last[0] == rows:
            return last[1], last[2]
        found = self._held.get(name)
        if found is None or found[0].shape[0] < rows:
            capacity = rows if found is None else max(rows, found[0].shape[0] * 5 // 4)
            t = torch.empty((capacity, *rest), dtype=dtype)
            found = self._held[name] = (t, t.numpy())
        views = (rows, found[0][:rows], found[1][:rows])
        self._views[name] = views
        return views[1], views[2]


class PerExample:
    """Per-example gradients of one unit (one or two parameters) for one batch."""

    params: tuple[nn.Parameter, ...]

    @property
    def size(self) -> int:
        return sum(p.numel() for p in self.params)

    def squared_norms(self) -> Floats:
        """(B,) float64, a fresh array: an upper bound on each example's squared gradient
        norm (exact up to the relative rounding that CLIP_MARGIN covers)."""
        raise NotImplementedError

    def add_clipped_sum(self, factors: Floats, total: Ints, work: Workspace | None = None
                        ) -> None:
        """total += the exact sum over examples of their truncated, scaled gradients: int64,
        the parameters' entries in order. ``factors`` (B,) is c_i 2^GRID_BITS / C."""
        raise NotImplementedError

    def gradients(self) -> list[Tensor]:
        """Each parameter's per-example gradients (B, *shape), float64: the plain reference
        (used where a layer is called twice in one pass, and by tests)."""
        raise NotImplementedError

    def clipped_sum(self, factors: Floats) -> Ints:
        """The exact sum alone (a fresh int64 vector)."""
        total = np.zeros(self.size, dtype=np.int64)
        self.add_clipped_sum(factors, total)
        return total


@dataclass
class Materialized(PerExample):
    """Per-example gradients of one unit: ``scale`` times a held (B, ...) tensor.

    ``order``: where the held entries (flattened per example) are not the unit's parameters'
    entries in order, the gather that puts them in order (unit = held[order]).
    """

    params: tuple[nn.Parameter, ...]
    grads: Tensor
    scale: float = 1.0
    order: npt.NDArray[np.intp] | None = None

    def _flat(self) -> npt.NDArray[Any]:
        return _array(self.grads).reshape(self.grads.shape[0], -1)

    def squared_norms(self) -> Floats:
        flat = self._flat()
        squared = np.empty(flat.shape[0], dtype=np.float64)
        _kernels.squares(flat, squared, False)
        if self.scale != 1.0:
            squared *= self.scale * self.scale
        return squared

    def add_clipped_sum(self, factors: Floats, total: Ints, work: Workspace | None = None
                        ) -> None:
        flat = self._flat()
        if self.scale != 1.0:
            factors = factors * self.scale
        if self.order is None:
            _kernels.truncated_sum(flat, factors, total)
            return
        held = np.zeros(flat.shape[1], dtype=np.int64)
        _kernels.truncated_sum(flat, factors, held)
        total += held[self.order]

    def gradients(self) -> list[Tensor]:
        flat = self.grads.reshape(self.grads.shape[0], -1).to(torch.float64) * self.scale
        if self.order is not None:
            flat = flat[:, torch.from_numpy(self.order)]
        sizes = [p.numel() for p in self.params]
        return [g.reshape(-1, *p.shape)
                for p, g in zip(self.params, torch.split(flat, sizes, dim=1), strict=True)]


class OuterProduct(PerExample):
    """A linear layer's weight (and bias) gradients scale b_i [a_i, 1]^T, never materialized.

    ``params``: the weight, then the bias if it is fused in. ``activations`` (B, in) and
    ``backprops`` (B, out); ``scale``: the loss reduction's batch size, or 1.
    """

    def __init__(self, params: tuple[nn.Parameter, ...], activations: Tensor,
                 backprops: Tensor, scale: float) -> None:
        self.params = params
        self.activations, self.backprops, self.scale = activations, backprops, scale
        self._a, self._b = _array(activations), _array(backprops)
        self._squares: tuple[Floats, Floats] | None = None

    def _factor_squares(self) -> tuple[Floats, Floats]:
        """|[a_i, 1]|^2 and |b_i|^2 (unscaled), computed once."""
        if self._squares is None:
            n = self._a.shape[0]
            a2, b2 = np.empty(n), np.empty(n)
            _kernels.outer_squares(self._a, self._b, len(self.params) == 2, a2, b2)
            self._squares = (a2, b2)
        return self._squares

    def squared_norms(self) -> Floats:
        a2, b2 = self._factor_squares()
        squared: Floats = a2 * b2 * (self.scale * self.scale)
        return squared

    def add_clipped_sum(self, factors: Floats, total: Ints, work: Workspace | None = None
                        ) -> None:
        a, b = self._a, self._b
        a2, b2 = self._factor_squares()
        work = Workspace() if work is None else work
        (n, n_in), n_out = a.shape, b.shape[1]
        width = n_in + (len(self.params) == 2)
        u_t, u = work.get("u", (n, width), torch.float64)
        v_t, v = work.get("v", (n, n_out), torch.float64)
        _kernels.outer_factors(a, b, a2, b2, self.scale, factors, u, v)
        product_t, product = work.get("product", (width, n_out), torch.float64)
        for start in range(0, n, ROWS):  # exact integers: at most ROWS examples at a time
            # (one batch of at most ROWS is not sliced: each view costs microseconds)
            u_c, v_c = (u_t, v_t) if n <= ROWS else (u_t[start:start + ROWS],
                                                     v_t[start:start + ROWS])
            torch.mm(u_c.T, v_c, out=product_t)  # sum_i u_i v_i^T
            _kernels.add_outer(product, total, n_in)

    def gradients(self) -> list[Tensor]:
        a = self.activations.to(torch.float64)
        b = self.backprops.to(torch.float64) * self.scale
        grads = [torch.einsum("bo,bi->boi", b, a)]
        if len(self.params) == 2:
            grads.append(b)
        return grads


@dataclass
class _Use:
    """One call of a layer in a forward pass: its input, and later its output's gradient."""

    activation: Tensor
    version: int  # the input's version counter then: a later in-place change is refused
    backprop: Tensor | None = None
    #: the data loader's chunk current at the call (``_sampling.Chunk``), or None
    chunk: Any = None

    def keep(self, backprop: Tensor) -> None:
        """The output's gradient hook (twice for a graph run backward twice: they add)."""
        done = backprop.detach()
        self.backprop = done if self.backprop is None else self.backprop + done


@dataclass
class _Layer:
    name: str
    module: nn.Module
    params: dict[str, nn.Parameter]
    uses: list[_Use] = field(default_factory=list)
    #: the data loader's current chunk, recorded with each call (``GradSampler.chunk_of``)
    chunk_of: Callable[[], Any] | None = None


# --- tapped layers --------------------------------------------------------------------------

#: Tapped modules and the records their calls go to, both held weakly: a deep copy of a
#: tapped module is not in it, and a module whose sampler is gone (its optimizer dropped) is
#: no longer recorded; either computes as the plain layer does.
_TAPS: weakref.WeakKeyDictionary[nn.Module, weakref.ref[_Layer]] = weakref.WeakKeyDictionary()


def _tapped_layer(module: nn.Module) -> _Layer | None:
    """The records of a tapped module's calls, if they are wanted now."""
    if not torch.is_grad_enabled():
        return None
    ref = _TAPS.get(module)
    return None if ref is None else ref()


#: A constant that "needs" a gradient: the anchor of a tapped layer whose input needs none.
_ANCHOR = torch.zeros((), requires_grad=True)


class _Anchored(torch.autograd.Function):
    """out = compute(x) for an x that needs no gradient, made to need one (through the
    anchor) so that the backward pass reaches it; the backward records dL/dout and passes
    nothing on. The output is a fresh tensor, so in-place operations on it stay legal."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, anchor: Tensor, compute: Callable[[Tensor], Tensor],
                use: _Use) -> Tensor:
        ctx.use = use
        return compute(x)

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[None, None, None, None]:
        ctx.use.keep(grad_out)
        return None, None, None, None


def _tap(layer: _Layer, x: Tensor, compute: Callable[[Tensor], Tensor]) -> Tensor:
    """out = compute(x), from detached parameters; keep x and the gradient reaching out.

    With the parameters detached, autograd computes the input's gradient only. The output's
    gradient is recorded by a tensor hook (which sees the output as it was, even if it is
    changed in place later), or, when the input needs no gradient, by ``_Anchored``.
    """
    use = _Use(x.detach(), x._version,
               chunk=layer.chunk_of() if layer.chunk_of is not None else None)
    layer.uses.append(use)
    if x.requires_grad:
        out = compute(x)
        out.register_hook(use.keep)  # type: ignore[no-untyped-call]
        return out
    anchored: Tensor = _Anchored.apply(x, _ANCHOR, compute, use)  # type: ignore[no-untyped-call]
    return anchored


def _detached(param: Tensor | None) -> Tensor | None:
    return None if param is None else param.detach()


def _unbatched(module: nn.Module, shape: torch.Size) -> UserError:
    return UserError(f"a {type(module).__name__} layer got an input of shape {tuple(shape)}; "
                     "per-example gradients need the batch as the input's first dimension")


class _TappedLinear(nn.Linear):
    """nn.Linear whose summed weight gradient is never computed while it is made private."""

    def forward(self, input: Tensor) -> Tensor:
        layer = _tapped_layer(self)
        if layer is None:
            return super().forward(input)
        if input.dim() < 2:
            raise _unbatched(self, input.shape)
        weight, bias = self.weight.detach(), _detached(self.bias)
        return _tap(layer, input, lambda x: F.linear(x, weight, bias))

    def _get_name(self) -> str:
        return "Linear"


class _TappedConv2d(nn.Conv2d):
    """nn.Conv2d whose summed weight gradient is never computed while it is made private."""

    def forward(self, input: Tensor) -> Tensor:
        layer = _tapped_layer(self)
        if layer is None:
            return super().forward(input)
        if not _tappable_conv(self):
            raise UserError(f"layer {layer.name!r} was changed after make_private (grouped, or "
                            "padding other than zeros); make the model private again")
        if input.dim() != 4:
            raise _unbatched(self, input.shape)
        weight, bias = self.weight.detach(), _detached(self.bias)
        stride, padding, dilation = self.stride, self.padding, self.dilation
        return _tap(layer, input,
                    lambda x: F.conv2d(x, weight, bias, stride, padding, dilation))

    def _get_name(self) -> str:
        return "Conv2d"


def _tappable_conv(module: nn.Conv2d) -> bool:
    return (module.groups == 1 and isinstance(module.padding, tuple)
            and module.padding_mode == "zeros")


def _tapped_class(module: nn.Module) -> type[nn.Module] | None:
    """The tapped subclass for exactly nn.Linear or a tappable nn.Conv2d, else None."""
    if type(module) is nn.Linear:
        return _TappedLinear
    if type(module) is nn.Conv2d and _tappable_conv(module):
        return _TappedConv2d
    return None


def _layer_per_example(layer: _Layer, use: _Use, scale: float, fuse: bool,
                       work: Workspace | None) -> list[PerExample]:
    assert use.backprop is not None
    module, a, b = layer.module, use.activation, use.backprop
    weight = layer.params.get("weight")
    bias = layer.params.get("bias")
    if isinstance(module, nn.Linear) and a.dim() == 2:
        if weight is not None and bias is not None and fuse:
            return [OuterProduct((weight, bias), a, b, scale)]
        parts: list[PerExample] = []
        if weight is not None:
            parts.append(OuterProduct((weight,), a, b, scale))
        if bias is not None:
            parts.append(Materialized((bias,), b, scale))
        return parts
    if isinstance(module, nn.Linear) and a.dim() > 2:
        # (B, T, in) and (B, T, out): sum over the positions T of the outer products.
        a3 = a.reshape(a.shape[0], -1, a.shape[-1])
        b3 = b.reshape(b.shape[0], -1, b.shape[-1])
        parts = []
        if weight is not None:
            parts.append(Materialized((weight,), torch.bmm(b3.transpose(1, 2), a3), scale))
        if bias is not None:
            parts.append(Materialized((bias,), b3.sum(dim=1), scale))
        return parts
    if isinstance(module, nn.Conv2d) and _tappable_conv(module) and a.dim() == 4:
        return _conv2d_per_example(layer, module, a, b, scale, fuse, work)
    grads = _functorch_per_example(layer, a, b)
    return [Materialized((p,), g, scale)
            for p, g in zip(layer.params.values(), grads, strict=True)]


@functools.lru_cache(maxsize=64)
def _conv_order(out_c: int, in_c: int, kh: int, kw: int, channels_inner: bool, bias: bool
                ) -> npt.NDArray[np.intp]:
    """The gather from a held (K [+ 1], out_c) layout to (weight, [bias]) order; K indexes
    (ki, kj, c) when ``channels_inner``, else (c, ki, kj), and the bias is the last row."""
    o, c, i, j = np.meshgrid(np.arange(out_c), np.arange(in_c), np.arange(kh), np.arange(kw),
                             indexing="ij")
    row = (i * kw + j) * in_c + c if channels_inner else (c * kh + i) * kw + j
    order = (row * out_c + o).reshape(-1)
    if bias:
        order = np.concatenate([order, in_c * kh * kw * out_c + np.arange(out_c)])
    return order.astype(np.intp)


def _conv2d_per_example(layer: _Layer, module: nn.Conv2d, a: Tensor, b: Tensor, scale: float,
                        fuse: bool, work: Workspace | None) -> list[PerExample]:
    """Per-example gradients of a 2-D convolution: the input unfolded into columns (compiled
    im2col), then one batched product (B, C_in k k [+ 1], L) x (B, L, C_out), L the output
    positions; the bias, when fused, is a row of ones (its gradient is the output gradient
    summed over the positions)."""
    n, channels = a.shape[0], a.shape[1]
    out_c, out_h, out_w = b.shape[1], b.shape[2], b.shape[3]
    positions = out_h * out_w
    kh, kw = module.kernel_size
    sh, sw = module.stride
    padding = module.padding
    assert isinstance(padding, tuple)  # _tappable_conv
    ph, pw = padding
    dh, dw = module.dilation
    dtype = torch.float64 if a.dtype == b.dtype == torch.float64 else torch.float32
    x = _array(a.to(dtype))
    backprops = b.reshape(n, out_c, positions).to(dtype)
    weight, bias = layer.params.get("weight"), layer.params.get("bias")
    if weight is None:
        assert bias is not None
        return [Materialized((bias,), backprops.sum(dim=2), scale)]
    work = Workspace() if work is None else work
    fused = bias is not None and fuse
    rows = channels * kh * kw + fused
    channels_inner = channels >= out_w  # the faster im2col loop
    if channels_inner:
        cols_t, cols = work.get((id(layer), "cols"), (n, positions, rows), dtype)
        _kernels.im2col_channels(x, kh, kw, sh, sw, ph, pw, dh, dw, out_w, cols)
        columns = cols_t.transpose(1, 2)
    else:
        columns, cols = work.get((id(layer), "cols"), (n, rows, positions), dtype)
        _kernels.im2col_rows(x, kh, kw, sh, sw, ph, pw, dh, dw, out_w, cols)
    grads, _ = work.get((id(layer), "grads"), (n, rows, out_c), dtype)
    torch.bmm(columns, backprops.transpose(1, 2), out=grads)  # (B, C_in k k [+ 1], C_out)
    order = _conv_order(out_c, channels, kh, kw, channels_inner, fused)
    if fused:
        assert bias is not None
        return [Materialized((weight, bias), grads, scale, order)]
    parts: list[PerExample] = [Materialized((weight,), grads, scale, order)]
    if bias is not None:
        parts.append(Materialized((bias,), backprops.sum(dim=2), scale))
    return parts


def _functorch_per_example(layer: _Layer, a: Tensor, b: Tensor) -> list[Tensor]:
    """Per-example gradients of a layer's trainable parameters, by vmap over grad."""
    module = layer.module
    names = list(layer.params)
    frozen = {n: t.detach() for n, t in module.named_parameters(recurse=False) if n not in names}
    buffers = dict(module.named_buffers(recurse=False))

    def dot(params: dict[str, Tensor], a_i: Tensor, b_i: Tensor) -> Tensor:
        out: Tensor = functional_call(module, {**params, **frozen, **buffers},
                                      (a_i.unsqueeze(0),))
        return (out * b_i.unsqueeze(0)).sum()

    params = {n: p.detach() for n, p in layer.params.items()}
    grads: dict[str, Tensor] = vmap(grad(dot), in_dims=(None, 0, 0))(params, a, b)
    return [grads[n] for n in names]
