"""The browser playground: GET /playground and its static files, served from the package (no build step, nothing
fetched from elsewhere). The page holds no secret and talks to the public API only, so it needs no key of its
own; the visitor's key stays in the tab's memory and every request it makes is checked as any client's."""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import RedirectResponse, Response

PATH = "/playground"
PAGE = "index.html"
ASSETS = {"playground.js": "text/javascript", "playground.css": "text/css", "recorder.js": "text/javascript"}
# The browser itself keeps the page to this server: scripts, styles, requests and sockets from its own origin only
# ('self' covers ws:/wss: to the same host), audio from the blob: URLs it builds for playback and download.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "media-src 'self' blob:; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Permissions-Policy": "microphone=(self)",
    "Cache-Control": "no-cache",  # fetched afresh (a few KB), so an upgraded server serves its own page
}


def _file(data: bytes, media_type: str):
    async def serve() -> Response:
        return Response(data, media_type=f"{media_type}; charset=utf-8", headers=HEADERS)

    return serve


def install(app: FastAPI) -> None:
    here = resources.files(__package__)

    async def root() -> Response:
        # relative, so that it also holds behind a proxy that serves the API under a path prefix
        return RedirectResponse(PATH.lstrip("/"), status_code=307)

    app.add_api_route("/", root, methods=["GET"], include_in_schema=False)
    app.add_api_route(PATH, _file(here.joinpath(PAGE).read_bytes(), "text/html"), methods=["GET"],
                      include_in_schema=False)
    for name, media_type in ASSETS.items():
        app.add_api_route(f"{PATH}/{name}", _file(here.joinpath(name).read_bytes(), media_type), methods=["GET"],
                          include_in_schema=False)
