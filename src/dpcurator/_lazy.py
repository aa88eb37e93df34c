"""Lazy package exports (PEP 562): a package names its public surface without importing it.

``import dpcurator`` must stay cheap (every command pays it, and most use a small part of the
package), so packages whose parts pull in SciPy, numba or DuckDB export their names through
``exports``: the module-level ``__getattr__`` imports a name's module the first time the name
is used, then stores it in the package, so later uses are plain attribute reads. Each package
also imports the same names under ``typing.TYPE_CHECKING``, so type checkers and IDEs see real
signatures; ``tests/test_public_api.py`` checks that the two lists agree and that every name
resolves.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["exports"]


def exports(package: str, names: Mapping[str, str]
            ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``names`` maps each public name to the
    module that defines it (a submodule's own name maps to the submodule)."""

    def __getattr__(name: str) -> Any:
        source = names.get(name)
        if source is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(source)
        value = module if source == f"{package}.{name}" else getattr(module, name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__
