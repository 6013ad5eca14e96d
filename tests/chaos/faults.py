"""Shared parts of the fault tests: the scripted model's responder, fault worker pools,
and the checks every fault test makes on a session's UI stream.

The responder is driven by the turn's prompt (the last user message that is not the
engine's resume notice):

- `hold:<name>`: streams "partial ", waits for `model.release(name)`, then "rest";
- `probe:<name>` / `effect:<name>`: calls that tool once, then answers "done";
- `steps:<name>`: calls `probe` (name `quick-<name>`), then holds `<name>` before any
  output of the second step, then answers "after";
- `holdcall:<name>`: streams "partial ", waits for `model.release(name)`, then calls
  `probe` (name `quick-<name>`); after its result answers "done";
- `chain:<n>:<ms>`: n probe calls in a row, each reply after `<ms>`, then "chained";
- `stuck:`: a model request that never answers in time (60 s);
- `slowtool:`: calls `slow` for 60 s, then answers "done";
- anything else: "echo:<prompt>".
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import redis

from fxengine.testing import Reply, delay, hold, text, tool_call
from tests.chaos.tooling import events_key
from tests.support.stored import stored_records
from tests.support.workers import CeleryWorker, Workers, wait_until

RESUME_NOTICE_PREFIX = "Resuming from"


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def turn_prompt(request: Any) -> tuple[str, list[dict[str, Any]]]:
    """(the turn's prompt, the messages after it) of a recorded chat request."""
    messages = request.body.get("messages") or []
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.get("role") == "user" and not _content(m).startswith(RESUME_NOTICE_PREFIX):
            return _content(m), messages[i + 1:]
    return "", []


def tool_results(request: Any) -> list[str]:
    """The tool results the model is shown after the turn's prompt."""
    return [_content(m) for m in turn_prompt(request)[1] if m.get("role") == "tool"]


def _call(name: str, args: dict[str, Any]) -> Any:
    return tool_call(f"call_{uuid.uuid4().hex[:8]}", name, args)


def responder(request: Any) -> Reply:
    prompt, _ = turn_prompt(request)
    results = tool_results(request)
    kind, _, arg = prompt.partition(":")
    if kind == "hold":
        return Reply(text("partial "), hold(arg), text("rest"))
    if kind in ("probe", "effect"):
        return Reply(text("done")) if results else Reply(_call(kind, {"name": arg}))
    if kind == "holdcall":
        return Reply(text("done")) if results else Reply(text("partial "), hold(arg),
                                                          _call("probe", {"name": f"quick-{arg}"}))
    if kind == "steps":
        return Reply(hold(arg), text("after")) if results else Reply(_call("probe", {"name": f"quick-{arg}"}))
    if kind == "chain":
        n, ms = (int(x) for x in arg.split(":"))
        if len(results) < n:
            return Reply(delay(ms), _call("probe", {"name": f"chain-{uuid.uuid4().hex[:6]}"}))
        return Reply(delay(ms), text("chained"))
    if kind == "stuck":
        return Reply(delay(60_000), text("never"))
    if kind == "slowtool":
        return Reply(text("done")) if results else Reply(_call("slow", {"seconds": 60}))
    return Reply(text("echo:", prompt))


def requests_for(model: Any, prompt: str) -> list[Any]:
    return [r for r in model.requests if turn_prompt(r)[0] == prompt]


def pid_of(request: Any) -> int:
    return int(request.headers["x-fx-pid"])


# ----------------------------------------------------------------------------- workers


def fault_env(model: Any, **extra: str) -> dict[str, str]:
    """The environment of a fault worker: our agents module, a short lease, a fast sweep."""
    env = {
        "FX_AGENTS": "tests.chaos.agents",
        "FX_TEST_MODEL_URL": model.base_url,
        "FX_LEASE_S": "2",
        "FX_SWEEP_S": "0.5",
        "FX_RESERVE_S": "4",
        "FX_DELIVERY_TIMEOUT_S": "120",
    }
    env.update(extra)
    return env


class Pool:
    """Fault workers of one test module: keeps `size` alive, finds one by pid."""

    def __init__(self, workers: Workers, env: dict[str, str], *, size: int = 2, concurrency: int = 8,
                 queues: tuple[str, ...] = ("default",)) -> None:
        self.workers = workers
        self.env = env
        self.size = size
        self.concurrency = concurrency
        self.queues = queues  # the agents whose queues (`fx.<agent>`) its workers consume

    def live(self) -> list[CeleryWorker]:
        return [w for w in self.workers.started if w.proc is not None and w.proc.poll() is None]

    def start(self) -> CeleryWorker:
        return self.workers.start(env=dict(self.env), concurrency=self.concurrency, queues=self.queues)

    def fill(self, *, spare: int = 0) -> list[CeleryWorker]:
        """Starts workers until `size + spare` are alive."""
        while len(self.live()) < self.size + spare:
            self.start()
        return self.live()

    def by_pid(self, pid: int) -> CeleryWorker:
        for w in self.workers.started:
            if w.pid == pid:
                return w
        raise LookupError(f"no worker of this pool has pid {pid}")


# ----------------------------------------------------------------------------- stream checks


def lines_of(agent: Any, session_id: str) -> list[dict[str, Any]]:
    return list(agent.blocking_session(session_id).stream(0, follow=False))


def wait_line(agent: Any, session_id: str, cond: Callable[[dict[str, Any]], bool], timeout_s: float, *,
              what: str = "", interval_s: float = 0.01) -> dict[str, Any]:
    """Polls the session's stream until a line satisfies `cond`; returns that line."""
    def find() -> dict[str, Any] | None:
        return next((ln for ln in lines_of(agent, session_id) if cond(ln)), None)

    return wait_until(find, timeout_s, interval_s=interval_s, what=what)  # type: ignore[return-value]


def text_without_retracted(lines: Iterable[dict[str, Any]]) -> str:
    """The turn's visible text as a client that honours `retract` shows it."""
    kept: list[tuple[int | None, str]] = []
    for line in lines:
        if line["type"] == "turn_resume" and line.get("retract"):
            dropped = set(line["retract"])
            kept = [(s, d) for s, d in kept if s not in dropped]
        elif line["type"] == "text_delta":
            kept.append((line.get("step"), line["delta"]))
    return "".join(d for _, d in kept)


def assert_no_stale_line(lines: list[dict[str, Any]]) -> None:
    """Every line's epoch is the head epoch when it was written: epochs never go down."""
    head = 0
    for line in lines:
        assert line["epoch"] >= head, f"stale line of epoch {line['epoch']} after epoch {head}: {line}"
        head = line["epoch"]
    cursors = [ln["cursor"] for ln in lines]
    assert cursors == sorted(set(cursors)), "cursors are not strictly increasing"


def events_of(redis_url: str, prefix: str) -> list[dict[str, Any]]:
    """The `on_event` diagnostics the fault workers recorded (`tests.chaos.tooling.record_event`)."""
    return [json.loads(v) for v in redis_list(redis_url, events_key(prefix))]


def redis_list(redis_url: str, key: str) -> list[str]:
    r = redis.Redis.from_url(redis_url)
    try:
        return [v.decode() for v in r.lrange(key, 0, -1)]
    finally:
        r.close()


def redis_set(redis_url: str, key: str) -> None:
    r = redis.Redis.from_url(redis_url)
    try:
        r.set(key, "1", ex=600)
    finally:
        r.close()


def kill_and_time_resume(worker: CeleryWorker, agent: Any, session_id: str, after_cursor: int,
                         timeout_s: float) -> tuple[float, dict[str, Any]]:
    """kill -9 `worker`; returns (seconds until the resumed turn's first line, that line)."""
    t0 = time.monotonic()
    worker.kill()
    line = wait_line(agent, session_id, lambda ln: ln["cursor"] > after_cursor and ln["type"] == "turn_resume",
                     timeout_s, what="turn_resume after the kill")
    return time.monotonic() - t0, line


def log_has_in_order(redis_url: str, prefix: str, session_id: str, *kinds: bytes) -> bool:
    """True when the session's stored journal holds records of `kinds` in this order
    (a raw peek at the log, or at rest `rest`: each record's bytes name its kind)."""
    from fxworker.keys import session_keys

    r = redis.Redis.from_url(redis_url)
    try:
        entries = stored_records(r, session_keys(prefix, session_id))
    finally:
        r.close()
    want = list(kinds)
    for _, fields in entries:
        if want and want[0] in fields.get(b"d", b""):
            want.pop(0)
    return not want
