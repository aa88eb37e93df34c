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
  engines refuse it when the query is validated);
- a value does not convert where the engine converts it unasked (an implicit cast, below).

Implicit casts. An engine also converts values that the query never casts: DuckDB compares
a VARCHAR column with a number by casting the text to the number's type (``code = 1``,
``code IN (1, 2)``, ``y = code``, ``nullif(code, 3)``, ``CASE ... THEN code ELSE '0' END =
1``), casts text to BOOLEAN where a condition is expected (``WHERE code``, ``NOT code``),
widens DECIMALs and HUGEINTs to a common type that may not hold every value (a
DECIMAL(38,0) beside 1.5), a DATE to a TIMESTAMP (not every date is one), and a string
literal to the type it meets (``x = 'abc'``, ``t > 'notadate'``). Such a cast fails on a
value at run time, after the charge, and whether it fails can depend on one person's value:
a one-bit leak. Wrapping every comparison in TRY would close it but costs (``WHERE try(x =
15)``: 84 ms against 7 ms over 6M rows), so ``implicit_casts`` decides from the operands'
types, public (the engine's ``type_of``, which reads no row; a literal's type is syntactic):
operands of one family need no TRY (text with text, BOOLEAN with BOOLEAN, one temporal
type with itself, numbers whose common type holds them all: no UHUGEINT beside another
type, and with a DECIMAL, integer digits plus scale within 38); a constant operand (a string
literal, ``DATE '2024-01-01'`` beside a TIMESTAMP) is cast explicitly to the data's type
after the engine has evaluated that cast once, before the charge (it is data-independent);
one that does not convert is refused with a ``UserError`` then (``x = 'abc'``, ``t >
'notadate'``); a typed constant is cast so only where it casts back unchanged (not
``TIMESTAMP '2024-03-15 10:00'`` beside a DATE: SQL compares them as TIMESTAMPs, widening
the date, and so does the engine, under TRY); anything else (mixed families, an unknown
type) runs under the engine's TRY, where the failing cast is NULL. A condition (WHERE, AND,
OR, NOT, CASE WHEN, IF, IS TRUE) that is not BOOLEAN is ``TRY_CAST(... AS BOOLEAN)``.
Functions whose number arguments an engine converts (``exp``, ``%``, ``left``, ``right``,
``substring``, ``INTERVAL``) run under TRY unless their arguments have a type that converts
without failing. A date part or unit (``extract``, ``date_trunc``) must be a literal, refused
otherwise before the charge on every engine: a unit read from a row could be invalid
(``date_trunc(p, t)``), an error on that row. Only DuckDB's table uses ``implicit_casts``:
PostgreSQL refuses ``text = integer`` when it binds, before the charge, and Spark runs with
ANSI mode off, where a failing implicit cast is NULL.

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

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

from sqlglot import exp

from dpcurator.engines._trees import case, num, paren, width_bucket_case
from dpcurator.errors import InternalError, UserError
from dpcurator.query import expressions as ex

__all__ = [
    "COMPARED",
    "RULES",
    "TOTALS",
    "Cache",
    "Evaluates",
    "Handler",
    "Rules",
    "Total",
    "TypeOf",
    "as_condition",
    "cast_by_type_name",
    "implicit_casts",
    "is_constant",
    "keep",
    "literal_part",
    "number_arguments",
    "operand_slots",
    "set_slot",
    "slot_value",
    "total",
]

TypeOf = Callable[[Sequence[exp.Expr]], list[str]]
# Does a constant expression evaluate without an error (the engine runs it once, no row)?
Evaluates = Callable[[exp.Expr], bool]
Handler = Callable[["Total", exp.Expr], exp.Expr]
Rules = Mapping[type[exp.Expr], Handler]


class Total:
    """One run of the pass: an engine's rule table and, where its rules need the types of
    subexpressions (PostgreSQL, DuckDB), the engine's ``type_of`` (it reads no row), and
    where they check a constant (DuckDB), its ``evaluates``."""

    def __init__(self, rules: Rules, engine: str, type_of: TypeOf | None = None,
                 evaluates: Evaluates | None = None) -> None:
        self.rules = rules
        self.engine = engine
        self.type_of = type_of
        self.evaluates = evaluates

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


def total(text: str, rules: Rules, engine: str, type_of: TypeOf | None = None,
          evaluates: Evaluates | None = None) -> exp.Expr:
    """The canonical expression ``text`` as an expression that no row can make raise."""
    node = ex.tree_of(text)  # the plan's tree (a copy), parsed once where it entered
    ex.check_scalar(node, "expression")  # the plan was checked; check again, cheaply
    node = node.transform(lambda n: width_bucket_case(n) if isinstance(n, exp.WidthBucket)
                          else n)
    return Total(rules, engine, type_of, evaluates).rewrite(node)


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
    """A number as a DOUBLE (TRY_CAST). Built after the rewrite, so no engine's Cast rule
    sees it, and PostgreSQL writes it as a plain CAST: its rules convert each argument to a
    double themselves first (``_postgres_expressions._doubles``; a bug hunt: a NUMERIC
    1e400 made ``sqrt`` raise after the charge)."""
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


def literal_part(t: Total, node: exp.Expr) -> exp.Expr:
    """extract, date_trunc: the part or unit is a literal (the engine checks it when it binds
    the query); one read from a row could be invalid, an error on that row: refused."""
    part = node.this if isinstance(node, exp.Extract) else node.args.get("unit")
    if part is not None and not isinstance(part, exp.Var) and not (
            isinstance(part, exp.Literal) and part.is_string):
        raise UserError(f"{ex.describe(node)} takes a literal date part or unit (one read "
                        "from the data could be invalid on a row)")
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
    exp.Week,
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
    exp.Extract: literal_part, exp.DateTrunc: literal_part, exp.TimestampTrunc: literal_part,
}


# -- implicit casts (module docstring; DuckDB's table) -------------------------------------------

# Integer digits of each exact number type, as a DECIMAL's precision less its scale.
_DIGITS = {"TINYINT": 3, "SMALLINT": 5, "INTEGER": 10, "BIGINT": 19, "HUGEINT": 39,
           "UTINYINT": 3, "USMALLINT": 5, "UINTEGER": 10, "UBIGINT": 20, "UHUGEINT": 39}
_FLOATING = {"FLOAT", "DOUBLE", "REAL"}
# Position arguments (left, right, substring): the types an engine converts to BIGINT
# without failing; INTERVAL's count: those it converts to INTEGER.
_POSITIONS = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER"}
_COUNTS = {"TINYINT", "SMALLINT", "INTEGER", "UTINYINT", "USMALLINT"}
_PREDICATES = (exp.Predicate, exp.Connector, exp.Not, exp.Xor, exp.Boolean, exp.Null)


def _base(type_name: str) -> str:
    return " ".join(type_name.split("(")[0].upper().split())


def _family(type_name: str) -> str:
    """"text", "number", "boolean", or the type itself (every other type converts to none
    other without a possible failure)."""
    base = _base(type_name)
    if base == "VARCHAR":
        return "text"
    if base in _DIGITS or base in _FLOATING or base == "DECIMAL":
        return "number"
    if base == "BOOLEAN":
        return "boolean"
    return " ".join(type_name.upper().split())


def _bare(node: exp.Expr) -> exp.Expr:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def is_constant(node: exp.Expr) -> bool:
    return not any(isinstance(n, exp.Column) for n in node.walk())


def _number_shape(item: str | exp.Literal) -> tuple[int, int, bool] | None:
    """(integer digits, scale, is a DECIMAL) of a number type or literal; None for a
    floating-point one (every number converts to a double)."""
    if isinstance(item, exp.Literal):
        text = item.this.lstrip("+-")
        if "e" in text.lower():
            return None
        if "." in text:
            whole, fraction = text.split(".", 1)
            return len(whole.lstrip("0")) or 1, len(fraction), True
        digits = len(text.lstrip("0")) or 1  # an integer literal: INTEGER, BIGINT or HUGEINT
        return (10 if digits <= 9 else 19 if digits <= 18 else 39), 0, False
    base = _base(item)
    if base in _FLOATING:
        return None
    if base == "DECIMAL":
        params = item[item.index("(") + 1:item.index(")")].split(",") if "(" in item else []
        precision = int(params[0]) if params else 18
        scale = int(params[1]) if len(params) > 1 else 3
        return precision - scale, scale, True
    return _DIGITS[base], 0, False


def _numbers_fit(items: Sequence[str | exp.Literal]) -> bool:
    """Numbers whose common type holds each of them: no UHUGEINT beside another type, and
    with a DECIMAL, the largest integer digits plus the largest scale within 38 (measured:
    DECIMAL(38,0) = 1.5 and HUGEINT = DECIMAL(18,3) fail on large values)."""
    bases = {_base(i) if isinstance(i, str) else "literal" for i in items}
    if "UHUGEINT" in bases and len(bases) > 1:
        return False
    shapes = [s for s in map(_number_shape, items) if s is not None]
    if not any(decimal for _, _, decimal in shapes):
        return True
    return max(d for d, _, _ in shapes) + max(s for _, s, _ in shapes) <= 38


def _types(t: Total, nodes: Sequence[exp.Expr]) -> list[str] | None:
    if t.type_of is None:
        return None
    return t.type_of(nodes) if nodes else []


def _converted(t: Total, node: exp.Expr, type_name: str) -> exp.Expr | None:
    """A constant as ``type_name``: the cast is evaluated once, before the charge (a constant
    converts on every row or on none); refused where it does not convert."""
    if t.evaluates is None:
        return None
    try:
        to = exp.DataType.build(type_name, dialect="duckdb", udt=True)
    except Exception:
        return None
    out = exp.Cast(this=node.copy(), to=to)
    if not t.evaluates(out):
        raise UserError(f"the constant {node.sql(dialect='duckdb')} does not convert to "
                        f"{type_name}, the type it is compared with")
    return out


def _exact(t: Total, node: exp.Expr, own: str, type_name: str) -> bool:
    """Does the constant ``node``, of type ``own``, cast to ``type_name`` and back unchanged
    (evaluated once, before the charge)? Then comparing the data with the cast constant is
    comparing it with the constant, as SQL does by widening the data to ``own`` (DATE
    '2024-01-01' beside a TIMESTAMP, or TIMESTAMP '2024-03-15' beside a DATE); a TIMESTAMP
    with a time beside a DATE does not cast back, and the engine compares as TIMESTAMPs."""
    if t.evaluates is None:
        return False
    try:
        to = exp.DataType.build(type_name, dialect="duckdb", udt=True)
        back = exp.DataType.build(own, dialect="duckdb", udt=True)
    except Exception:
        return False
    again = exp.Cast(this=exp.Cast(this=node.copy(), to=to), to=back)
    same = exp.NullSafeEQ(this=again, expression=node.copy())
    fails = exp.Anonymous(this="error", expressions=[exp.Literal.string("not exact")])
    return t.evaluates(exp.Case(ifs=[exp.If(this=same, true=exp.true())], default=fails))


def unify(t: Total, operands: Sequence[exp.Expr]) -> dict[int, exp.Expr] | None:
    """Operands that one comparison (or CASE, COALESCE...) brings to a common type: the
    replacements of its constants (by position), cast explicitly and checked; or None
    where an implicit cast could fail on a value (the caller runs the node under TRY)."""
    strings: list[int] = []
    literals: list[exp.Literal] = []
    typed: list[int] = []
    for i, op in enumerate(operands):
        bare = _bare(op)
        if isinstance(bare, exp.Null):
            continue
        if isinstance(bare, exp.Literal):
            (strings.append(i) if bare.is_string else literals.append(bare))
        else:
            typed.append(i)
    known = {i: "BOOLEAN" for i in typed if isinstance(_bare(operands[i]), _PREDICATES)}
    asked = [i for i in typed if i not in known]
    answer = _types(t, [operands[i] for i in asked])
    if answer is None:
        return None
    known.update(zip(asked, answer, strict=True))
    data = [i for i in typed if not is_constant(operands[i])] or typed
    constants = [i for i in typed if i not in data]
    families = {_family(known[i]) for i in data}
    if not families:  # literals only: alike, or TRY (a constant: free)
        return {} if not (strings and literals) and _numbers_fit(literals) else None
    if len(families) > 1:
        return None
    family = families.pop()
    out: dict[int, exp.Expr] = {}
    if family == "number":
        numbers: list[str | exp.Literal] = [known[i] for i in typed]
        if any(_family(known[i]) != "number" for i in constants):
            return None
        if not _numbers_fit([*numbers, *literals]):
            return None
        targets = {known[i] for i in data}
        if strings and len(targets) != 1:
            return None
    else:
        if literals:
            return None
        targets = {known[data[0]]}
        if family == "text":  # text beside text; a string literal is text
            return {} if all(_family(known[i]) == "text" for i in constants) else None
        for i in constants:
            if known[i] != known[data[0]]:
                if not _exact(t, operands[i], known[i], known[data[0]]):
                    return None  # the engine widens the data to the constant's type
                cast_ = _converted(t, operands[i], known[data[0]])
                if cast_ is None:
                    return None
                out[i] = cast_
    for i in strings:
        cast_ = _converted(t, operands[i], next(iter(targets)))
        if cast_ is None:
            return None
        out[i] = cast_
    return out


Slot = tuple[exp.Expr, str, int | None]


def operand_slots(node: exp.Expr) -> list[list[Slot]]:
    """The groups of operands that one node brings to a common type, as (parent, key,
    index in a list or None)."""
    def listed(parent: exp.Expr, key: str) -> list[Slot]:
        return [(parent, key, i) for i in range(len(parent.args.get(key) or []))]

    if isinstance(node, exp.In):
        return [[(node, "this", None), *listed(node, "expressions")]]
    if isinstance(node, exp.Between):
        return [[(node, "this", None), (node, "low", None), (node, "high", None)]]
    if isinstance(node, exp.Coalesce | exp.Greatest | exp.Least):
        return [[(node, "this", None), *listed(node, "expressions")]]
    if isinstance(node, exp.Case):
        ifs = node.args.get("ifs") or []
        values: list[Slot] = [(i, "true", None) for i in ifs]
        if node.args.get("default") is not None:
            values.append((node, "default", None))
        groups = [values]
        if node.this is not None:  # CASE x WHEN a ...: x = a
            groups.append([(node, "this", None), *((i, "this", None) for i in ifs)])
        return groups
    if isinstance(node, exp.If):
        return [[(node, "true", None), *([(node, "false", None)]
                                         if node.args.get("false") is not None else [])]]
    return [[(node, "this", None), (node, "expression", None)]]  # comparisons, NULLIF


def slot_value(slot: Slot) -> exp.Expr:
    parent, key, index = slot
    value = parent.args[key]
    out: exp.Expr = value[index] if index is not None else value
    return out


def set_slot(slot: Slot, value: exp.Expr) -> None:
    parent, key, index = slot
    if index is None:
        parent.set(key, value)
    else:
        values = list(parent.args[key])
        values[index] = value
        parent.set(key, values)


def as_condition(t: Total, node: exp.Expr) -> exp.Expr:
    """A condition as BOOLEAN: itself where it is one, else TRY_CAST (an engine's implicit
    cast of text to BOOLEAN fails on a value that is no boolean's text)."""
    if isinstance(_bare(node), _PREDICATES) or (
            isinstance(node, exp.Try) and isinstance(_bare(node.this), _PREDICATES)):
        return node
    answer = _types(t, [node])
    if answer is not None and _base(answer[0]) in ("BOOLEAN", '"NULL"', "NULL"):
        return node
    return exp.TryCast(this=node, to=exp.DataType.build("BOOLEAN"))


def _conditions(t: Total, node: exp.Expr) -> None:
    """The node's conditions (AND, OR, NOT, CASE WHEN, IF, IS TRUE) as BOOLEANs."""
    slots: list[Slot] = []
    if isinstance(node, exp.And | exp.Or | exp.Xor):
        slots = [(node, "this", None), (node, "expression", None)]
    elif isinstance(node, exp.Not) or (
            isinstance(node, exp.Is) and isinstance(node.expression, exp.Boolean)):
        slots = [(node, "this", None)]
    elif isinstance(node, exp.Case) and node.this is None:
        slots = [(i, "this", None) for i in node.args.get("ifs") or []]
    elif isinstance(node, exp.If) and not isinstance(node.parent, exp.Case):
        slots = [(node, "this", None)]
    for slot in slots:
        value = slot_value(slot)
        if isinstance(value, exp.Expr):
            set_slot(slot, as_condition(t, value))


COMPARED = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ,
            exp.NullSafeNEQ, exp.In, exp.Between, exp.Nullif, exp.Coalesce, exp.Greatest,
            exp.Least, exp.Case, exp.If)


def implicit_casts(wrap: Callable[[exp.Expr], exp.Expr], base: Handler = keep) -> Handler:
    """A rule for a node whose operands the engine brings to a common type, or that takes
    conditions: constants cast (checked) to the data's type, conditions as BOOLEAN, and the
    node under ``wrap`` (the engine's TRY) where a cast could still fail on a value; then
    ``base``."""
    def rule(t: Total, node: exp.Expr) -> exp.Expr:
        _conditions(t, node)
        if not isinstance(node, COMPARED) or (
                isinstance(node, exp.If) and isinstance(node.parent, exp.Case)):
            return base(t, node)
        safe = True
        for group in operand_slots(node):
            present = [s for s in group if isinstance(slot_value(s), exp.Expr)]
            out = unify(t, [slot_value(s) for s in present])
            if out is None:
                safe = False
                continue
            for i, value in out.items():
                set_slot(present[i], value)
        result = base(t, node)
        return result if safe else wrap(result)
    return rule


def number_arguments(wrap: Callable[[exp.Expr], exp.Expr], base: Handler = keep) -> Handler:
    """exp, %, left, right, substring, INTERVAL: the engine converts their number arguments
    (a string literal, a DOUBLE count of days, a HUGEINT position) and a conversion could
    fail on a value: under ``wrap`` unless each argument's type converts without failing; an
    INTERVAL of a literal is evaluated once, before the charge."""
    def rule(t: Total, node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Interval) and is_constant(node):
            if t.evaluates is not None and not t.evaluates(node):
                raise UserError(f"the interval {node.sql(dialect='duckdb')} is not valid")
            return base(t, node) if t.evaluates is not None else wrap(base(t, node))
        if isinstance(node, exp.Mod):
            fits = unify(t, [node.this, node.expression]) == {}
            result = base(t, node)
            return result if fits else wrap(result)
        if isinstance(node, exp.Exp):
            args, allowed = [node.this], None
        elif isinstance(node, exp.Interval):
            args, allowed = [node.this], _COUNTS
        elif isinstance(node, exp.Substring):
            args, allowed = [node.args.get("start"), node.args.get("length")], _POSITIONS
        else:  # left, right
            args, allowed = [node.expression], _POSITIONS
        present = [a for a in args if isinstance(a, exp.Expr)]
        fits = True
        asked = []
        for a in present:
            bare = _bare(a)
            if isinstance(bare, exp.Literal):
                fits &= bare.is_number and (allowed is None or (
                    "." not in bare.this and "e" not in bare.this.lower()))
            elif not isinstance(bare, exp.Null):
                asked.append(a)
        types = _types(t, asked)
        if types is None:
            fits = fits and not asked
        else:
            fits &= all(_family(n) == "number" if allowed is None else _base(n) in allowed
                        for n in types)
        result = base(t, node)
        return result if fits else wrap(result)
    return rule


#: expressions made total, kept per dialect (a sqlglot parse costs milliseconds)
TOTALS = 256


class Cache:
    """An engine's expressions made total, keyed on their text (one dialect serves one
    relation, so the types its rules asked are the same), the least recently used dropped
    beyond ``TOTALS``; each use gets a copy."""

    def __init__(self) -> None:
        self._nodes: OrderedDict[str, exp.Expr] = OrderedDict()

    def get(self, text: str, make: Callable[[str], exp.Expr]) -> exp.Expr:
        node = self._nodes.get(text)
        if node is None:
            node = self._nodes[text] = make(text)
            while len(self._nodes) > TOTALS:
                self._nodes.popitem(last=False)
        else:
            self._nodes.move_to_end(text)
        return node.copy()
