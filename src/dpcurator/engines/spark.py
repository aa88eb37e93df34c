"""Spark: the bounding statement of ``_sql`` run where a DataFrame lives (pyspark, Spark SQL).

The dialect (sqlglot's "spark"): user expressions made total by the shared rule table
(``_total``: the failing operation is NULL), with Spark's entries (try_add, try_subtract,
try_multiply, log10 and log2, weekofyear); every exact sum is a SUM of DECIMAL(38,0)
(Spark's SUM of BIGINT is a BIGINT that overflows, where DuckDB's is a HUGEINT); text is
hashed through ``md5`` (hex, read back as two little-endian 32-bit words with ``conv``),
timestamps by their wall-clock microseconds; the keyed hash is ``_hash``'s, in BIGINT
arithmetic that cannot overflow.

The transport: the DataFrame is a global temporary view read by a session of the engine's own
(``newSession``: the caller's SQL settings are copied, its data and cache shared, and ANSI mode
turned off, so that an operation the rewrite did not guard gives NULL instead of failing on a
row; the statement never depends on the caller's ANSI setting). Column types come from the
DataFrame's schema, named as DuckDB names them; the hash coefficients derived from the secret
key are bound as named parameters (``:dp_key_...``, Spark 3.4+); public keys are a temporary
view of their text. Messages never quote Spark's error text (it could quote a value).

    curator = dp.Curator.from_spark(events, privacy_unit="user_id", budget=dp.PureDP(1.0))
"""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from sqlglot import exp

from dpcurator.engines import _total
from dpcurator.engines._dialect import Dialect
from dpcurator.engines._engine import SqlEngine, key_text
from dpcurator.engines._hash import WORD_BITS
from dpcurator.engines._joins import TableSet
from dpcurator.engines._results import CompiledQuery
from dpcurator.engines._trees import add, band, case, cast, mul, num, paren, shr
from dpcurator.errors import UserError
from dpcurator.query.bounding import BoundedQuery

__all__ = ["SparkDialect", "SparkEngine"]

_NAMES = {"tinyint": "TINYINT", "smallint": "SMALLINT", "int": "INTEGER", "bigint": "BIGINT",
          "float": "FLOAT", "double": "DOUBLE", "string": "VARCHAR", "boolean": "BOOLEAN",
          "date": "DATE", "timestamp": "TIMESTAMP WITH TIME ZONE", "binary": "BLOB"}


def type_name(spark_type: str) -> str:
    """A Spark type (``simpleString``) as DuckDB names it: the names the curator reads
    (TIMESTAMP_NTZ, DuckDB's TIMESTAMP, keeps Spark's name: sqlglot writes TIMESTAMP as
    Spark's TIMESTAMP, which has a time zone)."""
    if spark_type in _NAMES:
        return _NAMES[spark_type]
    if spark_type.startswith(("varchar", "char", "string")):
        return "VARCHAR"
    return spark_type.upper()  # DECIMAL(10,2); ARRAY<...>, STRUCT<...>, INTERVAL ...: other


def _call(name: str, *args: exp.Expr) -> exp.Expr:
    return exp.Anonymous(this=name, expressions=list(args))


# -- Spark's entries of the rule table (engines._total) -----------------------------------------

_TRY: dict[type[exp.Expr], str] = {exp.Add: "try_add", exp.Sub: "try_subtract",
                                   exp.Mul: "try_multiply"}


def _try_arithmetic(t: _total.Total, node: exp.Expr) -> exp.Expr:
    """Integer + - *: NULL on overflow (Spark without ANSI would wrap around)."""
    return _call(_TRY[type(node)], paren(node.this), paren(node.expression))


def _negated(node: exp.Expr) -> exp.Expr:
    return _call("try_multiply", node, exp.Neg(this=num(1)))


def _negate(t: _total.Total, node: exp.Expr) -> exp.Expr:
    return node if isinstance(node.this, exp.Literal) else _negated(node.this)


def _abs(t: _total.Total, node: exp.Expr) -> exp.Expr:
    a = node.this
    return case((exp.LT(this=a, expression=num(0)), _negated(a.copy())), default=a.copy())


def _log_call(base: exp.Expr | None, x: exp.Expr) -> exp.Expr:
    """DuckDB's one-argument log is base 10, Spark's natural: log10 and log2 by name."""
    value = base.this if isinstance(base, exp.Cast) else base
    if base is None or (isinstance(value, exp.Literal) and value.this == "10"):
        return _call("log10", x)
    if isinstance(value, exp.Literal) and value.this == "2":
        return _call("log2", x)
    return _call("log", base, x)


def _week(t: _total.Total, node: exp.Expr) -> exp.Expr:
    return _call("weekofyear", node.this)


def _day_of_week(t: _total.Total, node: exp.Expr) -> exp.Expr:
    """DuckDB's dayofweek counts from 0 (Sunday), Spark's from 1."""
    return paren(exp.Sub(this=_call("dayofweek", node.this), expression=num(1)))


def _substring(s: exp.Expr, start: exp.Expr, length: exp.Expr | None) -> exp.Expr:
    """Spark reads start 0 as 1: DuckDB's substring(s, 0, n) is Spark's (s, 1, n - 1)."""
    if length is None or (isinstance(start, exp.Literal) and start.is_number and
                          start.this != "0"):
        return exp.Substring(this=s, start=start, length=length)
    return case((exp.EQ(this=start.copy(), expression=num(0)),
                 exp.Substring(this=s.copy(), start=num(1), length=exp.Sub(
                     this=paren(length.copy()), expression=num(1)))),
                default=exp.Substring(this=s, start=start, length=length))


def _ends(t: _total.Total, node: exp.Expr) -> exp.Expr:
    """left / right with n < 0: all but the last / first -n characters (DuckDB's and
    PostgreSQL's; Spark's is empty)."""
    s, n = node.this, node.expression
    kept = exp.Greatest(this=exp.Add(this=exp.Length(this=s.copy()), expression=paren(
        n.copy())), expressions=[num(0)])
    return case((exp.LT(this=n, expression=num(0)), type(node)(this=s.copy(), expression=kept)),
                default=node)


def _to_integer(x: exp.Expr, to: exp.Expr) -> exp.Expr:
    """Spark truncates a double cast to an integer: round it half to even first, as
    DuckDB and PostgreSQL do."""
    name = _call("typeof", x.copy())
    rounded = _call("bround", exp.TryCast(this=x.copy(), to=exp.DataType.build("DOUBLE")),
                    num(0))
    return case((exp.In(this=name, expressions=[exp.Literal.string("double"),
                                                exp.Literal.string("float")]),
                 exp.TryCast(this=rounded, to=to.copy())),
                default=exp.TryCast(this=x, to=to))


def _like(t: _total.Total, node: exp.Expr) -> exp.Expr:
    """LIKE and ILIKE mean DuckDB's: a backslash is an ordinary character. Spark's LIKE
    escapes with it, and refuses a backslash before a character other than ``_``, ``%`` or
    itself when it compiles the pattern, after the charge (a bug hunt: ``LIKE '\\a'`` failed
    on every dataset once the budget was spent): each backslash is doubled, Spark's own
    escape of a backslash, so that no pattern can fail and each matches what DuckDB's does.
    (Spark's LIKE runs as a Java regular expression of ``.*``, ``.`` and quoted text: no
    nested repetition, so its recursion depth is the pattern's length, never the value's.)"""
    node = _total.literal_pattern(t, node)
    pattern = node.expression
    node.set("expression", exp.Literal.string(pattern.this.replace("\\", "\\\\")))
    return node


def _regex(t: _total.Total, node: exp.Expr) -> exp.Expr:
    """Regular expressions are refused on Spark, before anything is charged (a bug hunt).
    Spark matches them with Java's backtracking ``java.util.regex``, which recurses once per
    repetition of a group: ``regexp_matches(code, '(a|b)*c')`` was released while one
    person's code was 'ab', and with 'ab' repeated 50,000 times the executor's stack
    overflowed and the SparkContext shut down, after the charge: one person's value decided
    between a release and an error (a one-bit leak) and every later query failed. The depth
    depends on the pattern's structure (nested groups multiply it) and on Java's version, so
    no length cap on the value is safe for every pattern, and a pattern's backtracking time
    can be exponential in the value's length. A malformed pattern (``'('``) also failed only
    when Spark compiled it, after the charge. The cost: ``regexp_matches`` is not available
    on Spark; LIKE and ILIKE are (DuckDB's RE2 and PostgreSQL's engine do not recurse per
    character, and take it there)."""
    raise UserError("regular expressions (regexp_matches) are not supported on Spark: Java's "
                    "regular expressions can fail on a long value while the query runs, after "
                    "the charge; use LIKE or ILIKE (% and _ wildcards) instead")


_EXACT = 2**52  # every double of at least this magnitude is an integer (its own ceil, floor)


def _whole(t: _total.Total, node: exp.Expr) -> exp.Expr:
    """ceil and floor of a DOUBLE (or FLOAT) are that type, as on DuckDB and PostgreSQL:
    Spark's are a BIGINT, which made NaN 0 and +inf and 1e300 both 2^63 - 1 (a bug hunt:
    ``GROUP BY floor(w)`` merged partitions, ``ceil(w) > 0`` counted otherwise). NaN, +-inf
    and |x| >= 2^52 (integers already) are kept as they are; another x's BIGINT is exact and
    read back as the type, 0 with x's sign (IEEE: ceil(-0.5) is -0.0). Other types are
    Spark's own (an integer is itself; a DECIMAL's ceil is a DECIMAL)."""
    x = node.this
    kind = t.type_name(x)
    if kind not in ("DOUBLE", "FLOAT"):
        return node
    special = exp.or_(_call("isnan", x.copy()),
                      exp.GTE(this=exp.Abs(this=x.copy()), expression=num(_EXACT)), copy=False)
    zero = exp.EQ(this=type(node)(this=x.copy()), expression=num(0))
    return case((special, x.copy()),
                (zero, exp.Mul(this=paren(x.copy()), expression=exp.Literal.number("0.0"))),
                default=cast(type(node)(this=x.copy()), kind))


RULES: _total.Rules = {
    **_total.RULES,
    exp.Like: _like, exp.ILike: _like, exp.RegexpLike: _regex,
    exp.Ceil: _whole, exp.Floor: _whole,
    exp.Add: _try_arithmetic, exp.Sub: _try_arithmetic, exp.Mul: _try_arithmetic,
    exp.Neg: _negate, exp.Abs: _abs,
    exp.Log: functools.partial(_total.logarithm, call=_log_call),
    exp.Week: _week, exp.DayOfWeek: _day_of_week,
    exp.Cast: _total.cast_by_type_name("string", _to_integer),  # Spark reads '1.5' as 1
    exp.Substring: functools.partial(_total.substring, call=_substring),
    exp.Left: _total.within_reach(_ends), exp.Right: _total.within_reach(_ends),
}


class SparkDialect(Dialect):
    """Spark SQL's primitives. ``type_of`` is the engine's (the types of expressions over its
    relation, analysed: no row is read): ceil and floor ask it."""

    sqlglot = "spark"
    # Each unit's partition count by a window: Spark evaluates a CTE once per reference, so
    # the grouped count joined back would compute the pairs twice.
    partitions_by_window = True
    # Measured on 2*10^6 rows, local[2]: 3 hash exchanges down to 2 (the floor's count), the
    # DP query from 2.2x to 1.8x the two-level floor (public keys), 2.5x to 1.3x (private).
    # The cost: no partial aggregation before the shuffle, which matters where units have
    # many rows in each partition.
    distribute_rows = True
    # For the same reason the contribution profile counts by windows (the grouped form
    # measured 12% slower here: its pairs and units are each read twice).
    profile_by_window = True

    def __init__(self, type_of: _total.TypeOf | None = None) -> None:
        self.type_of = type_of
        self._totals = _total.Cache()

    def hash_kind(self, sql_type: str) -> Any:
        return "timestamp" if sql_type == "TIMESTAMP_NTZ" else super().hash_kind(sql_type)

    def total(self, text: str) -> exp.Expr:
        return self._totals.get(text, lambda t: _total.total(t, RULES, "Spark", self.type_of))

    def exact_sum(self, node: exp.Expr) -> exp.Expr:
        return exp.Sum(this=cast(node, "DECIMAL(38, 0)"))

    def pair_sum(self, node: exp.Expr) -> tuple[exp.Expr, exp.Expr]:
        """A DECIMAL sum per row is Spark's slowest aggregate: sum the value's high and low
        26 bits as BIGINTs instead, joined in DECIMAL once per pair. ``try_sum`` is NULL
        where a part would pass 2^63 (beyond 2^37 rows in one pair), never a wrapped sum:
        that pair then contributes nothing, which no sensitivity bound can be broken by."""
        high = _call("try_sum", shr(node, 26))
        low = _call("try_sum", band(node.copy(), num(2**26 - 1)))
        small = add(mul(high, num(2**26)), low)
        big = add(mul(cast(high.copy(), "DECIMAL(38, 0)"), num(2**26)), low.copy())
        return small, big

    def epoch_microseconds(self, node: exp.Expr) -> exp.Expr:
        """Wall-clock microseconds (a TIMESTAMP_NTZ's own; a TIMESTAMP's in the session's
        time zone), from its day number and time of day: no time zone is applied."""
        t = cast(node, "TIMESTAMP_NTZ")
        day = mul(_call("unix_date", cast(t.copy(), "DATE")), num(86_400_000_000))
        hours = mul(_call("hour", t.copy()), num(3_600_000_000))
        minutes = mul(_call("minute", t.copy()), num(60_000_000))
        seconds = cast(mul(_call("date_part", exp.Literal.string("SECOND"), t.copy()),
                           num(1_000_000)), "BIGINT")
        return add(day, hours, minutes, seconds)

    def digest(self, node: exp.Expr) -> exp.Expr:
        return _call("md5", node)  # 32 hex digits: bytes 0-15

    def digest_words(self, node: exp.Expr) -> list[exp.Expr]:
        def u32(first: int) -> exp.Expr:  # bytes first..first+3, little-endian
            pairs = [_call("substr", node.copy(), num(2 * (first + i) + 1), num(2))
                     for i in (3, 2, 1, 0)]
            return cast(_call("conv", _call("concat", *pairs), num(16), num(10)), "BIGINT")

        low, high = u32(0), u32(4)
        return [band(low, num(2**WORD_BITS - 1)),
                add(shr(low.copy(), WORD_BITS), mul(band(high, num(2**28 - 1)), num(4)))]

    def render(self, tree: exp.Expr) -> str:
        return super().render(tree.transform(_spark_only))


def _spark_only(node: exp.Expr) -> exp.Expr:
    """What Spark reads otherwise than the trees mean it."""
    if isinstance(node, exp.Literal) and node.is_int:
        # An integer literal is an INT in Spark, and INT * INT is an INT, which overflows
        # (wrapping around without ANSI): the trees' arithmetic is BIGINT, so are their
        # literals (user expressions are try_ calls by now, their literals left as written)
        parent = node.parent.parent if isinstance(node.parent, exp.Neg) else node.parent
        if isinstance(parent, exp.Add | exp.Sub | exp.Mul):
            return exp.Literal.number(f"{node.this}L")
    if isinstance(node, exp.TryCast):
        node.set("safe", True)  # sqlglot writes a TryCast without it as Spark's CAST
    if isinstance(node, exp.Anonymous) and node.name.lower() == "isfinite":
        return exp.true()  # Spark's dates and timestamps are all finite
    if isinstance(node, exp.Window) and not node.args.get("order"):
        # row_number() needs an order in Spark: any order of the rows will do where the
        # trees give none, and the window's own columns are one
        order = [exp.Ordered(this=p.copy()) for p in node.args.get("partition_by") or []]
        node.set("order", exp.Order(expressions=order or [exp.Ordered(this=num(1))]))
    return node


DIALECT = SparkDialect()


class SparkEngine(SqlEngine):
    """Runs bounded queries on one Spark DataFrame (local mode or a cluster)."""

    name = "spark"
    title = "Spark"
    dialect = DIALECT

    def __init__(self, frame: Any, *, label: str = "DataFrame") -> None:
        super().__init__()
        user = frame.sparkSession
        session = user.newSession()
        for key, value in user.sql("SET").collect():  # the caller's settings, ANSI off
            if key.startswith("spark.sql.") and user.conf.isModifiable(key):
                session.conf.set(key, value)
        session.conf.set("spark.sql.ansi.enabled", "false")
        self._session = session
        self._view = f"__dpcurator_source_{uuid.uuid4().hex}"
        frame.createOrReplaceGlobalTempView(self._view)
        database = user.conf.get("spark.sql.globalTempDatabase", "global_temp")
        self._relation = f"`{database}`.`{self._view}`"
        self._frame = frame
        self.label = label
        self.dialect = SparkDialect(self.type_of)

    def show_progress(self, enabled: bool) -> None:
        """Spark's console progress bar is the application's setting."""

    def _sql(self, text: str, args: Mapping[str, int] | None = None) -> Any:
        return self._session.sql(text, args=dict(args) if args else None)

    # -- schema ------------------------------------------------------------------------------

    @classmethod
    def tables(cls, frames: Mapping[str, Any]) -> TableSet:
        """A schema's tables, Spark DataFrames of one Spark application (each a global
        temporary view that the joined statement reads)."""
        engines: dict[str, SqlEngine] = {}
        for name, frame in frames.items():
            engine = cls(frame, label=str(name))
            if engines:
                engine._lock = next(iter(engines.values()))._lock
            engines[str(name)] = engine
        return TableSet(engines, "Spark")

    def quote(self, name: str) -> str:
        return _quote(name)

    def _reset_derived(self) -> None:
        self._view = ""  # the view is the first table's, dropped by it
        self.dialect = SparkDialect(self.type_of)

    def columns(self) -> Mapping[str, str]:
        if self._fixed_columns is not None:
            return self._fixed_columns
        fields = self._frame.schema.fields
        if len({f.name.lower() for f in fields}) != len(fields):
            raise UserError("the DataFrame has two columns of the same name (case ignored): "
                            "rename one (for example with withColumnRenamed)")
        return {f.name: type_name(f.dataType.simpleString()) for f in fields}

    def check_source(self) -> None:
        """A DataFrame's values have its schema's types: nothing is read here. (A source
        that can fail while it is read, such as a FAILFAST CSV reader or a Python UDF that
        raises, is the data owner's to check.)"""

    def nan_columns(self, columns: Sequence[str]) -> list[str]:
        types = self.columns()
        floats = [c for c in columns if types.get(c) in ("DOUBLE", "FLOAT")]
        if not floats:
            return []
        checks = ", ".join(f"coalesce(bool_or(isnan({_quote(c)})), false)" for c in floats)
        try:
            with self._lock:
                row = self._sql(f"SELECT {checks} FROM {self._relation}").collect()[0]
        except self._errors():  # the JVM's text could quote a value
            raise UserError(f"Spark could not read the DataFrame to check {floats} for NaN; "
                            "check that it can be read, or pass check_nan=False") from None
        return [c for c, bad in zip(floats, row, strict=True) if bad]

    def group_key_types(self, query: BoundedQuery) -> list[str]:
        """The type of each group key expression (analysed, no row is read)."""
        return self.type_of([self.dialect.group_key(k.expression) for k in query.group_keys])

    def type_of(self, nodes: Sequence[exp.Expr]) -> list[str]:
        """The type of each expression over the relation, as DuckDB names it (analysed, no
        row is read)."""
        if not nodes:
            return []
        items = ", ".join(f"{self.dialect.render(n)} AS __t{i}" for i, n in enumerate(nodes))
        schema = self._sql(f"SELECT {items} FROM {self._relation}").schema
        return [type_name(f.dataType.simpleString()) for f in schema.fields]

    # -- the transport ------------------------------------------------------------------------

    def _errors(self) -> tuple[type[BaseException], ...]:
        """pyspark's own errors, and py4j's: an error raised while a job runs (a task that
        failed, a SparkContext shut down) arrives as a ``Py4JJavaError`` whose text is the
        JVM's (a bug hunt: it escaped unmapped, quoting Spark's whole error text)."""
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException

        return (PySparkException, Py4JError)

    def _refused(self, exc: BaseException) -> str:
        return ("the query does not fit the DataFrame's column types (check the WHERE "
                f"clause, group keys and keys); Spark said: {type(exc).__name__}")

    def _fetch(self, text: str, parameters: Mapping[str, int] | None = None
               ) -> list[tuple[Any, ...]]:
        with self._lock:
            return [tuple(row) for row in self._sql(text, parameters).collect()]

    def _bind(self, compiled: CompiledQuery) -> None:
        self._sql(compiled.statement, dict.fromkeys(compiled.parameter_names, 0))  # analysed

    @contextlib.contextmanager
    def _registered(self, compiled: CompiledQuery) -> Iterator[None]:
        """The public keys as a temporary view (i, c0, c1...: their text)."""
        from pyspark.sql.functions import broadcast

        name, keys = compiled.keys_table, compiled.query.keys
        assert name is not None and keys is not None
        width = len(compiled.key_types)
        schema = ", ".join(["i BIGINT"] + [f"c{i} STRING" for i in range(width)])
        rows = [(i, *(key_text(v, "Spark") for v in key)) for i, key in enumerate(keys.values)]
        # Broadcast: Spark cannot size a DataFrame made from Python rows, and would otherwise
        # shuffle and sort every row of the data to semi-join it.
        broadcast(self._session.createDataFrame(rows, schema)).createOrReplaceTempView(name)
        try:
            yield
        finally:
            self._session.catalog.dropTempView(name)

    def _key_columns(self, compiled: CompiledQuery) -> tuple[list[str], list[str]]:
        given = [f"c{i}" for i in range(len(compiled.key_types))]
        return given, [self.dialect.render(self.dialect.safe_cast(exp.column(g), t))
                       for g, t in zip(given, compiled.key_types, strict=True)]

    def close(self) -> None:
        """Drop the engine's view (the DataFrame and its session stay the caller's)."""
        if not self._view:
            return
        with contextlib.suppress(Exception):
            self._session.catalog.dropGlobalTempView(self._view)


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
