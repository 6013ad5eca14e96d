"""The ASGI app of §3: `create_app()` with an explicit route list and a lifespan.

    uvicorn --factory fxworker.web:create_app      # what `fx web` runs
    app = create_app(agents=[support], authorize=check)   # mounted in another app

The lifespan imports the agents module (`FX_AGENTS`) when no agents were passed, and owns
the web process's own Redis client (health checks, wake replay guard); the agents own
their store clients. A path with a trailing slash is 404, not a redirect (starlette's
redirect would build its `Location` from the request's `Host` header).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from fxworker.agent import Agent
from fxworker.errors import FxConfigError
from fxworker import tracing
from fxworker.settings import Settings

from fxworker.liveness import DeliveryCounter, Liveness
from fxworker.store import SessionStore, default_store, store_clients, store_kind

from . import health, openapi, sessions, wake
from .auth import Authorize, BearerAuth, ClientSessionIds, SessionContext
from .errors import EXCEPTION_HANDLERS
from .ndjson import StreamSlots

STATIC_DIR = Path(__file__).parent / "static"

logger = logging.getLogger("fxworker.web")


async def index(request: Request) -> Response:
    """The chat page (plain HTML and JS; the session id lives in `?session=`)."""
    return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


ROUTES = [
    Route("/", index, methods=["GET"]),
    Route("/healthz", health.healthz, methods=["GET"]),
    Route("/metrics", health.metrics_text, methods=["GET"]),
    Route("/openapi.json", openapi.openapi_json, methods=["GET"]),
    Route("/v1/sessions", sessions.create_session, methods=["POST"]),
    Route("/v1/sessions", sessions.list_sessions, methods=["GET"]),
    Route("/v1/sessions/{session_id}", sessions.state, methods=["GET"]),
    Route("/v1/sessions/{session_id}/prompts", sessions.prompt, methods=["POST"]),
    Route("/v1/sessions/{session_id}/steer", sessions.steer, methods=["POST"]),
    Route("/v1/sessions/{session_id}/cancel", sessions.cancel, methods=["POST"]),
    Route("/v1/sessions/{session_id}/calls/{call_id}", sessions.decide, methods=["POST"]),
    Route("/v1/sessions/{session_id}/timeline", sessions.timeline, methods=["GET"]),
    Route("/v1/sessions/{session_id}/stream", sessions.stream, methods=["GET"]),
    Route("/v1/wake", wake.wake, methods=["POST"]),
    Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
]


def _registry_agents() -> dict[str, Agent]:
    from fxworker import agents as registered

    return {name: agent for name, agent in registered().items() if isinstance(agent, Agent)}


def _fixed_agents(agents: Iterable[Agent] | Mapping[str, Agent]) -> Callable[[], dict[str, Agent]]:
    if isinstance(agents, Mapping):
        fixed = dict(agents)
    else:
        fixed = {agent.name: agent for agent in agents}
    return lambda: fixed


def create_app(
    agents: Iterable[Agent] | Mapping[str, Agent] | None = None,
    authorize: Authorize | None = None,
    store: SessionStore | None = None,
    *,
    settings: Settings | None = None,
    max_streams: int | None = None,
    session_context: SessionContext | None = None,
    allowed_origins: Iterable[str] | None = None,
    client_session_ids: ClientSessionIds | None = None,
) -> Starlette:
    """Build the web app.

    Args:
        agents: the agents it serves (a list, or a name → agent mapping). None: every agent
            registered in this process, after importing the `FX_AGENTS` module.
        authorize: `authorize(request, session_id, action) -> bool` (or awaitable), called by
            every API route; with it, the app also serves off loopback without `FX_API_TOKEN`.
        store: the session store used to list sessions; None: the default agent's store.
        settings: None reads the environment once (`Settings.from_env()`).
        max_streams: the most NDJSON streams this process serves at once (each following
            one holds a store connection); one more is 503 `FX_LIMIT_STREAMS`. None: three
            quarters of `FX_REDIS_MAX_CONNECTIONS`, so other calls always find connections.
        session_context: `session_context(request, create) -> context` (or awaitable): the
            tool context a new session gets, decided by the server from the request (its
            user) and the parsed create body (`create.agent`, `create.context` as the client
            sent it, ...); raise `FxForbiddenError` to refuse the create. The context is
            stored with the session and holds for every later prompt and steer. Without
            it, a client's `context` is taken as sent when the server's own token (or
            loopback) guards the API, and refused (403) under an `authorize` hook, whose
            callers are the embedder's users.
        allowed_origins: under an `authorize` hook, the origins (`https://app.example`)
            besides the server's own whose pages may POST (default `FX_ALLOWED_ORIGINS`).
        client_session_ids: whether a create may name its session (`sessionId`, an
            application's own id such as `user-42`): True, False, or
            `client_session_ids(request, session_id) -> bool` (or awaitable). None (the
            default): yes when the server's own token (or loopback) guards the API, no
            under an `authorize` hook, whose callers could otherwise take (or guess their
            way into) another user's session; 403 `FX_FORBIDDEN` when refused.

    When the environment asks for traces (`OTEL_TRACES_EXPORTER`, `OTEL_EXPORTER_OTLP_*`)
    and no tracer provider is installed, it installs one (`fxworker.tracing`).
    """
    settings = settings or Settings.from_env()
    tracing.configure_from_env("fx-web")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if agents is None and settings.agents_module:
            importlib.import_module(settings.agents_module)
        client = None
        if settings.store_url:
            client = store_clients(settings.store_url, socket_timeout_s=5.0)[0]()
            app.state.replay_guard = wake.RedisReplayGuard(client, prefix=settings.prefix)
            app.state.store_kind = store_kind(settings.store_url)
        app.state.redis = client
        # The web process announces the stored layout level it reads (its live mark, with no
        # agent): a writer of a new layout waits for every live reader (docs/operations.md).
        announcing = None
        if settings.store_url:
            liveness = Liveness(default_store(settings), agents=tuple, counter=DeliveryCounter(capacity=0), always=True)
            announcing = asyncio.get_running_loop().create_task(liveness.announce())
        try:
            yield
        finally:
            if announcing is not None:
                announcing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await announcing
            if client is not None:
                await client.aclose()

    def store_for(agent: Agent) -> SessionStore:
        found: SessionStore | None = store if store is not None else agent.store
        if found is None:
            raise FxConfigError("no session store to list: pass create_app(store=...)")
        return found

    app = Starlette(
        routes=ROUTES,
        middleware=[Middleware(
            BearerAuth, token=settings.api_token, open_off_loopback=authorize is not None,
            allowed_origins=tuple(settings.allowed_origins if allowed_origins is None else allowed_origins),
        )],
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=lifespan,
    )
    app.router.redirect_slashes = False
    app.state.settings = settings
    app.state.stream_slots = StreamSlots(max_streams or max(1, settings.redis_max_connections * 3 // 4))
    app.state.authorize = authorize
    app.state.session_context = session_context
    app.state.client_session_ids = client_session_ids
    app.state.agents = _registry_agents if agents is None else _fixed_agents(agents)
    app.state.store_for = store_for
    app.state.redis = None
    app.state.replay_guard = wake.MemoryReplayGuard()
    return app
