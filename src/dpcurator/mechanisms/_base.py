"""What every mechanism shares: parameter checks, the release contract, secure defaults."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import numpy.typing as npt

from dpcurator import _validation as check
from dpcurator.accounting import ZCDP, ApproxDP, Guarantee, Neighbouring, PureDP
from dpcurator.accounting.events import ApproxDPEvent, DpEvent, PureDPEvent, ZCDPEvent
from dpcurator.errors import UserError
from dpcurator.noise import RandomSource, resolve_source

ArrayLike = float | int | npt.ArrayLike


def check_positive(name: str, value: Any) -> float:
    """A finite number > 0, or a ValueError naming ``name``."""
    return check.positive(name, value, wrong_type=UserError)


def check_delta(value: Any) -> float:
    """A number in (0, 1), or a ValueError naming delta."""
    return check.unit_interval("delta", value, wrong_type=UserError)


def check_alpha(value: Any) -> float:
    """A confidence-interval miss probability in (0, 1): 0.05 for a 95% interval."""
    return check.unit_interval(
        "alpha", value, hint=" (0.05 for a 95% interval)", wrong_type=UserError
    )


def as_finite_array(name: str, x: ArrayLike, dtype: Any = np.float64) -> npt.NDArray[Any]:
    """The input as an array; refuses NaN and infinities without echoing any value."""
    try:
        arr = np.asarray(x, dtype=dtype)
    except (TypeError, ValueError):
        raise UserError(f"{name} must be numeric (a number or an array of numbers)") from None
    if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
        raise UserError(f"{name} must be finite: it contains NaN or infinite entries")
    return arr


class Mechanism(ABC):
    """A randomized algorithm with a stated privacy guarantee and a stated error.

    Subclasses document three things: the guarantee, the neighbouring relation it holds under,
    and the source of its analysis (paper and theorem).

    ``source`` selects the randomness: leave it ``None`` for the cryptographically secure
    default. Passing a ``SeededRandom`` makes the noise reproducible and INSECURE; it is for
    tests and benchmarks only.
    """

    def __init__(
        self,
        *,
        neighbouring: Neighbouring = Neighbouring.ADD_REMOVE,
        source: RandomSource | None = None,
    ) -> None:
        if not isinstance(neighbouring, Neighbouring):
            raise UserError(
                f"neighbouring must be Neighbouring.ADD_REMOVE or Neighbouring.REPLACE, "
                f"got {neighbouring!r}"
            )
        self.neighbouring = neighbouring
        self._source = source

    @property
    def source(self) -> RandomSource:
        return resolve_source(self._source)

    @property
    @abstractmethod
    def guarantee(self) -> Guarantee:
        """The privacy guarantee of one call to ``release`` on one query answer."""

    @property
    def event(self) -> DpEvent:
        """What one release does, as an accounting event (see ``dpcurator.accounting``).

        Accountants turn it into their currency (a PLD, an RDP curve, ...); its neighbouring
        relation is this mechanism's ``neighbouring``. Mechanisms whose noise has an exact
        profile (discrete Laplace and Gaussian, randomized response) return that profile;
        the others return their guarantee as a plain event, which is sound but composes less
        tightly.
        """
        g = self.guarantee
        if isinstance(g, PureDP):
            return PureDPEvent(g.epsilon)
        if isinstance(g, ApproxDP):
            return ApproxDPEvent(g.epsilon, g.delta)
        if isinstance(g, ZCDP):
            return ZCDPEvent(g.rho)
        raise NotImplementedError(f"no event for a {type(g).__name__} guarantee")

    @abstractmethod
    def release(self, x: Any) -> Any:
        """Release ``x`` privately: a scalar or numpy array in, the same shape out."""
