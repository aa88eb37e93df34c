"""A load client for the live service tests: threads that ask, retry, and record what came back.

    python tests/_service_load.py URL TOKEN DATASET PREFIX THREADS OUT [--repeat]

Each thread sends one query (its own SQL, epsilon 2^-5) with its own Idempotency-Key, then
sends it again with the same key; with ``--repeat`` it keeps going with new queries until
killed or refused. Every answer is appended to OUT as a JSON line as soon as it arrives:
``{"key", "status", "query_id", "cached", "rows"}``. Standard library only.
"""

from __future__ import annotations

import json
import sys
import threading
import urllib.error
import urllib.request
from typing import Any

EPSILON = 2.0**-5


def send(url: str, token: str, dataset: str, sql: str, key: str) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"sql": sql, "epsilon": EPSILON}).encode()
    request = urllib.request.Request(
        f"{url}/v1/datasets/{dataset}/queries", data=body, method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                 "Idempotency-Key": key})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def main() -> None:
    url, token, dataset, prefix, threads, out = sys.argv[1:7]
    repeat = "--repeat" in sys.argv
    lock = threading.Lock()
    sink = open(out, "a", buffering=1)  # noqa: SIM115 - closed at exit

    def record(key: str, status: int, answer: dict[str, Any]) -> None:
        line = json.dumps({"key": key, "status": status, "query_id": answer.get("query_id"),
                           "cached": answer.get("cached"), "rows": answer.get("rows"),
                           "error": answer.get("error", {}).get("type")})
        with lock:
            sink.write(line + "\n")

    def worker(thread: int) -> None:
        n = 0
        while True:
            key = f"{prefix}-{thread}-{n}"
            sql = f"SELECT COUNT(*) AS c_{prefix.replace('-', '_')}_{thread}_{n} FROM data"
            for _ in range(2):  # the request, then a retry with the same key
                try:
                    status, answer = send(url, token, dataset, sql, key)
                except OSError:
                    if not repeat:
                        raise
                    return  # the server went away (the kill test)
                record(key, status, answer)
                if status != 200:
                    return
            n += 1
            if not repeat:
                return

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(int(threads))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    sink.close()


if __name__ == "__main__":
    main()
