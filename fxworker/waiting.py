"""The inputs one delivery holds for its session, in the order they run (§6).

`Waiting` starts from the claim's waiting inputs and takes what the inbox watcher passes on
while the lease is held. A steer handed to the running turn stays known here until the
turn places it (its `user_message`): a turn that ends without placing it hands it back,
and it runs next, before any later prompt, as the store still holds it waiting.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable

from .store.types import Input


class Waiting:
    """The prompts, steers and decisions waiting in this delivery, and the steers handed to
    its turn."""

    def __init__(self, inputs: Iterable[Input] = ()) -> None:
        self.pending: deque[Input] = deque(inputs)
        # Steers handed to the running turn that it has not placed yet, by message id.
        self.handed: dict[str, Input] = {}
        # A cancel of the open turn came while it was parked here (fxworker/work.py).
        self.cancelled_open = False

    def __repr__(self) -> str:
        return f"<Waiting pending={len(self.pending)} handed={len(self.handed)}>"

    def next(self) -> Input | None:
        """The next prompt or steer to run (a cancel request left here applies to the turn
        open when it landed; none is open now)."""
        while self.pending:
            entry = self.pending.popleft()
            if entry.kind in ("prompt", "steer"):
                return entry
        return None

    def put_back(self, entry: Input) -> None:
        """`entry` runs first after all (the delivery stops before it)."""
        self.pending.appendleft(entry)

    def add(self, entry: Input) -> None:
        self.pending.append(entry)

    def any(self) -> bool:
        """Whether a prompt or steer waits here, or a steer handed to the turn is unplaced."""
        return bool(self.handed) or any(entry.kind in ("prompt", "steer") for entry in self.pending)

    def cancel(self, message_id: str) -> None:
        """A cancel of an input that has not started here: it ends `cancelled` as it starts.
        A steer the ended turn did not place heads the store's waiting inputs before it is
        taken back: the cancel names it there."""
        handed = self.handed.get(message_id)
        if handed is not None:
            self.handed[message_id] = dataclasses.replace(handed, cancelled=True)
        self.pending = deque(dataclasses.replace(waiting, cancelled=True)
                             if waiting.kind in ("prompt", "steer") and waiting.message_id == message_id
                             else waiting for waiting in self.pending)

    def hand(self, entry: Input) -> None:
        """`entry`, a steer, went to the running turn."""
        self.handed[entry.message_id] = entry

    def placed(self, message_id: str) -> None:
        """The running turn placed the steer `message_id` (its `accepted` record went first)."""
        self.handed.pop(message_id, None)

    def steers(self) -> list[Input]:
        """The steers waiting here, in order (they join a turn as it starts or resumes)."""
        return [entry for entry in self.pending if entry.kind == "steer"]

    def take_decisions(self) -> list[Input]:
        """The decisions waiting here (for the calls of the parked turn), taken out."""
        taken = [entry for entry in self.pending if entry.kind == "decision"]
        if taken:
            self.pending = deque(entry for entry in self.pending if entry.kind != "decision")
        return taken

    def remove(self, entry: Input) -> None:
        self.pending.remove(entry)

    def take_back_steers(self) -> None:
        """Puts the steers the last turn was handed but never placed (it was cancelled, or
        ended before its next request) back among the waiting inputs, in acceptance order."""
        if not self.handed:
            return
        back, self.handed = self.handed, {}
        self.pending = deque(sorted([*back.values(), *self.pending], key=lambda waiting: waiting.seq))
