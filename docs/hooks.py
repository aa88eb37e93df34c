"""MkDocs hooks: the reference pages that are generated from the code at build time.

- ``reference/cli.md``: every ``dpcurator`` command, from the typer app (its click tree).
- ``reference/openapi.md``: the service's endpoints and schemas, from
  ``dpcurator.server.create_app(...).openapi()`` on a throwaway configuration.
- ``benchmarks.md``: ``benchmarks/README.md`` as it stands, so the figures have one home.

Nothing here reaches the network, and a page that cannot be generated fails the build.
"""

from __future__ import annotations

import html
import json
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]


def on_files(files: Files, config: MkDocsConfig) -> Files:
    pages = {
        "reference/cli.md": cli_markdown(),
        "reference/openapi.md": openapi_markdown(),
        "benchmarks.md": benchmarks_markdown(),
    }
    for path, text in pages.items():
        files.append(File.generated(config, path, content=text))
    return files


# -- the command line ---------------------------------------------------------------------------


def cli_markdown() -> str:
    import typer

    from dpcurator.cli import app

    root = typer.main.get_command(app)
    lines = ["# Command line", "",
             "Generated from the `dpcurator` command itself (its typer app) when the site is "
             "built. Every command takes `--json` and then prints one JSON object on stdout; "
             "a user error is one line on stderr (with `--json`, one object "
             '`{"error", "type"}` on stdout) and exit status 2.', ""]
    _command(lines, root, ["dpcurator"], depth=2)
    return "\n".join(lines) + "\n"


def _command(lines: list[str], command: Any, path: list[str], depth: int) -> None:
    # typer ships its own copy of click, so the tree is read by its methods, not by class
    name = " ".join(path)
    context = command.context_class(command, info_name=name)
    lines += [f"{'#' * depth} `{name}`", ""]
    if command.help:
        lines += [_plain(command.help), ""]
    usage = " ".join(command.collect_usage_pieces(context))
    lines += ["```text", f"{name} {usage}".rstrip(), "```", ""]
    rows = []
    for param in command.params:
        argument = param.param_type_name == "argument"
        record = param.get_help_record(context)
        if record is None and not argument:
            continue
        if record is None:  # an argument without help
            record = (param.name.upper(), "")
        what = "`" + record[0].replace("|", "\\|") + "`"
        help_text = record[1]
        rows.append(f"| {what} | {_cell(help_text)} |")
    if rows:
        lines += ["| parameter | meaning |", "| --- | --- |", *rows, ""]
    if hasattr(command, "list_commands"):
        for sub_name in command.list_commands(context):
            sub = command.get_command(context, sub_name)
            if sub is not None and not sub.hidden:
                _command(lines, sub, [*path, sub_name], depth + 1 if depth < 4 else depth)


def _plain(text: str) -> str:
    """A docstring's help, with typer's line-break marker (``\\b``) removed."""
    return text.replace("\b", "").replace("%%", "%").strip()


def _cell(text: str) -> str:
    """One line of Markdown that shows ``text`` as it is: no table break, no link syntax."""
    text = html.escape(" ".join(_plain(text).split()), quote=False)
    for special in ("|", "[", "]", "*", "_"):
        text = text.replace(special, "\\" + special)
    return text


# -- the service's OpenAPI ----------------------------------------------------------------------


def openapi_markdown() -> str:
    spec = openapi_spec()
    lines = ["# Service API (OpenAPI)", "",
             "Generated from `dpcurator.server.create_app(...).openapi()` when the site is "
             "built; a running service serves the same document at `/openapi.json` and an "
             "interactive page at `/docs`. Every request but `/healthz` carries "
             "`Authorization: Bearer TOKEN`. Errors are JSON, "
             '`{"error": {"type", "message"}}`, and charge nothing.', "",
             f"Title: {spec['info']['title']}, version {spec['info']['version']}. "
             f"{spec['info'].get('description', '')}", "",
             "| method | path | what it does |", "| --- | --- | --- |"]
    operations = []
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            operations.append((path, method, operation))
            summary = _cell(operation.get("summary", ""))
            lines.append(f"| `{method.upper()}` | `{path}` | {summary} |")
    lines.append("")
    for path, method, operation in operations:
        lines += [f"## `{method.upper()} {path}`", ""]
        description = operation.get("description")
        if description:
            lines += [_cell(description), ""]
        parameters = operation.get("parameters", [])
        if parameters:
            lines += ["| parameter | in | type | required |", "| --- | --- | --- | --- |"]
            for p in parameters:
                lines.append(f"| `{p['name']}` | {p['in']} | {_type(p.get('schema', {}))} | "
                             f"{'yes' if p.get('required') else 'no'} |")
            lines.append("")
        body = operation.get("requestBody")
        if body:
            schema = next(iter(body["content"].values())).get("schema", {})
            lines += [f"Body: {_type(schema)}.", ""]
        responses = ", ".join(f"{code} ({_cell(r.get('description', ''))})"
                              for code, r in operation.get("responses", {}).items())
        lines += [f"Responses: {responses}.", ""]
    schemas = spec.get("components", {}).get("schemas", {})
    if schemas:
        lines += ["## Schemas", ""]
    for name, schema in schemas.items():
        lines += [f'### {name} {{ #schema-{name.lower()} }}', ""]
        if schema.get("description"):
            lines += [_cell(schema["description"]), ""]
        properties = schema.get("properties", {})
        required = set(schema.get("required", []))
        if properties:
            lines += ["| field | type | required | meaning |", "| --- | --- | --- | --- |"]
            for field, sub in properties.items():
                lines.append(f"| `{field}` | {_type(sub)} | "
                             f"{'yes' if field in required else 'no'} | "
                             f"{_cell(sub.get('description', sub.get('title', '')))} |")
            lines.append("")
    lines += ["## The whole document", "", '??? note "openapi.json"', "",
              "    ```json"]
    lines += ["    " + line for line in json.dumps(spec, indent=2).splitlines()]
    lines += ["    ```", ""]
    return "\n".join(lines)


def openapi_spec() -> dict[str, Any]:
    """The OpenAPI document of a service with one dataset and one analyst (both made up)."""
    from dpcurator.server import create_app
    from dpcurator.server._config import parse_config

    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder)
        (base / "sample.csv").write_text("unit,value\n1,1.0\n2,2.0\n", encoding="utf-8")
        config = parse_config({
            "ledger": "ledger.sqlite",
            "datasets": {"sample": {"path": "sample.csv", "privacy_unit": "unit",
                                    "budget": {"epsilon": 1.0}}},
            "analysts": {"ann": {"token_sha256": "0" * 64,
                                 "budgets": {"sample": {"epsilon": 1.0}}}},
        }, base=base)
        app = create_app(config)
        try:
            spec: dict[str, Any] = app.openapi()
        finally:  # its ledger's verifier would outlive the folder (a warning a minute)
            app.state.service.close()
    return spec


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#schema-{name.lower()})"
    for union in ("anyOf", "oneOf", "allOf"):
        if union in schema:
            return " or ".join(_type(s) for s in schema[union])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    return f"`{kind}`"


# -- benchmarks ---------------------------------------------------------------------------------


def benchmarks_markdown() -> str:
    text = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    note = ("The figures below are `benchmarks/README.md` as it stands in the repository, "
            "with the command that measures each. Run them from a clone (the scripts are in "
            "`benchmarks/`, not in the package).\n\n")
    head, _, rest = text.partition("\n")
    return f"{head}\n\n{note}{rest}"
