"""What the session model test (`test_session_model.py`) drives the embedded mode with.

- `responder`: the scripted model, driven by the prompt text;
- `tools(effects)`: an idempotent tool that takes a while, a tool that is not
  idempotent, whose every execution is counted by its execution id in `effects`, `refund`
  (not idempotent, waits for approval: each execution counted in `effects.refunds`) and
  `pick_file` (external: a client submits its result; its body never runs, and would be
  counted in `effects.external` if it did);
- `WakeTracker`: counts, per session, the wakes handed to a worker loop and not yet
  finished (the embedded mode's `handle_wake`, wrapped);
- `ProcessRegistry`: the agent registry as another process would see it, so that one
  delivery can run as a worker process whose registry lacks the session's agent.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from fxengine.testing import Reply, delay, text, tool_call
from fxengine.tools import Tool
from tests.durable.conftest import last_message_text

# ---------------------------------------------------------------------------- model and tools


def responder(request: Any) -> Reply:
    """The scripted model, driven by the last message:

    - `send:<to>`: calls the `send` tool (not idempotent), then answers "done";
    - `nap:<s>`: calls the `nap` tool (idempotent, takes `s` seconds), then answers "done";
    - `wait:<ms>`: the reply starts after `ms` (a model request a deadline can cut off);
    - `refund:<a>[,<b>...]`: one `refund` call per amount, in one response (its turn parks
      until each call is decided), then answers "done";
    - `pick:<pattern>`: calls the external `pick_file` (its turn parks for the result);
    - anything else (a steer included): answers "echo:<text>".
    """
    role, last = last_message_text(request)
    if role == "tool":
        return Reply(text("done"))
    call_id = f"call_{uuid.uuid4().hex[:8]}"
    if last.startswith("send:"):
        return Reply(tool_call(call_id, "send", {"to": last[5:]}))
    if last.startswith("nap:"):
        return Reply(tool_call(call_id, "nap", {"seconds": float(last[4:])}))
    if last.startswith("wait:"):
        return Reply(delay(float(last[5:])), text("ok"))
    if last.startswith("refund:"):
        return Reply(*[tool_call(f"call_{uuid.uuid4().hex[:8]}", "refund", {"amount": int(a)})
                       for a in last[7:].split(",")])
    if last.startswith("pick:"):
        return Reply(tool_call(call_id, "pick_file", {"pattern": last[5:]}))
    return Reply(text("echo:", last))


def call_of(execution_id: str) -> str:
    """The call id an execution id ends with (`<session>:<turn>:<step>:<call id>`)."""
    return execution_id.rsplit(":", 1)[-1]


class Effects:
    """The executions of the tools that are not idempotent, each by its execution id ->
    how many ran: `runs` of `send`, `refunds` of `refund`, `external` of `pick_file`
    (which must stay empty)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.runs: Counter[str] = Counter()
        self.refunds: Counter[str] = Counter()
        self.external: Counter[str] = Counter()

    def record(self, execution_id: str, kind: str = "runs") -> None:
        with self._lock:
            getattr(self, kind)[execution_id] += 1

    def repeated(self) -> dict[str, int]:
        with self._lock:
            return {key: n for runs in (self.runs, self.refunds) for key, n in runs.items() if n > 1}

    def refunded(self) -> dict[str, int]:
        """Call id -> how many times `refund` ran for it."""
        with self._lock:
            out: Counter[str] = Counter()
            for execution_id, n in self.refunds.items():
                out[call_of(execution_id)] += n
            return dict(out)


def tools(effects: Effects) -> list[Tool]:
    obj = {"type": "object", "properties": {}}

    def send(input: dict[str, Any], ctx: Any) -> str:
        effects.record(ctx.execution_id)
        return f"sent to {input.get('to', '')}"

    async def nap(input: dict[str, Any], ctx: Any) -> str:
        import asyncio

        try:
            await asyncio.wait_for(ctx.signal.wait(), timeout=float(input.get("seconds", 0.1)))
        except asyncio.TimeoutError:
            return "rested"
        return "woken"

    def refund(input: dict[str, Any], ctx: Any) -> str:
        effects.record(ctx.execution_id, "refunds")
        return f"refunded {input.get('amount', 0)}"

    def pick_file(input: dict[str, Any], ctx: Any) -> str:
        effects.record(ctx.execution_id, "external")
        raise AssertionError("an external tool's body never runs")

    return [
        Tool("send", "Sends a message (an effect).", {**obj, "properties": {"to": {"type": "string"}}},
             idempotent=False, execute=send),
        Tool("nap", "Takes a while.", {**obj, "properties": {"seconds": {"type": "number"}}},
             idempotent=True, execute=nap),
        Tool("refund", "Refunds an order (a person approves it first).",
             {**obj, "properties": {"amount": {"type": "integer"}}}, idempotent=False, execute=refund, approval=True),
        Tool("pick_file", "Lets the user pick a file.", {**obj, "properties": {"pattern": {"type": "string"}}},
             idempotent=False, execute=pick_file, external=True),
    ]


# ---------------------------------------------------------------------------- wakes in flight

# The reasons of the wakes the system sends itself (the sweeper, a yield's requeue, a
# release that found more waiting, a worker without the agent handing a wake on), as
# opposed to a sender's (prompt, steer, cancel, resume).
SYSTEM_REASONS = frozenset({"sweep", "yield", "pending", "forward"})


@dataclass
class Wake:
    session_id: str
    reason: str
    loop_thread: Any  # the worker loop it was handed to
    done: bool = False


@dataclass
class WakeTracker:
    """Wakes queued on a worker loop and not yet finished, per session.

    `wrap(handle_wake)` is installed as the embedded mode's `handle_wake`: the embedded
    waker calls it when it hands a wake to a worker (queued), and the delivery's end
    finishes it. A wake on a worker loop that was killed or closed before it finished is
    gone (a lost wake) and no longer counts. When a wake is queued, `check` is asked
    whether the session's wakes in flight at that moment are allowed; what it refuses is
    kept in `violations`.
    """

    check: Callable[[Wake, list[Wake]], str | None]
    queued: list[Wake] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    sent: Counter[str] = field(default_factory=Counter)  # reason -> wakes queued
    system_sent: Counter[str] = field(default_factory=Counter)  # session id -> wakes of SYSTEM_REASONS queued
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def in_flight(self, session_id: str) -> list[Wake]:
        with self._lock:
            return [w for w in self.queued if w.session_id == session_id and _live(w)]

    def wrap(self, handle_wake: Callable[..., Awaitable[Any]]) -> Callable[..., Coroutine[Any, Any, Any]]:
        def counted(payload: dict[str, Any], **kwargs: Any) -> Coroutine[Any, Any, Any]:
            wake = Wake(str(payload.get("sessionId")), str(payload.get("reason")), kwargs.get("loop_thread"))
            with self._lock:
                self.queued = [w for w in self.queued if _live(w)]
                others = [w for w in self.queued if w.session_id == wake.session_id]
                self.queued.append(wake)
                self.sent[wake.reason] += 1
                if wake.reason in SYSTEM_REASONS:
                    self.system_sent[wake.session_id] += 1
            refused = self.check(wake, others)
            if refused:
                with self._lock:
                    self.violations.append(refused)

            async def run() -> Any:
                try:
                    return await handle_wake(payload, **kwargs)
                finally:
                    wake.done = True

            return run()

        return counted


def _live(wake: Wake) -> bool:
    loop_thread = wake.loop_thread
    if wake.done or loop_thread is None:
        return False
    return not loop_thread.killed and loop_thread.loop.is_running()


# ---------------------------------------------------------------------------- another process's registry

_process_agents: ContextVar[dict[str, Any] | None] = ContextVar("fx_model_process_agents", default=None)


class ProcessRegistry:
    """`fxworker.registry` as the process the current context stands for sees it.

    Installed in place of the `registry` module the delivery handler and the runner
    read: outside `as_process(...)` it answers what the real registry holds; inside, only
    the agents given, as a worker process started without the session's agent would.
    """

    def __init__(self, real: Any) -> None:
        self.real = real

    def get_agent(self, name: str) -> Any:
        own = _process_agents.get()
        return self.real.get_agent(name) if own is None else own.get(name)

    def agents(self) -> dict[str, Any]:
        own = _process_agents.get()
        return self.real.agents() if own is None else dict(own)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


async def as_process(agents: dict[str, Any], work: Callable[[], Awaitable[Any]]) -> Any:
    """Runs `work()` as a process whose registry holds only `agents` (tasks it starts too)."""
    token = _process_agents.set(dict(agents))
    try:
        return await work()
    finally:
        _process_agents.reset(token)
