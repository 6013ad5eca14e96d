"""The store's operations as I/O-free plans: the calls to run and how to read their replies.

`StoreCore.op_accept(...)` and its siblings validate and encode their arguments and return
an `Op`: the steps (script calls and plain commands) to run in order, and a parser for the
replies. `RedisStore` (async) and `SyncRedisStore` run the same `Op` on their clients, so
the two never differ in anything but how they wait.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

from fxengine.codes import Code
from fxengine.errors import FxLimitError
from fxengine.persistence import JournalRecord, Loaded, Mark, StoredCheckpoint

from .. import scripts
from ..errors import (
    FxAckUnsupportedError,
    FxConfigError,
    FxInvalidCursorError,
    FxStoreUnavailableError,
    FxUnknownSessionError,
)
from ..ids import now_ms, validate_message_id, validate_session_id
from ..keys import SessionKeys, check_prefix, created_session_key, index_keys, session_keys
from ..scripts import Command, Step
from . import _replies as r
from .types import (
    CHECKPOINT_MAX_BYTES,
    INPUT_MAX_BYTES,
    STEER_MAX_BYTES,
    STEER_MAX_QUEUED,
    STEER_MAX_QUEUED_BYTES,
    Accepted,
    Appended,
    Claim,
    Idle,
    Input,
    InputKind,
    Mark,
    ReadySession,
    Released,
    Serving,
    SessionState,
    StoreRecord,
    Unserved,
)

T = TypeVar("T")
log = logging.getLogger("fxworker.store")

# A ready mark younger than this is never cleared: on a cluster it may belong to an accept
# still in flight (the sender marks first, then accepts). Well above any accept's socket
# timeout.
READY_GRACE_MS = 30_000
# On one server the accept script makes the mark itself, atomically, so no accept is in
# flight behind a mark; what is left is clock skew between the sender (whose clock scores
# the mark) and the sweeper (whose clock decides what is old).
READY_SKEW_MS = 5_000

# The most UI lines one read returns unless its caller asks for a count: a follower of a
# long session pages through it (and a slow client holds one page, not the session).
READ_PAGE_LINES = 128
# The most inbox entries one `watch_inboxes` read returns per session: a session with a
# longer queue is read a page a poll, each poll continuing after the last entry handed on.
INBOX_PAGE_ENTRIES = 256
# Stream ids are `<uint64>-<uint64>`: a cursor past this is no id Redis can read after.
MAX_CURSOR = 2**64 - 1


class _Unchecked:
    def __repr__(self) -> str:
        return "UNCHECKED"


UNCHECKED: Any = _Unchecked()
"""`append(expected=UNCHECKED)`: the call does not compare the log head (the default)."""

RecordLike = StoreRecord | tuple[str, bytes, Sequence[Mark]]


class Op(NamedTuple, Generic[T]):
    """Steps to run in order (one round trip when pipelined) and the parser of their replies."""

    steps: list[Step]
    parse: Callable[[list[Any]], T]


def _steer_text_bytes(input: Any, json_bytes: int) -> int:
    """The bytes a steer counts against its limits: its text (a steer given as blocks
    counts its text blocks; its images have their own limits, checked before the store)."""
    if isinstance(input, str):
        return len(input.encode("utf-8", "surrogatepass"))
    if isinstance(input, list) and all(isinstance(b, dict) for b in input):
        return sum(len(str(b.get("text", "")).encode("utf-8", "surrogatepass")) for b in input if b.get("type") == "text")
    return json_bytes


class StoreCore:
    """Validation, keys and operation plans shared by the sync and async Redis store."""

    def __init__(
        self,
        *,
        prefix: str = "fx",
        ack: str = "primary",
        memory_ids: bool = False,
        session_ttl_s: float | None = None,
        clock: Callable[[], int] | None = None,
        cluster: bool = False,
        ack_timeout_ms: int = 1000,
        max_block_ms: int = 4000,
    ) -> None:
        if ack not in ("primary", "aof", "replica"):
            raise FxConfigError(f"ack must be 'primary', 'aof' or 'replica', got {ack!r}")
        self.prefix = check_prefix(prefix)
        self.ack = ack
        self.memory_ids = memory_ids
        self.ttl_ms = int(session_ttl_s * 1000) if session_ttl_s else 0
        self.clock = clock or now_ms
        self.cluster = cluster
        self.ready_grace_ms = READY_GRACE_MS if cluster else READY_SKEW_MS
        self.ack_timeout_ms = ack_timeout_ms
        self.max_block_ms = max_block_ms
        self.index = index_keys(self.prefix)
        self._keys: dict[str, SessionKeys] = {}

    # -- helpers ---------------------------------------------------------------------

    def now(self, now_ms: int | None) -> int:
        return self.clock() if now_ms is None else int(now_ms)

    def grace(self, grace_ms: int | None) -> int:
        """How old a ready mark must be before it may be cleared (None: this store's own)."""
        return self.ready_grace_ms if grace_ms is None else int(grace_ms)

    def keys(self, session_id: str) -> SessionKeys:
        """The keys of a valid session id (`FxInvalidSessionIdError` otherwise), cached."""
        keys = self._keys.get(session_id)
        if keys is None:
            keys = session_keys(self.prefix, validate_session_id(session_id, memory=self.memory_ids))
            if len(self._keys) >= 4096:
                self._keys.clear()
            self._keys[session_id] = keys
        return keys

    def _ack_steps(self) -> list[Step]:
        if self.ack == "replica":
            return [Command(("WAIT", 1, self.ack_timeout_ms))]
        if self.ack == "aof":
            return [Command(("WAITAOF", 1, 0, self.ack_timeout_ms))]
        return []

    def _check_ack(self, replies: list[Any], what: str) -> None:
        if self.ack == "replica" and int(replies[0]) < 1:
            raise FxStoreUnavailableError(
                f"{what} is stored on the primary but no replica acknowledged it within {self.ack_timeout_ms} ms; "
                "repeating the call with the same ids is safe"
            )
        if self.ack == "aof" and int(replies[0][0]) < 1:
            raise FxStoreUnavailableError(f"{what} is stored but not yet fsynced to the AOF within {self.ack_timeout_ms} ms")

    def _block(self, block_ms: int | None) -> int | None:
        if block_ms is None:
            return None
        return max(1, min(int(block_ms), self.max_block_ms))

    # -- senders -----------------------------------------------------------------------

    def op_accept(
        self,
        session_id: str,
        *,
        agent: str,
        kind: InputKind,
        message_id: str,
        input: Any,
        context: Any,
        settings: Any,
        now_ms: int | None,
        create: bool,
        traceparent: str | None = None,
    ) -> Op[Accepted]:
        keys = self._keys.get(session_id) or self.keys(session_id)
        validate_message_id(message_id)
        code = r.kind_code(kind)
        input_json = r.dumps(input)
        json_bytes = len(input_json.encode())
        if json_bytes > INPUT_MAX_BYTES:
            raise FxLimitError(f"an input is limited to {INPUT_MAX_BYTES} bytes of JSON", code=Code.LIMIT_INPUT)
        # §6 limits a steer's text, not its JSON: quotes and escapes do not count.
        steer_bytes = None
        if code == "s":
            steer_bytes = _steer_text_bytes(input, json_bytes)
        now = self.clock() if now_ms is None else int(now_ms)
        cluster = self.cluster
        accept = scripts.accept(
            keys, kind=code, message_id=message_id, input_json=input_json,
            context_json="" if context is None else r.dumps(context),
            settings_json="" if settings is None else r.dumps(settings),
            agent=agent, now_ms=now, create=create, steer_max_bytes=STEER_MAX_BYTES,
            steer_max_count=STEER_MAX_QUEUED, steer_max_total_bytes=STEER_MAX_QUEUED_BYTES,
            ready=None if cluster else self.index, session_id=session_id, steer_bytes=steer_bytes,
            traceparent=traceparent or "",
        )
        # The ready mark goes first (§5): a sender that dies after the acknowledgement
        # leaves the session for the sweeper. On one server the accept script marks it
        # itself (one call, atomic); on a cluster the ready set is in another slot, so the
        # mark is a call of its own, run before the accept.
        if not cluster and self.ack == "primary":
            return Op([accept], lambda replies: r.parse_accept(replies[0], session_id, message_id, kind))
        # With an ack level each write is followed by its wait (on a cluster, on the node
        # that took the write: `scripts.AsyncRunner`); the mark's is sent, not required.
        steps: list[Step] = []
        if cluster:
            steps += [scripts.mark_ready(self.index, session_id=session_id, now_ms=now), *self._ack_steps()]
        at = len(steps)
        steps.append(accept)
        steps += self._ack_steps()

        def parse(replies: list[Any]) -> Accepted:
            # The ready mark's own wait is not checked: the index lives on one node, and a
            # failover there (its promoted replica has none) must not refuse every accept of
            # the cluster. A mark lost with that node is only the sweeper's net; the input
            # itself is acknowledged by a replica of its own node, and its wake is sent.
            accepted = r.parse_accept(replies[at], session_id, message_id, kind)
            if len(replies) > at + 1:
                self._check_ack(replies[at + 1:], f"message {message_id}")
            return accepted

        return Op(steps, parse)

    def op_created_session(self, message_id: str, session_id: str, *, scope: str = "") -> Op[str]:
        """`SET created:<message id> <session id> NX [PX ttl]`, then `GET` it: the session that won."""
        if scope and not scope.isalnum():
            raise ValueError(f"a message id scope is letters and digits, got {scope!r}")
        key = created_session_key(self.prefix, validate_message_id(message_id), scope)
        self.keys(session_id)  # a valid session id, or FxInvalidSessionIdError before anything is stored
        ttl = ("PX", self.ttl_ms) if self.ttl_ms else ()
        steps: list[Any] = [Command(("SET", key, session_id, "NX", *ttl), key=key), Command(("GET", key), key=key)]

        def parse(replies: list[Any]) -> str:
            owner = replies[1]
            return owner.decode() if isinstance(owner, bytes) else str(owner)

        return Op(steps, parse)

    def op_cancel(self, session_id: str, *, now_ms: int | None, message_id: str | None = None) -> Op[str | None]:
        call = scripts.cancel(self.keys(session_id), now_ms=self.now(now_ms), message_id=message_id)
        return Op([call], lambda replies: r.parse_cancel(replies[0], session_id=session_id))

    def op_mark_ready(self, session_id: str, *, now_ms: int | None) -> Op[None]:
        validate_session_id(session_id, memory=self.memory_ids)
        call = scripts.mark_ready(self.index, session_id=session_id, now_ms=self.now(now_ms))
        return Op([call], lambda replies: None)

    # -- workers ------------------------------------------------------------------------

    def op_claim(
        self, session_id: str, *, holder: str, lease_ms: int, now_ms: int | None, only_work: bool = False,
        serving: Serving | None = None,
    ) -> Op[Claim | Idle | Unserved | None]:
        if lease_ms <= 0:
            raise ValueError(f"lease_ms must be positive, got {lease_ms}")
        call = scripts.claim(
            self.keys(session_id), holder=holder, lease_ms=int(lease_ms), now_ms=self.now(now_ms), only_work=only_work,
            agents=serving.agents if serving else (), give_up_ms=serving.give_up_ms if serving else 0,
            retry_max_ms=serving.retry_max_ms if serving else 0,
        )
        return Op([call], lambda replies: r.parse_claim(replies[0], session_id=session_id, holder=holder))

    def op_append(
        self,
        session_id: str,
        epoch: int,
        *,
        records: Sequence[RecordLike],
        lines: Sequence[Mapping[str, Any]],
        marks: Sequence[Mark],
        expected: str | None | _Unchecked,
        durable: bool,
        now_ms: int | None,
        idempotency_key: str | None = None,
    ) -> Op[Appended]:
        keys = self.keys(session_id)
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
        check = not isinstance(expected, _Unchecked)
        call = scripts.append(
            keys, epoch=int(epoch), now_ms=self.now(now_ms), ttl_ms=self.ttl_ms,
            expected=expected if check else None, check_expected=check,  # type: ignore[arg-type]
            records=encoded, marks=r.encode_marks(marks), lines=[r.encode_line(line) for line in lines],
            call_key=idempotency_key or "",
        )
        steps: list[Step] = [call]
        if durable:
            steps += self._ack_steps()
        shown = None if not check else expected

        def parse(replies: list[Any]) -> Appended:
            appended = r.parse_append(replies[0], session_id=session_id, epoch=int(epoch), expected=shown)  # type: ignore[arg-type]
            if len(replies) > 1:
                self._check_ack(replies[1:], f"a record of session {session_id}")
            return appended

        return Op(steps, parse)

    def op_renew(self, session_id: str, epoch: int, *, lease_ms: int, now_ms: int | None) -> Op[int]:
        call = scripts.renew(self.keys(session_id), epoch=int(epoch), lease_ms=int(lease_ms), now_ms=self.now(now_ms))
        return Op([call], lambda replies: r.parse_renew(replies[0], session_id=session_id, epoch=int(epoch)))

    def op_release(self, session_id: str, epoch: int, *, cutoff: bool, now_ms: int | None) -> Op[Released]:
        call = scripts.release(
            self.keys(session_id), epoch=int(epoch), cutoff=cutoff, now_ms=self.now(now_ms), ttl_ms=self.ttl_ms,
            ready=None if self.cluster else self.index, session_id=session_id,
        )
        return Op([call], lambda replies: r.parse_release(replies[0], session_id=session_id, epoch=int(epoch)))

    def op_save_checkpoint(
        self, session_id: str, epoch: int, *, through: str | None, data: bytes, now_ms: int | None
    ) -> Op[int]:
        keys = self.keys(session_id)
        if len(data) > CHECKPOINT_MAX_BYTES:
            raise FxLimitError(f"a checkpoint is limited to {CHECKPOINT_MAX_BYTES} bytes", code=Code.JOURNAL_TOO_LARGE)
        call = scripts.save_checkpoint(
            keys, epoch=int(epoch), now_ms=self.now(now_ms), through=int(through or 0), data=bytes(data),
            max_bytes=CHECKPOINT_MAX_BYTES, ttl_ms=self.ttl_ms,
        )
        return Op([call], lambda replies: r.parse_checkpoint(replies[0], session_id=session_id, epoch=int(epoch)))

    def op_watch_inbox(self, session_id: str, after: int, *, block_ms: int | None, count: int | None) -> Op[list[Input]]:
        keys = self.keys(session_id)
        step = self._xread(keys.inbox, int(after), block_ms=block_ms, count=count)
        return Op([step], lambda replies: _inputs(replies[0]))

    def op_watch_inboxes(self, after: Mapping[str, int]) -> Op[dict[str, list[Input]]]:
        """One XREAD per session, pipelined: a worker process's one look at every inbox it
        follows; each session's read returns at most `INBOX_PAGE_ENTRIES` entries."""
        sids = list(after)
        steps: list[Step] = [
            self._xread(self.keys(sid).inbox, int(after[sid]), block_ms=None, count=INBOX_PAGE_ENTRIES) for sid in sids
        ]

        def parse(replies: list[Any]) -> dict[str, list[Input]]:
            return {sid: found for sid, reply in zip(sids, replies) if (found := _inputs(reply))}

        return Op(steps, parse)

    # -- readers ------------------------------------------------------------------------

    def _xread(self, key: str, after: int, *, block_ms: int | None, count: int | None) -> Command:
        args: list[Any] = ["XREAD"]
        if count is not None:
            args += ["COUNT", int(count)]
        block = self._block(block_ms)
        if block is not None:
            args += ["BLOCK", block]
        return Command((*args, "STREAMS", key, f"{after}-0"), key=key)

    def op_read_raw_lines(
        self, session_id: str, cursor: int, *, block_ms: int | None, count: int | None
    ) -> Op[list[tuple[int, bytes]]]:
        if isinstance(cursor, bool) or not isinstance(cursor, int) or cursor < 0:
            raise FxInvalidCursorError(f"a stream cursor must be a non-negative integer, got {cursor!r}")
        if cursor > MAX_CURSOR:
            raise FxInvalidCursorError(f"a stream cursor is at most {MAX_CURSOR} (2^64 - 1), got one of {cursor.bit_length()} bits")
        count = READ_PAGE_LINES if count is None else count
        step = self._xread(self.keys(session_id).ui, cursor, block_ms=block_ms, count=count)
        return Op([step], lambda replies: [(n, bytes(f[b"l"])) for n, f in r.parse_stream(replies[0])])

    def op_state(self, session_id: str, *, now_ms: int | None) -> Op[SessionState]:
        now = self.now(now_ms)

        def parse(replies: list[Any]) -> SessionState:
            state = r.parse_state(replies[0], session_id=session_id, now_ms=now)
            if state is None:
                raise FxUnknownSessionError(f"no session {session_id}")
            return state

        return Op([scripts.state(self.keys(session_id))], parse)

    def op_load(self, session_id: str) -> Op[Loaded]:
        """The session's conversation as the engine loads it (checkpoint and the log records
        after it), read-only: no lease, no script, nothing written.

        Three plain reads, the log before the checkpoint. Compaction (save_checkpoint.lua)
        only trims records its new checkpoint covers, so whatever it does between the two
        reads, the checkpoint read second covers every record trimmed from the log read
        first: the pair is always a checkpoint plus the records after it (records it
        covers are dropped here), a state the session really had.
        """
        keys = self.keys(session_id)
        steps: list[Step] = [
            Command(("HGET", keys.meta, "agent"), key=keys.meta),
            Command(("XRANGE", keys.log, "-", "+"), key=keys.log),
            Command(("HMGET", keys.ckpt, "data", "through"), key=keys.ckpt),
        ]

        def parse(replies: list[Any]) -> Loaded:
            agent, entries, (data, through) = replies
            if not agent:
                raise FxUnknownSessionError(f"no session {session_id}")
            covered = int(through) if through is not None else 0
            checkpoint = StoredCheckpoint(bytes(data or b""), str(covered)) if through is not None else None
            records = []
            for entry_id, fields in entries or ():
                cursor = int(r._text(entry_id).split("-", 1)[0])
                if cursor <= covered:
                    continue
                if isinstance(fields, list):
                    fields = {fields[i]: fields[i + 1] for i in range(0, len(fields), 2)}
                records.append(JournalRecord(str(cursor), bytes(fields.get(b"d", b""))))
            head = records[-1].cursor if records else (checkpoint.through if checkpoint and covered else None)
            return Loaded(checkpoint=checkpoint, journal=records, head=head)

        return Op(steps, parse)

    def op_states(self, session_ids: Sequence[str], *, now_ms: int | None) -> Op[list[SessionState | None]]:
        now = self.now(now_ms)
        steps: list[Step] = [scripts.state(self.keys(sid)) for sid in session_ids]
        return Op(
            steps,
            # A session with a key gone is None here, as one that is gone whole: nothing to wake
            # or list (state() of it alone raises FxSessionIncompleteError).
            lambda replies: [r.parse_state(rep, session_id=sid, now_ms=now, incomplete_is_none=True)
                             for sid, rep in zip(session_ids, replies)],
        )

    def op_index(self, key: str, limit: int, *, newest_first: bool) -> Op[list[tuple[str, int]]]:
        command = "ZREVRANGE" if newest_first else "ZRANGE"
        step = Command((command, key, 0, max(0, int(limit) - 1), "WITHSCORES"), key=key)

        def parse(replies: list[Any]) -> list[tuple[str, int]]:
            flat = replies[0]
            if flat and isinstance(flat[0], (list, tuple)):
                return [(r._text(m), int(float(s))) for m, s in flat]
            return [(r._text(flat[i]), int(float(flat[i + 1]))) for i in range(0, len(flat), 2)]

        return Op([step], parse)

    def op_clear(self, session_ids: Sequence[str], *, older_than_ms: int, forget: Sequence[bool]) -> Op[list[bool]]:
        steps: list[Step] = [
            scripts.clear_ready(self.index, session_id=sid, older_than_ms=older_than_ms, forget=f)
            for sid, f in zip(session_ids, forget)
        ]
        return Op(steps, lambda replies: [bool(x) for x in replies])

    @staticmethod
    def ready_from(
        marked: Sequence[tuple[str, int]], states: list[SessionState | None], *, include_held: bool = False
    ) -> list[ReadySession]:
        ready = []
        for (sid, marked_ms), state in zip(marked, states):
            if state is None or not state.has_work:
                continue
            if state.status == "waiting":
                reason = "open_turn" if state.open_turn else "pending"
                ready.append(ReadySession(sid, state.agent, reason, marked_ms,  # type: ignore[arg-type]
                                          unserved_next_ms=state.unserved_next_ms))
            elif include_held:
                ready.append(ReadySession(sid, state.agent, "held", marked_ms, state.lease_expires_ms))
        return ready

    @staticmethod
    def decode_lines(raw: list[tuple[int, bytes]]) -> list[dict[str, Any]]:
        return [json.loads(text) for _, text in raw]

    def check_server(self, info: Mapping[str, Any] | None, policy: Any) -> None:
        """Start-up checks on the answers of INFO server and CONFIG GET maxmemory-policy."""
        if self.ack == "aof" and info is not None:
            version = tuple(int(p) for p in str(info.get("redis_version", "0")).split(".")[:2])
            if version < (7, 2):
                raise FxAckUnsupportedError(
                    f"ack='aof' needs WAITAOF (Redis 7.2 or newer); this server is {info.get('redis_version')}"
                )
        value = _find_policy(policy)
        if value is not None and value != "noeviction":
            log.warning(
                "Redis maxmemory-policy is %r: under memory pressure Redis may evict session keys; "
                "set it to 'noeviction'", value,
            )


def _find_policy(policy: Any) -> str | None:
    if isinstance(policy, Mapping):
        for key, value in policy.items():
            k = key.decode() if isinstance(key, bytes) else key
            if k == "maxmemory-policy":
                return value.decode() if isinstance(value, bytes) else str(value)
            if isinstance(value, Mapping):  # a cluster client answers per node
                found = _find_policy(value)
                if found is not None:
                    return found
    return None


def _inputs(reply: Any) -> list[Input]:
    """The inbox entries of one XREAD reply."""
    out = []
    for seq, fields in r.parse_stream(reply):
        flat: list[Any] = [seq]
        for name, value in fields.items():
            flat += [name, value]
        out.append(r.parse_input(flat))
    return out
