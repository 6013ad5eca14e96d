"""Cost per step and per turn: Redis commands, round trips and bytes stored.

Starts a throwaway `redis-server`, the scripted model server (its own process) and one
Celery worker (bench/_agents.py, the deployment defaults: FX_LEASE_S 15, FX_SWEEP_S 5)
that counts its own round trips. Then, in the same run:

- 1,000 scripted turns (`--sessions` sessions × `--turns-per-session`, `--concurrency`
  sessions at a time), each the two-step tool turn (the model asks for `lookup`, then
  answers): `INFO commandstats` deltas (commands run inside scripts included) and round
  trips (socket writes) of the worker's store, its broker client and this client, per turn;
- the same Redis counts for Celery no-op tasks (`fxbench.noop`): the cost of one wake
  through the broker, the floor of a Celery-driven turn;
- MONITOR over a few turns: which scripts a turn runs, so the recorded steps (`append`
  calls) per turn and the round trips per recorded step are known;
- `MEMORY USAGE` of every key of a session at rest: after its 10 turns (compacted: the
  log is checkpointed once 24 records follow the last checkpoint), per turn; and of a
  short conversation (one two-step turn), against the 2 KiB target and against the bytes
  of its messages as plain compact JSON (what a chat-history store would hold); and what
  the same keys take rewritten (DUMP/RESTORE), without the 4 KiB first-node preallocation
  each Redis 7 stream makes (`stream-node-max-bytes`).

Run: ``.venv/bin/python bench/cost.py [--sessions 100] [--turns-per-session 10] [--json PATH]``
(about 40 s).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._harness import (  # noqa: E402
    CeleryNoop,
    ModelProcess,
    Row,
    add_json_arg,
    calls_delta,
    client_agent,
    commandstats,
    count_round_trips,
    monitor,
    new_prefix,
    print_rows,
    ratio_row,
    start_worker,
    stop_parts,
    write_json,
)
from tests.support.redis_server import RedisServer  # noqa: E402

NOOPS = 300
SHORT_SESSIONS = 20
MONITORED_TURNS = 10
TARGET_IDLE_BYTES = 2048


def worker_sends(path: Path) -> dict[str, int]:
    """The worker's round-trip counts as last written (it writes them every 50 ms)."""
    time.sleep(0.15)
    return json.loads(path.read_text())


def session_bytes(client: redis.Redis, prefix: str, session_id: str) -> int:
    """`MEMORY USAGE` (every element sampled) summed over the session's keys."""
    from fxworker.keys import session_keys

    total = 0
    for key in session_keys(prefix, session_id).all():
        used = client.memory_usage(key, samples=0)
        total += int(used or 0)
    return total


def rewritten_bytes(client: redis.Redis, prefix: str, session_id: str) -> int:
    """What the session's keys would take rewritten (each DUMP-ed and RESTORE-d to a
    scratch key, then measured and deleted): a Redis 7 stream preallocates
    `stream-node-max-bytes` (4 KiB) for its first node, which a rewrite gives back."""
    from fxworker.keys import session_keys

    total = 0
    for key in session_keys(prefix, session_id).all():
        dumped = client.dump(key)
        if dumped is None:
            continue
        scratch = f"fxbench:rewrite:{session_id}"
        client.restore(scratch, 0, dumped, replace=True)
        total += int(client.memory_usage(scratch, samples=0) or 0)
        client.delete(scratch)
    return total


def compressed(client: redis.Redis, prefix: str, session_id: str) -> dict[str, int]:
    """A session at rest's lines (as one NDJSON text), checkpoint and `rest`: their bytes
    raw, as stored (packed at rest, design §5) and zlib-compressed whole (level 6, the most
    packing them in one value could give); and how many `ui` entries hold the lines."""
    from fxworker.keys import session_keys
    from fxworker.store._packed import expand, unpack_checkpoint

    keys = session_keys(prefix, session_id)
    entries = [(int(i.split(b"-", 1)[0]), f) for i, f in client.xrange(keys.ui)]
    stored_ckpt = client.hget(keys.ckpt, "data") or b""
    rest = client.get(keys.rest) or b""
    parts = {
        "lines": (b"\n".join(text for _, text in expand(session_id, entries, 0)),
                  sum(len(v) for _, f in entries for v in f.values())),
        "ckpt": (unpack_checkpoint(stored_ckpt), len(stored_ckpt)),
        "rest": (rest, len(rest)),
    }
    sizes: dict[str, int] = {"ui_entries": len(entries)}
    for name, (raw, stored) in parts.items():
        sizes[name] = len(raw)
        sizes[f"{name}_stored"] = stored
        sizes[f"{name}_zlib"] = len(zlib.compress(raw, 6)) if raw else 0
    return sizes


async def conversation(agent: Any, turns: int, tag: str) -> str:
    """One session, `turns` two-step tool turns one after the other; returns its id."""
    session = agent.session()
    for i in range(turns):
        result = await (await session.prompt(f"tool:0:{tag}t{i}")).result()
        if result.stop_reason != "end_turn":
            raise RuntimeError(f"{tag} turn {i} ended {result}")
    return session.id


async def conversations(agent: Any, n: int, turns: int, concurrency: int, tag: str) -> list[str]:
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> str:
        async with gate:
            return await conversation(agent, turns, f"{tag}{i}")

    return list(await asyncio.gather(*(one(i) for i in range(n))))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--turns-per-session", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=10, help="sessions running at once")
    add_json_arg(parser)
    args = parser.parse_args()
    from fxworker.agent import _loop

    client_sends = count_round_trips()
    server = RedisServer()
    stats = redis.Redis.from_url(server.url)
    model = ModelProcess()
    prefix = new_prefix()
    count_file = Path(tempfile.mkdtemp(prefix="fxbench-")) / "sends.json"
    worker = start_worker(server, prefix, model.base_url, env={"FX_BENCH_COUNT_FILE": str(count_file)})
    agent = noop = None
    data: dict[str, Any] = {}
    try:
        agent = client_agent(server.url, prefix, model.base_url)
        noop = CeleryNoop(agent, server.url, prefix)
        run = _loop().run
        run(conversations(agent, 5, 1, 5, "warm"), timeout_s=60)
        for _ in range(20):
            noop.once()

        turns = args.sessions * args.turns_per_session
        before, w_before, c_before = commandstats(stats), worker_sends(count_file), dict(client_sends)
        started = time.monotonic()
        long_ids = run(conversations(agent, args.sessions, args.turns_per_session, args.concurrency, "c"),
                       timeout_s=600)
        elapsed = time.monotonic() - started
        w_after = worker_sends(count_file)
        commands = calls_delta(before, commandstats(stats))
        data["turns"] = {
            "turns": turns, "s": elapsed,
            "commands_per_turn": sum(commands.values()) / turns,
            "by_command_per_turn": {k: v / turns for k, v in sorted(commands.items(), key=lambda kv: -kv[1])},
            "worker_store_round_trips_per_turn": (w_after["async"] - w_before["async"]) / turns,
            "worker_broker_round_trips_per_turn": (w_after["sync"] - w_before["sync"]) / turns,
            "client_round_trips_per_turn": (client_sends["async"] + client_sends["sync"]
                                            - c_before["async"] - c_before["sync"]) / turns,
        }

        before, w_before, c_before = commandstats(stats), worker_sends(count_file), dict(client_sends)
        for _ in range(NOOPS):
            noop.once()
        w_after = worker_sends(count_file)
        noop_commands = calls_delta(before, commandstats(stats))
        data["noop"] = {
            "commands": sum(noop_commands.values()) / NOOPS,
            "by_command": {k: v / NOOPS for k, v in noop_commands.items()},
            "round_trips": (w_after["sync"] + w_after["async"] - w_before["sync"] - w_before["async"]
                            + client_sends["async"] + client_sends["sync"] - c_before["async"] - c_before["sync"])
            / NOOPS,
        }

        seen = monitor(server.url, lambda: run(conversation(agent, MONITORED_TURNS, "mon"), timeout_s=60))
        names = collections.Counter(command for _, command in seen)
        data["monitored"] = {k: v / MONITORED_TURNS for k, v in names.most_common()}

        short_ids = run(conversations(agent, SHORT_SESSIONS, 1, SHORT_SESSIONS, "s"), timeout_s=60)
        time.sleep(0.5)  # every release done: the sessions are at rest
        long_bytes = [session_bytes(stats, prefix, sid) for sid in long_ids]
        short_bytes = [session_bytes(stats, prefix, sid) for sid in short_ids]
        data["memory"] = {
            "bytes_per_long_session": sum(long_bytes) / len(long_bytes),
            "bytes_per_turn": sum(long_bytes) / len(long_bytes) / args.turns_per_session,
            "bytes_per_short_session": sum(short_bytes) / len(short_bytes),
            "bytes_per_short_session_rewritten": sum(rewritten_bytes(stats, prefix, sid) for sid in short_ids)
            / len(short_ids),
            "keys_of_a_long_session": {
                k.decode().rpartition(":")[2]: int(stats.memory_usage(k, samples=0) or 0)
                for k in stats.scan_iter(match=f"{prefix}:{{{long_ids[0]}}}:*")
            },
            "keys_of_a_short_session": {
                k.decode().rpartition(":")[2]: int(stats.memory_usage(k, samples=0) or 0)
                for k in stats.scan_iter(match=f"{prefix}:{{{short_ids[0]}}}:*")
            },
            "compressed_long_session": compressed(stats, prefix, long_ids[0]),
        }
    finally:
        stats.close()
        served = stop_parts(noop=noop, agent=agent, worker=worker, model=model, server=server)

    # The plain-JSON size of a conversation: the messages of its last model request.
    last_size: dict[str, int] = {}
    for _, prompt, size in served:
        last_size[prompt.rpartition(":")[2].rpartition("t")[0]] = size  # tag c12t3 -> session c12
    short_json = [last_size[f"s{i}"] for i in range(SHORT_SESSIONS) if f"s{i}" in last_size]
    long_json = [last_size[f"c{i}"] for i in range(args.sessions) if f"c{i}" in last_size]
    data["memory"]["plain_json_short_session"] = sum(short_json) / max(1, len(short_json))
    data["memory"]["plain_json_per_turn"] = sum(long_json) / max(1, len(long_json)) / args.turns_per_session

    t, m, n = data["turns"], data["monitored"], data["noop"]
    appends = m.get("EVALSHA append", 0.0)
    store_rt = t["worker_store_round_trips_per_turn"]
    print(f"{t['turns']} two-step tool turns in {t['s']:.1f} s ({t['turns'] / t['s']:.0f} turns/s), per turn:")
    print(f"  Redis commands {t['commands_per_turn']:.1f} (scripts' inner commands included): "
          + ", ".join(f"{k} {v:.1f}" for k, v in t["by_command_per_turn"].items() if v >= 0.05))
    print(f"  round trips: worker store {store_rt:.1f}, worker broker {t['worker_broker_round_trips_per_turn']:.1f}, "
          f"client {t['client_round_trips_per_turn']:.1f}")
    print(f"  commands sent, by name (MONITOR over {MONITORED_TURNS} turns, all processes): "
          + ", ".join(f"{k} {v:.1f}" for k, v in m.items() if v >= 0.05))
    print(f"Celery no-op task: {n['commands']:.1f} Redis commands, {n['round_trips']:.1f} round trips")
    mem = data["memory"]
    print(f"memory at rest: {mem['bytes_per_short_session']:.0f} B per short session (1 turn; plain JSON "
          f"{mem['plain_json_short_session']:.0f} B), {mem['bytes_per_turn']:.0f} B per turn of a "
          f"{args.turns_per_session}-turn session (plain JSON {mem['plain_json_per_turn']:.0f} B)")
    print(f"  keys of a short session: {mem['keys_of_a_short_session']}; rewritten "
          f"{mem['bytes_per_short_session_rewritten']:.0f} B")
    print(f"  keys of a {args.turns_per_session}-turn session: {mem['keys_of_a_long_session']}; its lines, "
          f"checkpoint and rest, raw, stored and zlib: {mem['compressed_long_session']}")

    item = "2 cost per step"
    rows: list[Row] = [
        ratio_row(item, "Redis commands per turn (2 steps)", t["commands_per_turn"], "commands",
                  "Celery no-op task", n["commands"]),
        ratio_row(item, "round trips per turn, all processes", store_rt + t["worker_broker_round_trips_per_turn"]
                  + t["client_round_trips_per_turn"], "round trips", "Celery no-op task", n["round_trips"]),
        ratio_row(item, "worker store round trips per recorded step", store_rt / appends if appends else float("nan"),
                  "round trips", "one per step record", 1.0,
                  note=f"{appends:.1f} records/turn; the rest: claim, lease, release, inbox"),
        ratio_row(item, "bytes per idle short session (1 turn)", mem["bytes_per_short_session"], "B",
                  "2 KiB target", TARGET_IDLE_BYTES, target=1.0, at_most=True),
        ratio_row(item, "bytes per idle short session (1 turn)", mem["bytes_per_short_session"], "B",
                  "its messages as plain JSON", mem["plain_json_short_session"]),
        ratio_row(item, "bytes per idle short session, keys rewritten", mem["bytes_per_short_session_rewritten"], "B",
                  "2 KiB target", TARGET_IDLE_BYTES, target=1.0, at_most=True,
                  note="DUMP/RESTORE: no 4 KiB stream preallocation"),
        ratio_row(item, f"bytes per turn, {args.turns_per_session}-turn session at rest", mem["bytes_per_turn"], "B",
                  "its messages as plain JSON", mem["plain_json_per_turn"], target=2.0, at_most=True,
                  note="lines and checkpoint packed at rest (design §5)"),
    ]
    print_rows(rows)
    write_json(args.json, "cost", rows, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
