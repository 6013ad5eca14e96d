"""A delivery's `Deadline` on its own (§7): the soft and hard stops, and a warm shutdown
pulling both in. The same stops over real workers are in test_fault_deadline.py and
test_fault_signals.py."""

from __future__ import annotations

import asyncio
import threading

from fxworker.deadline import HARD_STOP_MAX_MS, Deadline
from fxworker.ids import now_ms
from fxworker.runtime import StopSignal


def test_the_stops_sit_the_reserve_and_at_most_2_s_before_the_deadline() -> None:
    deadline = Deadline(100_000, 8_000)
    assert deadline.yield_at_ms == 92_000
    assert deadline.hard_stop_ms == 100_000 - HARD_STOP_MAX_MS
    assert Deadline(100_000, 1_000).hard_stop_ms == 99_500  # half a short reserve
    assert deadline.past_soft() and deadline.yield_at() == 92_000  # 100 s after the epoch: long past


async def test_the_hard_stop_fires_once_at_its_time_and_disarm_stops_it() -> None:
    fired = asyncio.Event()
    deadline = Deadline(now_ms() + 400, 400)  # hard stop 200 ms from now
    disarm = deadline.arm(on_hard_stop=fired.set, on_shutdown=lambda: None)
    try:
        await asyncio.wait_for(fired.wait(), 2)
        assert now_ms() >= deadline.hard_stop_ms
    finally:
        disarm()
    silent: list[str] = []
    disarm = Deadline(now_ms() + 400, 400).arm(on_hard_stop=lambda: silent.append("hard"), on_shutdown=lambda: None)
    disarm()
    await asyncio.sleep(0.4)  # past the disarmed hard stop: nothing may fire
    assert silent == []


async def test_a_warm_shutdown_yields_at_once_and_cuts_off_at_the_pulled_in_hard_stop() -> None:
    stopping = StopSignal()
    events: list[tuple[str, int]] = []
    cut_off = asyncio.Event()

    def hard_stop() -> None:
        events.append(("hard", now_ms()))
        cut_off.set()

    deadline = Deadline(now_ms() + 120_000, 400, stopping)  # two minutes left, a 400 ms reserve
    assert not deadline.past_soft() and deadline.yield_at() == deadline.yield_at_ms
    disarm = deadline.arm(on_hard_stop=hard_stop, on_shutdown=lambda: events.append(("shutdown", now_ms())))
    try:
        shutdown_at = now_ms()
        stopping.set()
        await asyncio.wait_for(cut_off.wait(), 5)
    finally:
        disarm()
    assert [kind for kind, _ in events] == ["shutdown", "hard"]
    assert deadline.shutting_down and deadline.past_soft()
    assert deadline.deadline_ms <= shutdown_at + 400 + 50  # pulled in to now + reserve, at once
    assert abs(deadline.yield_at() - now_ms()) < 50  # the engine yields now
    assert events[1][1] >= deadline.hard_stop_ms


async def test_a_shutdown_signalled_from_another_thread_reaches_the_loop_at_once() -> None:
    stopping = StopSignal()
    shut = asyncio.Event()
    deadline = Deadline(now_ms() + 120_000, 10_000, stopping)
    disarm = deadline.arm(on_hard_stop=lambda: None, on_shutdown=shut.set)
    try:
        signaller = threading.Thread(target=stopping.set)
        signaller.start()
        await asyncio.wait_for(shut.wait(), 1)
        signaller.join(1)
    finally:
        disarm()
    assert deadline.deadline_ms <= now_ms() + 10_000


async def test_a_disarmed_deadline_ignores_a_shutdown_already_on_its_way() -> None:
    stopping = StopSignal()
    events: list[str] = []
    disarm = Deadline(now_ms() + 120_000, 400, stopping).arm(
        on_hard_stop=lambda: events.append("hard"), on_shutdown=lambda: events.append("shutdown"))
    stopping.set()  # queues the watch's callback on this loop
    disarm()  # before it runs
    await asyncio.sleep(0.3)  # past the hard stop a shutdown would have pulled in
    assert events == []


async def test_a_deadline_armed_after_the_shutdown_began_yields_at_once() -> None:
    stopping = StopSignal()
    stopping.set()
    shut = asyncio.Event()
    deadline = Deadline(now_ms() + 120_000, 400, stopping)
    disarm = deadline.arm(on_hard_stop=lambda: None, on_shutdown=shut.set)
    try:
        await asyncio.wait_for(shut.wait(), 1)
    finally:
        disarm()
    assert deadline.past_soft()
