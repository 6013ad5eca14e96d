"""The protocol declared once (fxworker/protocol.py): control lines built by their
functions, the turn-end body, and store marks the store does not know refused."""

from __future__ import annotations

import pytest

from fxworker import protocol
from fxworker.store._replies import encode_marks


def test_the_turn_end_body_has_usage_always_and_error_only_when_there_is_one() -> None:
    assert protocol.end_body("end_turn", None, None) == {"stopReason": "end_turn", "usage": {}}
    assert protocol.end_body("error", {"inputTokens": 3}, {"code": "FX_X", "message": "m"}) == {
        "stopReason": "error", "usage": {"inputTokens": 3}, "error": {"code": "FX_X", "message": "m"}}
    line = protocol.turn_end("m1", protocol.end_body("cancelled", {}, None))
    assert line == {"type": "turn_end", "messageId": "m1", "stopReason": "cancelled", "usage": {}}


def test_control_lines_have_their_type_and_message_id() -> None:
    lines = [protocol.turn_start("m1", "s1", "hi"), protocol.turn_resume("m1", "s1", interrupted=True, retract=[2]),
             protocol.turn_yield("m1"), protocol.turn_pause("m1", [], at_ms=5),
             protocol.session_error("m1", {"code": "FX_X", "message": "m"}, "m1")]
    assert [line["type"] for line in lines] == ["turn_start", "turn_resume", "turn_yield", "turn_pause", "session_error"]
    assert all(line["messageId"] == "m1" for line in lines)
    assert protocol.turn_resume("m1", "s1", interrupted=False) == {
        "type": "turn_resume", "messageId": "m1", "sessionId": "s1", "interrupted": False}
    assert set(protocol.CONTROL_LINE_TYPES) == {"turn_start", "turn_resume", "turn_yield", "turn_pause", "turn_end",
                                                "session_error", "delegate_start", "delegate_end"}
    start = protocol.delegate_start("m1", call_id="c1", session_id="s2", agent="billing", child_message_id="d1",
                                    depth=1)
    assert start == {"type": "delegate_start", "messageId": "m1", "callId": "c1", "sessionId": "s2",
                     "agent": "billing", "childMessageId": "d1", "depth": 1}
    end = protocol.delegate_end("m1", call_id="c1", session_id="s2", agent="billing", stop_reason="error",
                                usage={"inputTokens": 3}, error={"code": "FX_DELEGATION_DEPTH", "message": "m"})
    assert end["stopReason"] == "error" and end["usage"] == {"inputTokens": 3}
    assert end["error"] == {"code": "FX_DELEGATION_DEPTH", "message": "m"}
    assert "error" not in protocol.delegate_end("m1", call_id="c1", session_id="s2", agent="b", stop_reason="end_turn",
                                                usage={})


def test_a_mark_the_store_does_not_know_is_refused_where_it_is_written() -> None:
    assert encode_marks([{"start": "m1"}, {"end": True}, protocol.drop("m2")]) == [
        ("start", "m1"), ("end", "1"), ("drop", "m2")]
    with pytest.raises(ValueError, match="unknown store mark 'ends'"):
        encode_marks([{"ends": True}])


def test_an_outcome_is_its_name() -> None:
    assert protocol.Outcome.YIELDED == "yielded" and f"{protocol.Outcome.DONE}" == "done"
