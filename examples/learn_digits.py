"""Train a small model privately on sklearn's handwritten digits and print accuracy against epsilon.

    .venv/bin/python examples/learn_digits.py                  # an MLP, epsilon 1, 3 and 8
    .venv/bin/python examples/learn_digits.py --epsilons 0.5,2 --epochs 20 --json

Each model is trained with DP-SGD (``dpcurator.learn``): Poisson-sampled batches of 256
expected examples, per-example gradients clipped to norm 1, secure discrete Gaussian noise
whose multiplier the accountant chooses so that training for ``--epochs`` epochs spends the
target epsilon (delta = 1e-5, add/remove one example). The non-private model is trained the
same way without clipping or noise, for reference. Needs ``dpcurator[learn]`` and
scikit-learn (which ships the data set: 1,797 8x8 images).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpcurator.learn import PrivacyEngine
from dpcurator.noise import RandomSource


def digits(seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    xs = torch.tensor(x / 16.0, dtype=torch.float32)[order]
    ys = torch.tensor(y, dtype=torch.long)[order]
    return TensorDataset(xs[:1437], ys[:1437]), TensorDataset(xs[1437:], ys[1437:])


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def accuracy(net: nn.Module, test: TensorDataset) -> float:
    with torch.no_grad():
        return float((net(test.tensors[0]).argmax(1) == test.tensors[1]).float().mean())


def train(net: nn.Module, optimizer: Any, loader: Any, epochs: int) -> None:
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(net(x), y).backward()
            optimizer.step()


def run(epsilons: list[float], epochs: int, seed: int = 0,
        source: RandomSource | None = None) -> list[dict[str, float]]:
    """Accuracy of the non-private model (epsilon inf) and of one private model per epsilon.
    ``source``: the noise's (None: the secure default; a seeded one for tests only)."""
    train_set, test = digits()
    torch.manual_seed(seed)
    net = model()
    loader = DataLoader(train_set, batch_size=256, shuffle=True)
    train(net, torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9), loader, epochs)
    rows = [{"epsilon": float("inf"), "accuracy": accuracy(net, test), "noise_multiplier": 0.0}]
    for epsilon in epsilons:
        torch.manual_seed(seed)
        net = model()
        engine = PrivacyEngine(source=source)
        net, optimizer, private_loader = engine.make_private(
            module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9),
            data_loader=DataLoader(train_set, batch_size=256), target_epsilon=epsilon,
            delta=1e-5, epochs=epochs, max_grad_norm=1.0)
        train(net, optimizer, private_loader, epochs)
        assert engine.noise_multiplier is not None
        rows.append({"epsilon": engine.epsilon(), "accuracy": accuracy(net, test),
                     "noise_multiplier": engine.noise_multiplier})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilons", default="1,3,8")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    rows = run([float(e) for e in args.epsilons.split(",")], args.epochs, args.seed)
    if args.json:
        print(json.dumps({"delta": 1e-5, "epochs": args.epochs, "results": rows}))
        return
    print(f"sklearn digits, MLP 64-128-10, {args.epochs} epochs, delta = 1e-5")
    print(f"{'epsilon':>8} {'noise multiplier':>17} {'test accuracy':>14}")
    for row in rows:
        print(f"{row['epsilon']:8.3g} {row['noise_multiplier']:17.4f} {row['accuracy']:14.3f}")


if __name__ == "__main__":
    main()
