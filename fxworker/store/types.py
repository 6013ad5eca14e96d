"""What the store's calls return: plain frozen records, no behaviour beyond small helpers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from fxengine.errors import FxError
from fxengine.persistence import JournalRecord, Loaded, StoredCheckpoint
from fxengine.persistence import Mark as Mark  # the store's marks are the engine's, plus `drop`

InputKind = Literal["prompt", "steer", "decision"]
InboxKind = Literal["prompt", "steer", "decision", "cancel"]
MessageStatus = Literal["waiting", "running", "done"]
# `paused`: the open turn is parked, its calls wait for decisions (none has come yet).
SessionStatus = Literal["idle", "waiting", "running", "paused"]

# The newest stored layout level this release reads (and the one it writes): journal
# records `FXJ` of fxengine's FORMAT_VERSION, checkpoints `FXZ\x01` (with their CRC),
# line chunks of format 1 (with their checksum), live marks v1; level 2 adds parked turns
# (journal records `tool_wait`, `turn_pause`, `tool_approved`, decision inputs `d` in the
# inbox, meta `paused`/`decided`/`decisions`); level 3 adds delegated turns (an input's
# settings carry the `delegation` link its end answers: a process that ignored it would end
# the turn and never answer the parent); level 4 adds typed turns (an input's settings carry
# the `output` its answer must validate as, and journal batches of format 2 hold `output`
# verdicts: a process that ignored it would end the turn with untyped text). A release
# that writes a layout the previous one cannot read raises it (docs/operations.md,
# "Upgrading").
LAYOUT_LEVEL = 4
PARKED_LEVEL = 2  # what reading parked turns and decisions needs
DELEGATED_LEVEL = 3  # what running a delegated turn needs (meta `newer` while one waits)
TYPED_LEVEL = 4  # what running a typed turn needs (meta `newer` while one waits)

# The limits of docs/design.md §5 and §6, enforced inside the scripts.
CHECKPOINT_MAX_BYTES = 4 * 1024 * 1024
STEER_MAX_BYTES = 64 * 1024
STEER_MAX_QUEUED = 64
STEER_MAX_QUEUED_BYTES = 1024 * 1024
INPUT_MAX_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Accepted:
    """The answer to `accept()`: the input is stored (or was already, `repeated=True`).

    `status` is the input's own: `waiting` (not taken by a turn yet), `running` (its turn is
    open) or `done`. `cursor` is the session's last UI cursor at acceptance: a caller that
    follows the new turn reads from it. `agent` is the session's owner, which differs from
    the caller's agent for a forwarded session. `end_cursor` is the UI cursor of the
    `turn_end` line of a finished prompt, when one was written.
    """

    session_id: str
    message_id: str
    kind: InputKind
    repeated: bool
    status: MessageStatus
    cursor: int
    agent: str
    created: bool
    seq: int
    end_cursor: int | None = None
    # Whether the sender should wake the session now: False while a wake sent for it less
    # than `liveness.SENDER_TRUST_MS` ago is outstanding (it runs this input too), or the
    # input is done (§7: one outstanding wake per session).
    wake: bool = True
    # The session's open turn at acceptance (None: none): the turn a decision resumes.
    turn: str | None = None


@dataclass(frozen=True, slots=True)
class Input:
    """One inbox entry: a prompt, a steer, a decision (`input`: ``{callId, decision, by?}``)
    or a cancel request (whose `message_id` is its target)."""

    seq: int
    kind: InboxKind
    message_id: str
    input: Any = None
    context: Any = None
    settings: Any = None
    accepted_ms: int = 0
    cancelled: bool = False
    unreadable: str | None = None  # why a stored field could not be decoded (the input cannot run)
    traceparent: str | None = None  # the W3C trace context of the request that sent it


@dataclass(frozen=True, slots=True)
class OpenTurn:
    """The turn a session has open: its id (the prompt's message id), whether it yielded, its input."""

    message_id: str
    yielded: bool
    input: Input | None = None


@dataclass(frozen=True, slots=True)
class Claim:
    """Everything a worker needs once it holds a session's lease (`claim()`).

    `records` are the log records after the checkpoint, oldest first; `head` the cursor the
    next append continues (`None`: nothing stored yet). `pending` are the inputs no turn has
    consumed yet, in acceptance order. `cutoffs` counts deadline cut-offs in a row of the
    open turn's step, `deaths` the takeovers of the open turn with no progress between
    (poison-turn detection, §6). `taken_over`: the previous lease expired while held.
    `inbox_cursor` is where `watch_inbox()` continues from. `turn_cursor` is the UI
    cursor of the open turn's `turn_start` line (0 with no turn open, or for a turn
    started before the store kept it): the open turn's lines are read from there.
    """

    session_id: str
    holder: str
    epoch: int
    lease_expires_ms: int
    agent: str
    checkpoint: StoredCheckpoint | None
    records: list[JournalRecord]
    head: str | None
    pending: list[Input]
    open_turn: OpenTurn | None
    cutoffs: int
    deaths: int
    cancel_requested: bool
    ui_cursor: int
    taken_over: bool
    inbox_cursor: int
    turn_cursor: int = 0
    # The owning agent is not among `Serving.agents` and waited for one past
    # `Serving.give_up_ms`: the lease is held only to end the session's inputs FX_NO_AGENT.
    give_up: bool = False
    # Claims (this one included) since an input or a step last moved on (§6: bounded).
    futile: int = 0
    # The stored checkpoint does not decode (FX_JOURNAL_INVALID); `checkpoint` is None. The
    # lease is held all the same: what heads the session ends with this error.
    unreadable: FxError | None = None

    def __repr__(self) -> str:
        return (
            f"<Claim session={self.session_id} epoch={self.epoch} head={self.head} "
            f"records={len(self.records)} pending={len(self.pending)} open={self.open_turn is not None}>"
        )

    def loaded(self) -> Loaded:
        """The engine's view of this claim (`Persistence.load()`); raises `unreadable`,
        so no engine ever starts from a checkpoint it lacks."""
        if self.unreadable is not None:
            raise self.unreadable
        return Loaded(checkpoint=self.checkpoint, journal=list(self.records), head=self.head)


@dataclass(frozen=True, slots=True)
class Serving:
    """What a claim may run: the agents of the claiming process (on this store), how long a
    session may wait for an agent none of them is (`give_up_ms`), and the longest wait
    between two wakes of such a session (`retry_max_ms`)."""

    agents: tuple[str, ...]
    give_up_ms: int
    retry_max_ms: int


@dataclass(frozen=True, slots=True)
class Unserved:
    """`claim(serving=...)` found the session owned by an agent the caller does not run and
    took nothing (lease and epoch unchanged): `agent` owns it, the first such miss since its
    last claim was at `since_ms`, and it should be woken again at `next_ms`."""

    agent: str
    since_ms: int
    next_ms: int
    # Another wake of the session is due at `next_ms` already: drop this one.
    spare: bool = False


@dataclass(frozen=True, slots=True)
class Newer:
    """`claim(reads=...)` found the session let go by a holder that met a stored layout it
    could not read: only a process reading `level` or newer claims it. Nothing was taken."""

    level: int


@dataclass(frozen=True, slots=True)
class Idle:
    """`claim(only_work=True)` found nothing to run (no turn open, no input waiting, no
    lease held) and took no lease: the epoch is unchanged. `agent` owns the session."""

    epoch: int
    agent: str = ""


@dataclass(frozen=True, slots=True)
class Appended:
    """What a fenced `append()` stored: the record cursors and UI line cursors, in order;
    `released`: the call let the session go (`append(release=True)`); `texts`: the call's
    lines as sent (for `pack_after`); `packed`: the lines its release packed."""

    records: list[str]
    lines: list[int]
    head: str | None
    repeated: bool = False
    released: bool = False
    texts: list[str] = field(default_factory=list)
    packed: int = 0


@dataclass(frozen=True, slots=True)
class Released:
    """`release()`: whether this call let the lease go (False: it already was), the cut-off
    count, and how many inputs were still waiting at that moment."""

    released: bool
    cutoffs: int
    pending: int = 0


@dataclass(frozen=True, slots=True)
class SessionState:
    """One consistent snapshot of a session (`state()`)."""

    session_id: str
    agent: str
    status: SessionStatus
    cursor: int
    turns: int
    epoch: int
    open_turn: str | None
    pending: int
    cancel_requested: bool
    lease_holder: str | None
    lease_expires_ms: int | None
    created_ms: int
    last_turn: str | None
    head: str | None
    # Set while a wake found no process running `agent` (since that ms; woken again at next).
    unserved_since_ms: int | None = None
    unserved_next_ms: int | None = None
    # When the wake queued for it was sent, while no delivery has taken that wake (§7).
    woken_ms: int | None = None
    # The layout level a claim must read (a holder let it go for a newer one), else None.
    newer: int | None = None
    # The calls the open turn waits on for a decision, and the decisions no turn took yet.
    paused_calls: tuple[str, ...] = ()
    decisions: int = 0

    @property
    def parked(self) -> bool:
        """The open turn waits for decisions and none has come (nor a cancel): nothing
        can run until one does, so nothing wakes it."""
        return bool(self.paused_calls) and self.decisions == 0 and not self.cancel_requested

    @property
    def has_work(self) -> bool:
        return not self.parked and (self.open_turn is not None or self.pending > 0)


@dataclass(frozen=True, slots=True)
class WorkerMark:
    """One live worker process as its last mark describes it (`heartbeat`, `live_workers`):
    the agents it runs, until when the mark holds, since when no delivery has run on it
    (None: one runs now) and the newest send time of a wake it started (0: none yet)."""

    worker_id: str
    agents: tuple[str, ...]
    expires_ms: int
    free_since_ms: int | None = None
    took_sent_ms: int = 0
    host: str = ""
    pid: int = 0
    # The newest stored layout level it reads (`LAYOUT_LEVEL` of its release).
    reads: int = LAYOUT_LEVEL


@dataclass(frozen=True, slots=True)
class ReadySession:
    """A session in the ready set with work to do: no live lease holds it (`pending`, an
    input waits; `open_turn`, a turn was left open), or, asked for with `include_held`, a
    live lease does (`held`, expiring at `lease_expires_ms`). `marked_ms`: when it was last
    marked ready (an input was accepted). `unserved_next_ms`: see `SessionState`."""

    session_id: str
    agent: str
    reason: Literal["pending", "open_turn", "held"]
    marked_ms: int = 0
    lease_expires_ms: int | None = None
    # A wake found no process running its agent: the store's backoff wakes it again then.
    unserved_next_ms: int | None = None
    # When its outstanding wake was queued (None: no wake waits for a delivery).
    woken_ms: int | None = None
    # The layout level a claim must read (see `SessionState.newer`).
    newer: int | None = None


@dataclass(frozen=True, slots=True)
class StoreRecord:
    """One record for `append()`: the engine's idempotency key, its bytes and its marks."""

    idempotency_key: str
    data: bytes
    marks: list[Mark] = field(default_factory=list)
