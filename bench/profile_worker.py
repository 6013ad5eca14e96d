"""Where one worker process spends its CPU while it carries 100 turns at once.

Runs `bench/e2e.py --profile` (100 sessions at once on one worker, the 200 ms scripted
model), which samples the worker with py-spy (`--gil`: only samples that hold the GIL,
i.e. Python work), then prints the functions with the most samples: by self time (the
frame that was running) and by total time (anywhere on the stack), as shares of all
samples. Rerun it before and after a change to the hot path, and compare the tables.

Run: ``.venv/bin/python bench/profile_worker.py [--top 20] [--keep PATH]`` (about 15 s).
Needs py-spy (``.venv/bin/pip install py-spy``); without it, it says so and exits 0.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_FRAME = re.compile(r"^(?P<func>.+?) \((?P<file>[^():]+)(?::\d+)?\)$")


def frame_name(frame: str) -> str:
    """`func (path/to/module.py:12)` -> `module.py:func` (line numbers merged)."""
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    return f"{Path(match['file']).name}:{match['func']}"


def tally(collapsed: str) -> tuple[collections.Counter[str], collections.Counter[str], int]:
    """Self and total samples per function from py-spy's collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [frame_name(f) for f in stack.split(";") if "(" in f]  # thread names carry no file
        if not frames:
            continue
        samples += n
        own[frames[-1]] += n
        for name in set(frames):
            total[name] += n
    return own, total, samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--keep", metavar="PATH", help="also keep the collapsed stacks here")
    args = parser.parse_args()
    spy = Path(sys.executable).parent / "py-spy"
    if not spy.exists() and shutil.which("py-spy") is None:
        print("py-spy is not installed (.venv/bin/pip install py-spy): no profile taken")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.keep) if args.keep else Path(tmp) / "worker.collapsed"
        run = subprocess.run([sys.executable, str(ROOT / "bench" / "e2e.py"), "--profile", str(path)],
                             capture_output=True, text=True, timeout=600)
        print("\n".join(ln for ln in run.stdout.splitlines() if ln.startswith(("RESULT", "round", "  CPU"))))
        if run.returncode != 0 or not path.exists():
            print(run.stdout[-2000:], run.stderr[-2000:])
            return 1
        own, total, samples = tally(path.read_text())
    if not samples:
        print("py-spy took no samples (is ptrace allowed here?)")
        return 0
    print(f"\nworker samples holding the GIL: {samples}")
    for title, counter in (("self", own), ("total", total)):
        print(f"\ntop {args.top} by {title} time:")
        for name, n in counter.most_common(args.top):
            print(f"  {100 * n / samples:5.1f}%  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
