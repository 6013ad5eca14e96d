"""The README's typed-answer example (`tickets.py`) runs as written and mypy types its
`result.output` as the model: no Redis (the turn runs in the script's process, the
embedded mode) and no key (a scripted model over loopback as AI Gateway)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.deploy.test_docs import _block

ROOT = Path(__file__).resolve().parents[2]


def _responder(request: Any) -> Any:
    """The model's first answer misses `priority` (refused, sent back with the error); its
    second is a valid `Ticket`."""
    from fxengine.testing.script import Reply, tool_call, usage

    messages = request.body["messages"]
    if messages[-1]["role"] == "tool":
        return Reply(tool_call("call_2", "final_result", {"category": "shipping", "priority": 1,
                                                         "summary": "Parcel two weeks late, needed by Friday"}),
                     usage(40, 20))
    return Reply(tool_call("call_1", "final_result", {"category": "shipping", "summary": "late parcel"}), usage(30, 12))


def test_the_readme_typed_script_runs_as_written(tmp_path: Path) -> None:
    """`tickets.py` as written: the model is offered `final_result` with the Ticket's schema
    (AI Gateway without a catalog: tool mode), its invalid first answer goes back with the
    validation error, and the script prints the validated Ticket's fields."""
    from fxengine.testing import ScriptedModel

    (tmp_path / "tickets.py").write_text(_block("README.md", "# tickets.py"))
    with ScriptedModel() as model:
        model.responder = _responder
        done = subprocess.run([sys.executable, "tickets.py"], cwd=tmp_path, capture_output=True, text=True, timeout=30,
                              env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "AI_GATEWAY_API_KEY": "test-key",
                                   "AI_GATEWAY_BASE_URL": model.base_url})
        requests = model.requests
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "shipping 1 Parcel two weeks late, needed by Friday", done.stdout
    assert len(requests) == 2
    [tool] = [t for t in requests[0].body["tools"] if t["function"]["name"] == "final_result"]
    assert tool["function"]["parameters"]["required"] == ["category", "priority", "summary"]
    retry = requests[1].body["messages"][-1]
    assert retry["role"] == "tool" and "priority" in retry["content"] and "Field required" in retry["content"]
    assert "response_format" not in requests[0].body


def test_mypy_types_the_readme_output_as_the_model(tmp_path: Path) -> None:
    """mypy --strict takes `tickets.py` as written (it reads `result.output.priority`, which
    it could not on an untyped output) and reveals `result.output` as `Ticket | None`;
    a misuse of the field's type is an error."""
    source = _block("README.md", "# tickets.py")
    body = source.replace("\nasyncio.run(main())", "")
    (tmp_path / "tickets.py").write_text(source)
    (tmp_path / "probe.py").write_text(body + "\n".join([
        "",
        "async def probe() -> None:",
        "    result = await (await triager.session().prompt('x')).result()",
        "    reveal_type(result.output)",
        "    wrong: str = result.output.priority if result.output is not None else ''",
        "",
    ]))
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "tickets.py", "probe.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "MYPYPATH": str(ROOT)})
    out = done.stdout
    assert 'Revealed type is "probe.Ticket | None"' in out, out
    assert "probe.py:" in out and 'Incompatible types in assignment (expression has type "int | str"' in out, out
    assert "tickets.py" not in out, out  # the README's script itself is clean
