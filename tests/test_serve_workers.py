"""``dpcurator serve --workers N``'s sockets (``dpcurator.cli._workers``), without starting
workers: each accepted connection has Nagle's algorithm off, and a port that another server
holds is refused, even one held by our own ``SO_REUSEPORT`` sockets.

(``test_workers_live`` starts the workers: answers on one keep-alive connection do not wait
for delayed acknowledgements, and connections spread over the workers.)
"""

from __future__ import annotations

import asyncio
import socket
import sys

import pytest

pytest.importorskip("uvicorn", reason="the server extra is not installed")

from dpcurator.cli._workers import _listen, serve_workers
from dpcurator.errors import UserError

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX sockets")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("reuse_port", [True, False])
def test_connections_accepted_from_a_workers_socket_have_nagle_off(reuse_port: bool) -> None:
    """As uvicorn serves it (``loop.create_server(sock=...)``): asyncio sets TCP_NODELAY on
    what it accepts only from a socket whose ``proto`` is TCP, which ``_listen`` names."""
    if reuse_port and not hasattr(socket, "SO_REUSEPORT"):
        assert not sys.platform.startswith("linux"), "Linux has SO_REUSEPORT"
        pytest.skip("no SO_REUSEPORT on this platform: the workers share one socket")
    sock = _listen("127.0.0.1", _free_port(), reuse_port=reuse_port)
    assert sock.proto == socket.IPPROTO_TCP
    seen: list[int] = []

    class Record(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted = transport.get_extra_info("socket")
            seen.append(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    async def accept_one() -> None:
        server = await asyncio.get_running_loop().create_server(Record, sock=sock)
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        for _ in range(500):
            if seen:
                break
            await asyncio.sleep(0.01)
        writer.close()
        server.close()

    try:
        asyncio.run(accept_one())
    finally:
        sock.close()
    assert len(seen) == 1 and seen[0] != 0


def test_a_port_in_use_is_refused_before_any_worker_starts() -> None:
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    try:
        with pytest.raises(UserError, match=r"cannot listen on 127\.0\.0\.1"):
            serve_workers("nowhere:app", 2, "127.0.0.1", held.getsockname()[1], {})
    finally:
        held.close()


@pytest.mark.skipif(not hasattr(socket, "SO_REUSEPORT"), reason="no SO_REUSEPORT here")
def test_a_port_held_by_another_supervisor_is_refused_not_joined() -> None:
    """A second ``serve --workers N`` on the port of a running one would otherwise join its
    ``SO_REUSEPORT`` group (same user), and the kernel would split the clients between two
    services: it is refused, as a port in use is without ``SO_REUSEPORT``."""
    port = _free_port()
    running = [_listen("127.0.0.1", port, reuse_port=True) for _ in range(2)]
    try:
        with pytest.raises(UserError, match=r"cannot listen on 127\.0\.0\.1"):
            serve_workers("nowhere:app", 2, "127.0.0.1", port, {})
    finally:
        for sock in running:
            sock.close()
