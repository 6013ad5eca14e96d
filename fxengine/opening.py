"""How a new turn opens in the journal: its prompt, then its `turn_start` record.

A prompt whose images an async `resize_image` prepares is awaited first and checked
again; refused, the turn journals nothing (`refused`). The start ends a turn an earlier
engine left open, and may carry the turn's first model request in the same append.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from . import events as ev
from .codes import Code
from .errors import FxError, FxInputError
from .ids import now_ms
from .limits import Block, check_prompt_input

if TYPE_CHECKING:
    from .core import EngineCore


class TurnOpening:
    """The prompt of one new turn, until its start is journaled."""

    def __init__(self, core: EngineCore, turn_id: str, *, blocks: list[Block] | None,
                 prepare: Awaitable[list[object]] | None) -> None:
        self._core = core
        self._turn_id = turn_id
        self._blocks = blocks
        self._prepare = prepare  # an awaitable of the blocks (an async `resize_image`), or None
        self.refused: FxError | None = None  # the prepared blocks' refusal: nothing was journaled

    def __repr__(self) -> str:
        return f"<TurnOpening turn={self._turn_id} prepared={self._prepare is None} refused={self.refused is not None}>"

    async def prepared(self) -> bool:
        """Awaits the prompt's blocks from an async `resize_image` (if any) and checks them;
        False (with `refused` set) when they are refused: the turn then journals nothing."""
        if self._prepare is None:
            return True
        prepare, self._prepare = self._prepare, None
        try:
            blocks = check_prompt_input(await prepare)
            self._core.check_images(blocks)
        except FxInputError as exc:
            self.refused = exc
            return False
        self._blocks = blocks
        return True

    def drop(self) -> None:
        """Closes a prompt never awaited (the turn stopped before its images were resized)."""
        if inspect.iscoroutine(self._prepare):
            self._prepare.close()

    def open(self, *, request: bool) -> tuple[asyncio.Future[str | None] | None, int | None]:
        """Journals the turn's start (ending a turn an earlier engine left open first);
        (the start's barrier, the step whose model_request rides with it, if any: none
        unless `request`)."""
        core = self._core
        conv = core.conversation
        if conv.open is not None:
            core.end_turn(conv.open.id, ev.end_body("cancelled", conv.open.usage, {
                "code": Code.TURN_INTERRUPTED, "message": "a new prompt ended this turn, which an earlier engine left open"}))
        assert self._blocks is not None
        first_barrier: asyncio.Future[str | None] | None = core.commit(
            "turn_start", {"turn": self._turn_id, "input": self._blocks, "atMs": now_ms()},
            marks=[{"start": self._turn_id}], barrier=True)
        requested = None
        if request:
            # The first request goes in the start's append (one store call fewer): a steer
            # placed after it still reaches that request, as its messages are built later.
            requested = conv.open.step + 1 if conv.open is not None else None
            if requested is not None:
                core.commit("model_request", {"step": requested})
        return first_barrier, requested
