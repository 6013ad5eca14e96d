"""The workers' operations: take the lease, write fenced, renew, release, checkpoint, and
follow the inbox while a turn runs.

Each plan sits beside the parser of its replies; `WorkerOperations` declares them for
`RedisStore` and `store.sync`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fxengine.codes import Code
from fxengine.errors import FxFencedError, FxJournalError, FxLimitError
from fxengine.persistence import JournalRecord, StoredCheckpoint

from .. import scripts
from ..errors import FxStoreUnavailableError, FxUnknownSessionError
from ..scripts import Step
from . import _packed
from . import _replies as r
from ._core import UNCHECKED, Op, RecordLike, StoreCore, Unchecked, one_call
from .types import (
    CHECKPOINT_MAX_BYTES,
    Appended,
    Claim,
    LAYOUT_LEVEL,
    Idle,
    Input,
    Mark,
    Newer,
    OpenTurn,
    Released,
    Serving,
    StoreRecord,
    Unserved,
)

# The most inbox entries one `watch_inboxes` read returns per session: a session with a
# longer queue is read a page a poll, each poll continuing after the last entry handed on.
INBOX_PAGE_ENTRIES = 256


def _claim(
    core: StoreCore, session_id: str, *, holder: str, lease_ms: int, now_ms: int | None = None,
    only_work: bool = False, serving: Serving | None = None, reads: int | None = LAYOUT_LEVEL,
) -> Op[Claim | Idle | Unserved | Newer | None]:
    """Takes the lease when none is live (none held, or expired by `now_ms`).

    Returns None when another holder's lease stands. The epoch goes up by one; the
    `Claim` carries the checkpoint, the records after it, the pending inputs, the open
    turn and the cut-off and death counts. With `only_work`, a session with no turn
    open, no input waiting and no lease held is left as it is: `Idle`, epoch unchanged.
    With `serving`, a session owned by an agent not in `serving.agents` is left as it
    is too (`Unserved`, its wakes backing off) until it waited `serving.give_up_ms`;
    then it is claimed with `Claim.give_up` set, to end its inputs. Raises
    `FxSessionIncompleteError` for a session with a key gone.
    """
    if lease_ms <= 0:
        raise ValueError(f"lease_ms must be positive, got {lease_ms}")
    call = scripts.claim(
        core.keys(session_id), holder=holder, lease_ms=int(lease_ms), now_ms=core.now(now_ms), only_work=only_work,
        agents=serving.agents if serving else (), give_up_ms=serving.give_up_ms if serving else 0,
        retry_max_ms=serving.retry_max_ms if serving else 0, outage_ms=core.outage_ms, reads=reads,
    )
    steps: list[Step] = [call, *core.ack_steps()]

    def parse(replies: list[Any]) -> Claim | Idle | Unserved | Newer | None:
        claimed = _claimed(replies[0], session_id=session_id, holder=holder)
        if isinstance(claimed, Claim) and len(replies) > 1:
            # A claim only one node has can be lost in a failover, and the next claim on
            # the promoted node would hand out the same epoch again: not acted on until
            # the store's ack level holds it (the same holder's retry answers this epoch).
            core.check_ack(replies[1:], f"the claim of session {session_id}")
        return claimed

    return Op(steps, parse)


def _claimed(reply: list[Any], *, session_id: str, holder: str) -> Claim | Idle | Unserved | Newer | None:
    word = reply[0]
    if word == b"held":
        return None
    if word == b"newer":
        return Newer(int(reply[1]))
    if word == b"idle":
        return Idle(int(reply[1]), r.text(reply[2]))
    if word == b"unserved":
        return Unserved(r.text(reply[1]), int(reply[2]), int(reply[3]), bool(reply[4]))
    if word == b"unknown":
        raise FxUnknownSessionError(f"no session {session_id}")
    if word == b"incomplete":
        raise r.incomplete(session_id, reply[1])
    (_, epoch, expires, agent, has_ckpt, ckpt_data, through, flat_records, head, waiting, turn, yielded,
     cutoffs, deaths, cancel, ui, taken, inbox, turn_input, turn_cursor, give_up, futile) = reply
    cancel_target = r.text(cancel)
    records = [
        JournalRecord(r.text(flat_records[i]), bytes(flat_records[i + 1])) for i in range(0, len(flat_records), 2)
    ]
    # The lease is taken by now: a checkpoint that does not decode rides in the claim, for
    # the runner to end what heads the session with it, instead of failing every claim.
    checkpoint, unreadable = None, None
    if has_ckpt:
        try:
            checkpoint = StoredCheckpoint(_packed.unpack_checkpoint(bytes(ckpt_data), session_id=session_id),
                                          str(through))
        except FxJournalError as exc:
            unreadable = exc
    open_id = r.text(turn)
    open_turn = None
    if open_id:
        open_turn = OpenTurn(
            message_id=open_id,
            yielded=bool(yielded),
            input=r.parse_input(turn_input, cancel_target=cancel_target) if turn_input else None,
        )
    return Claim(
        session_id=session_id,
        holder=holder,
        epoch=int(epoch),
        lease_expires_ms=int(expires),
        agent=r.text(agent),
        checkpoint=checkpoint,
        records=records,
        head=str(head) if int(head) else None,
        pending=[r.parse_input(e, cancel_target=cancel_target) for e in waiting if e],
        open_turn=open_turn,
        cutoffs=int(cutoffs),
        deaths=int(deaths),
        cancel_requested=bool(open_id) and cancel_target == open_id,
        ui_cursor=int(ui),
        taken_over=bool(taken),
        inbox_cursor=int(inbox),
        turn_cursor=int(turn_cursor),
        give_up=bool(give_up),
        futile=int(futile),
        unreadable=unreadable,
    )


def _append(
    core: StoreCore, session_id: str, epoch: int, *, records: Sequence[RecordLike] = (),
    lines: Sequence[Mapping[str, object]] = (), marks: Sequence[Mark] = (),
    expected: str | None | Unchecked = UNCHECKED,
    durable: bool = False, now_ms: int | None = None, idempotency_key: str | None = None,
    release: bool = False, checkpoint: bytes | None = None, pack_after: tuple[int, Sequence[str]] | None = None,
) -> Op[Appended]:
    """The fenced write: log records (with their marks), store marks and UI lines, in one call.

    Raises `FxLeaseLostError` and stores nothing when `epoch` no longer holds a live
    lease. `records` are `(idempotency_key, data, marks)` (or `StoreRecord`); a
    repeated key returns what the first call stored and stores nothing. `lines` get
    `epoch` and `cursor` added. `marks` without a record: `{"drop": id}` consumes an
    input no turn takes, `{"end": True}` closes the open turn. `expected` (a cursor or
    None) refuses with `FxFencedError` unless it is the log head. `durable=True`
    also waits for the store's `ack` level. `idempotency_key` keys a call without
    records (a line-only flush): repeated, it returns the first call's line cursors
    (`repeated=True`) and stores nothing. The session keeps its newest such key only
    (a writer retries a call before its next one); compaction drops it once a later
    record is covered. `release=True` also lets the session go in the same call, as
    `release()` does, when the call leaves no turn open and no input waiting
    (`Appended.released`); otherwise the lease stays held.

    With `release=True`, two more things go only if the session does (§5 "Packed at
    rest"): `checkpoint` (<= 4 MiB, the conversation through this call's last record)
    replaces the log, and `pack_after` = (first cursor, texts) — the lines this writer
    stored before this call, from that cursor on, as `Appended.texts` gave them — has
    them and this call's lines packed into chunks, if the stream holds exactly those
    (`Appended.packed` lines). `Appended.texts` are this call's lines as sent.
    """
    keys = core.keys(session_id)
    if idempotency_key is not None and (records or not idempotency_key):
        raise ValueError("idempotency_key= keys a call without records (its records carry their own keys)")
    encoded = []
    record_marks: Sequence[Mark]
    for record in records:
        if isinstance(record, StoreRecord):
            key, data, record_marks = record.idempotency_key, record.data, record.marks
        else:
            key, data, record_marks = record
        encoded.append((key, bytes(data), r.dumps(list(record_marks)), r.encode_marks(record_marks)))
    shown = None if isinstance(expected, Unchecked) else expected
    store_marks = r.encode_marks(marks)
    sent = [r.encode_line(line) for line in lines]
    texts = [text for text, _ in sent]
    marks_out: list[tuple[str, str | bytes]] = list(store_marks)
    if release:  # not an engine's marks: only these arguments send them
        marks_out.append(("release", session_id))
        if checkpoint is not None and records and len(checkpoint) <= CHECKPOINT_MAX_BYTES:
            marks_out.append(("checkpoint", _packed.pack_checkpoint(bytes(checkpoint))))
        if pack_after is not None:
            first, earlier = pack_after
            packs = _packed.pack_lines(session_id, int(epoch), first, [*earlier, *texts])
            marks_out += [("pack", chunk) for chunk in packs]
    elif checkpoint is not None or pack_after is not None:
        raise ValueError("checkpoint= and pack_after= go with release=True")
    call = scripts.append(
        keys, epoch=int(epoch), now_ms=core.now(now_ms), ttl_ms=core.ttl_ms,
        expected=shown, check_expected=not isinstance(expected, Unchecked),
        records=encoded, marks=marks_out, lines=sent,
        call_key=idempotency_key or "", ready=core.index if release and not core.cluster else None,
    )
    steps: list[Step] = [call]
    if durable:
        steps += core.ack_steps()

    def parse(replies: list[Any]) -> Appended:
        appended = _appended(replies[0], session_id=session_id, epoch=int(epoch), expected=shown, texts=texts)
        if len(replies) > 1:
            core.check_ack(replies[1:], f"a record of session {session_id}")
        return appended

    return Op(steps, parse)


def _appended(
    reply: list[Any], *, session_id: str, epoch: int, expected: str | None, texts: list[str]
) -> Appended:
    word = reply[0]
    if word == b"ok":
        _, head, cursors, first, last, repeated, released, packed = reply
        return Appended(
            records=[r.text(c) for c in cursors],
            lines=list(range(int(first), int(last) + 1)),
            head=str(head) if int(head) else None,
            repeated=bool(repeated),
            released=bool(released),
            texts=texts,
            packed=int(packed),
        )
    if word == b"fenced":
        raise r.fenced(session_id, epoch, reply)
    if word == b"conflict":
        head = int(reply[1]) or None
        raise FxFencedError(f"another engine appended to session {session_id}: expected {expected}, head {head}")
    raise FxStoreUnavailableError(f"unexpected append reply {reply!r}")


def _renew(core: StoreCore, session_id: str, epoch: int, *, lease_ms: int, now_ms: int | None = None) -> Op[int]:
    """Extends the lease to `now_ms + lease_ms` and returns that; `FxLeaseLostError` if it is gone."""
    call = scripts.renew(core.keys(session_id), epoch=int(epoch), lease_ms=int(lease_ms), now_ms=core.now(now_ms))

    def parse(replies: list[Any]) -> int:
        reply = replies[0]
        if reply[0] == b"ok":
            return int(reply[1])
        raise r.fenced(session_id, int(epoch), reply)

    return Op([call], parse)


def _release(
    core: StoreCore, session_id: str, epoch: int, *, cutoff: bool = False, now_ms: int | None = None,
    newer: int | None = None, input_at_rest: bool = False,
) -> Op[Released]:
    """Lets the session go. `cutoff=True` counts one more deadline cut-off of the open step (§6);
    `newer`: the holder met a stored layout it cannot read, so only a process reading that
    level claims the session next (nothing of it is ended); `input_at_rest`: a parked
    turn's input may wait in `rest` (release.lua), which only processes reading stored
    layout 2 read."""
    call = scripts.release(
        core.keys(session_id), epoch=int(epoch), cutoff=cutoff, now_ms=core.now(now_ms), ttl_ms=core.ttl_ms,
        ready=None if core.cluster else core.index, session_id=session_id, newer=newer,
        input_at_rest=input_at_rest,
    )

    def parse(replies: list[Any]) -> Released:
        reply = replies[0]
        if reply[0] == b"ok":
            return Released(released=bool(reply[1]), cutoffs=int(reply[2]), pending=int(reply[3]))
        raise r.fenced(session_id, int(epoch), reply)

    return Op([call], parse)


def _save_checkpoint(
    core: StoreCore, session_id: str, epoch: int, *, through: str | None, data: bytes, now_ms: int | None = None
) -> Op[int]:
    """Stores a checkpoint (<= 4 MiB) covering the log through `through`, trims the
    covered records and returns the log's remaining length. Fenced like `append`."""
    keys = core.keys(session_id)
    if len(data) > CHECKPOINT_MAX_BYTES:
        raise FxLimitError(f"a checkpoint is limited to {CHECKPOINT_MAX_BYTES} bytes", code=Code.JOURNAL_TOO_LARGE)
    call = scripts.save_checkpoint(
        keys, epoch=int(epoch), now_ms=core.now(now_ms), through=int(through or 0),
        data=_packed.pack_checkpoint(bytes(data)),
        max_bytes=CHECKPOINT_MAX_BYTES, ttl_ms=core.ttl_ms,
    )

    def parse(replies: list[Any]) -> int:
        reply = replies[0]
        word = reply[0]
        if word == b"ok":
            return int(reply[2])
        if word == b"fenced":
            raise r.fenced(session_id, int(epoch), reply)
        if word == b"too_large":
            raise FxLimitError(f"a checkpoint is limited to {reply[1]} bytes", code=Code.JOURNAL_TOO_LARGE)
        if word == b"bad_through":
            raise ValueError(f"checkpoint through must lie between the stored one ({reply[2]}) and the head ({reply[1]})")
        raise FxStoreUnavailableError(f"unexpected checkpoint reply {reply!r}")

    return Op([call], parse)


def _watch_inbox(
    core: StoreCore, session_id: str, after: int, *, block_ms: int | None = 1000, count: int | None = None
) -> Op[list[Input]]:
    """Inbox entries (prompts, steers, cancels) after seq `after`, blocking up to `block_ms`.

    A running worker follows this from `Claim.inbox_cursor` to see steers and cancels
    within a second.
    """
    step = core.xread(core.keys(session_id).inbox, int(after), block_ms=block_ms, count=count)
    return Op([step], lambda replies: _inputs(replies[0]), read=True, blocks=bool(block_ms))


def _watch_inboxes(core: StoreCore, after: Mapping[str, int]) -> Op[dict[str, list[Input]]]:
    """The inbox entries after `after[sid]` of each session, in one round trip (a
    pipeline of one XREAD each); sessions with nothing new are left out. Each session's
    read returns at most `INBOX_PAGE_ENTRIES` entries."""
    sids = list(after)
    steps: list[Step] = [
        core.xread(core.keys(sid).inbox, int(after[sid]), block_ms=None, count=INBOX_PAGE_ENTRIES) for sid in sids
    ]

    def parse(replies: list[Any]) -> dict[str, list[Input]]:
        return {sid: found for sid, reply in zip(sids, replies) if (found := _inputs(reply))}

    return Op(steps, parse, read=True)


def _inputs(reply: object) -> list[Input]:
    """The inbox entries of one XREAD reply."""
    out = []
    for seq, fields in r.parse_stream(reply):
        flat: list[object] = [seq]
        for name, value in fields.items():
            flat += [name, value]
        out.append(r.parse_input(flat))
    return out


class WorkerOperations:
    """The workers' operations of `RedisStore` (awaitable) and `store.sync` (blocking)."""

    claim = one_call(_claim)
    append = one_call(_append)
    renew = one_call(_renew)
    release = one_call(_release)
    save_checkpoint = one_call(_save_checkpoint)
    watch_inbox = one_call(_watch_inbox)
    watch_inboxes = one_call(_watch_inboxes)
