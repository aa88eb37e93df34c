"""Privacy accounting: guarantees in every currency, events, accountants, budgets.

- Currencies: ``PureDP``, ``ApproxDP``, ``ZCDP``, ``RDP``, ``GDP`` and ``PLD``.
- What happened: ``events`` (frozen data that every accountant interprets).
- Accountants: ``account`` (the tightest of all, naming its method), ``PLD`` /
  ``pld_from_event`` / ``pld_epsilon``, ``RDPAccountant``; composition theorems in
  ``composition``; conversions in ``conversions``; ``group_privacy``; ``posterior_bounds``.
- Privacy filters: the exact arithmetic of a budget (``filters``); the budget itself, with
  its durable ledger, is ``dpcurator.ledger.Budget``.
- DP-SGD: ``dpsgd_epsilon`` and ``dpsgd_noise_multiplier``.
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
    PureDP,
)

if TYPE_CHECKING:
    from dpcurator.accounting import composition, conversions, events, filters
    from dpcurator.accounting.accountant import AccountingResult, account
    from dpcurator.accounting.dpsgd import dpsgd_epsilon, dpsgd_event, dpsgd_noise_multiplier
    from dpcurator.accounting.group import group_privacy
    from dpcurator.accounting.pld import PLD, PrivacyLossPmf, pld_epsilon, pld_from_event
    from dpcurator.accounting.posterior import (
        PosteriorBounds,
        plot_posterior,
        posterior_bounds,
    )
    from dpcurator.accounting.rdp import RDPAccountant

__all__ = [
    "GDP",
    "PLD",
    "RDP",
    "ZCDP",
    "AccountingResult",
    "ApproxDP",
    "Guarantee",
    "Neighbouring",
    "PosteriorBounds",
    "PrivacyLossPmf",
    "PureDP",
    "RDPAccountant",
    "account",
    "composition",
    "conversions",
    "dpsgd_epsilon",
    "dpsgd_event",
    "dpsgd_noise_multiplier",
    "events",
    "filters",
    "group_privacy",
    "pld_epsilon",
    "pld_from_event",
    "plot_posterior",
    "posterior_bounds",
]

# The accountants load SciPy (and the PLD accountant numba): on first use only.
__getattr__, __dir__ = exports(__name__, {
    "AccountingResult": "dpcurator.accounting.accountant",
    "account": "dpcurator.accounting.accountant",
    "dpsgd_epsilon": "dpcurator.accounting.dpsgd",
    "dpsgd_event": "dpcurator.accounting.dpsgd",
    "dpsgd_noise_multiplier": "dpcurator.accounting.dpsgd",
    "group_privacy": "dpcurator.accounting.group",
    "PLD": "dpcurator.accounting.pld",
    "PrivacyLossPmf": "dpcurator.accounting.pld",
    "pld_epsilon": "dpcurator.accounting.pld",
    "pld_from_event": "dpcurator.accounting.pld",
    "PosteriorBounds": "dpcurator.accounting.posterior",
    "plot_posterior": "dpcurator.accounting.posterior",
    "posterior_bounds": "dpcurator.accounting.posterior",
    "RDPAccountant": "dpcurator.accounting.rdp",
    **{name: f"dpcurator.accounting.{name}" for name in
       ("composition", "conversions", "events", "filters")},
})
