"""``Schema``: several tables handed to one curator, with how each private row reaches its unit.

    schema = dp.Schema(
        {"customer": "customer.parquet", "orders": orders_df, "lineitem": "lineitem.parquet",
         "nation": nation_df},
        privacy_unit={"customer": "c_custkey",
                      "orders": "o_custkey -> customer.c_custkey",
                      "lineitem": "l_orderkey -> orders.o_orderkey"},
        public=["nation"])
    curator = dp.Curator(schema, budget=dp.PureDP(3))

is the same as ``dp.Curator({...}, privacy_unit={...}, public=[...], budget=...)``. The
declaration is checked against the tables when the curator is made
(``dpcurator.query.schema.declare``), and the data owner's check counts the rows whose path is
broken (``Curator.excluded``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dpcurator.errors import UserError

__all__ = ["Schema", "schema_parts"]


@dataclass(frozen=True)
class Schema:
    """Tables (``{name: data}``), each private table's unit column or path
    (``privacy_unit``), and the public tables; ``connection``: the tables are names of a
    DuckDB connection's tables (``Curator.from_duckdb``)."""

    tables: Mapping[str, Any]
    privacy_unit: Mapping[str, str] | None = None
    public: Any = ()
    connection: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.tables, Mapping) or not self.tables:
            raise UserError("Schema needs its tables as a mapping {name: data}")
        for name in self.tables:
            if not isinstance(name, str) or not name.isidentifier():
                raise UserError(f"a table's name must be a simple name such as 'orders', "
                                f"got {name!r}")


def schema_parts(data: Any, privacy_unit: Any, public: Any, connection_table: Any
                 ) -> tuple[Mapping[str, Any], Any, Any, Any] | None:
    """(tables, privacy_unit, public, connection) where ``data`` holds several tables; None
    for one table. Refuses a mix of the two forms."""
    if isinstance(data, Schema):
        if privacy_unit is not None or (public not in ((), None, [])):
            raise UserError("give privacy_unit and public in the Schema or to the Curator, "
                            "not both")
        return data.tables, data.privacy_unit, data.public or (), data.connection
    if isinstance(data, Mapping):
        Schema(data)  # checks the names
        if connection_table is not None:
            raise UserError("connection_table is for one table")
        return data, privacy_unit, public or (), None
    if isinstance(privacy_unit, Mapping):
        raise UserError("privacy_unit maps tables to units only for several tables: give the "
                        "data as {name: data, ...} (or a Schema), or privacy_unit as a column")
    if public not in ((), None, []):
        raise UserError("public names public tables of several tables; this curator has one")
    return None
