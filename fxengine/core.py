"""What every turn of one engine works on: the conversation, its journal, tools and model.

`Engine` owns one `EngineCore` and hands it to each `TurnRunner`. The conversation only
changes through `commit()` (applied, then queued for the journal), so a replay of the
journal rebuilds the same state (docs/design.md §9). The core knows nothing of running turns:
whoever owns it decides what a failed append stops (`on_journal_failure`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterable, Callable, Mapping, Sequence

import httpx

from .codes import Code
from .conversation import Conversation
from .errors import FxInputError
from .events import EndBody, Event
from .journal.journal import Journal
from .journal.records import ENGINE_VERSION, decode_batch, decode_checkpoint, encode_checkpoint
from .limits import JSONValue
from .persistence import Mark, Persistence
from .providers import ModelSpec, Provider
from .tools.definition import Tool

OnEvent = Callable[[dict[str, object]], None]
EventSink = Callable[[Event], None]


def tool_set_hash(tools: Mapping[str, Tool]) -> str:
    """A short hash of the tool set: names, schemas and the idempotent / writes flags."""
    described = [[t.name, t.idempotent, t.writes, dict(t.input_schema)] for t in sorted(tools.values(), key=lambda t: t.name)]
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()[:16]


class EngineCore:
    """One engine's state and settings, and the operations a turn uses on them.

    Attributes:
        conversation: the fold of every journaled event (`Conversation`).
        journal: where `commit()` queues events (a `Journal`, writing nothing without a store).
        provider, spec, client: the model endpoint, the checked model, the HTTP client.
        tools, tool_list, tools_hash: tools by name, in order, and `tool_set_hash` of them.
        instructions: the system prompt, or None.
        event_sink: gets every turn event synchronously, in order, and the turn's end
            (`report_end`).
        max_model_turns: model requests per turn.
        session_id, context, epoch: handed to every tool call's `ctx`.
    """

    def __init__(
        self,
        *,
        provider: Provider,
        spec: ModelSpec,
        tools: dict[str, Tool],
        instructions: str | None,
        persistence: Persistence | None,
        client: httpx.AsyncClient,
        on_event: OnEvent | None,
        event_sink: EventSink | None,
        max_model_turns: int,
        session_id: str | None,
        context: JSONValue,
        epoch: int | None,
        on_journal_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.provider = provider
        self.spec = spec
        self.tools = tools
        self.tool_list = list(tools.values())
        self.tools_hash = tool_set_hash(tools)
        self.instructions = instructions
        self.persistence = persistence
        self.client = client
        self.event_sink = event_sink
        self.max_model_turns = max_model_turns
        self.session_id = session_id
        self.context = context
        self.epoch = epoch
        self.conversation = Conversation()
        self.journal = Journal(persistence, head=None, on_failure=on_journal_failure, diag=self.diag)
        self._on_event = on_event

    def __repr__(self) -> str:
        open_id = self.conversation.open.id if self.conversation.open else None
        return (f"<EngineCore model={self.spec.id} provider={self.provider.name} "
                f"messages={len(self.conversation.messages)} open_turn={open_id} head={self.journal.head}>")

    # images

    @property
    def takes_images(self) -> bool:
        """False when the model's catalog entry says it takes no images (unknown: True)."""
        entry = self.spec.entry
        return entry is None or bool(entry.supports_images)

    def check_images(self, blocks: Sequence[Mapping[str, object]]) -> None:
        """`FX_MODEL_NO_IMAGES` for blocks with an image when the model takes none."""
        if not self.takes_images and any(block.get("type") == "image" for block in blocks):
            raise FxInputError(f"model {self.spec.id} does not take images", code=Code.MODEL_NO_IMAGES)

    # diagnostics

    def diag(self, event: dict[str, object]) -> None:
        """Hands a diagnostic event to `on_event`; a failing callback is ignored."""
        if self._on_event is None:
            return
        try:
            self._on_event(event)
        except Exception:  # a diagnostics callback must never break a turn
            pass

    # loading

    async def load(self, checkpoint: bytes | None) -> None:
        """Rebuilds the conversation from the store (or `checkpoint`) and sets the journal head."""
        seed = checkpoint
        head: str | None = None
        records = []
        if self.persistence is not None:
            loaded = await self.persistence.load()
            if loaded.checkpoint is not None:
                seed = loaded.checkpoint.data
            journal = loaded.journal
            records = [r async for r in journal] if isinstance(journal, AsyncIterable) else list(journal)
            if loaded.head is not None:
                head = loaded.head
            elif records:
                head = records[-1].cursor
            elif loaded.checkpoint is not None:
                head = loaded.checkpoint.through
        conv = self._restore(seed) if seed is not None else Conversation()
        for record in records:
            for kind, body in decode_batch(record.data):
                conv.apply(kind, body)
        self.conversation = conv
        self.journal.head = head
        self.diag({"type": "journal.open", "events": len(records), "checkpoint": seed is not None,
                   "turns": conv.turns, "resumable": conv.open is not None})

    def _restore(self, data: bytes) -> Conversation:
        body = decode_checkpoint(data)
        current = {"engineVersion": ENGINE_VERSION, "toolSchemaHash": self.tools_hash, "model": self.spec.id}
        saved = {"engineVersion": body.get("engine"), "toolSchemaHash": body.get("tools"), "model": body.get("model")}
        changed = [key for key in current if saved[key] != current[key]]
        if changed:
            self.diag({"type": "checkpoint.mismatch", "sessionId": self.session_id, "changed": changed,
                       "saved": saved, "current": current})
        return Conversation.from_dict(body["state"])

    # the journal

    def report_end(self, kind: str, turn_id: str, body: Mapping[str, object]) -> None:
        """Tells the event sink that turn `turn_id` ends (`turn_end {turnId, stopReason,
        usage, error?}`), yields (`turn_yield {turnId}`) or parks (`turn_pause {turnId}`).
        Called just before the record
        that says so is committed, so a sink that stores lines can store this one in the
        same write as that record (the turn's own iteration never yields it)."""
        if self.event_sink is None:
            return
        try:
            self.event_sink({"type": kind, "turnId": turn_id, **body})
        except Exception as exc:  # a failing sink must not break the turn
            self.diag({"type": "ui.error", "error": type(exc).__name__})

    def end_turn(self, turn_id: str, body: EndBody | None) -> None:
        """Ends (`body`) or yields (None) the open turn: tells the event sink, then queues
        the record with its store mark, so a sink can store its line with that record."""
        if body is None:
            self.report_end("turn_yield", turn_id, {})
            self.commit("turn_yield", {}, marks=[{"yield": True}])
        else:
            self.report_end("turn_end", turn_id, dict(body))
            self.commit("turn_end", dict(body), marks=[{"end": True}])

    def pause_turn(self) -> None:
        """Parks the open turn until its awaiting calls are decided (`turn_pause`), unless
        it is parked already: a resume with no decision records nothing."""
        turn = self.conversation.open
        if turn is not None and not turn.paused:
            self.report_end("turn_pause", turn.id, {})
            self.commit("turn_pause", {}, marks=[{"pause": "\n".join(
                ("e:" if call["kind"] == "external" else "a:") + call["id"] for call in turn.awaiting)}])

    def commit(self, kind: str, body: dict[str, object], *, marks: list[Mark] | None = None, barrier: bool = False,
               want_ack: bool = False) -> asyncio.Future[str | None] | None:
        """Applies one event to the conversation and queues it for the journal."""
        self.conversation.apply(kind, body)
        all_marks = list(marks or ())
        if self.conversation.open is not None:
            all_marks.append({"step": self.conversation.open.step_name})
        return self.journal.add(kind, body, marks=all_marks, barrier=barrier, want_ack=want_ack)

    def checkpoint(self) -> bytes:
        """The conversation as opaque bytes (at most 4 MiB)."""
        return encode_checkpoint(state=self.conversation.to_dict(), tools=self.tools_hash, model=self.spec.id)

    def settled_checkpoint(self) -> bytes | None:
        """`checkpoint()` when it is exactly what the journal's record on its way leaves
        behind: no turn open and nothing committed after that record. Else None."""
        if self.conversation.open is not None or self.journal.queued or not self.journal.enabled:
            return None
        return self.checkpoint()

    async def save_checkpoint(self) -> None:
        """Stores a checkpoint through the journal head, when the store takes them (and,
        if it says, `checkpoint_due()`: the bytes are built only then).

        A failure is only reported (`checkpoint.error`): the journal still holds everything.
        """
        save = getattr(self.persistence, "save_checkpoint", None)
        due = getattr(self.persistence, "checkpoint_due", None)
        through = self.journal.head
        if save is None or not self.journal.enabled or through is None or (due is not None and not due()):
            return
        try:
            data = self.checkpoint()
            await save(through=through, data=data)
        except Exception as exc:  # the journal still holds everything; the next turn end tries again
            self.diag({"type": "checkpoint.error", "error": getattr(exc, "code", type(exc).__name__),
                       "message": str(exc)})
            return
        self.diag({"type": "checkpoint.save", "through": through, "bytes": len(data)})
