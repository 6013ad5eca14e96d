"""`Agent`, `Session`, `Turn`: the durable Python API (§2).

An `Agent` is configuration; creating one touches no network, file or process and
registers it in this process by name. A `Session` addresses one conversation by id; its
`prompt()` stores the input (and returns once the store acknowledged it), then wakes a
worker. A `Turn` follows what the worker writes to the session's UI stream.

Async first::

    agent = Agent("support", model="openai/gpt-5", tools=[lookup])
    session = agent.session()
    turn = await session.prompt("Where is my order?")
    async for event in turn:              # text_delta, tool_start, tool_end, ...
        ...
    result = await turn.result()          # TurnResult(stop_reason, usage, error, repeated)

and a blocking twin for Django/Flask/Celery code::

    session = agent.blocking_session()
    turn = session.prompt("Where is my order?")
    for line in session.stream(turn.cursor, follow=False): ...
    print(turn.result().stop_reason)
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from types import UnionType
from typing import Any, Generic, NotRequired, TypedDict, overload

from typing_extensions import TypeVar

from fxengine import approvals
from fxengine.codes import Code
from fxengine.engine import check_max_model_turns
from fxengine.errors import FxError, FxInputError, FxToolDefinitionError
from fxengine.limits import (
    Block,
    ResizeImage,
    check_context,
    check_instructions,
    check_steer_text,
    has_images,
    prepare_prompt_input,
    prompt_text,
)
from fxengine.lines import TURN_OPENS, Idle, Line, ModelEvent, StoredLine, TurnEnd, TurnPause, is_model_event
from fxengine.providers import CatalogCache, ModelSpec, Provider, resolve_provider
from fxengine.providers.auth import RefreshLockFn
from fxengine.providers.check import PROVIDER_NAMES
from fxengine.output import DEFAULT_OUTPUT_RETRIES, FINAL_RESULT_TOOL, Output
from fxengine.tools import Tool, check_tools
from fxengine.turn import OutputT, TurnResult
from fxengine.usage import add_usage
from opentelemetry import trace

from . import delegation, metrics, registry, tracing, typed
from .delegation import DelegateTool, delegate_tool
from .embedded import InProcessWaker, stop_embedded_workers
from .errors import FxConfigError, FxInvalidCursorError, FxUnknownSessionError
from .export import export_checkpoint
from .ids import (
    new_message_id,
    new_request_id,
    new_session_id,
    new_steer_id,
    now_ms,
    validate_message_id,
    validate_session_id,
)
from .liveness import layout_all_read
from .runtime import LoopThread, SharedLoop
from .settings import Settings
from .store import RedisStore, close_default_store, default_store
from .store.types import PARKED_LEVEL, TYPED_LEVEL, Accepted, InputKind, SessionStatus
from .wakers import CeleryWaker, Waker, cancel_with_wake, wake_failures

log = logging.getLogger("fxworker.agent")
T = TypeVar("T")

_AGENT_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
FOLLOW_BLOCK_MS = 1000

OnEvent = Callable[[dict[str, object]], object]

# A decision's call id as providers write them (no newline: the store frames ids with it).
CALL_ID = re.compile(r"[^\x00-\x1f\x7f]{1,256}")
MAX_REASON_CHARS = 4096  # a denial's reason, and who decided
MAX_DECISION_TIMEOUT_S = 366 * 86400  # a wait of up to a year
_DECISION_CODE = {"approve": "a", "deny": "d", "result": "r"}  # accept.lua's ARGV 17


class NoWorker(TypedDict):
    agent: str
    sinceMs: int
    nextWakeMs: int | None


class SessionInfo(TypedDict):
    """What `Session.state()` answers (and `GET /v1/sessions/{id}`)."""

    sessionId: str
    agent: str
    status: SessionStatus
    cursor: int
    turns: int
    epoch: int
    noWorker: NotRequired[NoWorker]
    pendingCalls: NotRequired[list[str]]  # the calls a parked (`paused`) turn waits on


def check_cursor(cursor: object) -> int:
    """A stream cursor: a non-negative integer (`FX_INVALID_CURSOR` otherwise)."""
    if isinstance(cursor, bool) or not isinstance(cursor, int) or cursor < 0:
        raise FxInvalidCursorError(f"a stream cursor is a non-negative integer, got {cursor!r}")
    return cursor


class Agent(Generic[OutputT]):
    """Configuration of one agent: name, model, instructions, tools, provider, store, limits.

    Args:
        name: the agent's name (routing key and Celery queue `fx.<name>`).
        model: a model id or `{"id", "effort"?, "fast"?, "ultrafast"?}`.
        tools: fxengine tools; each must declare `idempotent`.
        store: a `fxworker.store` store; None = Redis at `REDIS_URL`, else the local store
            (sessions in `FX_DATA_DIR`, `fxworker.store.local`).
        waker: how wakes reach a worker; None = Celery when `REDIS_URL` is set, else the
            in-process waker of the embedded mode.
        reserve_s / lease_s: deadline reserve and lease length (default `FX_RESERVE_S`,
            `FX_LEASE_S`).
        on_event: diagnostics callback (`session.*`, `tool.rerun`, `checkpoint.mismatch`...).
        resize_image: ``hook({"bytes", "mime_type"}) -> {"bytes", "mime_type"}`` (sync or
            async), run by `Session.prompt` / `steer` on every image before the limits and
            before the prompt is stored (to downscale or convert it).
        provider: None / ``"gateway"`` (AI Gateway), ``"codex"`` (ChatGPT plans),
            ``"grok"`` (Grok plans), a custom provider dict, or a `Provider`.
        credentials / on_credentials / refresh_lock: the credential callbacks of a plan
            (or custom) provider, called in whichever process runs the turn
            (`fxengine.providers.auth`; `fxworker.redis_refresh_lock` is a lock).
        model_catalog: AI Gateway's catalog, supplied so that nothing is fetched.
        decision_timeout_s: how long a parked turn waits for its decisions (§6 "Paused
            turns"); past it the sweeper denies the calls still waiting ("no decision came
            within N s") and the turn goes on. None (the default): it waits for ever.
        max_delegation_depth / max_children: the bounds of delegation (§6 "Delegated
            turns"): how many agents deep a chain of delegated turns may go from a turn of
            this agent (default 3), and how many of its delegated calls may wait at once
            (default 8); a call past either is answered with `FX_DELEGATION_DEPTH` /
            `FX_DELEGATION_FANOUT` and runs nothing.
        output_type / output_mode / output_retries: every turn answers with an object of
            this type, validated (§6 "Typed answers"; `TurnResult.output`); a prompt may
            give its own (`Session.prompt(output_type=)`), asked for and retried the same
            way. `FX_OUTPUT_TYPE_INVALID` for a type pydantic cannot describe.

    The model, instructions and provider are checked here by the checks the engine runs
    (`fxengine.providers.check_model`, `fxengine.limits.check_instructions`), so a worker
    never meets a setting the agent accepted and the engine refuses. The checks are
    offline, except that a model naming an effort, fast or ultrafast on AI Gateway without
    `model_catalog` fetches the Gateway's catalog once (cached by the agent).

    Raises:
        FxAgentExistsError: this process already has an agent of this name.
        FxToolDefinitionError: a tool does not declare `idempotent`.
        FxInputError: a bad model (`FX_INVALID_INPUT`, `FX_MODEL_UNKNOWN`,
            `FX_MODEL_UNSUPPORTED_EFFORT` / `_FAST` / `_ULTRAFAST`), provider
            (`FX_PROVIDER_INVALID`), instructions (`FX_INVALID_INPUT`,
            `FX_LIMIT_INSTRUCTIONS`), `api_key` or `max_model_turns`.
        FxProviderError: a plan provider without `credentials`
            (`FX_PROVIDER_NO_CREDENTIALS`), or the catalog fetch failed.
    """

    def __init__(
        self,
        name: str = registry.DEFAULT_AGENT_NAME,
        *,
        model: str | Mapping[str, object],
        instructions: str | Sequence[str] | None = None,
        tools: Sequence[Tool] = (),
        provider: Mapping[str, object] | Provider | str | None = None,
        api_key: str | None = None,
        store: RedisStore | None = None,
        waker: Waker | None = None,
        reserve_s: float | None = None,
        lease_s: float | None = None,
        on_event: OnEvent | None = None,
        max_model_turns: int = 50,
        settings: Settings | None = None,
        resize_image: ResizeImage | None = None,
        credentials: Callable[..., object] | None = None,
        on_credentials: Callable[..., object] | None = None,
        refresh_lock: RefreshLockFn | None = None,
        model_catalog: object = None,
        decision_timeout_s: float | None = None,
        max_delegation_depth: int = delegation.DEFAULT_MAX_DEPTH,
        max_children: int = delegation.DEFAULT_MAX_CHILDREN,
        output_type: type[OutputT] | UnionType | str | None = None,
        output_mode: str = "auto",
        output_retries: int = DEFAULT_OUTPUT_RETRIES,
    ) -> None:
        if not isinstance(name, str) or not _AGENT_NAME.fullmatch(name):
            raise FxConfigError(f"agent name must be 1 to 64 of A-Z a-z 0-9 . _ -, got {name!r}")
        if provider is not None and not isinstance(provider, (dict, Provider)) and provider not in PROVIDER_NAMES:
            raise FxInputError("provider must be gateway, codex, grok or a custom provider dict {name, base_url, models}",
                               code=Code.PROVIDER_INVALID)
        if api_key is not None and not isinstance(api_key, str):
            raise FxInputError("api_key must be a string")
        if provider == "gateway":
            provider = None
        resolved: Provider | Mapping[str, object] | None
        if isinstance(provider, str) or credentials is not None:
            # Callbacks travel inside the resolved provider: the worker's engine gets them
            # with the provider and binds them to each session.
            resolved = resolve_provider(provider, api_key=api_key, model_catalog=model_catalog, credentials=credentials,
                                        on_credentials=on_credentials, refresh_lock=refresh_lock)
        else:
            resolved = provider
        self._catalog = CatalogCache(resolved, api_key=api_key, model_catalog=model_catalog)
        self._catalog.check(model)
        check_instructions(instructions)
        check_max_model_turns(max_model_turns)
        if resize_image is not None and not callable(resize_image):
            raise FxInputError("resize_image must be a function")
        if decision_timeout_s is not None and (isinstance(decision_timeout_s, bool)
                                               or not isinstance(decision_timeout_s, (int, float))
                                               or not 0 < decision_timeout_s <= MAX_DECISION_TIMEOUT_S):
            raise FxConfigError(f"decision_timeout_s must be a number of seconds, 0 < s <= {MAX_DECISION_TIMEOUT_S}, "
                                f"or None (a parked turn waits for its decisions for ever), got {decision_timeout_s!r}")
        for label, value, top in (("max_delegation_depth", max_delegation_depth, delegation.MAX_DEPTH_LIMIT),
                                  ("max_children", max_children, delegation.MAX_CHILDREN_LIMIT)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
                raise FxConfigError(f"{label} must be an int from 0 to {top}, got {value!r}")
        # The type every turn's answer validates as (`fxengine.output`), unless a prompt says.
        self.output: Output[OutputT] | None = (Output(output_type, mode=output_mode, retries=output_retries)
                                               if output_type is not None else None)
        if self.output is None:
            Output(str, mode=output_mode, retries=output_retries)  # the options are checked all the same
        self.output_mode = output_mode  # a prompt's own type is asked for and retried so too
        self.output_retries = output_retries
        self._check_output(self.output, tools)
        self.name = name
        self.model = model
        self.instructions = instructions
        self.tools = list(check_tools(tools).values())
        self.provider = resolved
        self.api_key = api_key
        self.on_event = on_event
        self.max_model_turns = max_model_turns
        self.resize_image = resize_image
        self.decision_timeout_s = decision_timeout_s
        self.max_delegation_depth = max_delegation_depth
        self.max_children = max_children
        self._settings = settings
        self._store = store
        self._waker = waker
        self._reserve_s = reserve_s
        self._lease_s = lease_s
        registry.register(self)

    def __repr__(self) -> str:
        return f"<Agent {self.name!r} model={self.model!r} tools={[t.name for t in self.tools]}>"

    def _check_output(self, output: Output[Any] | None, tools: Sequence[Tool] | None = None) -> None:
        """`FX_TOOL_INVALID` when a tool is named as the typed answer's final-result tool."""
        tools = self.tools if tools is None else tools
        if output is not None and not output.text and output.mode != "native" and any(
                getattr(t, "name", None) == FINAL_RESULT_TOOL for t in tools):
            raise FxInputError(f"a tool named {FINAL_RESULT_TOOL!r} clashes with the typed answer's final-result tool; "
                               "rename the tool or use output_mode='native'", code=Code.TOOL_INVALID)

    def check_model(self, model: object) -> ModelSpec:
        """Checks a model setting against this agent's catalog (fetched once, when needed)."""
        return self._catalog.check(model)

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = Settings.from_env()
        return self._settings

    @property
    def reserve_s(self) -> float:
        return self.settings.reserve_s if self._reserve_s is None else self._reserve_s

    @property
    def lease_s(self) -> float:
        return self.settings.lease_s if self._lease_s is None else self._lease_s

    @property
    def store(self) -> RedisStore:
        """The session store (resolved on first use, so creating an agent does no I/O)."""
        if self._store is None:
            self._store = default_store(self.settings)
        return self._store

    @property
    def waker(self) -> Waker:
        if self._waker is None:
            if self.settings.broker_url:
                self._waker = CeleryWaker()
            else:
                self._waker = InProcessWaker()
        return self._waker

    def as_tool(self, name: str | None = None, *, description: str | None = None, keep: bool = False) -> DelegateTool:
        """A tool another agent's model calls to hand a task to this agent (§6 "Delegated
        turns"): each call prompts a turn of this agent in a session of its own (`keep`:
        one session per caller's session, which remembers earlier calls), run by this
        agent's workers; the caller's turn parks, holding nothing, until that turn ends,
        and reads its final text (or its error) as the call's result.

        `name` defaults to the agent's name (dots become `_`); the model passes the task as
        `input`. For other arguments, or a prompt built from them, use
        `fxworker.delegate_tool`.
        """
        return delegate_tool(
            self.name, name=name or self.name.replace(".", "_"),
            description=description or f"Hands a task to agent {self.name} and returns its answer. Give the task "
                                       "in full in `input`: the agent sees nothing else of this conversation.",
            keep=keep)

    def new_session_id(self) -> str:
        """A new session id (`fxs_` + ULID)."""
        return new_session_id()

    def session(
        self,
        session_id: str | None = None,
        *,
        model: str | Mapping[str, object] | None = None,
        instructions: str | Sequence[str] | None = None,
        context: object = None,
    ) -> Session[OutputT]:
        """A session object; a new session id is assigned at once when `session_id` is None.

        `model` and `instructions` override the agent's for the turns this object starts;
        `context` (JSON) is handed to every tool call. All three are checked here, and
        again when a prompt or steer is stored (`FX_` errors, nothing stored).
        """
        return Session(self, session_id, model=model, instructions=instructions, context=context)

    def blocking_session(
        self,
        session_id: str | None = None,
        *,
        model: str | Mapping[str, object] | None = None,
        instructions: str | Sequence[str] | None = None,
        context: object = None,
    ) -> BlockingSession[OutputT]:
        """The blocking twin of `session()`, for code that does not run an event loop."""
        return BlockingSession(self.session(session_id, model=model, instructions=instructions, context=context))

    def emit(self, event: Mapping[str, object]) -> None:
        """Sends a diagnostic to `on_event` (exceptions from the callback are swallowed)."""
        if self.on_event is None:
            return
        try:
            self.on_event({"timestamp": time.time(), **event})
        except Exception:  # noqa: BLE001 - a diagnostics sink must not break a turn
            log.debug("on_event raised", exc_info=True)

    def wake(self, session_id: str, *, agent: str | None = None, reason: str) -> None:
        """Sends one wake for `session_id` to the agent `agent` (default: this one)."""
        self.waker.wake(session_id, agent=agent or self.name, reason=reason)

    def close(self) -> None:
        """Removes this agent from the process registry. The last agent of the process to
        close also closes what the agents shared: the embedded worker its first prompt
        started (with its loop's HTTP clients) and the process's default store (the next
        agent gets new ones). A `store` or `waker` passed in is the application's to close."""
        if registry.get_agent(self.name) is self:
            registry.unregister(self.name)
        if registry.agents():
            return
        if isinstance(self._waker, InProcessWaker) and self._waker.started_workers:
            stop_embedded_workers()
            self._waker.started_workers = False
        if self._store is not None and close_default_store(self._store):
            self._store = None


class Session(Generic[OutputT]):
    """One conversation, addressed by id; every method goes through the store.

    Raises (when built, and from `prompt` / `steer` before anything is stored):
        FxInputError: a bad `model` (checked against the agent's provider catalog by
            `fxengine.providers.check_model`), `instructions` or `context`
            (`fxengine.limits.check_context`: JSON with finite numbers and valid Unicode,
            at most 32 levels and 64 KiB, else `FX_LIMIT_CONTEXT`).
    """

    def __init__(
        self,
        agent: Agent[OutputT],
        session_id: str | None = None,
        *,
        model: str | Mapping[str, object] | None = None,
        instructions: str | Sequence[str] | None = None,
        context: object = None,
    ) -> None:
        self.agent = agent
        memory = bool(getattr(getattr(agent.store, "core", None), "memory_ids", False)) if session_id is not None else False
        self.id = validate_session_id(session_id, memory=memory) if session_id is not None else new_session_id()
        self.model = model
        self.instructions = instructions
        self.context = context
        self.context = self._checked()[0]

    def __repr__(self) -> str:
        return f"<Session {self.id} agent={self.agent.name!r}>"

    @property
    def store(self) -> RedisStore:
        """The agent's store (each call timed in `fxworker.metrics.STORE_LATENCY`)."""
        return self.agent.store

    def _checked(self, output: Output[Any] | None = None) -> tuple[object, dict[str, object] | None]:
        """(context, settings) as the store keeps them, after the engine's own checks:
        a setting accepted here is one the worker's engine takes. `output`: a prompt's own
        answer type (else the agent's, if it has one)."""
        context = check_context(self.context)
        out: dict[str, object] = {}
        output = output or self.agent.output
        if output is not None:
            out[typed.OUTPUT_KEY] = dict(typed.stored(output, self.agent.output))
        if self.model is not None:
            self.agent.check_model(self.model)
            out["model"] = self.model if isinstance(self.model, str) else dict(self.model)
        if self.instructions is not None:
            check_instructions(self.instructions)
            instructions = self.instructions
            out["instructions"] = instructions if isinstance(instructions, str) else list(instructions)
        return context, out or None

    async def prepare_input(self, input: str | list[Block]) -> list[Block]:
        """The prompt's blocks as they will be stored: the agent's `resize_image` applied,
        then every limit (`fxengine.limits.prepare_prompt_input`; image data as base64
        strings only, since the store keeps JSON), and images refused for a model whose
        catalog entry takes none (`FX_MODEL_NO_IMAGES`)."""
        blocks = await prepare_prompt_input(input, resize_image=self.agent.resize_image, json_only=True)
        if has_images(blocks):
            spec = self.agent.check_model(self.model if self.model is not None else self.agent.model)
            if spec.entry is not None and not spec.entry.supports_images:
                raise FxInputError(f"model {spec.id} does not take images", code=Code.MODEL_NO_IMAGES)
        return blocks

    async def _wake(self, owner: str, reason: str) -> None:
        """Sends the wake for what was just stored. It is a hint (§7): when the broker
        refuses it (away, full), the stored work keeps its ready mark and the sweeper wakes
        the session, so the caller still gets its acknowledgement."""
        try:
            await asyncio.to_thread(self.agent.wake, self.id, agent=owner, reason=reason)
        except Exception as exc:
            if not isinstance(exc, wake_failures(self.agent.waker)):
                raise  # a bug in the waker, not its broker away
            metrics.WAKES_FAILED.inc()
            log.warning("waking %s (%s) failed (%s: %s); the sweeper will wake it", self.id, reason,
                        type(exc).__name__, exc)

    def _forwarded(self, owner: str | None) -> str:
        if owner and owner != self.agent.name:
            self.agent.emit(
                {"type": "session.forwarded", "sessionId": self.id, "from": self.agent.name, "to": owner}
            )
            return owner
        return self.agent.name

    @overload
    async def prompt(self, input: str | list[Block], *, message_id: str | None = None) -> Turn[OutputT]: ...

    @overload
    async def prompt(self, input: str | list[Block], *, message_id: str | None = None,
                     output_type: type[T]) -> Turn[T]: ...

    @overload
    async def prompt(self, input: str | list[Block], *, message_id: str | None = None,
                     output_type: str | None) -> Turn[Any]: ...

    async def prompt(self, input: str | list[Block], *, message_id: str | None = None,
                     output_type: type[Any] | str | None = None) -> Turn[Any]:
        """Stores a prompt and wakes a worker; returns once the store acknowledged it.

        A repeated `message_id` runs nothing new: the returned turn follows the original
        (or answers at once with `repeated=True` when it ended). `output_type`: this turn's
        answer is an object of that type (`TurnResult.output`), in place of the agent's;
        the worker imports it by name, so it must be a module-level class there
        (`FX_OUTPUT_TYPE_INVALID` otherwise; a union goes on the `Agent`).
        """
        output = self._output(output_type)
        blocks = await self.prepare_input(input)
        message_id = validate_message_id(message_id) if message_id is not None else new_message_id()
        accepted = await self._accept("prompt", message_id, blocks, output=output)
        metrics.ACCEPTED.inc()
        owner = self._forwarded(getattr(accepted, "agent", None))
        if accepted.wake:  # else a wake sent moments ago, not taken yet, runs it too (§7)
            await self._wake(owner, "prompt")
        elif accepted.repeated and accepted.status != "done" and isinstance(self.agent.waker, InProcessWaker):
            # A prompt stored by a process that died (the embedded mode, a local store): this
            # process's worker and sweeper must run, or nothing here would take the turn on
            # once its dead lease expires.
            await self._wake(owner, "prompt")
        return Turn(self, message_id=accepted.message_id, repeated=accepted.repeated, cursor=accepted.cursor,
                    output=output or self.agent.output)

    def _output(self, output_type: object) -> Output[Any] | None:
        """A prompt's own answer type, checked (None: the agent's applies)."""
        if output_type is None:
            return None
        agent = self.agent
        output: Output[Any] = Output(output_type, mode=agent.output_mode, retries=agent.output_retries)
        agent._check_output(output)
        typed.stored(output, agent.output)  # nameable for the worker, or FX_OUTPUT_TYPE_INVALID now
        return output

    async def steer(self, input: str | list[Block], *, message_id: str | None = None) -> Accepted:
        """Stores a steer for the running turn (or the next one) and wakes a worker.

        `input` is text, or blocks as a prompt takes them. A steer with images cannot join
        a turn: it ends the running turn at its next safe point and runs next (§6).
        Returns the store's acknowledgement (`message_id`, `repeated`, ...).
        """
        text: str | list[Block]
        if isinstance(input, str):
            text = check_steer_text(input)
        else:
            blocks = await self.prepare_input(input)
            words = prompt_text(blocks)
            if has_images(blocks):
                if words.strip():
                    check_steer_text(words)
                text = blocks
            else:
                text = check_steer_text(words)
        message_id = validate_message_id(message_id) if message_id is not None else new_steer_id()
        accepted = await self._accept("steer", message_id, text)
        metrics.ACCEPTED.inc()
        owner = self._forwarded(getattr(accepted, "agent", None))
        if accepted.wake:
            await self._wake(owner, "steer")
        return accepted

    async def _accept(self, kind: InputKind, message_id: str, input: str | list[Block],
                      output: Output[Any] | None = None) -> Accepted:
        """Stores one input with this object's context and settings; with tracing on, in a
        `fx.accept` span whose context is stored with it (`fxworker.tracing`). A typed
        input needs `TYPED_LEVEL`: no process of an older release claims it."""
        context, settings = self._checked(output)
        needs = TYPED_LEVEL if settings is not None and typed.OUTPUT_KEY in settings else 0
        span = tracing.start_accept(self.id, kind, message_id)
        if span is None:
            return await self.store.accept(self.id, agent=self.agent.name, kind=kind, message_id=message_id,
                                           input=input, context=context, settings=settings, now_ms=now_ms(),
                                           needs=needs)
        with trace.use_span(span, end_on_exit=True):
            accepted = await self.store.accept(self.id, agent=self.agent.name, kind=kind, message_id=message_id,
                                               input=input, context=context, settings=settings, now_ms=now_ms(),
                                               traceparent=tracing.current_traceparent(), needs=needs)
            span.set_attribute("fx.repeated", accepted.repeated)
            return accepted

    async def approve(self, call_id: str, *, message_id: str | None = None, by: str | None = None) -> Accepted:
        """Approves call `call_id`, which the session's parked turn waits on (an
        `approval_request` line, `state()["pendingCalls"]`): the decision is stored and the
        session woken; a worker resumes the turn and runs the call once. Idempotent by
        `message_id`; `by` names who decided (kept with the decision). Returns the store's
        acknowledgement (`turn`: the turn it resumes; `follow()` reads on from it).

        Raises `FX_DECISION_UNKNOWN_CALL` (no such call waits), `FX_DECISION_REPEATED`
        (another decision came first), `FX_DECISION_EXPIRED` (its wait timed out),
        `FX_DECISION_INVALID` (the call is an external tool's: `submit_tool_result`),
        `FX_UPGRADE_IN_PROGRESS` (a live process of an older release cannot read decisions).
        """
        return await self._decide(call_id, approvals.approve(), message_id=message_id, by=by)

    async def deny(self, call_id: str, *, reason: str = "", message_id: str | None = None,
                   by: str | None = None) -> Accepted:
        """Denies call `call_id` of the parked turn: the model reads the denial (with
        `reason`) as the call's result. As `approve` otherwise."""
        if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
            raise FxInputError(f"reason must be a string of at most {MAX_REASON_CHARS} characters",
                               code=Code.DECISION_INVALID)
        return await self._decide(call_id, approvals.deny(reason), message_id=message_id, by=by)

    async def submit_tool_result(self, call_id: str, result: object, *, is_error: bool = False,
                                 message_id: str | None = None, by: str | None = None) -> Accepted:
        """Gives call `call_id` of an external tool (`@tool(external=True)`) its result, as
        the client ran it: the model reads it as the tool's. As `approve` otherwise."""
        if not isinstance(is_error, bool):
            raise FxInputError("is_error must be a bool", code=Code.DECISION_INVALID)
        return await self._decide(call_id, approvals.submit_result(result, is_error=is_error),
                                  message_id=message_id, by=by)

    async def _decide(self, call_id: str, decision: approvals.Decision, *, message_id: str | None,
                      by: str | None, expired: bool = False) -> Accepted:
        """Stores one decision for `call_id` (checked at the door, accept.lua) and wakes the
        session, as a prompt is."""
        if not isinstance(call_id, str) or not CALL_ID.fullmatch(call_id):
            raise FxInputError(f"call id must be 1-256 printable characters, got {call_id!r}",
                               code=Code.DECISION_UNKNOWN_CALL)
        if by is not None and (not isinstance(by, str) or len(by) > MAX_REASON_CHARS):
            raise FxInputError(f"by must be a string of at most {MAX_REASON_CHARS} characters",
                               code=Code.DECISION_INVALID)
        message_id = validate_message_id(message_id) if message_id is not None else new_message_id()
        await self._check_layout()
        body: dict[str, object] = {"callId": call_id, "decision": decision}
        if by:
            body["by"] = by
        accepted = await self.store.accept(
            self.id, agent=self.agent.name, kind="decision", message_id=message_id, input=body, now_ms=now_ms(),
            create=False, call_id=call_id, decision=_DECISION_CODE[decision["type"]], expired=expired,
        )
        metrics.DECISIONS.labels(decision["type"]).inc()
        owner = self._forwarded(accepted.agent)
        if accepted.wake:
            await self._wake(owner, "decision")
        return accepted

    async def _check_layout(self) -> None:
        """`FX_UPGRADE_IN_PROGRESS` while a live process of an older release runs: it could
        not read a decision, nor the parked turn's journal."""
        level = layout_all_read(await self.store.live_workers())
        if level < PARKED_LEVEL:
            raise FxError(
                f"a live process of an older release reads stored layout level {level}; decisions need level "
                f"{PARKED_LEVEL}: an upgrade is in progress; send the decision again once every process runs this "
                "release",
                code=Code.UPGRADE_IN_PROGRESS,
            )

    def follow(self, accepted: Accepted) -> Turn[OutputT]:
        """The turn an input acknowledged by `accepted` continues (a decision's parked turn, a
        steer's running one), read from the moment of its acceptance: to its end, or to its
        next pause."""
        return Turn(self, message_id=accepted.turn or accepted.message_id, repeated=False, cursor=accepted.cursor,
                    output=self.agent.output)

    async def cancel(self) -> None:
        """Cancels the running or waiting turn; the running worker sees it within a second."""
        await self._cancel(None)

    async def _cancel(self, message_id: str | None) -> bool:
        """Asks for the open (or next waiting) turn, or `message_id`'s, to end `cancelled`;
        whether a turn was targeted. A running worker sees the request in its inbox; a
        waiting session is woken only when no wake of it is outstanding (§7), so a cancel
        sent before any worker ran costs no second wake."""
        target, state = await cancel_with_wake(self.store, self.id, message_id=message_id,
                                               wake=lambda owner: self._wake(owner, "cancel"))
        if state is None:
            raise FxUnknownSessionError(f"no session {self.id}")
        return target is not None

    async def stream(self, cursor: int = 0, *, follow: bool = True) -> AsyncIterator[StoredLine]:
        """Every stored line after `cursor` (each with `cursor`); with `follow`, stays open."""
        async for raw in self.stream_raw(cursor, follow=follow):
            yield json.loads(raw)

    async def stream_raw(self, cursor: int = 0, *, follow: bool = True) -> AsyncIterator[bytes]:
        """`stream()`'s lines as the store holds them, one JSON object's bytes each (its
        `cursor` and `epoch` included): what a relay sends on without decoding it."""
        cursor = check_cursor(cursor)
        while True:
            lines = await self.store.read_raw_lines(self.id, cursor, block_ms=FOLLOW_BLOCK_MS if follow else None)
            for cursor, raw in lines:
                yield raw
            if not follow and not lines:
                return

    async def resume(self) -> Turn[OutputT]:
        """Wakes the session and follows whatever turn it continues (`idle` when nothing; a
        parked turn's pause, `paused` with its `pending_calls`, without a wake)."""
        state = await self.state()
        if state["status"] == "idle":
            return Turn(self, message_id=None, repeated=False, cursor=state["cursor"], idle=True,
                        output=self.agent.output)
        if state["status"] == "paused":
            # Nothing runs until a decision comes: no wake. A parked session writes nothing
            # after its turn's `turn_pause`, so its last line is that one: the turn's result
            # is its pause, with the calls that wait.
            stored = await self.store.state(self.id)
            return Turn(self, message_id=stored.open_turn if stored else None, repeated=False,
                        cursor=max(0, state["cursor"] - 1), output=self.agent.output)
        # Follow from the current end: the worker that continues writes turn_resume (an
        # open turn) or turn_start (a waiting prompt) after it.
        await self._wake(state["agent"], "resume")
        return Turn(self, message_id=None, repeated=False, cursor=state["cursor"], output=self.agent.output)

    async def state(self) -> SessionInfo:
        """`{sessionId, agent, status: idle|waiting|running, cursor, turns, epoch}`, and
        `noWorker: {agent, sinceMs, nextWakeMs}` while its work waits for a worker that
        runs its agent (a wake found none). `FxSessionIncompleteError` for a session with a
        key gone."""
        state = await self.store.state(self.id)
        if state is None:
            raise FxUnknownSessionError(f"no session {self.id}")
        out: SessionInfo = {
            "sessionId": state.session_id,
            "agent": state.agent,
            "status": state.status,
            "cursor": state.cursor,
            "turns": state.turns,
            "epoch": state.epoch,
        }
        if state.paused_calls:
            out["pendingCalls"] = list(state.paused_calls)
        if state.unserved_since_ms is not None and state.status == "waiting":
            out["noWorker"] = {
                "agent": state.agent, "sinceMs": state.unserved_since_ms, "nextWakeMs": state.unserved_next_ms,
            }
        return out

    async def checkpoint(self) -> bytes:
        """A read-only export of the conversation: `Engine.checkpoint()` bytes that
        `fxengine.create_engine(..., checkpoint=data)` continues from. Takes no lease and
        writes nothing (a running turn goes on); `FxUnknownSessionError` for no session."""
        return await export_checkpoint(self.agent, self.id, store=self.store, model=self.model)


class Turn(Generic[OutputT]):
    """One prompt and what the agent does to answer it, read from the session's UI stream.

    Iterate it for the model-facing events, `await result()` for the outcome, or
    `ndjson()` for every line of the turn as bytes. One reader per `Turn` object; a
    turn nobody reads still runs to its end on a worker, and leaving the iteration (or
    the reader's task being cancelled) does not cancel it: the prompt is durable. Call
    `cancel()` to stop it.
    """

    def __init__(
        self,
        session: Session[Any],
        *,
        message_id: str | None,
        repeated: bool,
        cursor: int,
        idle: bool = False,
        output: Output[Any] | None = None,
    ) -> None:
        self.session = session
        self._output = output  # how `result().output` is read from the `turn_end` line
        self.session_id = session.id
        self.message_id = message_id
        self.repeated = repeated
        self.cursor = cursor
        self._idle = idle
        self._end: TurnEnd | TurnPause | Idle | None = None
        self._lines: AsyncIterator[Line] | None = None
        self._delegated: set[str] = set()  # calls answered by other agents' turns (`delegate_start`)
        self._delegated_usage: dict[str, int] = {}

    def __repr__(self) -> str:
        state = self._end.get("stopReason") if self._end else "open"
        return f"<Turn {self.session_id}/{self.message_id} {state} repeated={self.repeated}>"

    def _line_source(self) -> AsyncIterator[Line]:
        if self._lines is None:
            self._lines = self._read_lines()
        return self._lines

    async def _read_lines(self) -> AsyncIterator[Line]:
        if self._idle:
            self._end = {"type": "idle", "requestId": new_request_id()}
            yield self._end
            return
        start = 0 if self.repeated else self.cursor
        async for line in self.session.stream(start, follow=True):
            mid = line.get("messageId")
            if self.message_id is None:
                # A resume follows the first turn that starts or continues after its cursor.
                if line["type"] in TURN_OPENS:
                    self.message_id = mid
                else:
                    continue
            if mid != self.message_id:
                continue
            if line["type"] == "delegate_start":
                self._delegated.add(line["callId"])
            elif line["type"] == "delegate_end":
                self._delegated_usage = dict(add_usage(self._delegated_usage, line["usage"]))
            if line["type"] == "turn_pause" and not self.repeated:
                if all(call["id"] in self._delegated for call in line["pendingCalls"]):
                    yield line  # it waits on other agents' turns only: their ends resume it
                    continue
                self._end = line  # parked: its decisions' followers read on (`Session.follow`)
                yield line
                return
            if line["type"] == "turn_end":
                if self.repeated:
                    line = line.copy()
                    line["repeated"] = True
                self._end = line
                yield line
                return
            if self.repeated:
                continue  # an ended turn answered from the store: only its outcome
            yield line

    async def __aiter__(self) -> AsyncIterator[ModelEvent]:
        """The turn's model events (`MODEL_EVENT_TYPES`)."""
        async for line in self._line_source():
            if is_model_event(line):
                yield line

    async def ndjson(self) -> AsyncIterator[bytes]:
        """Every line of this turn as one NDJSON line (`b'{...}\\n'`), with `cursor`."""
        async for line in self._line_source():
            yield json.dumps(line, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"

    async def cancel(self) -> bool:
        """Cancels this turn, whether it waits or runs: it ends `cancelled` (a running one
        within a second) and the session's next prompt runs as usual. A no-op once the
        turn ended; returns whether a cancel was requested."""
        if self._idle or self._end is not None:
            return False
        if self.message_id is None:  # a resume not yet started: the turn it continues
            return await self.session._cancel(None)
        return await self.session._cancel(self.message_id)

    async def result(self) -> TurnResult[OutputT]:
        """Waits for the turn's end: `TurnResult(stop_reason, usage, error, repeated,
        message_id, epoch, output)` (`epoch`: the lease epoch of the worker that wrote the
        end; `output`: a typed turn's answer as an instance of its type, read from the
        `turn_end` line's JSON)."""
        if self._end is None:
            async for _ in self._line_source():
                pass
        end = self._end
        if end is not None and end["type"] == "idle":
            return TurnResult("idle", {}, None, False)
        if end is not None and end["type"] == "turn_pause":
            return TurnResult("paused", {}, None, False, message_id=self.message_id, epoch=end.get("epoch"),
                              pending_calls=list(end["pendingCalls"]), delegated_usage=self._delegated_usage)
        return TurnResult(
            stop_reason=end.get("stopReason", "unknown") if end else "unknown",
            usage=(end.get("usage") if end else None) or {},
            error=end.get("error") if end else None,
            repeated=bool(self.repeated),
            message_id=self.message_id,
            epoch=end.get("epoch") if end else None,
            delegated_usage=dict(end.get("delegatedUsage") or self._delegated_usage) if end else self._delegated_usage,
            output=self._load_output(end),
        )

    def _load_output(self, end: TurnEnd | None) -> Any:
        """The answer of a typed turn's `turn_end` line, as its type (None when it has none).

        The worker validated it; one that does not validate here (web and worker on
        different versions of the type) stays JSON, with a warning."""
        if end is None or "output" not in end:
            return None
        value = end["output"]
        output = self._output
        named = end.get("outputType")
        try:
            if named == typed.AGENT_TYPE:
                output = self.session.agent.output
            elif isinstance(named, str) and (output is None or output.name != named):
                output = Output(named)  # the prompt's own type, by the name the worker stored
        except FxInputError as exc:
            log.warning("the answer type of %s/%s, %s, does not import here (%s); its answer is kept as JSON",
                        self.session_id, self.message_id, named, exc)
            return value
        if output is None:
            return value
        try:
            return output.load(value)
        except ValueError as exc:
            log.warning("the answer of %s/%s does not validate as %r here (%s); kept as JSON", self.session_id,
                        self.message_id, output.type, exc)
            return value


# -------------------------------------------------------------------------- blocking twin

_blocking_loop = SharedLoop("fx-blocking")


def _loop() -> LoopThread:
    """The private loop the blocking twins run their coroutines on."""
    return _blocking_loop.get()


class BlockingTurn(Generic[OutputT]):
    """The blocking twin of `Turn`."""

    def __init__(self, turn: Turn[OutputT]) -> None:
        self._turn = turn

    @property
    def session_id(self) -> str:
        return self._turn.session_id

    @property
    def message_id(self) -> str | None:
        return self._turn.message_id

    @property
    def repeated(self) -> bool:
        return self._turn.repeated

    @property
    def cursor(self) -> int:
        return self._turn.cursor

    def __getattr__(self, name: str) -> object:
        return getattr(self._turn, name)

    def __repr__(self) -> str:
        return repr(self._turn).replace("<Turn", "<BlockingTurn", 1)

    def __iter__(self) -> Iterator[ModelEvent]:
        return _iterate(self._turn.__aiter__())

    def ndjson(self) -> Iterator[bytes]:
        return _iterate(self._turn.ndjson())

    def result(self) -> TurnResult[OutputT]:
        return _loop().run(self._turn.result())

    def cancel(self) -> bool:
        return _loop().run(self._turn.cancel())


async def _anext(agen: AsyncIterator[T]) -> T:
    return await agen.__anext__()


def _iterate(agen: AsyncIterator[T]) -> Iterator[T]:
    loop = _loop()
    while True:
        try:
            yield loop.run(_anext(agen))
        except StopAsyncIteration:
            return


class BlockingSession(Generic[OutputT]):
    """The blocking twin of `Session`: the same methods, no `await`; `stream()` is an iterator."""

    def __init__(self, session: Session[OutputT]) -> None:
        self._session = session
        self.id = session.id
        self.agent = session.agent

    def __repr__(self) -> str:
        return f"<BlockingSession {self.id} agent={self.agent.name!r}>"

    @overload
    def prompt(self, input: str | list[Block], *, message_id: str | None = None) -> BlockingTurn[OutputT]: ...

    @overload
    def prompt(self, input: str | list[Block], *, message_id: str | None = None,
               output_type: type[T]) -> BlockingTurn[T]: ...

    @overload
    def prompt(self, input: str | list[Block], *, message_id: str | None = None,
               output_type: str | None) -> BlockingTurn[Any]: ...

    def prompt(self, input: str | list[Block], *, message_id: str | None = None,
               output_type: type[Any] | str | None = None) -> BlockingTurn[Any]:
        turn: Turn[Any] = _loop().run(self._session.prompt(input, message_id=message_id,
                                                           output_type=output_type))
        return BlockingTurn(turn)

    def steer(self, input: str | list[Block], *, message_id: str | None = None) -> Accepted:
        return _loop().run(self._session.steer(input, message_id=message_id))

    def approve(self, call_id: str, *, message_id: str | None = None, by: str | None = None) -> Accepted:
        return _loop().run(self._session.approve(call_id, message_id=message_id, by=by))

    def deny(self, call_id: str, *, reason: str = "", message_id: str | None = None,
             by: str | None = None) -> Accepted:
        return _loop().run(self._session.deny(call_id, reason=reason, message_id=message_id, by=by))

    def submit_tool_result(self, call_id: str, result: object, *, is_error: bool = False,
                           message_id: str | None = None, by: str | None = None) -> Accepted:
        return _loop().run(self._session.submit_tool_result(call_id, result, is_error=is_error,
                                                            message_id=message_id, by=by))

    def follow(self, accepted: Accepted) -> BlockingTurn[OutputT]:
        return BlockingTurn(self._session.follow(accepted))

    def cancel(self) -> None:
        _loop().run(self._session.cancel())

    def stream(self, cursor: int = 0, *, follow: bool = True) -> Iterator[StoredLine]:
        return _iterate(self._session.stream(cursor, follow=follow))

    def resume(self) -> BlockingTurn[OutputT]:
        return BlockingTurn(_loop().run(self._session.resume()))

    def state(self) -> SessionInfo:
        return _loop().run(self._session.state())

    def checkpoint(self) -> bytes:
        return _loop().run(self._session.checkpoint())
