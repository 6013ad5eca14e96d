"""One model step of a turn: the request streamed, its deltas passed on as events.

`ModelStream.run(step)` builds the request from the conversation, streams it
(`models.openai_chat.model_step`) as a sub-task of the turn's task and returns what came
with whether a steer cut it short (`cut()` cancels only that sub-task). What a step had
streamed when the turn stopped inside it is kept until the runner records it
(`take_partial()`), or forgets it once the step's response is committed (`forget()`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import events as ev
from . import tracing
from .models.openai_chat import StepOutput, build_request, model_step
from .turn import EventBuffer

if TYPE_CHECKING:
    from .core import EngineCore


class ModelStream:
    """Streams the model steps of one turn, one at a time."""

    def __init__(self, core: EngineCore, *, events: EventBuffer, halted: Callable[[], bool]) -> None:
        self._core = core
        self._events = events
        self._halted = halted  # a halted turn's cancel is the turn's, not a steer's cut
        self._task: asyncio.Task[StepOutput] | None = None
        self.step: int | None = None  # the step streaming now, or None
        # The last step and its output, until taken or forgotten: a stop inside the step
        # leaves it for the runner to record.
        self._partial: StepOutput | None = None
        self._partial_step = 0
        # A typed turn's part of each request (`build_request`'s `output`), or None.
        self.ask: dict[str, object] | None = None

    def __repr__(self) -> str:
        return f"<ModelStream step={self.step} streaming={self._task is not None}>"

    def cut(self) -> None:
        """Cuts the streaming reply short (a steer): `run` returns it as cut."""
        stream = self._task
        if stream is not None and not stream.done():
            stream.cancel()

    def forget(self) -> None:
        """The step's output was committed: there is no partial output to record."""
        self._partial = None

    def take_partial(self) -> tuple[int, StepOutput] | None:
        """(step, output) of a step the turn stopped inside, once; None when there is none."""
        out, self._partial = self._partial, None
        return (self._partial_step, out) if out is not None else None

    async def run(self, step: int) -> tuple[StepOutput, bool]:
        """Streams step `step`: (its output, whether a steer cut it short)."""
        core = self._core
        out = StepOutput()
        self._partial = out
        self._partial_step = step
        self.step = step
        body = build_request(core.spec, core.conversation.messages, tools=core.tool_list, instructions=core.instructions,
                             output=self.ask)
        put = self._events.put

        async def on_delta(kind: str, delta: str) -> None:
            if kind == "text_delta":
                await put(ev.text_delta(delta, step))
            else:
                await put(ev.reasoning_delta(delta, step))

        stream = asyncio.get_running_loop().create_task(
            model_step(core.client, core.provider, body, on_delta=on_delta, diag=core.diag, step=step, out=out)
        )
        self._task = stream
        span = tracing.start_model_span(core.provider.name, core.spec.id, step)
        cut, failure = False, None
        try:
            await stream
            return out, False
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._halted() or (task is not None and task.cancelling()):
                raise
            cut = True
            return out, True  # a steer cut the reply short
        except Exception as exc:
            failure = exc
            raise
        finally:
            self._task = None
            self.step = None
            tracing.end_model_span(span, model=out.model, finish_reason=out.finish_reason, usage=out.usage, cut=cut,
                                   error=failure)
