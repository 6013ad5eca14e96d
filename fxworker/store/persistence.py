"""The engine's `Persistence` over one claimed session, and the UI lines that ride with it.

`StorePersistence` is the engine's `Persistence` (docs/design.md §9) for one claim: `load()`
answers from the claim (no round trip), `append()` is the store's fenced append and
`save_checkpoint()` compacts the log. A record whose epoch lost the lease raises
`FxLeaseLostError` (an `FxFencedError`), one whose `expected` is not the log head raises
`FxFencedError`; either way nothing is stored. `store.persistence(sid, epoch, claim)`
builds one; the runner builds one on its own `LineWriter`.

`LineWriter` queues the UI lines of a running turn (§4, §5) and writes them at once when
no write of its own is in flight; while one is, the lines wait and consecutive text (or
reasoning) deltas of one step are merged, never reordered or lost, and the next call
takes them all. So a quiet session's line costs one round trip of latency, and a busy
worker writes fewer, larger batches. One fenced store call writes a batch. The writers of
one store on one loop share a `LineFlusher`: once per loop iteration it takes the lines
of every writer that has some (and no write of its own in flight) and sends their calls
in one round trip, with no task or future per writer; a writer whose call fails, or that
holds a batch to resend, writes through its own `flush()` (the retries below). Each
journal record goes out in the same fenced call as the lines queued before it, so a
step's record and its lines cost one round trip and its lines are stored no later than
its record — after a crash, a step the journal holds has all its lines in the stream.
Lines queued with `queue_lines()` are kept as given (no merging, no timer) and ride with
the next record, or with `flush_lines()`.

A store outage (`FxStoreUnavailableError`, e.g. a Redis restart) is transient: both
retry the same call with a bounded backoff while this worker's lease still stands
(`lease_due_ms`; without it, one try). Every call carries an idempotency key — a record
its own, a line-only flush one of the writer's (`lines:<epoch>:<n>`) — and a retry keeps
it, so a call that ran but lost its reply is answered from the store and stores nothing
twice (§11.7). Past the lease the error is raised, and the runner leaves the turn open
for the next delivery.

A batch whose call failed may still have been stored (the reply was lost, or the call
was cancelled in flight). It is held, not merged back into the queue: the next write
sends it first, alone and under the same key, so it lands once whatever happened. Lines
that rode with a record are held under the record's key (the journal never sends a key
again after a failed append): resent, they are stored only if that record call did not
run.

`StorePersistence` can also add a line to a record's own call (`ride_with_end`): the
engine reports a turn's end to its event sink just before it commits the end (or yield)
record, the runner hands the `turn_end` (or `turn_yield`) line over, and it goes last in
the call of the next record carrying an `end` or `yield` mark, so both are stored or
neither. The `EndRide` it returns says what that call did: whether the line was stored,
and whether the call let the session go (the runner asks for that in the same call).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from fxengine.lines import DELTA_TYPES
from fxengine.persistence import Loaded, Mark

from ..errors import FxLeaseLostError, FxStoreUnavailableError
from ..ids import now_ms
from ._core import Op
from ._workers import _append
from .types import Appended, Claim, StoreRecord

if TYPE_CHECKING:
    from .api import SessionStore

T = TypeVar("T")
# A UI line as a writer queues it: the line's JSON fields, with `epoch` (the store adds `cursor`).
Line = dict[str, object]
log = logging.getLogger("fxworker.lines")

RETRY_FIRST_MS = 50
RETRY_MAX_MS = 500
RETRY_MARGIN_MS = 100  # the last try starts this long before `due_ms`
# A turn's end compacts the log once this many records follow the checkpoint: a claim
# reads at most about this many records, and a short turn costs no compaction call.
COMPACT_AFTER_RECORDS = 24
# The most lines a writer keeps (as sent) for the call that lets the session go to pack
# (`append(pack_after=...)`); a longer claim leaves its oldest lines unpacked.
PACK_MAX_LINES = 4096


async def retry_unavailable(
    call: Callable[[], Awaitable[T]],
    *,
    due_ms: Callable[[], int] | None,
    what: str,
    stop: Callable[[], bool] | None = None,
) -> T:
    """`await call()`, retried on `FxStoreUnavailableError` with a doubling backoff
    (`RETRY_FIRST_MS` to `RETRY_MAX_MS`) until `due_ms()` (a wall-clock ms, e.g. when the
    lease would expire) is near or `stop()` says so; then the last error is raised.
    Without `due_ms`, one try."""
    delay_ms = RETRY_FIRST_MS
    attempt = 0
    while True:
        try:
            return await call()
        except FxStoreUnavailableError as exc:
            attempt += 1
            left_ms = (due_ms() if due_ms is not None else 0) - RETRY_MARGIN_MS - now_ms()
            if left_ms <= 0 or (stop is not None and stop()):
                log.warning("%s failed after %d tries, giving up: %s", what, attempt, exc)
                raise
            wait_ms = min(delay_ms, left_ms)
            log.warning("%s failed (%s); retry %d in %d ms", what, exc, attempt, wait_ms)
            await asyncio.sleep(wait_ms / 1000)
            delay_ms = min(delay_ms * 2, RETRY_MAX_MS)


class LineWriter:
    """Queues one runner's UI lines and writes them in order, fenced by its epoch."""

    def __init__(
        self,
        store: SessionStore,
        session_id: str,
        epoch: int,
        *,
        on_fenced: Callable[[], None] | None = None,
        lease_due_ms: Callable[[], int] | None = None,
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.epoch = epoch
        self.on_fenced = on_fenced
        self.lease_due_ms = lease_due_ms  # when this worker's lease would expire (retry bound)
        self.lock = asyncio.Lock()
        self._queue: list[Line] = []
        self._flushing: asyncio.Task[None] | None = None
        self._flusher: LineFlusher | None = None
        self._marked = False  # waiting for the flusher's next round
        # A journal record is on its way (`StorePersistence.record_coming`): its call takes
        # the queued lines, so the flusher's next round leaves them to it, once.
        self.record_due = False
        self._calls = 0
        # (key, lines, marks) of a call that failed and may have run
        self._held: tuple[str, list[Line], list[Mark]] | None = None
        self.closed = False
        # The lines this writer stored, as sent, from cursor `_stored_first` on, and the
        # cursor its next line gets (the claim's `ui_cursor` + 1 until it stores one).
        self._stored: list[str] = []
        self._stored_first = 0
        self.next_line: int | None = None

    def __repr__(self) -> str:
        held = len(self._held[1]) if self._held else 0
        return f"<LineWriter session={self.session_id} epoch={self.epoch} queued={len(self._queue)} held={held}>"

    def push(self, line: Line) -> None:
        if self.closed:
            return
        line = {**line, "epoch": self.epoch}
        last = self._queue[-1] if self._queue else None
        kind = line.get("type")  # per delta: the plain read (DELTA_TYPES are declared types)
        if (
            last is not None
            and kind in DELTA_TYPES
            and last.get("type") == kind
            and last.get("step") == line.get("step")
            and last.get("messageId") == line.get("messageId")
        ):
            last["delta"] = str(last["delta"]) + str(line["delta"])
        else:
            self._queue.append(line)
        self.push_pending()

    def push_pending(self) -> None:
        """Hands the queued lines to the flusher's round at the end of this loop iteration
        (what the turn pushes in the same iteration, a burst of deltas, goes in the same
        call), unless a write of this writer's is already on its way."""
        if self._flushing is not None or self._marked:
            return
        if self._flusher is None:
            make = getattr(self.store, "line_flusher", None)  # a store without one: a task of our own
            self._flusher = make() if make is not None else None
        if self._flusher is None:
            self.flush_in_background()
            return
        self._marked = True
        self._flusher.mark(self)

    def flush_in_background(self) -> None:
        """Writes the queued lines (a held batch first) in a task of this writer's own,
        with its retries."""
        if self._flushing is None:
            self._flushing = asyncio.ensure_future(self._flush_quietly())

    def next_key(self) -> str:
        """The idempotency key of this writer's next line-only call."""
        self._calls += 1
        return f"lines:{self.epoch}:{self._calls}"

    def queue(self, lines: Iterable[Mapping[str, object]]) -> None:
        """Queues lines as given: no merging and no timer, so they wait for the next
        record or `flush()`."""
        if self.closed:
            return
        for line in lines:
            self._queue.append({**line, "epoch": self.epoch})

    async def _flush_quietly(self) -> None:
        """Writes the queued lines until none are left (those pushed while a call was in
        flight go in the next one); a failure leaves them for the next write."""
        try:
            while self._queue and not self.closed:
                await self.flush()
        except FxLeaseLostError:
            pass
        except Exception:  # noqa: BLE001 - the next flush (or the record) retries
            log.warning("writing lines of %s failed", self.session_id, exc_info=True)
        finally:
            self._flushing = None

    def take(self) -> list[Line]:
        """Removes and returns the queued lines (the caller writes them; hold `lock`)."""
        lines, self._queue = self._queue, []
        return lines

    def hold(self, key: str, lines: list[Line], marks: list[Mark] | None = None) -> None:
        """Keeps lines (and store marks) whose call (keyed `key`) failed and may have run:
        `send_held()` resends them first, alone, under the same key (hold `lock`)."""
        if (lines or marks) and not self.closed:
            self._held = (key, lines, list(marks or ()))

    def stored(self, appended: Appended) -> None:
        """Keeps the texts of the lines a call of this writer stored, for `pack_after()`."""
        if not appended.lines:
            return
        first = appended.lines[0]
        if len(appended.texts) != len(appended.lines) or (
            self._stored and first != self._stored_first + len(self._stored)
        ):
            self._stored = []  # not this writer's run of lines: start again after it
        else:
            if not self._stored:
                self._stored_first = first
            self._stored.extend(appended.texts)
            if len(self._stored) > PACK_MAX_LINES:
                drop = len(self._stored) - PACK_MAX_LINES
                del self._stored[:drop]
                self._stored_first += drop
        self.next_line = appended.lines[-1] + 1

    def pack_after(self) -> tuple[int, list[str]] | None:
        """(first cursor, texts) of the lines this writer stored, for the call that lets the
        session go to pack with its own (None: where its lines begin is not known)."""
        if self._stored:
            return self._stored_first, self._stored
        return (self.next_line, []) if self.next_line is not None else None

    async def begin_round(self) -> tuple[str, list[Line]] | None:
        """The flusher's round (`LineFlusher`): the key and lines this writer sends in it,
        with `lock` held and the writer still marked (what it is handed meanwhile waits)
        until `end_round`; None when it has nothing to send there (its lines ride with a
        record on its way, or go through its own `flush()`: a batch to resend first, or a
        write in flight)."""
        if self.closed or not self._queue:
            self._marked = False
            return None
        if self.record_due:
            # The record's call takes these lines (the turn's first line rides with its
            # first record: one round trip, not two); whatever is left goes next round.
            self.record_due = self._marked = False
            self.push_pending()
            return None
        if self._held is not None or self.lock.locked() or self._flushing is not None:
            self._marked = False
            self.flush_in_background()
            return None
        await self.lock.acquire()  # free: no wait (lines pushed meanwhile wait for the next round)
        return self.next_key(), self.take()

    def end_round(self, key: str, lines: list[Line], result: Appended | BaseException | None) -> None:
        """What the round's call of `begin_round`'s batch came to: stored (`Appended`),
        refused for the epoch (fenced), failed (held: it may have run, so it is resent first,
        alone, under its key), or None when the round was cancelled (held as well)."""
        self._marked = False
        fenced = isinstance(result, FxLeaseLostError)
        failed = not fenced and not isinstance(result, Appended)
        if fenced:
            self.fenced()
        elif failed:
            self.hold(key, lines)
        elif isinstance(result, Appended):
            self.stored(result)
        self.lock.release()
        if result is None:
            return
        if failed:
            log.debug("writing lines of %s failed (%s); its writer retries", self.session_id, result)
            self.flush_in_background()
        elif self._queue and not self.closed:
            self.push_pending()

    def fenced(self) -> None:
        """A write was refused: this writer writes nothing more."""
        self.closed = True
        self._held = None
        self._queue = []
        if self.on_fenced:
            self.on_fenced()

    async def send_held(self) -> list[int]:
        """Resends a held batch under its own key (hold `lock`): stored once, whether or
        not its first call ran. Returns the batch's cursors."""
        if self._held is None:
            return []
        key, lines, marks = self._held
        self._held = None
        return await self._send(key, lines, marks)

    async def _send(self, key: str, lines: list[Line], marks: list[Mark]) -> list[int]:
        try:
            appended = await retry_unavailable(
                lambda: self.store.append(self.session_id, self.epoch, lines=lines, marks=marks, idempotency_key=key),
                due_ms=self.lease_due_ms,
                what=f"writing {len(lines)} line(s) of {self.session_id}",
                stop=lambda: self.closed,
            )
        except FxLeaseLostError:
            self.fenced()
            raise
        except BaseException:
            self.hold(key, lines, marks)
            raise
        self.stored(appended)
        return list(appended.lines)

    async def flush(self, *, marks: Iterable[Mark] = ()) -> list[int]:
        """Writes every queued line now (a held batch first), one fenced call per batch;
        returns the cursors of the lines it stored. `marks` are store marks (`{"drop": id}`
        consumes an input no turn takes, `{"end": True}` closes the open turn) stored in
        the same call as the queued lines."""
        marks = list(marks)
        async with self.lock:
            cursors = await self.send_held()
            lines = self.take()
            if not lines and not marks:
                return cursors
            return cursors + await self._send(self.next_key(), lines, marks)


class LineFlusher:
    """The line writes of one store's writers on one loop: one round trip per loop
    iteration for every writer with lines queued (`RedisStore.line_flusher()`)."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self._marked: list[LineWriter] = []
        self._rounds: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"<LineFlusher marked={len(self._marked)} rounds={len(self._rounds)}>"

    def mark(self, writer: LineWriter) -> None:
        """Writes `writer`'s lines in the round at the end of this loop iteration."""
        if not self._marked:
            asyncio.get_running_loop().call_soon(self._start_round)
        self._marked.append(writer)

    def _start_round(self) -> None:
        writers, self._marked = self._marked, []
        task = asyncio.ensure_future(self._round(writers))
        self._rounds.add(task)
        task.add_done_callback(self._rounds.discard)

    async def _round(self, writers: list[LineWriter]) -> None:
        sending: list[tuple[LineWriter, str, list[Line]]] = []
        for writer in writers:
            batch = await writer.begin_round()
            if batch is not None:
                sending.append((writer, *batch))
        if not sending:
            return
        try:
            results = await self._send(sending)
        except asyncio.CancelledError:  # the loop stops: every batch is held for a resend
            for writer, key, lines in sending:
                writer.end_round(key, lines, None)
            raise
        except Exception as exc:  # the connection failed: every batch is held
            results = [exc] * len(sending)
        for (writer, key, lines), result in zip(sending, results):
            writer.end_round(key, lines, result)

    async def _send(self, sending: list[tuple[LineWriter, str, list[Line]]]) -> list[Appended | Exception]:
        ops: list[Op[Appended] | Exception] = []
        for writer, key, lines in sending:
            try:
                ops.append(_append(self.store.core, writer.session_id, writer.epoch, lines=lines,
                                   idempotency_key=key))
            except Exception as exc:  # noqa: BLE001 - a line the store refuses: that writer's alone
                ops.append(exc)
        planned: list[Op[Appended]] = [op for op in ops if not isinstance(op, Exception)]
        answers = iter(await self.store.run_each(planned, "append") if planned else [])
        return [op if isinstance(op, Exception) else next(answers) for op in ops]


@dataclass(slots=True)
class EndRide:
    """A turn's end (or yield) line handed to `StorePersistence.ride_with_end`, with what
    the call of the record that ends the turn may also do, and what it did.

    `release`, asked just before that call (the runner's state as the call leaves), says
    whether it may also let the session go (`append(release=True)`, only for an `end`
    mark): one round trip less, and an input accepted after it finds the session free.
    That call also packs the lines the writer stored and carries the checkpoint
    `checkpoint()` gives (the conversation exactly through that record, or None), so the
    session rests without a log (§5 "Packed at rest"); without a checkpoint it lets go only
    when no compaction is due after the record (`save_checkpoint` writes under the lease).
    `before()`, when given, is awaited before that call (what must be stored elsewhere
    before the turn ends or parks: a delegated turn's answer, the children a parked turn
    waits on); lines it pushes ride in the call.
    """

    line: Line
    release: Callable[[], bool] | None = None
    checkpoint: Callable[[], bytes | None] | None = None
    before: Callable[[], Awaitable[object]] | None = None  # awaited first (retried while the store is away)
    stored: bool = False  # the line went in its record's call
    released: bool = False  # and that call let the session go: nothing more under this epoch


class StorePersistence:
    """The engine's `Persistence` for one claim: fenced appends that carry the queued lines.

    `load()` is the claim's snapshot (checkpoint, records after it, head); `append()` is
    one fenced store call with the record and every line queued before it; a repeated
    idempotency key returns the stored cursor (the store's own dedup). Writes go under
    the session and epoch of `writer` (by default a new `LineWriter` of the claim).

    `ride_with_end(line, release=, checkpoint=)` puts a line in the call of the next record
    that ends or yields a turn (an `end` or `yield` mark), and that call lets the session
    go when `release()` says it may (`EndRide`). When the store let go, the writer is
    closed: nothing more is written under this epoch.
    """

    def __init__(
        self,
        store: SessionStore,
        claim: Claim,
        *,
        writer: LineWriter | None = None,
    ) -> None:
        self.store = store
        self.claim = claim
        self.writer = writer if writer is not None else LineWriter(store, claim.session_id, claim.epoch)
        self.session_id = self.writer.session_id
        self.epoch = self.writer.epoch
        self.head = claim.head
        self.uncompacted = len(claim.records)  # records after the stored checkpoint
        self._ride: EndRide | None = None
        self._released = False
        if self.writer.next_line is None:
            self.writer.next_line = claim.ui_cursor + 1

    def __repr__(self) -> str:
        return f"<StorePersistence session={self.session_id} epoch={self.epoch} head={self.head}>"

    def queue_lines(self, lines: Iterable[Mapping[str, object]]) -> None:
        """UI lines to store with the next record (or with `flush_lines()`), as given."""
        self.writer.queue(lines)

    async def flush_lines(self) -> list[int]:
        """Stores the queued UI lines now (fenced); returns their cursors."""
        return await self.writer.flush()

    async def load(self) -> Loaded:
        return self.claim.loaded()

    def record_coming(self) -> None:
        """The journal has a record on its way: the lines queued meanwhile go in its call."""
        self.writer.record_due = True

    def ride_with_end(
        self,
        line: Mapping[str, object],
        *,
        release: Callable[[], bool] | None = None,
        checkpoint: Callable[[], bytes | None] | None = None,
        before: Callable[[], Awaitable[object]] | None = None,
    ) -> EndRide:
        """Stores `line` last in the call of the next record that ends, yields or parks a
        turn; that call may also let the session go (`EndRide`)."""
        ride = self._ride = EndRide({**line, "epoch": self.epoch}, release, checkpoint, before)
        return ride

    def _take_ride(self, marks: list[Mark]) -> EndRide | None:
        if self._ride is None or not any("end" in m or "yield" in m or "pause" in m for m in marks):
            return None
        ride, self._ride = self._ride, None
        return ride

    async def append(
        self,
        *,
        expected: str | None,
        idempotency_key: str,
        data: bytes,
        barrier: bool,
        marks: list[Mark],
    ) -> str:
        record = StoreRecord(idempotency_key, bytes(data), list(marks))
        ride = self._take_ride(marks)
        if ride is not None and ride.before is not None:
            await retry_unavailable(ride.before, due_ms=self.writer.lease_due_ms,
                                    what=f"what goes before record {idempotency_key} of {self.session_id}",
                                    stop=lambda: self.writer.closed)
        async with self.writer.lock:
            await self.writer.send_held()  # an earlier batch that may have run goes first
            # Asked last, just before the call: the runner's state as the call leaves.
            release = (
                ride is not None and ride.release is not None
                and any("end" in m for m in marks)
                and ride.release()
            )
            checkpoint = self._settled_checkpoint(ride) if release and ride is not None else None
            if checkpoint is None and self.uncompacted + 1 >= COMPACT_AFTER_RECORDS:
                release = False  # a compaction is due after the record, under the lease
            pack_after = self.writer.pack_after() if release else None
            lines = self.writer.take()
            self.writer.record_due = False
            sent = lines + [ride.line] if ride is not None else lines
            try:
                # A retry sends the same idempotency key: a call that ran but lost its
                # reply is answered from the store and stores nothing again.
                appended = await retry_unavailable(
                    lambda: self.store.append(
                        self.session_id,
                        self.epoch,
                        records=[record],
                        lines=sent,
                        expected=expected,
                        durable=barrier,
                        release=release,
                        checkpoint=checkpoint,
                        pack_after=pack_after,
                    ),
                    due_ms=self.writer.lease_due_ms,
                    what=f"appending record {idempotency_key} of {self.session_id}",
                    stop=lambda: self.writer.closed,
                )
            except FxLeaseLostError:
                self.writer.fenced()
                raise
            except BaseException:
                # The end line is not held: it is stored with its record or not at all.
                self.writer.hold(idempotency_key, lines)
                raise
        self.head = str(appended.records[0])
        self.uncompacted += 1
        self.writer.stored(appended)
        if ride is not None:
            ride.stored = True
        if appended.released:
            self._released = True
            self.writer.closed = True
            if ride is not None:
                ride.released = True
            if checkpoint is not None:
                self.uncompacted = 0  # the log went with the release: the checkpoint covers it
        return self.head

    def checkpoint_due(self) -> bool:
        """Whether `save_checkpoint` would store one: `COMPACT_AFTER_RECORDS` records follow
        the last checkpoint (before that, a claim reads them at little cost), and the session
        was not let go (the engine asks before it builds the bytes)."""
        return self.uncompacted >= COMPACT_AFTER_RECORDS and not self._released

    def _settled_checkpoint(self, ride: EndRide) -> bytes | None:
        """The ride's `checkpoint()`, or None when there is none or it fails (the record
        goes without it: the log keeps the conversation, as before)."""
        if ride.checkpoint is None:
            return None
        try:
            return ride.checkpoint()
        except Exception:  # noqa: BLE001 - the journal still holds everything
            log.warning("building the checkpoint of %s failed", self.session_id, exc_info=True)
            return None

    async def save_checkpoint(self, *, through: str, data: bytes) -> None:
        """Compacts the log through `through` when `checkpoint_due()`."""
        if not self.checkpoint_due():
            return
        await self.store.save_checkpoint(self.session_id, self.epoch, through=through, data=data)
        self.uncompacted = 0
