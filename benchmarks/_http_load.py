"""A thin load client for benchmarks/service.py: keep-alive HTTP/1.1 over asyncio streams.

    python benchmarks/_http_load.py URL TOKEN SQL CLIENTS SECONDS

Sends the query once (the release is made and charged), then ``CLIENTS`` connections send it
again as fast as they get answers for ``SECONDS`` seconds. Prints one JSON object: every
request's latency, the wall time, and how many answers were not ``200`` with ``cached``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from urllib.parse import urlsplit


def request_bytes(host: str, token: str, sql: str) -> bytes:
    body = json.dumps({"sql": sql, "epsilon": 1.0}).encode()
    head = (f"POST /v1/datasets/orders/queries HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   request: bytes) -> tuple[int, bytes]:
    writer.write(request)
    await writer.drain()
    lines = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in lines
                  if line.lower().startswith(b"content-length:"))
    return int(lines[0].split()[1]), await reader.readexactly(length)


async def main(url: str, token: str, sql: str, clients: int, seconds: float) -> None:
    where = urlsplit(url)
    host, port = where.hostname or "127.0.0.1", where.port or 80
    request = request_bytes(where.netloc, token, sql)
    reader, writer = await asyncio.open_connection(host, port)
    status, payload = await exchange(reader, writer, request)
    if status != 200:
        raise SystemExit(f"the first request failed: {status} {payload[:300]!r}")
    writer.close()
    times: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(host, port)
        while time.perf_counter() < stop:
            start = time.perf_counter()
            status, payload = await exchange(reader, writer, request)
            times.append(time.perf_counter() - start)
            if status != 200 or not json.loads(payload)["cached"]:
                errors += 1
        writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    print(json.dumps({"times": times, "wall": time.perf_counter() - start, "errors": errors}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]),
                     float(sys.argv[5])))
