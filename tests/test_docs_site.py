"""The documentation site builds strictly and offline, and its reference is complete.

One ``mkdocs build --strict`` (what ``scripts/docs`` runs) into a scratch folder: a warning
(a broken link, a cross-reference that does not resolve, a docstring mkdocstrings cannot read)
fails it. Then the built pages are read: nothing in them is fetched from another host, every
name of every public package's ``__all__`` is in the Python reference, every command is in the
command-line page and every endpoint in the OpenAPI page.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mkdocs", reason="the docs extra is not installed")
pytest.importorskip("mkdocstrings_handlers.python", reason="the docs extra is not installed")
pytest.importorskip("fastapi", reason="the server extra is not installed")

import dpcurator
from test_exported_members import EXPORTED

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference" / "python"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    source = str(Path(dpcurator.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": source, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                            str(folder)], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    assert "WARNING" not in built.stderr, built.stderr
    return folder


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def test_nothing_is_fetched_from_another_host(site: Path) -> None:
    """No web font, script, style or image from elsewhere: the site works offline."""
    pages = list(site.rglob("*.html"))
    assert len(pages) > 20
    remote = re.compile(r"""<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=["'](?:https?:)?//""")
    for page in pages:
        text = _text(page)
        assert not remote.search(text), page
        assert "fonts.googleapis" not in text and "fonts.gstatic" not in text, page
    for style in site.rglob("*.css"):
        assert not re.search(r"@import\s+url\(\s*['\"]?(?:https?:)?//", _text(style)), style


def test_every_public_name_is_in_the_python_reference(site: Path) -> None:
    """Each name of each public package's ``__all__``: rendered where it is defined (an anchor
    with its full name), or linked from its package's page to where it is rendered."""
    assert set(EXPORTED) == {p.stem if p.stem == "dpcurator" else f"dpcurator.{p.stem}"
                             for p in REFERENCE.glob("*.md") if p.stem != "index"}
    anchors = set()
    for page in (site / "reference" / "python").rglob("index.html"):
        anchors |= set(re.findall(r'\bid="(dpcurator[\w.]*)"', _text(page)))
    missing = []
    for package in EXPORTED:
        module = importlib.import_module(package)
        name = package.rpartition(".")[2]
        markdown = _text(REFERENCE / f"{name}.md")
        for public in module.__all__:
            rendered = f"::: {package}.{public}\n" in markdown
            linked = re.search(rf"\[`{re.escape(public)}`\](\[[\w.]+\]|\([\w.]+\))", markdown)
            if rendered:
                if f"{package}.{public}" not in anchors:
                    missing.append(f"{package}.{public} (not rendered)")
            elif not linked and not (public == "__version__" and "`__version__`" in markdown):
                missing.append(f"{package}.{public}")
    assert not missing, missing


def test_the_command_line_page_has_every_command(site: Path) -> None:
    import typer

    from dpcurator.cli import app

    page = _text(site / "reference" / "cli" / "index.html")
    root = typer.main.get_command(app)

    def walk(command: Any, path: list[str]) -> None:
        assert f"<code>{' '.join(path)}</code>" in page, path
        if hasattr(command, "list_commands"):
            context = command.context_class(command, info_name=path[-1])
            for name in command.list_commands(context):
                walk(command.get_command(context, name), [*path, name])

    walk(root, ["dpcurator"])
    assert "--privacy-unit" in page and "--journal" in page


def test_the_openapi_page_has_every_endpoint(site: Path) -> None:
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        hooks = importlib.import_module("hooks")
    finally:
        sys.path.remove(str(ROOT / "docs"))
    spec = hooks.openapi_spec()
    page = _text(site / "reference" / "openapi" / "index.html")
    for path, methods in spec["paths"].items():
        for method in methods:
            assert f"<code>{method.upper()} {path}</code>" in page, (method, path)


def test_the_configuration_page_names_exactly_the_keys_the_parser_accepts() -> None:
    """Every table of ``docs/reference/configuration.md`` lists the keys that
    ``dpcurator.server``'s parser allows there (read from its own refusal of an unknown key),
    and the page's example is a configuration the parser accepts."""
    from dpcurator.errors import ConfigError
    from dpcurator.server._config import parse_config

    page = _text(ROOT / "docs" / "reference" / "configuration.md")
    documented: dict[str, set[str]] = {}
    for table, body in re.findall(r"^## `(.+?)`\n(.*?)(?=^## |\Z)", page, flags=re.S | re.M):
        documented[table] = set(re.findall(r"^\| `(\w+)` \|", body, flags=re.M))
    token = {"token_sha256": "0" * 64}
    dataset = {"path": "orders.csv", "privacy_unit": "customer_id",
               "budget": {"epsilon": 1.0}}
    analyst = {**token, "budgets": {"orders": {"epsilon": 1.0}}}
    tables = {
        "top level": lambda extra: {"datasets": {"orders": dataset},
                                    "analysts": {"ann": analyst}, **extra},
        "[datasets.NAME]": lambda extra: {"datasets": {"orders": {**dataset, **extra}},
                                          "analysts": {"ann": analyst}},
        "[analysts.NAME]": lambda extra: {"datasets": {"orders": dataset},
                                          "analysts": {"ann": {**analyst, **extra}}},
        "[owners.NAME]": lambda extra: {"datasets": {"orders": dataset},
                                        "analysts": {"ann": analyst},
                                        "owners": {"olga": {"token_sha256": "1" * 64,
                                                            **extra}}},
        "[limits]": lambda extra: {"datasets": {"orders": dataset},
                                   "analysts": {"ann": analyst}, "limits": extra},
    }
    assert set(documented) == set(tables)
    for table, make in tables.items():
        with pytest.raises(ConfigError) as refused:
            parse_config(make({"no_such_key": 1}), base=ROOT / "examples")
        allowed = set(re.findall(r"'(\w+)'", str(refused.value).split("allowed:")[1]))
        assert documented[table] == allowed, table
    example = re.search(r"```toml\n(.*?)```", page, flags=re.S)
    assert example is not None
    parse_config(tomllib.loads(example.group(1)), base=ROOT / "examples")
