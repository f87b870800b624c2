"""The dashboard's ASGI application (Starlette): pages, JSON, live events, actions.

Routes (relative to ``root_path``, which a reverse proxy that serves the
dashboard under a prefix sets; see ``docs/dashboard.md``):

- ``GET /``: the page (``static/``: plain HTML, CSS and JavaScript shipped
  in the wheel, no build step; every URL in it is relative, so it works
  under any prefix); ``GET /?token=...`` logs in (see :mod:`.access`);
- ``GET /api/session``: the namespace, the mode, and for a logged-in page
  of a dashboard with actions the CSRF token its actions carry;
- ``GET /api/state``: one reading of the namespace (see :mod:`.live`);
- ``GET /api/events``: server-sent events: ``state`` (the namespace, on
  every change) and ``tasks`` (tasks in flight and the task statistics of
  the last hour, when they change), driven by the queues' wake-ups;
- ``GET /api/queues/<queue>``: a queue's messages per state;
- ``GET /api/tasks/find?id=<id>``: a task by its framework's id (or a
  message ID), wherever it is (see :mod:`.tasks`);
- ``GET /api/tasks/running``, ``GET /api/tasks/dead``: tasks in flight;
  dead letters with their task names and errors;
- ``GET /api/tasks/stats?minutes=60&name=<task>``: per-minute task
  statistics (every name, or one) and each name's summary;
- ``POST /api/dead-letters/<queue>/requeue`` (retry: ``{"target": ...,
  "ids": [...] or null}``), ``.../delete`` (``{"ids": [...]}``) and
  ``.../purge``: each one script, so all or nothing; refused unless
  :meth:`.access.Access.action_refusal` lets them through.

Nothing sent to a page names the server's address or password.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from typing import Any, Final

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from simplebroker_redis.calls.operations import MAX_INSPECT, inspect
from simplebroker_redis.calls.tasks import task_stats_read
from simplebroker_redis.runner import AsyncRedisRunner
from simplebroker_redis.validation import validate_queue_name

from ..task_summary import names_table, series
from .access import COOKIE, Access
from .actions import perform, queue_json
from .live import LiveState, read_state, state_json
from .tasks import Reader

#: Most seconds the stop waits for the reader and the pools to close.
SHUTDOWN_SECONDS: Final[float] = 5.0

#: Seconds between comment lines on an idle event stream (keeps proxies open).
KEEPALIVE_SECONDS: Final[float] = 15.0

#: Most minutes a statistics request reads (the records' retention).
MAX_MINUTES: Final[int] = 480

#: Longest task id a search takes.
MAX_QUERY: Final[int] = 256

STATIC = resources.files("simplebroker_redis") / "ops" / "dashboard" / "static"

Handler = Callable[[Request], Awaitable[Response]]


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


class _Dashboard:
    """The handlers of one dashboard (see the module docstring)."""

    def __init__(self, runner: AsyncRedisRunner, access: Access, refresh: float) -> None:
        self.runner = runner
        self.access = access
        self.live = LiveState(runner, refresh=refresh)
        self.namespace = runner.keys.namespace

    def guarded(self, handler: Handler) -> Handler:
        async def run(request: Request) -> Response:
            if not self.access.logged_in(request):
                headers = self.access.challenge()
                return PlainTextResponse("log in first", status_code=401, headers=headers)
            return await handler(request)

        return run

    async def index(self, request: Request) -> Response:
        access = self.access
        given = request.query_params.get("token")
        if access.token is not None and given is not None:
            if not secrets.compare_digest(given, access.token):
                return PlainTextResponse("wrong token", status_code=401)
            root = request.scope.get("root_path", "") or ""
            response = RedirectResponse(root + "/", status_code=303)
            response.set_cookie(
                COOKIE, given, httponly=True, samesite="strict", path=root + "/" if root else "/"
            )
            return response
        if not access.logged_in(request):
            hint = "open /?token=<token> once" if access.token else "log in"
            return PlainTextResponse(
                f"a login is required: {hint}", status_code=401, headers=access.challenge()
            )
        with resources.as_file(STATIC / "index.html") as path:
            return FileResponse(path, headers={"cache-control": "no-store"})

    async def session(self, request: Request) -> Response:
        access = self.access
        body: dict[str, Any] = {
            "namespace": self.namespace,
            "actions": access.allow_actions and access.login_required,
            "login": "token" if access.token else "basic" if access.basic else None,
        }
        if body["actions"]:
            body["csrf"] = access.csrf
        return JSONResponse(body, headers={"cache-control": "no-store"})

    async def state(self, request: Request) -> Response:
        body = state_json(await read_state(self.runner), self.namespace)
        body["actions"] = self.access.allow_actions
        return JSONResponse(body)

    async def events(self, request: Request) -> Response:
        queue = self.live.subscribe()
        hello = json.dumps({"actions": self.access.allow_actions and self.access.login_required})

        async def stream() -> AsyncIterator[str]:
            try:
                yield f"event: hello\ndata: {hello}\n\n"
                while True:
                    try:
                        async with asyncio.timeout(KEEPALIVE_SECONDS):
                            kind, data = await queue.get()
                    except TimeoutError:
                        yield ": keep-alive\n\n"
                        continue
                    yield f"event: {kind}\ndata: {data}\n\n"
            finally:
                self.live.unsubscribe(queue)

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    async def queue_view(self, request: Request) -> Response:
        name = request.path_params["queue"]
        try:
            validate_queue_name(name)
            limit = int(request.query_params.get("limit", "100"))
            if not 1 <= limit <= MAX_INSPECT:
                raise ValueError(f"limit must be 1 to {MAX_INSPECT}")
        except (ValueError, TypeError) as exc:
            return _error(str(exc), 400)
        reading = await read_state(self.runner)
        dead = name in reading.dead_letter_queues
        view = await self.runner.run(inspect(name, limit, journal=dead))
        holders = state_json(reading, self.namespace)["holders"]
        return JSONResponse(queue_json(name, dead, view, holders, reading.now_us))

    async def reader(self) -> Reader:
        return Reader(self.runner, await read_state(self.runner))

    async def find(self, request: Request) -> Response:
        query = request.query_params.get("id", "").strip()
        if not query or len(query) > MAX_QUERY:
            return _error(f"give the task's id (1 to {MAX_QUERY} characters): ?id=...", 400)
        return JSONResponse(await (await self.reader()).find(query))

    async def running(self, request: Request) -> Response:
        return JSONResponse(await (await self.reader()).running())

    async def dead(self, request: Request) -> Response:
        return JSONResponse(await (await self.reader()).dead_letters())

    async def stats(self, request: Request) -> Response:
        try:
            minutes = int(request.query_params.get("minutes", "60"))
            if not 1 <= minutes <= MAX_MINUTES:
                raise ValueError(f"minutes must be 1 to {MAX_MINUTES}")
        except ValueError as exc:
            return _error(str(exc), 400)
        name = request.query_params.get("name", "")
        reading = await read_state(self.runner)
        last = reading.now_us // 60_000_000
        page = await self.runner.run(task_stats_read(last - minutes + 1, last))
        return JSONResponse(
            {
                "name": name,
                **series(page, last - minutes + 1, last, name),
                "names": names_table(page),
            }
        )

    async def act(self, request: Request) -> Response:
        refusal = self.access.action_refusal(request)
        if refusal is not None:
            return _error(refusal, 403)
        name, action = request.path_params["queue"], request.path_params["action"]
        try:
            body = await request.json() if action in ("requeue", "delete") else {}
            if not isinstance(body, dict):
                raise ValueError("the request body must be a JSON object")
            done = await perform(self.runner, name, action, body)
        except (ValueError, TypeError) as exc:
            return _error(str(exc), 400)
        self.live.changed()
        return JSONResponse(done)


def create_app(
    runner: AsyncRedisRunner,
    *,
    allow_actions: bool = False,
    token: str | None = None,
    basic: tuple[str, str] | None = None,
    refresh: float = 2.0,
) -> Starlette:
    """Return the dashboard of ``runner``'s namespace (an ASGI application)."""
    board = _Dashboard(runner, Access(token, basic, allow_actions), refresh)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            # Bounded: a server that went away must not hold up the stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SHUTDOWN_SECONDS):
                    await board.live.close()
                    await runner.aclose()

    guarded = board.guarded
    routes = [
        Route("/", board.index),
        Route("/api/session", guarded(board.session)),
        Route("/api/state", guarded(board.state)),
        Route("/api/events", guarded(board.events)),
        Route("/api/queues/{queue}", guarded(board.queue_view)),
        Route("/api/tasks/find", guarded(board.find)),
        Route("/api/tasks/running", guarded(board.running)),
        Route("/api/tasks/dead", guarded(board.dead)),
        Route("/api/tasks/stats", guarded(board.stats)),
        Route("/api/dead-letters/{queue}/{action:str}", guarded(board.act), methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=str(STATIC)), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.live = board.live
    return app
