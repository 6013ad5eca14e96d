"""The steers of one running turn: queued within the §6 limits, placed at its next safe point."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from . import events as ev
from .ids import new_steer_id
from .limits import check_message_id, check_prompt_input, check_steer_text, has_images, prompt_text
from .turn import EventBuffer

if TYPE_CHECKING:
    from .core import EngineCore


def steer_text(core: EngineCore, input: str | list[object], steer_id: str | None) -> str | None:
    """The text of a steer (text, or text blocks); None for one with images, checked as
    the next prompt it becomes (its id, the model's images, its text).

    Raises:
        FxLimitError, FxInputError: as `limits.check_prompt_input`, and for a steer with
            images, `check_message_id`, `EngineCore.check_images` and `check_steer_text`.
    """
    if isinstance(input, str):
        return input
    blocks = check_prompt_input(input)
    if not has_images(blocks):
        return prompt_text(blocks)
    if steer_id is not None:
        check_message_id(steer_id)
    core.check_images(blocks)
    text = prompt_text(blocks)
    if text.strip():
        check_steer_text(text)
    return None


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


class SteerQueue:
    """Steers waiting for the turn's next safe point (before a model request), in order."""

    def __init__(self) -> None:
        self._items: deque[tuple[str, str]] = deque()  # (steer id, text)
        self._bytes = 0

    def __repr__(self) -> str:
        return f"<SteerQueue steers={len(self._items)} bytes={self._bytes}>"

    def __len__(self) -> int:
        return len(self._items)

    def add(self, text: str, steer_id: str | None) -> None:
        """Queues one steer's text (a new id when `steer_id` is None).

        Raises:
            FxLimitError: over the steering limits (64 KiB, 64 queued, 1 MiB queued).
            FxInputError: empty text, a malformed `steer_id`.
        """
        check_steer_text(text, queued=len(self._items), queued_bytes=self._bytes)
        if steer_id is not None:
            check_message_id(steer_id)
        self._items.append((steer_id or new_steer_id(), text))
        self._bytes += _size(text)

    async def place(self, core: EngineCore, events: EventBuffer) -> None:
        """Records every queued steer as accepted and tells the reader, in order."""
        while self._items:
            steer_id, text = self._items.popleft()
            self._bytes -= _size(text)
            core.commit("accepted", {"id": steer_id, "text": text}, marks=[{"accepted": steer_id}])
            await events.put(ev.user_message(text, steer_id))
