"""The engine: one conversation in one process (docs/design.md §9), optionally journaled.

    engine = await create_engine("scripted", provider=model.provider, tools=[lookup])
    turn = engine.prompt("What is the order status?")
    async for event in turn:
        ...
    result = await turn.result()

Everything runs on the caller's asyncio loop: many engines may share one process (and
one `httpx.AsyncClient`). With a `persistence`, every step is journaled as it happens and
a new engine on the same store can `resume()` a turn the last process left open.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Unpack, overload

import httpx

from .approvals import check_decisions, pending_calls
from .codes import Code
from .core import EngineCore, EventSink, OnEvent
from .errors import FxError, FxInputError, FxJournalAppendError
from .events import end_body
from .ids import new_turn_id
from .lines import PendingCall
from .limits import (
    INSTRUCTIONS_MAX_BYTES,
    Block,
    JSONValue,
    ResizeImage,
    check_context,
    check_instructions,
    check_prompt_input,
    resize_prompt_images,
    stage_prompt_input,
)
from .loop import OnAmbiguous, TurnOptions, TurnRunner
from .output import DEFAULT_OUTPUT_RETRIES, FINAL_RESULT_TOOL, Output
from .persistence import Persistence
from .providers import ModelSpec, Provider, check_model, resolve_provider
from .providers.auth import CredentialsFn, OnCredentialsFn, RefreshLockFn
from .tools.definition import Tool, check_tools
from .turn import OutputT, Turn, TurnResult

DEFAULT_MAX_MODEL_TURNS = 50
# A streamed reply may pause for minutes (long reasoning); connecting may not.
DEFAULT_TIMEOUT = httpx.Timeout(connect=10.0, read=300.0, write=30.0, pool=30.0)

# Turn ids are message ids (§10): 1 to 128 of A-Z a-z 0-9 . _ : -
_TURN_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")


def check_max_model_turns(max_model_turns: object) -> int:
    """Model requests per turn: a positive integer (`FX_INVALID_INPUT` otherwise)."""
    if isinstance(max_model_turns, bool) or not isinstance(max_model_turns, int) or max_model_turns < 1:
        raise FxInputError("max_model_turns must be a positive integer")
    return max_model_turns


def _check_turn_id(turn_id: object) -> str:
    if not isinstance(turn_id, str) or not 1 <= len(turn_id) <= 128 or not set(turn_id) <= _TURN_ID_CHARS:
        raise FxInputError("turn_id must be 1 to 128 of A-Z a-z 0-9 . _ : -")
    return turn_id


def _check_yield_at(yield_at: object) -> float | None:
    if yield_at is None:
        return None
    if isinstance(yield_at, bool) or not isinstance(yield_at, (int, float)) or yield_at < 0:
        raise FxInputError("yield_at must be a time in epoch milliseconds")
    return float(yield_at)


def check_output(output: Output[Any], core: EngineCore) -> None:
    """`FX_TOOL_INVALID` when the final-result tool a typed answer would add clashes with a tool."""
    if not output.text and output.mode_for(core.spec) == "tool" and FINAL_RESULT_TOOL in core.tools:
        raise FxInputError(f"a tool named {FINAL_RESULT_TOOL!r} clashes with the typed answer's final-result tool; "
                           "rename the tool or use output_mode='native'", code=Code.TOOL_INVALID)


class Engine:
    """One conversation. Create it with `create_engine()`; one prompt runs at a time.

    `core` is the `EngineCore` every turn of this engine works on (the conversation, the
    journal, tools and model); the engine keeps which turn runs and whether it may run one.
    """

    def __init__(
        self,
        *,
        provider: Provider,
        spec: ModelSpec,
        tools: dict[str, Tool],
        instructions: str | None,
        persistence: Persistence | None,
        on_event: OnEvent | None,
        event_sink: EventSink | None,
        max_model_turns: int,
        http_client: httpx.AsyncClient | None,
        session_id: str | None,
        context: JSONValue,
        epoch: int | None,
        resize_image: ResizeImage | None = None,
        output: Output[Any] | None = None,
        output_mode: str = "auto",
        output_retries: int = DEFAULT_OUTPUT_RETRIES,
    ) -> None:
        self._own_client = http_client is None
        self._resize_image = resize_image
        self.core = EngineCore(
            provider=provider,
            spec=spec,
            tools=tools,
            instructions=instructions,
            persistence=persistence,
            client=http_client if http_client is not None else httpx.AsyncClient(timeout=DEFAULT_TIMEOUT),
            on_event=on_event,
            event_sink=event_sink,
            max_model_turns=max_model_turns,
            session_id=session_id,
            context=context,
            epoch=epoch,
            on_journal_failure=self._on_journal_failure,
        )
        self.output = output  # how a turn's answer is typed, unless its prompt says otherwise
        self.output_mode = output_mode  # a prompt's own type is asked for and retried so too
        self.output_retries = output_retries
        if output is not None:
            check_output(output, self.core)
        self._running: TurnRunner | None = None
        self._broken: FxError | None = None
        self._detached = False
        self._closed = False

    def __repr__(self) -> str:
        core = self.core
        running = self._running.turn_id if self._running else None
        open_id = core.conversation.open.id if core.conversation.open else None
        return (f"<Engine model={core.spec.id} provider={core.provider.name} messages={len(core.conversation.messages)} "
                f"open_turn={open_id} running={running} head={core.journal.head}>")

    @property
    def max_model_turns(self) -> int:
        """Model requests per turn before it stops `max_model_turns`."""
        return self.core.max_model_turns

    @property
    def session_id(self) -> str | None:
        return self.core.session_id

    @property
    def context(self) -> JSONValue:
        return self.core.context

    @property
    def epoch(self) -> int | None:
        return self.core.epoch

    # running turns

    def _runner(self, turn_id: str, **options: Unpack[TurnOptions]) -> TurnRunner:
        return TurnRunner(self.core, turn_id, on_finish=self._turn_finished, on_detach=self._on_detach, **options)

    def _on_journal_failure(self, exc: BaseException) -> None:
        error = FxJournalAppendError(f"the journal append failed: {exc}")
        error.__cause__ = exc
        self._broken = error
        if self._running is not None:
            self._running.on_journal_failure(exc)

    def _on_detach(self) -> None:
        self.core.journal.detach()
        self._detached = True

    def _turn_finished(self, runner: TurnRunner) -> None:
        if self._running is runner:
            self._running = None

    # the public surface

    def _check_usable(self) -> None:
        if self._closed:
            raise FxError("the engine is closed", code=Code.ENGINE_CLOSED)
        if self._broken is not None:
            raise self._broken
        if self._detached:
            raise FxError("this engine detached from its session; create a new engine to continue", code=Code.DETACHED)
        if self._running is not None:
            raise FxError("a turn is already running on this engine (one prompt at a time)", code=Code.TURN_RUNNING)

    @overload
    def prompt(self, input: str | Sequence[object], *, yield_at: float | None = None, turn_id: str | None = None,
               output_type: None = None) -> Turn: ...

    @overload
    def prompt(self, input: str | Sequence[object], *, yield_at: float | None = None, turn_id: str | None = None,
               output_type: type[OutputT]) -> Turn[OutputT]: ...

    def prompt(self, input: str | Sequence[object], *, yield_at: float | None = None, turn_id: str | None = None,
               output_type: type[Any] | None = None) -> Turn[Any]:
        """Starts a turn and returns it at once.

        Args:
            input: text, or a list of text and image blocks (checked by
                `fxengine.limits.check_prompt_input`; image data as bytes or base64).
                With a `resize_image` hook every image goes through it first and the
                limits apply to what it returns; an async hook runs in the turn, so a
                limit it breaks ends the turn `error` with its code, nothing journaled.
            yield_at: epoch ms; the turn stops `yielded` before its next model request
                after that time (its first request always goes).
            turn_id: the turn's id; the open turn's id resumes it, the last ended
                turn's id answers its result again (`repeated=True`) and runs nothing.
            output_type: this turn's answer is an object of this type (`fxengine.output`;
                the engine's `output_mode` and `output_retries` apply), in place of the
                engine's `output_type`.

        Raises:
            FxInputError / FxLimitError: bad input, before anything is sent or stored;
                `FX_MODEL_NO_IMAGES` for images to a model whose catalog entry takes none.
            FxError: `FX_TURN_RUNNING`, `FX_ENGINE_CLOSED`, `FX_DETACHED`, or the
                journal failure that stopped this engine.
        """
        self._check_usable()
        yield_at = _check_yield_at(yield_at)
        if turn_id is not None:
            _check_turn_id(turn_id)
        output = self._output_of(output_type)
        blocks, prepare = self._prompt_blocks(input)
        if turn_id is not None:
            conv = self.core.conversation
            repeat = (conv.open is not None and turn_id == conv.open.id) or (
                turn_id == conv.last_turn_id and conv.last_end is not None)
            if repeat and inspect.iscoroutine(prepare):
                prepare.close()  # a repeated turn id runs nothing of this input
            if conv.open is not None and turn_id == conv.open.id:
                resumed = self.resume(yield_at=yield_at, output_type=output_type)
                assert resumed is not None
                return resumed
            if turn_id == conv.last_turn_id and conv.last_end is not None:
                end = conv.last_end
                runner = self._runner(turn_id, output=output)
                runner.finish_now(TurnResult(end.get("stopReason") or "end_turn", dict(end.get("usage") or {}),
                                             end.get("error"), repeated=True,
                                             output=runner.load_output(end["output"]) if "output" in end else None))
                return Turn(runner)
        runner = self._runner(turn_id or new_turn_id(), blocks=blocks, prepare=prepare, yield_at=yield_at,
                              output=output)
        self._running = runner
        runner.start()
        return Turn(runner)

    def _output_of(self, output_type: object) -> Output[Any] | None:
        """The typing of one turn: its own `output_type`, else the engine's."""
        if output_type is None:
            return self.output
        output: Output[Any] = Output(output_type, mode=self.output_mode, retries=self.output_retries)
        check_output(output, self.core)
        return output

    def _prompt_blocks(self, input: object) -> tuple[list[Block] | None, Awaitable[list[object]] | None]:
        """(blocks, None) checked now, or (None, an awaitable of the blocks) when an async
        `resize_image` has yet to answer (the turn awaits and checks them)."""
        hook = self._resize_image
        if hook is None:
            blocks = check_prompt_input(input)
        else:
            resized = resize_prompt_images(stage_prompt_input(input), hook)
            if inspect.isawaitable(resized):
                return None, resized
            blocks = check_prompt_input(resized)
        self.core.check_images(blocks)
        return blocks, None

    def resume(
        self,
        *,
        on_ambiguous: OnAmbiguous | None = None,
        yield_at: float | None = None,
        no_rerun: bool = False,
        next_step: int | None = None,
        decisions: Mapping[str, object] | None = None,
        decision_inputs: Mapping[str, str] | None = None,
        output_type: type[Any] | None = None,
    ) -> Turn[Any] | None:
        """Continues the turn the last engine left open, or returns None when there is none.

        A `paused` turn continues with `decisions`, ``{call id: decision}`` for the calls
        it waits on (`pending_calls`): ``{"type": "approve"}``, ``{"type": "deny",
        "reason"?}``, or for an external tool ``{"type": "result", "result", "isError"?}``
        (`fxengine.approvals`). Every decision is journaled before anything runs; an
        approved call then runs once under the rules below. Calls not decided keep
        waiting: the turn ends `paused` again without a model request (with no decision
        at all it records nothing). `decision_inputs` (``{call id: input id}``) names the
        store's input that carried each decision: the record that takes the decision marks
        it taken (`{"accepted": id}`), so a store consumes it in the same append.

        A call that finished keeps its result; an idempotent call left running is rerun
        with the same `execution_id` (`tool.rerun` on `on_event`); any other is answered
        to the model as possibly partly run (`tool_end` with `isError`) unless
        ``on_ambiguous({"executionId", "name", "input"})`` returns ``"rerun"``.
        `no_rerun=True` answers every call left running that way. The model is told
        "Resuming from unexpected session interruption." unless the turn had yielded.
        `next_step` sets the number of the next model step. `output_type`, for a turn a
        prompt typed with its own: as there (a typed turn resumes from its journaled
        verdicts: a valid answer is not asked for again).

        Raises:
            FxInputError: `FX_DECISION_INVALID`, `FX_DECISION_UNKNOWN_CALL` or
                `FX_DECISION_REPEATED` for a decision that cannot apply (nothing is
                journaled); `FX_INVALID_INPUT` for a bad option.
        """
        self._check_usable()
        output = self._output_of(output_type)
        if on_ambiguous is not None and not callable(on_ambiguous):
            raise FxInputError("on_ambiguous must be a function")
        if next_step is not None and (not isinstance(next_step, int) or isinstance(next_step, bool) or next_step < 1):
            raise FxInputError("next_step must be a positive integer")
        yield_at = _check_yield_at(yield_at)
        open_turn = self.core.conversation.open
        decided = check_decisions(open_turn, decisions) if decisions is not None else []
        if decision_inputs:
            decided = [dataclasses.replace(d, input_id=decision_inputs.get(d.call["id"])) for d in decided]
        if open_turn is None:
            return None
        runner = self._runner(open_turn.id, yield_at=yield_at, resume=True, on_ambiguous=on_ambiguous,
                             no_rerun=no_rerun, next_step=next_step, decisions=decided, output=output)
        self._running = runner
        runner.start()
        return Turn(runner)

    async def end_open_turn(self, stop_reason: str = "cancelled", error: dict[str, object] | None = None) -> TurnResult | None:
        """Closes the open turn without running it (e.g. after 3 cut-offs of a model request).

        Calls it left running are answered as unfinished; calls a paused turn waits on are
        answered as denied (the model reads "The user denied this tool call: <stop reason>").
        Returns None when no turn is open.
        """
        self._check_usable()
        open_turn = self.core.conversation.open
        if open_turn is None:
            return None
        usage = dict(open_turn.usage)
        self.core.end_turn(open_turn.id, end_body(stop_reason, usage, error))
        await self.core.journal.flush()
        self.core.journal.raise_failure()
        await self.core.save_checkpoint()
        return TurnResult(stop_reason, usage, error)

    def checkpoint(self) -> bytes:
        """The conversation as opaque bytes (at most 4 MiB); restore with `checkpoint=`."""
        return self.core.checkpoint()

    def settled_checkpoint(self) -> bytes | None:
        """`checkpoint()` if it is exactly the state through the journal record being
        appended (no turn open, nothing committed after it), else None: a store may keep it
        in that record's call instead of the records (fxworker's release at rest does)."""
        return self.core.settled_checkpoint()

    @property
    def open_turn(self) -> dict[str, object] | None:
        """The turn that started and has not ended: ``{turnId, yielded, paused, step,
        responses, running, inFlight, usage, pendingCalls}``, or None."""
        turn = self.core.conversation.open
        if turn is None:
            return None
        return {"turnId": turn.id, "yielded": turn.yielded, "paused": turn.paused, "step": turn.step,
                "responses": turn.responses, "running": self._running is not None, "inFlight": self.in_flight,
                "usage": dict(turn.usage), "pendingCalls": self.pending_calls}

    @property
    def pending_calls(self) -> list[PendingCall]:
        """The calls the open turn waits on for a decision (`TurnResult.pending_calls`), in
        call order; empty when none waits."""
        return pending_calls(self.core)

    @property
    def in_flight(self) -> dict[str, object] | None:
        """What is running now (``{"kind": "model"|"tool", "step", "calls"}``); with no turn
        running, what the open turn had in flight when its engine stopped."""
        if self._running is not None:
            flight = self._running.in_flight
            return dict(flight) if flight is not None else None
        turn = self.core.conversation.open
        if turn is None:
            return None
        unanswered = turn.left_running  # a call waiting for a decision is not in flight
        if unanswered and turn.pending is not None:
            return {"kind": "tool", "step": int(turn.pending["step"]),
                    "calls": [{"id": c["id"], "name": c["name"]} for c in unanswered]}
        if turn.retract:
            return {"kind": "model", "step": turn.retract[-1], "calls": []}
        return None

    def recorded_steps(self, turn_id: str) -> set[int]:
        """Steps of the turn whose model response is in the journal."""
        conv = self.core.conversation
        turn = conv.open
        if turn is not None and turn.id == turn_id:
            return set(turn.responded)
        if conv.last_turn_id == turn_id and conv.last_end is not None:
            return set(conv.last_end.get("steps") or [])
        return set()

    @property
    def messages(self) -> list[dict[str, object]]:
        """A copy of the history (provider-neutral messages)."""
        messages: list[dict[str, object]] = json.loads(json.dumps(self.core.conversation.messages))
        return messages

    @property
    def model_id(self) -> str:
        return str(self.core.spec.id)

    async def close(self) -> None:
        """Cancels a running turn, waits for the journal, and closes the engine's own client."""
        if self._closed:
            return
        runner = self._running
        if runner is not None:
            runner.cancel()
            try:
                await runner.result_future
            except Exception:
                pass
        if self.core.journal.enabled:
            # A detached or failed journal writes nothing more; an append it left stalled
            # (a store that never answers) must not hold the close.
            await self.core.journal.flush()
        self._closed = True
        if self._own_client:
            await self.core.client.aclose()


async def create_engine(
    model: str | Mapping[str, object],
    *,
    api_key: str | None = None,
    instructions: str | Sequence[str] | None = None,
    tools: Sequence[Tool] | Mapping[str, Tool] | None = None,
    provider: Mapping[str, object] | Provider | str | None = None,
    checkpoint: bytes | None = None,
    persistence: Persistence | None = None,
    on_event: OnEvent | None = None,
    event_sink: EventSink | None = None,
    max_model_turns: int = DEFAULT_MAX_MODEL_TURNS,
    http_client: httpx.AsyncClient | None = None,
    session_id: str | None = None,
    context: object = None,
    epoch: int | None = None,
    model_catalog: object = None,
    model_idle_timeout_s: float | None = None,
    credentials: CredentialsFn | None = None,
    on_credentials: OnCredentialsFn | None = None,
    refresh_lock: RefreshLockFn | None = None,
    resize_image: ResizeImage | None = None,
    output_type: object = None,
    output_mode: str = "auto",
    output_retries: int = DEFAULT_OUTPUT_RETRIES,
) -> Engine:
    """Creates an engine (and loads its journal when `persistence` is given).

    Args:
        model: a model id, or ``{"id", "effort"?, "fast"?, "ultrafast"?}``.
        api_key: the provider key; for AI Gateway (the default provider) falls back to
            `AI_GATEWAY_API_KEY`, then `VERCEL_OIDC_TOKEN`.
        instructions: the system prompt (a string or a list of strings, ≤ 64 KiB).
        tools: `Tool`s (a list, or a dict keyed by name; at most 64).
        provider: None (or ``"gateway"``) for AI Gateway, ``"codex"`` (ChatGPT plans),
            ``"grok"`` (Grok plans), a custom provider dict (see
            `fxengine.providers.custom`), or a `Provider` such as
            `fxengine.providers.chatgpt.provider(...)` (every endpoint configurable).
        checkpoint: bytes from `Engine.checkpoint()` to start from.
        persistence: a `Persistence` store; every step is journaled to it.
        on_event: diagnostics (`transport.*`, `tool.rerun`, `checkpoint.*`, ...).
        event_sink: gets every turn event synchronously, in order, and the turn's end:
            `turn_end {turnId, stopReason, usage, error?}` or `turn_yield {turnId}`, just
            before the record that ends or yields the turn is committed (turn iteration
            never yields those two).
        max_model_turns: model requests per turn before it stops `max_model_turns`.
        model_idle_timeout_s: a model stream that sends nothing for this long (its headers
            or its next bytes) fails the step `FX_PROVIDER_TIMEOUT`, retried once before
            any output; a provider's own `idle_timeout_s` wins (default 120 s).
        http_client: a shared `httpx.AsyncClient` (not closed by the engine).
        session_id, context, epoch: handed to every tool call's `ctx`; `context` is JSON
            (`fxengine.limits.check_context`: finite numbers, valid Unicode, ≤ 32 levels,
            ≤ 64 KiB).
        model_catalog: model entries for AI Gateway (or a plan), to check settings
            offline (`fxengine.providers.catalog`); nothing is fetched here.
        credentials, on_credentials, refresh_lock: the plan's (or a custom provider's)
            credential callbacks, called with ``{"provider", "session_id"}``; see
            `fxengine.providers.auth`. Credentials are added to each request just
            before it is sent and are never journaled or passed to `on_event`.
        resize_image: ``hook({"bytes", "mime_type"}) -> {"bytes", "mime_type"}`` (sync or
            async), applied to every prompt image before the limits (to downscale or
            convert it).
        output_type: every turn's answer is an object of this type, validated (a pydantic
            model, a dataclass, a `TypedDict`, a union of them, ``"module:Name"``, or
            `str`); `TurnResult.output` holds it (`fxengine.output`).
        output_mode: ``"auto"`` (native where the model's catalog entry says it takes a
            JSON-schema response format, else a final-result tool), ``"native"`` or
            ``"tool"``.
        output_retries: answers refused by validation that go back to the model with
            the errors before the turn ends `error` `FX_OUTPUT_INVALID` (0 to 10).

    Raises:
        FxInputError: a bad model, setting, provider, tool or option (`FX_*` codes;
            `FX_OUTPUT_TYPE_INVALID` for an output type pydantic cannot describe); the
            model is checked by `fxengine.providers.check_model`, the check the durable
            layer runs when an agent or session is made.
        FxProviderError: `FX_PROVIDER_NO_CREDENTIALS` when AI Gateway has no key.
        FxJournalVersionError: the journal or checkpoint is from a newer fxengine.
        FxJournalError: the journal or checkpoint does not parse.
    """
    tools_by_name = check_tools(tools)
    resolved = resolve_provider(provider, api_key=api_key, model_catalog=model_catalog, credentials=credentials,
                                on_credentials=on_credentials, refresh_lock=refresh_lock).bind(session_id)
    if model_idle_timeout_s is not None and resolved.idle_timeout_s is None:
        # The provider's own idle timeout wins; this is the default of the rest.
        resolved = dataclasses.replace(resolved, idle_timeout_s=float(model_idle_timeout_s))
    # The same checks `fxworker` runs when an Agent or a Session is made (§10): a setting
    # the door accepted is never refused here.
    spec = check_model(model, resolved, model_catalog=model_catalog)
    instructions = check_instructions(instructions)
    context = check_context(context)
    check_max_model_turns(max_model_turns)
    if checkpoint is not None and not isinstance(checkpoint, (bytes, bytearray, memoryview)):
        raise FxInputError("checkpoint must be bytes from Engine.checkpoint()")
    if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int)):
        raise FxInputError("epoch must be an integer")
    if resize_image is not None and not callable(resize_image):
        raise FxInputError("resize_image must be a function")
    output: Output[Any] | None = (Output(output_type, mode=output_mode, retries=output_retries)
                                  if output_type is not None else None)
    if output is None:
        Output(str, mode=output_mode, retries=output_retries)  # the options are checked all the same
    engine = Engine(
        provider=resolved,
        spec=spec,
        tools=tools_by_name,
        instructions=instructions,
        persistence=persistence,
        on_event=on_event,
        event_sink=event_sink,
        max_model_turns=max_model_turns,
        http_client=http_client,
        session_id=session_id,
        context=context,
        epoch=epoch,
        resize_image=resize_image,
        output=output,
        output_mode=output_mode,
        output_retries=output_retries,
    )
    try:
        await engine.core.load(bytes(checkpoint) if checkpoint is not None else None)
    except BaseException:
        await engine.close()
        raise
    return engine
