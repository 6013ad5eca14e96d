"""Streaming under load: N sessions on one worker process, each turn streaming `CHUNKS`
chunks at one per `INTERVAL_MS` (a real model at ~50 tokens/s), a reader following each.

Starts, each in its own process: a throwaway `redis-server`, a streaming model server
(aiohttp; every chunk's text is the time it was written, in µs since the epoch, then
``|``), and one Celery worker (`-P threads`, agents of `tests.durable.agents`). This
process prompts N sessions at once and follows each with `Session.stream` (the product's
reader), timing every chunk from the model's write to the reader.

Beside it, in the same run and against the same model server, the floors of the same
streams, each in a process of its own: a bare aiohttp client and a bare httpx client
receiving and decoding the N streams, and a bare relay (aiohttp receive, then one
pipelined XADD per chunk, all sessions' writes of one loop turn in one pipeline).

Reported per N: worker CPU per chunk, lines written per chunk, p50/p99 latency from the
model's write to the reader, the reader's CPU per line; the largest N whose p99 stays
under 250 ms; and at N = 100 the worker's CPU per chunk against the relay's.

Run: ``.venv/bin/python bench/stream.py`` (about 90 s); ``--sizes 10,100,300``,
``--chunks``, ``--interval-ms``; ``--json PATH`` writes the summary rows (bench/run_all.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._harness import cpu_s  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402
from tests.support.workers import CeleryWorker  # noqa: E402

CHUNKS = 300
INTERVAL_MS = 20
SIZES = (10, 100, 300)
P99_TARGET_MS = 250.0
BARE_N = 100


# ---------------------------------------------------------------------------- model server


def serve_model(chunks: int, interval_ms: float) -> None:
    """The model server process: prints its base URL, serves until stdin closes."""
    from aiohttp import web

    done = (b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
            b'"usage":{"prompt_tokens":10,"completion_tokens":%d}}\n\ndata: [DONE]\n\n' % chunks)

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        step = interval_ms / 1000
        for _ in range(chunks):
            await asyncio.sleep(step)
            stamp = time.time_ns() // 1000
            await response.write(b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"%d|"}}]}\n\n' % stamp)
        await response.write(done)
        return response

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(f"http://127.0.0.1:{port}/v1", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await runner.cleanup()

    asyncio.run(main())


class ModelProcess:
    def __init__(self, chunks: int, interval_ms: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-model", "--chunks", str(chunks), "--interval-ms", str(interval_ms)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        self.base_url = self.proc.stdout.readline().strip()
        if not self.base_url.startswith("http"):
            raise RuntimeError("the model server did not start")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


# ---------------------------------------------------------------------------- the floors


def bare(kind: str, n: int, base_url: str, redis_url: str) -> None:
    """A floor process: receives `n` streams at once and prints its CPU seconds and the
    chunks it decoded, as JSON."""
    body = json.dumps({"model": "scripted", "stream": True, "messages": [{"role": "user", "content": "go"}]})
    url = f"{base_url}/chat/completions"
    counts = {"chunks": 0}

    def decode(line: bytes) -> bool:
        if not line.startswith(b"data: "):
            return False
        data = line[6:].strip()
        if data == b"[DONE]":
            return False
        json.loads(data)
        counts["chunks"] += 1
        return True

    async def with_aiohttp(relay: Any = None) -> None:
        import aiohttp

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            async def one(i: int) -> None:
                async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
                    async for line in response.content:
                        if decode(line) and relay is not None:
                            relay(f"bench:{i}", line)

            await asyncio.gather(*[one(i) for i in range(n)])

    async def with_httpx() -> None:
        import httpx

        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=None), timeout=60) as client:
            async def one() -> None:
                async with client.stream("POST", url, content=body, headers={"Content-Type": "application/json"}) as r:
                    async for line in r.aiter_lines():
                        decode(line.encode())

            await asyncio.gather(*[one() for _ in range(n)])

    async def relayed() -> None:
        import redis.asyncio

        client = redis.asyncio.Redis.from_url(redis_url)
        queued: list[tuple[str, bytes]] = []
        loop = asyncio.get_running_loop()
        flushing: list[asyncio.Task[None]] = []

        async def flush() -> None:
            batch = queued[:]
            queued.clear()
            pipe = client.pipeline(transaction=False)
            for key, line in batch:
                pipe.xadd(key, {"l": line})
            await pipe.execute()

        def relay(key: str, line: bytes) -> None:
            if not queued:
                loop.call_soon(lambda: flushing.append(loop.create_task(flush())))
            queued.append((key, line))

        await with_aiohttp(relay)
        await asyncio.gather(*flushing)
        await client.aclose()

    run = {"aiohttp": with_aiohttp, "httpx": with_httpx, "relay": relayed}[kind]
    cpu0 = time.process_time()
    asyncio.run(run())
    print(json.dumps({"cpu_s": time.process_time() - cpu0, "chunks": counts["chunks"]}), flush=True)


def run_bare(kind: str, n: int, base_url: str, redis_url: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--bare", kind, "--n", str(n), "--url", base_url,
                          "--redis", redis_url], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return {"us_per_chunk": result["cpu_s"] * 1e6 / max(1, result["chunks"]), "chunks": result["chunks"]}


# ---------------------------------------------------------------------------- fxworker


def stream_phase(agent: Any, worker_pid: int, n: int, chunks: int) -> dict[str, Any]:
    """N sessions at once, one reader each: latencies, CPU per chunk, lines per chunk."""
    from fxworker.agent import _loop

    latencies_us: list[int] = []
    lines = {"text": 0, "all": 0}

    async def follow(session: Any) -> None:
        async for line in session.stream(0):
            lines["all"] += 1
            if line.get("type") == "text_delta":
                now = time.time_ns() // 1000
                lines["text"] += 1
                for stamp in line["delta"].split("|")[:-1]:
                    latencies_us.append(now - int(stamp))
            elif line.get("type") == "turn_end":
                assert line.get("stopReason") == "end_turn", line
                return

    async def phase() -> float:
        sessions = [agent.session() for _ in range(n)]
        readers = [asyncio.ensure_future(follow(s)) for s in sessions]
        await asyncio.gather(*[s.prompt("stream") for s in sessions])
        started = time.monotonic()
        await asyncio.gather(*readers)
        return time.monotonic() - started

    worker0, client0 = cpu_s(worker_pid), time.process_time()
    took_s = _loop().run(phase(), timeout_s=300)
    worker_s, client_s = cpu_s(worker_pid) - worker0, time.process_time() - client0
    latencies_us.sort()
    total = n * chunks
    assert len(latencies_us) == total, f"{len(latencies_us)} chunks read of {total}"

    def pct(p: float) -> float:
        return latencies_us[min(len(latencies_us) - 1, int(len(latencies_us) * p))] / 1000

    return {
        "n": n, "s": took_s, "chunks": total, "lines": lines["text"],
        "worker_us_per_chunk": worker_s * 1e6 / total, "lines_per_chunk": lines["text"] / total,
        "p50_ms": pct(0.50), "p99_ms": pct(0.99), "max_ms": latencies_us[-1] / 1000,
        "reader_us_per_line": client_s * 1e6 / max(1, lines["all"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--serve-model", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bare", choices=("aiohttp", "httpx", "relay"), help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=BARE_N, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--redis", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="sessions at once, one phase each")
    parser.add_argument("--chunks", type=int, default=CHUNKS)
    parser.add_argument("--interval-ms", type=float, default=INTERVAL_MS)
    parser.add_argument("--no-bare", action="store_true", help="skip the floors")
    parser.add_argument("--json", metavar="PATH", help="also write the summary rows to PATH")
    args = parser.parse_args()
    if args.serve_model:
        serve_model(args.chunks, args.interval_ms)
        return
    if args.bare:
        bare(args.bare, args.n, args.url, args.redis)
        return

    sizes = [int(s) for s in args.sizes.split(",") if s]
    started = time.monotonic()
    server = RedisServer()
    model = ModelProcess(args.chunks, args.interval_ms)
    prefix = f"fxbench{uuid.uuid4().hex[:8]}"
    worker = CeleryWorker(
        redis_url=server.url, prefix=prefix, queues=("default",), agents=("default",),
        concurrency=max(sizes) + 10,
        env={"FX_TEST_MODEL_URL": model.base_url, "FX_LOG_LEVEL": "WARNING", "FX_DELIVERY_TIMEOUT_S": "300"},
    )
    try:
        worker.start(timeout_s=30)
        print(f"worker pid {worker.pid}, model server pid {model.proc.pid}, redis port {server.port}; "
              f"{args.chunks} chunks every {args.interval_ms:g} ms per turn")
        phases, floors = run(args, sizes, server, model, worker, prefix)
    finally:
        worker.close()
        model.close()
        server.stop()
    report(args, phases, floors)
    print(f"bench took {time.monotonic() - started:.1f} s")


def run(args: Any, sizes: list[int], server: RedisServer, model: ModelProcess, worker: CeleryWorker,
        prefix: str) -> tuple[list[dict[str, Any]], dict[str, dict[str, float]]]:
    from fxworker import Agent, Settings
    from fxworker.celery_app import make_celery_app
    from fxworker.store import redis_store
    from fxworker.wakers import CeleryWaker
    from tests.durable.tooling import provider, tools

    settings = Settings(redis_url=server.url, prefix=prefix)
    agent = Agent(
        "default", model="scripted", provider=provider(model.base_url), tools=tools(), api_key="test-key",
        # Each reader holds a connection through its blocking read.
        store=redis_store(server.url, prefix=prefix, max_connections=2 * max(sizes) + 50), waker=CeleryWaker(make_celery_app(settings)), settings=settings,
    )
    assert worker.pid is not None
    stream_phase(agent, worker.pid, 2, args.chunks)  # warms up both sides
    phases = []
    for n in sizes:
        phase = stream_phase(agent, worker.pid, n, args.chunks)
        phases.append(phase)
        print(f"  N={n:>4}: worker {phase['worker_us_per_chunk']:6.0f} µs/chunk, {phase['lines_per_chunk']:.2f} "
              f"lines/chunk, p50 {phase['p50_ms']:6.1f} ms, p99 {phase['p99_ms']:7.1f} ms, "
              f"reader {phase['reader_us_per_line']:4.0f} µs/line, {phase['s']:.1f} s", flush=True)
    floors: dict[str, dict[str, float]] = {}
    if not args.no_bare:
        for kind in ("aiohttp", "httpx", "relay"):
            floors[kind] = run_bare(kind, BARE_N, model.base_url, server.url)
            print(f"  bare {kind:<8} N={BARE_N}: {floors[kind]['us_per_chunk']:5.0f} µs/chunk", flush=True)
    agent.close()
    return phases, floors


def report(args: Any, phases: list[dict[str, Any]], floors: dict[str, dict[str, float]]) -> None:
    under = [p["n"] for p in phases if p["p99_ms"] <= P99_TARGET_MS]
    print(f"RESULT largest N with p99 <= {P99_TARGET_MS:.0f} ms: {max(under) if under else 'none'} "
          f"(of {', '.join(str(p['n']) for p in phases)})")
    at = {p["n"]: p for p in phases}
    if BARE_N in at and "relay" in floors:
        ratio = at[BARE_N]["worker_us_per_chunk"] / floors["relay"]["us_per_chunk"]
        print(f"RESULT worker CPU per chunk at N={BARE_N}: {at[BARE_N]['worker_us_per_chunk']:.0f} µs, "
              f"{ratio:.2f}x the bare relay's {floors['relay']['us_per_chunk']:.0f} µs "
              f"(aiohttp receive {floors['aiohttp']['us_per_chunk']:.0f}, httpx {floors['httpx']['us_per_chunk']:.0f}); "
              f"{at[BARE_N]['lines_per_chunk']:.2f} lines per chunk")
    if not args.json:
        return
    from bench._harness import Row, ratio_row, write_json

    item = "streaming (issue 25)"
    rows: list[Row] = []
    for p in phases:
        rows.append(ratio_row(item, f"p99 model write -> reader, N={p['n']}", p["p99_ms"], "ms", "250 ms target",
                              P99_TARGET_MS, target=1.0, at_most=True, note=f"p50 {p['p50_ms']:.1f} ms"))
    if BARE_N in at and "relay" in floors:
        rows.append(ratio_row(item, f"worker CPU per chunk, N={BARE_N}", at[BARE_N]["worker_us_per_chunk"], "µs",
                              "bare relay (aiohttp + pipelined XADD)", floors["relay"]["us_per_chunk"], target=2.0,
                              at_most=True, note=f"{at[BARE_N]['lines_per_chunk']:.2f} lines/chunk"))
    write_json(args.json, "stream", rows, {"phases": phases, "floors": floors})


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
