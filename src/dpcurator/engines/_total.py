"""User expressions made total: one pass, one rule table, one meaning on every engine.

A user expression (a WHERE filter, a computed group key) runs after the charge, on every row,
so no value may make it raise. This pass rewrites the plan's canonical expression
(``dpcurator.query.expressions``: DuckDB text of the checked scalar subset) bottom-up, node
by node, through a rule table from sqlglot node type to handler, in the manner of sqlglot's
``Generator.TRANSFORMS``: ``RULES`` holds the rules every engine shares, and each engine's
table is ``{**RULES, ...}`` with its own entries where its SQL differs (DuckDB in
``engines.duckdb``, PostgreSQL in ``engines._postgres_expressions``, Spark in
``engines.spark``). A handler receives the node with its children already made total, and
returns the node's total form. A node type that no entry covers is refused with a
``UserError`` when the query is validated, before anything is charged.

The meaning, the same on every engine: **the failing operation is NULL**, and the NULL then
propagates by SQL's ordinary three-valued logic (``NULL OR TRUE`` is TRUE, ``NOT NULL`` is
NULL, a WHERE keeps a row only where its filter is TRUE). One failing operation never
nulls the whole expression. An operation fails where:

- a divisor is zero: ``/``, ``//`` and ``%`` (doubles included: ``1.0 / 0.0`` is NULL, not
  inf);
- an integer result does not fit its type: ``+ - *``, unary minus, ``abs``, ``//``;
- a value does not convert: every ``CAST`` is ``TRY_CAST``, with one meaning where the
  engines' own differ: text converts to an integer type only where it is an optional sign
  and digits (blanks around allowed: not '1.5', '1e3', '0x10' or '1_000'), to a double only
  where it is a decimal number or inf, infinity or nan (not '1_0', '0x10', '1d'); a double
  rounds to an integer half to even, a decimal half away from zero; NULL where an integer is
  out of range (text beyond the double range reads as +-inf, IEEE, as below);
- the argument is outside the function's domain: ``ln``, ``log``, ``log10``, ``log2`` of
  x <= 0 (and ``log(b, x)`` for a base b <= 0 or b = 1); ``sqrt`` of x < 0; ``power(a, b)``
  with a = 0 and b < 0, or a < 0 and b a finite non-integer; ``substring`` with a negative
  length; a date part of an infinite date;
- a pattern is malformed (only DuckDB accepts a pattern that is not a literal; the other
  engines refuse it when the query is validated).

Doubles are IEEE: an operation whose exact result lies outside the double range gives +-inf
(``1e308 * 10``, ``exp(1000)``, ``power(10.0, 400)``), one below it gives 0 or a subnormal,
and NaN and +-inf flow through as IEEE says (``ln('inf')`` is inf, ``sqrt('NaN')`` is NaN):
that is what DuckDB and Spark compute natively and what PostgreSQL, which raises there, is
given by its rules. NaN compares above every number on all three engines, so the domain
guards (``x > 0``, ``x >= 0``) let NaN through, to a NaN result.

Functions mean what DuckDB's mean (the canonical dialect), also at their edges: ``log`` is
base 10; ``substring`` counts a negative start from the end and 0 as the place before the
first character; ``left`` and ``right`` of a negative n keep all but the last (first) -n
characters; ``week`` is ISO, ``dayofweek`` counts from 0 (Sunday). Known differences left:
``//`` of doubles (DuckDB divides, Spark and PostgreSQL refuse the query), ``upper`` and
``lower`` of non-ASCII text under a PostgreSQL database's C locale, a cast of a DECIMAL to
an integer on Spark (truncated), and on PostgreSQL NULL for a double product, quotient or
power within 0.1% of the double range's edges (where its guards cannot tell).

The table's shape: ``Rules = Mapping[type[exp.Expr], Handler]``, a handler being
``(Total, node) -> node``; ``Total.apply`` looks a node's type up along its MRO (so
``TryCast`` takes ``Cast``'s entry), and a rule may apply the table to a node it builds
(``t.apply(exp.Neg(...))``: the engine's own total negation). Parametrised rules
(``logarithm``, ``substring``, ``cast_by_type_name``) take the engine's SQL for the one call
that differs, so an override is one entry, never a copy of the rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from sqlglot import exp

from dpcurator.engines._trees import case, num, paren, width_bucket_case
from dpcurator.errors import InternalError, UserError
from dpcurator.query import expressions as ex

__all__ = ["RULES", "Handler", "Rules", "Total", "TypeOf", "cast_by_type_name", "keep", "total"]

TypeOf = Callable[[Sequence[exp.Expr]], list[str]]
Handler = Callable[["Total", exp.Expr], exp.Expr]
Rules = Mapping[type[exp.Expr], Handler]


class Total:
    """One run of the pass: an engine's rule table and, where its rules need the types of
    subexpressions (PostgreSQL), the engine's ``type_of`` (it reads no row)."""

    def __init__(self, rules: Rules, engine: str, type_of: TypeOf | None = None) -> None:
        self.rules = rules
        self.engine = engine
        self.type_of = type_of

    def type_name(self, node: exp.Expr) -> str:
        if self.type_of is None:
            raise InternalError(f"a rule for {self.engine} asked for a type; this is a bug")
        return self.type_of([node])[0]

    def rewrite(self, node: exp.Expr) -> exp.Expr:
        """The node's total form, its children first (the node is changed in place)."""
        for key, value in list(node.args.items()):
            if isinstance(value, exp.Expr):
                node.set(key, self.rewrite(value))
            elif isinstance(value, list):
                node.set(key, [self.rewrite(v) if isinstance(v, exp.Expr) else v
                               for v in value])
        return self.apply(node)

    def apply(self, node: exp.Expr) -> exp.Expr:
        """The rule for one node whose children are total already (also for nodes that a
        rule builds, as ``t.apply(exp.Neg(this=a))``: the engine's total negation)."""
        for kind in type(node).__mro__:
            handler = self.rules.get(kind)
            if handler is not None:
                return handler(self, node)
            if kind is exp.Expr:
                break
        raise UserError(f"{ex.describe(node)} is not supported on {self.engine}")


def total(text: str, rules: Rules, engine: str, type_of: TypeOf | None = None) -> exp.Expr:
    """The canonical expression ``text`` as an expression that no row can make raise."""
    node = ex.tree_of(text)  # the plan's tree (a copy), parsed once where it entered
    ex.check_scalar(node, "expression")  # the plan was checked; check again, cheaply
    node = node.transform(lambda n: width_bucket_case(n) if isinstance(n, exp.WidthBucket)
                          else n)
    return Total(rules, engine, type_of).rewrite(node)


# -- shared rules -------------------------------------------------------------------------------


def keep(t: Total, node: exp.Expr) -> exp.Expr:
    """Cannot raise once its arguments cannot: logic, comparisons, CASE, NULL handling, text."""
    return node


def refuse(t: Total, node: exp.Expr) -> exp.Expr:
    raise UserError(f"{ex.describe(node)} is not supported on {t.engine}")


def when(condition: exp.Expr, value: exp.Expr) -> exp.Expr:
    """CASE WHEN condition THEN value END: NULL where the condition is not TRUE."""
    return case((condition, value))


def double(node: exp.Expr) -> exp.Expr:
    """A number as a DOUBLE (TRY_CAST: PostgreSQL writes it as its CAST, whose own rules
    guard what they cast)."""
    return exp.TryCast(this=node, to=exp.DataType.build("DOUBLE"))


# The text that converts: to an integer, a sign and digits; to a double, a decimal number or
# inf, infinity or nan (any case); blanks around either. PostgreSQL checks these before its
# casts; DuckDB and Spark, whose own casts read more ('1.5', '0x10', '1_000', '1d'), too.
INTEGER_TEXT = r"^\s*[+-]?[0-9]{1,40}\s*$"
NUMBER_TEXT = r"^\s*[+-]?([0-9]{1,40}(\.[0-9]{0,40})?|\.[0-9]{1,40})([eE][+-]?[0-9]{1,4})?\s*$"
SPECIAL_TEXT = r"(?i)^\s*[+-]?(inf|infinity|nan)\s*$"
_INTEGERS = {exp.DataType.Type.TINYINT, exp.DataType.Type.SMALLINT, exp.DataType.Type.INT,
             exp.DataType.Type.BIGINT}
_DOUBLES = {exp.DataType.Type.DOUBLE, exp.DataType.Type.FLOAT}


def _try_cast(t: Total, node: exp.Expr) -> exp.Expr:
    return exp.TryCast(this=node.this, to=node.args["to"])


def cast_by_type_name(text: str, to_integer: Callable[[exp.Expr, exp.Expr], exp.Expr] =
                      lambda x, to: exp.TryCast(this=x, to=to)) -> Handler:
    """CAST as TRY_CAST, where the engine's own cast to an integer type is laxer than the
    meaning (text converts only where it is a sign and digits, blanks around; a number
    rounds as ``to_integer`` says): the argument's type is the engine's ``typeof``, a
    constant, named ``text`` for text."""
    def matches(x: exp.Expr, pattern: str) -> exp.Expr:
        return exp.RegexpLike(this=exp.TryCast(this=x.copy(), to=exp.DataType.build("TEXT")),
                              expression=exp.Literal.string(pattern))

    def rule(t: Total, node: exp.Expr) -> exp.Expr:
        x, to = node.this, node.args["to"]
        if isinstance(to, exp.DataType) and to.this in _INTEGERS:
            syntax, value = matches(x, INTEGER_TEXT), to_integer(x, to)
        elif isinstance(to, exp.DataType) and to.this in _DOUBLES:
            syntax = exp.or_(matches(x, NUMBER_TEXT), matches(x, SPECIAL_TEXT), copy=False)
            value = exp.TryCast(this=x, to=to)
        else:
            return exp.TryCast(this=x, to=to)
        type_name = exp.Anonymous(this="typeof", expressions=[x.copy()])
        return when(exp.or_(exp.NEQ(this=type_name, expression=exp.Literal.string(text)),
                            paren(syntax), copy=False), value)
    return rule


def _divide(t: Total, node: exp.Expr) -> exp.Expr:
    """DuckDB's ``/`` is a double division, whatever the operands; NULL by zero."""
    a, b = double(node.this), double(node.expression)
    return when(exp.NEQ(this=b, expression=num(0)),
                exp.Div(this=a.copy(), expression=b.copy()))


def _int_divide(t: Total, node: exp.Expr) -> exp.Expr:
    """a // b: NULL by zero; by -1 it is the engine's total negation (MIN // -1 overflows)."""
    a, b = node.this, node.expression
    return case((exp.EQ(this=b, expression=exp.Neg(this=num(1))),
                 t.apply(exp.Neg(this=paren(a.copy())))),
                default=exp.IntDiv(this=paren(a), expression=exp.Nullif(
                    this=b.copy(), expression=num(0))))


def _modulo(t: Total, node: exp.Expr) -> exp.Expr:
    """a % b: NULL by zero (MIN % -1 is 0 on every engine)."""
    return exp.Mod(this=paren(node.this), expression=exp.Nullif(this=node.expression,
                                                                expression=num(0)))


def _sqrt(t: Total, node: exp.Expr) -> exp.Expr:
    a = double(node.this)
    return when(exp.GTE(this=a, expression=num(0)), exp.Sqrt(this=a.copy()))


def _ln(t: Total, node: exp.Expr) -> exp.Expr:
    a = double(node.this)
    return when(exp.GT(this=a, expression=num(0)), exp.Ln(this=a.copy()))


LogCall = Callable[[exp.Expr | None, exp.Expr], exp.Expr]


def log_call(base: exp.Expr | None, x: exp.Expr) -> exp.Expr:
    """DuckDB's (and PostgreSQL's) log: one argument is base 10, two are (base, x)."""
    return exp.Log(this=x) if base is None else exp.Log(this=base, expression=x)


def logarithm(t: Total, node: exp.Expr, call: LogCall = log_call) -> exp.Expr:
    """log(x) and log(b, x) (log10 and log2 are parsed as the latter): NULL for x <= 0, and
    for a base b <= 0 or b = 1."""
    if node.expression is None:
        x = double(node.this)
        return when(exp.GT(this=x, expression=num(0)), call(None, x.copy()))
    b, x = double(node.this), double(node.expression)
    ok = exp.and_(exp.GT(this=x, expression=num(0)), exp.GT(this=b, expression=num(0)),
                  exp.NEQ(this=b.copy(), expression=num(1)), copy=False)
    return when(ok, call(b.copy(), x.copy()))


def power_domain(a: exp.Expr, b: exp.Expr) -> exp.Expr:
    """power(a, b) is defined: not 0 to a negative power, not a negative base to a finite
    non-integer power (every double from 2^53 up is an integer)."""
    zero_base = exp.and_(exp.EQ(this=a.copy(), expression=num(0)),
                         exp.LT(this=b.copy(), expression=num(0)), copy=False)
    fraction = exp.and_(exp.LT(this=a.copy(), expression=num(0)),
                        exp.LT(this=exp.Abs(this=b.copy()), expression=num(2**53)),
                        exp.NEQ(this=b.copy(), expression=exp.Floor(this=b.copy())), copy=False)
    return exp.Not(this=paren(exp.or_(zero_base, fraction, copy=False)))


def _power(t: Total, node: exp.Expr) -> exp.Expr:
    a, b = double(node.this), double(node.expression)
    return when(power_domain(a, b), exp.Pow(this=a.copy(), expression=b.copy()))


Positions = Callable[[exp.Expr, exp.Expr, exp.Expr | None], exp.Expr]


def substring(t: Total, node: exp.Expr, call: Positions | None = None) -> exp.Expr:
    """DuckDB's substring(s, start[, length]), the canonical meaning: positions from 1, a
    negative start counting from the end (-1 is the last character), 0 the place before
    the first; the positions in [start, start + length) that exist; NULL for a negative
    length. ``call`` writes it where the engine's own substring means otherwise."""
    s, start, length = node.this, node.args.get("start"), node.args.get("length")
    out = node if call is None or start is None else call(s, start, length)
    # positions beyond +-(2^31 - 1) raise on the engines (DuckDB past 2^32, PostgreSQL past
    # its int4): NULL there, as for a negative length (a bug hunt: a start chosen by a CASE
    # on the data raised after the charge, one bit about the rows)
    guards = _reach_guards(((start, -SUBSTRING_REACH), (length, 0)))
    return when(exp.and_(*guards, copy=False), out) if guards else out


#: the largest |position| and length ``substring``, ``left`` and ``right`` take (beyond: NULL)
SUBSTRING_REACH = 2**31 - 1


def _reach_guards(args: Sequence[tuple[exp.Expr | None, int]]) -> list[exp.Expr]:
    """``arg BETWEEN least AND SUBSTRING_REACH`` for each argument that is not a literal
    within that range."""
    guards: list[exp.Expr] = []
    for arg, least in args:
        if not isinstance(arg, exp.Expression):
            continue
        ok, value = ex.literal_value(arg)
        if ok and isinstance(value, int) and not isinstance(value, bool) and \
                least <= value <= SUBSTRING_REACH:
            continue  # a literal within reach: nothing to guard
        guards.append(exp.Between(this=arg.copy(), low=num(least), high=num(SUBSTRING_REACH)))
    return guards


def within_reach(handler: Handler) -> Handler:
    """``left(s, n)`` and ``right(s, n)``: NULL for |n| beyond ``SUBSTRING_REACH`` (DuckDB's
    left raises past 2^32), then ``handler``."""
    def rule(t: Total, node: exp.Expr) -> exp.Expr:
        guards = _reach_guards(((node.expression, -SUBSTRING_REACH),))
        out = handler(t, node)
        return when(exp.and_(*guards, copy=False), out) if guards else out
    return rule


def literal_pattern(t: Total, node: exp.Expr) -> exp.Expr:
    """LIKE and regular expressions with a literal pattern only: a pattern read from a row
    could be malformed (an error at run time); another is refused before any charge."""
    pattern = node.expression
    if not isinstance(pattern, exp.Literal) or not pattern.is_string:
        raise UserError(f"LIKE and regular expressions take a literal pattern on {t.engine} "
                        "(a pattern read from the data could fail on a row)")
    if isinstance(node, exp.Like | exp.ILike) and (
            len(pattern.this) - len(pattern.this.rstrip("\\"))) % 2:
        raise UserError("a LIKE pattern must not end with an escape character")
    return node


# Nodes that cannot raise once their arguments cannot.
PASS: tuple[type[exp.Expr], ...] = (
    exp.Column, exp.Identifier, exp.Literal, exp.Boolean, exp.Null, exp.Paren, exp.Tuple,
    exp.And, exp.Or, exp.Not, exp.Xor, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE,
    exp.NullSafeEQ, exp.NullSafeNEQ, exp.Is, exp.In, exp.Between, exp.Case, exp.If,
    exp.Coalesce, exp.Nullif, exp.Greatest, exp.Least, exp.Lower, exp.Upper, exp.Length,
    exp.Trim, exp.Concat, exp.DPipe, exp.StartsWith, exp.Left, exp.Right, exp.Sign,
    exp.Ceil, exp.Floor, exp.Round, exp.Exp, exp.DataType, exp.DataTypeParam, exp.Var,
    exp.Interval, exp.Year, exp.Month, exp.Day, exp.DayOfWeek, exp.DayOfYear, exp.Quarter,
    exp.Week, exp.Extract, exp.DateTrunc, exp.TimestampTrunc,
)

# The rules every engine shares. + - * unary minus and abs are the engine's own (an integer
# overflow is caught by TRY, try_add or a NUMERIC bound): here they are kept as they are,
# and every engine's table overrides them.
RULES: dict[type[exp.Expr], Handler] = {
    **dict.fromkeys(PASS, keep),
    exp.Left: within_reach(keep), exp.Right: within_reach(keep),
    exp.Add: keep, exp.Sub: keep, exp.Mul: keep, exp.Neg: keep, exp.Abs: keep,
    exp.Cast: _try_cast,
    exp.Div: _divide,
    exp.IntDiv: _int_divide,
    exp.Mod: _modulo,
    exp.Sqrt: _sqrt,
    exp.Ln: _ln,
    exp.Log: logarithm,
    exp.Pow: _power,
    exp.Substring: substring,
    exp.Like: literal_pattern,
    exp.ILike: literal_pattern,
    exp.RegexpLike: literal_pattern,
}
