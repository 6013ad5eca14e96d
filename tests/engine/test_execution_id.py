"""`ctx.execution_id` is scoped to the session: two sessions running turns of one message id
(the caller picks turn ids) hand their tools different ids, so a downstream service that
deduplicates on it never merges their calls; one session keeps its id on every rerun."""

from __future__ import annotations

from typing import Any

from fxengine import tool
from fxengine.testing import Reply, ScriptedModel, text, tool_call
from fxengine.tools.runner import execution_id

from .conftest import run


async def test_two_sessions_with_one_turn_id_get_different_execution_ids(model: ScriptedModel, make_engine: Any) -> None:
    seen: list[tuple[str | None, str]] = []

    @tool(idempotent=False)
    def charge(amount: int, ctx: Any) -> str:
        """Charges an amount."""
        seen.append((ctx.session_id, ctx.execution_id))
        return "charged"

    for session_id in ("fxs_A", "fxs_B"):
        model.script(Reply(tool_call("call_1", "charge", {"amount": 5})), Reply(text("done")))
        engine = await make_engine(tools=[charge], session_id=session_id)
        await run(engine.prompt("charge 5", turn_id="same-message-id"))
    assert seen == [("fxs_A", "fxs_A:same-message-id:1:call_1"), ("fxs_B", "fxs_B:same-message-id:1:call_1")]
    assert seen[0][1] != seen[1][1]


def test_an_engine_alone_keeps_the_turn_scoped_form() -> None:
    assert execution_id(None, "t1", 2, "c") == "t1:2:c"
    assert execution_id("fxs_A", "t1", 2, "c") == "fxs_A:t1:2:c"
