"""The dashboard's ASGI application (Starlette): pages, JSON, live events, actions.

Routes:

- ``GET /``: the page (``static/index.html``; plain HTML, CSS and JavaScript
  shipped in the wheel, no build step), ``GET /static/...``;
- ``GET /api/state``: one reading of the namespace (see :mod:`.live`);
- ``GET /api/events``: the same as server-sent events, a new one whenever
  the namespace changed (driven by the queues' wake-ups);
- ``GET /api/queues/<queue>``: a queue's messages per state (``inspect.lua``)
  with the worker holding each reserved one, and for a dead-letter queue
  the journal's reason and delivery count;
- ``POST /api/dead-letters/<queue>/requeue`` (JSON ``{"target": ...,
  "ids": [...] or null}``) and ``POST /api/dead-letters/<queue>/purge``:
  each one script (``dead_letter_requeue.lua``, ``delete_queues.lua``), so
  each is all or nothing. Refused (403) unless the server was started with
  actions allowed, and unless the request carries the header
  ``X-Dashboard-Action: 1`` (a page of another site cannot send it without
  the browser asking first, and this server never says yes).

With a token, every request must carry it (``Authorization: Bearer``, or
the cookie that ``/?token=...`` sets). Nothing sent to a page names the
server's address or password: pages see the namespace name only.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
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

from ..aio.runner import AsyncRedisRunner
from ..calls import delete_queues
from ..calls.operations import MAX_INSPECT, dead_letter_requeue, inspect
from ..queue_names import shown_queue
from ..types import QueueView
from ..validation import validate_queue_name
from .live import LiveState, read_state, state_json

#: Name of the cookie that carries the token after ``/?token=...``.
COOKIE: Final[str] = "sbr_dashboard"

#: Header every action must carry.
ACTION_HEADER: Final[str] = "x-dashboard-action"

#: Most seconds the stop waits for the reader and the pools to close.
SHUTDOWN_SECONDS: Final[float] = 5.0

#: Seconds between comment lines on an idle event stream (keeps proxies open).
KEEPALIVE_SECONDS: Final[float] = 15.0

STATIC = resources.files("simplebroker_redis") / "dashboard" / "static"


def _token_of(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return request.cookies.get(COOKIE)


class _Dashboard:
    """The handlers of one dashboard (see the module docstring)."""

    def __init__(
        self, runner: AsyncRedisRunner, *, allow_actions: bool, token: str | None, refresh: float
    ) -> None:
        self.runner = runner
        self.live = LiveState(runner, refresh=refresh)
        self.namespace = runner.keys.namespace
        self.allow_actions = allow_actions
        self.token = token

    def allowed(self, request: Request) -> bool:
        if self.token is None:
            return True
        given = _token_of(request)
        return given is not None and hmac.compare_digest(given, self.token)

    def guarded(
        self, handler: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            if not self.allowed(request):
                return PlainTextResponse("a token is required", status_code=401)
            return await handler(request)

        return run

    async def index(self, request: Request) -> Response:
        given = request.query_params.get("token")
        if self.token is not None and given is not None:
            if not hmac.compare_digest(given, self.token):
                return PlainTextResponse("wrong token", status_code=401)
            response = RedirectResponse("/", status_code=303)
            response.set_cookie(COOKIE, given, httponly=True, samesite="strict")
            return response
        if not self.allowed(request):
            return PlainTextResponse("a token is required: open /?token=<token>", status_code=401)
        with resources.as_file(STATIC / "index.html") as path:
            return FileResponse(path, headers={"cache-control": "no-store"})

    async def state(self, request: Request) -> Response:
        body = state_json(await read_state(self.runner), self.namespace)
        body["actions"] = self.allow_actions
        return JSONResponse(body)

    async def events(self, request: Request) -> Response:
        queue = self.live.subscribe()
        hello = json.dumps({"actions": self.allow_actions})

        async def stream() -> AsyncIterator[str]:
            try:
                yield f"event: hello\ndata: {hello}\n\n"
                while True:
                    try:
                        async with asyncio.timeout(KEEPALIVE_SECONDS):
                            data = await queue.get()
                    except TimeoutError:
                        yield ": keep-alive\n\n"
                        continue
                    yield f"event: state\ndata: {data}\n\n"
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
            return JSONResponse({"error": str(exc)}, status_code=400)
        reading = await read_state(self.runner)
        dead = name in reading.dead_letter_queues
        view = await self.runner.run(inspect(name, limit, journal=dead))
        holders = state_json(reading, self.namespace)["holders"]
        return JSONResponse(_queue_json(name, dead, view, holders, reading.now_us))

    async def act(self, request: Request) -> Response:
        if not self.allow_actions:
            return JSONResponse(
                {"error": "actions are off: start the dashboard with --allow-actions"},
                status_code=403,
            )
        if request.headers.get(ACTION_HEADER) != "1":
            return JSONResponse({"error": f"missing header {ACTION_HEADER}"}, status_code=403)
        name, action = request.path_params["queue"], request.path_params["action"]
        try:
            body = await request.json() if action == "requeue" else {}
            if not isinstance(body, dict):
                raise ValueError("the request body must be a JSON object")
            done = await _perform(self.runner, name, action, body)
        except (ValueError, TypeError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        self.live.changed()
        return JSONResponse(done)


def create_app(
    runner: AsyncRedisRunner,
    *,
    allow_actions: bool = False,
    token: str | None = None,
    refresh: float = 2.0,
) -> Starlette:
    """Return the dashboard of ``runner``'s namespace (an ASGI application)."""
    board = _Dashboard(runner, allow_actions=allow_actions, token=token, refresh=refresh)

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

    routes = [
        Route("/", board.index),
        Route("/api/state", board.guarded(board.state)),
        Route("/api/events", board.guarded(board.events)),
        Route("/api/queues/{queue}", board.guarded(board.queue_view)),
        Route("/api/dead-letters/{queue}/{action:str}", board.guarded(board.act), methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=str(STATIC)), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.live = board.live
    return app


async def _perform(
    runner: AsyncRedisRunner, queue: str, action: str, body: dict[str, Any]
) -> dict[str, Any]:
    """Run one action (one script); raise ValueError for bad input, before any change."""
    validate_queue_name(queue)
    if action == "purge":
        deleted = await runner.run(delete_queues([queue]))
        return {"action": "purge", "queue": queue, "deleted": deleted}
    if action != "requeue":
        raise ValueError(f"unknown action {action!r}")
    target = body.get("target")
    if not isinstance(target, str):
        raise ValueError("requeue needs a target queue")
    validate_queue_name(target)
    raw = body.get("ids")
    ids = None if raw is None else _message_ids(raw)
    moved = await runner.run(dead_letter_requeue(queue, target, ids))
    return {"action": "requeue", "queue": queue, "target": target, "moved": moved}


def _message_ids(raw: object) -> list[int]:
    """Return the IDs of a request: digit strings, or integers.

    Pages send strings: JavaScript's numbers lose 19-digit IDs.
    """
    if not isinstance(raw, list) or not raw:
        raise ValueError("ids must be a non-empty list of message ids, or null for all")
    ids = []
    for item in raw:
        if isinstance(item, str) and item.isdigit():
            ids.append(int(item))
        elif isinstance(item, int) and not isinstance(item, bool):
            ids.append(item)
        else:
            raise ValueError(f"not a message id: {item!r}")
    return ids


def _queue_json(
    name: str, dead: bool, view: QueueView, holders: dict[str, str], now_us: int
) -> dict[str, Any]:
    journal = {entry.id: entry for entry in view.journal}
    states = {}
    for part in view.states:
        messages = []
        for message in part.messages:
            item: dict[str, Any] = {
                # As a string too: JavaScript numbers lose IDs above 2**53.
                "id": str(message.id),
                "body": message.body,
                "size": message.size,
                "deliveries": message.deliveries,
            }
            if part.state == "delayed" and message.until_us is not None:
                item["due_in"] = (message.until_us - now_us) / 1e6
            if part.state == "reserved":
                item["holder"] = holders.get(message.token, "")
                item["token"] = message.token
                if message.until_us is not None:
                    item["lease_expires_in"] = (message.until_us - now_us) / 1e6
            if dead:
                entry = journal.get(message.id)
                if entry is not None:
                    item["reason"] = f"delivered {entry.deliveries} times (max deliveries)"
                    item["source"] = entry.queue
                    item["deliveries"] = max(message.deliveries, entry.deliveries)
                else:
                    # The journal keeps only unreported entries (a Taskiq worker
                    # reports each at once); a rejected message never had one.
                    item["reason"] = "rejected by its worker, or dead-lettered and reported"
            messages.append(item)
        states[part.state] = {"count": part.count, "messages": messages}
    return {
        "queue": name,
        "shown": shown_queue(name),
        "dead_letter": dead,
        "states": states,
        "requeue_to": _source(name),
    }


def _source(name: str) -> str:
    """Return the queue a dead-letter queue's messages most likely came from."""
    return name.removesuffix(".dead") if name.endswith(".dead") else ""
