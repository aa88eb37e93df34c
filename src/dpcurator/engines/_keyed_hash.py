"""The keyed hash of ``_hash`` written as trees: ``HashInput`` (one value it reads) and
``KeyedHash`` (the lanes' accumulations and the 62-bit priorities, recording the parameters
they use)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlglot import exp

from dpcurator.engines._dialect import Dialect, HashKind
from dpcurator.engines._hash import DEGREE, PREFIX, PRIME, WORD_BITS
from dpcurator.engines._trees import add, band, case, cast, col, div, mod, mul, num, paren, shr, sub
from dpcurator.errors import InternalError

__all__ = ["HashInput", "KeyedHash"]

_LN2 = 0.6931471805599453

@dataclass(frozen=True)
class HashInput:
    """One value the keyed hash reads: a column of the stage, its kind, whether it may be
    NULL, and (for text) the column holding its digest."""

    node: exp.Expr
    kind: HashKind
    nullable: bool = False
    digest: str | None = None


class KeyedHash:
    """Writes the keyed hash of ``_hash`` as trees, recording the parameters it uses."""

    def __init__(self, dialect: Dialect) -> None:
        self.d = dialect
        self.names: list[str] = []

    def param(self, name: str) -> exp.Expr:
        full = PREFIX + name
        if full not in self.names:
            self.names.append(full)
        return self.d.parameter(full)

    def _words(self, value: HashInput) -> list[exp.Expr]:
        """The value as 30-bit words (each below p, so distinct words stay distinct mod p)."""
        node, kind = value.node, value.kind

        def chunks(n: exp.Expr, count: int, last_bits: int = WORD_BITS
                   ) -> list[exp.Expr]:
            out: list[exp.Expr] = []
            for i in range(count):
                bits = last_bits if i == count - 1 else WORD_BITS
                part = shr(n.copy(), WORD_BITS * i) if i else n.copy()
                out.append(band(part, num(2**bits - 1)))
            return out

        if kind in ("text", "other"):
            assert value.digest is not None
            return self.d.digest_words(col(value.digest))
        if kind == "small":  # below 2^29 in magnitude
            return chunks(cast(node, "BIGINT"), 1)
        if kind == "bool":
            return [cast(cast(node.copy(), "INT"), "BIGINT")]
        if kind == "int32":
            return chunks(cast(node, "BIGINT"), 2, 2)
        if kind == "int64":
            return chunks(node, 3, 4)
        if kind == "int128":
            return [cast(w, "BIGINT") for w in chunks(node, 5, 8)]
        if kind == "date":
            days = cast(sub(node.copy(), exp.cast(exp.Literal.string("1970-01-01"), "DATE")),
                        "BIGINT")
            return chunks(days, 2, 2)
        if kind == "timestamp":
            return chunks(self.d.epoch_microseconds(node.copy()), 3, 4)
        if kind == "float":
            # x = m * 2^(e - 53) exactly, e = floor(log2 |x|) as ln computes it (within one of
            # the true exponent, so m is an integer below 2^55): an injective integer pair.
            e = cast(exp.Floor(this=div(exp.Ln(this=exp.Abs(this=node.copy())),
                                        self.d.double(_LN2))), "BIGINT")
            h = sub(num(53), e)
            h1 = cast(exp.Floor(this=div(h, self.d.double(2.0))), "BIGINT")
            h2 = sub(h.copy(), h1)
            two = self.d.double(2.0)
            m = cast(mul(mul(node.copy(), exp.Pow(this=two, expression=cast(h1.copy(),
                                                                             "DOUBLE"))),
                         exp.Pow(this=two.copy(), expression=cast(h2, "DOUBLE"))), "BIGINT")
            return [*chunks(e.copy(), 1), *chunks(m, 3, 4)]
        raise InternalError(f"no hash words for kind {kind}; this is a bug")

    def _term(self, lane: str, position: str, value: HashInput) -> exp.Expr:
        """The value's contribution to a lane: sum of c_i * w_i, each product below 2^61 and
        reduced mod p every three; NULL and special values give a random constant instead."""
        words = self._words(value)
        products = [mul(self.param(f"{lane}c{position}_{i}"), w) for i, w in enumerate(words)]
        term: exp.Expr = add(*products[:3])
        for i in range(3, len(products), 2):
            term = add(mod(term, num(PRIME)), *products[i:i + 2])
        term = paren(term)
        specials: list[tuple[exp.Expr, exp.Expr]] = []
        node = value.node
        if value.nullable and value.kind not in ("float", "date", "timestamp"):
            # a NULL value has NULL words: its term is NULL, and COALESCE (cheaper than a
            # CASE) gives the constant instead
            return exp.Coalesce(this=term, expressions=[self.param(f"{lane}n{position}")])
        if value.nullable:
            specials.append((exp.Is(this=node.copy(), expression=exp.Null()),
                             self.param(f"{lane}n{position}")))
        if value.kind == "float":
            inf = self.d.double(float("inf"))
            specials += [
                (self.d.is_nan(node.copy()), self.param(f"{lane}nan{position}")),
                (exp.EQ(this=node.copy(), expression=inf), self.param(f"{lane}pinf{position}")),
                (exp.EQ(this=node.copy(), expression=exp.Neg(this=inf.copy())),
                 self.param(f"{lane}minf{position}")),
                (exp.EQ(this=node.copy(), expression=self.d.double(0.0)),
                 self.param(f"{lane}zero{position}")),
            ]
        if value.kind in ("date", "timestamp"):
            finite = exp.Anonymous(this="isfinite", expressions=[node.copy()])
            specials.append((exp.Not(this=finite), case(
                (exp.GT(this=node.copy(), expression=exp.cast(exp.Literal.string("1970-01-01"),
                                                                "DATE")),
                 self.param(f"{lane}pinf{position}")),
                default=self.param(f"{lane}minf{position}"))))
        return case(*specials, default=term) if specials else term

    def accumulate(self, lane: str, start: exp.Expr | None, values: Sequence[HashInput],
                   offset: int) -> exp.Expr:
        """x = (start + sum of the values' terms) mod p, reduced after each value (below
        2^31 + 3 * 2^61 < 2^63); ``start`` None is the lane's seed."""
        acc = self.param(f"{lane}s") if start is None else start
        for i, value in enumerate(values):
            acc = mod(add(acc, self._term(lane, str(offset + i), value)), num(PRIME))
        return acc

    def priority(self, use: str, xa: exp.Expr, xb: exp.Expr) -> exp.Expr:
        """poly(xa) * 2^31 + xb: a 62-bit priority, as a non-negative BIGINT. The order is
        lane a's polynomial; lane b only breaks its ties (probability 2^-31 a pair)."""
        r = self.param(f"a{use}{DEGREE}")
        for j in range(DEGREE - 1, -1, -1):
            r = mod(add(mul(r, xa.copy()), self.param(f"a{use}{j}")), num(PRIME))
        return add(mul(r, num(2**31)), xb)
