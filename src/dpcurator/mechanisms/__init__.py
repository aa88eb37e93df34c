"""Mechanisms: each knows its privacy guarantee (with its neighbouring relation) and its error.

Additive noise (exact, on a grid for real values): ``Laplace``, ``DiscreteLaplace``,
``Gaussian``, ``DiscreteGaussian``. Selection: ``Exponential``, ``PermuteAndFlip``,
``ReportNoisyMax``. Thresholding: ``SparseVector``. Surveys: ``RandomizedResponse``. A
lesson, never used by the curator: ``NameAndShame`` (what delta can mean).
"""

from dpcurator.mechanisms._base import Mechanism
from dpcurator.mechanisms._tails import CountIntervals, NoiseTails
from dpcurator.mechanisms.exponential import Exponential, PermuteAndFlip, ReportNoisyMax
from dpcurator.mechanisms.gaussian import DiscreteGaussian, Gaussian
from dpcurator.mechanisms.laplace import DiscreteLaplace, Laplace
from dpcurator.mechanisms.name_and_shame import NameAndShame
from dpcurator.mechanisms.randomized_response import Estimate, RandomizedResponse
from dpcurator.mechanisms.sparse_vector import SparseVector

__all__ = [
    "CountIntervals",
    "DiscreteGaussian",
    "DiscreteLaplace",
    "Estimate",
    "Exponential",
    "Gaussian",
    "Laplace",
    "Mechanism",
    "NameAndShame",
    "NoiseTails",
    "PermuteAndFlip",
    "RandomizedResponse",
    "ReportNoisyMax",
    "SparseVector",
]
