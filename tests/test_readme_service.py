"""The README's service section runs as written, from a copy of a fresh clone's files.

Its code blocks are taken from README.md as they stand: the first shell block (the
configuration, alice's token, and ``dpcurator serve ... &``, whose server is started in a
process of its own, as the ``&`` says), then the Python block, then the command-line block,
each in a scratch folder holding what the README names (``examples/orders.csv``). The only
change: port 8000 becomes a free port, since other tests may hold 8000.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the server extra is not installed")
pytest.importorskip("uvicorn", reason="the server extra is not installed")

import dpcurator
from test_server_live import _free_port

ROOT = Path(__file__).resolve().parents[1]


def _section_blocks() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## The curator as a service", 1)[1].split("\n## ", 1)[0]
    section = section.split("\n### ", 1)[0]  # its own blocks, not its subsections' examples
    return re.findall(r"```(bash|python)\n(.*?)```", section, flags=re.S)


def test_the_readme_service_section_runs_as_written(tmp_path: Path) -> None:
    blocks = _section_blocks()
    assert [kind for kind, _ in blocks] == ["bash", "python", "bash"]
    port = str(_free_port())
    (setup, python, command) = (code.replace("8000", port) for _, code in blocks)
    for name in re.findall(r'path = "([^"]+)"', setup):  # what a clone holds: the sample data
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    source = str(Path(dpcurator.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": source,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("DPCURATOR_TOKEN", None)

    lines = setup.strip().splitlines()
    serve = lines[-1]
    assert serve.startswith("dpcurator serve --config") and " &" in serve
    prepared = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(lines[:-1])],
                              cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
    assert prepared.returncode == 0, prepared.stderr
    assert (tmp_path / "alice.token").stat().st_mode & 0o077 == 0
    server = subprocess.Popen(shlex.split(serve.split("&")[0]), cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              start_new_session=True)
    try:
        _wait_for(f"http://127.0.0.1:{port}/healthz", server)
        (tmp_path / "readme.py").write_text(python)
        asked = subprocess.run([sys.executable, "readme.py"], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=300)
        assert asked.returncode == 0, asked.stderr
        printed = asked.stdout.splitlines()
        assert len(printed) == 4 and "'n':" in printed[0] and "'region': 'east'" in printed[1]
        assert printed[3] == "2"
        queried = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=tmp_path,
                                 env=env, capture_output=True, text=True, timeout=300)
        assert queried.returncode == 0, queried.stderr + queried.stdout
        assert '"remaining"' in queried.stdout and '"rows"' in queried.stdout
        docs = urllib.request.urlopen(f"http://127.0.0.1:{port}/docs", timeout=10).read()
        assert b"https://" not in docs  # the OpenAPI docs the README names, offline
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def _wait_for(url: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            assert server.stderr is not None
            raise AssertionError(f"the server exited: {server.stderr.read().decode()}")
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the server did not start in 60 s")
