"""Test-suite hygiene shared by every test module."""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import mpmath
import pytest


@pytest.fixture(autouse=True)
def _restore_mpmath_precision() -> Iterator[None]:
    """Some tests raise mpmath's global precision; never let it leak into the next test."""
    saved = mpmath.mp.prec
    yield
    mpmath.mp.prec = saved


@pytest.fixture(autouse=True)
def _learn_on_one_thread(request: pytest.FixtureRequest) -> Iterator[None]:
    """The DP-SGD tests (test_learn_*) run torch on one thread: their bit-for-bit comparisons
    of two paths assume the same kernels, and two cores are shared with the other worker.
    torch is imported only for them (the core package does not need it)."""
    if not request.module.__name__.startswith("test_learn"):
        yield
        return
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# -- one PostgreSQL server per test run -------------------------------------------------------
#
# The first test that asks for ``postgres_url`` starts a throwaway server (initdb into a fresh
# temporary folder, a Unix socket there and a free loopback TCP port, fsync on); every later
# test of the run, in this process or another pytest-xdist worker, gets the same server. The
# run's controller (the only process without xdist) makes one folder per run and names it in
# the environment its workers inherit; the workers take turns on a file lock in that folder
# and the first one starts the server. The controller stops it at the end of the session, and
# a watchdog process stops it if the controller dies without doing so (killed, say).

_PG_RUN = "DPCURATOR_TEST_POSTGRES_RUN"  # "<controller pid>:<folder>"
_PG_OWNED = pytest.StashKey[str]()  # the folder, in the process that made it


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller, or a run without xdist
        folder = tempfile.mkdtemp(prefix="dpcurator-test-pg-")
        os.chmod(folder, 0o711)  # the server's user must reach its data folder inside
        os.environ[_PG_RUN] = f"{os.getpid()}:{folder}"
        config.stash[_PG_OWNED] = folder


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_PG_OWNED, None)
    if folder is not None:
        _stop_postgres(Path(folder))
        shutil.rmtree(folder, ignore_errors=True)


def _postgres_binaries() -> Path | None:
    """The folder of initdb, pg_ctl and postgres: on PATH, or Debian's newest."""
    found = shutil.which("pg_ctl")
    folders = [Path(os.path.realpath(found)).parent] if found else []
    folders += sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                      key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
                      reverse=True)
    for folder in folders:
        if all((folder / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            return folder
    return None


def _server_user() -> tuple[int, int] | None:
    """(uid, gid) to run the server as: PostgreSQL refuses to run as root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        return entry.pw_uid, entry.pw_gid
    raise RuntimeError("running as root, and neither a 'postgres' nor a 'nobody' user exists "
                       "to run the test PostgreSQL server as")


def _as_server_user(command: list[str], folder: Path, timeout: float) -> None:
    user = _server_user()
    ids: dict[str, Any] = {} if user is None else {
        "user": user[0], "group": user[1], "extra_groups": []}
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C"}
    done = subprocess.run(command, cwd=folder, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                          start_new_session=True, check=False, **ids)
    if done.returncode != 0:
        log = folder / "server.log"
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        raise RuntimeError(f"{' '.join(command[:2])} failed ({done.returncode}):\n"
                           f"{done.stdout.decode(errors='replace')[-3000:]}\n{tail}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_postgres(binaries: Path, run: Path, owner: int) -> dict[str, Any]:
    folder = run / "pg"
    folder.mkdir()
    user = _server_user()
    if user is not None:
        os.chown(folder, *user)
    data = folder / "data"
    _as_server_user([str(binaries / "initdb"), "-D", str(data), "-U", "postgres",
                     "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"], folder, 120)
    for attempt in range(5):
        port = _free_port()
        options = (f"-c listen_addresses=127.0.0.1 -c port={port} "
                   f"-c unix_socket_directories={folder} -c max_connections=300 "
                   "-c shared_buffers=64MB -c max_parallel_workers_per_gather=0 "
                   "-c log_min_messages=warning -c fsync=on")
        try:
            _as_server_user([str(binaries / "pg_ctl"), "start", "-D", str(data), "-w",
                             "-t", "60", "-l", str(folder / "server.log"), "-o", options],
                            folder, 90)
            break
        except RuntimeError:
            if attempt == 4:  # another program took the port five times, or a real failure
                raise
    # The watchdog: stops the server if the run's controller goes away without doing so.
    subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(owner), str(run)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    return {"url": f"postgresql://postgres@127.0.0.1:{port}/postgres",
            "socket": str(folder), "port": port, "data": str(data)}


# Run as ``python -c WATCHDOG OWNER_PID RUN_FOLDER`` (standard library only).
_WATCHDOG = r"""
import os, shutil, signal, sys, time
owner, run = int(sys.argv[1]), sys.argv[2]
while os.path.isdir(run):
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        break
    except PermissionError:
        pass
    time.sleep(0.5)
else:
    sys.exit(0)  # the controller cleaned up
pidfile = os.path.join(run, "pg", "data", "postmaster.pid")
try:
    pid = int(open(pidfile).readline())
    os.kill(pid, signal.SIGINT)
    for _ in range(100):
        time.sleep(0.1)
        if not os.path.exists(pidfile):  # the server removes it as it exits
            break
    else:
        os.kill(pid, signal.SIGQUIT)
        time.sleep(2)
except (OSError, ValueError):
    pass
shutil.rmtree(run, ignore_errors=True)
"""


def _stop_postgres(run: Path) -> None:
    """Stop the run's server, if it was started (fast shutdown: clients are disconnected)."""
    pidfile = run / "pg" / "data" / "postmaster.pid"
    try:
        pid = int(pidfile.read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + 30
        while pidfile.exists():  # the server removes it as it exits
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGQUIT)
                break
            time.sleep(0.05)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The URL of the run's PostgreSQL server (superuser ``postgres``, trust auth, database
    ``postgres``); tests keep apart by each using a schema of their own."""
    binaries = _postgres_binaries()
    if binaries is None:
        reason = ("no PostgreSQL server binaries (initdb, pg_ctl, postgres) on this machine: "
                  "install Debian's postgresql package to run the PostgreSQL tests")
        if os.environ.get("DPCURATOR_REQUIRE_POSTGRES"):  # CI installs it: never skip there
            pytest.fail(reason)
        pytest.skip(reason)
    owner_text, _, folder = os.environ.get(_PG_RUN, "").partition(":")
    if not folder:  # the controller's hook did not run: a server of this process's own,
        folder = tempfile.mkdtemp(prefix="dpcurator-test-pg-")  # stopped by the watchdog
        os.chmod(folder, 0o711)
        os.environ[_PG_RUN] = f"{os.getpid()}:{folder}"
        owner_text = str(os.getpid())
    run = Path(folder)
    with open(run / "server.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = run / "server.json"
        if state.exists():
            return str(json.loads(state.read_text())["url"])
        info = _start_postgres(binaries, run, int(owner_text))
        state.write_text(json.dumps(info))
        return str(info["url"])


@pytest.fixture
def postgres_ledger_url(postgres_url: str) -> str:
    """A ``postgresql://`` ledger URL of a schema no other test uses."""
    return f"{postgres_url}?schema=test_{secrets.token_hex(6)}"


@pytest.fixture(params=["sqlite", "postgres"])
def ledger_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], str]:
    """Names a new, not yet created ledger at each call: a SQLite file in the test's folder,
    or a schema of its own on the run's PostgreSQL server. A test that takes it runs once
    for each database."""
    if request.param == "sqlite":
        counter = itertools.count()
        return lambda: str(tmp_path / f"ledger-{next(counter)}.sqlite")
    url = request.getfixturevalue("postgres_url")
    return lambda: f"{url}?schema=test_{secrets.token_hex(6)}"
