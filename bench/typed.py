"""Typed answers (docs/design.md §6 "Typed answers"): what asking for and validating an object
costs a turn, against the same turn answering in text, in the same run.

The engine alone (`fxengine.create_engine`, journaled to a `MemoryPersistence` as the
workers journal to the store), in this process; the scripted model server
(bench/_model.py) in a process of its own, answering at once. Kinds of turn, each a new
engine and prompt, in rounds that take every kind in turn (the order rotating per round):

- `text`: one step, text (the baseline of the one-step kinds);
- `tool`: one step, a `final_result` call whose arguments validate (tool mode);
- `native`: one step, the object as text under a `response_format` (native mode);
- `lookup`: two steps, a tool call then text (the baseline of the retried kind);
- `retried`: two steps, a `final_result` call missing a field (refused, sent back with
  the errors), then a valid one.

Figures: this process's CPU per turn (the engine, its HTTP client, the journal; the model
server is another process), median over the rounds of each kind's mean; each typed kind
against its baseline, ratio of medians, with the spread of the per-round ratios
(25th-75th percentile). Also the journaled bytes per turn (what a store writes: the
verdict record rides in the response's append, so there is no extra append).

Run: ``.venv/bin/python bench/typed.py [--rounds 15] [--turns 40] [--json PATH]`` (about
20 s at the defaults on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from bench._harness import ModelProcess, Row, add_json_arg, pct, print_rows, ratio_row, write_json  # noqa: E402
from fxengine import MemoryPersistence, Tool, create_engine  # noqa: E402

KINDS = ("text", "tool", "native", "lookup", "retried")
BASELINE = {"tool": "text", "native": "text", "retried": "lookup"}


class Answer(BaseModel):
    tag: str
    n: int


class Counted(MemoryPersistence):
    """The reference store, counting the appends and bytes it is sent."""

    def __init__(self) -> None:
        super().__init__()
        self.appends = 0
        self.written = 0

    async def append(self, *, expected: str | None, idempotency_key: str, data: bytes, barrier: bool,
                     marks: list[Any]) -> str:
        self.appends += 1
        self.written += len(data)
        return await super().append(expected=expected, idempotency_key=idempotency_key, data=data, barrier=barrier,
                                    marks=marks)


def _provider(base_url: str, *, native: bool) -> dict[str, Any]:
    return {"name": "bench", "base_url": base_url,
            "models": {"scripted": {"supports_tools": True, "supports_structured_output": native}}}


def _lookup() -> Tool:
    return Tool("lookup", "Looks up.", {"type": "object", "properties": {"q": {"type": "string"}}},
                idempotent=True, execute=lambda input, ctx: "found")


async def _turn(kind: str, base_url: str, client: httpx.AsyncClient, i: int) -> tuple[int, int]:
    """One turn of `kind` on a new journaled engine; the appends and bytes it journaled."""
    store = Counted()
    prompt = {"text": f"text:0:{i}", "tool": f"typed:0:{i}", "native": f"typed:0:{i}", "lookup": f"tool:0:{i}",
              "retried": f"typedbad:0:{i}"}[kind]
    options: dict[str, Any] = {}
    if kind in ("tool", "native", "retried"):
        options["output_type"] = Answer
    engine = await create_engine("scripted", provider=_provider(base_url, native=kind == "native"), persistence=store,
                                 tools=[_lookup()] if kind == "lookup" else [], http_client=client, **options)
    result = await engine.prompt(prompt).result()
    await engine.close()
    if result.stop_reason != "end_turn" or (kind in BASELINE and not isinstance(result.output, Answer)):
        raise RuntimeError(f"{kind} turn ended {result.stop_reason}: {result.error}")
    return store.appends, store.written


async def _run(base_url: str, rounds: int, turns: int) -> dict[str, list[tuple[float, int, int]]]:
    """Per kind, per round: (CPU ms per turn, appends per turn, journaled bytes per turn)."""
    out: dict[str, list[tuple[float, int, int]]] = {kind: [] for kind in KINDS}
    async with httpx.AsyncClient(timeout=30) as client:
        for kind in KINDS:  # warm-up
            await _turn(kind, base_url, client, 0)
        for r in range(rounds):
            order = KINDS[r % len(KINDS):] + KINDS[:r % len(KINDS)]
            for kind in order:
                started = time.process_time()
                appends = written = 0
                for i in range(turns):
                    a, w = await _turn(kind, base_url, client, i)
                    appends, written = appends + a, written + w
                out[kind].append(((time.process_time() - started) * 1000 / turns, appends // turns, written // turns))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--turns", type=int, default=40, help="turns of each kind per round")
    add_json_arg(parser)
    args = parser.parse_args()
    model = ModelProcess()
    try:
        runs = asyncio.run(_run(model.base_url, args.rounds, args.turns))
    finally:
        model.close()
    rows: list[Row] = []
    medians = {kind: statistics.median(r[0] for r in runs[kind]) for kind in KINDS}
    for kind, base in BASELINE.items():
        per_round = [r[0] / b[0] for r, b in zip(runs[kind], runs[base], strict=True)]
        rows.append(ratio_row(f"typed turn, {kind}", f"{kind} turn, CPU per turn", medians[kind], "ms",
                              f"{base} turn", medians[base],
                              note=f"per-round ratio {pct(per_round, 0.25):.2f}-{pct(per_round, 0.75):.2f}"))
    for kind in KINDS:
        _, appends, written = runs[kind][-1]
        print(f"{kind:>8}: {medians[kind]:.2f} ms CPU per turn, {appends} appends and {written} journaled bytes per turn")
    print_rows(rows)
    write_json(args.json, "typed", rows, {kind: {"cpu_ms": medians[kind], "appends": runs[kind][-1][1],
                                                 "journal_bytes": runs[kind][-1][2]} for kind in KINDS})


if __name__ == "__main__":
    main()
