"""The line types are declared once (fxengine/lines.py), and every reader agrees with that list:
the page's `render` has a case for each, and a `Turn` yields every model event."""

from __future__ import annotations

import re
import typing
from pathlib import Path

from fxengine import events, lines
from fxworker.agent import Turn

APP_JS = Path(__file__).resolve().parents[2] / "fxworker" / "web" / "static" / "app.js"


def _declared(union: object) -> set[str]:
    """The `type` literals of the TypedDicts of a union."""
    found = set()
    for member in typing.get_args(union):
        (kind,) = typing.get_args(typing.get_type_hints(member)["type"])
        found.add(kind)
    return found


def test_each_tuple_of_types_is_its_union() -> None:
    assert set(lines.LINE_TYPES) == _declared(lines.Line) and len(lines.LINE_TYPES) == len(set(lines.LINE_TYPES))
    assert set(lines.MODEL_EVENT_TYPES) == _declared(lines.ModelEvent)
    assert set(lines.CONTROL_LINE_TYPES) == _declared(lines.ControlLine)
    marks = {name for member in typing.get_args(lines.Mark) for name in typing.get_type_hints(member)}
    assert set(lines.MARK_NAMES) == marks


def test_the_page_renders_exactly_the_declared_line_types() -> None:
    source = APP_JS.read_text(encoding="utf-8")
    render = re.search(r"^function render\(line\) \{\n(.*?)^\}", source, re.S | re.M)
    assert render is not None, "app.js has no render(line)"
    handled = re.findall(r'^\s*case "([a-z_]+)":', render.group(1), re.M)
    assert len(handled) == len(set(handled)), handled
    assert set(handled) == set(lines.LINE_TYPES)


def test_the_engine_builds_only_declared_events_with_their_declared_keys() -> None:
    built = [events.text_delta("a", 1), events.reasoning_delta("b", 1), events.tool_start("c1", "t", {"x": 1}, 2),
             events.tool_start("c2", "t", "x" * 70_000, 2), events.tool_end("c1", "t", is_error=False, content="ok", step=2),
             events.user_message("steer", "msg_1"),
             events.approval_request({"id": "c3", "executionId": "t:2:c3", "name": "t", "kind": "approval", "step": 2,
                                      "input": {"x": 1}}),
             events.approval_decision("c3", "t", "deny", step=2, by="alice", reason="no", decided_at_ms=1)]
    by_type = {typing.get_args(typing.get_type_hints(m)["type"])[0]: m for m in typing.get_args(lines.ModelEvent)}
    assert {event["type"] for event in built} == set(lines.MODEL_EVENT_TYPES)
    for event in built:
        declared = by_type[event["type"]]
        assert set(event) <= set(typing.get_type_hints(declared)), event
        hints = typing.get_type_hints(declared, include_extras=True)
        required = {key for key, hint in hints.items() if typing.get_origin(hint) is not typing.NotRequired}
        assert required - {"cursor", "epoch"} <= set(event), event


class _Session:
    """What a `Turn` reads: its session's stream."""

    def __init__(self, stored: list[dict[str, object]]) -> None:
        self.id = "fxs_test"
        self._stored = stored

    async def stream(self, cursor: int = 0, *, follow: bool = True) -> typing.AsyncIterator[dict[str, object]]:
        for line in self._stored:
            yield line


async def test_a_turn_yields_every_declared_model_event_and_no_other_line() -> None:
    stored: list[dict[str, object]] = [{"type": "turn_start", "messageId": "m1", "sessionId": "fxs_test", "input": "hi"}]
    stored += [{"type": kind, "messageId": "m1", "step": 1} for kind in lines.MODEL_EVENT_TYPES]
    stored += [{"type": "session_waiting", "messageId": "m1", "noWorker": {"agent": "a", "sinceMs": 1}},
               {"type": "turn_yield", "messageId": "m1"}, {"type": "turn_resume", "messageId": "m1"},
               {"type": "turn_end", "messageId": "m1", "stopReason": "end_turn", "usage": {}}]
    turn = Turn(_Session(stored), message_id="m1", repeated=False, cursor=0)
    assert [event["type"] async for event in turn] == list(lines.MODEL_EVENT_TYPES)
    assert (await turn.result()).stop_reason == "end_turn"
