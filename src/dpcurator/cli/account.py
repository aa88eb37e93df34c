"""``dpcurator account``: privacy accounting from the command line (DP-SGD, composition,
conversions). Every command prints one JSON object with at least "epsilon" and "delta" when
given ``--json``."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import typer

from dpcurator.accounting.guarantees import ZCDP, PureDP
from dpcurator.cli._common import emit, fail, user_errors
from dpcurator.errors import UserError

if TYPE_CHECKING:
    from dpcurator.accounting.events import DpEvent

# The accountants (SciPy, numba) are imported by the commands that use them, so that
# ``dpcurator --help`` and the other commands start quickly.

account_app = typer.Typer(no_args_is_help=True, help="Privacy accounting.")


def _render(result: dict[str, Any]) -> None:
    from rich.console import Console

    console = Console()
    line = f"epsilon = {result['epsilon']:.6g} at delta = {result['delta']:g}"
    if "method" in result:
        line += f"  (method: {result['method']})"
    console.print(line)
    if result.get("note"):
        console.print(f"note: {result['note']}")
    if "noise_multiplier" in result:
        console.print(f"noise multiplier = {result['noise_multiplier']:.6g}")
    if "rho" in result:
        console.print(f"rho = {result['rho']:.6g}")


@account_app.command()
def dpsgd(
    sampling_rate: float = typer.Option(..., help="Poisson sampling rate q of each step."),
    steps: int = typer.Option(..., help="Number of training steps T."),
    delta: float = typer.Option(..., help="Target delta."),
    noise_multiplier: float | None = typer.Option(None, help="sigma: noise std / clip norm."),
    target_epsilon: float | None = typer.Option(
        None, help="Solve for the noise multiplier reaching this epsilon instead."
    ),
    method: str = typer.Option("best", help="pld, rdp, or best (the tighter)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Epsilon of DP-SGD (Poisson-subsampled Gaussian steps), or the noise a target needs."""
    from dpcurator.accounting.dpsgd import dpsgd_epsilon, dpsgd_noise_multiplier

    if (noise_multiplier is None) == (target_epsilon is None):
        fail("give exactly one of --noise-multiplier and --target-epsilon")
    with user_errors():
        if target_epsilon is not None:
            sigma, res = dpsgd_noise_multiplier(sampling_rate=sampling_rate, steps=steps,
                                                delta=delta, target_epsilon=target_epsilon,
                                                method=method)
        else:
            assert noise_multiplier is not None
            sigma = noise_multiplier
            res = dpsgd_epsilon(sampling_rate=sampling_rate, noise_multiplier=sigma,
                                steps=steps, delta=delta, method=method)
    result: dict[str, Any] = {"epsilon": res.epsilon, "delta": res.delta, "method": res.method,
                              "noise_multiplier": sigma, "sampling_rate": sampling_rate,
                              "steps": steps, "candidates": res.candidates}
    if res.note:
        result["note"] = res.note
    emit(result, as_json, _render)


@account_app.command()
def compose(
    mechanism: str = typer.Option(..., help="gaussian, laplace or randomized-response."),
    times: int = typer.Option(1, help="How many times the mechanism runs (K)."),
    delta: float = typer.Option(1e-6, help="Target delta."),
    noise: float | None = typer.Option(None, help="Noise scale (Gaussian std, Laplace b)."),
    sensitivity: float = typer.Option(1.0, help="The query's sensitivity (L2 or L1)."),
    epsilon: float | None = typer.Option(None, help="Randomized response: its epsilon."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Epsilon of K runs of one mechanism, by the tightest accountant available."""
    from dpcurator.accounting.accountant import account
    from dpcurator.accounting.events import SelfComposedEvent

    with user_errors():
        event = _single_event(mechanism, noise, sensitivity, epsilon)
        if isinstance(times, bool) or times < 1:
            raise UserError(f"times must be an integer >= 1, got {times!r}")
        res = account(SelfComposedEvent(event, times) if times > 1 else event, delta=delta)
    result: dict[str, Any] = {"epsilon": res.epsilon, "delta": res.delta, "method": res.method,
                              "times": times, "candidates": res.candidates}
    if res.note:
        result["note"] = res.note
    emit(result, as_json, _render)


def _single_event(mechanism: str, noise: float | None, sensitivity: float,
                  epsilon: float | None) -> DpEvent:
    from dpcurator.accounting.events import GaussianEvent, LaplaceEvent, RandomizedResponseEvent

    if mechanism == "randomized-response":
        if epsilon is None:
            raise UserError("randomized-response needs --epsilon (its per-answer epsilon)")
        if not (epsilon > 0 and math.isfinite(epsilon)):
            raise UserError(f"epsilon must be a positive number, got {epsilon!r}")
        # Binary randomized response reporting the truth w.p. e^eps / (1 + e^eps).
        return RandomizedResponseEvent(1 / (1 + math.exp(-epsilon)), 2)
    if mechanism not in ("gaussian", "laplace"):
        raise UserError(
            f"mechanism must be gaussian, laplace or randomized-response, got {mechanism!r}"
        )
    if noise is None:
        raise UserError(f"{mechanism} needs --noise (the noise scale)")
    if not (noise > 0 and math.isfinite(noise)):
        raise UserError(f"noise must be a positive number, got {noise!r}")
    if not (sensitivity > 0 and math.isfinite(sensitivity)):
        raise UserError(f"sensitivity must be a positive number, got {sensitivity!r}")
    multiplier = noise / sensitivity
    return GaussianEvent(multiplier) if mechanism == "gaussian" else LaplaceEvent(multiplier)


@account_app.command()
def convert(
    source: str = typer.Option(..., "--from", help="pure, zcdp or gdp."),
    delta: float = typer.Option(1e-6, help="The delta of the (epsilon, delta) answer."),
    epsilon: float | None = typer.Option(None, help="pure: its epsilon."),
    rho: float | None = typer.Option(None, help="zcdp: its rho."),
    mu: float | None = typer.Option(None, help="gdp: its mu."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Convert a guarantee to (epsilon, delta)-DP (and pure DP to zCDP)."""
    from dpcurator.accounting.conversions import gdp_to_epsilon, pure_to_zcdp, zcdp_to_epsilon

    with user_errors():
        result: dict[str, Any]
        if source == "pure":
            if epsilon is None:
                raise UserError("--from pure needs --epsilon")
            z = pure_to_zcdp(PureDP(epsilon))
            result = {"epsilon": epsilon, "delta": 0.0, "rho": z.rho}
        elif source == "zcdp":
            if rho is None:
                raise UserError("--from zcdp needs --rho")
            result = {"epsilon": zcdp_to_epsilon(ZCDP(rho).rho, delta), "delta": delta,
                      "rho": rho}
        elif source == "gdp":
            if mu is None:
                raise UserError("--from gdp needs --mu")
            result = {"epsilon": gdp_to_epsilon(mu, delta), "delta": delta, "mu": mu}
        else:
            raise UserError(f"--from must be pure, zcdp or gdp, got {source!r}")
    emit(result, as_json, _render)
