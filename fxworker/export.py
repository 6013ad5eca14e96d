"""`session.checkpoint()`: a session's conversation as engine checkpoint bytes, read-only (§2, §9).

    data = await session.checkpoint()
    engine = await fxengine.create_engine(model, tools=..., provider=..., checkpoint=data)

The store's `load(session_id)` reads the checkpoint and the log records after it with
plain reads: no lease is taken and nothing is written, so exporting a session a worker
is running neither stops nor fences it (the export is the conversation as far as it was
stored). An engine is built on that snapshot (the same decoding a worker's claim gets)
and asked for its checkpoint; it sends no request, so no credentials are needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from fxengine.codes import Code
from fxengine.engine import create_engine
from fxengine.errors import FxError
from fxengine.persistence import Loaded, Mark
from fxengine.providers import GATEWAY_BASE_URL, Provider

if TYPE_CHECKING:
    from .protocol import WorkerAgent
    from .store import RedisStore


class SnapshotPersistence:
    """A `Persistence` that answers `load()` from a snapshot and refuses every write."""

    def __init__(self, loaded: Loaded) -> None:
        self._loaded = loaded

    def __repr__(self) -> str:
        journal = self._loaded.journal
        records = len(journal) if isinstance(journal, list) else "?"
        return f"<SnapshotPersistence records={records} checkpoint={self._loaded.checkpoint is not None}>"

    async def load(self) -> Loaded:
        return self._loaded

    async def append(self, *, expected: str | None, idempotency_key: str, data: bytes, barrier: bool,
                     marks: list[Mark]) -> str:
        raise FxError("a checkpoint export is read-only: nothing may be appended", code=Code.READ_ONLY)


def _offline_provider(provider: Provider | Mapping[str, object] | None) -> Provider | Mapping[str, object]:
    # AI Gateway without a key is fine here: the export engine sends no request. A custom
    # provider dict resolves without credentials anyway.
    return Provider("gateway", GATEWAY_BASE_URL) if provider is None else provider


async def export_checkpoint(agent: WorkerAgent, session_id: str, *, store: RedisStore | None = None,
                            model: str | Mapping[str, object] | None = None) -> bytes:
    """The conversation of `session_id` as `Engine.checkpoint()` bytes (≤ 4 MiB).

    Args:
        agent: the session's `Agent` (its tools and model name the checkpoint).
        store: where to read (default `agent.store`).
        model: the model to record in the checkpoint (default the agent's).

    Raises:
        FxUnknownSessionError: the store has no such session.
        FxJournalError / FxJournalVersionError: a stored record or checkpoint does not
            parse, or comes from a newer fxengine.
    """
    loaded = await (store if store is not None else agent.store).load(session_id)
    engine = await create_engine(
        model=model if model is not None else agent.model,
        tools=agent.tools,
        provider=_offline_provider(agent.provider),
        persistence=SnapshotPersistence(loaded),
        session_id=session_id,
    )
    try:
        return engine.checkpoint()
    finally:
        await engine.close()
