"""The curator: DP answers to aggregate questions about one table, within one budget.

    >>> import dpcurator as dp
    >>> from dpcurator.curator import Curator
    >>> curator = Curator("sales.parquet", privacy_unit="customer_id",
    ...                   budget=dp.ApproxDP(1.0, 1e-6))                 # doctest: +SKIP
    >>> release = curator.sql(
    ...     "SELECT category, COUNT(*) AS n, AVG(amount) AS mean_amount "
    ...     "FROM data GROUP BY category",
    ...     epsilon=0.5, delta=1e-7, bounds={"amount": (0, 500)})        # doctest: +SKIP
    >>> release.to_pandas(intervals=True)                                # doctest: +SKIP
"""

from dpcurator.curator._privacy import PrivacyRequest
from dpcurator.curator._schema import Schema
from dpcurator.curator._session import Curator, CuratorQuery, PreparedQuery, ResolvedQuery
from dpcurator.curator.protocol import CuratorLike
from dpcurator.curator.release import Release

__all__ = ["Curator", "CuratorLike", "CuratorQuery", "PreparedQuery", "PrivacyRequest",
           "Release", "ResolvedQuery", "Schema"]
