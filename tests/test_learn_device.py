"""The torch-operations path of ``dpcurator.learn`` (``_device``), used for models on a GPU.

Run here on the CPU by forcing the path (``sampler.on_device = True``), and on every CUDA
device the machine has (none in CI; the device machine runs this file). What the privacy proof
needs from it (``_device``' docstring):

- the exact sum equals, bit for bit, each example's integer contribution summed one example
  at a time in Python integers;
- every example's contribution is at most C (2^40 grid units), in exact integer arithmetic;
- its per-example gradients are the CPU path's (so, the true ones: ``test_learn_grads``);
- an example whose gradient is not finite contributes exactly nothing;
- the released gradient is (exact sum + the noise the source gives, in order) times the
  scale: the same noise, step after step, as the CPU path draws from the same seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from _learn_reference import outer_reference, truncated_reference
from dpcurator.learn import PrivacyEngine
from dpcurator.learn._device import (
    ClippingGraphs,
    DeviceOuter,
    DevicePart,
    OnDevice,
    clip_factors,
    fill_padded,
    padded_records,
)
from dpcurator.learn._grads import GRID_BITS, PerExample
from dpcurator.learn._kernels import ROWS
from dpcurator.learn._optimizer import DPOptimizer
from dpcurator.learn._sampler import GradSampler
from dpcurator.noise import SeededRandom

UNIT = 1 << GRID_BITS
DEVICES = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]



class _Twice(nn.Module):
    """A linear layer called twice in one pass (its gradients add up)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(6, 6)
        self.out = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.inner(torch.tanh(self.inner(x)))))


def _image(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, 2, 5, 5)


class _Image(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _image(x)


class _Sequence(nn.Module):
    """A linear layer over sequences (B, T, in), then a LayerNorm (torch.func's path)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(5, 4)
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.proj(x.reshape(-1, 10, 5)))
        out: torch.Tensor = self.head(h.mean(dim=1))
        return out


MODELS: dict[str, tuple[Callable[[], nn.Module], int]] = {  # (model, input width)
    "mlp": (lambda: nn.Sequential(nn.Linear(50, 16), nn.ReLU(), nn.Linear(16, 3)), 50),
    "cnn": (lambda: nn.Sequential(_Image(), nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(4, 3, (2, 3), stride=(2, 1), dilation=(1, 2)),
                                  nn.Flatten(), nn.Linear(3 * 2 * 1, 3)), 50),
    "twice": (_Twice, 6),
    "sequence": (_Sequence, 50),
}


def _records(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, on_device: bool,
             fuse: bool) -> tuple[GradSampler, list[PerExample]]:
    sampler = GradSampler(model, loss_reduction="mean", fuse=fuse)
    sampler.on_device = on_device
    nn.CrossEntropyLoss()(model(x), y).backward()
    _, parts = sampler.per_example()
    return sampler, parts


def _reference(part: DevicePart, factors: torch.Tensor) -> tuple[list[int], list[int]]:
    if isinstance(part, DeviceOuter):
        return _outer_reference(part, factors)
    assert isinstance(part, OnDevice)
    return _materialized_reference(part, factors)


def _outer_reference(part: DeviceOuter, factors: torch.Tensor) -> tuple[list[int], list[int]]:
    """From the part's own squares (the device's sums of them)."""
    a2, b2 = (x.cpu().numpy() for x in part._factor_squares())
    return outer_reference(part._a.cpu().numpy(), part._b.cpu().numpy(),
                           bias=len(part.params) == 2, scale=float(part.scale),
                           factors=factors.cpu().numpy(), a2=a2, b2=b2)


def _materialized_reference(part: OnDevice, factors: torch.Tensor
                            ) -> tuple[list[int], list[int]]:
    held = part.grads.detach().reshape(part.grads.shape[0], -1).cpu().to(torch.float64)
    return truncated_reference(held.numpy(), (factors * part.scale).cpu().numpy())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("kind", list(MODELS))
def test_device_sums_are_exact_bounded_and_of_the_true_gradients(
        kind: str, fuse: bool, device: str) -> None:
    build, width = MODELS[kind]
    torch.manual_seed(7)
    model = build().to(device)
    reference = build()
    reference.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    x = torch.randn(12, width) * 3.0
    y = torch.randint(0, 3, (12,))
    x[0] = 0.0
    _, parts = _records(model, x.to(device), y.to(device), on_device=True, fuse=fuse)
    _, cpu_parts = _records(reference, x, y, on_device=False, fuse=fuse)
    assert parts and all(isinstance(p, DevicePart) for p in parts)
    if kind == "mlp":
        assert isinstance(parts[0], DeviceOuter)
    got = [g.cpu() for p in parts for g in p.gradients()]
    want = [g for p in cpu_parts for g in p.gradients()]
    assert [g.shape for g in got] == [g.shape for g in want]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    squared = sum(p.device_squared_norms() for p in parts if isinstance(p, DevicePart))
    assert isinstance(squared, torch.Tensor)
    torch.testing.assert_close(squared.cpu(), sum(torch.from_numpy(p.squared_norms())
                                                  for p in cpu_parts), rtol=1e-6, atol=0)
    factors = clip_factors(squared, 0.05) * (UNIT / 0.05)  # clips almost every example
    if len(factors) > 4:
        factors[2], factors[3] = math.nan, math.inf
    for part in parts:
        assert isinstance(part, DevicePart)
        total = torch.zeros(part.size, dtype=torch.int64, device=part.device)
        part.device_add_clipped_sum(factors, total)
        exact, norms = _reference(part, factors)
        assert total.cpu().tolist() == exact
        assert max(norms) <= UNIT * UNIT
    flat_norms = [sum(_reference(p, factors)[1][i] for p in parts if isinstance(p, DevicePart))
                  for i in range(len(x))]
    assert max(flat_norms) <= UNIT * UNIT  # the whole example, across its units, within C


@pytest.mark.parametrize("device", DEVICES)
def test_a_non_finite_example_contributes_nothing_on_the_device(device: str) -> None:
    """A linear loss makes each example's gradient its own input: the exact sum with an
    infinite or NaN example equals, bit for bit, the sum without it."""
    x = torch.randn(8, 5)
    sums = []
    for bad in (None, math.inf, math.nan):
        rows = x.clone()
        if bad is not None:
            rows[3, 2] = bad
        else:
            rows = torch.cat([x[:3], x[4:]])
        model = nn.Linear(5, 3).to(device)
        _, optimizer, _ = _private(model, rows)
        optimizer.sampler.on_device = True
        (model(rows.to(device)) * torch.tensor([1.0, -2.0, 0.5], device=device)
         ).sum().backward()
        optimizer._accumulate(released_next=False)
        assert isinstance(optimizer._sum, torch.Tensor)
        sums.append(optimizer._sum.cpu().clone())
    assert torch.equal(sums[0], sums[1]) and torch.equal(sums[0], sums[2])


def _private(model: nn.Module, x: torch.Tensor, seed: int = 0
             ) -> tuple[Any, DPOptimizer, Any]:
    """The private optimizer and loader of ``model`` over the rows ``x``: at sampling rate 1
    every batch the loader gives is ``x`` itself, in order."""
    engine = PrivacyEngine(source=SeededRandom(seed))
    dataset = TensorDataset(x, torch.zeros(len(x)))
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(dataset, batch_size=len(x)), noise_multiplier=1.0,
        delta=1e-5, max_grad_norm=1.0, loss_reduction="sum")
    assert loader.sampling_rate == 1.0
    return engine, optimizer, loader


@pytest.mark.parametrize("device", DEVICES)
def test_released_gradients_carry_the_sources_noise_in_order(device: str) -> None:
    """Zero inputs: the exact sum of the weight is 0, so the released weight gradient is the
    noise times the scale. The device path releases bit for bit what the CPU path releases
    from the same seed, step after step, both as a seeded source is drawn by default (on the
    calling thread, in order with the loader's draws) and with each step's noise drawn ahead
    in a background thread (the secure source's default, forced here); and a step with a
    real gradient releases the exact sum plus that noise."""
    released: dict[tuple[bool, bool | None], list[torch.Tensor]] = {}
    for on_device, prefetch in ((False, None), (True, None), (True, True)):
        torch.manual_seed(1)
        model = nn.Linear(4, 3)
        if on_device:
            model = model.to(device)
        _, optimizer, loader = _private(model, torch.zeros(6, 4), seed=5)
        optimizer.sampler.on_device = on_device
        optimizer.prefetch_noise = prefetch
        target = device if on_device else "cpu"
        steps = []
        for _ in range(3):
            (rows, _), = loader  # one batch an epoch: the six zero rows
            optimizer.zero_grad()
            model(rows.to(target)).sum().backward()
            optimizer.step()
            assert model.weight.grad is not None and model.weight.grad.device == model.weight.device
            steps.append(model.weight.grad.detach().cpu().clone())
        released[on_device, prefetch] = steps
        # the background thread only where it was asked for: never for a seeded source
        assert (optimizer._executor is not None) == (prefetch is True)
    for on_device_default, ahead in zip(released[True, None], released[True, True], strict=True):
        assert torch.equal(on_device_default, ahead)
    for cpu_step, device_step in zip(released[False, None], released[True, True], strict=True):
        assert torch.equal(cpu_step, device_step)
    assert not torch.equal(released[True, True][0], released[True, True][1])  # fresh noise


def test_the_secure_source_draws_a_devices_noise_a_step_ahead() -> None:
    """With the default (secure) source, the device path has the next step's noise drawn in
    the background once a step is released; the CPU path draws on the calling thread."""
    for on_device in (True, False):
        model = nn.Linear(4, 3)
        optimizer = DPOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            sampler=GradSampler(model, loss_reduction="sum"), noise_multiplier=1.0,
            max_grad_norm=1.0, expected_batch_size=6.0, last_chunk=lambda: True,
            on_step=lambda: None)
        optimizer.sampler.on_device = on_device
        model(torch.ones(6, 4)).sum().backward()
        optimizer.step()
        assert (optimizer._pending_noise is not None) == on_device
        assert model.weight.grad is not None and torch.isfinite(model.weight.grad).all()


@pytest.mark.parametrize("device", DEVICES)
def test_a_device_step_trains_and_matches_the_cpu_step_up_to_truncation(device: str) -> None:
    """One private step of a small MLP, CPU path and device path, same seed: the released
    gradients differ only by how each path truncates onto the grid, far below the noise
    (standard deviation 1 here). The CPU path truncates a linear layer's two factors to
    about 20 bits each (``_grads``), an error of at most |u_i| + |v_i| + 1 <= 2^21 + 1 grid
    steps of 2^-40 per example and entry; the device path one step. So at most 2^-18 per
    example, plus the float32 rounding of the released values."""
    torch.manual_seed(2)
    x, y = torch.randn(32, 10), torch.randint(0, 3, (32,))
    grads = {}
    for on_device in (False, True):
        torch.manual_seed(3)
        model = nn.Sequential(nn.Linear(10, 8), nn.Tanh(), nn.Linear(8, 3))
        target = device if on_device else "cpu"
        model = model.to(target)
        _, optimizer, loader = _private(model, x, seed=9)
        optimizer.sampler.on_device = on_device
        (rows, _), = loader  # at sampling rate 1: x, in order
        assert torch.equal(rows, x)
        nn.CrossEntropyLoss(reduction="sum")(model(rows.to(target)), y.to(target)).backward()
        optimizer.step()
        grads[on_device] = torch.cat([p.grad.detach().cpu().reshape(-1).to(torch.float64)
                                      for p in model.parameters() if p.grad is not None])
    assert (grads[True] - grads[False]).abs().max().item() <= 32 * 2.0**-18 + 2.0**-20
    assert grads[True].abs().max().item() > 0.1


@pytest.mark.parametrize("device", DEVICES)
def test_outer_product_sums_are_exact_at_the_float64_edge_on_the_device(device: str) -> None:
    """9,000 examples just under the bound, one entry each: the float64 matrix product's
    blocks of 2^13 examples approach 2^53, where float64 stops being exact, and the total
    passes it. The device's product (whatever its blocking) still gives the integer sum."""
    n = ROWS + 808
    a = 0.999 - 1e-6 * (torch.arange(n, dtype=torch.float32) % 1000)[:, None]
    part = DeviceOuter((nn.Parameter(torch.zeros(1, 1)),), a.to(device),
                       torch.ones(n, 1, device=device), 1.0)
    factors = clip_factors(part.device_squared_norms(), 1.0) * UNIT
    total = torch.zeros(1, dtype=torch.int64, device=device)
    part.device_add_clipped_sum(factors, total)
    exact, norms = _outer_reference(part, factors)
    assert total.cpu().tolist() == exact
    assert max(norms) <= UNIT * UNIT
    assert exact[0] > 2**53


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", list(MODELS))
def test_zero_padded_records_and_cuda_graphs_give_the_same_exact_sum(
        kind: str, device: str) -> None:
    """What lets a CUDA graph serve batches of several sizes (``ClippingGraphs``): records
    padded with zero rows sum, bit for bit, to the batch's own exact sum (a zero row's
    gradient is zero, or not finite and dropped), with the loss reduction's batch size as a
    device scalar. On a GPU, the captured graph then replays exactly the padded eager sum,
    for a second batch as for the first."""
    build, width = MODELS[kind]
    torch.manual_seed(11)
    model = build().to(device)
    engine = PrivacyEngine(source=SeededRandom(0))
    x = torch.randn(12, width)
    model, optimizer, _ = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(TensorDataset(x, torch.zeros(12)), batch_size=12),
        noise_multiplier=1.0, delta=1e-5, max_grad_norm=0.1)
    optimizer.sampler.on_device = True
    for step in range(3):
        rows = 12 - 3 * step  # 12, 9, 6 examples: all padded to 32
        xs = (torch.randn(rows, width) * 2.0).to(device)
        ys = torch.randint(0, 3, (rows,)).to(device)
        optimizer.sampler.clear()
        nn.CrossEntropyLoss()(model(xs), ys).backward()
        batch, records = optimizer.sampler.records()
        eager = optimizer._clip_and_sum(batch, records, None)
        static = padded_records(records, 32)
        fill_padded(static, records, batch)
        scale = torch.tensor(float(batch), dtype=torch.float64, device=device)
        padded = optimizer._clip_and_sum(32, static, scale)
        assert eager.abs().max().item() > 0
        if kind == "cnn" and device != "cpu":  # a GPU's batched product may round per size
            assert (padded - eager).abs().max().item() <= 32 * 2**21
        else:
            assert torch.equal(padded, eager)
        if device.startswith("cuda"):
            graphs = optimizer._graphs or ClippingGraphs(optimizer._clip_and_sum, mean=True)
            optimizer._graphs = graphs
            replayed = graphs.run(batch, records)
            if step == 0:
                assert replayed is None  # a shape seen once is computed eagerly
            else:
                assert replayed is not None and torch.equal(replayed, padded)
            if step == 2:  # other clipping settings never reuse a graph that baked in these
                assert graphs.run(batch, records, ("another bound",)) is None


@pytest.mark.parametrize("device", DEVICES)
def test_virtual_steps_release_the_same_gradients_with_and_without_graphs(device: str) -> None:
    """Batches summed in chunks (``max_physical_batch_size``) on the device path, same seed,
    CUDA graphs on and off: the released gradients agree bit for bit, step after step. On a
    GPU the chunks replay one graph, whose output buffer the next replay overwrites: a
    batch's first chunk must be copied out of it unless the sum is released before the next
    replay (the batch's only chunk). On the CPU both runs are eager."""
    released: list[list[torch.Tensor]] = []
    x = torch.randn(48, 6, generator=torch.Generator().manual_seed(3))
    y = (x[:, 0] > 0).long()
    for graphs in (False, True):
        torch.manual_seed(4)
        model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 2)).to(device)
        engine = PrivacyEngine(source=SeededRandom(8))
        model, optimizer, loader = engine.make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(TensorDataset(x, y), batch_size=12), noise_multiplier=1.0,
            delta=1e-5, max_grad_norm=1.0, max_physical_batch_size=4)
        optimizer.sampler.on_device = True
        optimizer.cuda_graphs = graphs
        steps = []
        for xs, ys in loader:
            optimizer.zero_grad()
            nn.CrossEntropyLoss()(model(xs.to(device)), ys.to(device)).backward()
            optimizer.step()
            if optimizer._sum is None:  # a batch's last chunk: released
                steps.append(torch.cat([p.grad.detach().cpu().flatten()
                                        for p in model.parameters() if p.grad is not None]))
        released.append(steps)
    assert len(released[0]) == len(released[1]) >= 3
    for eager, replayed in zip(*released, strict=True):
        assert torch.equal(eager, replayed)


def test_a_large_secure_noise_vector_drawn_in_parts_has_the_right_law(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The secure source's noise for a device, drawn on several threads: the full length,
    iid N_Z(0, s^2) with s = grid_sigma(sigma). 2^18 draws: the sample standard deviation is
    within 1% of s (7 standard errors: failure probability below 1e-11) and the mean within
    5 s / sqrt(n) of 0 (below 1e-6); the four parts are each checked alike, to 2%."""
    import dpcurator.learn._optimizer as optimizer_module

    monkeypatch.setattr(optimizer_module, "_NOISE_THREADS", 4)
    model = nn.Linear(511, 512)  # 262,144 weights and biases
    optimizer = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), sampler=GradSampler(model),
        noise_multiplier=0.5, max_grad_norm=1.0, expected_batch_size=10.0,
        last_chunk=lambda: True, on_step=lambda: None)
    noise = optimizer._draw_noise(torch.device("cpu")).numpy().astype(np.float64)
    assert noise.shape == (1 << 18,)
    assert optimizer._noise_pool is not None  # drawn in parts
    s = float(optimizer.grid_sigma)
    assert abs(noise.std() / s - 1) < 0.01
    assert abs(noise.mean()) < 5 * s / math.sqrt(noise.size)
    for part in np.array_split(noise, 4):  # 2^16 each: 2% is 7 standard errors (5e-13)
        assert abs(part.std() / s - 1) < 0.02
