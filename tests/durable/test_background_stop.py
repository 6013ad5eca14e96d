"""Stopping what runs beside a turn returns within a bound, even mid Redis call.

On Python 3.11 redis-py writes to its socket inside `asyncio.wait_for`, which drops a
cancellation that lands as the write completes; a watcher or lease keeper that lost its
cancel that way ran for ever and its runner waited at `stop()` (fxworker/background.py).
The lease keeper's `SessionLoop.stop()` now ends it within a bound (a task that holds out
past `timeout_s` is left to its `stopping` flag, which ends it once its call returns); an
`InboxWatcher` leaves its loop's `InboxHub` at once and is handed nothing after that.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from fxworker.background import STOP_TIMEOUT_S, SessionLoop
from fxworker.ids import new_session_id
from fxworker.leases import LeaseKeeper
from fxworker.store import redis_store
from fxworker.watch import InboxWatcher

pytestmark = pytest.mark.redis

STOP_BOUND_S = STOP_TIMEOUT_S + 0.5


class CancelSwallowingStore:
    """A real store whose calls wait at a gate the first time and drop the cancellation that
    reaches them there, as Python 3.11's `asyncio.wait_for` does when the cancel lands as
    the inner call completes; then they make the real call and return its result."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.entered = asyncio.Event()
        self.swallowed = 0
        self.calls_after_swallow = 0

    async def _swallowing(self, make_call: Any) -> Any:
        if self.swallowed:
            self.calls_after_swallow += 1
        elif not self.entered.is_set():
            self.entered.set()
            try:
                await asyncio.sleep(10)  # the stop's cancel lands here
            except asyncio.CancelledError:
                self.swallowed += 1
                asyncio.current_task().uncancel()  # type: ignore[union-attr]
        return await make_call()

    async def watch_inboxes(self, *args: Any, **kwargs: Any) -> Any:
        return await self._swallowing(lambda: self.store.watch_inboxes(*args, **kwargs))

    async def renew(self, *args: Any, **kwargs: Any) -> Any:
        return await self._swallowing(lambda: self.store.renew(*args, **kwargs))


async def _accepted_session(store: Any) -> str:
    sid = new_session_id()
    await store.accept(sid, agent="a", kind="prompt", message_id="m1", input=[{"type": "text", "text": "x"}],
                       now_ms=int(time.time() * 1000))
    return sid


async def _stop_within_bound(loop: Any) -> float:
    """Seconds `loop.stop()` took; fails when it has not returned after `STOP_BOUND_S`."""
    started = time.monotonic()
    # Not wait_for: cancelling a stop() that waits on its task cancels the task again.
    stopping = asyncio.ensure_future(loop.stop())
    done, _ = await asyncio.wait({stopping}, timeout=STOP_BOUND_S)
    assert done, f"{loop!r}.stop() has not returned after {STOP_BOUND_S} s"
    stopping.result()
    return time.monotonic() - started


def _watcher(store: Any, sid: str) -> InboxWatcher:
    return InboxWatcher(store, sid, after_seq=0, on_input=lambda entry: None)


def _keeper(store: Any, sid: str, epoch: int) -> LeaseKeeper:
    # A short lease so renewals (and cancels landing in them) come quickly.
    return LeaseKeeper(store, sid, epoch, lease_ms=300, on_lost=lambda exc: None)


async def _claimed(store: Any, sid: str) -> int:
    claim = await store.claim(sid, holder="wkr_test", lease_ms=300, now_ms=int(time.time() * 1000))
    assert claim is not None
    return claim.epoch


def test_stop_ends_a_lease_keeper_whose_cancel_was_swallowed(redis_url: str, key_prefix: str) -> None:
    async def main() -> None:
        store = CancelSwallowingStore(redis_store(redis_url, prefix=key_prefix))
        sid = await _accepted_session(store.store)
        loop = _keeper(store, sid, await _claimed(store.store, sid)).start()
        task = loop._task
        assert task is not None
        # Stop while a store call is in flight, so the first cancel lands inside it.
        await asyncio.wait_for(store.entered.wait(), 5)
        await _stop_within_bound(loop)
        assert task.done()
        assert store.swallowed == 1, "the cancel never landed inside a store call"
        calls = store.calls_after_swallow
        await asyncio.sleep(0.5)
        assert store.calls_after_swallow == calls, "the loop went on calling the store after stop()"

    asyncio.run(main())


class StubbornLoop(SessionLoop):
    """A loop whose one call drops every cancel and returns only when `release` is set."""

    TASK_NAME = "stubborn"

    def __init__(self) -> None:
        self.session_id = "fxs_stubborn"
        self.calls = 0
        self.swallowed = 0
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def _call(self) -> None:
        self.calls += 1
        self.entered.set()
        while not self.release.is_set():
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.swallowed += 1
                asyncio.current_task().uncancel()  # type: ignore[union-attr]

    async def _run(self) -> None:
        while not self.stopping:
            await self._call()


def test_stop_gives_up_after_its_timeout_and_the_flag_ends_the_loop(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        loop = StubbornLoop().start()
        task = loop._task
        assert task is not None
        await asyncio.wait_for(loop.entered.wait(), 5)
        started = time.monotonic()
        stopping = asyncio.ensure_future(loop.stop(timeout_s=0.3))
        done, _ = await asyncio.wait({stopping}, timeout=1.5)
        took_s = time.monotonic() - started
        assert done, "stop() did not give up within 1.5 s"
        stopping.result()
        assert 0.3 <= took_s < 1.5
        assert not task.done() and loop.swallowed >= 1, "the call did not hold out past the timeout"
        assert "did not stop within 0.3 s" in caplog.text
        # The call returns at last: the loop sees its flag and makes no further call.
        loop.release.set()
        await asyncio.wait_for(task, 5)
        assert loop.calls == 1

    asyncio.run(main())


def test_a_watcher_stopped_while_its_hub_reads_is_handed_nothing(redis_url: str, key_prefix: str) -> None:
    async def main() -> None:
        store = CancelSwallowingStore(redis_store(redis_url, prefix=key_prefix))
        sid = await _accepted_session(store.store)  # its inbox holds one entry after seq 0
        handed: list[Any] = []
        watcher = InboxWatcher(store, sid, after_seq=0, on_input=handed.append).start()
        hub = watcher._hub
        assert hub is not None and hub._task is not None
        await asyncio.wait_for(store.entered.wait(), 5)  # the hub's read is in flight
        await _stop_within_bound(watcher)
        await asyncio.wait_for(hub._task, 5)  # with no watcher left, the hub's task ends
        assert handed == [], "an entry was handed to a watcher after it stopped"
        assert watcher.after_seq == 0

    asyncio.run(main())


def test_one_hub_reads_every_inbox_of_a_loop_in_one_call(redis_url: str, key_prefix: str) -> None:
    async def main() -> None:
        store = redis_store(redis_url, prefix=key_prefix)
        sids = [await _accepted_session(store) for _ in range(20)]
        handed: dict[str, list[Any]] = {sid: [] for sid in sids}
        watchers = [InboxWatcher(store, sid, after_seq=0, on_input=handed[sid].append).start() for sid in sids]
        hub = watchers[0]._hub
        assert hub is not None and all(w._hub is hub for w in watchers)
        for _ in range(200):
            if all(handed.values()):
                break
            await asyncio.sleep(0.01)
        assert all(len(entries) == 1 and entries[0].message_id == "m1" for entries in handed.values())
        assert hub.reads <= 2  # one call found all 20 (a second may have started meanwhile)
        for w in watchers:
            await w.stop()

    asyncio.run(main())


def test_many_stops_on_a_real_store_each_return_within_the_bound(redis_url: str, key_prefix: str) -> None:
    """1,000 watchers and 200 lease keepers, each stopped at a random point of its loop."""

    async def main() -> None:
        store = redis_store(redis_url, prefix=key_prefix)
        sids = [await _accepted_session(store) for _ in range(50)]
        slowest = 0.0
        for round_ in range(20):
            watchers = [_watcher(store, sid).start() for sid in sids]
            await asyncio.sleep(0.003 * (round_ % 7))
            durations = await asyncio.gather(*(_stop_within_bound(w) for w in watchers))
            slowest = max(slowest, *durations)
            assert all(w._hub is None for w in watchers)
        for round_ in range(4):
            keepers = [_keeper(store, sid, await _claimed(store, sid)).start() for sid in sids]
            await asyncio.sleep(0.1 + 0.03 * round_)
            durations = await asyncio.gather(*(_stop_within_bound(k) for k in keepers))
            slowest = max(slowest, *durations)
            for sid, keeper in zip(sids, keepers):
                await store.release(sid, keeper.epoch)
        print(f"slowest stop: {slowest * 1000:.1f} ms")

    asyncio.run(main())


def test_a_turn_shorter_than_the_interval_costs_no_inbox_read(redis_url: str, key_prefix: str) -> None:
    """A watcher joins right after its claim read the inbox: the hub reads after its
    interval, not at once, so a watcher gone before then cost no read at all."""
    async def main() -> None:
        store = redis_store(redis_url, prefix=key_prefix)
        sid = await _accepted_session(store)
        watcher = InboxWatcher(store, sid, after_seq=1, on_input=lambda entry: None).start()
        hub = watcher._hub
        assert hub is not None and hub._task is not None
        await asyncio.sleep(0)
        await watcher.stop()
        await asyncio.wait_for(hub._task, 5)  # with no watcher left, the hub's task ends
        assert hub.reads == 0

    asyncio.run(main())
