"""The docs cannot drift from the code: every fenced block of the README, docs/ and
DEVELOPERS.md is checked — Python compiles (top-level `await` allowed), an agents module
runs as written, and every shell line that calls `fx`, `make`, `pip install` or
`docker compose` names a command, option, target, extra or file that exists."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import click
import pytest

from fxworker.cli import main as fx_main

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "DEVELOPERS.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(kind: str) -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for n, match in enumerate(FENCE.finditer(doc.read_text())):
            if match.group(1) == kind:
                found.append((f"{doc.relative_to(ROOT)}#{n}", match.group(2)))
    return found


@pytest.mark.parametrize(("where", "source"), blocks("python"))
def test_python_blocks_compile(where: str, source: str) -> None:
    compile(source, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


@pytest.mark.parametrize(("where", "source"), [b for b in blocks("python") if b[1].startswith("# myapp/agents.py")])
def test_an_agents_module_of_the_docs_runs_as_written(where: str, source: str, tmp_path: Path) -> None:
    if "orders." in source or "payments." in source:
        pytest.skip(f"{where} calls the reader's own services")
    (tmp_path / "agents_doc.py").write_text(source + "\nfrom fxworker import agents\nprint(sorted(agents()))\n")
    done = subprocess.run([sys.executable, "agents_doc.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "support" in done.stdout


def _shell_commands() -> list[tuple[str, list[str]]]:
    commands = []
    for where, source in blocks("sh") + blocks("bash") + blocks("console"):
        for raw in source.splitlines():
            line = raw.split(" #", 1)[0].strip()
            if not line or line.startswith("#"):
                continue
            for part in re.split(r"\s*(?:&&|&|;|\|)\s*", line):
                try:
                    words = shlex.split(part)
                except ValueError:
                    continue
                while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
                    words = words[1:]  # VAR=value prefixes
                if words and words[0] == "export":
                    continue
                if words:
                    commands.append((where, words))
    return commands


def _makefile_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


def _extras() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


@pytest.mark.parametrize(("where", "words"), _shell_commands(), ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_shell_lines_name_what_exists(where: str, words: list[str]) -> None:
    command = words[0]
    if command == "fx":
        sub = fx_main.commands.get(words[1]) if len(words) > 1 else None
        assert sub is not None, f"{where}: fx has no command {words[1:2]}"
        known = {opt for p in sub.params if isinstance(p, click.Option) for opt in p.opts + p.secondary_opts}
        for word in words[2:]:
            if word.startswith("--"):
                assert word.split("=", 1)[0] in known, f"{where}: fx {words[1]} has no option {word}"
    elif command == "make":
        assert set(w for w in words[1:] if "=" not in w) <= _makefile_targets(), f"{where}: {words}"
    elif command == "pip" and words[1:2] == ["install"]:
        for word in words[2:]:
            for extra in re.findall(r"fxworker\[([\w,]+)\]", word):
                assert set(extra.split(",")) <= _extras(), f"{where}: no extra {extra}"
    elif command == "docker" and "-f" in words:
        assert (ROOT / words[words.index("-f") + 1]).is_file(), f"{where}: {words}"


def _block(doc: str, first_line: str, *, without: str = "\0") -> str:
    sources = [source for where, source in blocks("python")
               if where.startswith(doc + "#") and source.startswith(first_line) and without not in source]
    assert len(sources) == 1, f"{doc}: expected one block starting {first_line!r}, found {len(sources)}"
    return sources[0]


def test_the_readme_script_runs_its_turn_without_redis(tmp_path: Path) -> None:
    """The README's `myapp/agents.py` and `main.py`, as written, with no `REDIS_URL`: the
    turn runs in the script's own process (the embedded worker) against a scripted model
    over loopback (`AI_GATEWAY_BASE_URL`), and ends `end_turn` within 10 s."""
    from fxengine.testing import ScriptedModel
    from fxengine.testing.script import Reply, text, tool_call

    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "agents.py").write_text(_block("README.md", "# myapp/agents.py", without="orders."))
    (tmp_path / "main.py").write_text(_block("README.md", "# main.py"))
    with ScriptedModel() as model:
        model.script(Reply(tool_call("c1", "get_order", {"id": "42"})), Reply(text("Order 42 has shipped.")))
        done = subprocess.run([sys.executable, "main.py"], cwd=tmp_path, capture_output=True, text=True, timeout=10,
                              env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "AI_GATEWAY_API_KEY": "test-key",
                                   "AI_GATEWAY_BASE_URL": model.base_url})
        requests = model.requests
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1:] == ["end_turn"], done.stdout
    assert "Order 42 has shipped." in done.stdout
    assert len(requests) == 2, "the tool's result went back to the model"
    assert "order 42: shipped" in str(requests[1].body)
