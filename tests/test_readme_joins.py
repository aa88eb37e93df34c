"""The README's section on several tables runs as written: its shell block (TPC-H from the
``tpchgen-cli`` wheel) and then its Python block, in a scratch folder, with the environment's
own ``bin`` first on PATH (where the wheel puts ``tpchgen-cli``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _blocks() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("### Several tables", 1)[1].split("\n## ", 1)[0]
    section = section.split("\n### ", 1)[0]
    return re.findall(r"```(bash|python)\n(.*?)```", section, flags=re.S)


def test_the_readme_joins_section_runs_as_written(tmp_path: Path) -> None:
    blocks = _blocks()
    assert [kind for kind, _ in blocks] == ["bash", "python"]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}"
                                f"{os.environ.get('PATH', '')}")
    subprocess.run(["bash", "-euo", "pipefail", "-c", blocks[0][1]], cwd=tmp_path, env=env,
                   check=True, timeout=300)
    assert (tmp_path / "tpch" / "lineitem.parquet").is_file()
    done = subprocess.run([sys.executable, "-c", blocks[1][1]], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "revenue_low" in done.stdout and "n_name" in done.stdout
