"""Name-and-shame: the mechanism that shows what delta can mean. A lesson, never a tool.

With probability delta it publishes the data it was given, every record of it; otherwise it
publishes nothing. Whatever it publishes is either nothing (equally likely whatever the data)
or a dataset that no neighbour of the data could have produced: its privacy loss is 0 with
probability 1 - delta and +infinity with probability delta. So for every eps >= 0 it is
(eps, delta)-DP under both readings of delta (the references' "DP from A to epsilon"):
probabilistic, P[L > eps] = delta, and approximate, E[max(0, 1 - e^(eps - L))] = delta. It
satisfies the definition of (0, delta)-DP and yet, with probability delta, everyone is named.
Compare the Gaussian mechanism, whose loss passes eps often but by little
(``dpcurator.accounting.loss``; ``dpcurator explain --mechanism name-and-shame``).

The curator never runs it: the curator builds its own mechanisms from a query's plan, and its
budget refuses the guarantee this one states (``ProbabilisticDP``, which is not closed under
post-processing).
"""

from __future__ import annotations

from typing import Any

from dpcurator.accounting import Neighbouring
from dpcurator.accounting.events import DpEvent, NameAndShameEvent
from dpcurator.accounting.guarantees import ProbabilisticDP
from dpcurator.mechanisms._base import Mechanism, check_delta
from dpcurator.noise import RandomSource, sample_bernoulli

__all__ = ["NameAndShame"]


class NameAndShame(Mechanism):
    """Publish the data with probability ``delta``, nothing (None) otherwise.

    Guarantee: ``ProbabilisticDP(0, delta)``, and so (eps, delta)-DP for every eps >= 0 under
    both readings, under ``neighbouring`` (add/remove one unit by default; any relation, since
    two different datasets are never both published). Its privacy loss is 0 w.p. 1 - delta and
    +infinity w.p. delta, in both orders of every pair (``NameAndShameEvent``, which the
    accountants read exactly). Source: the references' "DP from A to epsilon" (the name-and-shame
    mechanism and its two readings of delta); Meiser, "Approximate and probabilistic
    differential privacy definitions", IACR ePrint 2018/277.

    ``release(x)`` returns ``x`` itself (the whole dataset) with probability delta, decided by
    an exact Bernoulli draw of delta's binary value, and None otherwise. It has no error to
    state: what it publishes is exact or absent.
    """

    def __init__(
        self,
        *,
        delta: float,
        neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
        source: RandomSource | None = None,
    ) -> None:
        super().__init__(neighbouring=neighbouring, source=source)
        self.delta = check_delta(delta)

    @property
    def guarantee(self) -> ProbabilisticDP:
        """(0, delta)-probabilistic DP; ``.to_approx_dp()`` gives (0, delta)-DP."""
        return ProbabilisticDP(0.0, self.delta, self.neighbouring)

    @property
    def event(self) -> DpEvent:
        """Its exact privacy loss, for the accountants (``NameAndShameEvent``)."""
        return NameAndShameEvent(self.delta)

    def release(self, x: Any) -> Any:
        """``x`` (everything) with probability delta, otherwise None."""
        named = bool(sample_bernoulli(self.delta, 1, self.source)[0])
        return x if named else None

    def __repr__(self) -> str:
        return f"NameAndShame(delta={self.delta!r})"
