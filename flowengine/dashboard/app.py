"""The dashboard's web application (Starlette): pages, JSON, server-sent events.

Routes: ``/`` the page; ``/static/...`` its script and style; ``/api/state``
the live state as JSON; ``/api/stream`` the same pushed as server-sent events
at every change; ``/api/flows``, ``/api/flows/{flow}`` and
``/api/flows/{flow}/graph.svg`` the persisted flows (404 without
``--backend``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from flowengine.commands.errors import CommandError
from flowengine.dashboard.flows import FlowsSource
from flowengine.dashboard.live import LiveState
from flowengine.engines.action_engine import graph_draw

LOG = logging.getLogger(__name__)

#: Folder of the page, its script and its style.
STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")

#: Seconds between keep-alive comments on a quiet event stream: proxies and
#: browsers drop a connection silent for long.
KEEPALIVE_S = 15.0


def build_app(live: LiveState, flows: FlowsSource | None) -> Starlette:
    """The application over ``live`` (started by the caller, stopped with the app) and ``flows``."""

    async def index(request: Request) -> Response:
        return FileResponse(os.path.join(STATIC_DIR, "index.html"))

    async def favicon(request: Request) -> Response:
        # Browsers ask for /favicon.ico whatever the page links: no 404 in logs.
        return FileResponse(os.path.join(STATIC_DIR, "favicon.svg"), media_type="image/svg+xml")

    async def state(request: Request) -> Response:
        return JSONResponse(dict(live.snapshot(), flows_enabled=flows is not None))

    async def stream(request: Request) -> Response:
        async def events() -> AsyncIterator[str]:
            version = -1
            while not await request.is_disconnected():
                new = await anyio.to_thread.run_sync(live.wait_change, version, KEEPALIVE_S)
                if new == version:
                    yield ": keep-alive\n\n"
                    continue
                version = new
                snapshot = dict(live.snapshot(), flows_enabled=flows is not None)
                yield f"data: {json.dumps(snapshot)}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    def _flows() -> FlowsSource:
        if flows is None:
            raise CommandError("no --backend: the dashboard shows no persisted flows")
        return flows

    async def flow_list(request: Request) -> Response:
        try:
            return JSONResponse(await anyio.to_thread.run_sync(_flows().list))
        except CommandError as e:
            return JSONResponse({"error": str(e)}, status_code=404)

    async def flow_detail(request: Request) -> Response:
        try:
            return JSONResponse(await anyio.to_thread.run_sync(
                _flows().detail, request.path_params["flow"]))
        except CommandError as e:
            return JSONResponse({"error": str(e)}, status_code=404)

    async def flow_graph(request: Request) -> Response:
        try:
            svg = await anyio.to_thread.run_sync(_flows().graph_svg,
                                                 request.path_params["flow"])
        except CommandError as e:
            return JSONResponse({"error": str(e)}, status_code=404)
        except graph_draw.GraphvizMissing as e:
            return JSONResponse({"error": str(e)}, status_code=503)
        return Response(svg, media_type="image/svg+xml")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(live.stop)

    routes: list[Any] = [
        Route("/", index),
        Route("/favicon.ico", favicon),
        Route("/api/state", state),
        Route("/api/stream", stream),
        Route("/api/flows", flow_list),
        Route("/api/flows/{flow}", flow_detail),
        Route("/api/flows/{flow}/graph.svg", flow_graph),
        Mount("/static", app=StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
