"""dpcurator: differential privacy with exact noise, exact accounting and empirical audits.

The guarantees are imported at once; everything else (the curator and its engines, the
mechanisms and their samplers, the accountants) on first use, so that ``import dpcurator``
and every ``dpcurator`` command start quickly (see ``dpcurator._lazy``).
"""

from typing import TYPE_CHECKING

from dpcurator._lazy import exports
from dpcurator.accounting.guarantees import ZCDP, ApproxDP, Neighbouring, PureDP

if TYPE_CHECKING:
    from dpcurator import accounting, audit, ledger, local, mechanisms, noise
    from dpcurator.curator import Curator, CuratorLike, Release, Schema
    from dpcurator.ledger import Budget
    from dpcurator.server.client import connect

__version__ = "0.1.0"

__all__ = [
    "ZCDP",
    "ApproxDP",
    "Budget",
    "Curator",
    "CuratorLike",
    "Neighbouring",
    "PureDP",
    "Release",
    "Schema",
    "__version__",
    "accounting",
    "audit",
    "connect",
    "ledger",
    "local",
    "mechanisms",
    "noise",
]

__getattr__, __dir__ = exports(__name__, {
    "Budget": "dpcurator.ledger",
    "Curator": "dpcurator.curator",
    "CuratorLike": "dpcurator.curator",
    "Release": "dpcurator.curator",
    "Schema": "dpcurator.curator",
    "connect": "dpcurator.server.client",
    **{name: f"dpcurator.{name}" for name in
       ("accounting", "audit", "ledger", "local", "mechanisms", "noise")},
})
