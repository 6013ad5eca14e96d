"""`LoopThread`: an asyncio loop in a thread that carries many turns (§7).

A Celery worker process has one (`fxworker.tasks.process_loop`): its `threads` pool
hands each delivery to the loop (`run_coroutine_threadsafe`) and waits on it, so one
process runs 100+ turns at once while each waits on its model. The engines of a loop
share `HTTP_CLIENTS` `httpx.AsyncClient`s, a session always on the same one: httpcore's
pool walks every connection it holds (and asks each idle one's socket whether it is
readable) on every request start and end, so one pool of 100+ connections costs a turn
more CPU than the rest of its HTTP work.

They are `fxengine.models.aio.AioClient`s: httpx's API on aiohttp's transport
(`httpx-aiohttp`), whose model requests go to aiohttp directly. A streamed chunk costs a
third of httpcore's receive (bench/stream.py: bare aiohttp 25 µs a chunk against httpx's
79 at 100 streams), and a request without httpx around it 0.75x.

The embedded dev mode (no `REDIS_URL`) runs loops of this class as its in-process
workers: see `fxworker.embedded`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import ssl
import threading
import zlib
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import httpx

from fxengine.models.aio import AioClient


T = TypeVar("T")
log = logging.getLogger("fxworker.runtime")

# The loop's shared HTTP clients, and the connection limits of each. Sessions are spread
# over many clients because httpcore's pool does work in proportion to the requests it
# holds on every request and response: with 100 streamed requests at once, one client
# costs about 6 ms of CPU per request, 8 clients 1.6 ms, 64 clients under 1 ms (measured
# against the scripted model server on loopback). Each is built on first use, all on one
# TLS context.
HTTP_CLIENTS = 64
HTTP_LIMITS = httpx.Limits(max_connections=64, max_keepalive_connections=16)
HTTP_TIMEOUT = httpx.Timeout(connect=10.0, read=600.0, write=30.0, pool=600.0)


class StopSignal(threading.Event):
    """A warm shutdown's flag (a `threading.Event`): `set()`, from any thread, also runs
    what the running turns asked for with `on_set`, each on its own loop, at once; no
    turn polls the flag (a poll per turn every 100 ms cost a worker carrying 300 streams
    3,000 loop wake-ups a second)."""

    def __init__(self) -> None:
        super().__init__()
        self._guard = threading.Lock()
        self._waiting: dict[int, tuple[asyncio.AbstractEventLoop, Callable[[], None]]] = {}
        self._next = 0

    def set(self) -> None:
        with self._guard:
            super().set()
            waiting, self._waiting = list(self._waiting.values()), {}
        for loop, callback in waiting:
            try:
                loop.call_soon_threadsafe(callback)
            except RuntimeError:  # that loop is closed: nothing of it runs any more
                pass

    def on_set(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Calls `callback` on the running loop once the flag is set (soon, if it is);
        returns the cancel."""
        loop = asyncio.get_running_loop()
        with self._guard:
            if not self.is_set():
                key = self._next
                self._next += 1
                self._waiting[key] = (loop, callback)
                return lambda: self._forget(key)
        return loop.call_soon(callback).cancel

    def _forget(self, key: int) -> None:
        with self._guard:
            self._waiting.pop(key, None)


class LoopThread:
    """An asyncio loop running in a daemon thread, with the process's shared HTTP clients."""

    def __init__(self, name: str = "fx-loop") -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._clients: list[AioClient | None] = [None] * HTTP_CLIENTS
        self._tls: ssl.SSLContext | None = None  # one TLS context for every client (building one is slow)
        self.stopping = StopSignal()  # warm shutdown: running turns yield and requeue
        self.closing = StopSignal()  # `close()`: running turns let go as they stand, before the cancel
        self.killed = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._ready.wait(10.0)

    def __repr__(self) -> str:
        tasks = len(asyncio.all_tasks(self.loop)) if self.loop.is_running() else 0
        return f"<LoopThread {self.name} running={self.loop.is_running()} tasks={tasks}>"

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        # The loop is stopped but never closed: a blocking read cancelled on it may leave a
        # wake-up callback in the embedded (fakeredis) server, which later calls
        # `call_soon_threadsafe` on this loop; on a closed loop that would fail the write.
        self.loop.run_forever()

    @property
    def http_client(self) -> httpx.AsyncClient:
        """The first of this loop's shared HTTP clients (see `http_client_for`)."""
        return self._http_client(0)

    def http_client_for(self, session_id: str) -> httpx.AsyncClient:
        """The shared HTTP client of `session_id`'s engines on this loop (always the same one)."""
        return self._http_client(zlib.crc32(session_id.encode()) % HTTP_CLIENTS)

    def build_http_clients(self) -> concurrent.futures.Future[None]:
        """Builds every shared HTTP client ahead of the first turns (a worker calls it
        when it is ready), one per loop turn so running work is not held up."""

        async def build() -> None:
            for shard in range(HTTP_CLIENTS):
                self._http_client(shard).session  # noqa: B018 - its aiohttp session, built now
                await asyncio.sleep(0)

        return self.submit(build())

    def _http_client(self, shard: int) -> AioClient:
        client = self._clients[shard]
        if client is None:  # built on first use, on the loop
            if self._tls is None:
                self._tls = httpx.create_ssl_context()
            client = self._clients[shard] = AioClient(timeout=HTTP_TIMEOUT, limits=HTTP_LIMITS, verify=self._tls)
        return client

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedules `coro` on the loop from any thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], *, timeout_s: float | None = None) -> T:
        """Runs `coro` on the loop and blocks the calling thread for its result."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("LoopThread.run() called from its own loop thread")
        return self.submit(coro).result(timeout_s)

    def close(self, *, timeout_s: float = 5.0) -> None:
        """Lets the running turns go, cancels every task, closes the shared HTTP clients
        and stops the loop.

        `closing` is set first: its callbacks (each running delivery's) run on the loop
        before any task is cancelled, so a turn is detached and writes nothing more. A
        cancelled turn would end itself `cancelled` and flush its journal; with its first
        record's call cut short by the same cancel, that stored its lines without the
        record, and the input, still waiting in the store, ran again at the next claim.
        """
        if not self.loop.is_running():
            return
        self.closing.set()  # its callbacks are queued on the loop ahead of `_aclose`

        async def _aclose() -> None:
            me = asyncio.current_task()
            others = [t for t in asyncio.all_tasks() if t is not me]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)
            clients, self._clients = self._clients, [None] * HTTP_CLIENTS
            for client in clients:
                if client is not None:
                    await client.aclose()

        try:
            self.submit(_aclose()).result(timeout_s)
        except Exception:  # noqa: BLE001 - closing is best effort
            log.debug("closing the shared HTTP client failed", exc_info=True)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self.loop.close()  # its selector and self-pipe: a process that starts and stops loops keeps no descriptors

    def kill(self) -> None:
        """Stops the loop abruptly, as a crash would: nothing more runs, no finally blocks.

        The loop and its tasks are kept referenced for ever so that no coroutine is
        garbage-collected (which would run its `finally` blocks and write).
        """
        self.killed = True
        _graveyard.append(self)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5.0)


_graveyard: list[LoopThread] = []


class SharedLoop:
    """A process-wide `LoopThread`, started on first use (and again if it stopped); any
    thread may ask for it at once."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: LoopThread | None = None

    def __repr__(self) -> str:
        return f"<SharedLoop {self.name} running={self.running is not None}>"

    def get(self) -> LoopThread:
        with self._lock:
            if self._loop is None or not self._loop.loop.is_running():
                self._loop = LoopThread(self.name)
            return self._loop

    @property
    def running(self) -> LoopThread | None:
        """The loop if it was started, without starting one."""
        with self._lock:
            return self._loop
