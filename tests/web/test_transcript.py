"""What `fx prompt` and `fx tail` print for stream lines (`fxworker.web.client.Transcript`).

The end-to-end runs are in test_cli.py (a worker killed mid-stream, a retract seen by both
commands); these feed the lines a failed delivery and a retracted step store, one by one.
"""

from __future__ import annotations

from fxworker.web.client import Transcript


def test_a_turn_that_could_not_open_prints_its_session_error_and_its_end() -> None:
    error = {"code": "FX_MODEL_UNKNOWN", "message": "no model 'nope' in the catalog"}
    lines = [
        {"type": "session_error", "messageId": "msg_1", "cursor": 4, "code": error["code"], "message": error["message"]},
        {"type": "turn_end", "messageId": "msg_1", "cursor": 5, "stopReason": "error", "usage": {}, "error": error},
    ]
    transcript = Transcript()
    printed = "".join(transcript.feed(line) for line in lines)
    assert printed == (
        "\n[FX_MODEL_UNKNOWN: no model 'nope' in the catalog]\n"
        "\n[error: FX_MODEL_UNKNOWN no model 'nope' in the catalog]\n"
    )


def test_a_retracted_step_is_withdrawn_and_the_turn_so_far_printed_again() -> None:
    turn = "msg_2"
    transcript = Transcript()
    printed = [
        transcript.feed({"type": "turn_start", "messageId": turn, "input": "hi"}),
        transcript.feed({"type": "text_delta", "messageId": turn, "step": 1, "delta": "partial "}),
        transcript.feed({"type": "turn_resume", "messageId": turn, "interrupted": True, "retract": [1]}),
        transcript.feed({"type": "text_delta", "messageId": turn, "step": 1, "delta": "whole answer"}),
    ]
    assert printed[2] == (
        "\n[resumed after an interruption]\n"
        "[cut off: the output of step 1 above is withdrawn and reruns; the turn so far:]\n"
        "> hi\n"
    )
    # Below the marker, the turn as it stands: the prompt and the rerun's text only.
    assert printed[2].split("the turn so far:]\n")[1] + printed[3] == "> hi\nwhole answer"


def test_a_retract_of_a_step_that_printed_nothing_needs_no_marker() -> None:
    transcript = Transcript()  # a tail that started after the cut-off step's text
    resumed = transcript.feed({"type": "turn_resume", "messageId": "msg_3", "interrupted": True, "retract": [1]})
    assert resumed == "\n[resumed after an interruption]\n"


def test_a_turn_waiting_on_delegated_agents_names_them_and_is_not_a_pause_for_a_person() -> None:
    turn, child = "msg_3", "fxs_01J0000000000000000000000C"
    transcript = Transcript()
    approval = {"type": "approval_request", "messageId": turn, "id": "c1", "name": "billing", "kind": "external",
                "input": {"input": "refund 5"}, "step": 1}
    start = {"type": "delegate_start", "messageId": turn, "callId": "c1", "sessionId": child, "agent": "billing",
             "childMessageId": "dlg_1", "depth": 1}
    pause = {"type": "turn_pause", "messageId": turn, "pendingCalls": [{"id": "c1"}]}
    end = {"type": "delegate_end", "messageId": turn, "callId": "c1", "sessionId": child, "agent": "billing",
           "stopReason": "end_turn", "usage": {}}
    printed = [transcript.feed(line) for line in (approval, start, pause, end)]
    assert printed[1] == f"⇒ billing in session {child} (fx tail {child})\n"
    assert printed[2] == "\n[waiting for the delegated agents' turns]\n" and transcript.delegated_only(pause)
    assert printed[3] == "⇐ billing ended end_turn\n"
    person = {"type": "turn_pause", "messageId": turn, "pendingCalls": [{"id": "c1"}, {"id": "c2"}]}
    assert not transcript.delegated_only(person) and "fx approve" in transcript.feed(person)
