"""Tools and provider of the fault workers (`tests.chaos.agents`), and the Redis keys the
tests read their records from (importing this creates no agent).

Every model request of a fault worker carries the header `x-fx-pid` (this worker's pid),
so a test knows which process to kill, stop or signal. Its tools record each start in Redis, so a test counts real executions:

- `probe` (idempotent): `{name}`; pushes `<execution_id>|<epoch>|<pid>` to
  `<FX_PREFIX>:fault:starts:<name>`; a name starting with `hold` then waits until the key
  `<FX_PREFIX>:fault:release:<name>` exists (or the turn aborts); answers `probed:<name>`.
- `effect` (not idempotent): the same, but an effect: each start is one execution the
  tests require to happen at most once; after its release it pushes to `...:fault:done:<name>`.
- `slow` (idempotent): sleeps `seconds` (aborts with the turn); answers `slept`.
- `refund` (not idempotent, `approval=True`): a call of it parks its turn until a person
  approves or denies it (`tests.chaos.approvals`); once approved it starts as `effect` does
  (a start record, tool `refund`) and answers `refunded <amount>`. The checker requires each
  call to start at most once, and never unless its approval was accepted.

- `delegate` (the agent `default` only, `delegate_tool`): a call's `input` is the prompt of a
  turn of the agent `default` in a child session of its own (`fxworker.delegation`), whose
  final text answers the call. The child's tools record their starts as above (the records
  name the child session in their execution id).

`TypedAnswer` is the answer type of the agent `typed` (`TYPED_AGENT`, `output_type=`, with
`TYPED_RETRIES` refused answers sent back): every turn of that agent answers with one,
through the final-result tool (the scripted model's catalog entry does not say it takes a
response format). Module-level, so the web process and the workers import it by name.

`probe` and `effect` take an optional `ms`: how long they run after their start (the
window a fault can hit). Each start of either also pushes one JSON object to
`<FX_PREFIX>:fault:runs` (`runs_key`) for the chaos checker (`tests/chaos/checker.py`):
`{"x": execution id, "tool", "epoch", "pid", "token": a fresh id of this start, "intent":
whether the session's stored journal held the call's id when it started}` (a start on a
worker that lost its lease may come after the session went to rest: its log is then in
`rest`). The token tells
a start that ran twice from one push a client library resent.

These records live on `REDIS_URL`; the journal a start looks its intent up in lives in the
store, which `FX_STORE_URL` names when it is another (the chaos run on a Redis Cluster:
`REDIS_URL` is then its broker, a standalone server that survives the store's failovers).
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from typing import Any

import redis as redis_sync
import redis.asyncio as aioredis
from pydantic import BaseModel

from fxengine.tools import Tool
from fxworker import delegate_tool
from fxworker.delegation import DelegateTool

DELEGATE_TOOL = "delegate"
DELEGATE_AGENT = "default"
TYPED_AGENT = "typed"
TYPED_RETRIES = 1
PREFIX = os.environ.get("FX_PREFIX", "fx")
REDIS_URL = os.environ.get("REDIS_URL", "")
MODEL_URL = os.environ.get("FX_TEST_MODEL_URL", "http://127.0.0.1:9/v1")
POLL_S = 0.02

_client: aioredis.Redis | None = None
_events_client: redis_sync.Redis | None = None


class TypedAnswer(BaseModel):
    """The answer of a turn of the agent `typed`: the tag of the prompt (or steer) it answers,
    and the number the scripted model gave this answer (each valid answer its own)."""

    tag: str
    n: int


def starts_key(name: str, prefix: str = PREFIX) -> str:
    return f"{prefix}:fault:starts:{name}"


def done_key(name: str, prefix: str = PREFIX) -> str:
    return f"{prefix}:fault:done:{name}"


def release_key(name: str, prefix: str = PREFIX) -> str:
    return f"{prefix}:fault:release:{name}"


def runs_key(prefix: str = PREFIX) -> str:
    """Every start of `probe`, `effect` and `refund`, one JSON object per list entry (see the module doc)."""
    return f"{prefix}:fault:runs"


def events_key(prefix: str = PREFIX) -> str:
    """The fault workers' `on_event` diagnostics, one JSON object per list entry."""
    return f"{prefix}:fault:events"


def record_event(event: dict[str, Any]) -> None:
    """`on_event` of the fault workers' agent: appends the event to `events_key()`."""
    global _events_client
    if _events_client is None:
        _events_client = redis_sync.Redis.from_url(REDIS_URL)
    _events_client.rpush(events_key(), json.dumps(event, default=str))


def _redis() -> aioredis.Redis:
    # Tools run on the worker's one process loop, so one asyncio client serves them all.
    global _client
    if _client is None:
        _client = aioredis.Redis.from_url(REDIS_URL)
    return _client


async def _held(name: str, ctx: Any) -> bool:
    """Waits for the release of `name`; False when the turn aborted first."""
    r = _redis()
    while not await r.exists(release_key(name)):
        if ctx.signal.aborted:
            return False
        await asyncio.sleep(POLL_S)
    return True


def _journal_store() -> Any:
    """The store of the tools' sessions: this worker's own (`FX_STORE_URL`, else `REDIS_URL`)."""
    from fxworker.settings import Settings
    from fxworker.store import default_store

    return default_store(Settings.from_env())


async def _intent_stored(execution_id: str, store: Any = None) -> bool:
    """True when the session's journal holds the call's id: its intent. `store.load()`
    reads the checkpoint and the log (at rest, `rest`) in one atomic read (load.lua): read
    apart, a release moving the log into `rest` between two reads could hide it."""
    session_id, call_id = execution_id.split(":", 1)[0], execution_id.rsplit(":", 1)[-1].encode()
    loaded = await (store or _journal_store()).load(session_id)
    checkpoint = loaded.checkpoint.data if loaded.checkpoint is not None else b""
    return call_id in checkpoint or any(call_id in record.data for record in loaded.journal)


async def _start(name: str, ctx: Any, tool: str) -> None:
    run = {"x": ctx.execution_id, "tool": tool, "name": name, "epoch": ctx.epoch, "pid": os.getpid(),
           "token": uuid.uuid4().hex, "intent": await _intent_stored(ctx.execution_id)}
    # Both records or neither: at the memory limit Redis refuses the whole MULTI, the tool
    # raises and does nothing, so a start is never done without the checker seeing it.
    async with _redis().pipeline(transaction=True) as pipe:
        pipe.rpush(starts_key(name), f"{ctx.execution_id}|{ctx.epoch}|{os.getpid()}")
        pipe.rpush(runs_key(), json.dumps(run))
        await pipe.execute()


async def _run_for(input: dict[str, Any], ctx: Any) -> bool:
    """Waits the call's `ms`; False when the turn aborted first."""
    seconds = float(input.get("ms", 0)) / 1000.0
    if seconds <= 0:
        return True
    try:
        await asyncio.wait_for(ctx.signal.wait(), timeout=seconds)
    except asyncio.TimeoutError:
        return True
    return False


async def _probe(input: dict[str, Any], ctx: Any) -> str:
    name = str(input.get("name", ""))
    await _start(name, ctx, "probe")
    if name.startswith("hold") and not await _held(name, ctx):
        return "aborted"
    if not await _run_for(input, ctx):
        return "aborted"
    return f"probed:{name}"


async def _effect(input: dict[str, Any], ctx: Any) -> str:
    name = str(input.get("name", ""))
    await _start(name, ctx, "effect")
    if name.startswith("hold") and not await _held(name, ctx):
        return "aborted"
    if not await _run_for(input, ctx):
        return "aborted"
    await _redis().rpush(done_key(name), f"{ctx.execution_id}|{ctx.epoch}|{os.getpid()}")
    return f"effected:{name}"


async def _slow(input: dict[str, Any], ctx: Any) -> str:
    try:
        await asyncio.wait_for(ctx.signal.wait(), timeout=float(input.get("seconds", 1)))
    except asyncio.TimeoutError:
        return "slept"
    return "aborted"


async def _refund(input: dict[str, Any], ctx: Any) -> str:
    await _start(str(input.get("name", "")), ctx, "refund")
    return f"refunded {input.get('amount', 0)}"


# A planted fault the chaos checker must catch (tests/chaos/run.py --plant duplicate-effects):
# with FX_TEST_DUPLICATE_EFFECTS=1 in a worker, each call of `effect` starts twice.
DUPLICATE_EFFECTS = os.environ.get("FX_TEST_DUPLICATE_EFFECTS") == "1"


async def _effect_twice(input: dict[str, Any], ctx: Any) -> str:
    await _effect(input, ctx)
    return await _effect(input, ctx)


def tools() -> list[Tool]:
    named = {"type": "object", "properties": {"name": {"type": "string"}, "ms": {"type": "number"}}}
    timed = {"type": "object", "properties": {"seconds": {"type": "number"}}}
    effect = _effect_twice if DUPLICATE_EFFECTS else _effect
    return [
        Tool("probe", "Probes something (idempotent).", named, idempotent=True, execute=_probe),
        Tool("effect", "Has an effect (not idempotent).", named, idempotent=False, execute=effect),
        Tool("slow", "Takes a while (idempotent).", timed, idempotent=True, execute=_slow),
        Tool("refund", "Refunds an order (a person approves it first; not idempotent).",
             {"type": "object", "properties": {"name": {"type": "string"}, "amount": {"type": "integer"}}},
             idempotent=False, execute=_refund, approval=True),
    ]


def delegate() -> DelegateTool:
    """The delegating tool of the agent `default`: each call a turn of `default` itself, in
    a child session of its own."""
    return delegate_tool(DELEGATE_AGENT, name=DELEGATE_TOOL,
                         description="Hands a task to another agent; answers with its final text.")


def provider(model_url: str = MODEL_URL) -> dict[str, Any]:
    return {
        "name": "scripted",
        "base_url": model_url,
        "headers": {"x-fx-pid": str(os.getpid())},
        "models": {"scripted": {"context_window": 100_000, "max_output_tokens": 4096, "supports_tools": True}},
    }

