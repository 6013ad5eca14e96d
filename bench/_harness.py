"""What the benches share: the real parts they start, the client agent, and their results.

Every bench starts its own parts, each a real process: a throwaway `redis-server`
(tests/support/redis_server.py), the scripted model server (bench/_model.py), and Celery
worker processes (tests/support/workers.py) whose agents module is bench/_agents.py.

A bench's figures go out as rows (`Row`): a figure, the baseline it is measured against
in the same run, their ratio, and the target when the issue sets one. `write_json()`
writes them, with the raw figures, to the path given by ``--json``; bench/run_all.py
collects every bench's rows into one table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fxworker.keys import queue_name  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402
from tests.support.workers import CeleryWorker  # noqa: E402


# ----------------------------------------------------------------------------- figures


def pct(values: Iterable[float], q: float) -> float:
    """The q-quantile (nearest rank) of `values`."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, int(round(q * (len(ordered) - 1)))))]


@dataclass
class Row:
    """One line of the summary table.

    `ratio` is figure / baseline unless the bench says otherwise (`ratio_note` then says
    how it reads); `target` is a text such as ``">= 0.7x"`` and `met` whether it holds.
    """

    item: str
    figure: str
    value: float
    unit: str
    baseline: str = ""
    baseline_value: float | None = None
    baseline_unit: str = ""
    ratio: float | None = None
    target: str = ""
    met: bool | None = None
    note: str = ""


def ratio_row(item: str, figure: str, value: float, unit: str, baseline: str, baseline_value: float, *,
              baseline_unit: str | None = None, invert: bool = False, target: float | None = None,
              at_most: bool = False, note: str = "") -> Row:
    """A row whose ratio is value / baseline (or baseline / value with `invert`), checked
    against `target` as ``>=`` (``<=`` with `at_most`)."""
    ratio = (baseline_value / value if invert else value / baseline_value) if value and baseline_value else None
    met = None
    text = ""
    if target is not None and ratio is not None:
        met = ratio <= target if at_most else ratio >= target
        text = f"{'<=' if at_most else '>='} {target:.2f}x"
    return Row(item, figure, value, unit, baseline, baseline_value, baseline_unit or unit, ratio, text, met, note)


def add_json_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="PATH", help="also write the figures and summary rows to PATH")


def write_json(path: str | None, name: str, rows: list[Row], data: dict[str, Any]) -> None:
    """Writes one bench's rows and raw figures (nothing without a path)."""
    if not path:
        return
    out = {"bench": name, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cores": os.cpu_count(),
           "rows": [asdict(r) for r in rows], "data": data}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=1, default=str))


def print_rows(rows: list[Row]) -> None:
    for r in rows:
        print("  " + format_row(r))


def format_row(r: Row) -> str:
    base = f"{fmt(r.baseline_value)} {r.baseline_unit}" if r.baseline_value is not None else ""
    ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
    met = "" if r.met is None else ("met" if r.met else "MISSED")
    return (f"{r.figure}: {fmt(r.value)} {r.unit} | {r.baseline} {base} | {ratio} {r.target} {met}"
            f"{'  (' + r.note + ')' if r.note else ''}")


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if v != v:  # nan
        return "nan"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


# ----------------------------------------------------------------------------- parts


class ModelProcess:
    """The scripted model server (bench/_model.py, or `script` with its arguments: a bench
    that scripts its own) in a process of its own. It prints its URL, serves until its stdin
    closes, then prints one JSON list: a row per chat request it served."""

    def __init__(self, script: list[str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, *(script or [str(BENCH / "_model.py")])], cwd=ROOT, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        self.base_url = self.proc.stdout.readline().strip()
        if not self.base_url.startswith("http"):
            raise RuntimeError("the model server did not start")

    def rows(self, timeout_s: float = 30) -> list[list[Any]]:
        """Stops the server; its rows, as it printed them."""
        out, _ = self.proc.communicate(timeout=timeout_s)
        rows: list[list[Any]] = json.loads(out.strip().splitlines()[-1])
        return rows

    def served(self) -> list[tuple[float, str, int]]:
        """Stops bench/_model.py's server; (arrival epoch ms, prompt, bytes of the messages)
        of every chat request it served."""
        return [(float(at), str(p), int(n)) for at, p, n in self.rows()]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def new_prefix() -> str:
    return f"fxbench{uuid.uuid4().hex[:8]}"


def start_worker(server: RedisServer, prefix: str, model_url: str, *, concurrency: int = 100,
                 env: dict[str, str] | None = None, queues: tuple[str, ...] = ("default",)) -> CeleryWorker:
    """One Celery worker process on `server` carrying agent `default` (bench/_agents.py),
    or the agents `queues` names (of the module `env`'s FX_AGENTS names)."""
    worker = CeleryWorker(
        redis_url=server.url, prefix=prefix, queues=queues, agents=("default",), concurrency=concurrency,
        env={"FX_AGENTS": "bench._agents", "FX_TEST_MODEL_URL": model_url, "FX_LOG_LEVEL": "WARNING",
             # The defaults a deployment runs with (the test workers' are shorter).
             "FX_LEASE_S": "15", "FX_SWEEP_S": "5", "FX_RESERVE_S": "30", "FX_DELIVERY_TIMEOUT_S": "300",
             **(env or {})},
    )
    return worker.start(timeout_s=60)


def client_agent(redis_url: str, prefix: str, model_url: str, *, lease_s: float = 15.0,
                 store_url: str | None = None) -> Any:
    """This process's agent `default`: it prompts and reads; the workers run the turns.
    `redis_url` is the broker, and the store unless `store_url` names another."""
    from fxworker import Agent, Settings
    from fxworker.celery_app import make_celery_app
    from fxworker.store import redis_store
    from fxworker.wakers import CeleryWaker
    from tests.durable.tooling import provider, tools

    settings = Settings(redis_url=redis_url, store_url=store_url, prefix=prefix, lease_s=lease_s)
    return Agent(
        "default", model="scripted", provider=provider(model_url), tools=tools(), api_key="test-key",
        store=redis_store(settings.store_url, prefix=prefix), waker=CeleryWaker(make_celery_app(settings)),
        settings=settings,
    )


class CeleryNoop:
    """Round trips of the ``fxbench.noop`` task through the client's Celery app: send, the
    worker runs it, the client sees its push (a BLPOP on the same Redis)."""

    def __init__(self, agent: Any, redis_url: str, prefix: str) -> None:
        import redis

        self.app = agent.waker.app
        self.client = redis.Redis.from_url(redis_url)
        self.key = f"{prefix}:bench:noop:{uuid.uuid4().hex[:8]}"

    def once(self) -> tuple[float, float]:
        """(round trip s, send to start s) of one no-op task."""
        t0 = time.time()
        self.app.send_task("fxbench.noop", args=[self.key], queue=queue_name("default"))
        got = self.client.blpop([self.key], timeout=10)
        t1 = time.time()
        if got is None:
            raise RuntimeError("the no-op task did not run within 10 s")
        return t1 - t0, float(got[1]) - t0

    def close(self) -> None:
        self.client.close()


SENDS = {"async": 0, "sync": 0}


def stop_parts(*, noop: Any, agent: Any, worker: Any, model: ModelProcess, server: RedisServer) -> list[Any]:
    """Stops a bench's parts (the client's first, the server last; a part never started is
    None); returns what the model server served, when it was still up."""
    if noop is not None:
        noop.close()
    if agent is not None:
        agent.close()
    worker.close()
    served = model.served() if model.proc.poll() is None else []
    model.close()
    server.close()
    return served


def count_round_trips() -> dict[str, int]:
    """Counts this process's Redis round trips from now on (socket writes: one per command,
    one per pipeline), asyncio clients apart from blocking ones; returns the live counts."""
    import redis.asyncio.connection
    import redis.connection

    sync_send = redis.connection.AbstractConnection.send_packed_command
    async_send = redis.asyncio.connection.AbstractConnection.send_packed_command
    if getattr(sync_send, "fxbench", False):
        return SENDS

    def counted_sync(self: Any, command: Any, check_health: bool = True) -> None:
        SENDS["sync"] += 1
        sync_send(self, command, check_health)

    async def counted_async(self: Any, command: Any, check_health: bool = True) -> None:
        SENDS["async"] += 1
        await async_send(self, command, check_health)

    counted_sync.fxbench = True  # type: ignore[attr-defined]
    redis.connection.AbstractConnection.send_packed_command = counted_sync  # type: ignore[method-assign]
    redis.asyncio.connection.AbstractConnection.send_packed_command = counted_async  # type: ignore[method-assign]
    return SENDS


def monitor(redis_url: str, run: Any) -> list[tuple[str, str]]:
    """(client address, command) of every Redis command sent while `run()` runs, scripts
    named by their `fxworker.scripts` name (``EVALSHA append``)."""
    import threading

    import redis

    from fxworker.scripts import SCRIPTS

    names = {s.sha: s.name for s in SCRIPTS.values()}
    seen: list[tuple[str, str]] = []
    stop = threading.Event()
    started = threading.Event()

    def watch() -> None:
        client = redis.Redis.from_url(redis_url)
        with client.monitor() as m:
            started.set()
            for event in m.listen():
                if stop.is_set():
                    return
                parts = event["command"].split(" ")
                if parts[0] == "EVALSHA" and len(parts) > 1:
                    parts[0] = f"EVALSHA {names.get(parts[1], parts[1][:8])}"
                seen.append((f"{event['client_address']}:{event['client_port']}", parts[0]))

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    started.wait(5)
    run()
    time.sleep(0.3)  # the worker's release and the monitor's last lines arrive
    stop.set()
    redis.Redis.from_url(redis_url).ping()  # one more event so the listener returns
    thread.join(5)
    return seen


def commandstats(client: Any) -> dict[str, dict[str, float]]:
    return {name.removeprefix("cmdstat_"): s for name, s in client.info("commandstats").items()}


def calls_delta(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, int]:
    out = {k: int(v["calls"]) - int(before.get(k, {}).get("calls", 0)) for k, v in after.items()}
    out.pop("info", None)
    return {k: v for k, v in out.items() if v}


def cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) a process used so far, its threads included."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
