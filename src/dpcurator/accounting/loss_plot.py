"""The privacy loss made visible: the two readings of delta drawn on the loss distribution.

``plot_privacy_loss(profile, epsilon)`` draws the distribution of the privacy loss L as a
histogram of probability masses, with eps marked, in two panels, as the references draw them
(the references' "DP from A to epsilon", after Desfontaines, "Privacy loss random variable"):

- left, probabilistic DP: the mass of every bin past eps is shaded; the shaded total,
  P[L > eps], is delta_pDP;
- right, approximate DP: past eps each bin is shaded only up to its *weighted excess*
  P(bin) - e^eps Q(bin) = E[(1 - e^(eps - L)) 1{L in bin}]; the shaded total is delta_aDP.

Bins are right-closed, (a, b], and eps is a bin edge, so an atom of the loss at eps falls on
the left (within eps), as both readings count it. The first bin also holds all the mass below
it and the last all the finite mass above it; the mass at +infinity (outputs the other dataset
cannot produce) is its own bar at the right, shaded in full in both panels. So each panel's
shaded bars add up to its delta exactly (up to rounding). Each panel draws the order of the
pair whose delta is the larger, and the law that delta is read from (``PrivacyLossProfile``).

The data drawn is returned (``LossPicture``), and the figure itself: the bars are the
containers labelled "distribution", "shaded" and "infinity" on each axis, eps the line
labelled "epsilon". matplotlib's Agg canvas is used directly, so no global backend changes.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dpcurator import _validation as check
from dpcurator.accounting._loss_laws import FloatArray, Law
from dpcurator.accounting.loss import Direction, PrivacyLossProfile
from dpcurator.errors import UserError, UserTypeError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["LossPanel", "LossPicture", "loss_panel", "plot_privacy_loss"]

#: Bins drawn across the bulk of the distribution.
DEFAULT_BINS = 72


@dataclass(frozen=True, eq=False)
class LossPanel:
    """One panel's data: a histogram of L in one order of the pair, and what is shaded.

    ``edges`` are the bin edges (eps is one of them); ``masses[i]`` is P[L in (edges[i],
    edges[i+1]]] (the first bin with everything below, the last with every finite loss above);
    ``shaded[i]`` is the bin's share of delta (0 left of eps); ``infinity_mass`` is P[L = +inf];
    ``delta`` = sum(shaded) + infinity_mass.
    """

    reading: str  # "pDP" or "aDP"
    direction: Direction
    epsilon: float
    edges: FloatArray
    masses: FloatArray
    shaded: FloatArray
    infinity_mass: float

    @property
    def delta(self) -> float:
        return float(np.sum(self.shaded)) + self.infinity_mass


@dataclass(frozen=True, eq=False)
class LossPicture:
    """What ``plot_privacy_loss`` drew: both panels' data, the reported deltas, the figure."""

    epsilon: float
    pdp: LossPanel
    adp: LossPanel
    delta_pdp: float
    delta_adp: float
    figure: Figure
    path: Path | None


def _edges(laws: list[Law], epsilon: float, bins: int) -> FloatArray:
    """Bin edges over the bulk of the laws (and eps), eps on an edge."""
    lo, hi = epsilon, epsilon
    for law in laws:
        a, b = law.bounds(1e-4)
        losses, masses = law.atoms()
        heavy = losses[masses >= 1e-4]  # atoms worth seeing (a grid's tails are not)
        lo, hi = min(lo, a), max(hi, b)
        if heavy.size:
            lo, hi = min(lo, float(heavy.min())), max(hi, float(heavy.max()))
    if not (math.isfinite(lo) and math.isfinite(hi)):  # pragma: no cover - bounds are finite
        lo, hi = epsilon - 1.0, epsilon + 1.0
    span = max(hi - lo, 0.5)
    lo, hi = lo - 0.06 * span, hi + 0.06 * span
    width = (hi - lo) / bins
    first = math.floor((lo - epsilon) / width)
    last = math.ceil((hi - epsilon) / width)
    edges: FloatArray = epsilon + width * np.arange(first, last + 1, dtype=np.float64)
    return edges


def _bin_masses(law: Law, edges: FloatArray, q: bool) -> FloatArray:
    """P (or Q) of each bin, from the upper tails at the inner edges.

    The first bin holds P[L <= edges[1]] (its Q-mass is left at 0: it lies left of eps, where
    nothing is shaded); the last holds every finite loss above edges[-2].
    """
    inner = edges[1:-1]
    if q:
        upper = np.concatenate([[np.nan], law.sf_q(inner), [0.0]])
    else:
        finite = 1.0 - law.infinity_mass
        upper = np.concatenate([[finite], law.sf_p(inner) - law.infinity_mass, [0.0]])
    out: FloatArray = np.nan_to_num(np.maximum(upper[:-1] - upper[1:], 0.0), nan=0.0)
    return out


def loss_panel(
    profile: PrivacyLossProfile, epsilon: float, reading: str, bins: int = DEFAULT_BINS
) -> LossPanel:
    """The data of one panel: ``reading`` "pDP" or "aDP" at ``epsilon``."""
    eps = check.nonnegative("epsilon", epsilon)
    if reading not in ("pDP", "aDP"):
        raise UserError(f"reading must be 'pDP' or 'aDP', got {reading!r}")
    pdp = reading == "pDP"
    direction = max(profile.directions, key=lambda d: _one(profile, d, eps, pdp))
    law = profile.pdp_law(direction) if pdp else profile.adp_law(direction)
    edges = _edges([law], eps, bins)
    masses = _bin_masses(law, edges, q=False)
    right = edges[:-1] >= eps - 1e-12 * max(1.0, eps)  # bins (a, b] with a >= eps
    if pdp:
        shaded = np.where(right, masses, 0.0)
    else:
        excess = masses - math.exp(eps) * _bin_masses(law, edges, q=True)
        shaded = np.where(right, np.maximum(excess, 0.0), 0.0)
    return LossPanel(reading, direction, eps, edges, masses, shaded, float(law.infinity_mass))


def _one(profile: PrivacyLossProfile, direction: Direction, eps: float, pdp: bool) -> float:
    law = profile.pdp_law(direction) if pdp else profile.adp_law(direction)
    value = law.sf_p(np.array([eps])) if pdp else law.adp(np.array([eps]))
    return float(np.asarray(value).reshape(-1)[0])


def _draw(ax: Any, panel: LossPanel, reported: float) -> None:
    edges, masses, shaded = panel.edges, panel.masses, panel.shaded
    widths = np.diff(edges)
    grey, colour = "0.72", ("C3" if panel.reading == "pDP" else "C0")
    ax.bar(edges[:-1], masses, width=widths, align="edge", color=grey, linewidth=0,
           label="distribution")
    ax.bar(edges[:-1], shaded, width=widths, align="edge", color=colour, alpha=0.85,
           linewidth=0, label="shaded")
    step = float(widths[0])
    x_inf = float(edges[-1]) + 2.0 * step
    ax.bar([x_inf], [panel.infinity_mass], width=2.0 * step, align="edge", color=colour,
           hatch="//", edgecolor="black", linewidth=0.5, label="infinity")
    top = max(float(masses.max(initial=0.0)), panel.infinity_mass, 1e-12)
    ax.axvline(panel.epsilon, color="black", linestyle="--", linewidth=1.2, label="epsilon")
    ax.text(panel.epsilon, top * 1.04, f" ε = {panel.epsilon:g}", ha="left", va="bottom")
    if panel.infinity_mass > 1e-6:  # (below, the shaded total still counts it)
        ax.annotate(f"P[L = +∞]\n= {panel.infinity_mass:.3g}",
                    xy=(x_inf + step, panel.infinity_mass), xytext=(x_inf + step, top * 0.45),
                    ha="center", fontsize="small", arrowprops={"arrowstyle": "->",
                                                               "linewidth": 0.8})
    finite = [float(t) for t in ax.get_xticks() if edges[0] <= t <= edges[-1] - step]
    ax.set_xticks([*finite, x_inf + step])
    ax.set_xticklabels([*[f"{t:g}" for t in finite], "+∞"])
    ax.text(0.02, 0.96, f"shaded: {panel.delta:.3g}", transform=ax.transAxes, ha="left",
            va="top", color=colour, fontsize="small")
    ax.set_xlim(float(edges[0]), x_inf + 3.0 * step)
    ax.set_ylim(0.0, top * 1.18)
    ax.set_xlabel(f"privacy loss L ({panel.direction}: output drawn with the unit "
                  f"{'in' if panel.direction == 'remove' else 'out'})")
    if panel.reading == "pDP":
        title = f"probabilistic DP: δ = P[L > ε] = {reported:.4g}"
    else:
        title = f"approximate DP: δ = E[(1 − e^(ε−L))₊] = {reported:.4g}"
    ax.set_title(title, fontsize="medium")
    ax.grid(True, axis="y", linewidth=0.4, alpha=0.5)


def plot_privacy_loss(
    profile: PrivacyLossProfile,
    epsilon: float,
    path: str | os.PathLike[str] | None = None,
    *,
    title: str | None = None,
    bins: int = DEFAULT_BINS,
) -> LossPicture:
    """Draw the loss distribution with both deltas shaded (see the module docstring).

    Writes ``path`` (``.png`` or ``.svg``) when given. Returns the data drawn and the figure.
    """
    if not isinstance(profile, PrivacyLossProfile):
        raise UserTypeError(f"profile must be a PrivacyLossProfile, got {type(profile).__name__}")
    eps = check.nonnegative("epsilon", epsilon)
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 8:
        raise UserError(f"bins must be an integer >= 8, got {bins!r}")
    out: Path | None = None
    if path is not None:
        out = Path(path)
        if out.suffix.lower() not in (".png", ".svg"):
            raise UserError(f"path must end in .png or .svg, got {str(path)!r}")

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    pdp, adp = loss_panel(profile, eps, "pDP", bins), loss_panel(profile, eps, "aDP", bins)
    delta_p = float(profile.delta_pdp(eps))
    delta_a = float(profile.delta_adp(eps))
    fig = Figure(figsize=(11.0, 4.2))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharey=False)
    _draw(axes[0], pdp, delta_p)
    _draw(axes[1], adp, delta_a)
    axes[0].set_ylabel("probability")
    fig.suptitle(title or f"What δ means at ε = {eps:g}", fontsize="large")
    fig.tight_layout()
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format=out.suffix.lower().lstrip("."), dpi=80)
    return LossPicture(eps, pdp, adp, delta_p, delta_a, fig, out)
