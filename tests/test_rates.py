"""The shared rate limit's buckets (``dpcurator.ledger.open_rate_buckets``): beside a SQLite
ledger, a mapped table of buckets under ``lockf`` (``MappedRateBuckets``); the arithmetic is
the SQL takes' (refill from the last take, a clock stepping back refills nothing, a refusal
changes nothing), and across racing processes no key is admitted more than
``burst + rate * t`` times in ``t`` seconds. (``test_workers`` races 4 processes for a bucket
that never refills: exactly its burst is had, on SQLite and PostgreSQL.)
"""

from __future__ import annotations

import math
import os
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dpcurator.errors import UserError
from dpcurator.ledger import _rates, open_ledger, open_rate_buckets

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the mapped table needs fcntl")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(_rates.time, "time", fake)
    return fake


def test_beside_a_sqlite_ledger_the_buckets_are_a_mapped_table_only_the_owner_reads(
        tmp_path: Path) -> None:
    buckets = open_rate_buckets(str(tmp_path / "ledger.sqlite"))
    try:
        assert isinstance(buckets, _rates.MappedRateBuckets)
        assert buckets.take("alice", rate=1.0, burst=1)
        mode = os.stat(tmp_path / "ledger.sqlite.buckets").st_mode
        assert stat.S_IMODE(mode) == 0o600
    finally:
        buckets.close()


def test_the_arithmetic_is_the_sql_takes(tmp_path: Path, clock: Clock) -> None:
    buckets = _rates.MappedRateBuckets(tmp_path / "b")
    other = _rates.MappedRateBuckets(tmp_path / "b")  # another process's view of the file
    try:
        take = lambda b=buckets: b.take("alice", rate=2.0, burst=3)  # noqa: E731
        assert [take(), take(other), take()] == [True] * 3  # a new key starts full
        assert not take(other)
        clock.now += 0.25  # half a token
        assert not take() and not take(other)  # a refusal keeps the refill counting
        clock.now += 0.25
        assert take(other) and not take()
        clock.now -= 100  # the clock steps back: nothing refills, nothing breaks
        assert not take()
        clock.now += 100 + 10  # ten seconds on: full again, never more than the burst
        assert [take() for _ in range(4)] == [True] * 3 + [False]
        assert buckets.take("bob", rate=2.0, burst=3)  # his own bucket
    finally:
        buckets.close()
        other.close()


def test_a_slot_a_crash_left_unreadable_starts_full(tmp_path: Path, clock: Clock) -> None:
    buckets = _rates.MappedRateBuckets(tmp_path / "b")
    try:
        assert buckets.take("alice", rate=0.0, burst=1)
        assert not buckets.take("alice", rate=0.0, burst=1)
        raw = bytearray((tmp_path / "b").read_bytes())
        slot = _rates._HEADER.size
        for at in range(slot, len(raw), _rates._SLOT.size):  # alice's slot, wherever it is
            if raw[at:at + 16] != bytes(16):
                struct.pack_into("<d", raw, at + 16, math.nan)
        (tmp_path / "b").write_bytes(bytes(raw))
        assert buckets.take("alice", rate=0.0, burst=1)
        assert not buckets.take("alice", rate=0.0, burst=1)
    finally:
        buckets.close()


def test_a_full_table_refuses_a_new_key_and_keeps_the_old(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_rates, "SLOTS", 4)
    buckets = _rates.MappedRateBuckets(tmp_path / "b")
    try:
        assert all(buckets.take(f"k{i}", rate=0.0, burst=2) for i in range(4))
        with pytest.raises(UserError, match=r"4 keys already.*remove it"):
            buckets.take("k4", rate=0.0, burst=2)
        assert all(buckets.take(f"k{i}", rate=0.0, burst=2) for i in range(4))
        assert not any(buckets.take(f"k{i}", rate=0.0, burst=2) for i in range(4))
    finally:
        buckets.close()


def test_a_file_of_another_layout_is_refused(tmp_path: Path) -> None:
    (tmp_path / "b").write_bytes(b"SQLite format 3\x00" + bytes(100))
    with pytest.raises(UserError, match="not a rate limits' file of this version"):
        _rates.MappedRateBuckets(tmp_path / "b")


def test_the_sqlite_buckets_where_fcntl_is_missing_still_admit_exactly_the_burst(
        tmp_path: Path) -> None:
    buckets = _rates.SQLiteRateBuckets(tmp_path / "ledger.sqlite.rates")
    try:
        assert [buckets.take("alice", rate=1e-9, burst=5) for _ in range(7)] == (
            [True] * 5 + [False] * 2)
    finally:
        buckets.close()


_TAKE_FOR = """
import sys, time
from dpcurator.ledger import open_rate_buckets
buckets = open_rate_buckets(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()  # all ready: go
stop, admitted = time.monotonic() + float(sys.argv[2]), 0
while time.monotonic() < stop:
    admitted += buckets.take("alice", rate=200.0, burst=20)
print(admitted)
"""


def test_racing_processes_are_admitted_at_most_burst_plus_rate_times_the_time(
        ledger_factory: Callable[[], str]) -> None:
    """4 processes take from one bucket (burst 20, 200 a second) as fast as they can for
    1.5 s: together they are admitted at most 20 + 200 * t, t measured from before the first
    take to after the last (a window holding every take, so the bound must hold for it)."""
    target = ledger_factory()
    open_ledger(target).close()
    racers = [subprocess.Popen([sys.executable, "-c", _TAKE_FOR, target, "1.5"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
              for _ in range(4)]
    for racer in racers:
        assert racer.stdout is not None and racer.stdout.readline() == "ready\n"
    started = time.monotonic()
    for racer in racers:
        assert racer.stdin is not None
        racer.stdin.write("go\n")
        racer.stdin.flush()
    admitted = sum(int(racer.communicate(timeout=120)[0]) for racer in racers)
    took = time.monotonic() - started
    assert admitted <= 20 + 200 * took, (admitted, took)
    assert admitted >= 40, (admitted, took)  # it refilled: the bound was tested, not idled under
