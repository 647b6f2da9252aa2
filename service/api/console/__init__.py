"""/console: a web console for the operator of one deployment (gallery, enroll, verify, identify,
model), plain HTML, CSS and JavaScript modules shipped in this package and served as static files:
nothing to build, nothing fetched from elsewhere at run time.

The files hold no data: they load without an API key, and every call the page makes goes to the
public API with the key the operator typed (kept in the tab's sessionStorage), so the console can do
nothing the key cannot. Its responses carry a strict Content-Security-Policy: scripts and styles
only from these files (no inline code), connections only to this origin, no framing."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.types import Scope

CONSOLE = "/console"
STATIC = Path(__file__).parent / "static"
# blob: images are the operator's own photos and the chips fetched with the key; media: the camera.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; media-src 'self' blob:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Permissions-Policy": "camera=(self), microphone=(), geolocation=()",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-cache",  # revalidated (ETag): a new version's files are picked up at once
}


def is_console(path: str) -> bool:
    """Whether a request path names the console's static files (which the key check lets through)."""
    return path == CONSOLE or path.startswith(CONSOLE + "/")


class ConsoleFiles(StaticFiles):
    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(HEADERS)
        return response


def install(app: FastAPI) -> None:
    """GET /console answers a redirect to /console/ (the router's), which serves index.html."""
    app.mount(CONSOLE, ConsoleFiles(directory=STATIC, html=True), name="console")
