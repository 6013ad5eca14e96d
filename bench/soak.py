"""Soak: many short turns on one worker process; does its memory and thread count level off?

Starts a throwaway `redis-server`, the scripted model server and one Celery worker
(bench/_agents.py, deployment timings), then runs `--turns` one-step turns (``text:0:…``),
`--batch` new sessions at a time, each prompted and followed to its end by this process.
Every `--every` turns it samples the worker's resident memory and thread count
(`/proc/<pid>/status`). The figures: both after the warm-up (`--warm` turns) and at the
end, and the growth over the second half per 1,000 turns — the baseline is the warm-up
sample, so a ratio of 1.00 means flat.

Run: ``.venv/bin/python bench/soak.py [--turns 10000] [--json PATH]`` (about 3 minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._harness import (  # noqa: E402
    ModelProcess,
    Row,
    add_json_arg,
    client_agent,
    new_prefix,
    print_rows,
    ratio_row,
    start_worker,
    stop_parts,
    write_json,
)
from tests.support.redis_server import RedisServer  # noqa: E402


def sample(pid: int) -> tuple[float, int]:
    """(resident MB, threads) of a process."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["Threads"])


async def batch(agent: Any, tags: list[str]) -> None:
    sessions = [agent.session() for _ in tags]
    turns = await asyncio.gather(*[s.prompt(f"text:0:{tag}") for s, tag in zip(sessions, tags)])
    for turn in turns:
        result = await turn.result()
        if result.stop_reason != "end_turn":
            raise RuntimeError(f"turn {turn.message_id} ended {result}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--every", type=int, default=500)
    parser.add_argument("--warm", type=int, default=1_000)
    add_json_arg(parser)
    args = parser.parse_args()
    from fxworker.agent import _loop

    server = RedisServer()
    model = ModelProcess()
    prefix = new_prefix()
    worker = start_worker(server, prefix, model.base_url, concurrency=args.batch)
    agent = None
    samples: list[dict[str, float]] = []
    started = time.monotonic()
    try:
        assert worker.pid is not None
        agent = client_agent(server.url, prefix, model.base_url)
        rss, threads = sample(worker.pid)
        samples.append({"turns": 0, "rss_mb": rss, "threads": threads, "s": 0.0})
        done = 0
        while done < args.turns:
            n = min(args.batch, args.turns - done)
            _loop().run(batch(agent, [f"s{done + i}" for i in range(n)]), timeout_s=120)
            done += n
            if done % args.every == 0 or done == args.turns:
                rss, threads = sample(worker.pid)
                samples.append({"turns": done, "rss_mb": rss, "threads": threads,
                                "s": round(time.monotonic() - started, 1)})
                print(f"  {done:>6} turns  {rss:7.1f} MB  {threads:3d} threads  {samples[-1]['s']:6.1f} s",
                      flush=True)
    finally:
        stop_parts(noop=None, agent=agent, worker=worker, model=model, server=server)

    warm = next(s for s in samples if s["turns"] >= args.warm)
    end = samples[-1]
    half = next(s for s in samples if s["turns"] >= args.turns // 2)
    per_k = 1000 / max(1, end["turns"] - half["turns"])
    rows: list[Row] = [
        ratio_row("soak", f"worker RSS after {end['turns']:.0f} turns", end["rss_mb"], "MB",
                  f"after {warm['turns']:.0f} (warm-up)", warm["rss_mb"]),
        ratio_row("soak", f"worker threads after {end['turns']:.0f} turns", end["threads"], "",
                  f"after {warm['turns']:.0f} (warm-up)", warm["threads"]),
        ratio_row("soak", "RSS growth per 1,000 turns, second half", (end["rss_mb"] - half["rss_mb"]) * per_k, "MB",
                  "warm-up RSS", warm["rss_mb"]),
    ]
    print_rows(rows)
    write_json(args.json, "soak", rows, {"samples": samples, "turns": args.turns, "batch": args.batch})
    return 0


if __name__ == "__main__":
    sys.exit(main())
