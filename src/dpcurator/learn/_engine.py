"""``PrivacyEngine``: make a PyTorch model, optimizer and data loader differentially private.

Guarantee: a model trained for T steps with the returned optimizer and loader is
(epsilon, delta)-DP under add/remove of one training example, with epsilon =
``engine.epsilon()``: T Poisson-subsampled Gaussian steps with sampling rate q and noise
multiplier sigma (Abadi et al., "Deep learning with differential privacy", CCS 2016),
accounted by dpcurator's privacy-loss-distribution accountant (Koskela, Jälkö and Honkela
2020; Doroshenko, Ghazi, Kamath, Kumar and Manurangsi 2022), or by Rényi DP (Mironov, Talwar
and Zhang 2019) where that is tighter: ``dpcurator.accounting.dpsgd``, the same numbers as
``dpcurator account dpsgd``. Why the discrete, exactly summed implementation meets that
analysis: ``_optimizer`` and ``_grads``.

Switching from Opacus: ``from dpcurator.learn import PrivacyEngine``; ``make_private`` takes
``noise_multiplier=`` or ``target_epsilon=`` with ``epochs=``, and ``delta=`` (Opacus's
``target_delta``); ``engine.epsilon()`` is Opacus's ``get_epsilon(delta)``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.optim import Optimizer

from dpcurator.errors import UserError
from dpcurator.learn._optimizer import DPOptimizer
from dpcurator.learn._sampler import GradSampler
from dpcurator.learn._sampling import DPDataLoader, check_loader, steps_for
from dpcurator.noise import RandomSource, resolve_source

__all__ = ["EpochReport", "PrivacyEngine"]

log = logging.getLogger("dpcurator.learn")

_CLIPPING = ("flat", "per_layer")


@dataclass(frozen=True)
class EpochReport:
    """The privacy spent by the end of an epoch: (epsilon, delta)-DP after ``steps`` steps."""

    epoch: int
    steps: int
    epsilon: float
    delta: float


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
        value > 0 and math.isfinite(value)
    ):
        raise UserError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


class PrivacyEngine:
    """Makes training differentially private and accounts for it.

    ``source``: leave it None for the cryptographically secure default (noise and batch
    sampling). A ``dpcurator.noise.SeededRandom`` makes training reproducible and INSECURE
    (anyone with the seed can subtract the noise); it is for tests and benchmarks only.
    ``accounting``: "best" (the tighter of PLD and RDP), "pld" or "rdp".
    """

    def __init__(self, *, source: RandomSource | None = None, accounting: str = "best") -> None:
        if accounting not in ("best", "pld", "rdp"):
            raise UserError(f"accounting must be 'best', 'pld' or 'rdp', got {accounting!r}")
        self._source = None if source is None else resolve_source(source)
        self.accounting = accounting
        self.steps = 0
        self.sampling_rate: float | None = None
        self.noise_multiplier: float | None = None
        self.delta: float | None = None
        self.history: list[EpochReport] = []
        self._epochs_done = 0

    def make_private(
        self,
        *,
        module: nn.Module,
        optimizer: Optimizer,
        data_loader: Any,
        delta: float,
        max_grad_norm: float | list[float],
        noise_multiplier: float | None = None,
        target_epsilon: float | None = None,
        epochs: float | None = None,
        clipping: str = "flat",
        loss_reduction: str = "mean",
        max_physical_batch_size: int | None = None,
    ) -> tuple[nn.Module, DPOptimizer, DPDataLoader]:
        """Return the module (recording what per-example gradients need), a private
        optimizer and a Poisson-sampling loader; train with them as usual.

        The module is the one given, changed in place: its ``nn.Linear`` and ``nn.Conv2d``
        layers become subclasses that skip the summed weight gradient (so their parameters'
        ``.grad`` stay unset between ``backward()`` and ``step()``), other trainable layers
        get hooks (``dpcurator.learn._grads``).

        Give ``noise_multiplier`` (sigma: noise standard deviation over the clipping bound), or
        ``target_epsilon`` with ``epochs`` to have sigma chosen by the accountant: the smallest
        sigma (within 0.1%) whose epsilon after ``epochs`` epochs is at most the target.
        ``max_grad_norm`` is the clipping bound C; with ``clipping="per_layer"``, a list of
        one bound per trainable parameter (``module.parameters()`` order; C is then the root
        of their sum of squares). ``loss_reduction`` says whether the loss is the batch's mean
        (as ``nn.CrossEntropyLoss()`` by default) or sum. ``max_physical_batch_size`` splits
        larger batches into chunks that are summed before the noise (virtual steps).
        """
        if self.sampling_rate is not None:
            raise UserError("this PrivacyEngine already made a model private; use one engine "
                            "per training run")
        if not isinstance(module, nn.Module):
            raise UserError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        if not isinstance(optimizer, Optimizer) or isinstance(optimizer, DPOptimizer):
            raise UserError("optimizer must be a torch.optim.Optimizer (not yet private), got "
                            f"{type(optimizer).__name__}")
        loader = check_loader(data_loader)
        if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0 < delta < 1:
            raise UserError(f"delta must lie in (0, 1), got {delta!r}")
        if clipping not in _CLIPPING:
            raise UserError(f"clipping must be 'flat' or 'per_layer', got {clipping!r}")
        if clipping == "flat":
            bound: float | list[float] = _positive("max_grad_norm", max_grad_norm)
        else:
            if not isinstance(max_grad_norm, list | tuple) or not max_grad_norm:
                raise UserError("with clipping='per_layer', max_grad_norm must be a list of "
                                f"positive bounds, got {max_grad_norm!r}")
            bound = [_positive("max_grad_norm[i]", c) for c in max_grad_norm]
        steps_per_epoch = len(loader)
        sampling_rate = 1 / steps_per_epoch
        if (noise_multiplier is None) == (target_epsilon is None):
            raise UserError("give exactly one of noise_multiplier and target_epsilon")
        if target_epsilon is not None:
            if epochs is None:
                raise UserError("target_epsilon needs epochs: the noise is chosen so that "
                                "training for that many epochs spends target_epsilon")
            epochs = _positive("epochs", epochs)
            sigma = self._noise_for(_positive("target_epsilon", target_epsilon),
                                    sampling_rate, steps_for(epochs, steps_per_epoch), delta)
        else:
            sigma = _positive("noise_multiplier", noise_multiplier)
            if sigma > 1 << 16:
                raise UserError(f"noise_multiplier must be at most 2^16, got {sigma!r}")
        sampler = GradSampler(module, loss_reduction=loss_reduction, fuse=clipping == "flat")
        try:  # a refusal leaves the module as it was given
            _check_optimizer_params(optimizer, sampler)
            dp_loader = DPDataLoader(loader, source=self._source,
                                     max_physical_batch_size=max_physical_batch_size,
                                     on_epoch_end=self._end_epoch)
        except BaseException:
            sampler.remove()
            raise
        sampler.watch(lambda: dp_loader.chunk)  # each step checked against its chunk
        dp_optimizer = DPOptimizer(
            optimizer, sampler=sampler, noise_multiplier=sigma, max_grad_norm=bound,
            expected_batch_size=dp_loader.expected_batch_size,
            last_chunk=lambda: dp_loader.last_chunk, on_step=self._count_step,
            source=self._source,
        )
        self.sampling_rate, self.noise_multiplier, self.delta = sampling_rate, sigma, delta
        log.info("DP-SGD: sampling rate %.6g, noise multiplier %.6g, clipping bound %.6g",
                 sampling_rate, sigma, dp_optimizer.max_grad_norm)
        return module, dp_optimizer, dp_loader

    def _noise_for(self, target: float, sampling_rate: float, steps: int, delta: float) -> float:
        from dpcurator.accounting.dpsgd import dpsgd_noise_multiplier

        sigma, _ = dpsgd_noise_multiplier(sampling_rate=sampling_rate, steps=steps, delta=delta,
                                          target_epsilon=target, method=self.accounting)
        return sigma

    def _count_step(self) -> None:
        self.steps += 1

    def _end_epoch(self) -> None:
        self._epochs_done += 1
        assert self.delta is not None
        report = EpochReport(self._epochs_done, self.steps, self.epsilon(), self.delta)
        self.history.append(report)
        log.info("epoch %d: (%.4g, %.3g)-DP after %d steps", report.epoch, report.epsilon,
                 report.delta, report.steps)

    def epsilon(self, delta: float | None = None) -> float:
        """Epsilon spent so far at ``delta`` (default: make_private's), an upper bound."""
        if self.sampling_rate is None or self.noise_multiplier is None or self.delta is None:
            raise UserError("call make_private before asking for epsilon")
        delta = self.delta if delta is None else delta
        if self.steps == 0:
            return 0.0
        from dpcurator.accounting.dpsgd import dpsgd_epsilon

        return dpsgd_epsilon(sampling_rate=self.sampling_rate,
                             noise_multiplier=self.noise_multiplier, steps=self.steps,
                             delta=delta, method=self.accounting).epsilon


def _check_optimizer_params(optimizer: Optimizer, sampler: GradSampler) -> None:
    private = {id(p) for p in sampler.parameters()}
    if len(private) != sum(1 for _ in sampler.parameters()):
        raise UserError("module shares a parameter between layers; per-example gradients of "
                        "tied parameters are not supported")
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and id(p) not in private:
                raise UserError("optimizer holds a trainable parameter that is not in module; "
                                "give the optimizer module.parameters()")
