"""The keyed hash every engine computes identically: random priorities for bounding.

Sampled bounding ranks a unit's rows (and partitions) by a keyed random priority and keeps the
smallest. Every engine must give the same priority to the same values under the same secret
key, so the hash is defined here as arithmetic that any SQL engine evaluates exactly in
signed 64-bit integers (no overflow, no engine-specific hash function):

1. Each input value is encoded as 30-bit words ``w`` (below p, so distinct words stay
   distinct mod p): an integer of any width by its 64-bit two's complement, a date by its
   day number, a timestamp by its microseconds, a double by an exact (exponent, mantissa)
   pair, text by the first 8 bytes of its MD5 digest; NULL and special values (NaN,
   infinities) get a random constant of their own instead.
2. Two lanes compress the words into one element of GF(p) each, p = 2^31 - 1:
   ``x = (s + sum_i c_i w_i) mod p``, with ``s`` and every ``c_i`` uniform in [0, p): a
   multilinear, pairwise independent family (Carter and Wegman 1979), so two distinct inputs
   share a lane's ``x`` with probability 1/p.
3. Lane a maps ``x`` through a random polynomial of degree 3 over GF(p), which makes the
   values of distinct ``x`` 4-wise independent and uniform (Wegman and Carter 1981);
   polynomials of this kind are close to min-wise independent, so "the r smallest" is close
   to a uniformly random r-subset (Indyk 2001). The priority is ``y_a * 2^31 + x_b``: 62
   bits, ordered by lane a, whose rare ties (probability 2^-31 a pair) lane b breaks.

Every product is below 2^63 (a coefficient below 2^31 times a word below 2^30, summed three at
a time, or two field elements), so the arithmetic is exact in BIGINT on DuckDB, PostgreSQL and
Spark alike, with no engine's own hash function. The coefficients are derived from the 64-bit
secret key in Python (BLAKE2b) and bound as parameters: the key never appears in SQL text.
Only accuracy rests on these properties; the sensitivity bounds hold for any deterministic
function of a unit's own rows and the key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["DEGREE", "PRIME", "WORD_BITS", "hash_parameters"]

PRIME = 2**31 - 1
WORD_BITS = 30  # words below 2^30 < p: distinct words are distinct mod p
DEGREE = 3
PREFIX = "dp_key_"


def hash_parameters(key: int, names: Iterable[str]) -> dict[str, int]:
    """The value of each named hash coefficient under the 64-bit secret ``key``: an element
    of GF(p) derived by BLAKE2b keyed with the key, so each is uniform and independent."""
    secret = (int(key) & (2**64 - 1)).to_bytes(8, "little")
    out: dict[str, int] = {}
    for name in names:
        digest = hashlib.blake2b(name.encode(), key=secret, digest_size=16,
                                 person=b"dpcurator-hash").digest()
        out[name] = int.from_bytes(digest, "little") % PRIME
    return out
