"""What a reader under `FX_ACK=replica` must see while the session's replica is stopped:
shared by the store's tests on one primary with its replica and on a cluster."""

from __future__ import annotations

import signal
import subprocess

import pytest

from fxworker.errors import FxStoreUnavailableError
from fxworker.ids import new_session_id
from fxworker.store import RedisStore


async def session_with_a_line(store: RedisStore) -> tuple[str, int]:
    """A new session, claimed, with one line stored: its id and the claim's epoch."""
    sid = new_session_id()
    await store.accept(sid, agent="default", message_id="m1", input="x")
    claim = await store.claim(sid, holder="w1", lease_ms=60_000)
    assert claim is not None
    await store.append(sid, claim.epoch, lines=[{"type": "text_delta", "delta": "kept"}])
    return sid, claim.epoch


async def reads_wait_for_the_replica(store: RedisStore, sid: str, epoch: int, replica: subprocess.Popen[bytes]) -> None:
    """With `replica` stopped, a line flush lands on the primary only (it does not wait for
    a replica; a record that needs it does, durable=True): reads that would return it
    raise FX_STORE_UNAVAILABLE, async and blocking alike. Once the replica runs again,
    they return it."""
    replica.send_signal(signal.SIGSTOP)  # the replica stops acknowledging
    try:
        store.core.ack_timeout_ms = 200
        await store.append(sid, epoch, lines=[{"type": "text_delta", "delta": "primary only"}])
        with pytest.raises(FxStoreUnavailableError, match="replica"):
            await store.read_lines(sid, 0)
        with pytest.raises(FxStoreUnavailableError, match="replica"):
            store.sync.read_lines(sid, 1)
        # What no replica holds yet is not in the way of a read that finds nothing.
        assert await store.read_lines(sid, 2) == []
    finally:
        replica.send_signal(signal.SIGCONT)
    store.core.ack_timeout_ms = 5000
    assert [line["delta"] for line in await store.read_lines(sid, 0)] == ["kept", "primary only"]
    assert [line["delta"] for line in store.sync.read_lines(sid, 1, block_ms=100)] == ["primary only"]
