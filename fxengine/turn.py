"""A running turn as its caller sees it: events (lossless, bounded), result, steer, cancel."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, cast

from typing_extensions import TypeVar

from .events import Event, event_size
from .lines import PendingCall

# An unread turn pauses production at this many events or bytes (backpressure).
BUFFER_MAX_EVENTS = 256
BUFFER_MAX_BYTES = 1024 * 1024

# A typed turn's answer (`fxengine.output`); an untyped turn's is None.
OutputT = TypeVar("OutputT", default=object)


@dataclass(frozen=True)
class TurnResult(Generic[OutputT]):
    """How a turn ended.

    Attributes:
        stop_reason: `end_turn`, `max_output_tokens`, `max_model_turns`, `refused`,
            `cancelled`, `error`, `yielded`, `paused` (tool calls wait for a decision:
            the turn stays open in the journal, see `pending_calls`), or `unknown` (the
            turn was detached: it stays open in the journal).
        usage: tokens summed over the turn's steps (camelCase keys, only those reported).
        error: ``{"code", "message", "cause"?}`` when `stop_reason` is `error`.
        repeated: True when the result is that of a turn that had already ended.
        detached: True when `detach()` stopped the turn and nothing more was written.
        message_id: the turn's id (its prompt's message id), when known.
        epoch: for a session turn, the lease epoch of the worker that ended it.
        pending_calls: for a `paused` turn, the calls it waits on (``{id, executionId,
            name, kind: "approval" | "external", step, input | inputPreview}``), to be
            decided by `engine.resume(decisions=...)`.
        delegated_usage: for a session turn that delegated calls to other agents
            (`delegate_end` lines), the usage of those agents' turns, summed.
        output: for a turn with an `output_type` that ended `end_turn`, the validated
            answer (an instance of the type; for `str`, the answer's text); else None.
    """

    stop_reason: str
    usage: dict[str, int] = field(default_factory=dict)
    error: dict[str, object] | None = None
    repeated: bool = False
    detached: bool = False
    message_id: str | None = None
    epoch: int | None = None
    pending_calls: list[PendingCall] = field(default_factory=list)
    delegated_usage: dict[str, int] = field(default_factory=dict)
    output: OutputT | None = None


class TurnDriver(Protocol):
    """What a `Turn` needs of the loop that runs it (`fxengine.loop.TurnRunner`)."""

    turn_id: str
    retract_candidates: list[int]
    result_future: asyncio.Future[TurnResult]
    events: EventBuffer

    def describe(self) -> str: ...
    def steer(self, input: str | list[object], steer_id: str | None) -> None: ...
    def cancel(self) -> None: ...
    def yield_now(self) -> None: ...
    def detach(self) -> None: ...


class EventBuffer:
    """Events between the turn and its reader: nothing is dropped, production pauses when full.

    Every event also goes, synchronously and in order, to `sink`. Once the caller awaits
    `result()` the bound is lifted, so a turn nobody reads still runs to its end.
    """

    def __init__(self, *, sink: Callable[[Event], None] | None, diag: Callable[[dict[str, object]], None]) -> None:
        self._items: deque[Event] = deque()
        self._bytes = 0
        self._sink = sink
        self._diag = diag
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._closed = False
        self._unbounded = False
        self._reported = False
        self._discarding = False

    def __len__(self) -> int:
        return len(self._items)

    def _full(self) -> bool:
        return not self._unbounded and (len(self._items) >= BUFFER_MAX_EVENTS or self._bytes >= BUFFER_MAX_BYTES)

    async def put(self, event: Event) -> None:
        """Adds one event; waits while the buffer is full and the bound applies."""
        if self._sink is not None:
            try:
                self._sink(event)
            except Exception as exc:  # a failing sink must not break the turn
                self._diag({"type": "ui.error", "error": type(exc).__name__})
        if self._discarding:
            return
        self._items.append(event)
        self._bytes += event_size(event)
        self._readable.set()
        if self._full():
            self._writable.clear()
            if not self._reported:
                self._reported = True
                self._diag({"type": "output.backpressure", "bufferedBytes": self._bytes,
                            "bufferedEvents": len(self._items)})
            while self._full():
                await self._writable.wait()

    def unbound(self) -> None:
        """Lifts the bound (the caller awaits the result and may never read)."""
        self._unbounded = True
        self._writable.set()

    def close(self) -> None:
        self._closed = True
        self._readable.set()

    def discard(self) -> None:
        """Nobody will read on: drops what is buffered (and what comes until the turn
        ends), with one `output.discarded` diagnostic, and lifts the bound."""
        if self._discarding:
            return
        self._discarding = True
        self._diag({"type": "output.discarded", "events": len(self._items), "bytes": self._bytes})
        self._items.clear()
        self._bytes = 0
        self.unbound()

    async def get(self) -> Event | None:
        """The next event, or None once the turn ended and everything was read."""
        while not self._items:
            if self._closed:
                return None
            self._readable.clear()
            await self._readable.wait()
        event = self._items.popleft()
        self._bytes -= event_size(event)
        if not self._full():
            self._writable.set()
        return event


class Turn(Generic[OutputT]):
    """One prompt (or resume) and everything the engine does to answer it.

    Iterate it for model-facing events (dicts, docs/design.md §4 shapes plus `step`); await
    `result()` for the `TurnResult`. Leaving an iteration before its end (`break`, an
    exception, or `aclose()` on the iterator) cancels the turn, as `cancel()` does: the
    model request is closed and the turn ends `cancelled`. To stop reading without
    cancelling, await `result()` instead (events left unread no longer hold the turn back).
    `async with engine.prompt(...) as turn:` cancels a turn still running at the block's end.
    """

    def __init__(self, runner: TurnDriver) -> None:
        self._runner = runner

    def __repr__(self) -> str:
        return f"<Turn {self.turn_id} {self._runner.describe()}>"

    @property
    def turn_id(self) -> str:
        """The turn's id (the prompt's `turn_id`, or `turn_<hex>`)."""
        return self._runner.turn_id

    @property
    def retract_candidates(self) -> list[int]:
        """For a resumed turn: steps whose request was sent but whose response was never
        recorded (their partial output is not part of the conversation)."""
        return list(self._runner.retract_candidates)

    @property
    def done(self) -> bool:
        return self._runner.result_future.done()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        ended = False
        try:
            while (event := await self._runner.events.get()) is not None:
                yield event
            ended = True
        finally:
            # Closed before the end: the caller broke out of its loop (or failed in it).
            if not ended and not self.done:
                self._runner.events.discard()
                self._runner.cancel()

    async def __aenter__(self) -> Turn[OutputT]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self.done:
            self._runner.cancel()

    async def result(self) -> TurnResult[OutputT]:
        """Waits for the turn to end; events left unread no longer hold it back."""
        self._runner.events.unbound()
        result: TurnResult[Any] = await asyncio.shield(self._runner.result_future)
        if result.message_id is None:
            result = dataclasses.replace(result, message_id=self.turn_id)
        return cast("TurnResult[OutputT]", result)

    def steer(self, input: str | list[object], *, id: str | None = None) -> None:
        """Steers the turn: cuts a streaming reply short, or waits for running tools, then
        continues with `input` (text, or text blocks) as a `user_message`.

        A steer with images cannot join the turn: the turn ends `end_turn` at its next
        safe point (a streaming reply is cut short, running tools finish; the turn's first
        request always goes), takes no further steer, and `FxSteerDeferredError`
        (`FX_STEER_NEXT_TURN`) hands the steer back to run as the next prompt.

        Raises:
            FxSteerDeferredError: the steer has images (see above).
            FxLimitError: over the steering limits (64 KiB, 64 queued, 1 MiB queued), or
                an image limit of `fxengine.limits.check_prompt_input`.
            FxInputError: empty text, the turn already ended (`FX_TURN_ENDED`), images
                to a model that takes none (`FX_MODEL_NO_IMAGES`).
        """
        self._runner.steer(input, id)

    def cancel(self) -> None:
        """Ends the turn `cancelled`: aborts tool signals and stops waiting for them."""
        self._runner.cancel()

    def yield_now(self) -> None:
        """Yields before the next model request, as if `yield_at` were reached now.

        Unlike `yield_at`, this applies to the turn's first request too. A model request
        already streaming, and tool calls already running, finish first; the turn then
        ends `yielded` and stays open in the journal (the next `resume()` continues it
        without telling the model). A turn that needs no further request ends as usual.
        No effect once the turn ended.
        """
        self._runner.yield_now()

    def detach(self) -> None:
        """Stops at once and writes nothing more; the turn stays open in the journal."""
        self._runner.detach()
