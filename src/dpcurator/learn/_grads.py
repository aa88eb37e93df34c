"""Per-example gradients, clipped and summed exactly in fixed point.

``GradSampler`` attaches to a module. During the forward pass it keeps each trainable layer's
input; during the backward pass, the gradient of the loss with respect to the layer's output
(tensor hooks, so in-place activations after the layer are fine). At the optimizer's step it
turns them into each example's gradient, one parameter at a time:

- ``nn.Linear`` on a batch of vectors: example i's weight gradient is the outer product
  b_i a_i^T of its output gradient and its input, so its norm is |b_i| |a_i| and the clipped
  sum is one matrix product; it is never materialized per example.
- ``nn.Conv2d`` (ungrouped): the input unfolded into columns, one batched matrix product.
- every other layer: ``torch.func.vmap`` over ``torch.func.grad`` of the layer's own function
  (``functional_call`` with the captured input), which gives the per-example gradients of any
  layer whose output row i depends only on input row i.

Clipping (Abadi et al. 2016): example i's gradient is scaled by c_i = min(1, C / |g_i|), its
norm taken over all parameters ("flat") or per parameter with bounds C_p, sum of C_p^2 = C^2
("per-layer"). Each clipped gradient is then truncated toward zero onto the grid of step
C 2^-40, as integers, and summed over the batch exactly:

- truncation toward zero never increases a coordinate's magnitude, so a truncated gradient's
  norm is at most its clipped norm: at most C. Norms are computed in float64 and the bound
  used is C (1 - 2^-16), which covers every rounding error in computing them (relative errors
  below 2^-30 for any layer with fewer than 2^20 ... 2^36 terms), so one example's
  contribution to the sum is at most C in L2 norm, exactly;
- the sum of integers below 2^53 is exact in float64 whatever the order of summation (BLAS,
  threads): rows are summed 2^13 at a time (each entry at most 2^40), the partial sums
  added in int64. So the batch's sum is an exact function of the examples, and adding or
  removing one example changes it by that example's contribution, nothing more. (Outer
  products truncate their two factors, which split the bits between them, so that each
  product is an integer of magnitude at most 2^40.)

So the summed gradient's L2 sensitivity under add/remove of one example is C, with no
floating-point inflation. What is assumed: PyTorch computes example i's activations and
output gradients from example i alone (row-wise kernels; layers that mix examples, such as
batch normalization, are refused).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from numba import njit
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from dpcurator.errors import UserError

__all__ = ["GRID_BITS", "GradSampler", "clip_factors"]

#: Clipped gradients are summed on a grid of step C 2^-GRID_BITS.
GRID_BITS = 40
#: The clipping bound used, as a fraction of the stated one: covers rounding in the norms.
CLIP_MARGIN = 1.0 - 2.0**-16
#: Rows summed at once in float64: at most 2^13 integers of magnitude 2^40 stay below 2^53.
_ROWS = 1 << (53 - GRID_BITS)
#: Examples in one logical batch: their int64 sum stays below 2^62 (the noise fits on top).
MAX_BATCH = 1 << (62 - GRID_BITS)

_MIXING_LAYERS = (
    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm,
    nn.LazyBatchNorm1d, nn.LazyBatchNorm2d, nn.LazyBatchNorm3d,
)


class PerExample:
    """Per-example gradients of some parameters for one batch, in whatever form is cheapest."""

    params: tuple[nn.Parameter, ...]

    def squared_norms(self) -> Tensor:
        """(B,) float64: an upper bound on each example's squared gradient norm (exact up to
        the float64 rounding that CLIP_MARGIN covers)."""
        raise NotImplementedError

    def clipped_sum(self, factors: Tensor) -> Tensor:
        """The exact sum over examples of their truncated, scaled gradients: one flat int64
        vector, the parameters' entries in order.

        ``factors`` (B,) float64 is c_i 2^GRID_BITS / C: the clip and the grid in one.
        """
        raise NotImplementedError


#: float32 norms are used (and bounded) up to this many entries per example.
_FLOAT32_NORM_MAX = 1 << 20


@dataclass
class Materialized(PerExample):
    """Per-example gradients of one parameter, held as a (B, *shape) tensor."""

    params: tuple[nn.Parameter, ...]
    grads: Tensor

    def squared_norms(self) -> Tensor:
        flat = self.grads.reshape(self.grads.shape[0], -1)
        size = flat.shape[1]
        if flat.dtype == torch.float32 and size <= _FLOAT32_NORM_MAX:
            # A float32 norm of d terms, summed in any order, is within a relative (d + 2) 2^-24
            # of the true one; divided by 1 - (d + 2) 2^-23 it is an upper bound.
            norms = torch.linalg.vector_norm(flat, dim=1).to(torch.float64)
            upper = norms / (1.0 - (size + 2) * 2.0**-23)
            if bool(torch.isfinite(upper).all()):
                squared: Tensor = upper.square()
                return squared
        return flat.to(torch.float64).square().sum(dim=1)

    def clipped_sum(self, factors: Tensor) -> Tensor:
        flat = self.grads.reshape(self.grads.shape[0], -1)
        if flat.dtype not in (torch.float32, torch.float64):
            flat = flat.to(torch.float64)
        total = np.zeros(flat.shape[1], dtype=np.int64)
        _truncated_sum(flat.contiguous().numpy(), factors.contiguous().numpy(), total)
        return torch.from_numpy(total)


@dataclass
class OuterProduct(PerExample):
    """A linear layer's weight (and bias) gradients b_i [a_i, 1]^T, never materialized."""

    params: tuple[nn.Parameter, ...]  # the weight, then the bias if it is trainable
    backprops: Tensor  # (B, out) float64
    activations: Tensor  # (B, in), with a column of ones for the bias; float64
    _norms: tuple[Tensor, Tensor] | None = field(default=None, init=False, repr=False)

    def _factor_norms(self) -> tuple[Tensor, Tensor]:
        if self._norms is None:
            self._norms = (
                torch.linalg.vector_norm(self.backprops, dim=1),
                torch.linalg.vector_norm(self.activations, dim=1),
            )
        return self._norms

    def squared_norms(self) -> Tensor:
        nb, na = self._factor_norms()
        return (nb * na).square()

    def clipped_sum(self, factors: Tensor) -> Tensor:
        nb, na = self._factor_norms()
        # With t_i = sqrt(f_i |b_i| |a_i|): U_i = trunc(a_i t_i / |a_i|), V_i = trunc(b_i t_i /
        # |b_i|), so |U_i| |V_i| <= t_i^2 = f_i |g_i| <= 2^40 bounds every entry of V_i U_i^T,
        # and each factor carries about half of the bits.
        t = (factors * na * nb).sqrt()
        u = (self.activations * torch.where(na > 0, t / na, 0.0)[:, None]).trunc_()
        v = (self.backprops * torch.where(nb > 0, t / nb, 0.0)[:, None]).trunc_()
        total = torch.zeros((v.shape[1], u.shape[1]), dtype=torch.int64)
        for start in range(0, u.shape[0], _ROWS):
            rows = slice(start, start + _ROWS)
            total += (v[rows].T @ u[rows]).to(torch.int64)  # integers, exact below 2^53
        if len(self.params) == 1:
            return total.reshape(-1)
        return torch.cat([total[:, :-1].reshape(-1), total[:, -1]])


@njit(cache=True, nogil=True)
def _truncated_sum(grads, factors, total):  # type: ignore[no-untyped-def]
    """total += sum_i trunc(float64(grads[i]) * factors[i]), exactly, in one pass.

    Rows are added in float64 (exact: at most 2^13 integers of magnitude 2^40 stay below
    2^53), and every 2^13 rows the partial sums move into the int64 total.
    """
    rows, cols = grads.shape
    partial = np.zeros(cols, dtype=np.float64)
    for start in range(0, rows, _ROWS):
        stop = min(rows, start + _ROWS)
        partial[:] = 0.0
        for i in range(start, stop):
            f = factors[i]
            for j in range(cols):
                partial[j] += np.trunc(np.float64(grads[i, j]) * f)
        for j in range(cols):
            total[j] += np.int64(partial[j])


def clip_factors(squared: Tensor, bound: float) -> Tensor:
    """min(1, bound * CLIP_MARGIN / norm) per example, in float64 (1 for a zero gradient)."""
    norms = squared.sqrt()
    return torch.clamp(bound * CLIP_MARGIN / norms, max=1.0)


@dataclass
class _Use:
    """One call of a layer in a forward pass: its input, and later its output's gradient."""

    activation: Tensor
    backprop: Tensor | None = None


@dataclass
class _Layer:
    name: str
    module: nn.Module
    params: dict[str, nn.Parameter]
    uses: list[_Use] = field(default_factory=list)


class GradSampler:
    """Captures what each trainable layer of ``module`` needs for per-example gradients.

    ``loss_reduction`` says how the loss combined the examples: "mean" (the gradients that
    reach the layers are divided by the batch size, which is undone) or "sum". ``fuse``
    treats a linear layer's weight and bias as one unit (fine for flat clipping, where only
    the total norm matters; per-layer clipping needs one unit per parameter).
    """

    def __init__(self, module: nn.Module, *, loss_reduction: str = "mean",
                 fuse: bool = True) -> None:
        if loss_reduction not in ("mean", "sum"):
            raise UserError(f"loss_reduction must be 'mean' or 'sum', got {loss_reduction!r}")
        self.loss_reduction = loss_reduction
        self.fuse = fuse  # a linear layer's weight and bias as one clipped unit (flat clipping)
        self.module = module
        self.layers: list[_Layer] = []
        self._handles: list[Any] = []
        for name, sub in module.named_modules():
            if isinstance(sub, _MIXING_LAYERS):
                raise UserError(
                    f"module {name or type(sub).__name__!r} ({type(sub).__name__}) mixes the "
                    "examples of a batch, so per-example gradients are not defined; use "
                    "nn.GroupNorm or nn.LayerNorm instead"
                )
            own = {n: p for n, p in sub.named_parameters(recurse=False) if p.requires_grad}
            if not own:
                continue
            if any(p.requires_grad for c in sub.children() for p in c.parameters()):
                raise UserError(
                    f"module {name!r} ({type(sub).__name__}) has trainable parameters of its "
                    "own and trainable submodules; per-example gradients need each trainable "
                    "parameter to belong to a module whose children are frozen or parameter-free"
                )
            layer = _Layer(name, sub, own)
            self.layers.append(layer)
            self._handles.append(sub.register_forward_hook(self._capture(layer)))
        if not self.layers:
            raise UserError("module has no trainable parameters")

    def parameters(self) -> Iterator[nn.Parameter]:
        """The trainable parameters, in the order ``per_example`` returns them."""
        for layer in self.layers:
            yield from layer.params.values()

    def _capture(self, layer: _Layer) -> Callable[[nn.Module, tuple[Any, ...], Any], None]:
        def hook(module: nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
            if not torch.is_grad_enabled() or not isinstance(output, Tensor):
                return
            if not output.requires_grad:
                return
            if len(inputs) != 1 or not isinstance(inputs[0], Tensor):
                raise UserError(
                    f"layer {layer.name!r} ({type(module).__name__}) was called with "
                    f"{len(inputs)} inputs; per-example gradients need layers with trainable "
                    "parameters to take one tensor"
                )
            use = _Use(inputs[0].detach())
            layer.uses.append(use)

            def keep(backprop: Tensor) -> None:
                use.backprop = backprop.detach()

            output.register_hook(keep)  # type: ignore[no-untyped-call]

        return hook

    def clear(self) -> None:
        """Forget what was captured (after a step, or on ``zero_grad``)."""
        for layer in self.layers:
            layer.uses.clear()

    def remove(self) -> None:
        """Detach from the module."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.clear()

    def per_example(self) -> tuple[int, list[PerExample]]:
        """The batch size and the per-example gradients of every trainable parameter, in the
        order of ``parameters()``."""
        batch: int | None = None
        out: list[PerExample] = []
        for layer in self.layers:
            done = [u for u in layer.uses if u.backprop is not None]
            if not done:
                raise UserError(
                    f"no gradient reached layer {layer.name!r} ({type(layer.module).__name__}) "
                    "since the last step: call loss.backward() before optimizer.step(), or "
                    "freeze the layer (requires_grad=False)"
                )
            for use in done:
                size = use.activation.shape[0] if use.activation.dim() else -1
                if batch is None:
                    batch = size
                if size != batch:
                    raise UserError(
                        f"layer {layer.name!r} saw a batch of {size} rows where the first "
                        f"layer saw {batch}: the batch must be the first dimension of every "
                        "trainable layer's input"
                    )
            scale = float(batch) if self.loss_reduction == "mean" and batch else 1.0
            per_use = [_layer_per_example(layer, u, scale, self.fuse) for u in done]
            if len(per_use) == 1:
                out.extend(per_use[0])
            else:  # a layer called several times in one forward pass: gradients add up
                for param in layer.params.values():
                    total = sum(_materialize(parts, param) for parts in per_use)
                    assert isinstance(total, Tensor)
                    out.append(Materialized((param,), total))
        assert batch is not None
        return batch, out


def _materialize(parts: list[PerExample], param: nn.Parameter) -> Tensor:
    """One parameter's per-example gradients (B, *shape), in float64."""
    for part in parts:
        if not any(p is param for p in part.params):
            continue
        if isinstance(part, Materialized):
            return part.grads.to(torch.float64)
        assert isinstance(part, OuterProduct)
        full = torch.einsum("bo,bi->boi", part.backprops, part.activations)
        if part.params[0] is param:
            return full[:, :, : param.shape[1]] if len(part.params) == 2 else full
        return full[:, :, -1]
    raise AssertionError("parameter missing from its layer's gradients; this is a bug")


def _layer_per_example(layer: _Layer, use: _Use, scale: float, fuse: bool
                       ) -> list[PerExample]:
    assert use.backprop is not None
    module, a, b = layer.module, use.activation, use.backprop
    if isinstance(module, nn.Linear) and a.dim() == 2:
        b64 = b.to(torch.float64) * scale
        a64 = a.to(torch.float64)
        weight = layer.params.get("weight")
        bias = layer.params.get("bias")
        parts: list[PerExample] = []
        if weight is not None and bias is not None and fuse:
            ones = torch.ones((a64.shape[0], 1), dtype=torch.float64)
            return [OuterProduct((weight, bias), b64, torch.cat([a64, ones], dim=1))]
        if weight is not None:
            parts.append(OuterProduct((weight,), b64, a64))
        if bias is not None:
            parts.append(Materialized((bias,), b64))
        return parts
    if (isinstance(module, nn.Conv2d) and module.groups == 1
            and isinstance(module.padding, tuple) and module.padding_mode == "zeros"
            and a.dim() == 4):
        return _conv2d_per_example(layer, module, a, b * scale)
    grads = _functorch_per_example(layer, a, b * scale)
    return [Materialized((p,), g) for p, g in zip(layer.params.values(), grads, strict=True)]


def _conv2d_per_example(layer: _Layer, module: nn.Conv2d, a: Tensor, b: Tensor
                        ) -> list[PerExample]:
    """Per-example gradients of a 2-D convolution: unfold the input, one batched product."""
    assert isinstance(module.padding, tuple)
    columns = torch.nn.functional.unfold(
        a, module.kernel_size, dilation=module.dilation, padding=module.padding,
        stride=module.stride)  # (B, C_in k k, L)
    backprops = b.reshape(b.shape[0], b.shape[1], -1)  # (B, C_out, L)
    parts: list[PerExample] = []
    for name, param in layer.params.items():
        if name == "weight":
            grads = torch.bmm(backprops, columns.transpose(1, 2)).reshape(-1, *param.shape)
        else:
            grads = backprops.sum(dim=2)
        parts.append(Materialized((param,), grads))
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
