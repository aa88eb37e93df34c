"""Start-up stays cheap: ``import dpcurator`` and every ``--help`` load no numeric stack.

Not a timing test (timings are in ``benchmarks/startup.py``): each check runs in a fresh
interpreter and looks at ``sys.modules``, so it holds on any machine, however loaded. The
heavy libraries load only inside the commands that use them (see ``dpcurator._lazy`` and the
imports inside the functions of ``dpcurator.cli``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

#: Imported only by the work itself: the samplers, the accountants, the engine, the figures.
HEAVY = ("numpy", "pandas", "scipy", "numba", "duckdb", "matplotlib")

#: Every group's and command's help, all of which must start without the heavy libraries.
HELPS = [
    [], ["account"], ["account", "convert"], ["account", "dpsgd"], ["account", "compose"],
    ["demo"], ["explain"], ["query"], ["ledger"], ["ledger", "verify"], ["ledger", "show"],
    ["ledger", "export"], ["ledger", "raise"], ["ledger", "migrate"], ["survey"],
    ["survey", "simulate"], ["survey", "estimate"], ["survey", "plan"], ["survey", "config"],
]


def _loaded(code: str) -> dict[str, list[str]]:
    """Run ``code`` in a fresh interpreter; it prints a JSON object as its last line."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert isinstance(result, dict)
    return result


def _top_level(modules: list[str]) -> set[str]:
    return {name.split(".")[0] for name in modules}


def test_import_dpcurator_loads_no_heavy_library() -> None:
    found = _loaded("""
        import json, sys
        import dpcurator, dpcurator.accounting, dpcurator.local
        print(json.dumps({"modules": sorted(sys.modules)}))
    """)
    assert _top_level(found["modules"]) & {*HEAVY, "rich", "typer"} == set()


def test_import_cli_loads_no_heavy_library() -> None:
    found = _loaded("""
        import json, sys
        import dpcurator.cli, dpcurator.local.client
        print(json.dumps({"modules": sorted(sys.modules)}))
    """)
    assert _top_level(found["modules"]) & set(HEAVY) == set()


def test_every_help_loads_no_heavy_library() -> None:
    """``dpcurator ... --help`` for every group and command, one after another in one process:
    a heavy import is reported against the first help that made it."""
    found = _loaded(f"""
        import contextlib, io, json, sys
        from dpcurator.cli import app

        heavy = {HEAVY!r}
        result = {{}}
        for args in {HELPS!r}:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                try:
                    app([*args, "--help"], prog_name="dpcurator")
                except SystemExit as exc:
                    assert exc.code in (0, None), (args, exc.code)
            assert "Usage" in out.getvalue(), args
            result[" ".join(args) or "(root)"] = sorted(
                m for m in sys.modules if m.split(".")[0] in heavy)
        print(json.dumps(result))
    """)
    assert len(found) == len(HELPS)
    assert {args: modules for args, modules in found.items() if modules} == {}


def test_the_cli_help_lists_the_same_mechanisms_as_the_library() -> None:
    """``dpcurator survey`` names the mechanisms from the standard-library client (cheap to
    import); the library's list must be the same."""
    from dpcurator.local import client, survey

    assert client.MECHANISMS == survey.MECHANISMS
