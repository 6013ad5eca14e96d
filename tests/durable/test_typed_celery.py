"""Typed answers on real processes (docs/design.md §4 "Typed answers").

Celery worker processes (`fx worker`'s Celery app, `tests.durable.typed_agents`: agent
`invoicer`, whose answers are `tests.durable.typed_models.Invoice` objects asked for by a
`final_result` tool, and the untyped `plain`) on the test Redis. This process's agents of
the same names (the same `output_type`) store the prompts and read the answers. Model
requests carry their worker's pid (`x-fx-pid`).

Each test has a key prefix, workers and client agents of its own (`Stack`), so it can
kill a worker without another test's workers taking its wakes. The embedded-store tests
of typed answers are in tests/durable/test_typed.py.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any, cast

import pytest
import redis

from fxengine.testing import Reply, ScriptedModel, hold, text, tool_call
from tests.chaos.faults import assert_no_stale_line, lines_of, pid_of, wait_line
from tests.durable.conftest import system_text
from tests.durable.tooling import provider
from tests.durable.typed_models import Invoice, Receipt
from tests.support.redis_server import delete_prefix
from tests.support.stored import stored_records
from tests.support.workers import CeleryWorker, Workers, wait_until

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.timeout(120)]

LEASE_S = 2.0
TURN_S = 20.0  # a turn's end
TAKEOVER_S = LEASE_S + 13.0  # a dead worker's turn resumed by a new one (its start included)
# What the engine writes into a conversation (retries, a resume): never a turn's prompt.
ENGINE_TEXTS = ("Your answer did not validate", "Give your answer by calling", "Resuming from")
ERRORS_MARK = "did not validate as"


# ------------------------------------------------------------------------ the model


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def _prompt_at(request: Any) -> int:
    messages = request.body.get("messages") or []
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user" and not _content(messages[i]).startswith(ENGINE_TEXTS):
            return i
    return -1


def prompt_of(request: Any) -> str:
    """The prompt of the turn a recorded request belongs to."""
    at = _prompt_at(request)
    return _content(request.body["messages"][at]) if at >= 0 else ""


def told_errors(request: Any) -> list[str]:
    """The validation errors the model is shown in this turn (a final-result call's result)."""
    at = _prompt_at(request)
    after = request.body.get("messages", [])[at + 1:] if at >= 0 else []
    return [_content(m) for m in after if ERRORS_MARK in _content(m)]


def answer(request: Any, obj: dict[str, Any], *before: Any) -> Reply:
    """`obj` as the request asks for it (after the parts `before`): JSON text for a
    response format, else a call of `final_result`."""
    if "response_format" in request.body:
        return Reply(*before, text(json.dumps(obj)))
    return Reply(*before, tool_call(f"call_{uuid.uuid4().hex[:8]}", "final_result", obj))


class Responder:
    """Driven by the turn's prompt `<kind>:<arg>`:

    - `valid:<n>`: the invoice `{number: n, total: 42}`;
    - `fix:<n>`: `{number: n}` (no total) until the model was shown errors, then `{n, 7}`;
    - `bad:<n>`: `{number: n}`, every time;
    - `killfix:<name>`: as `fix`, except that the first request carrying the errors holds
      (`hold(name)`) before its valid answer: a test can kill its worker there;
    - `receipt:<shop>`: the receipt `{shop, items: [tea, cake]}`;
    - anything else: `echo:<prompt>`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: set[str] = set()

    def __call__(self, request: Any) -> Reply:
        assert "You are" in system_text(request)
        kind, _, arg = prompt_of(request).partition(":")
        errors = told_errors(request)
        if kind == "valid":
            return answer(request, {"number": arg, "total": 42})
        if kind == "fix":
            return answer(request, {"number": arg, "total": 7} if errors else {"number": arg})
        if kind == "bad":
            return answer(request, {"number": arg})
        if kind == "killfix":
            if not errors:
                return answer(request, {"number": arg})
            with self._lock:
                first = arg not in self._held
                self._held.add(arg)
            return answer(request, {"number": arg, "total": 7}, *([hold(arg)] if first else []))
        if kind == "receipt":
            return answer(request, {"shop": arg, "items": ["tea", "cake"]})
        return Reply(text("echo:" + prompt_of(request)))


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as m:
        m.responder = Responder()
        yield m


def asked(model: ScriptedModel, prompt: str) -> list[Any]:
    """The model requests of the turns whose prompt is `prompt`, in order."""
    return [r for r in model.requests if prompt_of(r) == prompt]


def tag() -> str:
    return uuid.uuid4().hex[:8]


# ------------------------------------------------------------------------ the stack


class Stack:
    """One test's prefix, its worker processes and this process's agents on them."""

    def __init__(self, redis_url: str, model: ScriptedModel) -> None:
        from fxworker import Agent, Settings
        from fxworker.celery_app import make_celery_app
        from fxworker.store import redis_store
        from fxworker.wakers import CeleryWaker

        self.redis_url = redis_url
        self.model = model
        self.prefix = f"fxd{uuid.uuid4().hex[:10]}"
        self.workers = Workers(redis_url=redis_url, prefix=self.prefix)
        settings = Settings(redis_url=redis_url, prefix=self.prefix, lease_s=LEASE_S, reserve_s=4.0)
        common: dict[str, Any] = dict(model="scripted", provider=provider(model.base_url), api_key="test-key",
                                      store=redis_store(redis_url, prefix=self.prefix),
                                      waker=CeleryWaker(make_celery_app(settings)), settings=settings)
        self.agents = {
            "invoicer": Agent("invoicer", instructions="You are invoicer.", output_type=Invoice, **common),
            "native": Agent("native", instructions="You are native.", output_type=Invoice, output_mode="native",
                            **common),
            "plain": Agent("plain", instructions="You are plain.", **common),
        }

    def start(self, *queues: str) -> CeleryWorker:
        """A worker consuming the queues of `queues` (agent names), ready."""
        return self.workers.start(queues=queues or ("invoicer", "native", "plain"), env={
            "FX_AGENTS": "tests.durable.typed_agents", "FX_TEST_MODEL_URL": self.model.base_url,
            "FX_LEASE_S": str(LEASE_S), "FX_SWEEP_S": "0.5", "FX_RESERVE_S": "4"})

    def journal(self, session_id: str) -> list[list[tuple[str, dict[str, Any]]]]:
        """The session's stored journal records, each as its events (kind, body)."""
        from fxengine.journal.records import decode_batch
        from fxworker.keys import session_keys

        r = redis.Redis.from_url(self.redis_url)
        try:
            records = stored_records(r, session_keys(self.prefix, session_id))
        finally:
            r.close()
        return [decode_batch(fields[b"d"]) for _, fields in records]

    def lines(self, agent: str, session_id: str) -> list[dict[str, Any]]:
        return lines_of(self.agents[agent], session_id)

    def wait_end(self, agent: str, session_id: str, timeout_s: float = TURN_S) -> dict[str, Any]:
        return wait_line(self.agents[agent], session_id, lambda ln: ln["type"] == "turn_end", timeout_s,
                         what=f"the turn_end of {agent} session {session_id}")

    def close(self) -> None:
        self.workers.close()
        for agent in self.agents.values():
            agent.close()
        delete_prefix(self.redis_url, self.prefix)


@pytest.fixture
def stack(redis_url: str, model: ScriptedModel) -> Iterator[Stack]:
    s = Stack(redis_url, model)
    try:
        yield s
    finally:
        s.close()


def of_type(lines: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [ln for ln in lines if ln["type"] == kind]


def final_results(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The `tool_end` lines of `final_result` calls (each answer has one)."""
    return [ln for ln in of_type(lines, "tool_end") if ln["name"] == "final_result"]


# ----------------------------------------------------------------------------------- tests


def test_a_valid_object_on_the_first_try_ends_the_turn_with_it(stack: Stack, model: ScriptedModel) -> None:
    worker = stack.start()
    session = stack.agents["invoicer"].blocking_session()
    prompt = f"valid:A-{tag()}"
    turn = session.prompt(prompt)
    end = stack.wait_end("invoicer", session.id)
    assert end["stopReason"] == "end_turn" and end["output"] == {"number": prompt[6:], "total": 42}, end
    result = turn.result()
    assert isinstance(result.output, Invoice) and result.output == Invoice(number=prompt[6:], total=42)
    [request] = asked(model, prompt)
    assert pid_of(request) == worker.pid
    assert [t["function"]["name"] for t in request.body["tools"]] == ["final_result"]
    lines = stack.lines("invoicer", session.id)
    assert [t["isError"] for t in final_results(lines)] == [False]
    # A prompt's own type, on the untyped agent: imported by name on the worker.
    plain = stack.agents["plain"].blocking_session()
    shop = f"Shop{tag()}"
    receipt = plain.prompt(f"receipt:{shop}", output_type=Receipt).result()
    assert receipt.stop_reason == "end_turn" and receipt.output == Receipt(shop=shop, items=["tea", "cake"])


def test_an_invalid_answer_is_corrected_on_the_retry_which_carries_the_errors(
        stack: Stack, model: ScriptedModel) -> None:
    stack.start()
    session = stack.agents["invoicer"].blocking_session()
    prompt = f"fix:B-{tag()}"
    turn = session.prompt(prompt)
    end = stack.wait_end("invoicer", session.id)
    assert end["stopReason"] == "end_turn" and end["output"] == {"number": prompt[4:], "total": 7}, end
    assert turn.result().output == Invoice(number=prompt[4:], total=7)
    first, second = asked(model, prompt)
    assert told_errors(first) == []
    [errors] = told_errors(second)
    assert errors.startswith("The arguments did not validate as Invoice: ")
    listed = json.loads(errors.split(": ", 1)[1].split("\n", 1)[0])
    assert listed == [{"type": "missing", "loc": ["total"], "msg": "Field required"}]
    lines = stack.lines("invoicer", session.id)
    assert [t["isError"] for t in final_results(lines)] == [True, False]
    assert len(of_type(lines, "turn_end")) == 1


def test_an_answer_invalid_twice_ends_the_turn_fx_output_invalid(stack: Stack, model: ScriptedModel) -> None:
    stack.start()
    session = stack.agents["invoicer"].blocking_session()
    prompt = f"bad:C-{tag()}"
    turn = session.prompt(prompt)
    end = stack.wait_end("invoicer", session.id)
    assert end["stopReason"] == "error" and end["error"]["code"] == "FX_OUTPUT_INVALID", end
    assert "output" not in end
    result = turn.result()
    assert result.stop_reason == "error" and result.output is None
    assert result.error is not None and result.error["code"] == "FX_OUTPUT_INVALID"
    assert [len(told_errors(r)) for r in asked(model, prompt)] == [0, 1], "one answer and one retry"


@pytest.mark.parametrize("agent,own_type", [("invoicer", None), ("plain", Invoice), ("native", None)],
                         ids=["agents-type", "prompts-own-type", "native"])
def test_a_worker_killed_before_the_retrys_answer_is_taken_over_without_asking_the_first_again(
        stack: Stack, model: ScriptedModel, agent: str, own_type: type | None) -> None:
    """The first answer does not validate; its verdict is stored with the response. The
    retry (carrying the errors) is held at the model; kill -9 of its worker there. A new
    worker takes the session over once the lease expires and resumes the turn from the
    verdict: it sends the retry again (with the errors), not the first request, and the
    valid answer ends the turn once. For the agent's type, a prompt's own (imported by
    name on both workers), and native mode (the errors go back as a user message, kept
    in the verdict's record)."""
    dying = stack.start()
    session = stack.agents[agent].blocking_session()
    name = f"K{tag()}"
    prompt = f"killfix:{name}"
    turn = session.prompt(prompt, output_type=own_type) if own_type else session.prompt(prompt)
    try:
        model.wait_held(name, timeout_s=TURN_S)
        first, retry = asked(model, prompt)
        assert (pid_of(first), told_errors(first)) == (dying.pid, [])
        assert pid_of(retry) == dying.pid and len(told_errors(retry)) == 1
        # The verdict rides in the response's append: once it is stored, kill.
        found = wait_until(lambda: [r for r in stack.journal(session.id) if any(k == "output" for k, _ in r)],
                           TURN_S, what="the first answer's verdict stored")
        [appended] = cast("list[list[tuple[str, dict[str, Any]]]]", found)
        kinds = [kind for kind, _ in appended]
        verdict = kinds.index("output")
        assert kinds[:verdict + 1] == ["model_response", *(["tool_result"] if agent != "native" else []), "output"]
        body = appended[verdict][1]
        assert "errors" in body and ("retry" in body) == (agent == "native"), body
        dying.kill()
        taking_over = stack.start()
        end = stack.wait_end(agent, session.id, TAKEOVER_S)
    finally:
        model.release(name)
    assert end["stopReason"] == "end_turn" and end["output"] == {"number": name, "total": 7}, end
    result = turn.result()
    assert isinstance(result.output, Invoice) and result.output == Invoice(number=name, total=7)
    requests = asked(model, prompt)
    assert [told_errors(r) == [] for r in requests].count(True) == 1, "the first request was sent once in all"
    assert [(pid_of(r), len(told_errors(r))) for r in requests] == [
        (dying.pid, 0), (dying.pid, 1), (taking_over.pid, 1)]
    assert told_errors(requests[2]) == told_errors(requests[1]), "the same errors, read from the journal"
    lines = stack.lines(agent, session.id)
    assert_no_stale_line(lines)
    assert len(of_type(lines, "turn_end")) == 1
    assert [ln["interrupted"] for ln in of_type(lines, "turn_resume")] == [True]
    assert [t["isError"] for t in final_results(lines)] == ([] if agent == "native" else [True, False])
    assert end["epoch"] > lines[0]["epoch"], "the end came from the new worker"
