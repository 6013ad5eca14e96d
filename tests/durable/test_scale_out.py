"""Scale-out by configuration, proven under a primary failover (§5, §7, §11).

`fx web` and two `fx worker` processes, configured only by environment variables, run on a
distributed store — a 3-primary + 3-replica Redis Cluster, or a primary + replica watched
by three sentinels — with a standalone Redis as the Celery broker and `FX_ACK=replica`.
A client creates 200 sessions over HTTP, each prompt calling the non-idempotent `send`
tool once; mid-load the primary holding the first session is killed -9 (and restarted once
a replica has taken over, as a process manager would: it rejoins as a replica). Checked:
every acknowledged prompt ends, no effect runs twice, and no session waits longer than
lease + failover + sweep (plus the turn itself under this load). The failover counts until
the shard takes replica-acknowledged writes again: the new primary has a replica online.

The flap: once the restarted node is a replica, a second failover is forced back to it
(`SENTINEL FAILOVER`, `CLUSTER FAILOVER FORCE`) while the load runs, and the sentinels call
a primary down after 1 s (under this load they may fail over on their own too). Two
faults it found, both fixed: a claim only the primary held was lost with it and the
promoted node gave the same epoch to the next claimer (claims now wait for the ack level);
and the takeovers after each outage were counted as deaths of the turn, so a flapping
store ended healthy turns as poison (a holder silent since an outage the claimer met is
not counted dead).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from fxengine.testing import Reply, text, tool_call
from tests.durable.conftest import first_user_text
from tests.support.redis_server import RedisServer, free_port
from tests.support.redis_topology import RedisClusterProcesses, SentinelGroup, replica_online
from tests.support.workers import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.redis, pytest.mark.celery, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = 200
IN_FLIGHT = 40  # prompts the client has open at once
KILL_AFTER = 60  # acknowledged prompts before the kill
LEASE_S, SWEEP_S = 3.0, 1.0
TURN_SLACK_S = 15.0  # a turn's own time on two loaded cores, and the client's retries
POLL_S = 150.0  # how long the client waits for every turn end, well inside the test's timeout


class Topology:
    """The store under test: its URL for the processes, the kill of the primary holding a
    session (returns the failover's seconds), and the restart of the killed node."""

    def __init__(self, kind: str, *, flap: bool) -> None:
        self.kind = kind
        self.cluster = RedisClusterProcesses(primaries=3, replicas=1) if kind == "cluster" else None
        # 5 s before the sentinels call a primary down, so that one kill is one failover.
        # With 1 s (the flap), a primary busy with the restarted node's full sync on two
        # loaded cores may be called down again, with writes its replica has not yet had.
        down_after_ms = 1000 if flap else 5000
        self.sentinels = SentinelGroup(down_after_ms=down_after_ms) if kind == "sentinel" else None
        self.killed: RedisServer | None = None

    @property
    def url(self) -> str:
        return self.cluster.seed_url if self.cluster else self.sentinels.url  # type: ignore[union-attr]

    def worker_url(self, i: int) -> str:
        # One worker names a cluster by a node's plain URL: the store asks the server.
        return self.cluster.url if self.cluster and i == 1 else self.url

    def kill_primary_of(self, prefix: str, session_id: str) -> float:
        if self.cluster:
            self.killed = self.cluster.primary_of(f"{prefix}:{{{session_id}}}:meta")
            return self.cluster.kill(self.killed)
        assert self.sentinels is not None
        self.killed = self.sentinels.primary()
        started = time.monotonic()
        self.killed.stop(kill=True)
        self.sentinels.wait_new_primary(self.killed.port)
        return time.monotonic() - started

    def restart_killed(self) -> None:
        """Starts the killed node again and waits until it is an online replica: until
        then the promoted primary has none, and `FX_ACK=replica` refuses its writes.

        A cluster node rejoins as a replica by its own cluster config. A node under
        sentinels starts as a replica of the primary the sentinels name, as a process
        manager for a sentinel deployment does; left to start as a primary, it waits for
        the sentinels to reconfigure it (8-18 s, longer when they are starved of CPU)."""
        assert self.killed is not None
        if self.sentinels:
            self.killed.args = ("--replicaof", "127.0.0.1", str(self.sentinels.primary_port()))
        self.killed.start()
        wait_until(lambda: all(replica_online(p.port) for p in self._primaries()), 60, interval_s=0.05,
                   what="the restarted node replicating")

    def fail_back(self) -> float:
        """A second failover at once, back to the restarted node, while the primary that
        just took over is alive and serving (a flapping primary): `SENTINEL FAILOVER`, or
        `CLUSTER FAILOVER FORCE` on the restarted replica. Waits until the node serves
        again with a replica online; returns the seconds."""
        assert self.killed is not None
        started = time.monotonic()
        if self.sentinels:
            serving = self.sentinels.primary_port()
            sentinel = redis.Redis(host="127.0.0.1", port=self.sentinels.sentinels[0].port)
            try:
                sentinel.execute_command("SENTINEL", "FAILOVER", self.sentinels.master)
            finally:
                sentinel.close()
            self.sentinels.wait_new_primary(serving)
        else:
            assert self.cluster is not None
            self.cluster.promote(self.killed)
        wait_until(lambda: all(replica_online(p.port) for p in self._primaries()), 60, interval_s=0.05,
                   what="the demoted node replicating")
        return time.monotonic() - started

    def _primaries(self) -> list[RedisServer]:
        if self.cluster:
            return self.cluster.primaries()
        assert self.sentinels is not None
        return [self.sentinels.primary()]

    def logs(self, n: int = 2000) -> dict[str, str]:
        """The tail of each sentinel's log, to say why a failover stalled."""
        if not self.sentinels:
            return {}
        return {f"sentinel {s.port}": (s.dir / "sentinel.log").read_text(errors="replace")[-n:]
                for s in self.sentinels.sentinels}

    def close(self) -> None:
        (self.cluster or self.sentinels).close()  # type: ignore[union-attr]


class Process:
    """An `fx` command in a process of its own, its output in a temporary file."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.log = Path(tempfile.mkstemp(prefix="fx-scale-", suffix=".log")[1])
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "fxworker", *args], env=env, cwd=ROOT,
                                         stdout=out, stderr=subprocess.STDOUT)

    def tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.log.unlink(missing_ok=True)


@pytest.fixture(params=[False, True], ids=["failover", "flap"])
def flap(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture(params=["cluster", "sentinel"])
def topology(request: pytest.FixtureRequest, flap: bool) -> Iterator[Topology]:
    t = Topology(request.param, flap=flap)
    try:
        yield t
    finally:
        t.close()


@pytest.fixture
def broker() -> Iterator[RedisServer]:
    server = RedisServer()
    try:
        yield server
    finally:
        server.close()


def _env(store_url: str, broker_url: str, prefix: str, model_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FX_") and k != "REDIS_URL"}
    env.update(
        FX_STORE_URL=store_url, FX_BROKER_URL=broker_url, FX_ACK="replica", FX_PREFIX=prefix,
        FX_AGENTS="tests.durable.agents", FX_TEST_AGENTS="default", FX_TEST_MODEL_URL=model_url,
        FX_TEST_EFFECTS_URL=broker_url, FX_LEASE_S=str(LEASE_S), FX_SWEEP_S=str(SWEEP_S), FX_RESERVE_S="4",
        FX_DELIVERY_TIMEOUT_S="120", FX_LOG_LEVEL="INFO",
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    return env


async def _create(client: httpx.AsyncClient, i: int, acked: dict[int, tuple[str, float]],
                  gate: asyncio.Semaphore) -> None:
    """Creates session i with `send:<i>`, again with the same message id while the store is
    unavailable (503): what a client does; acknowledged once a 202 comes back."""
    message_id = f"msg_scale{i:04d}{uuid.uuid4().hex[:8]}"
    async with gate:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = await client.post("/v1/sessions", json={"input": f"send:r{i}", "agent": "default",
                                                            "messageId": message_id})
            except httpx.TransportError:
                r = None
            if r is not None and r.status_code == 202:
                acked[i] = (r.json()["sessionId"], time.monotonic())
                return
            assert r is None or r.status_code == 503, (r.status_code, r.text)
            assert time.monotonic() < deadline, f"session {i} was never acknowledged"
            await asyncio.sleep(0.2)


async def _ended_at(client: httpx.AsyncClient, session_id: str) -> dict[str, Any] | None:
    """The session's `turn_end` line, with `maybeRan: True` when a `tool_end` before it
    said the call may have partly run; None before it ends."""
    r = await client.get(f"/v1/sessions/{session_id}/stream", params={"cursor": 0, "follow": 0})
    if r.status_code != 200:
        return None
    lines = [json.loads(text) for text in r.text.splitlines()]
    for line in lines:
        if line.get("type") == "turn_end":
            maybe = any(ln.get("type") == "tool_end" and ln.get("isError") for ln in lines)
            return {**line, "maybeRan": maybe}
    return None


def responder(request: Any) -> Reply:
    """`send:<to>` calls `send` once, then answers "done" — also when the turn was resumed
    (a resumed request ends with the resume notice, not the prompt)."""
    messages = request.body.get("messages") or []
    if any(m.get("role") == "tool" for m in messages):
        return Reply(text("done"))
    prompt = first_user_text(request)
    if prompt.startswith("send:"):
        return Reply(tool_call(f"call_{uuid.uuid4().hex[:8]}", "send", {"to": prompt[5:]}))
    return Reply(text("echo:", prompt))


@pytest.mark.timeout(POLL_S + 90)
def test_two_workers_on_a_distributed_store_lose_nothing_through_a_failover(
    topology: Topology, broker: RedisServer, model: Any, flap: bool
) -> None:
    model.responder = responder
    prefix = f"fxs{uuid.uuid4().hex[:8]}"
    port = free_port()
    web = Process(["web", "--host", "127.0.0.1", "--port", str(port)],
                  _env(topology.url, broker.url, prefix, model.base_url))
    workers = [Process(["worker", "--concurrency", "50", "-n", f"w{i}@fxscale"],
                       _env(topology.worker_url(i), broker.url, prefix, model.base_url)) for i in range(2)]
    parts = [web, *workers]
    effects = redis.Redis.from_url(broker.url)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _healthy(base, parts), 60, interval_s=0.1, what="fx web healthy")
        assert httpx.get(f"{base}/healthz", timeout=5).json()["store"] == topology.kind
        wait_until(lambda: _workers_ready(parts, topology, prefix), 60, interval_s=0.1, what="both workers ready")

        acked: dict[int, tuple[str, float]] = {}
        failover: dict[str, float] = {}

        killer_error: list[BaseException] = []

        def kill_when_loaded() -> None:
            try:
                wait_until(lambda: len(acked) >= KILL_AFTER, 60, interval_s=0.02, what="load")
                first = acked[min(acked)][0]
                started = time.monotonic()
                failover["promoted_s"] = topology.kill_primary_of(prefix, first)
                topology.restart_killed()
                if flap:
                    failover["back_s"] = topology.fail_back()
                failover["s"] = time.monotonic() - started
            except BaseException as exc:
                killer_error.append(exc)

        killer = threading.Thread(target=kill_when_loaded, daemon=True)
        killer.start()

        async def drive() -> dict[int, dict[str, Any]]:
            async with httpx.AsyncClient(base_url=base, timeout=30) as client:
                gate = asyncio.Semaphore(IN_FLIGHT)
                await asyncio.gather(*[_create(client, i, acked, gate) for i in range(SESSIONS)])
                ends: dict[int, dict[str, Any]] = {}
                polls = asyncio.Semaphore(IN_FLIGHT)

                async def look(i: int, sid: str) -> None:
                    async with polls:
                        try:
                            end = await _ended_at(client, sid)
                        except httpx.TransportError:
                            end = None
                    if end is not None:
                        ends[i] = {**end, "seen_s": time.monotonic()}

                deadline = time.monotonic() + POLL_S
                while len(ends) < len(acked) and time.monotonic() < deadline and not killer_error:
                    await asyncio.gather(*[look(i, sid) for i, (sid, _) in acked.items() if i not in ends])
                    await asyncio.sleep(0.1)
                return ends

        ends = asyncio.run(drive())
        killer.join(60)
        assert not killer_error, (f"the failover did not complete: {killer_error[0]!r}", topology.logs())
        assert "s" in failover, "the primary was never killed"
        assert len(acked) == SESSIONS
        missing = sorted(set(acked) - set(ends))
        assert not missing, (f"{len(missing)} acknowledged sessions never ended: {missing[:10]}",
                             [p.tail(3000) for p in workers], topology.logs())
        assert Counter(e["stopReason"] for e in ends.values()) == Counter({"end_turn": SESSIONS})

        sent = [entry.decode().split("|")[2] for entry in effects.lrange(f"{prefix}:test:sent", 0, -1)]
        twice = {to: n for to, n in Counter(sent).items() if n > 1}
        assert not twice, f"effects ran twice: {twice}"
        # A call whose outcome the store could not record (its intent stored, the write
        # after it unacknowledged while the shard had no replica) is answered "may have
        # partly run", never run again; no other call goes without its effect.
        silent = [i for i in acked if f"r{i}" not in sent and not ends[i]["maybeRan"]]
        assert not silent, f"sessions whose effect neither ran nor was reported as maybe run: {silent[:10]}"
        maybe_ran = sum(1 for e in ends.values() if e["maybeRan"])

        waits = sorted(ends[i]["seen_s"] - acked[i][1] for i in acked)
        bound = LEASE_S + failover["s"] + SWEEP_S + TURN_SLACK_S
        back = f", failed back in {failover['back_s']:.1f} s" if flap else ""
        print(f"{topology.kind}: failover {failover['s']:.1f} s (promoted in {failover['promoted_s']:.1f} s{back}); wait for a turn end p50 {waits[len(waits) // 2]:.2f} s, "
              f"max {waits[-1]:.2f} s (bound {bound:.1f} s); effects {len(sent)}, answered 'may have partly run' "
              f"{maybe_ran}")
        assert waits[-1] <= bound, f"a session waited {waits[-1]:.1f} s, over {bound:.1f} s"
        for part in parts:
            assert part.alive(), part.tail()
    finally:
        effects.close()
        for part in parts:
            part.close()


def _healthy(base: str, parts: list[Process]) -> bool:
    for part in parts:
        assert part.alive(), part.tail()
    try:
        return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _workers_ready(parts: list[Process], topology: Topology, prefix: str) -> bool:
    for part in parts:
        assert part.alive(), part.tail()
    from fxworker.store import store_clients

    client = store_clients(topology.url, max_connections=1)[1]()
    try:
        return all(client.get(f"{prefix}:workers:w{i}@fxscale") for i in range(2))
    finally:
        client.close()
