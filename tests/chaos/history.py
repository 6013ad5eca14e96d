"""The recorded history of a chaos run: what the workload and the nemesis did, and when.

Every operation is one dict `{"t": seconds since the run began, "kind": ..., ...}`,
appended under a lock by the threads of the run (session drivers, readers, the nemesis and
its watchers). The checker reads it together with what the store holds at the end; the
run writes it as JSON lines next to its result, so a failed run can be read back.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any


class History:
    """An append-only, thread-safe list of operations."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self._ops: list[dict[str, Any]] = []

    def now(self) -> float:
        """Seconds since the run began (the `t` of an operation recorded now)."""
        return time.monotonic() - self._t0

    def record(self, kind: str, **fields: Any) -> dict[str, Any]:
        op = {"t": round(self.now(), 4), "kind": kind, **fields}
        with self._lock:
            self._ops.append(op)
        return op

    def of(self, *kinds: str) -> list[dict[str, Any]]:
        """The operations of these kinds, in the order they were recorded."""
        with self._lock:
            return [op for op in self._ops if op["kind"] in kinds]

    def all(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._ops)

    def write_jsonl(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as out:
            for op in self.all():
                out.write(json.dumps(op, default=str) + "\n")
