"""``dpcurator serve`` whose answers wait, for the live tests that kill a server mid-request.

    python tests/_slow_server.py SECONDS serve --config curator.toml --port PORT ...

Each answer (``Curator.answer``, run after the request's charge is committed) first sleeps
``SECONDS``: the window in which a test kills the server with a request charged and not yet
answered. Everything else is the real command. The answer is slowed when this file is
imported, so the workers of ``serve --workers N`` (spawned processes, which import the
parent's main file and get its ``sys.argv``) are slowed too.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from dpcurator.cli import app
from dpcurator.curator import Curator

_answer = Curator.answer


def _slow_answer(self: Curator, *args: Any, **kwargs: Any) -> Any:
    time.sleep(float(sys.argv[1]))
    return _answer(self, *args, **kwargs)


Curator.answer = _slow_answer  # type: ignore[method-assign]

if __name__ == "__main__":
    app(args=sys.argv[2:], prog_name="dpcurator")
