"""``dpcurator query``: one DP SQL query over a CSV or Parquet file, from the shell.

    dpcurator query sales.parquet --privacy-unit customer_id --epsilon 1 \\
        --sql "SELECT region, COUNT(*) AS n, AVG(amount) AS avg FROM data GROUP BY region" \\
        --bounds amount=0:500 --keys regions.csv --json

The file is scanned in place by DuckDB. Several tables, joined in the query, are given with
``--table NAME=PATH`` (repeatable), each private table's unit or path with
``--privacy-unit TABLE=COLUMN`` or ``--privacy-unit "TABLE=COLUMN -> TABLE.COLUMN"`` and the
public ones with ``--public NAME`` (``dpcurator.query.schema``)::

    dpcurator query --table customer=customer.parquet --table orders=orders.parquet \
        --table nation=nation.parquet --privacy-unit customer=c_custkey \
        --privacy-unit "orders=o_custkey -> customer.c_custkey" --public nation \
        --sql "SELECT n_name, COUNT(*) AS n FROM orders JOIN customer ON o_custkey = \
               c_custkey JOIN nation ON c_nationkey = n_nationkey GROUP BY n_name" \
        --epsilon 1 --delta 1e-6 By default the budget is what the query spends; with
``--journal`` the charges are kept in a ledger file (SQLite, shared safely by concurrent
runs): ``--budget-epsilon`` / ``--budget-delta`` set its total when it is created, and later
runs use the stored total (a different one is refused: ``dpcurator ledger raise`` changes it).

Each value is printed beside its own interval; a SUM whose total was measured has a second
column, ``NAME_total``, the sum without the caps and the clamping with its own interval. The
release's warnings follow the table (``"warnings"`` in ``--json``). ``--explain`` shows what
the query would cost, its noise and the warnings known before spending, and charges nothing.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import typer

from dpcurator.cli._common import guarded, user_errors
from dpcurator.errors import UserError

__all__ = ["parse_bounds", "query"]


def parse_bounds(items: list[str] | None) -> dict[str, Any] | str:
    """``["amount=0:500", "age=18:99"]`` -> ``{"amount": (0.0, 500.0), ...}``; ``["auto"]``
    -> ``"auto"`` (every bound chosen from the data), ``["amount=auto"]`` -> that column's."""
    out: dict[str, Any] = {}
    if items == ["auto"]:
        return "auto"
    for item in items or []:
        column, sep, rest = item.partition("=")
        if sep and column and rest == "auto":
            out[column] = "auto"
            continue
        lo_text, colon, hi_text = rest.partition(":")
        if not sep or not colon or not column:
            raise typer.BadParameter(f"--bounds takes COLUMN=LO:HI, COLUMN=auto or auto, got "
                                     f"{item!r}")
        try:
            lo, hi = float(lo_text), float(hi_text)
        except ValueError:
            raise typer.BadParameter(
                f"--bounds {column}: LO and HI must be numbers, got {rest!r}") from None
        out[column] = (lo, hi)
    return out


def _tables(data: Path | None, tables: list[str] | None, units: list[str] | None,
            public: list[str] | None) -> tuple[Any, Any, list[str]]:
    """(the data, the privacy unit, the public tables) from the options: one file and one
    column, or ``--table NAME=PATH`` with ``--privacy-unit TABLE=UNIT`` for each private
    table."""
    if not tables:
        if public:
            raise UserError("--public names public tables among several --table; give "
                            "--table NAME=PATH for each table")
        if units and len(units) > 1:
            raise UserError("--privacy-unit is given once for one file (several are for "
                            "several --table)")
        if data is None:
            raise UserError("give the data file, or several tables with --table NAME=PATH")
        return data, units[0] if units else None, []
    if data is not None:
        raise UserError("give either the data file or --table NAME=PATH options, not both")
    sources: dict[str, str] = {}
    for item in tables:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise UserError(f"--table takes NAME=PATH, got {item!r}")
        if name.strip() in sources:
            raise UserError(f"--table names {name.strip()!r} twice")
        sources[name.strip()] = path.strip()
    declared: dict[str, str] = {}
    for item in units or []:
        table, sep, spec = item.partition("=")
        if not sep or not table.strip() or not spec.strip():
            raise UserError(f"with --table, --privacy-unit takes TABLE=COLUMN or "
                            f"'TABLE=COLUMN -> TABLE.COLUMN', got {item!r}")
        if table.strip() in declared:  # the last one won before, silently (a bug hunt)
            raise UserError(f"--privacy-unit declares {table.strip()!r} twice")
        declared[table.strip()] = spec.strip()
    return sources, declared or None, list(public or [])


def _unit_caps(rows: str | None, sums: list[str] | None) -> dict[str, Any]:
    """--max-unit-rows and --max-unit-sums COLUMN=V as ``Curator.sql``'s options."""
    out: dict[str, Any] = {}
    if rows is not None:
        out["max_unit_rows"] = _cap("--max-unit-rows", rows)
    for item in sums or []:
        column, sep, value = item.partition("=")
        try:
            number = float(value) if sep and column else None
        except ValueError:
            number = None
        if number is None and value != "auto":
            raise typer.BadParameter(f"--max-unit-sums takes COLUMN=V (a positive number) or "
                                     f"COLUMN=auto, got {item!r}")
        out.setdefault("max_unit_sums", {})[column] = value if number is None else number
    return out


def _cap(option: str, value: str | None) -> int | str | None:
    """A contribution cap: a positive integer, "auto", or None (not given: chosen)."""
    if value is None or value == "auto":
        return value
    try:
        number = int(value)
    except ValueError:
        raise typer.BadParameter(f"{option} takes a positive integer or auto, got "
                                 f"{value!r}") from None
    if number < 1:
        raise typer.BadParameter(f"{option} must be at least 1, got {number}")
    return number


def _read_keys(path: Path) -> Any:
    """The public keys file (CSV with a header, or Parquet) as a DataFrame; a UserError naming
    the file when it cannot be read (the engine's message is not echoed)."""
    import duckdb

    if not path.is_file():
        raise UserError(f"--keys: no such file: {path}")
    reader = "read_parquet" if path.suffix.lower() in (".parquet", ".pq") else "read_csv"
    literal = "'" + str(path).replace("'", "''") + "'"
    con = duckdb.connect()
    try:
        return con.execute(f"SELECT * FROM {reader}({literal})").fetchdf()
    except duckdb.Error as exc:
        raise UserError(f"--keys: cannot read {path} ({type(exc).__name__}); give a CSV file "
                        "with a header line naming the key columns, or a Parquet file") from None
    finally:
        con.close()


def _budget(journal: str | None, epsilon: float, delta: float,
            budget_epsilon: float | None, budget_delta: float | None) -> Any:
    """The budget the query charges: the ledger's stored total when it exists and no total is
    given; otherwise the total given (default: what this query spends), which a new ledger
    stores and an existing one must already hold. ``journal`` is a file or a
    ``postgresql://`` URL."""
    import dpcurator as dp
    from dpcurator.ledger import is_postgres_url

    if journal is not None and budget_epsilon is None and budget_delta is None:
        if Path(journal).is_file():
            return dp.Budget.open(journal)
        if is_postgres_url(journal):
            try:
                return dp.Budget.open(journal)
            except UserError:
                pass  # no ledger there yet: created below with this query's total
    total_epsilon = budget_epsilon if budget_epsilon is not None else epsilon
    total_delta = budget_delta if budget_delta is not None else delta
    total = dp.ApproxDP(total_epsilon, total_delta) if total_delta > 0 else dp.PureDP(
        total_epsilon)
    return dp.Budget(total, journal=journal) if journal is not None else total


def _key_values(keys: Path | None) -> list[Any] | None:
    """The public keys file's rows as the service takes them (one value, or a list, each)."""
    if keys is None:
        return None
    frame = _read_keys(keys)
    return [list(row) if len(row) > 1 else row[0]
            for row in frame.itertuples(index=False, name=None)]


def _remote_explain(server: str, token: str, dataset: str, sql: str, epsilon: float,
                    delta: float, noise: str | None, keys: Path | None,
                    intervals: str | None, total_share: float | None,
                    bounding: str | None) -> dict[str, Any]:
    from dpcurator.server.client import connect

    privacy = {"epsilon": epsilon, "delta": delta or None, "noise": noise,
               "keys": _key_values(keys), "intervals": intervals, "total_share": total_share,
               "bounding": bounding}
    return connect(server, token, dataset=dataset).explain(
        sql, **{k: v for k, v in privacy.items() if v is not None})


def _remote_query(server: str, token: str, dataset: str, sql: str, epsilon: float,
                  delta: float, noise: str | None, confidence: float,
                  keys: Path | None, intervals: str | None,
                  total_share: float | None, bounding: str | None) -> dict[str, Any]:
    from dpcurator.server.client import connect

    key_values = _key_values(keys)
    curator = connect(server, token, dataset=dataset)
    return curator.sql(sql, epsilon=epsilon, delta=delta or None, noise=noise,
                       confidence=confidence, keys=key_values, intervals=intervals,
                       total_share=total_share, bounding=bounding)


def _show_remote(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(result))
        return
    from rich.console import Console
    from rich.table import Table

    rows, intervals = result.get("rows", []), result.get("intervals", [])
    level = result.get("confidence", 0.95)
    table = Table(title=f"DP answer ({level:.0%} intervals)"
                        + (" (cached, free)" if result.get("cached") else ""))
    names = list(rows[0]) if rows else []
    for name in names:
        table.add_column(name, justify="right")
        if intervals and name in intervals[0]:
            table.add_column(f"{level:.0%} interval", justify="right")
    for row, bounds in zip(rows, intervals or [{}] * len(rows), strict=False):
        cells = []
        for name in names:
            value = row[name]
            cells.append(_cell(value) if value is not None else "-")
            if name in bounds:
                low, high = bounds[name]
                cells.append("-" if low is None else f"[{_cell(low)}, {_cell(high)}]")
        table.add_row(*cells)
    console = Console()
    console.print(table)
    _print_warnings(console, result.get("warnings") or [])
    console.print(f"privacy spent: {result.get('privacy')}  (query {result.get('query_id')})")
    console.print(f"budget remaining: {result.get('remaining')}")


def _print_warnings(console: Any, warnings: list[str]) -> None:
    """The release's warnings, after its table: a short block, one sentence a line."""
    if warnings:
        console.print("warnings:", markup=False)
        for sentence in warnings:
            console.print(f"  - {sentence}", markup=False, highlight=False)


def _print_kinds(console: Any, release: Any) -> None:
    """What the total intervals cover, under the table (the warnings say the rest)."""
    kinds = release.interval_kinds
    counts = [n for n in release.aggregate_names if kinds[n] == "total"]
    totals = list(release.total_columns.values())
    if not counts and not totals:
        return
    import statistics

    caps = ([f"{release.max_unit_rows:,} rows"] if release.max_unit_rows else []) + [
        f"a sum of |{c}| of {_cell(v)}" for c, v in release.max_unit_sums.items()]
    within = f"for units of at most {' and '.join(caps)}" if caps else \
        "each row its own unit: no cap removes a row"
    parts = []
    if counts:
        bounded = {n: release.interval(n, kind="bounded") for n in counts}
        widths = ", ".join(f"{n}: {_cell(float(statistics.median((h - lo).tolist())))}"
                           for n, (lo, h) in bounded.items())
        parts.append(f"{', '.join(counts)}: intervals of the total count (without the caps), "
                     f"which hold the value; the bounded intervals' median width: {widths}")
    if totals:
        parts.append(f"{', '.join(totals)}: the sum without the caps and the clamping, its "
                     "own estimate and interval")
    console.print(f"{'; '.join(parts)}; {within}", markup=False)


def _explained_json(explained: dict[str, Any]) -> dict[str, Any]:
    """``Curator.explain``'s dict as JSON: the cost as numbers, the plan left out."""
    cost = explained.get("cost")
    out = {k: v for k, v in explained.items() if k not in ("plan", "cost")}
    out["cost"] = {"guarantee": type(cost).__name__,
                   **{n: getattr(cost, n) for n in ("epsilon", "delta", "rho")
                      if hasattr(cost, n)}}
    loaded: dict[str, Any] = json.loads(json.dumps(out, default=str))
    return loaded


def _show_explained(explained: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(explained))
        return
    from rich.console import Console

    console = Console()
    console.print(f"cost (nothing charged): {explained.get('cost')}", markup=False)
    for name, measures in (explained.get("noise") or {}).items():
        for measure in measures:
            error = measure.get("error_95")
            console.print(f"{name}: {measure.get('noise')} on {measure.get('measure')}, "
                          f"95% error {_cell(error) if error is not None else '-'}",
                          markup=False)
    for key in ("bounds_to_choose", "outer_caps_to_choose"):
        if explained.get(key):
            console.print(f"{key.replace('_', ' ')}: {explained[key]}", markup=False)
    _print_warnings(console, explained.get("warnings") or [])


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:,.4g}"
    return str(value)


@guarded
def query(
    data: Path | None = typer.Argument(
        None, help="CSV or Parquet file (scanned in place), or with --server a dataset's "
                   "name; or none, with --table."),
    sql: str = typer.Option(..., "--sql", help="DP SQL: SELECT ... FROM data ..."),
    privacy_unit: list[str] | None = typer.Option(
        None, "--privacy-unit", help="Column identifying whose data a row is; with --table, "
                                     "TABLE=COLUMN or 'TABLE=COLUMN -> TABLE.COLUMN' for each "
                                     "private table (repeatable)."),
    table_options: list[str] | None = typer.Option(
        None, "--table", help="A table of several, NAME=PATH (CSV or Parquet; repeatable), "
                              "joined in the query by NAME."),
    public: list[str] | None = typer.Option(
        None, "--public", help="A public table among the --table ones (repeatable)."),
    epsilon: float = typer.Option(..., "--epsilon", help="Epsilon this query spends."),
    delta: float = typer.Option(0.0, "--delta", help="Delta (needed for private keys)."),
    bounds: list[str] | None = typer.Option(
        None, "--bounds", help="Clamping bounds COLUMN=LO:HI (repeatable); a column given "
                               "none has its bounds chosen from the data under DP with 10% "
                               "of --epsilon, as have the caps below."),
    max_partitions: str | None = typer.Option(
        None, "--max-partitions", help="Partitions one unit may contribute to (default: "
                                       "chosen from the data under DP)."),
    max_rows_per_partition: str | None = typer.Option(
        None, "--max-rows-per-partition", help="Rows one unit may contribute per group "
                                               "(default: chosen from the data under DP)."),
    bounds_share: float | None = typer.Option(
        None, "--bounds-share", help="The share of --epsilon spent choosing the bounds "
                                     "left to the data, in (0, 1) (default 0.1)."),
    bounding: str | None = typer.Option(
        None, "--bounding", help="How the caps apply: rescale, sample, or unit: caps on "
                                 "each unit's total over all groups (COUNT(*) and SUM only; "
                                 "--max-unit-rows, --max-unit-sums). Default: unit where a "
                                 "COUNT(*)/SUM query gives no bounds and no private keys, "
                                 "else rescale."),
    max_unit_rows: str | None = typer.Option(
        None, "--max-unit-rows", help="Under --bounding unit (asked for by this alone where "
                                      "it can answer): rows one unit may contribute in all "
                                      "(default: chosen from the data under DP)."),
    max_unit_sums: list[str] | None = typer.Option(
        None, "--max-unit-sums", help="Under --bounding unit (asked for by this alone where "
                                      "it can answer): COLUMN=V, the most one unit's sum of "
                                      "|COLUMN| may be (repeatable; default: chosen from the "
                                      "data under DP)."),
    interval_kind: str | None = typer.Option(
        None, "--intervals", help="What the intervals of COUNT(*) and SUM cover: 'total' "
                                  "(the answer without the caps and the clamping, for 10% of "
                                  "--epsilon) or 'bounded' (the default)."),
    total_share: float | None = typer.Option(
        None, "--total-share", help="The share of --epsilon the total intervals spend, in "
                                    "(0, 1) (default 0.1)."),
    keys: Path | None = typer.Option(
        None, "--keys", help="CSV/Parquet of public group keys (header = key columns)."),
    confidence: float = typer.Option(0.95, "--confidence", help="Interval level."),
    noise: str | None = typer.Option(None, "--noise", help="laplace (default) or gaussian."),
    one_row_per_person: bool = typer.Option(
        False, "--one-row-per-person",
        help="Row-level privacy: assume every row is a different person."),
    journal: str | None = typer.Option(
        None, "--journal", help="Ledger: a SQLite file, or a postgresql:// URL; charges "
                                "persist across invocations."),
    budget_epsilon: float | None = typer.Option(
        None, "--budget-epsilon",
        help="Total epsilon of a new ledger (default: --epsilon; an existing ledger keeps its "
             "stored total)."),
    budget_delta: float | None = typer.Option(
        None, "--budget-delta", help="Total delta of a new ledger (default: --delta)."),
    allow_large_delta: bool = typer.Option(
        False, "--allow-large-delta",
        help="Accept a delta above 0.001 (a delta of 1/n or more can publish records as "
             "they are)."),
    server: str | None = typer.Option(
        None, "--server", help="A curator service's URL: DATA is then a dataset's name there."),
    token: str | None = typer.Option(
        None, "--token", envvar="DPCURATOR_TOKEN",
        help="Your token for --server (or the DPCURATOR_TOKEN environment variable)."),
    explain: bool = typer.Option(
        False, "--explain", help="Show the query's cost, noise and the warnings known before "
                                 "spending; charge nothing and read no row."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Answer one DP SQL query about a file, or a dataset of a curator service (--server),
    with intervals and the privacy spent."""
    from dpcurator.curator import Curator

    if server is not None:
        local = {"--privacy-unit": privacy_unit, "--bounds": bounds, "--journal": journal,
                 "--table": table_options, "--public": public,
                 "--budget-epsilon": budget_epsilon, "--budget-delta": budget_delta,
                 "--one-row-per-person": one_row_per_person or None,
                 "--allow-large-delta": allow_large_delta or None,
                 "--max-partitions": max_partitions,
                 "--max-rows-per-partition": max_rows_per_partition,
                 "--bounds-share": bounds_share,
                 "--max-unit-rows": max_unit_rows, "--max-unit-sums": max_unit_sums}
        with user_errors(as_json):
            given = [name for name, value in local.items() if value]
            if given:
                raise UserError(f"{', '.join(given)} belong to the curator's configuration, "
                                "not to a query sent with --server")
            if not token:
                raise UserError("--server needs --token (or DPCURATOR_TOKEN)")
            if data is None:
                raise UserError("with --server, give the dataset's name")
            if explain:
                explained = _remote_explain(server, token, str(data), sql, epsilon, delta,
                                            noise, keys, interval_kind, total_share, bounding)
            else:
                remote = _remote_query(server, token, str(data), sql, epsilon, delta, noise,
                                       confidence, keys, interval_kind, total_share,
                                       bounding)
        if explain:
            _show_explained(explained, as_json)
        else:
            _show_remote(remote, as_json)
        return
    with user_errors(as_json):  # --explain charges nothing: no ledger is opened or made
        source, unit, public_tables = _tables(data, table_options, privacy_unit, public)
        budget = _budget(None if explain else journal, epsilon, delta, budget_epsilon,
                         budget_delta)
        with warnings.catch_warnings(record=True) as owner_checks:
            warnings.simplefilter("always", UserWarning)
            curator = Curator(
                source, privacy_unit=unit, public=public_tables,
                one_row_per_person=one_row_per_person,
                budget=budget, max_partitions=_cap("--max-partitions", max_partitions),
                max_rows_per_partition=_cap("--max-rows-per-partition", max_rows_per_partition),
                confidence=confidence, auto_bounds_share=bounds_share,
                allow_large_delta=allow_large_delta, intervals=interval_kind,
                total_share=total_share, bounding=bounding)
        for check in owner_checks:  # the data owner's check of several tables: on stderr
            typer.echo(f"data owner's check: {check.message}", err=True)
        if explain:
            explained = _explained_json(curator.explain(
                sql, epsilon=epsilon, delta=delta or None, bounds=parse_bounds(bounds),
                keys=_read_keys(keys) if keys is not None else None, noise=noise,
                **_unit_caps(max_unit_rows, max_unit_sums)))
        else:
            if not as_json:
                curator.show_progress(True)
            release = curator.sql(sql, epsilon=epsilon, delta=delta or None,
                                  bounds=parse_bounds(bounds),
                                  keys=_read_keys(keys) if keys is not None else None,
                                  noise=noise, **_unit_caps(max_unit_rows, max_unit_sums))
    if explain:
        _show_explained(explained, as_json)
        return
    result = release.to_dict()
    result["remaining"] = {k: v for k, v in vars(curator.remaining).items() if v is not None}
    if as_json:
        typer.echo(json.dumps(result))
        return
    from rich.console import Console
    from rich.table import Table

    level = release.confidence
    table = Table(title=f"DP answer ({level:.0%} intervals)")
    for column in release.group_columns:
        table.add_column(column)
    printed = list(release.interval_kinds)  # each value column, beside its own interval
    for name in printed:
        table.add_column(name, justify="right")
        table.add_column(f"{level:.0%} interval", justify="right")
    intervals = release.intervals()
    for i, (key, row) in enumerate(zip(release.keys, release.rows(), strict=True)):
        cells = [str(v) for v in key]
        for name in printed:
            low, high = intervals[name]
            cells.append("-" if row[name] is None else _cell(float(row[name])))
            cells.append("-" if math.isnan(low[i]) else
                         f"[{_cell(float(low[i]))}, {_cell(float(high[i]))}]")
        table.add_row(*cells)
    console = Console()
    console.print(table)
    _print_kinds(console, release)
    _print_warnings(console, list(release.warnings))
    console.print(f"privacy spent: {release.privacy}")
    if release.bounds_chosen is not None:
        chosen = {k: v for k, v in release.bounds_chosen.items() if k != "method"}
        console.print(f"bounds chosen from the data (part of the privacy spent): {chosen}")
    console.print(f"budget remaining: {result['remaining']}")
