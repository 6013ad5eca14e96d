"""Three simulated workers race for one session against the real Redis (§11.4, §11.7).

Workers claim, append (records + UI lines), renew, freeze (stop renewing), wake, release,
end a turn with a call that lets the session go and packs the lines it stored (§5 "Packed
at rest"; at random with one text wrong, which packs nothing), while the clock the
scripts see is advanced past lease expiries. After every step: the log
holds exactly the writes of whoever headed the epoch chain at the time, the UI stream is
contiguous, in epoch order and free of stale lines, and at most one live holder exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from fxworker.errors import FxLeaseLostError
from fxworker.ids import new_session_id
from fxworker.store import redis_store
from tests.store.conftest import FakeClock
from tests.support.stored import stored_records

LEASE_MS = 1000
WORKERS = st.sampled_from(["w1", "w2", "w3"])


@dataclass
class Worker:
    epoch: int | None = None
    frozen: bool = False
    first_line: int = 0  # the cursor its claim's first line gets
    texts: list[str] = field(default_factory=list)  # its lines as sent (`Appended.texts`)


class LeaseMachine(RuleBasedStateMachine):
    url = ""
    prefix = ""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.store = redis_store(self.url, prefix=self.prefix, clock=self.clock).sync
        self.sid = new_session_id()
        self.store.accept(self.sid, agent="default", message_id="m1", input="go")
        self.workers = {name: Worker() for name in ("w1", "w2", "w3")}
        # The model: the head of the epoch chain and what it wrote.
        self.epoch = 0
        self.holder: str | None = None
        self.expires_ms = 0
        self.released = True
        self.log: list[tuple[bytes, int]] = []
        self.lines: list[tuple[str, int]] = []
        self.writes = 0

    def teardown(self) -> None:
        self.store.close()

    def live(self) -> bool:
        return not self.released and self.expires_ms > self.clock.ms

    def heads(self, name: str) -> bool:
        return self.workers[name].epoch == self.epoch and self.live()

    @rule(name=WORKERS)
    def claim(self, name: str) -> None:
        claim = self.store.claim(self.sid, holder=name, lease_ms=LEASE_MS)
        if self.live() and self.holder == name:
            # The live lease's own holder claiming again (a retry after a lost reply):
            # the same epoch, the lease extended, nothing else changes.
            assert claim is not None and claim.epoch == self.epoch
            self.expires_ms = self.clock.ms + LEASE_MS
            return
        if self.live():
            assert claim is None
            return
        assert claim is not None and claim.epoch == self.epoch + 1
        assert [r.data for r in claim.records] == [data for data, _ in self.log]
        self.epoch, self.holder, self.expires_ms, self.released = claim.epoch, name, self.clock.ms + LEASE_MS, False
        assert claim.ui_cursor == len(self.lines)
        self.workers[name] = Worker(epoch=claim.epoch, first_line=claim.ui_cursor + 1)

    def _write(self, name: str, n_lines: int, *, let_go: bool = False, spoil: bool = False) -> None:
        """A record and `n_lines` lines from worker `name`. With `let_go`, the record's call
        lets the session go and packs the lines the worker stored under its claim (`spoil`:
        with one of their texts wrong, which packs nothing)."""
        worker = self.workers[name]
        if worker.epoch is None:
            return
        self.writes += 1
        data = f"{name}:{self.writes}".encode()
        lines = [{"type": "text_delta", "delta": f"{data.decode()}/{i}"} for i in range(n_lines)]
        texts = list(worker.texts)
        spoilt = spoil and bool(texts)
        if spoilt:
            texts[0] = texts[0].replace("text_delta", "text_delte")
        # The prompt is taken without a turn (`drop`): nothing waits, so the call lets go.
        marks = [{"drop": "m1"}] if let_go else []
        options: dict[str, Any] = {"release": True, "pack_after": (worker.first_line, texts)} if let_go else {}
        expected = self.heads(name)
        try:
            appended = self.store.append(self.sid, worker.epoch, records=[(data.decode(), data, marks)], lines=lines,
                                         **options)
        except FxLeaseLostError:
            assert not expected
            worker.epoch = None  # a fenced worker stops at once
            return
        assert expected
        assert appended.lines == list(range(len(self.lines) + 1, len(self.lines) + n_lines + 1))
        self.log.append((data, worker.epoch))
        self.lines += [(line["delta"], worker.epoch) for line in lines]
        worker.texts += appended.texts
        if let_go:
            assert appended.released
            claimed = len(self.lines) - worker.first_line + 1  # the lines of this claim
            assert appended.packed == (0 if spoilt else claimed)
            self.released = True
            worker.epoch = None

    @rule(name=WORKERS, n_lines=st.integers(0, 3))
    def append(self, name: str, n_lines: int) -> None:
        self._write(name, n_lines)

    @rule(name=WORKERS, n_lines=st.integers(0, 3), spoil=st.booleans())
    def end_and_let_go(self, name: str, n_lines: int, spoil: bool) -> None:
        self._write(name, n_lines, let_go=True, spoil=spoil)

    @rule(name=WORKERS)
    def renew(self, name: str) -> None:
        worker = self.workers[name]
        if worker.epoch is None or worker.frozen:
            return
        expected = self.heads(name)
        try:
            self.store.renew(self.sid, worker.epoch, lease_ms=LEASE_MS)
        except FxLeaseLostError:
            assert not expected
            worker.epoch = None
            return
        assert expected
        self.expires_ms = self.clock.ms + LEASE_MS

    @rule(name=WORKERS)
    def freeze(self, name: str) -> None:
        self.workers[name].frozen = True

    @rule(name=WORKERS)
    def wake(self, name: str) -> None:
        self.workers[name].frozen = False

    @rule(ms=st.integers(1, 2 * LEASE_MS))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule(name=WORKERS, cutoff=st.booleans())
    def release(self, name: str, cutoff: bool) -> None:
        worker = self.workers[name]
        if worker.epoch is None:
            return
        expected = worker.epoch == self.epoch
        try:
            self.store.release(self.sid, worker.epoch, cutoff=cutoff)
        except FxLeaseLostError:
            assert not expected
        else:
            assert expected
            self.released = True
        worker.epoch = None

    @invariant()
    def only_the_chain_head_writes_are_stored(self) -> None:
        raw = stored_records(self.store.client, self.store._core.keys(self.sid))
        stored = [(fields[b"d"], int(fields[b"e"])) for _, fields in raw]
        assert stored == self.log
        epochs = [e for _, e in stored]
        assert epochs == sorted(epochs)

    @invariant()
    def the_ui_stream_is_in_order_with_no_stale_line(self) -> None:
        lines = self.store.read_lines(self.sid, 0)
        assert [line["cursor"] for line in lines] == list(range(1, len(lines) + 1))
        assert [(line["delta"], line["epoch"]) for line in lines] == self.lines

    @invariant()
    def at_most_one_live_holder(self) -> None:
        state = self.store.state(self.sid)
        assert state.epoch == self.epoch
        assert state.lease_holder == (self.holder if self.live() else None)


@pytest.mark.redis
@pytest.mark.slow
def test_only_the_head_of_the_epoch_chain_writes(redis_url: str, key_prefix: str) -> None:
    class Machine(LeaseMachine):
        url = redis_url
        prefix = key_prefix

    run_state_machine_as_test(
        Machine,
        settings=settings(max_examples=300, stateful_step_count=50, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]),
    )
