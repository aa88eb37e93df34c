"""Where randomness comes from.

Every sampler in dpcurator draws uniformly random 64-bit words from a ``RandomSource``. The
default, ``SecureRandom``, is a cryptographically secure generator: AES-256 in counter mode
(the construction of NIST SP 800-90A's CTR_DRBG, without its derivation function) keyed from
the operating system's entropy pool (``os.urandom``), computed by OpenSSL through the
``cryptography`` package. It re-keys itself from the OS after every 2^30 bytes and after a
``fork`` so that two processes never share a stream.

``SeededRandom`` is reproducible and NOT secure: an attacker who learns its seed learns every
noise value it produced, and so the private data. It exists for tests and benchmarks only.
"""

from __future__ import annotations

import os
import threading
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from dpcurator.errors import UserError, UserTypeError

__all__ = ["RandomSource", "SecureRandom", "SeededRandom", "default_source", "resolve_source"]

U64Array = npt.NDArray[np.uint64]


@runtime_checkable
class RandomSource(Protocol):
    """A source of independent, uniformly distributed 64-bit words."""

    #: True only for sources fit for production (cryptographically secure).
    secure: bool

    def words(self, n: int) -> U64Array:
        """Return ``n`` independent uniform 64-bit words."""
        ...


class SecureRandom:
    """Cryptographically secure random words: AES-256-CTR keyed from ``os.urandom``.

    Thread-safe. Fork-safe: a child process re-keys before its first draw.
    """

    secure = True
    _REKEY_BYTES = 1 << 30
    _CHUNK_BYTES = 1 << 22  # 4 MiB of zeros encrypted in place per step

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._zeros = memoryview(bytes(self._CHUNK_BYTES))  # sliced without copying
        self._rekey()

    def _rekey(self) -> None:
        key = os.urandom(32)
        nonce = os.urandom(16)
        self._encryptor = Cipher(algorithms.AES(key), modes.CTR(nonce)).encryptor()
        self._produced = 0
        self._pid = os.getpid()

    def words(self, n: int) -> U64Array:
        if n < 0:
            raise UserError(f"n must be >= 0, got {n}")
        out = np.empty(n, dtype=np.uint64)
        view = memoryview(out).cast("B")  # type: ignore[arg-type]
        total = 8 * n
        with self._lock:
            if self._pid != os.getpid():
                self._rekey()
            done = 0
            while done < total:
                if self._produced >= self._REKEY_BYTES:
                    self._rekey()
                step = min(self._CHUNK_BYTES, total - done, self._REKEY_BYTES - self._produced)
                # The CTR keystream XOR zeros is the keystream itself.
                self._encryptor.update_into(self._zeros[:step], view[done : done + step])
                done += step
                self._produced += step
        return out

    def __repr__(self) -> str:
        return "SecureRandom()"


class SeededRandom:
    """Reproducible, INSECURE random words (numpy's PCG64). For tests and benchmarks only.

    Never use it to release data: anyone who knows the seed can subtract the noise.
    """

    secure = False

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._bitgen = np.random.PCG64(seed)
        self._lock = threading.Lock()

    def words(self, n: int) -> U64Array:
        if n < 0:
            raise UserError(f"n must be >= 0, got {n}")
        with self._lock:
            return self._bitgen.random_raw(n).astype(np.uint64, copy=False)

    def __repr__(self) -> str:
        return f"SeededRandom(seed={self.seed!r})  # INSECURE: tests and benchmarks only"


_default: SecureRandom | None = None
_default_lock = threading.Lock()


def default_source() -> SecureRandom:
    """The process-wide secure source used whenever no source is given."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = SecureRandom()
    return _default


def resolve_source(source: RandomSource | None) -> RandomSource:
    """``source`` if given (tests and benchmarks), else the secure default."""
    if source is None:
        return default_source()
    if not isinstance(source, RandomSource):
        raise UserTypeError(
            "source must be a dpcurator.noise.RandomSource (SecureRandom, or SeededRandom in "
            f"tests), got {type(source).__name__}"
        )
    return source
