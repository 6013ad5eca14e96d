"""The line writers of one store on one loop share a `LineFlusher`: one round trip per loop
iteration for all of them. A fenced writer stops alone; a round the connection dropped
under is held by each writer and resent under its key, so every line is stored once."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable

import pytest

from fxengine.journal.journal import Journal
from fxworker.ids import new_session_id, now_ms
from fxworker.metrics import REGISTRY
from fxworker.store import RedisStore, redis_store
from fxworker.store.persistence import LineWriter
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.redis


async def _writers(store: RedisStore, n: int, *, due: Callable[[], int] | None = None) -> list[LineWriter]:
    sids = [new_session_id() for _ in range(n)]
    await asyncio.gather(*[store.accept(sid, agent="a", message_id="m1", input="hi") for sid in sids])
    claims = await asyncio.gather(*[store.claim(sid, holder="w", lease_ms=60_000) for sid in sids])
    return [LineWriter(store, sid, claim.epoch, lease_due_ms=due) for sid, claim in zip(sids, claims)]  # type: ignore[union-attr]


def _push(writer: LineWriter, text: str) -> None:
    writer.push({"type": "text_delta", "delta": text, "step": 1, "messageId": "m1"})


async def _settled(writers: list[LineWriter]) -> None:
    for writer in writers:
        await asyncio.wait_for(writer.flush(), 10)


async def test_the_writers_of_one_iteration_share_a_round_and_keep_their_order(redis_url: str, key_prefix: str) -> None:
    store = redis_store(redis_url, prefix=key_prefix)
    try:
        writers = await _writers(store, 12)
        for round_ in range(5):
            for i, writer in enumerate(writers):
                _push(writer, f"{i}.{round_} ")
            await asyncio.sleep(0.01)
        await _settled(writers)
        for i, writer in enumerate(writers):
            lines = await store.read_lines(writer.session_id, 0)
            assert "".join(line["delta"] for line in lines) == "".join(f"{i}.{r} " for r in range(5))
            assert [line["cursor"] for line in lines] == list(range(1, len(lines) + 1))
    finally:
        await store.aclose()


async def test_a_fenced_writer_stops_alone(redis_url: str, key_prefix: str) -> None:
    store = redis_store(redis_url, prefix=key_prefix)
    try:
        writers = await _writers(store, 4)
        fenced = writers[1]
        fenced_calls: list[str] = []
        refused = asyncio.Event()

        def on_fenced() -> None:
            fenced_calls.append(fenced.session_id)
            refused.set()

        fenced.on_fenced = on_fenced
        await store.release(fenced.session_id, fenced.epoch)  # its lease is gone: its writes are refused
        for i, writer in enumerate(writers):
            _push(writer, f"w{i}")
        await asyncio.wait_for(refused.wait(), 10)  # the round that carried all four came back
        await asyncio.gather(*[w.flush() for i, w in enumerate(writers) if i != 1])
        assert fenced.closed and fenced_calls == [fenced.session_id]
        for i, writer in enumerate(writers):
            lines = await store.read_lines(writer.session_id, 0)
            assert [line["delta"] for line in lines] == ([] if i == 1 else [f"w{i}"])
    finally:
        await store.aclose()


async def test_a_round_the_connection_dropped_under_is_resent_and_stored_once() -> None:
    server = RedisServer(appendonly=True, args=("--appendfsync", "always"))
    store = redis_store(server.url, prefix="fxf", socket_timeout_s=5.0)
    try:
        due = now_ms() + 20_000
        writers = await _writers(store, 6, due=lambda: due)
        for i, writer in enumerate(writers):
            _push(writer, f"a{i}")
        await _settled(writers)
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)  # the next round is written, its replies never come
        for i, writer in enumerate(writers):
            _push(writer, f"b{i}")
        await asyncio.sleep(0.2)
        server.stop(kill=True)  # the connection resets under the round: each writer holds its batch
        server.start()  # same port, everything acknowledged kept (AOF), scripts forgotten
        await _settled(writers)  # each resends its held batch under its key, then what came after
        for i, writer in enumerate(writers):
            lines = await store.read_lines(writer.session_id, 0)
            assert [line["delta"] for line in lines] == [f"a{i}", f"b{i}"]
    finally:
        await store.aclose()
        server.close()


def _appends() -> float:
    return REGISTRY.get_sample_value("fx_store_latency_seconds_count", {"op": "append"}) or 0.0


@pytest.mark.parametrize("record_first", [False, True], ids=["line-first", "record-first"])
async def test_a_line_pushed_while_a_record_is_on_its_way_rides_in_the_records_call(
    redis_url: str, key_prefix: str, record_first: bool
) -> None:
    """A turn's first line and its first record leave in one call, not two: the journal
    tells the store a record is coming, and the flusher's round leaves the lines to it."""
    store = redis_store(redis_url, prefix=key_prefix)
    try:
        sid = new_session_id()
        await store.accept(sid, agent="a", message_id="m1", input="hi")
        claim = await store.claim(sid, holder="w", lease_ms=60_000)
        assert claim is not None
        persistence = store.persistence(sid, claim.epoch, claim)
        journal = Journal(persistence, head=None)
        before = _appends()
        if record_first:
            journal.add("turn_start", {"turn": "m1"}, marks=[{"start": "m1"}])
        persistence.writer.push({"type": "turn_start", "messageId": "m1"})
        if not record_first:
            journal.add("turn_start", {"turn": "m1"}, marks=[{"start": "m1"}])
        await asyncio.wait_for(journal.flush(), 10)
        await asyncio.wait_for(persistence.writer.flush(), 10)
        assert _appends() - before == 1, "the line and the record went in separate calls"
        assert [line["type"] for line in await store.read_lines(sid, 0)] == ["turn_start"]
        assert len((await store.load(sid)).journal) == 1
    finally:
        await store.aclose()
