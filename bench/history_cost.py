"""AOF bytes and Redis script time per short turn, against the length of the session.

Starts a private `redis-server` with `appendonly yes` (`appendfsync no`, automatic AOF
rewrites off, every command in SLOWLOG) and drives the store API as a worker's
StorePersistence does: accept, claim, the turn's start record with its lines, then its end
record's call, which lets the session go with the checkpoint and the `pack` marks of the
claim's lines (design §5 "Packed at rest"). A short turn: 9 lines, a checkpoint of a fixed
2 KB (what a conversation's own checkpoint costs is the engine's concern, not the lines').

At 1, 1,001 and 10,001 turns of history, `--turns` short turns each run with this tree's
scripts and as many with the baseline's (`--baseline`: by default the last commit whose
packing rebuilt the whole stream and whose release rewrote it; its `fxworker` package,
taken with `git archive`, runs in a child process on the same server), one after the
other on the same session (at 1: each on a new session of one turn). The history is
built with this tree's scripts (its layout is the baseline's: chunks, no deleted entries).
Per turn: AOF growth (`INFO persistence` aof_current_size; the mean), EVALSHA time
(`INFO commandstats` usec: accept, claim and both appends) and the longest single call
(SLOWLOG), their medians, and the `ui` stream's bytes at rest after it, with what a
DUMP/RESTORE of it would give back.

Run: ``.venv/bin/python bench/history_cost.py [--sizes 1,1001,10001] [--turns 20] [--json PATH]``
(about 40 s).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The last commit whose append.lua rebuilt the whole `ui` stream to pack a claim's lines
# and whose _at_rest.lua rewrote it (DUMP/RESTORE) at every release.
BASELINE = "9e54771"
CHECKPOINT = b"FXJ\x01" + json.dumps({"messages": [{"role": "user", "content": f"question {i}"}
                                                   for i in range(80)]}).encode()[:2000]


def _lines(n: int) -> list[dict[str, Any]]:
    return [
        {"type": "turn_start", "messageId": f"m{n}", "sessionId": "", "input": f"question {n}"},
        {"type": "tool_start", "id": f"call_{n}", "name": "lookup", "input": {"q": n}, "step": 1,
         "messageId": f"m{n}"},
        {"type": "tool_end", "id": f"call_{n}", "name": "lookup", "isError": False, "content": f"value {n}",
         "messageId": f"m{n}"},
        *({"type": "text_delta", "delta": f"part {i} of answer {n} ", "step": 2, "messageId": f"m{n}"}
          for i in range(5)),
    ]


async def turn(store: Any, sid: str, n: int) -> int:
    """Prompt `m<n>` run by one claim and released at rest with its lines packed; returns
    the lines packed."""
    from fxworker.store.types import StoreRecord

    await store.accept(sid, agent="default", message_id=f"m{n}", input=f"question {n}")
    claim = await store.claim(sid, holder="bench", lease_ms=60_000)
    if claim is None:
        raise RuntimeError(f"session {sid} was not claimed for turn {n}")
    first = await store.append(sid, claim.epoch, records=[StoreRecord(f"r{n}a", b"start", [{"start": f"m{n}"}])],
                               lines=_lines(n))
    end = {"type": "turn_end", "messageId": f"m{n}", "stopReason": "end_turn",
           "usage": {"inputTokens": 10, "outputTokens": 5}}
    last = await store.append(sid, claim.epoch, records=[StoreRecord(f"r{n}b", b"end", [{"end": True}])],
                              lines=[end], release=True, checkpoint=CHECKPOINT,
                              pack_after=(claim.ui_cursor + 1, list(first.texts)))
    if not last.released:
        raise RuntimeError(f"turn {n} of {sid} did not let the session go")
    return int(last.packed)


def drive(url: str, prefix: str) -> int:
    """The child: runs one turn per line of stdin (`<session id> <n>`), answers its lines
    packed and the `fxworker` it ran (on the baseline's package, first on sys.path)."""
    from fxworker.store import redis_store

    store = redis_store(url, prefix=prefix)
    import fxworker

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            sid, n = line.split()
            packed = await turn(store, sid, int(n))
            print(json.dumps({"packed": packed, "fxworker": fxworker.__file__}), flush=True)
        await store.aclose()

    asyncio.run(serve())
    return 0


class Baseline:
    """The baseline's `fxworker` (git archive of `rev`) driving turns in a child process."""

    def __init__(self, rev: str, url: str, prefix: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="fxbench-baseline-"))
        tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "fxworker"], check=True,
                             capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
            archive.extractall(self.dir, filter="data")
        code = (f"import sys; sys.path.insert(0, {str(self.dir)!r}); sys.path.insert(1, {str(ROOT)!r}); "
                f"from bench.history_cost import drive; sys.exit(drive({url!r}, {prefix!r}))")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, cwd=self.dir)

    def turn(self, sid: str, n: int) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{sid} {n}\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        if not reply["fxworker"].startswith(str(self.dir)):
            raise RuntimeError(f"the baseline ran {reply['fxworker']}, not the archive in {self.dir}")
        return int(reply["packed"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(30)


def summary(turns: list[dict[str, float]]) -> dict[str, float]:
    """Means over the turns; times are medians (a turn on a shared machine may wait for a
    core, and Redis steps its Lua GC every 50 scripts, in whichever script comes)."""
    out = {k: sum(t[k] for t in turns) / len(turns) for k in turns[0]}
    for k in ("evalsha_us", "longest_call_us"):
        out[k] = statistics.median(t[k] for t in turns)
        out[f"{k}_max"] = max(t[k] for t in turns)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,1001,10001", help="turns of history, comma-separated")
    # 20: more than a stream node's worth of turns (what a packing moves grows with how
    # full the node of the claim's first line is, then starts again with the next node).
    parser.add_argument("--turns", type=int, default=20, help="short turns measured per size and code")
    parser.add_argument("--baseline", default=BASELINE, help="the commit to compare with (git rev)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures and summary rows to PATH")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import redis

    from bench._harness import Row, print_rows, ratio_row, write_json
    from fxworker.ids import new_session_id
    from fxworker.keys import session_keys
    from fxworker.store import redis_store
    from tests.support.redis_server import RedisServer

    sizes = [int(s) for s in args.sizes.split(",")]
    server = RedisServer(appendonly=True, args=("--appendfsync", "no", "--auto-aof-rewrite-percentage", "0",
                                                "--slowlog-log-slower-than", "0", "--slowlog-max-len", "256"))
    admin = redis.Redis.from_url(server.url)
    prefix = "fxh"
    store = redis_store(server.url, prefix=prefix)
    baseline = Baseline(args.baseline, server.url, prefix)
    counter = {"n": 0}
    run = asyncio.new_event_loop().run_until_complete

    def next_n() -> int:
        counter["n"] += 1
        return counter["n"]

    def measured(one: Any, sid: str) -> dict[str, float]:
        """One turn's AOF bytes, EVALSHA µs and longest call µs, and `ui` at rest after it."""
        admin.slowlog_reset()
        aof = int(admin.info("persistence")["aof_current_size"])
        stats = admin.info("commandstats").get("cmdstat_evalsha", {})
        packed = one(sid, next_n())
        aof_bytes = int(admin.info("persistence")["aof_current_size"]) - aof
        after = admin.info("commandstats")["cmdstat_evalsha"]
        calls = [e for e in admin.slowlog_get(256) if e["command"].split(b" ", 1)[0].upper() == b"EVALSHA"]
        ui = session_keys(prefix, sid).ui
        dumped = admin.dump(ui)
        assert dumped is not None
        admin.restore("fxh:scratch", 0, dumped, replace=True)
        rewritten = int(admin.memory_usage("fxh:scratch", samples=0) or 0)
        admin.delete("fxh:scratch")
        return {"aof_bytes": aof_bytes,
                "evalsha_us": float(after["usec"]) - float(stats.get("usec", 0)),
                "longest_call_us": float(max(e["duration"] for e in calls)),
                "packed": packed, "ui_bytes": int(admin.memory_usage(ui, samples=0) or 0),
                "ui_bytes_rewritten": rewritten, "ui_entries": int(admin.xlen(ui))}

    def new_turn(sid: str, n: int) -> int:
        return run(turn(store, sid, n))

    def grow(sid: str, turns: int) -> None:
        for _ in range(turns):
            run(turn(store, sid, next_n()))

    data: dict[str, Any] = {"sizes": {}, "baseline": args.baseline}
    started = time.monotonic()
    try:
        for code in (new_turn, baseline.turn):  # each loads its scripts (SCRIPT LOAD) before measuring
            code(new_session_id(), next_n())
        sid = new_session_id()
        history = 0
        for size in sizes:
            per: dict[str, list[dict[str, float]]] = {"new": [], "old": []}
            # Each code's turns in a row: Redis steps the Lua GC every 50 scripts, so a
            # turn pays for the garbage of the scripts before it (the baseline's rebuild).
            for name, code in (("new", new_turn), ("old", baseline.turn)):
                for _ in range(args.turns):
                    if size <= 10:  # a short history: each turn on a session of exactly `size` turns
                        short = new_session_id()
                        grow(short, size)
                        per[name].append(measured(code, short))
                    else:
                        if history < size:
                            built = time.monotonic()
                            grow(sid, size - history)
                            print(f"  history built to {size} turns in {time.monotonic() - built:.1f} s", flush=True)
                            history = size
                        per[name].append(measured(code, sid))
                        history += 1
            data["sizes"][str(size)] = {name: summary(turns) | {"turns": turns} for name, turns in per.items()}
    finally:
        baseline.close()
        store.close()
        admin.close()
        server.close()
    data["s"] = time.monotonic() - started

    figures = [("aof_bytes", "AOF bytes", "B"), ("evalsha_us", "EVALSHA time", "µs"),
               ("longest_call_us", "longest script call", "µs")]
    print(f"\nper short turn ({args.turns} turns each, bytes their mean, times their median; "
          f"old: {args.baseline}, new: this tree):")
    print(f"  {'history':>8}  " + "  ".join(f"{label + ' old':>26} {label + ' new':>22} {'old/new':>8}"
                                             for _, label, _ in figures))
    for size in sizes:
        s = data["sizes"][str(size)]
        print(f"  {size:>8,}  " + "  ".join(f"{s['old'][k]:>23,.0f} {unit:<2} {s['new'][k]:>19,.0f} {unit:<2} "
                                            f"{s['old'][k] / s['new'][k]:>7.1f}x" for k, _, unit in figures))
    print("  `ui` at rest after the turn (B), as left / rewritten by DUMP+RESTORE, entries:")
    for size in sizes:
        s = data["sizes"][str(size)]
        print(f"  {size:>8,}  old {s['old']['ui_bytes']:>10,.0f} / {s['old']['ui_bytes_rewritten']:>10,.0f}   "
              f"new {s['new']['ui_bytes']:>10,.0f} / {s['new']['ui_bytes_rewritten']:>10,.0f}   "
              f"{s['new']['ui_entries']:,.0f} entries")

    item = "36.4 per-turn cost"
    low, high = data["sizes"][str(sizes[0])], data["sizes"][str(sizes[-1])]
    rows: list[Row] = []
    for key, label, unit in figures[:2]:
        rows.append(ratio_row(item, f"{label} per short turn at {sizes[-1]:,} turns of history", high["new"][key],
                              unit, f"the same at {sizes[0]:,}", low["new"][key], target=2.0, at_most=True))
        rows.append(ratio_row(item, f"{label} per short turn at {sizes[-1]:,} turns of history, previous code",
                              high["old"][key], unit, "this code, same run", high["new"][key],
                              note=f"baseline {args.baseline}: the whole stream rebuilt and rewritten"))
    rows.append(ratio_row(item, f"longest script call at {sizes[-1]:,} turns of history", high["new"]["longest_call_us"],
                          "µs", f"the same at {sizes[0]:,}", low["new"]["longest_call_us"],
                          note="how long one turn holds Redis"))
    rows.append(ratio_row(item, f"longest script call at {sizes[-1]:,} turns of history, previous code",
                          high["old"]["longest_call_us"], "µs", "this code, same run", high["new"]["longest_call_us"]))
    print_rows(rows)
    write_json(args.json, "history_cost", rows, data)
    return 0 if all(r.met is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
