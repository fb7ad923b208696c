"""The dashboard's web application (Starlette): pages, JSON, server-sent events.

Routes: ``/`` the page; ``/static/...`` its script and style; ``/api/state``
the live state as JSON; ``/api/stream`` the same pushed as server-sent events
at every change; ``/api/flows`` (filtered by ``state``, ``name``, ``since``,
``until``, ``worker``), ``/api/flows/{flow}`` and
``/api/flows/{flow}/graph.svg`` the persisted flows (404 without
``--backend``); ``/api/jobs`` (the same filters) the jobs a board lists
(404 without ``--board``); ``/api/deadletters`` the dead letters waiting;
``POST /api/actions/{action}`` an action (see :mod:`.actions`).

With credentials (:mod:`.auth`) every route but the page's shell, script
and style needs them (401 otherwise: nothing is read, nothing done), and
actions are allowed; without, actions are refused (403) and not shown.
An action must come from the page itself: a POST with a JSON body and the
``X-Flowengine-Dashboard`` header, which a page of another site can send
neither with a form nor (no CORS is allowed here) with a script.
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
from flowengine.dashboard import actions as actions_mod
from flowengine.dashboard import auth
from flowengine.dashboard.flows import FlowsSource
from flowengine.dashboard.history import BadFilter, HistoryFilter
from flowengine.dashboard.jobs import JOB_STATES, JobsSource
from flowengine.dashboard.live import LiveState
from flowengine.engines.action_engine import graph_draw

LOG = logging.getLogger(__name__)

#: Folder of the page, its script and its style.
STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")

#: Seconds between keep-alive comments on a quiet event stream: proxies and
#: browsers drop a connection silent for long.
KEEPALIVE_S = 15.0

#: Header an action request must carry (with a JSON body): proof it comes from
#: a script of this page, not a form or a script of another site.
ACTION_HEADER = "X-Flowengine-Dashboard"


class RequireCredentials:
    """ASGI middleware: 401 for a request without valid credentials (when any are set).

    The page's shell, script, style and icon are open (they hold no data)
    unless basic-auth users exist: then the page itself asks, so the
    browser prompts once and sends them with every later request. Who was
    let in is in ``request.state.who``.
    """

    def __init__(self, app: Any, credentials: auth.Credentials) -> None:
        self.app = app
        self.credentials = credentials

    def _open(self, path: str) -> bool:
        if path.startswith("/static/") or path == "/favicon.ico":
            return True
        return path == "/" and not self.credentials.users

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client") or ("?", 0)
        who = "anonymous"
        if self.credentials.enabled and not self._open(scope["path"]):
            headers = dict(scope.get("headers") or [])
            found = self.credentials.who(headers.get(b"authorization", b"").decode("latin-1"))
            if found is None:
                response = JSONResponse(
                    {
                        "error": "credentials missing or wrong: this dashboard needs its"
                        " token (Authorization: Bearer ...) or a user's password"
                    },
                    status_code=401,
                    headers={"WWW-Authenticate": self.credentials.challenge()},
                )
                await response(scope, receive, send)
                return
            who = found
        scope.setdefault("state", {})["who"] = f"{who} from {client[0]}"
        await self.app(scope, receive, send)


def build_app(
    live: LiveState,
    flows: FlowsSource | None,
    credentials: auth.Credentials | None = None,
    actions: actions_mod.Actions | None = None,
    jobs: JobsSource | None = None,
) -> Starlette:
    """The application over ``live`` (started by the caller, stopped with the app) and ``flows``.

    ``actions`` are allowed only with ``credentials`` (read-only otherwise).
    """
    credentials = credentials or auth.Credentials()
    if not credentials.enabled:
        actions = None

    def current(snapshot: dict[str, Any]) -> dict[str, Any]:
        return dict(
            snapshot,
            flows_enabled=flows is not None,
            jobs_enabled=jobs is not None,
            actions_enabled=actions is not None,
        )

    async def index(request: Request) -> Response:
        return FileResponse(os.path.join(STATIC_DIR, "index.html"))

    async def favicon(request: Request) -> Response:
        # Browsers ask for /favicon.ico whatever the page links: no 404 in logs.
        return FileResponse(os.path.join(STATIC_DIR, "favicon.svg"), media_type="image/svg+xml")

    async def state(request: Request) -> Response:
        return JSONResponse(current(live.snapshot()))

    async def stream(request: Request) -> Response:
        async def events() -> AsyncIterator[str]:
            version = -1
            while not await request.is_disconnected():
                new = await anyio.to_thread.run_sync(live.wait_change, version, KEEPALIVE_S)
                if new == version:
                    yield ": keep-alive\n\n"
                    continue
                version = new
                snapshot = current(live.snapshot())
                yield f"data: {json.dumps(snapshot)}\n\n"

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    def _flows() -> FlowsSource:
        if flows is None:
            raise CommandError("no --backend: the dashboard shows no persisted flows")
        return flows

    async def flow_list(request: Request) -> Response:
        try:
            only = HistoryFilter.from_query(
                request.query_params, request.query_params.getlist("state")
            )
        except BadFilter as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        try:
            return JSONResponse(await anyio.to_thread.run_sync(_flows().list, only))
        except CommandError as e:
            return JSONResponse({"error": str(e)}, status_code=404)

    async def job_list(request: Request) -> Response:
        if jobs is None:
            return JSONResponse(
                {"error": "no --board: the dashboard shows no jobs"}, status_code=404
            )
        try:
            only = HistoryFilter.from_query(
                request.query_params,
                request.query_params.getlist("state"),
                known=JOB_STATES,
                kind="job",
            )
        except BadFilter as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        return JSONResponse(await anyio.to_thread.run_sync(jobs.list, only))

    async def dead_letters(request: Request) -> Response:
        workers = live.snapshot()["workers"]
        try:
            found = await anyio.to_thread.run_sync(_dead_letters, live, workers)
        except Exception as e:
            return JSONResponse({"error": f"{type(e).__name__}: {e}"}, status_code=502)
        return JSONResponse(found)

    async def action(request: Request) -> Response:
        name = request.path_params["action"]
        if actions is None:
            return JSONResponse(
                {
                    "error": "this dashboard is read-only: start it with"
                    " --token-file or --basic-auth-file (or their"
                    " environment variables) to allow actions"
                },
                status_code=403,
            )
        problem = _csrf_problem(request)
        if problem is not None:
            LOG.warning("Dashboard action %s by %s refused: %s", name, request.state.who, problem)
            return JSONResponse({"error": problem}, status_code=403)
        try:
            fields = await request.json()
        except ValueError:
            fields = None
        if not isinstance(fields, dict):
            return JSONResponse({"error": "an action's body is a JSON object"}, status_code=400)
        try:
            outcome = await anyio.to_thread.run_sync(actions.run, name, fields, request.state.who)
        except actions_mod.ActionRefused as e:
            return JSONResponse({"ok": False, "error": str(e)}, status_code=e.status)
        return JSONResponse(outcome.to_dict())

    async def flow_detail(request: Request) -> Response:
        try:
            return JSONResponse(
                await anyio.to_thread.run_sync(_flows().detail, request.path_params["flow"])
            )
        except CommandError as e:
            return JSONResponse({"error": str(e)}, status_code=404)

    async def flow_graph(request: Request) -> Response:
        try:
            svg = await anyio.to_thread.run_sync(_flows().graph_svg, request.path_params["flow"])
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
        Route("/api/jobs", job_list),
        Route("/api/deadletters", dead_letters),
        Route("/api/actions/{action}", action, methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.add_middleware(RequireCredentials, credentials=credentials)
    return app


def _csrf_problem(request: Request) -> str | None:
    """Why an action request may come from another site (None: it comes from the page)."""
    if request.headers.get(ACTION_HEADER) != "1":
        return f"an action needs the {ACTION_HEADER}: 1 header (sent by the page's script)"
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        return "an action's body is JSON (Content-Type: application/json)"
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
        return f"an action from another origin ({origin}) is refused"
    return None


def _dead_letters(live: LiveState, workers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each dead-letter queue that holds messages, with them (bodies left out)."""
    from flowengine.commands import queues_cmd
    from flowengine.engines.worker_based.messaging import dead_letter_reader as dlr
    from flowengine.engines.worker_based.messaging import dead_letters, inventory

    names = queues_cmd.dead_letter_queues(live.exchange, workers, [])
    found = inventory.describe_queues(live.broker, live.exchange, names, {})
    return [
        {
            "queue": q.name,
            "messages": q.messages,
            "letters": [
                letter.as_dict(body=False)
                for letter in dlr.read_dead_letters(live.broker, live.exchange, q.name)
            ],
        }
        for q in found
        if dead_letters.is_dead_letter_queue(q.name) and q.messages
    ]
