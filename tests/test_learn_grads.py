"""The fast per-example paths of ``dpcurator.learn._grads`` against plain references.

What the privacy proof needs from them (``_grads``' docstring), checked here:

- the exact sums are exact: the compiled kernels and the float64 matrix product give, bit for
  bit, the sum of each example's integer contribution computed one example at a time in
  Python integers (up to the 2^53 edge of float64, across the 2^13-example blocks);
- each example's contribution is at most C (2^40 grid units), in exact integer arithmetic;
- the per-example gradients are the true ones (against ``torch.func`` and a loop of
  single-example backward passes), whichever im2col layout a convolution takes;
- tapped layers compute what the plain layers compute, skip the summed weight gradient,
  survive in-place activations after them, and come off cleanly;
- an example whose gradient is not finite contributes exactly nothing.
"""

from __future__ import annotations

import copy
import gc
import math
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.utils.data import DataLoader, TensorDataset

from _learn_reference import outer_reference, truncated_reference
from dpcurator.errors import UserError
from dpcurator.learn import PrivacyEngine
from dpcurator.learn._grads import (
    GRID_BITS,
    Materialized,
    OuterProduct,
    PerExample,
    Workspace,
    clip_factors,
)
from dpcurator.learn._kernels import ROWS
from dpcurator.learn._sampler import GradSampler
from dpcurator.noise import SeededRandom

UNIT = 1 << GRID_BITS



# --- references, one example at a time, in Python integers ------------------------------------


def _outer_reference(part: OuterProduct, factors: npt.NDArray[np.float64]
                     ) -> tuple[list[int], list[int]]:
    return outer_reference(part.activations.detach().numpy().astype(np.float64),
                           part.backprops.detach().numpy().astype(np.float64),
                           bias=len(part.params) == 2, scale=part.scale, factors=factors)


def _materialized_reference(part: Materialized, factors: npt.NDArray[np.float64]
                            ) -> tuple[list[int], list[int]]:
    """Gathered into parameter order where the held layout differs."""
    held = part.grads.detach().reshape(part.grads.shape[0], -1).numpy().astype(np.float64)
    total, norms = truncated_reference(held, factors * part.scale)
    if part.order is not None:
        total = [total[j] for j in part.order]
    return total, norms


def _reference(part: PerExample, factors: npt.NDArray[np.float64]
               ) -> tuple[list[int], list[int]]:
    if isinstance(part, OuterProduct):
        return _outer_reference(part, factors)
    assert isinstance(part, Materialized)
    return _materialized_reference(part, factors)


def _clip_factors(parts: list[PerExample], bound: float = 1.0) -> Any:
    squared = parts[0].squared_norms()
    for part in parts[1:]:
        squared += part.squared_norms()
    return clip_factors(squared, bound) * (UNIT / bound)


# --- exact sums -------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 40), n_in=st.integers(1, 9), n_out=st.integers(1, 7),
       bias=st.booleans(), log_scale=st.floats(-20, 20), seed=st.integers(0, 2**31),
       scale=st.sampled_from([1.0, 3.0, 256.0]))
def test_outer_product_sums_equal_the_integer_reference(
        n: int, n_in: int, n_out: int, bias: bool, log_scale: float, seed: int,
        scale: float) -> None:
    """Bit for bit, and every example within 2^40: clipped (most examples far above the
    bound) or not, with zero rows, and with factors that are 0, NaN or infinite."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n_in, generator=g) * 10.0**log_scale
    b = torch.randn(n, n_out, generator=g)
    if n > 2:
        a[0] = 0.0
        b[1] = 0.0
    layer = nn.Linear(n_in, n_out, bias=bias)
    params = tuple(layer.parameters())
    part = OuterProduct(params, a, b, scale)
    factors = _clip_factors([part])
    if n > 5:
        factors[2], factors[3], factors[4] = 0.0, math.nan, math.inf
    fast = part.clipped_sum(factors)
    exact, norms = _outer_reference(part, factors)
    assert fast.tolist() == exact
    assert max(norms, default=0) <= UNIT * UNIT


def test_outer_product_sums_are_exact_at_the_float64_edge() -> None:
    """9,000 examples just under the bound, one entry each: each contributes a different
    integer of nearly 2^40 to the one entry, so the blocks of 2^13 approach 2^53, where
    float64 stops being exact, and the total passes it. The sum still equals the integer
    one, which one float64 sum over all the examples misses."""
    n = ROWS + 808
    a = 0.999 - 1e-6 * (torch.arange(n, dtype=torch.float32) % 1000)[:, None]
    b = torch.ones(n, 1)
    part = OuterProduct((nn.Parameter(torch.zeros(1, 1)),), a, b, 1.0)
    factors = _clip_factors([part])
    exact, norms = _outer_reference(part, factors)
    assert part.clipped_sum(factors).tolist() == exact
    assert max(norms) <= UNIT * UNIT
    assert exact[0] > 2**53
    each = [math.isqrt(norm) for norm in norms]  # one positive entry: its norm
    assert sum(each) == exact[0]
    running = 0.0
    for value in each:
        running += value
    assert int(running) != exact[0]


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("shape", [
    # (in, out, kernel, stride, padding, dilation, height, width): rows then channels im2col
    (1, 3, 3, 1, 1, 1, 6, 7),
    (2, 4, (2, 3), (2, 1), (0, 2), (1, 2), 7, 9),
    (6, 3, 3, 1, 1, 1, 4, 4),
    (5, 2, (3, 1), (1, 2), (1, 0), (2, 1), 6, 5),
])
def test_conv2d_gradients_and_sums_equal_the_references(shape: tuple[Any, ...],
                                                        fuse: bool) -> None:
    """Per-example gradients as torch.func computes them; clipped sums as a loop of
    single examples in integers, bit for bit; every example within 2^40."""
    in_c, out_c, kernel, stride, padding, dilation, height, width = shape
    torch.manual_seed(in_c * 100 + height)
    conv = nn.Conv2d(in_c, out_c, kernel, stride, padding, dilation)
    x = torch.randn(6, in_c, height, width)
    reference = _func_grads(conv, x)
    sampler = GradSampler(nn.Sequential(conv), loss_reduction="sum", fuse=fuse)
    (conv(x).square().sum() / 2).backward()
    _, parts = sampler.per_example(Workspace())
    assert len(parts) == (1 if fuse else 2)
    for part in parts:
        for param, grads in zip(part.params, part.gradients(), strict=True):
            want = reference["weight" if param is conv.weight else "bias"]
            torch.testing.assert_close(grads, want.to(torch.float64), rtol=1e-5, atol=1e-5)
    factors = _clip_factors(parts, bound=0.5)
    for part in parts:
        exact, norms = _reference(part, factors)
        assert part.clipped_sum(factors).tolist() == exact
        assert max(norms) <= UNIT * UNIT


def _func_grads(conv: nn.Conv2d, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-example gradients of sum(conv(x_i)^2) / 2 by torch.func, the plain way."""
    params = {n: p.detach() for n, p in conv.named_parameters()}

    def loss(p: dict[str, torch.Tensor], x_i: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = functional_call(conv, p, (x_i.unsqueeze(0),))
        return out.square().sum() / 2

    grads: dict[str, torch.Tensor] = vmap(grad(loss), in_dims=(None, 0))(params, x)
    return grads


# --- tapped layers ----------------------------------------------------------------------------


def _net() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(inplace=True), nn.Flatten(),
                         nn.Linear(48, 5), nn.ReLU(inplace=True), nn.Linear(5, 2))


def test_tapped_layers_compute_as_before_and_skip_the_summed_gradient() -> None:
    """Same outputs; in-place ReLUs after tapped layers (even the first, whose input needs
    no gradient) are fine; weights get no .grad from backward; per-example gradients match
    a loop of single-example passes; remove() restores the classes; a deep copy computes as
    a plain model and records nothing."""
    torch.manual_seed(3)
    model = _net()
    plain = copy.deepcopy(model)
    x, y = torch.randn(4, 1, 4, 4), torch.tensor([0, 1, 1, 0])
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    rows = [torch.autograd.grad(loss_fn(plain(x[i:i + 1]), y[i:i + 1]),
                                list(plain.parameters())) for i in range(4)]
    sampler = GradSampler(model, loss_reduction="sum")
    assert type(model[0]).__name__ == "_TappedConv2d" and isinstance(model[0], nn.Conv2d)
    assert repr(model) == repr(plain)
    out = model(x)
    torch.testing.assert_close(out, plain(x), rtol=0, atol=0)
    loss_fn(out, y).backward()
    assert all(p.grad is None for p in model.parameters())
    _, parts = sampler.per_example()
    got = [g for part in parts for g in part.gradients()]
    for k, param_grads in enumerate(got):
        want = torch.stack([rows[i][k] for i in range(4)]).to(torch.float64)
        torch.testing.assert_close(param_grads, want, rtol=1e-5, atol=1e-6)
    twin = copy.deepcopy(model)
    sampler.clear()
    twin(x).sum().backward()
    assert all(not layer.uses for layer in sampler.layers)
    assert all(p.grad is not None for p in twin.parameters())
    sampler.remove()
    assert type(model[0]) is nn.Conv2d and type(model[3]) is nn.Linear


def test_a_model_whose_optimizer_is_gone_trains_as_a_plain_one() -> None:
    """Nothing is recorded (no memory held) and autograd fills .grad again, for tapped and
    hooked layers alike, once the private optimizer is dropped."""
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    _, _, optimizer, _ = _private(model, torch.randn(5, 3))
    layers = optimizer.sampler.layers
    model(torch.randn(5, 3)).sum().backward()
    assert all(len(layer.uses) == 1 for layer in layers)
    assert all(p.grad is None for p in model[0].parameters())
    del optimizer, layers
    gc.collect()
    model(torch.randn(5, 3)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_an_input_changed_in_place_is_refused() -> None:
    class Scribbler(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = nn.Linear(3, 3)
            self.second = nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.first(x) + 1.0  # nothing saved for backward: autograd would not notice
            out: torch.Tensor = self.second(h)
            h.mul_(2.0)  # the second layer's recorded input changes after the fact
            return out

    model = Scribbler()
    sampler = GradSampler(model)
    model(torch.randn(4, 3)).sum().backward()
    with pytest.raises(UserError, match="in place"):
        sampler.per_example()


def test_an_example_with_a_non_finite_gradient_contributes_nothing() -> None:
    """A linear loss makes each example's gradient its own input, whatever the batch: the
    exact sum with an infinite or NaN example equals, bit for bit, the sum without it."""
    x = torch.randn(8, 5)
    sums = []
    for bad in (None, math.inf, math.nan):
        rows = x.clone()
        if bad is not None:
            rows[3, 2] = bad
        else:
            rows = torch.cat([x[:3], x[4:]])
        model = nn.Linear(5, 3)
        _, _, optimizer, _ = _private(model, rows)
        (model(rows) * torch.tensor([1.0, -2.0, 0.5])).sum().backward()
        optimizer._accumulate(released_next=False)
        assert optimizer._sum is not None
        sums.append(optimizer._sum.copy())
    assert np.array_equal(sums[0], sums[1]) and np.array_equal(sums[0], sums[2])


def _private(model: nn.Module, x: torch.Tensor) -> tuple[Any, nn.Module, Any, Any]:
    engine = PrivacyEngine(source=SeededRandom(0))
    dataset = TensorDataset(x, torch.zeros(len(x)))
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(dataset, batch_size=len(x)), noise_multiplier=1.0,
        delta=1e-5, max_grad_norm=1.0, loss_reduction="sum")
    return engine, model, optimizer, loader


def test_workspace_reuses_one_buffer_per_key_as_batches_vary() -> None:
    work = Workspace()
    first, first_np = work.get("k", (10, 3), torch.float64)
    assert first.shape == (10, 3) and first_np.shape == (10, 3)
    smaller, _ = work.get("k", (7, 3), torch.float64)
    assert smaller.data_ptr() == first.data_ptr() and smaller.is_contiguous()
    larger, larger_np = work.get("k", (11, 3), torch.float64)
    assert larger.shape == (11, 3) and larger_np.shape == (11, 3)
    again, _ = work.get("k", (12, 3), torch.float64)  # grown by a quarter: no new buffer
    assert again.data_ptr() == larger.data_ptr()


def test_released_gradients_are_views_of_one_buffer_overwritten_each_step() -> None:
    """After step(), .grad holds the released gradient (noise only here: zero inputs); the
    next step writes the same tensors, as backward() does with set_to_none=False."""
    model = nn.Linear(4, 3)
    _, _, optimizer, loader = _private(model, torch.zeros(6, 4))
    grads = []
    for _ in range(2):
        (rows, _), = loader  # sampling rate 1: the six zero rows
        optimizer.zero_grad()
        model(rows).sum().backward()
        optimizer.step()
        assert model.weight.grad is not None and model.bias.grad is not None
        grads.append((model.weight.grad, model.weight.grad.clone()))
    assert grads[0][0] is grads[1][0]
    assert not torch.equal(grads[0][1], grads[1][1])  # fresh noise each step
