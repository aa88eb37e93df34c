"""Privacy accounting: guarantees in every currency, events, accountants, budgets.

- Currencies: ``PureDP``, ``ApproxDP``, ``ZCDP``, ``RDP``, ``GDP`` and ``PLD``; and
  ``ProbabilisticDP``, which the budget refuses (it is not closed under post-processing).
- What happened: ``events`` (frozen data that every accountant interprets).
- Accountants: ``account`` (the tightest of all, naming its method), ``PLD`` /
  ``pld_from_event`` / ``pld_epsilon``, ``RDPAccountant``; composition theorems in
  ``composition``; conversions in ``conversions``; ``group_privacy``; ``posterior_bounds``.
- Privacy filters: the exact arithmetic of a budget (``filters``); the budget itself, with
  its durable ledger, is ``dpcurator.ledger.Budget``.
- DP-SGD: ``dpsgd_epsilon`` and ``dpsgd_noise_multiplier``.
- What delta means: ``loss_profile`` (``PrivacyLossProfile``: the probabilistic delta
  P[L > eps] and the approximate delta E[(1 - e^(eps - L))+] of any event, and their inverses;
  shortcuts ``delta_pdp``, ``delta_adp``, ``epsilon_pdp``, ``epsilon_adp``; ``pair_deltas``
  for two distributions on a finite set), the picture
  ``plot_privacy_loss``, and the thresholded histogram against partition selection
  (``ThresholdedHistogram``, ``KeepRule``).
"""

from typing import TYPE_CHECKING

from dpcurator._lazy import exports
from dpcurator.accounting.guarantees import (
    GDP,
    RDP,
    ZCDP,
    ApproxDP,
    Guarantee,
    Neighbouring,
    ProbabilisticDP,
    PureDP,
)

if TYPE_CHECKING:
    from dpcurator.accounting import composition, conversions, events, filters
    from dpcurator.accounting.accountant import AccountingResult, account
    from dpcurator.accounting.dpsgd import dpsgd_epsilon, dpsgd_event, dpsgd_noise_multiplier
    from dpcurator.accounting.group import group_privacy
    from dpcurator.accounting.loss import (
        PrivacyLossProfile,
        delta_adp,
        delta_pdp,
        epsilon_adp,
        epsilon_pdp,
        loss_profile,
        pair_deltas,
    )
    from dpcurator.accounting.loss_plot import LossPicture, plot_privacy_loss
    from dpcurator.accounting.pld import PLD, PrivacyLossPmf, pld_epsilon, pld_from_event
    from dpcurator.accounting.posterior import (
        PosteriorBounds,
        plot_posterior,
        posterior_bounds,
        posterior_figure,
    )
    from dpcurator.accounting.rdp import RDPAccountant
    from dpcurator.accounting.thresholding import KeepRule, ThresholdedHistogram

__all__ = [
    "GDP",
    "PLD",
    "RDP",
    "ZCDP",
    "AccountingResult",
    "ApproxDP",
    "Guarantee",
    "KeepRule",
    "LossPicture",
    "Neighbouring",
    "PosteriorBounds",
    "PrivacyLossPmf",
    "PrivacyLossProfile",
    "ProbabilisticDP",
    "PureDP",
    "RDPAccountant",
    "ThresholdedHistogram",
    "account",
    "composition",
    "conversions",
    "delta_adp",
    "delta_pdp",
    "dpsgd_epsilon",
    "dpsgd_event",
    "dpsgd_noise_multiplier",
    "epsilon_adp",
    "epsilon_pdp",
    "events",
    "filters",
    "group_privacy",
    "loss_profile",
    "pair_deltas",
    "pld_epsilon",
    "pld_from_event",
    "plot_posterior",
    "plot_privacy_loss",
    "posterior_bounds",
    "posterior_figure",
]

# The accountants load SciPy (and the PLD accountant numba): on first use only.
__getattr__, __dir__ = exports(__name__, {
    "AccountingResult": "dpcurator.accounting.accountant",
    "account": "dpcurator.accounting.accountant",
    "dpsgd_epsilon": "dpcurator.accounting.dpsgd",
    "dpsgd_event": "dpcurator.accounting.dpsgd",
    "dpsgd_noise_multiplier": "dpcurator.accounting.dpsgd",
    "group_privacy": "dpcurator.accounting.group",
    **{name: "dpcurator.accounting.loss" for name in
       ("PrivacyLossProfile", "delta_adp", "delta_pdp", "epsilon_adp", "epsilon_pdp",
        "loss_profile", "pair_deltas")},
    "LossPicture": "dpcurator.accounting.loss_plot",
    "plot_privacy_loss": "dpcurator.accounting.loss_plot",
    "KeepRule": "dpcurator.accounting.thresholding",
    "ThresholdedHistogram": "dpcurator.accounting.thresholding",
    "PLD": "dpcurator.accounting.pld",
    "PrivacyLossPmf": "dpcurator.accounting.pld",
    "pld_epsilon": "dpcurator.accounting.pld",
    "pld_from_event": "dpcurator.accounting.pld",
    "PosteriorBounds": "dpcurator.accounting.posterior",
    "plot_posterior": "dpcurator.accounting.posterior",
    "posterior_bounds": "dpcurator.accounting.posterior",
    "posterior_figure": "dpcurator.accounting.posterior",
    "RDPAccountant": "dpcurator.accounting.rdp",
    **{name: f"dpcurator.accounting.{name}" for name in
       ("composition", "conversions", "events", "filters")},
})
