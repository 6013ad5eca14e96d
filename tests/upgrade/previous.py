"""The previous release, materialised from git beside the working tree.

`PREVIOUS_RELEASE` is the commit of the last release: bump it at each release, so the
rolling-upgrade test always runs the code a deploy replaces against the code it deploys.
`materialise` extracts that commit's tree (`git archive | tar -x`: no worktree metadata,
no index lock) into a temporary directory. Its processes run on this venv's interpreter with the
tree first on `PYTHONPATH` and as their working directory, and in pure Python
(`FXENGINE_NO_EXTENSIONS=1`: the archive holds no compiled extension). The venv's editable
install of this checkout sits behind `PYTHONPATH` (its finder is appended to
`sys.meta_path`); `imported_from` proves it, with the exact environment the processes get.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.workers import ROOT

# The commit of the previous release. Bump at each release.
PREVIOUS_RELEASE = "31e2dcf"


@dataclass(frozen=True)
class Tree:
    """A source tree whose processes the test starts: this checkout, or an older commit."""

    label: str  # "old" or "new", as reports name it
    root: Path
    env: dict[str, str] = field(default_factory=dict)  # what its processes add to the environment

    def __repr__(self) -> str:
        return f"<Tree {self.label} {self.root}>"

    def environment(self, extra: dict[str, str]) -> dict[str, str]:
        """The environment of one of its processes: no inherited `FX_` variable, no other
        tree on the path, then `extra`, then the tree's own."""
        base = {k: v for k, v in os.environ.items()
                if not k.startswith("FX_") and k not in ("REDIS_URL", "AI_GATEWAY_API_KEY", "PYTHONPATH")}
        return {**base, **extra, **self.env, "PYTHONPATH": str(self.root)}


def current_tree() -> Tree:
    return Tree("new", ROOT)


def _git(*args: str) -> bytes:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True).stdout


@contextmanager
def materialise(ref: str = PREVIOUS_RELEASE) -> Iterator[Tree]:
    """`ref`'s tree in a temporary directory, removed afterwards."""
    try:
        commit = _git("rev-parse", "--verify", f"{ref}^{{commit}}").decode().strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        raise RuntimeError(f"the previous release {ref} is not in this git checkout (a shallow clone? "
                           f"fetch it: git fetch --unshallow): {exc}") from exc
    root = Path(tempfile.mkdtemp(prefix=f"fx-release-{ref}-"))
    try:
        archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", "--format=tar", commit], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(root)], stdin=archive.stdout, check=True)
        assert archive.stdout is not None and archive.wait() == 0, f"git archive {commit} failed"
        archive.stdout.close()
        yield Tree("old", root, {"FXENGINE_NO_EXTENSIONS": "1"})
    finally:
        shutil.rmtree(root, ignore_errors=True)


def imported_from(tree: Tree) -> dict[str, str]:
    """The files `fxworker`, `fxengine` and the agents module load from in a process started
    as the tree's processes are (same interpreter, environment and working directory)."""
    probe = ("import json, fxworker, fxengine, tests.chaos.agents as a; "
             "print(json.dumps({'fxworker': fxworker.__file__, 'fxengine': fxengine.__file__, 'agents': a.__file__}))")
    out = subprocess.run([sys.executable, "-c", probe], env=tree.environment({"REDIS_URL": "redis://127.0.0.1:9/0"}),
                         cwd=tree.root, check=True, capture_output=True, timeout=60)
    return dict(json.loads(out.stdout.decode().strip().splitlines()[-1]))
