"""What a turn records: the journal's event kinds, batches and checkpoints.

One `Persistence.append` stores one *batch* (``kind "batch"``): every event produced while
the previous append was in flight, in order. Each event is ``[kind, body]``:

    turn_start     {turn, input: [blocks], atMs}           marks {start: turn}; a barrier
    model_request  {step}                                  a model request is about to be sent
    model_response {step, content, reasoning?, toolCalls: [{id, name, arguments}],
                    finishReason, usage, cut}              cut: steered or cancelled mid-stream
    tool_result    {step, id, name, content, isError, images?}
                                                           also a denial or an external tool's submitted result
    tool_wait      {step, calls: [{id, name, kind}]}       calls of the step that wait for a decision
                                                           (kind "approval" or "external")
    tool_approved  {step, id}                              a waiting call was approved: it runs next
    turn_pause     {}                                      the turn parked until its calls are decided
    accepted       {id, text}                              marks {accepted: id}: a steer joined
    resumed        {interrupted, retract: [step]}          a later engine continued the turn
    turn_yield     {}                                      marks {yield: True}
    output         {step, value} | {step, errors, retry?}  the verdict on a typed answer (`fxengine.output`):
                                                           valid, or invalid with the text the model reads
                                                           (none when a final-result call's result carried it)
    turn_end       {stopReason, usage, error?, output?}    marks {end: True}

Every record's marks also end with ``{step: name}``, where the turn is after it:
``model:<k>`` (its k-th model call, the same name across retries, cut-offs and resumes)
or ``tools:<k>`` (the calls of its k-th response), so a store can count cut-offs of one
step in a row. The batch body is ``{"v": 1, "seq": first_seq, "events": [...]}``, with `v` 2
when it holds an event kind version 1 lacks (`output`): a release that reads only version
1 then refuses the batch as newer (`FxJournalVersionError`), never as damaged, and every
other batch stays readable to it. A checkpoint is ``kind "checkpoint"`` with ``{"v": 1,
"engine", "tools", "model", "state"}``. A `v` above `FORMAT_VERSION` (or a newer codec
version byte) is `FxJournalVersionError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from ..codes import Code
from ..errors import FxJournalError, FxJournalVersionError
from .codec import decode_record, encode_record

FORMAT_VERSION = 2  # the newest batch format read; checkpoints are written as CHECKPOINT_VERSION
CHECKPOINT_VERSION = 1
ENGINE_VERSION = "0.1.0"
CHECKPOINT_MAX_BYTES = 4 * 1024 * 1024

EventKind = Literal[
    "turn_start", "model_request", "model_response", "tool_result", "tool_wait", "tool_approved", "accepted",
    "resumed", "turn_yield", "turn_pause", "turn_end", "output"
]
EVENT_KINDS: frozenset[str] = frozenset(
    ("turn_start", "model_request", "model_response", "tool_result", "tool_wait", "tool_approved", "accepted",
     "resumed", "turn_yield", "turn_pause", "turn_end", "output")
)
# The kinds of batch format 2 (a batch holding one is written as `v` 2).
V2_KINDS: frozenset[str] = frozenset(("output",))
JournalEvent = tuple[str, dict[str, object]]


def _invalid(message: str, raw: bytes) -> FxJournalError:
    error = FxJournalError(message)
    error.raw = raw  # type: ignore[attr-defined]
    return error


def _check_version(body: Mapping[str, object], raw: bytes, what: str, newest: int = FORMAT_VERSION) -> None:
    version = body.get("v")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _invalid(f"{what} has no valid format version", raw)
    if version > newest:
        error = FxJournalVersionError(f"{what} format {version} was written by a newer fxengine (reads {newest})")
        error.raw = raw  # type: ignore[attr-defined]
        raise error


def encode_batch(events: list[JournalEvent], *, seq: int) -> bytes:
    """One append's bytes: the batch of events starting at `seq`."""
    version = 2 if any(kind in V2_KINDS for kind, _ in events) else 1
    return encode_record("batch", {"v": version, "seq": seq, "events": [[k, b] for k, b in events]})


def decode_batch(raw: bytes) -> list[JournalEvent]:
    """The events of one stored record.

    Raises:
        FxJournalVersionError: written by a newer fxengine.
        FxJournalError: not a batch, or an unknown event kind (bytes attached as `.raw`).
    """
    kind, body = decode_record(raw)
    if kind != "batch":
        raise _invalid(f"journal record of kind {kind!r} is not a batch", raw)
    _check_version(body, raw, "journal record")
    events = body.get("events")
    if not isinstance(events, list):
        raise _invalid("journal batch has no events", raw)
    out: list[JournalEvent] = []
    for event in events:
        if not isinstance(event, list) or len(event) != 2 or not isinstance(event[1], dict):
            raise _invalid("journal event is not [kind, body]", raw)
        if event[0] not in EVENT_KINDS:
            raise _invalid(f"unknown journal event {event[0]!r}", raw)
        out.append((event[0], event[1]))
    return out


def encode_checkpoint(*, state: Mapping[str, object], tools: str, model: str) -> bytes:
    """Checkpoint bytes (at most 4 MiB) carrying the engine version, tool-set hash and model."""
    data = encode_record(
        "checkpoint", {"v": CHECKPOINT_VERSION, "engine": ENGINE_VERSION, "tools": tools, "model": model, "state": state}
    )
    if len(data) > CHECKPOINT_MAX_BYTES:
        raise FxJournalError(f"the checkpoint is {len(data)} bytes, over 4 MiB", code=Code.JOURNAL_TOO_LARGE)
    return data


def decode_checkpoint(raw: bytes) -> dict[str, Any]:
    """The checkpoint body ``{v, engine, tools, model, state}``.

    Raises:
        FxJournalVersionError: written by a newer fxengine.
        FxJournalError: not a checkpoint, or over 4 MiB (`FX_JOURNAL_TOO_LARGE`).
    """
    raw = bytes(raw)
    if len(raw) > CHECKPOINT_MAX_BYTES:
        raise FxJournalError(f"the checkpoint is {len(raw)} bytes, over 4 MiB", code=Code.JOURNAL_TOO_LARGE)
    kind, body = decode_record(raw)
    if kind != "checkpoint":
        raise _invalid(f"record of kind {kind!r} is not a checkpoint", raw)
    _check_version(body, raw, "checkpoint", CHECKPOINT_VERSION)
    if not isinstance(body.get("state"), dict):
        raise _invalid("checkpoint has no state", raw)
    return body
