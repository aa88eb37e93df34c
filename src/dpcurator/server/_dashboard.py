"""The dashboard: static pages served at ``/`` by the service itself (no second server, no
build step: plain HTML, small ES modules, and the libraries in ``static/vendor``, fetched
from npm by ``scripts/fetch-frontend`` and checked in with their licences).

The pages and scripts are public on purpose: they hold no data. Everything they show comes
from the API, asked with the bearer token the user pastes on the sign-in page (kept in the
tab's ``sessionStorage``, sent as ``Authorization: Bearer``), so a page shows exactly what
that token may read and nothing more. A strict Content-Security-Policy (scripts, styles and
connections from this origin only, no inline script) keeps a stored query text from ever
running as script; the scripts also write every value as text, never as HTML.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response

__all__ = ["STATIC", "add_dashboard"]

STATIC = Path(__file__).with_name("static")
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


def add_dashboard(app: FastAPI, notes: Callable[..., dict[str, Any]]) -> None:
    """``GET /`` (the one page; its views are the URL's fragment) and ``GET /static/...``
    (its scripts, style and libraries: only files under ``static/`` of the known types).
    ``notes`` records the request's action for its audit line."""

    @app.get("/", include_in_schema=False)
    def dashboard(request: Request) -> Response:
        notes(request, action="dashboard")
        return _file(STATIC / "index.html", "no-cache")

    @app.get("/static/{path:path}", include_in_schema=False)
    def static(path: str, request: Request) -> Response:
        notes(request, action="dashboard")
        found = _resolve(path)
        if found is None:
            return JSONResponse({"error": {"type": "not_found", "message": "no such file"}},
                                status_code=404)
        # The libraries change only with the package; our own scripts are revalidated.
        return _file(found, "public, max-age=86400" if path.startswith("vendor/")
                     else "no-cache")


def _resolve(path: str) -> Path | None:
    """The file ``path`` names under ``static/`` (no way out of it), of a type we serve."""
    root = STATIC.resolve()
    try:
        found = (root / path).resolve()
    except (OSError, ValueError):
        return None
    if not found.is_relative_to(root) or found.suffix not in _TYPES or not found.is_file():
        return None
    return found


def _file(path: Path, cache: str) -> FileResponse:
    return FileResponse(path, media_type=_TYPES[path.suffix],
                        headers={**_HEADERS, "Cache-Control": cache})
