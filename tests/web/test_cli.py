"""The `fx` client commands as a user runs them: real `fx` processes against `fx web` over loopback.

`fx prompt` (new session, `--session`, `--agent`, streamed live), `fx tail` (after a cursor,
following until the turn ends, Ctrl-C), `fx sessions`, every documented exit code, and
`--help` of every command.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from fxengine.testing import ScriptedModel
from tests.support.ports import default_port_busy  # noqa: F401 - a fixture, used by pytestmark
from tests.support.redis_server import delete_prefix, free_port
from tests.support.workers import Workers, wait_until
from tests.web import _server
from tests.web._server import FX, ROOT, WebProcess
from tests.web.conftest import TOKEN, _env, ndjson_lines, read_turn

# Port 8000 (the web commands' default) is busy throughout: a test that starts `fx web` or
# `fx dev` must give it a free `--port`, or it passes only where nothing else listens there.
pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.usefixtures("default_port_busy")]

RUN_TIMEOUT_S = 30.0
UNKNOWN_SESSION = "fxs_01JZZZZZZZZZZZZZZZZZZZZZZZ"
SESSION_BANNER = re.compile(r"^session (fxs_\w+)$", re.M)


def fx_env(url: str, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FX_") and k not in ("REDIS_URL", "AI_GATEWAY_API_KEY")}
    return {**base, "PYTHONPATH": str(ROOT), "FX_URL": url, **extra}


def fx(url: str, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """`fx ARGS` to completion (bounded), with FX_URL pointing at `url`."""
    return subprocess.run([FX, *args], env=fx_env(url, **extra), cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


class Running:
    """A running `fx` child whose stdout and stderr are read as they arrive."""

    def __init__(self, url: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [FX, *args], env=fx_env(url), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self._out = bytearray()
        self._err = bytearray()
        self._readers = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self._out), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self._err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _pump(pipe: object, into: bytearray) -> None:
        fd = pipe.fileno()  # type: ignore[attr-defined]
        while chunk := os.read(fd, 65536):
            into.extend(chunk)

    @property
    def stdout(self) -> str:
        return bytes(self._out).decode(errors="replace")

    @property
    def stderr(self) -> str:
        return bytes(self._err).decode(errors="replace")

    def wait_stdout(self, needle: str, timeout_s: float = 15.0) -> None:
        def seen() -> bool:
            if needle in self.stdout:
                return True
            assert self.proc.poll() is None, f"fx exited {self.proc.returncode} first: {self.stdout!r} {self.stderr!r}"
            return False

        wait_until(seen, timeout_s, what=f"{needle!r} on fx's stdout")

    def session_id(self, timeout_s: float = 15.0) -> str:
        match = wait_until(lambda: SESSION_BANNER.search(self.stderr), timeout_s, what="the session banner")
        return match.group(1)  # type: ignore[union-attr]

    def wait(self, timeout_s: float = RUN_TIMEOUT_S) -> int:
        code = self.proc.wait(timeout_s)
        for reader in self._readers:
            reader.join(5)
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.wait(10)


@pytest.fixture
def running() -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for child in started:
        child.close()


def start(started: list[Running], url: str, *args: str) -> Running:
    child = Running(url, *args)
    started.append(child)
    return child


def banner_session(result: subprocess.CompletedProcess[str]) -> str:
    match = SESSION_BANNER.search(result.stderr)
    assert match, result.stderr
    return match.group(1)


# ------------------------------------------------------------------------------- fx prompt


def test_prompt_streams_the_answer_live_while_the_model_is_still_held(
    web_open: WebProcess, model: ScriptedModel, running: list[Running]
) -> None:
    child = start(running, web_open.url, "prompt", "hold:cli-live")
    try:
        child.wait_stdout("partial ")
        # The model is held until released below: the turn cannot have ended yet.
        assert child.proc.poll() is None
        assert "rest" not in child.stdout and "[end_turn]" not in child.stdout
    finally:
        model.release("cli-live")
    assert child.wait() == 0, child.stderr
    assert child.stdout == "> hold:cli-live\npartial rest\n[end_turn]\n"
    assert SESSION_BANNER.search(child.stderr)


def test_prompt_continues_a_session_and_names_the_agent(web_open: WebProcess, api: httpx.Client) -> None:
    first = fx(web_open.url, "prompt", "--agent", "a", "first words")
    assert first.returncode == 0, first.stderr
    assert "echo:first words" in first.stdout
    sid = banner_session(first)
    second = fx(web_open.url, "prompt", "--session", sid, "--json", "second words")
    assert second.returncode == 0, second.stderr
    lines = [json.loads(raw) for raw in second.stdout.splitlines()]
    assert [lines[0]["type"], lines[-1]["type"]] == ["turn_start", "turn_end"]
    assert "".join(line["delta"] for line in lines if line["type"] == "text_delta") == "echo:second words "
    assert {line["sessionId"] for line in lines if "sessionId" in line} == {sid}
    state = api.get(f"/v1/sessions/{sid}").json()
    assert state["agent"] == "a" and state["turns"] == 2 and state["status"] == "idle"


def test_prompt_exits_1_when_the_turn_is_cancelled(
    web_open: WebProcess, api: httpx.Client, model: ScriptedModel, running: list[Running]
) -> None:
    child = start(running, web_open.url, "prompt", "hold:cli-cancel")
    try:
        sid = child.session_id()
        model.wait_held("cli-cancel", timeout_s=15)
        assert api.post(f"/v1/sessions/{sid}/cancel").status_code == 202
        assert child.wait() == 1, child.stderr
    finally:
        model.release("cli-cancel")
    assert child.stdout.endswith("[cancelled]\n")


def test_prompt_stopped_with_ctrl_c_exits_130_and_the_turn_goes_on(
    web_open: WebProcess, api: httpx.Client, model: ScriptedModel, running: list[Running]
) -> None:
    child = start(running, web_open.url, "prompt", "hold:cli-sigint")
    try:
        sid = child.session_id()
        child.wait_stdout("partial ")
        child.proc.send_signal(signal.SIGINT)
        assert child.wait() == 130
    finally:
        model.release("cli-sigint")
    assert "Traceback" not in child.stderr and f"fx tail {sid}" in child.stderr
    lines = read_turn(api, sid)
    assert lines[-1]["stopReason"] == "end_turn"


def test_prompt_rides_out_a_web_restart_without_showing_a_line_twice(
    redis_url: str, prefix: str, model: ScriptedModel, workers: Workers, running: list[Running],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()
    monkeypatch.setattr(_server, "free_port", lambda: port)  # both web processes on one address
    env = _env(redis_url, prefix, model, "default")
    first = WebProcess(env=env).wait_ready()
    second = None
    try:
        child = start(running, first.url, "prompt", "--url", first.url, "hold:cli-drop")
        child.wait_stdout("partial ")
        first.proc.kill()
        first.proc.wait(10)
        second = WebProcess(env=env).wait_ready()
        model.release("cli-drop")
        assert child.wait() == 0, child.stderr
    finally:
        model.release("cli-drop")
        first.close()
        if second is not None:
            second.close()
    assert child.stdout == "> hold:cli-drop\npartial rest\n[end_turn]\n"


RETRACTED = (
    "> holdonce:cli-retract\n"
    "partial \n"  # step 1, cut off by the kill: printed live, then withdrawn
    "[resumed after an interruption]\n"
    "[cut off: the output of step 1 above is withdrawn and reruns; the turn so far:]\n"
    "> holdonce:cli-retract\n"
    "after the kill\n"
    "[end_turn]\n"
)


def test_prompt_withdraws_the_text_of_a_step_cut_off_by_a_killed_worker(
    redis_url: str, model: ScriptedModel, running: list[Running]
) -> None:
    # A pool of its own (its own prefix and queues): killing it leaves the module's worker alone.
    prefix = f"fxr{uuid.uuid4().hex[:10]}"
    pool = Workers(redis_url=redis_url, prefix=prefix, env={"FX_TEST_MODEL_URL": model.base_url})
    web = None
    try:
        first = pool.start(queues=("default",), concurrency=4)
        web = WebProcess(env=_env(redis_url, prefix, model, "default")).wait_ready()
        child = start(running, web.url, "prompt", "holdonce:cli-retract")
        child.wait_stdout("partial ")
        sid = child.session_id()
        first.kill()  # mid-stream: step 1's response is never recorded
        pool.start(queues=("default",), concurrency=4)  # takes the turn over once the lease is dead
        assert child.wait() == 0, child.stderr
        assert child.stdout == RETRACTED
        with httpx.Client(base_url=web.url, timeout=15.0) as api:
            lines = ndjson_lines(api.get(f"/v1/sessions/{sid}/stream", params={"follow": 0}))
        assert [line.get("retract") for line in lines if line["type"] == "turn_resume"] == [[1]]
        # fx tail reads the same stored lines the same way; --json keeps them as they are.
        tail = fx(web.url, "tail", sid, "--no-follow")
        assert tail.returncode == 0 and tail.stdout == RETRACTED, tail.stderr
        raw = fx(web.url, "tail", sid, "--no-follow", "--json")
        assert [json.loads(x) for x in raw.stdout.splitlines()] == lines
        # The timeline of the same session: the killed worker's part died, the next one's ended.
        with httpx.Client(base_url=web.url, timeout=15.0) as api:
            (turn,) = api.get(f"/v1/sessions/{sid}/timeline").json()["turns"]
        assert [d["how"] for d in turn["deliveries"]] == ["died", "ended"]
        dead_epoch = turn["deliveries"][0]["epoch"]
        assert [s["withdrawn"] for s in turn["steps"] if s["epoch"] == dead_epoch] == [True]
        inspected = fx(web.url, "inspect", sid)
        assert f"epoch {dead_epoch}: died" in inspected.stdout and ": ended (cursors" in inspected.stdout
    finally:
        model.release("cli-retract")
        if web is not None:
            web.close()
        pool.close()
        delete_prefix(redis_url, prefix)


# --------------------------------------------------------------------------------- fx tail


def test_tail_prints_only_the_lines_after_the_cursor(web_open: WebProcess, api: httpx.Client) -> None:
    sid = api.post("/v1/sessions", json={"input": "tool:tailing"}).json()["sessionId"]
    read_turn(api, sid)
    whole = ndjson_lines(api.get(f"/v1/sessions/{sid}/stream", params={"follow": 0}))
    types = [line["type"] for line in whole]
    after = whole[types.index("tool_start") - 1]["cursor"]
    shown = [line for line in whole if line["cursor"] > after]
    assert shown and shown[0]["type"] == "tool_start"
    # Following a finished session: what is stored after the cursor, then it exits.
    result = fx(web_open.url, "tail", sid, "--cursor", str(after), "--json")
    assert result.returncode == 0, result.stderr
    assert [json.loads(raw) for raw in result.stdout.splitlines()] == shown
    stored = fx(web_open.url, "tail", sid, "--cursor", str(after), "--no-follow")
    assert stored.returncode == 0, stored.stderr
    assert stored.stdout.startswith("\n→ lookup(") and "looked up" in stored.stdout
    assert "> tool:tailing" not in stored.stdout  # the turn_start is at or before the cursor


def test_tail_follows_a_running_turn_until_it_ends(
    web_open: WebProcess, api: httpx.Client, model: ScriptedModel, running: list[Running]
) -> None:
    sid = api.post("/v1/sessions", json={"input": "hold:cli-tail"}).json()["sessionId"]
    try:
        model.wait_held("cli-tail", timeout_s=15)
        child = start(running, web_open.url, "tail", sid)
        child.wait_stdout("partial ")
        assert child.proc.poll() is None
    finally:
        model.release("cli-tail")
    assert child.wait() == 0, child.stderr
    assert child.stdout == "> hold:cli-tail\npartial rest\n[end_turn]\n"


def test_tail_from_the_end_of_an_idle_session_follows_its_next_turn(
    web_open: WebProcess, api: httpx.Client, running: list[Running]
) -> None:
    sid = api.post("/v1/sessions", json={"input": "one"}).json()["sessionId"]
    end = read_turn(api, sid)[-1]["cursor"]
    child = start(running, web_open.url, "tail", sid, "--cursor", str(end), "--json")
    # Whether the tail connects before or after this prompt, the turn it starts is the one
    # it follows to the end.
    second = api.post(f"/v1/sessions/{sid}/prompts", json={"input": "two", "messageId": "tail-next"})
    assert second.status_code == 202
    assert child.wait() == 0, child.stderr
    lines = [json.loads(raw) for raw in child.stdout.splitlines()]
    assert lines and all(line["cursor"] > end and line["messageId"] == "tail-next" for line in lines)
    assert lines[0]["type"] == "turn_start"
    assert lines[-1]["type"] == "turn_end" and lines[-1]["stopReason"] == "end_turn"


def test_tail_exits_1_after_a_cancelled_turn_and_130_on_ctrl_c(
    web_open: WebProcess, api: httpx.Client, model: ScriptedModel, running: list[Running]
) -> None:
    sid = api.post("/v1/sessions", json={"input": "hold:cli-tail-cancel"}).json()["sessionId"]
    try:
        model.wait_held("cli-tail-cancel", timeout_s=15)
        cancelled = start(running, web_open.url, "tail", sid)
        interrupted = start(running, web_open.url, "tail", sid)
        cancelled.wait_stdout("partial ")
        interrupted.wait_stdout("partial ")
        interrupted.proc.send_signal(signal.SIGINT)
        assert interrupted.wait() == 130
        assert "Traceback" not in interrupted.stderr
        assert api.post(f"/v1/sessions/{sid}/cancel").status_code == 202
        assert cancelled.wait() == 1, cancelled.stderr
    finally:
        model.release("cli-tail-cancel")
    assert cancelled.stdout.endswith("[cancelled]\n")


# ----------------------------------------------------------------------------- fx sessions


def test_sessions_lists_the_session_with_its_status(web_open: WebProcess, api: httpx.Client, model: ScriptedModel) -> None:
    idle = api.post("/v1/sessions", json={"input": "listed", "agent": "a"}).json()["sessionId"]
    read_turn(api, idle)
    busy = api.post("/v1/sessions", json={"input": "hold:cli-list"}).json()["sessionId"]
    try:
        model.wait_held("cli-list", timeout_s=15)
        as_json = fx(web_open.url, "sessions", "--json", "--limit", "200")
        text = fx(web_open.url, "sessions", "--limit", "200")
    finally:
        model.release("cli-list")
    assert as_json.returncode == 0 and text.returncode == 0, as_json.stderr + text.stderr
    listed = {item["sessionId"]: item for item in json.loads(as_json.stdout)}
    assert listed[idle]["status"] == "idle" and listed[idle]["agent"] == "a"
    assert listed[busy]["status"] == "running"
    rows = {line.split()[0]: line.split() for line in text.stdout.splitlines()}
    assert rows[idle][1:3] == ["a", "idle"] and rows[busy][1:3] == ["default", "running"]
    read_turn(api, busy)


# ------------------------------------------------------------------------------ exit codes


def test_usage_and_configuration_errors_exit_2(web_open: WebProcess) -> None:
    missing_text = fx(web_open.url, "prompt")
    assert missing_text.returncode == 2 and "Missing argument 'TEXT'" in missing_text.stderr
    negative = fx(web_open.url, "tail", UNKNOWN_SESSION, "--cursor", "-1")
    assert negative.returncode == 2 and "--cursor" in negative.stderr
    bad_url = fx("ftp://nowhere", "sessions")
    assert bad_url.returncode == 2 and "FX_URL" in bad_url.stderr
    bad_setting = fx(web_open.url, "sessions", FX_LEASE_S="soon")
    assert bad_setting.returncode == 2 and "FX_LEASE_S" in bad_setting.stderr


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("prompt", "--agent", "nobody", "hi"), "FX_UNKNOWN_AGENT"),
        (("prompt", "--session", UNKNOWN_SESSION, "hi"), "FX_UNKNOWN_SESSION"),
        (("prompt", "--message-id", "bad id!", "hi"), "FX_INVALID_MESSAGE_ID"),
        (("tail", UNKNOWN_SESSION), "FX_UNKNOWN_SESSION"),
        (("tail", "fxs_not-a-session", "--no-follow"), "FX_INVALID_SESSION_ID"),
        (("tail", "not-a-session", "--no-follow"), "FX_UNKNOWN_SESSION"),  # an application may name its own
    ],
)
def test_a_refused_request_exits_3_with_its_code(web_open: WebProcess, args: tuple[str, ...], code: str) -> None:
    result = fx(web_open.url, *args)
    assert result.returncode == 3, result.stdout + result.stderr
    assert result.stderr.startswith(f"fx: {code}: ") and result.stdout == ""


def test_the_token_comes_from_fx_api_token(web_auth: WebProcess) -> None:
    refused = fx(web_auth.url, "sessions")
    assert refused.returncode == 3 and "FX_UNAUTHORIZED" in refused.stderr
    assert "set FX_API_TOKEN" in refused.stderr
    done = fx(web_auth.url, "prompt", "--agent", "b", "with token", FX_API_TOKEN=TOKEN)
    assert done.returncode == 0, done.stderr
    assert "echo:with token" in done.stdout


@pytest.mark.parametrize("args", [("prompt", "hi"), ("tail", UNKNOWN_SESSION), ("sessions",)])
def test_an_unreachable_api_exits_4(args: tuple[str, ...]) -> None:
    result = fx(f"http://127.0.0.1:{free_port()}", *args)
    assert result.returncode == 4, result.stdout + result.stderr
    assert result.stderr.startswith("fx: FX_CONNECT: cannot reach http://127.0.0.1:")


# ---------------------------------------------------------------------------------- --help


def test_every_command_has_help() -> None:
    commands = ["", "dev", "demo", "web", "worker", "prompt", "tail", "sessions", "steer", "cancel", "approve", "deny"]
    children = {
        name: subprocess.Popen([FX, *([name] if name else []), "--help"], env=fx_env("http://127.0.0.1:9"), cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in commands
    }
    outputs = {}
    for name, child in children.items():
        out, err = child.communicate(timeout=RUN_TIMEOUT_S)
        assert child.returncode == 0, err
        assert out.startswith(f"Usage: fx {name}".rstrip()) and "--help" in out
        outputs[name] = out
    assert all(re.search(rf"^  {name}\b", outputs[""], re.M) for name in commands[1:])
    assert "--session" in outputs["prompt"] and "--agent" in outputs["prompt"] and "--cursor" in outputs["tail"]


def test_steer_and_cancel_a_running_turn(web_open: WebProcess, api: httpx.Client, model: ScriptedModel) -> None:
    steered_sid = api.post("/v1/sessions", json={"input": "hold:cli-steer"}).json()["sessionId"]
    model.wait_held("cli-steer", timeout_s=15)
    steered = fx(web_open.url, "steer", steered_sid, "shorter please")
    assert steered.returncode == 0, steered.stderr
    assert re.match(r"^steer msg_\w+ stored$", steered.stdout.strip())

    def joined() -> bool:  # the worker polls its inbox: let it see the steer before the reply ends
        stored = api.get(f"/v1/sessions/{steered_sid}/stream", params={"cursor": 0, "follow": "false"})
        return any(ln["type"] == "user_message" for ln in ndjson_lines(stored))

    wait_until(joined, 10, what="the steer joining the held turn")
    model.release("cli-steer")
    lines = read_turn(api, steered_sid)
    assert any(ln["type"] == "user_message" for ln in lines), lines  # the steer joined the turn
    assert "echo:shorter please" in "".join(ln.get("delta", "") for ln in lines)

    sid = api.post("/v1/sessions", json={"input": "hold:cli-cancel2"}).json()["sessionId"]
    model.wait_held("cli-cancel2", timeout_s=15)
    cancelled = fx(web_open.url, "cancel", sid)
    assert cancelled.returncode == 0 and f"cancel of {sid} asked" in cancelled.stdout
    try:
        ends = [ln for ln in read_turn(api, sid) if ln["type"] == "turn_end"]
    finally:
        model.release("cli-cancel2")
    assert ends and ends[-1]["stopReason"] == "cancelled"
    unknown = fx(web_open.url, "cancel", UNKNOWN_SESSION)
    assert unknown.returncode == 3 and "FX_UNKNOWN_SESSION" in unknown.stderr


@pytest.mark.parametrize("command", ["web", "dev"])
def test_a_busy_port_is_exit_2_with_a_hint(redis_url: str, command: str) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = fx("http://127.0.0.1:9", command, "--port", str(port), REDIS_URL=redis_url,
                    FX_AGENTS="tests.durable.agents")
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr and "pass --port" in result.stderr


def test_fx_web_says_its_agents_store_and_address_at_start(redis_url: str) -> None:
    web = WebProcess(env={"REDIS_URL": redis_url, "FX_PREFIX": f"fxcli{uuid.uuid4().hex[:8]}",
                          "FX_AGENTS": "tests.durable.agents"})
    try:
        web.wait_ready()
        first = web.log_tail().splitlines()[0]
    finally:
        web.close()
    assert first.startswith("fx web: agents ") and "(tests.durable.agents)" in first, first
    assert "store redis at redis://" in first and f"http://127.0.0.1:{web.port}/" in first, first


@pytest.mark.parametrize("command", ["web", "worker"])
def test_an_unreachable_store_is_named_by_host_and_port_never_by_password(command: str) -> None:
    port = ["--port", str(free_port())] if command == "web" else []  # fx web checks its port before the store
    result = fx("http://127.0.0.1:9", command, *port, REDIS_URL="redis://:hunter2-secret@127.0.0.1:9/0",
                FX_AGENTS="tests.durable.agents")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "127.0.0.1:9" in result.stderr and "hunter2-secret" not in result.stdout + result.stderr, result.stderr


def test_prompt_names_its_session_at_once_and_says_when_no_worker_takes_it(
    running: list[Running], redis_url: str
) -> None:
    prefix = f"fxcli{uuid.uuid4().hex[:8]}"
    web = WebProcess(env={"REDIS_URL": redis_url, "FX_PREFIX": prefix, "FX_AGENTS": "tests.durable.agents"})
    try:
        web.wait_ready()
        child = start(running, web.url, "prompt", "nobody runs me")
        sid = child.session_id(timeout_s=10)  # before any line: no worker runs
        wait_until(lambda: "waiting for a worker" in child.stderr, 10, what="the waiting notice")
        assert f"fx tail {sid}" in child.stderr and child.stdout == ""
    finally:
        web.close()
        delete_prefix(redis_url, prefix)


# ---------------------------------------------------------------------------------- approve / deny


def _parked_call(api: httpx.Client, prompt: str) -> tuple[str, str]:
    """A new session whose turn parks on one call: (session id, call id)."""
    sid = api.post("/v1/sessions", json={"input": prompt}).json()["sessionId"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = api.get(f"/v1/sessions/{sid}").json()
        if state["status"] == "paused":
            return sid, state["pendingCalls"][0]
        time.sleep(0.05)
    raise AssertionError(f"{sid} did not park: {state}")


def test_approve_and_deny_answer_a_parked_turn_and_print_it_going_on(web_open: WebProcess, api: httpx.Client) -> None:
    sid, call = _parked_call(api, "refund:6")
    shown = fx(web_open.url, "tail", sid, "--no-follow")
    assert f"waits for approval: call {call}" in shown.stdout and "[paused:" in shown.stdout, shown.stdout
    approved = fx(web_open.url, "approve", sid, call)
    assert approved.returncode == 0, approved.stderr
    assert f"approval of {call} stored" in approved.stderr and "[end_turn]" in approved.stdout, approved.stdout
    again = fx(web_open.url, "approve", sid, call)
    assert again.returncode != 0 and "FX_DECISION_REPEATED" in again.stderr, again.stderr

    sid, call = _parked_call(api, "refund:7")
    denied = fx(web_open.url, "deny", sid, call, "--reason", "over the limit", "--no-follow")
    assert denied.returncode == 0 and f"denial of {call} stored" in denied.stdout, denied.stderr
    unknown = fx(web_open.url, "deny", sid, "call_nope")
    assert unknown.returncode != 0 and "FX_DECISION_UNKNOWN_CALL" in unknown.stderr, unknown.stderr
