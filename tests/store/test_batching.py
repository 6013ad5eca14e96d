"""The single calls of one loop iteration leave as one pipeline (`AsyncTransport.run_batched`),
each answered on its own: one refused call fails alone, a server that forgot its scripts
answers every call of the batch once, and a dropped connection fails the batch with
FX_STORE_UNAVAILABLE and the next calls reconnect."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import pytest
import redis

from fxworker.errors import FxLeaseLostError, FxStoreUnavailableError
from fxworker.ids import new_session_id
from fxworker.store import RedisStore, redis_store
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.redis

SESSIONS = 20


@pytest.fixture
async def store(redis_url: str, key_prefix: str) -> AsyncIterator[RedisStore]:
    built = redis_store(redis_url, prefix=key_prefix, socket_timeout_s=2.0)
    try:
        yield built
    finally:
        await built.aclose()


async def _claimed(store: RedisStore, n: int) -> list[tuple[str, int]]:
    sids = [new_session_id() for _ in range(n)]
    await asyncio.gather(*[store.accept(sid, agent="a", message_id="m1", input="hi") for sid in sids])
    claims = await asyncio.gather(*[store.claim(sid, holder="w", lease_ms=10_000) for sid in sids])
    return [(sid, claim.epoch) for sid, claim in zip(sids, claims)]  # type: ignore[union-attr]


async def test_a_batch_goes_in_one_write_and_each_call_gets_its_own_answer(
    store: RedisStore, redis_url: str
) -> None:
    sessions = await _claimed(store, SESSIONS)
    admin = redis.Redis.from_url(redis_url)
    try:
        before = len(admin.client_list())
        lines = [{"type": "text_delta", "delta": f"s{i}", "step": 1} for i in range(SESSIONS)]
        appended = await asyncio.gather(*[
            store.append(sid, epoch, lines=[line]) for (sid, epoch), line in zip(sessions, lines)
        ])
        # Twenty calls at once, one connection: they went as one batch, not twenty calls
        # each on a connection of its own.
        assert len(admin.client_list()) == before
    finally:
        admin.close()
    assert [a.lines for a in appended] == [[1]] * SESSIONS
    read = await asyncio.gather(*[store.read_lines(sid, 0) for sid, _ in sessions])
    assert [r[0]["delta"] for r in read] == [f"s{i}" for i in range(SESSIONS)]


async def test_a_refused_call_fails_alone(store: RedisStore) -> None:
    sessions = await _claimed(store, 4)
    stale = sessions[1]
    calls = [store.append(sid, epoch + (1 if (sid, epoch) == stale else 0), lines=[{"type": "x"}])
             for sid, epoch in sessions]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(results[1], FxLeaseLostError), results[1]
    assert all(not isinstance(r, BaseException) for i, r in enumerate(results) if i != 1), results


async def test_a_server_that_forgot_its_scripts_answers_every_call_of_the_batch_once(
    store: RedisStore, redis_url: str
) -> None:
    sessions = await _claimed(store, 6)
    admin = redis.Redis.from_url(redis_url)
    try:
        admin.script_flush()
        appended = await asyncio.gather(*[store.append(sid, epoch, lines=[{"type": "x"}]) for sid, epoch in sessions])
        assert [a.lines for a in appended] == [[1]] * 6  # each stored once: a NOSCRIPT call never ran
        read = await asyncio.gather(*[store.read_lines(sid, 0) for sid, _ in sessions])
        assert [len(r) for r in read] == [1] * 6
    finally:
        admin.close()


async def test_a_dropped_connection_fails_the_batch_and_the_next_calls_reconnect() -> None:
    server = RedisServer(appendonly=True, args=("--appendfsync", "always"))
    store = redis_store(server.url, prefix="fxb", socket_timeout_s=5.0)
    try:
        sessions = await _claimed(store, 8)
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)  # the batch is written, its replies never come
        calls = asyncio.ensure_future(asyncio.gather(
            *[store.renew(sid, epoch, lease_ms=10_000) for sid, epoch in sessions], return_exceptions=True))
        await asyncio.sleep(0.2)
        assert not calls.done()
        server.stop(kill=True)  # the connection resets under the waiting batch
        results = await asyncio.wait_for(calls, 10)
        assert all(isinstance(r, FxStoreUnavailableError) for r in results), results
        server.start()  # same port, the claims kept (AOF), the scripts forgotten
        renewed = await asyncio.gather(*[store.renew(sid, epoch, lease_ms=10_000) for sid, epoch in sessions])
        assert all(isinstance(ms, int) for ms in renewed)
    finally:
        await store.aclose()
        server.close()


async def test_a_stalled_server_fails_the_batch_at_its_deadline_and_the_next_calls_go_through() -> None:
    server = RedisServer()
    store = redis_store(server.url, prefix="fxb", socket_timeout_s=0.5)
    try:
        sessions = await _claimed(store, 8)
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            results = await asyncio.wait_for(asyncio.gather(
                *[store.renew(sid, epoch, lease_ms=10_000) for sid, epoch in sessions], return_exceptions=True), 10)
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert all(isinstance(r, FxStoreUnavailableError) for r in results), results
        renewed = await asyncio.gather(*[store.renew(sid, epoch, lease_ms=10_000) for sid, epoch in sessions])
        assert all(isinstance(ms, int) for ms in renewed)
    finally:
        await store.aclose()
        server.close()
