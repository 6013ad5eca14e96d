"""Runs every bench once and prints one table: each figure beside its baseline from the same
run, their ratio, and the target where issue 15 (or 11) sets one. `make bench` runs this.

Each bench runs in a process of its own (its own `redis-server`, model server and
workers) and writes its rows to ``bench/results/<name>.json``; this script collects them
into ``bench/results/summary.json`` (every bench's rows and figures) and draws
``bench/results/throughput.png`` (turns/s against sessions at once; the idle sessions'
memory and sweeper pass) and ``bench/results/failover.png`` (every kill's time, p50, p99
and the bound). Each bench's own output goes to ``bench/results/<name>.log``.

Settings chosen to fit 10 minutes on 2 cores: failover runs 30 kills with a 6 s lease
(FX_LEASE_S 6 rather than the default 15; FX_SWEEP_S at its default of 5 s, which must stay
below the lease; the bound is lease_s + 1 s either way), about 4 minutes of the run;
bench/e2e.py runs 2 rounds; bench/backlog.py 300 sessions (issue 35's case is 1,000: about
2 min on its own); bench/delegation.py 50 rounds and 20 counted turns of each kind (the
default is 200 and 30); the py-spy profile (bench/profile_worker.py) is not part of it.

Run: ``.venv/bin/python bench/run_all.py [--only cost,scale] [--markdown]`` (about 6 min).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))

from bench._harness import Row, fmt  # noqa: E402

# name -> (script, arguments, timeout s), in the order the table shows them.
BENCHES: dict[str, tuple[str, list[str], int]] = {
    "store": ("store.py", [], 150),
    "cost": ("cost.py", [], 200),
    "history_cost": ("history_cost.py", [], 150),
    "engine_decode": ("engine_decode.py", [], 120),
    "turn_start": ("turn_start.py", ["--turns", "60"], 120),
    "scale": ("scale.py", [], 240),
    "e2e": ("e2e.py", ["--rounds", "2"], 120),
    "stream": ("stream.py", [], 240),
    "failover": ("failover.py", ["--runs", "30", "--lease-s", "6"], 420),
    "peers": ("peers.py", ["--turns", "30"], 240),
    "cluster": ("cluster.py", ["--rounds", "3"], 300),
    "tracing": ("tracing.py", ["--turns", "100", "--rounds", "3"], 300),
    "backlog": ("backlog.py", ["--sessions", "300"], 240),
    "parked": ("parked.py", ["--sessions", "1000", "--sample", "100"], 180),
    "delegation": ("delegation.py", ["--sample", "50", "--count", "20"], 180),
    "typed": ("typed.py", ["--rounds", "10", "--turns", "30"], 120),
    "local_store": ("local_store.py", [], 120),
}


def run_bench(name: str) -> dict[str, Any]:
    script, extra, timeout_s = BENCHES[name]
    out_json = RESULTS / f"{name}.json"
    out_json.unlink(missing_ok=True)
    started = time.monotonic()
    with (RESULTS / f"{name}.log").open("w") as log:
        try:
            proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), *extra, "--json", str(out_json)],
                                  cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    took = time.monotonic() - started
    if out_json.exists():
        result = json.loads(out_json.read_text())
    else:
        result = {"bench": name, "rows": [], "data": {}}
    result["exit"] = code
    result["s"] = took
    if not result["rows"]:
        result["rows"] = [Row(name, f"{script} did not finish ({code}); see bench/results/{name}.log", float("nan"),
                              "").__dict__]
    print(f"  {script:<18} {took:6.1f} s  exit {code}", flush=True)
    return result


def ratio_text(r: dict[str, Any]) -> str:
    """The ratio to 2 decimals, or 3 where 2 would print a missed target as its own value."""
    if r.get("ratio") is None:
        return "-"
    shown = f"{r['ratio']:.2f}x"
    if r.get("met") is False and r.get("target", "").endswith(shown):
        return f"{r['ratio']:.3f}x"
    return shown


def table(rows: list[dict[str, Any]], markdown: bool = False) -> str:
    head = ["item", "figure", "value", "baseline (same run)", "ratio", "target", "note"]
    body = []
    for r in rows:
        base = ""
        if r.get("baseline"):
            bv = r.get("baseline_value")
            base = f"{r['baseline']}: {fmt(bv)} {r.get('baseline_unit', '')}".strip() if bv is not None else r["baseline"]
        met = "" if r.get("met") is None else (" met" if r["met"] else " MISSED")
        ratio = ratio_text(r)
        body.append([r["item"], r["figure"], f"{fmt(r['value'])} {r['unit']}".strip(), base, ratio,
                     (r.get("target") or "") + met, r.get("note") or ""])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in body]
        return "\n".join(lines)
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(head)]
    widths[-1] = len(head[-1])  # the note runs on past the table's right edge
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in body]
    return "\n".join(lines)


def plot(results: dict[str, dict[str, Any]]) -> list[Path]:
    """The two PNGs (none without matplotlib, or without the benches they draw)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plots")
        return []
    made = []
    scale = results.get("scale", {}).get("data", {})
    if scale.get("throughput"):
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
        for workers, style, color in (("1", "o-", "tab:blue"), ("2", "s-", "tab:green")):
            series = scale["throughput"].get(workers)
            if not series:
                continue
            xs = [int(k) for k in series]
            left.plot(xs, [v["turns_per_s"] for v in series.values()], style, color=color,
                      label=f"turns/s, {workers} worker(s)")
            left.plot(xs, [v["noop_per_s"] for v in series.values()], style, color=color, alpha=0.35,
                      label=f"Celery no-op/s, {workers} worker(s) (baseline)")
        left.set(xscale="log", yscale="log", xlabel="sessions at once", ylabel="per second",
                 title="Throughput, zero model latency (two-step tool turns)")
        left.legend(fontsize=7)
        idle = {int(k): v for k, v in scale.get("idle", {}).items() if int(k) > 0}
        if idle:
            xs = sorted(idle)
            right.plot(xs, [idle[x]["bytes_per_session"] / 1024 for x in xs], "o-", label="KiB per idle session")
            right.set(xscale="log", xlabel="idle sessions", ylabel="KiB per session",
                      title="Idle sessions: Redis memory, sweeper pass")
            twin = right.twinx()
            twin.plot(xs, [idle[x]["sweep"]["ms"] for x in xs], "s--", color="tab:red", label="sweeper pass ms")
            twin.set_ylabel("sweeper pass (ms)")
            right.set_ylim(bottom=0)
            twin.set_ylim(bottom=0)
            right.legend(loc="upper left", fontsize=7)
            twin.legend(loc="lower right", fontsize=7)
        fig.tight_layout()
        path = RESULTS / "throughput.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    failover = results.get("failover", {}).get("data", {})
    if failover.get("times_s"):
        times = failover["times_s"]
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(range(1, len(times) + 1), times, "o", label="kill -9 -> turn_resume")
        for y, label, style, color in ((failover["p50_s"], "p50", "-", "tab:green"),
                                       (failover["p99_s"], "p99", "--", "tab:orange"),
                                       (failover["lease_s"] + 1, "bound lease_s + 1 s", ":", "tab:red"),
                                       (failover["lease_s"], "lease_s", "-.", "gray")):
            ax.axhline(y, linestyle=style, color=color, linewidth=1, label=f"{label} {y:.2f} s")
        ax.legend(fontsize=7, loc="lower right")
        ax.set(xlabel="kill", ylabel="seconds", ylim=(0, failover["lease_s"] + 1.5),
               title=f"Failover over {len(times)} kills (lease_s {failover['lease_s']:g}, "
                     f"FX_SWEEP_S {failover['sweep_s']:g})")
        fig.tight_layout()
        path = RESULTS / "failover.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    return made


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated bench names (default: all): " + ",".join(BENCHES))
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown too")
    args = parser.parse_args()
    names = [n for n in (args.only.split(",") if args.only else BENCHES) if n]
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        parser.error(f"unknown bench(es): {', '.join(unknown)}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(f"running {len(names)} benches (each its own redis-server, model server and workers):", flush=True)
    results = {name: run_bench(name) for name in names}
    rows = [r for name in names for r in results[name]["rows"]]
    total = time.monotonic() - started
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    summary = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit.strip(),
               "cores": os.cpu_count(), "s": total, "rows": rows, "benches": results}
    (RESULTS / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    plots = plot(results)
    print()
    print(table(rows))
    if args.markdown:
        print()
        print(table(rows, markdown=True))
    print(f"\n{total:.0f} s in all; results in {RESULTS.relative_to(ROOT)}/ (summary.json"
          + "".join(f", {p.name}" for p in plots) + ")")
    failed = [n for n in names if results[n]["exit"] not in (0,)]
    if failed:
        print(f"benches that did not exit 0: {', '.join(failed)} (see their .log)")
    return 1 if any(results[n]["exit"] not in (0, 1) for n in names) else 0


if __name__ == "__main__":
    sys.exit(main())
