"""An empirical audit of DP-SGD: canary gradients through the real engine, many per step.

What is audited: one step of ``PrivacyEngine``'s training (Poisson sampling, per-example
gradients, clipping, the exact sum, the secure noise), end to end, against the epsilon the
accountant claims for that step (``dpcurator.accounting.dpsgd``, add/remove one example).

How (a canary-gradient audit, as in Jagielski, Ullman and Oprea 2020 and Nasr, Song,
Thakurta, Papernot and Carlini 2021, with many orthogonal canaries per step as in Steinke,
Nasr and Jagielski 2023): the model is a linear layer with ``canaries`` inputs and no bias,
and example j's input is 10 e_j, so its gradient (under a summed loss) is 10 e_j: ten times
the clipping bound, along its own coordinate. On dataset D2 every example is a canary; on D1
every example is zero (a zero gradient, which is as good as absent: the neighbour of D2 without
canary j, coordinate by coordinate). Coordinate j of the released gradient depends only on
whether canary j was sampled and on coordinate j's noise, all independent, so one step gives
``canaries`` independent draws of the one-coordinate mechanism: the Poisson-subsampled,
clipped canary plus discrete Gaussian noise. The black-box auditor
(``dpcurator.audit.audit_epsilon``) turns the draws into a lower bound on that mechanism's
epsilon, valid with probability at least 1 - ``failure_probability``.

A correct implementation keeps the bound at or below the claim; an implementation that skips
clipping, or adds too little noise, pushes it above (tests/test_learn_audit.py breaks both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpcurator.audit import AuditResult, audit_epsilon
from dpcurator.errors import UserError
from dpcurator.noise import RandomSource

__all__ = ["DpsgdAudit", "audit_dpsgd"]

_CANARY_NORM = 10.0  # in units of the clipping bound


@dataclass(frozen=True)
class DpsgdAudit:
    """The audit's verdict: ``epsilon_lower`` holds with probability >= 1 - failure_probability.

    ``refuted`` is True when the lower bound exceeds the claimed epsilon of one step, which
    happens to a correct implementation with probability at most ``failure_probability``.
    """

    epsilon_lower: float
    epsilon_claimed: float
    delta: float
    failure_probability: float
    draws: int
    result: AuditResult

    @property
    def refuted(self) -> bool:
        return self.epsilon_lower > self.epsilon_claimed


def _one_step_sampler(canaries: int, present: bool, noise_multiplier: float,
                      sampling_rate: float, source: RandomSource | None, device: str,
                      device_path: bool | None) -> Any:
    from dpcurator.learn._engine import PrivacyEngine

    scale = _CANARY_NORM if present else 0.0
    inputs = torch.eye(canaries) * scale
    dataset = TensorDataset(inputs, torch.zeros(canaries))
    batch_size = max(1, round(canaries * sampling_rate))
    model = nn.Linear(canaries, 1, bias=False).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    engine = PrivacyEngine(source=source, accounting="pld")
    _, dp_optimizer, loader = engine.make_private(
        module=model, optimizer=optimizer,
        data_loader=DataLoader(dataset, batch_size=batch_size),
        noise_multiplier=noise_multiplier, delta=0.5, max_grad_norm=1.0, loss_reduction="sum",
    )
    dp_optimizer.sampler.on_device = device_path

    def sample(k: int) -> npt.NDArray[np.float64]:
        # Shape (k,): coordinate j of each step's released gradient is one draw.
        out: list[npt.NDArray[np.float64]] = []
        drawn = 0
        while drawn < k:
            for x, _ in loader:
                dp_optimizer.zero_grad()
                model(x.to(device)).sum().backward()
                dp_optimizer.step()
                if loader.last_chunk:
                    grad = model.weight.grad
                    assert grad is not None
                    out.append(grad.detach().to(torch.float64).reshape(-1).cpu().numpy().copy())
                    drawn += canaries
        return np.concatenate(out)[:k]

    return sample, loader.sampling_rate


def audit_dpsgd(
    *,
    noise_multiplier: float = 1.0,
    sampling_rate: float = 1.0,
    delta: float = 1e-5,
    draws: int = 50_000,
    canaries: int = 512,
    failure_probability: float = 1e-7,
    source: RandomSource | None = None,
    device: str = "cpu",
    device_path: bool | None = None,
) -> DpsgdAudit:
    """Audit one DP-SGD step of ``PrivacyEngine`` with ``draws`` canary draws per dataset.

    ``sampling_rate`` is rounded to canaries / round(canaries * rate) as the engine's loader
    would (the claim uses the rate actually used). ``device``: where the model computes (a GPU
    audits the GPU path); ``device_path=True`` audits that path (torch operations) on the CPU.
    """
    if isinstance(canaries, bool) or not isinstance(canaries, int) or canaries < 2:
        raise UserError(f"canaries must be an integer >= 2, got {canaries!r}")
    if not (isinstance(sampling_rate, int | float) and 0 < sampling_rate <= 1):
        raise UserError(f"sampling_rate must lie in (0, 1], got {sampling_rate!r}")
    if not (isinstance(delta, int | float) and 0 < delta < 1):
        raise UserError(f"delta must lie in (0, 1), got {delta!r}")
    sample_d1, _ = _one_step_sampler(canaries, False, noise_multiplier, sampling_rate, source,
                                     device, device_path)
    sample_d2, rate = _one_step_sampler(canaries, True, noise_multiplier, sampling_rate, source,
                                        device, device_path)
    from dpcurator.accounting.dpsgd import dpsgd_epsilon

    claimed = dpsgd_epsilon(sampling_rate=rate, noise_multiplier=noise_multiplier, steps=1,
                            delta=delta).epsilon
    result = audit_epsilon(sample_d1, sample_d2, n=draws, delta=delta, events="threshold",
                           failure_probability=failure_probability,
                           batch_size=max(canaries, math.ceil(draws / 8 / canaries) * canaries))
    return DpsgdAudit(result.epsilon_lower, claimed, delta, failure_probability, draws, result)
