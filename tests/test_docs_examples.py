"""Every code block of the README and the documentation runs, in page order, as a reader would.

A small collector of our own rather than a plugin: pytest-markdown-docs runs Python blocks
only, each in the test process with no shared scratch folder, and pytest-examples is made
for checking formatting of examples; our pages interleave shell and Python (make a token in
the shell, then use it from Python), start a service in the background with ``&``, and need
a folder holding the repository's sample data. This file is all of it: parse, run, compare.

Per page, in a fresh scratch folder holding a copy of ``examples/`` (what a clone has):

- a ``bash`` block runs under ``bash -euo pipefail`` with this environment's ``bin`` first on
  PATH; a last line ending in `` &`` starts a background process instead (for
  ``dpcurator serve ... --port 8000``, the collector waits until ``/healthz`` answers), stopped
  when the page ends. Port 8000 becomes a free port on the whole page.
- a ``python`` block runs in this process, in one namespace per page (later blocks see what
  earlier ones made), with the scratch folder as working directory.
- a ``text`` block announced by ``<!-- docs: output -->`` is the printed output of the block
  just before it, compared as doctest compares (``...`` matches anything, whitespace runs
  are equal); ``<!-- docs: output, numbers vary -->`` compares it with every number replaced,
  for outputs whose words and shape are fixed but whose values are noisy.
- ``<!-- docs: not run: REASON -->`` marks an illustrative block; there are few of them, and
  ``test_illustrative_blocks_are_few`` holds the list.
"""

from __future__ import annotations

import contextlib
import doctest
import io
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

import dpcurator

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
RUN = {"python", "bash"}
KNOWN = RUN | {"text", "toml", "json", "nginx"}  # nginx: a proxy's configuration, shown
NUMBER = re.compile(r"[-+]?(?:\d[\d,_]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
MARKER = re.compile(r"^<!-- docs: (.+?) -->$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # where the fence opens (1-based)
    language: str
    code: str
    marker: str | None  # the docs: comment on the line before the fence

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, with the marker just above each (indented ones too)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = re.match(r"^(\s*)```(\S*)\s*$", lines[i])
        if not opening:
            i += 1
            continue
        indent, language = opening.groups()
        end = i + 1
        while not re.match(rf"^{indent}```\s*$", lines[end]):
            end += 1
        code = "\n".join(line[len(indent):] for line in lines[i + 1:end]) + "\n"
        above = lines[i - 1].strip() if i else ""
        marker = MARKER.match(above)
        found.append(Block(page, i + 1, language, code, marker.group(1) if marker else None))
        i = end + 1
    return found


def _runnable_pages() -> list[Path]:
    return [p for p in PAGES if any(b.language in RUN and b.marker is None for b in blocks(p))]


def test_every_block_is_known_and_marked_sensibly() -> None:
    """No block escapes the collector under another language name, and markers are spelled."""
    for page in PAGES:
        previous: Block | None = None
        for block in blocks(page):
            assert block.language in KNOWN, f"{block.where}: fence language {block.language!r}"
            if block.marker is not None:
                assert (block.marker.startswith("not run: ")
                        or block.marker in ("output", "output, numbers vary")), block.where
            if block.marker and block.marker.startswith("output"):
                assert block.language == "text", block.where
                assert previous is not None and previous.language in RUN, block.where
                assert previous.marker is None, f"{block.where}: output of a block not run"
            previous = block


def test_the_readme_links_to_files_that_exist() -> None:
    """The README is read on the forge, outside the site's strict build: its links are
    checked here."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t]
    assert local and all((ROOT / t).exists() for t in local), local


def test_illustrative_blocks_are_few() -> None:
    """The blocks not run, each with its reason: a new one is a deliberate change here."""
    skipped = sorted(f"{b.page.relative_to(ROOT)}: {b.marker}" for p in PAGES
                     for b in blocks(p) if b.marker and b.marker.startswith("not run: "))
    assert len(skipped) <= 10, skipped


@pytest.mark.parametrize("page", _runnable_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_page_runs_as_written(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                              ) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    port = str(_free_port())
    source = str(Path(dpcurator.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": source,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("DPCURATOR_TOKEN", None)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__main__"}
    background: list[subprocess.Popen[bytes]] = []
    printed: str | None = None
    try:
        for block in blocks(page):
            code = block.code.replace("127.0.0.1:8000", f"127.0.0.1:{port}").replace(
                "--port 8000", f"--port {port}")
            if block.marker and block.marker.startswith("output"):
                assert printed is not None
                _compare(block, printed)
                continue
            if block.language not in RUN or block.marker is not None:
                continue
            if block.language == "python":
                printed = _run_python(block, code, namespace)
            else:
                printed = _run_bash(block, code, tmp_path, env, port, background)
    finally:
        for process in background:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)


def _run_python(block: Block, code: str, namespace: dict[str, object]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, block.where, "exec"), namespace)
    return out.getvalue()


def _run_bash(block: Block, code: str, folder: Path, env: dict[str, str], port: str,
              background: list[subprocess.Popen[bytes]]) -> str:
    lines = code.rstrip().splitlines()
    last = re.match(r"^(.*[^&])&\s*(#.*)?$", lines[-1]) if lines else None
    if last:
        lines = lines[:-1]
    out = ""
    if lines:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(lines)], cwd=folder,
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{block.where}: exit {done.returncode}\n{done.stderr}"
        out = done.stdout
    if last:
        process = subprocess.Popen(["bash", "-c", f"exec {last.group(1)}"], cwd=folder,
                                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   start_new_session=True)
        background.append(process)
        if "dpcurator serve" in last.group(1):
            _wait_for(f"http://127.0.0.1:{port}/healthz", process, block)
    return out


def _compare(block: Block, printed: str) -> None:
    want, got = block.code, printed
    if block.marker == "output, numbers vary":
        want, got = NUMBER.sub("#", want), NUMBER.sub("#", got)
    checker = doctest.OutputChecker()
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    assert checker.check_output(want, got, flags), (
        f"{block.where}: the page shows\n{block.code}\nbut the block printed\n{printed}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(url: str, process: subprocess.Popen[bytes], block: Block) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            assert process.stderr is not None
            raise AssertionError(f"{block.where}: exited: {process.stderr.read().decode()}")
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{block.where}: the service did not answer in 60 s")
