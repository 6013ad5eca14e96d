"""The README's delegation example (a triage agent handing work to a billing agent) runs as
written, and examples/delegation.py is that example, runnable offline: no Redis (both
turns run in the script's process, the embedded mode) and no key (a scripted model)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.deploy.test_docs import _block

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "delegation.py"
BILLING_ANSWER = "Order 42 was paid on 3 March (billing checked invoice 42.00 EUR)."


def _answers(stdout: str) -> tuple[str, str]:
    """Billing's answer (the result of triage's `billing` call, as the script prints it) and
    triage's final answer (the text printed after it)."""
    lines = stdout.splitlines()
    [index] = [i for i, line in enumerate(lines) if line.startswith("[billing] ")]
    return lines[index][len("[billing] "):], "\n".join(lines[index + 1:-1])


def _responder(request: Any) -> Any:
    """triage calls `billing` with the question, then quotes its result; billing calls
    `get_invoice`, then answers `BILLING_ANSWER`."""
    from fxengine.testing.script import Reply, text, tool_call, usage

    messages = request.body["messages"]
    tools = {t["function"]["name"] for t in request.body.get("tools") or []}
    last = messages[-1]
    content = last["content"] if isinstance(last["content"], str) else json.dumps(last["content"])
    if "billing" in tools:
        if last["role"] == "tool":
            return Reply(text("Triage here. Billing's answer: " + content), usage(30, 9))
        return Reply(tool_call("call_t1", "billing", {"input": content}), usage(20, 5))
    if last["role"] == "tool":
        assert "invoice of order 42" in content
        return Reply(text(BILLING_ANSWER), usage(11, 7))
    return Reply(tool_call("call_b1", "get_invoice", {"order_id": "42"}), usage(10, 4))


def test_the_readme_delegation_script_runs_as_written(tmp_path: Path) -> None:
    """The README's `team.py`, as written, with no `REDIS_URL`: both agents' turns run in
    the script's process against a scripted model over loopback (`AI_GATEWAY_BASE_URL`);
    triage's final answer carries billing's."""
    from fxengine.testing import ScriptedModel

    (tmp_path / "team.py").write_text(_block("README.md", "# team.py"))
    with ScriptedModel() as model:
        model.responder = _responder
        done = subprocess.run([sys.executable, "team.py"], cwd=tmp_path, capture_output=True, text=True, timeout=30,
                              env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "AI_GATEWAY_API_KEY": "test-key",
                                   "AI_GATEWAY_BASE_URL": model.base_url})
        requests = model.requests
    assert done.returncode == 0, done.stderr[-2000:]
    billing, final = _answers(done.stdout)
    assert billing == BILLING_ANSWER, done.stdout
    assert final == "Triage here. Billing's answer: " + BILLING_ANSWER, done.stdout
    assert done.stdout.splitlines()[-1] == "end_turn; billing's turn used {'inputTokens': 21, 'outputTokens': 11}"
    assert len(requests) == 4, "triage, billing, billing after its tool, triage after billing's answer"


def test_the_example_file_is_the_readme_script_and_runs_offline() -> None:
    """examples/delegation.py holds the README's agents and `main` (only the model differs),
    and `python -m examples.delegation` runs with no key and no Redis."""
    readme = _block("README.md", "# team.py")
    body = readme[readme.index("@tool"):readme.index("\nasyncio.run(main())")]
    assert body.replace('model="openai/gpt-4o-mini"', "model=_model_id, provider=_provider") in EXAMPLE.read_text()
    done = subprocess.run([sys.executable, "-m", "examples.delegation"], cwd=ROOT, capture_output=True, text=True,
                          timeout=30, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    billing, final = _answers(done.stdout)
    assert re.fullmatch(r"Yes, the invoice of order 42: .*", billing), done.stdout
    assert billing in final, done.stdout
    assert done.stdout.splitlines()[-1].startswith("end_turn; billing's turn used {'inputTokens': "), done.stdout
