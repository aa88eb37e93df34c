"""DP-SGD on CPU: dpcurator.learn against non-private training and Opacus (sklearn digits).

    .bench-venv/bin/python benchmarks/dpsgd.py                      # about 7 minutes, 2 cores
    .bench-venv/bin/python benchmarks/dpsgd.py --quick              # about a minute
    .bench-venv/bin/python benchmarks/dpsgd.py --skip-accuracy --phases   # step time, profile
    .bench-venv/bin/python benchmarks/dpsgd.py --json benchmarks/results/dpsgd.json
    python3 benchmarks/dpsgd.py --device cuda --models MLP,CNN,CNN32 --skip-accuracy  # a GPU

Two models on sklearn's digits (1,797 8x8 images, a fixed split of 1,437 to train and 360 to
test): an MLP (64-128-10) and a small CNN (two 3x3 convolutions of 16 and 32 channels with
max-pooling, then a linear layer). Everything runs on one thread (``--threads``), so that the
comparison does not depend on how each library parallelises tiny kernels.

1. Step time: forward, backward and optimizer step on the same batch of 256 examples,
   non-private, dpcurator (secure noise, the default source) and Opacus (its default hooks),
   timed round-robin for ``--repeats`` rounds of ``--steps`` steps each (by default, as
   many as make a non-private round last ``--round-seconds``). Target: dpcurator <= 1.5x
   the non-private step. ``paired`` is the median over rounds of the ratio within a round,
   steadier on a loaded machine than the ratio of medians; ``cpu`` is the same ratio in this
   thread's CPU time, which other processes do not inflate. ``--phases`` adds a profile:
   the CPU time of each phase of a step (dpcurator's optimizer step split into clipping and
   exact sum, noise and release, and the wrapped optimizer's step).
2. Accuracy at epsilon = 1, 3, 8 (delta = 1e-5): each library chooses its noise multiplier
   for the target with its own accountant (dpcurator: PLD; Opacus: its default, PRV), then
   trains ``--epochs`` epochs with the same model, initialisation, optimizer (SGD, the same
   learning rate and momentum) and clipping bound, expected batch 256 (Poisson sampling, q =
   1/6). Test accuracy, mean over ``--seeds`` seeds. Target: dpcurator >= Opacus.
3. Accounting: for Opacus's noise multiplier and step count, dpcurator's epsilon against
   Opacus's reported one. Target: equal or tighter.

Opacus comes from benchmarks/requirements.txt (the benchmark environment only); without it
its columns read n/a.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpcurator.accounting.dpsgd import dpsgd_epsilon
from dpcurator.learn import PrivacyEngine

try:
    import opacus
    from opacus import PrivacyEngine as OpacusEngine
except ImportError:  # the library's own environment has no Opacus
    opacus = None
    OpacusEngine = None

DELTA = 1e-5
BATCH = 256
CLIP = 1.0


def digits() -> tuple[TensorDataset, TensorDataset]:
    """sklearn's digits, scaled to [0, 1], one fixed split (the same for every run)."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(x), generator=g)
    xs = torch.tensor(x / 16.0, dtype=torch.float32)[order]
    ys = torch.tensor(y, dtype=torch.long)[order]
    return TensorDataset(xs[:1437], ys[:1437]), TensorDataset(xs[1437:], ys[1437:])


class Image(nn.Module):
    """(B, 64) -> (B, 1, 8, 8)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1, 1, 8, 8)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def cnn() -> nn.Module:
    return nn.Sequential(
        Image(), nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(32 * 2 * 2, 10),
    )


def cnn32() -> nn.Module:
    """A larger CNN for a GPU (timing only): CIFAR-10's shape, 3x32x32 images, 0.39M weights."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(128 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10),
    )


MODELS: dict[str, Callable[[], nn.Module]] = {"MLP": mlp, "CNN": cnn, "CNN32": cnn32}
# The same hyperparameters for both libraries (chosen once on dpcurator at epsilon 3, seed
# 100, a seed not reported): SGD with momentum, these learning rates.
LEARNING_RATE = {"MLP": 0.2, "CNN": 0.1, "CNN32": 0.1}


def step_batch(kind: str, train: TensorDataset) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed batch a step is timed on: digits for MLP and CNN, random images for CNN32."""
    if kind == "CNN32":
        g = torch.Generator().manual_seed(0)
        return (torch.randn(BATCH, 3, 32, 32, generator=g),
                torch.randint(0, 10, (BATCH,), generator=g))
    return train.tensors[0][:BATCH], train.tensors[1][:BATCH]


def synchronize(device: str) -> None:
    """Wait for the device's queued work (a GPU computes asynchronously)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
MOMENTUM = 0.9


def sgd(model: nn.Module, kind: str) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=LEARNING_RATE[kind], momentum=MOMENTUM)


# --- step time ----------------------------------------------------------------------------------


def step_cases(kind: str, train: TensorDataset, device: str = "cpu"
               ) -> dict[str, Callable[[], None]]:
    """One closure per library: a full training step on the same fixed batch of 256."""
    x, y = step_batch(kind, train)
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH)
    x, y = x.to(device), y.to(device)
    loss_fn = nn.CrossEntropyLoss()
    cases: dict[str, Callable[[], None]] = {}

    def make_step(model: nn.Module, optimizer: Any) -> Callable[[], None]:
        def step() -> None:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()

        return step

    torch.manual_seed(0)
    plain = MODELS[kind]().to(device)
    cases["non-private"] = make_step(plain, sgd(plain, kind))
    torch.manual_seed(0)
    model = MODELS[kind]().to(device)
    model, optimizer, _ = PrivacyEngine().make_private(
        module=model, optimizer=sgd(model, kind), data_loader=loader, noise_multiplier=1.0,
        delta=DELTA, max_grad_norm=CLIP)
    # Timed on one fixed batch, not the loader's Poisson batches: its chunks are not checked
    # (a training run's steps are; the checks' other costs stay in the time)
    optimizer.sampler.watch(None)
    cases["dpcurator"] = make_step(model, optimizer)
    if device.startswith("cuda"):  # the same without CUDA graphs (ClippingGraphs)
        torch.manual_seed(0)
        model = MODELS[kind]().to(device)
        model, optimizer, _ = PrivacyEngine().make_private(
            module=model, optimizer=sgd(model, kind), data_loader=loader, noise_multiplier=1.0,
            delta=DELTA, max_grad_norm=CLIP)
        optimizer.sampler.watch(None)
        optimizer.cuda_graphs = False
        cases["dpcurator eager"] = make_step(model, optimizer)
    if OpacusEngine is not None:
        torch.manual_seed(0)
        model = MODELS[kind]().to(device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, optimizer, _ = OpacusEngine().make_private(
                module=model, optimizer=sgd(model, kind), data_loader=loader,
                noise_multiplier=1.0, max_grad_norm=CLIP)
        cases["opacus"] = make_step(model, optimizer)
    return cases


def time_steps(cases: dict[str, Callable[[], None]], repeats: int, steps: int,
               round_seconds: float, device: str = "cpu"
               ) -> tuple[int, dict[str, dict[str, list[float]]]]:
    """Seconds per step, per round, wall-clock and this thread's CPU time, every case timed
    once per round (round-robin). ``steps`` 0: as many as make a non-private round last
    ``round_seconds`` (at least 20). On a GPU each round ends when the device's work does."""
    for step in cases.values():  # warm-up: tables, compiled kernels, lazy imports, allocator
        for _ in range(10):
            step()
    synchronize(device)
    if steps <= 0:
        start = time.perf_counter()
        for _ in range(20):
            cases["non-private"]()
        synchronize(device)
        steps = max(20, math.ceil(round_seconds / ((time.perf_counter() - start) / 20)))
    times: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []}
                                                for name in cases}
    for _ in range(repeats):
        for name, step in cases.items():
            wall, cpu = time.perf_counter(), time.thread_time()
            for _ in range(steps):
                step()
            synchronize(device)
            times[name]["cpu"].append((time.thread_time() - cpu) / steps)
            times[name]["wall"].append((time.perf_counter() - wall) / steps)
    return steps, times


def _paired(values: list[float], base: list[float]) -> float:
    return statistics.median(v / b for v, b in zip(values, base, strict=True))


def phase_times(kind: str, train: TensorDataset, repeats: int, steps: int
                ) -> dict[str, dict[str, float]]:
    """CPU seconds per step in each phase of a step, median over rounds, non-private and
    dpcurator (its optimizer's step split into its stages) timed in alternate rounds."""
    x, y = step_batch(kind, train)
    loss_fn = nn.CrossEntropyLoss()
    torch.manual_seed(0)
    plain = MODELS[kind]()
    plain_optimizer = sgd(plain, kind)
    torch.manual_seed(0)
    model = MODELS[kind]()
    model, optimizer, _ = PrivacyEngine().make_private(
        module=model, optimizer=sgd(model, kind), data_loader=DataLoader(train, batch_size=BATCH),
        noise_multiplier=1.0, delta=DELTA, max_grad_norm=CLIP)
    # Each stage gets what the one before returned (the forward pass returns the loss).
    stages: dict[str, list[tuple[str, Callable[[Any], Any]]]] = {"non-private": [
        ("zero_grad", lambda _: plain_optimizer.zero_grad()),
        ("forward", lambda _: loss_fn(plain(x), y)),
        ("backward", lambda loss: loss.backward()),
        ("optimizer", lambda _: plain_optimizer.step()),
    ], "dpcurator": [
        ("zero_grad", lambda _: optimizer.zero_grad()),
        ("forward", lambda _: loss_fn(model(x), y)),
        ("backward", lambda loss: loss.backward()),
        ("clip and exact sum", lambda _: optimizer._accumulate(released_next=False)),
        ("noise and release", lambda _: optimizer._add_noise()),
        ("optimizer", lambda _: optimizer.original_optimizer.step()),
    ]}
    size = sum(p.numel() for p in optimizer.params)
    draw = "(of which the noise draw)"  # timed apart, in a loop of its own
    spent: dict[str, dict[str, list[float]]] = {
        case: {name: [] for name, _ in plan} for case, plan in stages.items()}
    spent["dpcurator"][draw] = []
    for rnd in range(repeats + 1):  # the first round warms up
        for case, plan in stages.items():
            totals = dict.fromkeys(spent[case], 0.0)
            for _ in range(steps):
                value = None
                for name, run in plan:
                    start = time.thread_time()
                    value = run(value)
                    totals[name] += time.thread_time() - start
            if case == "dpcurator":
                start = time.thread_time()
                for _ in range(steps):
                    optimizer._noise.sample(size)
                totals[draw] = time.thread_time() - start
            if rnd:
                for name, total in totals.items():
                    spent[case][name].append(total / steps)
    return {case: {name: statistics.median(v) for name, v in phases.items()}
            for case, phases in spent.items()}


def profile_steps(kind: str, train: TensorDataset, device: str, steps: int = 20) -> None:
    """torch.profiler's top operations over ``steps`` steps of each case, by host time and,
    on a GPU, by device time; and the noise draw alone (host milliseconds per step)."""
    from torch.profiler import ProfilerActivity, profile

    cases = step_cases(kind, train, device)
    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    for name, step in cases.items():
        for _ in range(10):
            step()
        synchronize(device)
        with profile(activities=activities) as prof:
            for _ in range(steps):
                step()
            synchronize(device)
        table = prof.key_averages()
        print(f"\n{kind} {name}: {steps} steps, top operations by host time")
        print(table.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=40))
        if device.startswith("cuda"):
            print(f"{kind} {name}: by device time")
            print(table.table(sort_by="self_cuda_time_total", row_limit=12,
                              max_name_column_width=40))
    torch.manual_seed(0)
    size = sum(p.numel() for p in MODELS[kind]().parameters())
    from dpcurator.learn._noise import WideGaussian
    from dpcurator.learn._optimizer import grid_sigma

    noise = WideGaussian(grid_sigma(1.0))
    noise.sample(size)
    start = time.perf_counter()
    for _ in range(steps):
        noise.sample(size)
    print(f"{kind}: noise draw for {size} weights: "
          f"{(time.perf_counter() - start) / steps * 1e3:.3f} ms a step (host)")


# --- accuracy -------------------------------------------------------------------------------------


def accuracy(model: nn.Module, test: TensorDataset) -> float:
    model.eval()
    with torch.no_grad():
        right = (model(test.tensors[0]).argmax(1) == test.tensors[1]).float().mean()
    model.train()
    return float(right)


def train(model: nn.Module, optimizer: Any, loader: Any, epochs: int) -> None:
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()


def run_nonprivate(kind: str, seed: int, train_set: TensorDataset, test: TensorDataset,
                   epochs: int) -> float:
    torch.manual_seed(seed)
    model = MODELS[kind]()
    loader = DataLoader(train_set, batch_size=BATCH, shuffle=True)
    train(model, sgd(model, kind), loader, epochs)
    return accuracy(model, test)


def run_dpcurator(kind: str, seed: int, epsilon: float, train_set: TensorDataset,
                  test: TensorDataset, epochs: int) -> dict[str, float]:
    torch.manual_seed(seed)
    model = MODELS[kind]()
    engine = PrivacyEngine()
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=sgd(model, kind),
        data_loader=DataLoader(train_set, batch_size=BATCH), target_epsilon=epsilon,
        delta=DELTA, epochs=epochs, max_grad_norm=CLIP)
    train(model, optimizer, loader, epochs)
    assert engine.noise_multiplier is not None
    return {"accuracy": accuracy(model, test), "sigma": engine.noise_multiplier,
            "epsilon": engine.epsilon(), "steps": engine.steps}


def run_opacus(kind: str, seed: int, epsilon: float, train_set: TensorDataset,
               test: TensorDataset, epochs: int) -> dict[str, float]:
    assert OpacusEngine is not None
    torch.manual_seed(seed)
    model = MODELS[kind]()
    engine = OpacusEngine()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optimizer, loader = engine.make_private_with_epsilon(
            module=model, optimizer=sgd(model, kind),
            data_loader=DataLoader(train_set, batch_size=BATCH), target_epsilon=epsilon,
            target_delta=DELTA, epochs=epochs, max_grad_norm=CLIP)
        train(model, optimizer, loader, epochs)
        reported = engine.get_epsilon(DELTA)
    steps = epochs * len(loader)
    sigma = float(optimizer.noise_multiplier)
    ours = dpsgd_epsilon(sampling_rate=1 / len(loader), noise_multiplier=sigma, steps=steps,
                         delta=DELTA).epsilon
    return {"accuracy": accuracy(model, test), "sigma": sigma, "epsilon": float(reported),
            "dpcurator_epsilon_same_noise": ours, "steps": steps}


# --- main -----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--epsilons", default="1,3,8")
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds")
    parser.add_argument("--steps", type=int, default=0,
                        help="steps per timed round (default: rounds of --round-seconds)")
    parser.add_argument("--round-seconds", type=float, default=0.2,
                        help="length of a non-private round when --steps is not given")
    parser.add_argument("--phases", action="store_true",
                        help="also the CPU time of each phase of a step (a profile)")
    parser.add_argument("--profile", action="store_true",
                        help="also torch.profiler's top operations of the steps (any device)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--models", default="MLP,CNN",
                        help="of MLP, CNN (digits) and CNN32 (random 3x32x32 images, timing "
                             "only: for a GPU)")
    parser.add_argument("--device", default="cpu",
                        help="where the models compute, e.g. cuda (step time only; the "
                             "accuracy runs stay on the CPU)")
    parser.add_argument("--skip-accuracy", action="store_true")
    parser.add_argument("--quick", action="store_true",
                        help="2 seeds, 10 epochs, 3 rounds: a smoke run, not a measurement")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.epochs, args.repeats = 2, 10, 3
    torch.set_num_threads(args.threads)
    train_set, test = digits()
    kinds = [k.strip() for k in args.models.split(",") if k.strip()]
    epsilons = [float(e) for e in args.epsilons.split(",")]
    report: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "opacus": getattr(opacus, "__version__", None),
                    "processor": platform.processor(), "threads": args.threads,
                    "device": (torch.cuda.get_device_name(args.device)
                               if args.device.startswith("cuda") else "cpu")},
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "step_time": {}, "accuracy": {},
    }

    print(f"Device: {report['machine']['device']}")
    print(f"Step time, batch {BATCH}, {args.threads} thread(s), median of {args.repeats} "
          "rounds (ms of wall-clock time); ratios to the non-private step: of the medians, "
          "paired (median of the ratios within a round) and paired in this thread's CPU time")
    print(f"{'model':6} {'case':12} {'ms/step':>9} {'x plain':>8} {'paired':>7} {'cpu':>6}")
    for kind in kinds:
        steps, times = time_steps(step_cases(kind, train_set, args.device), args.repeats,
                                  args.steps, args.round_seconds, args.device)
        base = times["non-private"]
        base_median = statistics.median(base["wall"])
        report["step_time"][kind] = {"seconds": times, "steps_per_round": steps}
        for name, values in times.items():
            median = statistics.median(values["wall"])
            paired = _paired(values["wall"], base["wall"])
            paired_cpu = _paired(values["cpu"], base["cpu"])
            report["step_time"][kind][name] = {
                "median": median, "ratio": median / base_median, "paired": paired,
                "paired_cpu": paired_cpu}
            print(f"{kind:6} {name:12} {median * 1e3:9.3f} {median / base_median:8.2f} "
                  f"{paired:7.2f} {paired_cpu:6.2f}")
        verdict = report["step_time"][kind]["dpcurator"]["paired"] <= 1.5
        print(f"{kind:6} target dpcurator <= 1.5x non-private: {'PASS' if verdict else 'FAIL'} "
              f"({steps} steps a round)")
        if args.phases and args.device == "cpu":
            phases = phase_times(kind, train_set, args.repeats, steps)
            report["step_time"][kind]["phases"] = phases
            for case, spent in phases.items():
                total = sum(v for k, v in spent.items() if not k.startswith("("))
                print(f"{kind:6} {case:12} phases, CPU ms/step (total {total * 1e3:.3f}): "
                      + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in spent.items()))

    if args.profile:
        for kind in kinds:
            profile_steps(kind, train_set, args.device)
    kinds = [k for k in kinds if k != "CNN32"]  # timing only
    if args.skip_accuracy or not kinds:
        _finish(report, args.json)
        return
    print(f"\nTest accuracy, mean of {args.seeds} seeds, {args.epochs} epochs, delta = {DELTA:g}")
    print(f"{'model':6} {'eps':>4} {'dpcurator':>10} {'sigma':>7} {'opacus':>8} {'sigma':>7} "
          f"{'eps(opacus)':>11} {'eps(ours, same noise)':>21}")
    for kind in kinds:
        baseline = [run_nonprivate(kind, s, train_set, test, args.epochs)
                    for s in range(args.seeds)]
        report["accuracy"][kind] = {"non-private": baseline}
        print(f"{kind:6} {'inf':>4} {statistics.mean(baseline):10.3f}  (non-private)")
        for epsilon in epsilons:
            ours = [run_dpcurator(kind, s, epsilon, train_set, test, args.epochs)
                    for s in range(args.seeds)]
            theirs = ([run_opacus(kind, s, epsilon, train_set, test, args.epochs)
                       for s in range(args.seeds)] if OpacusEngine is not None else [])
            report["accuracy"][kind][str(epsilon)] = {"dpcurator": ours, "opacus": theirs}
            line = (f"{kind:6} {epsilon:4g} {statistics.mean(r['accuracy'] for r in ours):10.3f}"
                    f" {ours[0]['sigma']:7.4f}")
            if theirs:
                line += (f" {statistics.mean(r['accuracy'] for r in theirs):8.3f}"
                         f" {theirs[0]['sigma']:7.4f} {theirs[0]['epsilon']:11.4f}"
                         f" {theirs[0]['dpcurator_epsilon_same_noise']:21.4f}")
            print(line)
    _finish(report, args.json)


def _finish(report: dict[str, Any], path: Path | None) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1, default=float))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
