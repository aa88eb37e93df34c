"""DP-SGD's engine (``dpcurator.learn``): per-example gradients, clipping, exact sums,
Poisson sampling, virtual steps, accounting, and the errors a user can meet.

Everything trains tiny models for a step or a few, on one thread. Where a test is
statistical it states its false-failure probability; the rest are deterministic (a seeded,
insecure source, as tests may use).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from typer.testing import CliRunner

from dpcurator.cli import app
from dpcurator.errors import UserError
from dpcurator.learn import DPDataLoader, DPOptimizer, PrivacyEngine
from dpcurator.learn._grads import GRID_BITS
from dpcurator.learn._sampler import GradSampler
from dpcurator.learn._sampling import PoissonBatchSampler
from dpcurator.noise import SeededRandom


def _blobs(n: int, seed: int) -> TensorDataset:
    """Two separable Gaussian blobs in 4 dimensions, labels 0 and 1."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    x = torch.randn(n, 4, generator=g) * 0.5 + (y[:, None] * 2.0 - 1.0)
    return TensorDataset(x, y)


def _private(model: nn.Module, dataset: TensorDataset, *, batch_size: int = 16, seed: int = 0,
             **kwargs: Any) -> tuple[PrivacyEngine, nn.Module, DPOptimizer, DPDataLoader]:
    engine = PrivacyEngine(source=SeededRandom(seed))
    optimizer = torch.optim.SGD(model.parameters(), lr=kwargs.pop("lr", 0.5))
    options: dict[str, Any] = {"delta": 1e-5, "max_grad_norm": 1.0, "noise_multiplier": 1.0}
    options.update(kwargs)
    model, dp_optimizer, loader = engine.make_private(
        module=model, optimizer=optimizer,
        data_loader=DataLoader(dataset, batch_size=batch_size), **options)
    return engine, model, dp_optimizer, loader


def _train(model: nn.Module, optimizer: DPOptimizer, loader: DPDataLoader, epochs: int) -> None:
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()


# --- per-example gradients --------------------------------------------------------------------


class _Mixed(nn.Module):
    """Every kind of layer the engine handles: outer products, vmap, several uses."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.seq = nn.Linear(2, 3)  # applied to a sequence: (B, 4, 2) -> (B, 4, 3)
        self.norm = nn.LayerNorm(3)
        self.head = nn.Linear(12, 2)
        self.shared = nn.Linear(2, 2)  # used twice in one forward pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x)).flatten(2).transpose(1, 2)[:, :4, :]  # (B, 4, 2)
        h = self.norm(self.seq(h)).flatten(1)  # (B, 12)
        out: torch.Tensor = self.shared(torch.tanh(self.shared(self.head(h))))
        return out


def _naive_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """Per-example gradients by a loop of single-example backward passes: (B, *shape) each."""
    loss_fn = nn.CrossEntropyLoss()
    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for i in range(x.shape[0]):
        grads = torch.autograd.grad(loss_fn(model(x[i:i + 1]), y[i:i + 1]), params)
        rows.append([g.detach() for g in grads])
    return [torch.stack([row[k] for row in rows]) for k in range(len(params))]


@pytest.mark.parametrize("fuse", [False, True])
def test_per_example_gradients_match_a_loop_of_backward_passes(fuse: bool) -> None:
    torch.manual_seed(0)
    model = _Mixed()
    x, y = torch.randn(5, 1, 4, 4), torch.tensor([0, 1, 1, 0, 1])
    naive = dict(zip(map(id, model.parameters()), _naive_grads(model, x, y), strict=True))
    sampler = GradSampler(model, fuse=fuse)
    nn.CrossEntropyLoss()(model(x), y).backward()
    batch, per_example = sampler.per_example()
    assert batch == 5
    assert [p for part in per_example for p in part.params] == list(model.parameters())
    # Fused: the conv's weight and bias, and the head's (2-D input, used once).
    assert len(per_example) == (8 if fuse else 10)
    unit = 2.0**GRID_BITS  # f = c 2^40 / C with C = 1, no clipping: as in training
    factors = np.full(5, unit)
    for part in per_example:
        grads = torch.cat([naive[id(p)].reshape(5, -1) for p in part.params], dim=1)
        want = grads.to(torch.float64).square().sum(1)
        squared = torch.from_numpy(part.squared_norms())
        torch.testing.assert_close(squared, want, rtol=1e-4, atol=1e-12)
        # The norms bound the gradients that are summed (the batch's own rounding, not the
        # single-example passes'), up to float64 rounding, which CLIP_MARGIN covers.
        reference = torch.cat([g.reshape(5, -1) for g in part.gradients()], dim=1)
        torch.testing.assert_close(reference, grads.to(torch.float64), rtol=1e-4, atol=1e-6)
        assert bool((squared >= reference.square().sum(1) * (1 - 1e-12)).all())
        # The sum of truncated, scaled gradients: outer products truncate two factors of about
        # 2^20 sqrt(|g|) each, so each example is off by about 1e-6 |g|^(1/2) here.
        exact = part.clipped_sum(factors)
        assert exact.dtype == np.int64
        torch.testing.assert_close(torch.from_numpy(exact).to(torch.float64) / unit,
                                   grads.to(torch.float64).sum(0), rtol=1e-4, atol=2e-5)


@settings(max_examples=40, deadline=None)
@given(log_scale=st.floats(-30, 30), seed=st.integers(0, 2**31), clipping=st.booleans(),
       bias=st.booleans())
def test_one_example_contributes_at_most_the_bound(log_scale: float, seed: int,
                                                   clipping: bool, bias: bool) -> None:
    """Whatever the gradient's scale, one example's exact contribution has norm <= C.

    Checked in exact integer arithmetic on the summed grid integers (units of C 2^-30).
    """
    torch.manual_seed(seed % 10_000)
    model = nn.Sequential(nn.Linear(6, 5, bias=bias), nn.Tanh(), nn.Conv1d(1, 2, 2))
    dataset = TensorDataset(torch.randn(1, 6) * 10.0**log_scale, torch.zeros(1))
    bound: float | list[float] = 1.0
    kwargs: dict[str, Any] = {}
    if clipping:
        n_params = sum(1 for _ in model.parameters())
        bound = [0.25] * n_params
        kwargs["clipping"] = "per_layer"

    class _View(nn.Module):
        def __init__(self, inner: nn.Sequential) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.inner[2](self.inner[1](self.inner[0](x)).unsqueeze(1))
            return out.sum((1, 2))

    _, _, optimizer, _ = _private(_View(model), dataset, batch_size=1,
                                       max_grad_norm=bound, loss_reduction="sum", **kwargs)
    (_View(model)(dataset.tensors[0]).sum() * 10.0**log_scale).backward()
    optimizer._accumulate(released_next=False)
    flat = optimizer._sum
    assert flat is not None and flat.dtype == np.int64
    sums = np.split(flat, np.cumsum([p.numel() for p in optimizer.params])[:-1])
    squares = [sum(int(v) ** 2 for v in t.tolist()) for t in sums]
    assert sum(squares) <= (1 << GRID_BITS) ** 2
    if clipping:
        limit = (1 << GRID_BITS) * 0.25 / optimizer.max_grad_norm
        assert all(math.sqrt(s) <= limit for s in squares)


# --- noise and the step -----------------------------------------------------------------------


def test_noise_has_the_stated_standard_deviation() -> None:
    """Zero gradients: the released gradient is noise alone, sigma C / E[B] per coordinate.

    200 x 200 weights = 40,000 coordinates; the sample variance's relative standard deviation
    is sqrt(2 / 40000) = 0.7% (kurtosis 3), so a 5% band is 7 standard deviations: false
    failure below 1e-11 (normal approximation of a sum of 40,000 independent squares).
    A noise off by the square root of 2 or by the batch size is off by 40% or more.
    """
    model = nn.Linear(200, 200, bias=False)
    dataset = TensorDataset(torch.zeros(64, 200), torch.zeros(64, dtype=torch.long))
    _, _, optimizer, loader = _private(model, dataset, batch_size=16, lr=0.0,
                                           noise_multiplier=2.0, max_grad_norm=3.0)
    x, y = next(iter(loader))
    optimizer.zero_grad()
    nn.CrossEntropyLoss()(model(x), y).backward()
    optimizer.step()
    assert model.weight.grad is not None
    released = model.weight.grad.to(torch.float64)
    expected = 2.0 * 3.0 / loader.expected_batch_size
    assert loader.expected_batch_size == 16
    assert abs(float(released.std()) / expected - 1) < 0.05
    assert abs(float(released.mean())) < 6 * expected / 200


def test_virtual_steps_give_the_same_step_as_whole_batches() -> None:
    """Chunks of 3 summed before the noise: bit for bit the whole batch's step (same seed).

    A linear model under a linear loss, so that each example's gradient is computed from it
    alone, exactly, whatever the batch (in a deeper model the floating-point forward pass may
    round differently at another batch size: the next test).
    """
    results = []
    for chunk in (None, 3):
        torch.manual_seed(1)
        model = nn.Linear(4, 2)
        _, _, optimizer, loader = _private(model, _blobs(40, 2), batch_size=10, seed=9,
                                               max_physical_batch_size=chunk,
                                               loss_reduction="sum")
        chunks = 0
        for _ in range(2):
            for x, y in loader:
                chunks += 1
                optimizer.zero_grad()
                (model(x) * (y[:, None] * 2.0 - 1.0)).sum().backward()
                optimizer.step()
        assert chunks > 8 if chunk else chunks == 8
        results.append([p.detach().clone() for p in model.parameters()])
    for whole, chunked in zip(*results, strict=True):
        assert torch.equal(whole, chunked)


def test_virtual_steps_in_a_deeper_model_match_to_rounding() -> None:
    results = []
    for chunk in (None, 3):
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        _, _, optimizer, loader = _private(model, _blobs(40, 2), batch_size=10, seed=9,
                                               max_physical_batch_size=chunk)
        _train(model, optimizer, loader, 2)
        results.append([p.detach().clone() for p in model.parameters()])
    for whole, chunked in zip(*results, strict=True):
        torch.testing.assert_close(whole, chunked, rtol=1e-5, atol=1e-6)


def test_empty_batches_step_with_noise_alone() -> None:
    """A Poisson batch may be empty: the step still happens (noise only) and is counted."""
    model = nn.Linear(4, 2)
    engine, _, optimizer, loader = _private(model, _blobs(200, 3), batch_size=1, seed=4)
    assert loader.sampling_rate == 1 / 200
    before = model.weight.detach().clone()
    sizes = []
    for x, y in loader:
        sizes.append(len(x))
        optimizer.zero_grad()
        nn.CrossEntropyLoss()(model(x), y).backward()
        optimizer.step()
    assert 0 in sizes  # P[no empty batch in 200] = (1 - 0.995^200)^200 < 1e-40 (seeded anyway)
    assert engine.steps == 200
    assert not torch.equal(before, model.weight)


def test_poisson_batch_sizes_are_binomial() -> None:
    """20,000 batches of 50 examples at q = 0.2: exact binomial tests on two counts.

    The number of empty-or-small batches (size <= 5) and the total of all sizes; each
    two-sided at 2.5e-8, so false failure < 1e-7. Fixed-size batches (always 10) fail both.
    """
    sampler = PoissonBatchSampler(50, 0.2, 20_000, SeededRandom(5))
    sizes = np.array([len(b) for b in sampler])
    small = int((sizes <= 5).sum())
    p_small = stats.binom.cdf(5, 50, 0.2)
    assert 2 * min(stats.binom.cdf(small, 20_000, p_small),
                   stats.binom.sf(small - 1, 20_000, p_small)) > 2.5e-8
    total = int(sizes.sum())
    assert 2 * min(stats.binom.cdf(total, 50 * 20_000, 0.2),
                   stats.binom.sf(total - 1, 50 * 20_000, 0.2)) > 2.5e-8


# --- accounting -------------------------------------------------------------------------------


def test_target_epsilon_is_met_reported_each_epoch_and_matches_the_cli() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    engine, _, optimizer, loader = _private(
        model, _blobs(64, 5), batch_size=16, noise_multiplier=None, target_epsilon=2.0,
        epochs=3)
    _train(model, optimizer, loader, 3)
    assert engine.steps == 12
    assert [r.epoch for r in engine.history] == [1, 2, 3]
    assert [r.steps for r in engine.history] == [4, 8, 12]
    eps = [r.epsilon for r in engine.history]
    assert eps == sorted(eps) and eps[-1] == engine.epsilon() <= 2.0
    assert engine.epsilon() > 1.9  # the smallest noise reaching the target: within 0.1%
    runner = CliRunner()
    common = ["account", "dpsgd", "--sampling-rate", repr(engine.sampling_rate), "--steps",
              "12", "--delta", "1e-05", "--json"]
    out = runner.invoke(app, [*common, "--noise-multiplier", repr(engine.noise_multiplier)])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["epsilon"] == engine.epsilon()
    out = runner.invoke(app, [*common, "--target-epsilon", "2"])
    assert json.loads(out.stdout)["noise_multiplier"] == engine.noise_multiplier


def test_private_training_learns() -> None:
    """Two blobs, epsilon 2: the model separates them (deterministic under the seed)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    train, test = _blobs(512, 6), _blobs(256, 7)
    engine, _, optimizer, loader = _private(
        model, train, batch_size=64, noise_multiplier=None, target_epsilon=2.0, epochs=4,
        lr=1.0)
    _train(model, optimizer, loader, 4)
    with torch.no_grad():
        accuracy = (model(test.tensors[0]).argmax(1) == test.tensors[1]).float().mean()
    assert accuracy > 0.9
    assert engine.epsilon() <= 2.0


def test_scheduler_and_state_dict_see_the_wrapped_optimizer() -> None:
    model = nn.Linear(4, 2)
    _, _, optimizer, loader = _private(model, _blobs(32, 8), batch_size=8, lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    _train(model, optimizer, loader, 1)
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)
    assert optimizer.state_dict()["param_groups"][0]["lr"] == pytest.approx(0.05)


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("change", "message"), [
    ({"delta": 0.0}, "delta"),
    ({"delta": 1.5}, "delta"),
    ({"max_grad_norm": 0.0}, "max_grad_norm"),
    ({"max_grad_norm": float("inf")}, "max_grad_norm"),
    ({"noise_multiplier": -1.0}, "noise_multiplier"),
    ({"noise_multiplier": None}, "exactly one"),
    ({"target_epsilon": 1.0}, "exactly one"),
    ({"noise_multiplier": None, "target_epsilon": 1.0}, "epochs"),
    ({"noise_multiplier": None, "target_epsilon": -1.0, "epochs": 1}, "target_epsilon"),
    ({"clipping": "both"}, "clipping"),
    ({"clipping": "per_layer"}, "max_grad_norm"),
    ({"clipping": "per_layer", "max_grad_norm": [1.0]}, "max_grad_norm"),
    ({"loss_reduction": "max"}, "loss_reduction"),
    ({"max_physical_batch_size": 0}, "max_physical_batch_size"),
])
def test_bad_arguments_name_the_parameter(change: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError, match=message):
        _private(nn.Linear(4, 2), _blobs(8, 0), **change)


def test_unsupported_models_and_inputs_are_refused() -> None:
    with pytest.raises(UserError, match="GroupNorm"):
        _private(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), _blobs(8, 0))
    tied = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
    tied[1].weight = tied[0].weight
    with pytest.raises(UserError, match="tied"):
        _private(tied, _blobs(8, 0))
    other = nn.Linear(4, 2)
    with pytest.raises(UserError, match="optimizer"):
        PrivacyEngine().make_private(
            module=nn.Linear(4, 2), optimizer=torch.optim.SGD(other.parameters(), lr=0.1),
            data_loader=DataLoader(_blobs(8, 0), batch_size=4), noise_multiplier=1.0,
            delta=1e-5, max_grad_norm=1.0)
    with pytest.raises(UserError, match="data_loader"):
        PrivacyEngine().make_private(
            module=nn.Linear(4, 2), optimizer=torch.optim.SGD(nn.Linear(4, 2).parameters()),
            data_loader=[1, 2], noise_multiplier=1.0, delta=1e-5, max_grad_norm=1.0)
    engine, _, optimizer, _ = _private(nn.Linear(4, 2), _blobs(8, 0))
    with pytest.raises(UserError, match="backward"):
        optimizer.step()
    with pytest.raises(UserError, match="already"):
        engine.make_private(module=nn.Linear(4, 2),
                            optimizer=torch.optim.SGD(nn.Linear(4, 2).parameters(), lr=0.1),
                            data_loader=DataLoader(_blobs(8, 0)), noise_multiplier=1.0,
                            delta=1e-5, max_grad_norm=1.0)
    with pytest.raises(UserError, match="make_private"):
        PrivacyEngine().epsilon()
    assert engine.epsilon() == 0.0


# --- found by a bug hunt: what a step must refuse --------------------------------------------


def test_a_layer_unfrozen_after_make_private_is_never_stepped_on_its_raw_gradient() -> None:
    """A bug hunt: the optimizer held every parameter, layer 0 frozen at make_private and
    unfrozen afterwards (a fine-tuning habit); each step applied its raw gradient, no clipping
    and no noise, while epsilon() reported the private figure. The step is now refused and
    nothing moves."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    model[0].requires_grad_(False)
    engine, _, optimizer, loader = _private(model, _blobs(32, 0), batch_size=8)
    model[0].requires_grad_(True)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = next(iter(loader))
    optimizer.zero_grad()
    nn.CrossEntropyLoss()(model(x), y).backward()
    with pytest.raises(UserError, match="not trainable when the model was made private"):
        optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert engine.steps == 0


def test_state_written_from_the_examples_is_refused() -> None:
    """A bug hunt: InstanceNorm's running statistics (and any buffer a module writes from
    its input) sat unprotected in state_dict(): one example scaled by 1e6 showed in them.
    Running statistics are refused when the model is made private, and a step after any
    buffer changed is refused."""
    with pytest.raises(UserError, match="track_running_stats=False"):
        _private(nn.Sequential(nn.Linear(4, 4), nn.Unflatten(1, (1, 4)),
                               nn.InstanceNorm1d(1, track_running_stats=True), nn.Flatten(),
                               nn.Linear(4, 2)), _blobs(8, 0))

    class Remembers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 2)
            self.register_buffer("seen", torch.zeros(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.seen.copy_(x.detach().amax(0))  # the data, kept without noise
            return self.linear(x)  # type: ignore[no-any-return]

    model = Remembers()
    _, _, optimizer, loader = _private(model, _blobs(32, 0), batch_size=4)
    x, y = next(iter(loader))
    nn.CrossEntropyLoss()(model(x), y).backward()
    with pytest.raises(UserError, match="buffer 'seen' changed during training"):
        optimizer.step()


def test_a_model_moved_after_make_private_keeps_its_buffers_unchanged() -> None:
    """A buffer replaced by a copy of the same values (``module.to``) is not a change."""
    model = nn.Sequential(nn.Linear(4, 2))
    model.register_buffer("scale", torch.ones(2))
    _, _, optimizer, loader = _private(model, _blobs(16, 0), batch_size=4)
    model.to(torch.float32)
    model.scale = model.scale.clone()  # type: ignore[assignment]
    x, y = next(iter(loader))
    nn.CrossEntropyLoss()(model(x) * model.scale, y).backward()
    optimizer.step()


def test_each_step_reads_one_fresh_batch_of_the_private_loader_with_one_row_per_example(
        ) -> None:
    """A bug hunt: (1) two batches' backward passes before one step were clipped row by row
    together, row i of the first with row i of the second, and counted as one step of one
    Poisson sample (one example could add 2C); (2) a layer that sees (sequence, batch,
    features) was clipped per position (one example added 9.9998 C for 10 positions); (3)
    stepping twice on one batch, or on tensors that no private batch gave, is not the
    accounted mechanism. Each is now refused before anything is released."""
    model = nn.Linear(4, 2)
    engine, _, optimizer, loader = _private(model, _blobs(64, 0), batch_size=16)
    loss = nn.CrossEntropyLoss()
    batches = iter(loader)
    (x1, y1), (x2, y2) = next(batches), next(batches)
    optimizer.zero_grad()
    loss(model(x1), y1).backward()
    loss(model(x2), y2).backward()
    with pytest.raises(UserError, match="several forward passes or several batches"):
        optimizer.step()
    optimizer.zero_grad()
    optimizer.sampler.clear()
    x3, y3 = next(batches)
    loss(model(x3), y3).backward()
    optimizer.step()
    assert engine.steps == 1
    loss(model(x3), y3).backward()  # the same batch again
    with pytest.raises(UserError, match="already used in a step"):
        optimizer.step()
    optimizer.sampler.clear()
    loss(model(torch.randn(5, 4)), torch.zeros(5, dtype=torch.long)).backward()
    with pytest.raises(UserError, match="a batch of 5 rows where the data loader gave"):
        optimizer.step()
    assert engine.steps == 1
    model = nn.Linear(4, 2)
    engine, _, optimizer, _ = _private(model, _blobs(64, 0), batch_size=16)
    loss(model(torch.randn(5, 4)), torch.zeros(5, dtype=torch.long)).backward()
    with pytest.raises(UserError, match="a batch of the data loader that make_private returned"):
        optimizer.step()
    assert engine.steps == 0

    class SequenceFirst(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 1, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (batch, 10, 3)
            return self.linear(x.transpose(0, 1)).sum(0)  # type: ignore[no-any-return]

    sequences = TensorDataset(torch.ones(40, 10, 3), torch.zeros(40))
    model = SequenceFirst()
    engine, _, optimizer, loader = _private(model, sequences, batch_size=4)
    for x, _ in loader:
        if len(x) not in (0, 10):
            break
    model(x).sum().backward()
    with pytest.raises(UserError, match=f"saw a batch of 10 rows where the data loader gave "
                                        f"{len(x)} examples"):
        optimizer.step()
    assert engine.steps == 0


def test_virtual_steps_never_sum_chunks_of_two_batches() -> None:
    """A step on a batch's first chunk only adds it to the sum; a chunk of the next batch
    stepped on before the first batch is released is refused (its sum would hold two
    Poisson samples)."""
    model = nn.Linear(4, 2)
    engine, _, optimizer, loader = _private(model, _blobs(60, 1), batch_size=30, seed=3,
                                            max_physical_batch_size=4)
    loss = nn.CrossEntropyLoss()
    stepped_first = False
    for x, y in loader:
        if not stepped_first:
            assert not loader.last_chunk  # about 30 examples in chunks of 4
            loss(model(x), y).backward()
            optimizer.step()  # summed, not released
            stepped_first = True
            continue
        if loader.chunk is not None and loader.chunk.batch > 0:  # the next batch
            loss(model(x), y).backward()
            with pytest.raises(UserError, match="another batch than the chunks summed"):
                optimizer.step()
            break
    assert engine.steps == 0


def test_an_empty_batch_never_carries_an_examples_value_and_unsupported_layers_are_named(
        ) -> None:
    """A bug hunt: the empty Poisson batch of a dataset of strings was example 0's string
    (so example 0 took part at rate q plus P[empty]). Loaders whose batches hold other
    values than tensors are refused unless their collate function builds the empty batch;
    recurrent layers and reparametrized weights are refused with their names (they failed
    with an internal error or a misleading message)."""
    class Named(torch.utils.data.Dataset[Any]):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> tuple[torch.Tensor, str]:
            return torch.ones(4), f"person {i}"

    options: dict[str, Any] = {"noise_multiplier": 1.0, "delta": 1e-5, "max_grad_norm": 1.0}
    model = nn.Linear(4, 2)
    with pytest.raises(UserError, match=r"not tensors \(str\)"):
        PrivacyEngine().make_private(module=model,
                                     optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                     data_loader=DataLoader(Named(), batch_size=2), **options)
    assert type(model) is nn.Linear  # the refusal left the module as it was

    def collate(rows: list[Any]) -> tuple[torch.Tensor, list[str]]:
        return (torch.stack([r[0] for r in rows]) if rows else torch.zeros(0, 4),
                [r[1] for r in rows])

    model = nn.Linear(4, 2)
    _, _, loader = PrivacyEngine(source=SeededRandom(0)).make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(Named(), batch_size=2, collate_fn=collate), **options)
    empty, names = loader.collate_fn([])
    assert empty.shape == (0, 4) and names == []
    for bad, words in ((nn.LSTM(4, 2), "recurrent layers"),
                       (nn.utils.spectral_norm(nn.Linear(4, 2)), "weight_orig"),
                       (nn.utils.parametrizations.weight_norm(nn.Linear(4, 2)),
                        "parametrized weight")):
        with pytest.raises(UserError, match=words):
            _private(bad, _blobs(8, 0))


def test_importing_learn_does_not_import_torch() -> None:
    code = ("import sys, dpcurator, dpcurator.learn; "
            "print('torch' in sys.modules, 'dpcurator.learn._engine' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120)
    assert done.stdout.split() == ["False", "False"]
