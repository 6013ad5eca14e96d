"""A backlog met by one worker (issue 35): wakes per turn, the broker queue's peak, the drain.

1,000 sessions are accepted (one prompt each) while no worker runs; then ONE Celery worker
process starts (`-c 20`, the deployment's defaults, `FX_SWEEP_S` 5 s) and runs them, every
model reply taking 2 s. Figures:

- wakes: every `fxworker.wake` task the worker received: its `fx_wakes_total` summed over
  outcomes (Prometheus, `FX_METRICS_PORT`), plus whatever is still in the broker at the
  end (the queue list and kombu's unacked hash; both empty once idle). Issue 35's target:
  at most 1,100 for 1,000 turns. The worker log's "received" lines are counted beside it;
- the broker queue's peak: LLEN of kombu's list `<prefix>:celery:fx.default`, sampled
  every 0.25 s (it starts at the client's 1,000 wakes; a sweeper that re-wakes waiting
  sessions grows it past that);
- the drain: from the last `turn_end` stored (meta `last_turn` set, which append.lua does
  in the call that stores the end; sampled every 0.25 s) to the worker going idle
  (the last change of its wake count, with the queue and unacked hash empty and nothing
  new for `--quiet-s`);
- wall time: from starting the worker to idle (the turns alone need
  sessions × turn / concurrency = 100 s).

Each side runs on its own `redis-server` (tests/support/redis_server.py), the scripted
model server (bench/_model.py, prompt ``slow:<turn ms>``) and one worker of agent
`default` (tests.durable.agents). The client (bench/_backlog_accept.py) and the worker run
the tree being measured: this one, and with ``--baseline-ref REF`` the same measurement of
that commit, checked out with ``git worktree add`` into /tmp (removed afterwards) and run
from there with this venv's python (``PYTHONPATH`` the worktree; both sides with
``FXENGINE_NO_EXTENSIONS=1``, so neither needs a build). A module the worktree lacks is
still found in this tree through the venv's editable install; an older commit imports none.
With ``--repeat N`` the sides alternate (AB, BA, ...) and the table quotes medians. The
worker logs at INFO (``--log-level``), so the sweeper's "woke N" lines count its share of
the wakes; ``--keep-logs DIR`` keeps each worker's log.

Run: ``.venv/bin/python bench/backlog.py [--sessions 1000] [--concurrency 20]
[--turn-ms 2000] [--sweep-s 5] [--baseline-ref 75c4587] [--repeat 1] [--json PATH]``
(about 2 min a side at the defaults). Writes bench/results/backlog.json unless told
another path.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._harness import ROOT, ModelProcess, Row, add_json_arg, print_rows, write_json  # noqa: E402
from fxworker.keys import queue_name  # noqa: E402
from tests.support.redis_server import RedisServer, free_port  # noqa: E402
from tests.support.workers import CeleryWorker, wait_until  # noqa: E402

AGENT = "default"
SAMPLE_S = 0.25
WAKES_LINE = re.compile(rb'^fx_wakes_total\{outcome="([^"]+)"\} ([0-9.e+]+)$', re.M)
RECEIVED = re.compile(rb"Task fxworker\.wake\[[^\]]+\] received")
SWEPT = re.compile(rb"sweeper woke (\d+) ready session")  # fxworker/sweeper.py, at INFO
TARGET_PER_TURN = 1.1  # issue 35: at most 1,100 wakes for 1,000 turns


@dataclass
class Side:
    """One measured run: the figures of one tree."""

    tree: str
    wakes: int = 0
    received_logged: int = 0
    sweeper_wakes_logged: int = 0  # the sweeper's "woke N" lines (the worker logs at INFO)
    outcomes: dict[str, int] = field(default_factory=dict)
    left_in_broker: int = 0
    queue_peak: int = 0
    queue_peak_after_start: int = 0
    unacked_peak: int = 0
    turns_done: int = 0
    model_requests: int = 0
    accept_s: float = 0.0
    ready_s: float = 0.0  # worker start -> ready mark
    first_turn_end_s: float = 0.0  # from worker start
    last_turn_end_s: float = 0.0
    idle_s: float = 0.0
    drain_s: float = 0.0  # last turn_end -> idle
    wall_s: float = 0.0  # worker start -> idle
    timed_out: bool = False
    queue_samples: list[tuple[float, int, int]] = field(default_factory=list)  # (s from start, LLEN, unacked)


class TreeWorker(CeleryWorker):
    """A Celery worker run from `root` (this tree or a worktree): its cwd and PYTHONPATH."""

    def __init__(self, root: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.root = root

    def environment(self) -> dict[str, str]:
        env = super().environment()
        env["PYTHONPATH"] = str(self.root)
        return env

    def start(self, *, wait: bool = True, timeout_s: float = 60.0) -> TreeWorker:
        cmd = [
            sys.executable, "-m", "celery", "-A", "fxworker.celery_app", "worker",
            "-P", "threads", "-c", str(self.concurrency), "-Q", queue_name(AGENT),
            "-n", self.hostname, "-l", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, env=self.environment(), cwd=self.root, stdout=log,
                                         stderr=subprocess.STDOUT)
        if wait:
            self.wait_ready(timeout_s)
        return self


def tree_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FX_")}
    env.update(PYTHONPATH=str(root), FXENGINE_NO_EXTENSIONS="1", PYTHONUNBUFFERED="1")
    return env


def accept(root: Path, url: str, prefix: str, sessions: int, prompt: str) -> dict[str, Any]:
    """Accepts `sessions` prompts with `root`'s fxworker (bench/_backlog_accept.py)."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "_backlog_accept.py"), url, prefix, str(sessions), prompt],
        cwd=root, env=tree_env(root), capture_output=True, text=True, timeout=600,
    )
    if out.returncode != 0:
        raise RuntimeError(f"accepting with {root} failed: {out.stderr[-3000:]}")
    accepted: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return accepted


def scrape_wakes(port: int) -> dict[str, int] | None:
    """The worker's `fx_wakes_total` by outcome, or None when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            body = r.read()
    except OSError:
        return None
    return {m.group(1).decode(): int(float(m.group(2))) for m in WAKES_LINE.finditer(body)}


def run_side(tree: str, root: Path, args: argparse.Namespace) -> Side:
    side = Side(tree)
    server = RedisServer()
    server.start()
    model = ModelProcess()
    worker: TreeWorker | None = None
    prefix = f"fxbench{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(server.url)
    queue_key = f"{prefix}:celery:{queue_name(AGENT)}"
    unacked_key = f"{prefix}:celery:unacked"
    try:
        got = accept(root, server.url, prefix, args.sessions, f"slow:{args.turn_ms}")
        side.accept_s = got["accept_s"]
        remaining = list(got["sessions"])
        side.queue_peak = int(client.llen(queue_key))
        if side.queue_peak != args.sessions:
            raise RuntimeError(f"{queue_key} holds {side.queue_peak} wakes after accepting {args.sessions}")
        metrics_port = free_port()
        worker = TreeWorker(
            root, redis_url=server.url, prefix=prefix, queues=(AGENT,), agents=(AGENT,),
            concurrency=args.concurrency,
            env={"FX_AGENTS": "tests.durable.agents", "FX_TEST_MODEL_URL": model.base_url,
                 "FX_LOG_LEVEL": args.log_level, "FX_METRICS_PORT": str(metrics_port),
                 # The defaults a deployment runs with (the test workers' are shorter).
                 "FX_LEASE_S": "15", "FX_SWEEP_S": str(args.sweep_s), "FX_RESERVE_S": "30",
                 "FX_DELIVERY_TIMEOUT_S": "300", "FXENGINE_NO_EXTENSIONS": "1"},
        )
        started = time.monotonic()
        worker.start(timeout_s=60)
        side.ready_s = time.monotonic() - started
        sample(side, client, worker, metrics_port, remaining, queue_key, unacked_key, started, args)
        log = worker.log_path.read_bytes()
        side.received_logged = len(RECEIVED.findall(log))
        side.sweeper_wakes_logged = sum(int(n) for n in SWEPT.findall(log))
        if args.keep_logs:
            Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
            (Path(args.keep_logs) / f"backlog-{prefix}-{tree.replace(' ', '_')}.log").write_bytes(log)
    except BaseException:
        if worker is not None:
            print(worker.log_tail(), file=sys.stderr)
        raise
    finally:
        client.close()
        if worker is not None:
            worker.close()
        served = model.served() if model.proc.poll() is None else []
        model.close()
        server.close()
    side.model_requests = len(served)
    return side


def sample(side: Side, client: redis.Redis, worker: TreeWorker, metrics_port: int, remaining: list[str],
           queue_key: str, unacked_key: str, started: float, args: argparse.Namespace) -> None:
    """Samples the broker, the worker's wake count and the sessions' ends every 0.25 s until
    every turn ended and nothing moved for `args.quiet_s`."""
    deadline = started + args.timeout_s
    last_total, last_change = -1, time.monotonic()
    outcomes: dict[str, int] = {}
    while True:
        now = time.monotonic()
        pipe = client.pipeline(transaction=False)
        pipe.llen(queue_key)
        pipe.hlen(unacked_key)
        for sid in remaining:
            # append.lua sets `last_turn` in the call that stores the end (`turns` counts starts).
            pipe.hget(f"{worker.prefix}:{{{sid}}}:meta", "last_turn")
        queued, unacked, *last = pipe.execute()
        ended = [sid for sid, turn in zip(remaining, last) if turn]
        if ended:
            if not side.turns_done:
                side.first_turn_end_s = now - started
            side.last_turn_end_s = now - started
            side.turns_done += len(ended)
            done = set(ended)
            remaining[:] = [sid for sid in remaining if sid not in done]
        outcomes = scrape_wakes(metrics_port) or outcomes
        total = sum(outcomes.values())
        side.queue_samples.append((round(now - started, 2), queued, unacked))
        side.queue_peak = max(side.queue_peak, queued)
        side.queue_peak_after_start = max(side.queue_peak_after_start, queued)
        side.unacked_peak = max(side.unacked_peak, unacked)
        if total != last_total or queued or unacked:
            last_total, last_change = total, now
        if not remaining and now - last_change >= args.quiet_s:
            break
        if now > deadline:
            side.timed_out = True
            break
        if worker.proc is not None and worker.proc.poll() is not None:
            raise RuntimeError(f"the worker exited ({worker.proc.returncode})")
        time.sleep(max(0.0, SAMPLE_S - (time.monotonic() - now)))
    side.outcomes = outcomes
    side.left_in_broker = int(client.llen(queue_key)) + int(client.hlen(unacked_key))
    side.wakes = sum(outcomes.values()) + side.left_in_broker
    side.idle_s = last_change - started
    side.wall_s = side.idle_s
    side.drain_s = max(0.0, side.idle_s - side.last_turn_end_s) if side.turns_done else float("nan")


# ----------------------------------------------------------------------------- the baseline tree


def add_worktree(ref: str) -> Path:
    path = Path(f"/tmp/fx-base-{os.getpid()}")
    subprocess.run(["git", "worktree", "add", "--detach", str(path), ref], cwd=ROOT, check=True,
                   capture_output=True, text=True)
    return path


def remove_worktree(path: Path) -> None:
    subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, capture_output=True, text=True)


def tree_state() -> dict[str, str]:
    """This tree's HEAD and a digest of its uncommitted changes to the packages (the code
    measured as "this tree" may be ahead of HEAD)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    diff = subprocess.run(["git", "diff", "HEAD", "--", "fxworker", "fxengine"], cwd=ROOT, capture_output=True)
    return {"head": head.stdout.strip(), "uncommitted_sha1": hashlib.sha1(diff.stdout).hexdigest()[:12] if diff.stdout
            else ""}


def short_commit(ref: str, cwd: Path) -> str:
    out = subprocess.run(["git", "rev-parse", "--short", ref], cwd=cwd, capture_output=True, text=True)
    return out.stdout.strip() or ref


# ----------------------------------------------------------------------------- the report


FIGURES = (
    # (attribute, figure, unit)
    ("wakes", "wakes for the turns", "wakes"),
    ("queue_peak", "broker queue peak", "msgs"),
    ("drain_s", "worker busy after the last turn", "s"),
    ("wall_s", "worker start to idle", "s"),
)


def median(sides: list[Side], attr: str) -> float:
    return statistics.median(float(getattr(s, attr)) for s in sides)


def rows_of(new: list[Side], base: list[Side], base_name: str, sessions: int) -> list[Row]:
    rows = []
    for attr, figure, unit in FIGURES:
        value = median(new, attr)
        row = Row("backlog", f"{figure} ({sessions} sessions)", value, unit)
        if base:
            row.baseline = base_name
            row.baseline_value = median(base, attr)
            row.baseline_unit = unit
            row.ratio = value / row.baseline_value if row.baseline_value else None
        if attr == "wakes":
            limit = TARGET_PER_TURN * sessions
            row.target = f"<= {limit:,.0f} wakes"
            row.met = value <= limit
            row.note = f"outcomes {new[-1].outcomes}; {new[-1].model_requests} model requests"
        elif attr == "drain_s":
            row.note = f"sampled every {SAMPLE_S} s"
        rows.append(row)
    return rows


def print_table(new: list[Side], base: list[Side], base_name: str) -> None:
    cols = [("this tree", new)] + ([(base_name, base)] if base else [])
    head = f"  {'':<34}" + "".join(f"{name:>14}" for name, _ in cols) + ("  new/base" if base else "")
    print(head)
    extra = (("turns_done", "turns ended", ""), ("model_requests", "model requests", ""),
             ("received_logged", "wakes received (log)", ""), ("sweeper_wakes_logged", "sent by the sweeper (log)", ""),
             ("queue_peak_after_start", "queue peak, worker up", ""),
             ("last_turn_end_s", "last turn_end (from start)", "s"), ("ready_s", "worker start to ready", "s"))
    for attr, figure, unit in (*FIGURES, *extra):
        values = [median(sides, attr) for _, sides in cols]
        text = "".join(f"{v:>12.1f}{unit:>2}" if unit == "s" else f"{v:>14,.0f}" for v in values)
        ratio = f"  {values[0] / values[1]:.2f}x" if base and values[1] else ""
        print(f"  {figure:<34}{text}{ratio}")
    for name, sides in cols:
        print(f"  {name}: outcomes {[s.outcomes for s in sides]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--turn-ms", type=int, default=2000)
    parser.add_argument("--sweep-s", type=float, default=5.0, help="the worker's FX_SWEEP_S (default 5)")
    parser.add_argument("--quiet-s", type=float, default=2.0, help="idle: no wake and an empty queue this long")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="give up on a side after this long")
    parser.add_argument("--baseline-ref", help="also measure this commit (a git worktree in /tmp)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per side, alternating sides; medians quoted")
    parser.add_argument("--log-level", default="INFO", help="the worker's FX_LOG_LEVEL (INFO: its sweeps are counted)")
    parser.add_argument("--keep-logs", metavar="DIR", help="keep each worker's log in DIR")
    add_json_arg(parser)
    parser.set_defaults(json=str(ROOT / "bench" / "results" / "backlog.json"))
    args = parser.parse_args()
    state = tree_state()

    worktree = add_worktree(args.baseline_ref) if args.baseline_ref else None
    base_name = short_commit(args.baseline_ref, ROOT) if args.baseline_ref else ""
    new: list[Side] = []
    base: list[Side] = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the worktree and parts are cleaned up
    try:
        for i in range(args.repeat):
            order = [("this tree", ROOT, new)] + ([(base_name, worktree, base)] if worktree else [])
            for name, root, into in order if i % 2 == 0 else reversed(order):
                print(f"run {i + 1}/{args.repeat}: {name}: {args.sessions} sessions, -c {args.concurrency}, "
                      f"{args.turn_ms} ms turns, FX_SWEEP_S {args.sweep_s:g}", flush=True)
                side = run_side(name, root, args)
                into.append(side)
                print(f"  wakes {side.wakes:,} (log {side.received_logged:,}), queue peak {side.queue_peak:,}, "
                      f"drain {side.drain_s:.1f} s, wall {side.wall_s:.1f} s, turns {side.turns_done}"
                      f"{', TIMED OUT' if side.timed_out else ''}; outcomes {side.outcomes}", flush=True)
    finally:
        if worktree is not None:
            remove_worktree(worktree)

    print()
    print_table(new, base, base_name)
    rows = rows_of(new, base, base_name, args.sessions)
    print()
    print_rows(rows)
    settings = {k: v for k, v in vars(args).items() if k != "json"}
    write_json(args.json, "backlog", rows, {
        "settings": settings, "tree": state, "baseline": base_name or None,
        "new": [asdict(s) for s in new], "base": [asdict(s) for s in base],
    })


if __name__ == "__main__":
    main()
