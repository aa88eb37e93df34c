"""``dpcurator serve --workers N``'s supervisor: N uvicorn servers, a listening socket each.

Why not uvicorn's own ``workers=N``: two reasons. Its workers share one listening socket, and a
worker that wakes accepts every connection waiting (asyncio accepts up to the backlog at
once); on two cores at most two workers are awake, so keep-alive connections opened together
(a proxy's pool, a load test's clients) land on one or two of them (measured: per-worker CPU
0.69, 0.26, 0, 0 of a core). Here each worker listens on a socket of its own, all bound to
the same address with ``SO_REUSEPORT``, and the kernel spreads new connections over them by
their addresses' hash (0.20, 0.30, 0.20, 0.24). (Where ``SO_REUSEPORT`` is missing, the
workers share one socket, as uvicorn's do.) And its socket leaves Nagle's algorithm on (the
last paragraph), which held 4 workers to 0.59 times what one served.

The supervisor binds every socket before any worker starts (so a port in use is reported at
once) and keeps them: a worker that dies (``kill -9``) is replaced on the same socket, and the
connections the kernel sent to it meanwhile wait in that socket's queue for its successor
instead of being refused. A worker that fails to start (exit status 3, as uvicorn's) stops
them all. SIGINT or SIGTERM stops every worker gracefully (each finishes what it is sending).
Workers are spawned, fresh interpreters, so nothing of the supervisor (a ledger connection,
a lock) crosses a fork. Linux lets only processes of the same user join a port's
``SO_REUSEPORT`` group.

Every socket is made with ``IPPROTO_TCP`` named. asyncio turns
Nagle's algorithm off on each connection it accepts only when the listening socket's
``proto`` says TCP, and a socket made as ``socket(AF_INET, SOCK_STREAM)`` (uvicorn's own, with
``workers=N``) says 0. A response goes out in two writes (its head, then its body): with Nagle
on, the body waits for the client to acknowledge the head, and the client delays that
acknowledgement (40 ms on Linux) while it waits for the body. Measured under
``benchmarks/workers.py``: each answer spent 44 ms between the worker's last write and the
client holding it (0.25 ms with one worker, whose socket asyncio makes itself), so 50
keep-alive clients could not get more than about 50 / 0.045 s = 1,100 answers a second
from any number of workers, however idle the cores.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
from multiprocessing.process import BaseProcess
from typing import Any

from dpcurator.errors import UserError

__all__ = ["STARTUP_FAILURE", "serve_workers"]

STARTUP_FAILURE = 3  # a worker's exit status when it could not start (uvicorn's)
_log = logging.getLogger("dpcurator.server")


def serve_workers(app: str, workers: int, host: str, port: int, options: dict[str, Any]
                  ) -> None:
    """Run ``workers`` uvicorn servers of the app factory ``app`` ("module:function") on
    ``host:port`` until SIGINT or SIGTERM; ``options`` are uvicorn's ``Config``'s."""
    shared = hasattr(socket, "SO_REUSEPORT")
    if shared:  # a port another server holds is refused here, as it is without SO_REUSEPORT
        _listen(host, port, reuse_port=False, backlog=None).close()
    sockets = [_listen(host, port, reuse_port=shared) for _ in range(workers if shared else 1)]
    spawn = multiprocessing.get_context("spawn")
    settings = {**options, "host": host, "port": port}

    def start(i: int) -> BaseProcess:
        process = spawn.Process(target=_serve_one, args=(app, sockets[i % len(sockets)],
                                                         settings), name=f"dpcurator-{i}")
        process.start()
        return process

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    processes = [start(i) for i in range(workers)]
    _log.info("supervisor [%d] started %d workers on %s:%d (%s)", os.getpid(), workers, host,
              port,
              "a socket each" if shared else "one shared socket")
    failed = False
    try:
        while not stop.wait(0.25):
            for i, process in enumerate(processes):
                if process.is_alive():
                    continue
                process.join()
                if process.exitcode == STARTUP_FAILURE:
                    _log.error("worker [%s] could not start; stopping", process.pid)
                    failed = True
                    stop.set()
                    break
                _log.warning("worker [%s] died (exit status %s); starting another",
                             process.pid, process.exitcode)
                processes[i] = start(i)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()  # SIGTERM: uvicorn shuts down gracefully
        for process in processes:
            process.join()
        for sock in sockets:
            sock.close()
    if failed:
        sys.exit(STARTUP_FAILURE)


def _serve_one(app: str, sock: socket.socket, settings: dict[str, Any]) -> None:
    """One worker: a uvicorn server of the app factory on its socket."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, factory=True, **settings))
    server.run(sockets=[sock])
    if not server.started:
        sys.exit(STARTUP_FAILURE)


def _listen(host: str, port: int, *, reuse_port: bool, backlog: int | None = 2048
            ) -> socket.socket:
    """A TCP socket bound to ``host:port``, listening unless ``backlog`` is None (a check
    that the port is free: bound without ``SO_REUSEPORT``, so that a port another server
    holds, even one of ours with ``SO_REUSEPORT``, is refused instead of joined)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio then sets TCP_NODELAY on every connection accepted from it
    # (see the module's docstring; Linux does not copy TCP_NODELAY from a listening socket).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    if backlog is not None:
        sock.listen(backlog)
        sock.set_inheritable(True)
    return sock
