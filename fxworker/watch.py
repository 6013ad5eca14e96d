"""Watching the inboxes of the sessions a worker process runs, for steers, prompts and cancels (§6).

One `InboxHub` per event loop and store reads the inbox of every session the loop is
running, all in one round trip (`store.watch_inboxes`: a pipeline of one XREAD each),
every `WATCH_INTERVAL_S`, and hands each new entry to that session's `InboxWatcher`, in
acceptance order; so a cancel reaches the running turn well within a second of being
stored. A process carrying 100 turns makes 4 such calls a second, not 400. Each read
returns at most a page of a session's inbox (`INBOX_PAGE_ENTRIES`); the watcher's
`after_seq` moves to the last entry handed over, so the next read goes on from there.

It polls rather than blocking: a blocking read pins a Redis connection and cannot take in
a session that starts while it waits. A watcher that stops while a read is in flight is
handed nothing more: what the read found stays in the inbox for the session's next claim.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from .errors import FxStoreUnavailableError
from .store.api import SessionStore
from .store.types import Input

log = logging.getLogger("fxworker.watch")

WATCH_INTERVAL_S = 0.25  # also the wait before a read after one that failed


class InboxWatcher:
    """Follows a session's inbox after `after_seq`, calling `on_input(entry)` for each entry.

    `start()` joins the loop's `InboxHub` for `store`; `stop()` leaves it at once (nothing
    is handed over after it returns).
    """

    def __init__(
        self, store: SessionStore, session_id: str, *, after_seq: int, on_input: Callable[[Input], None]
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.after_seq = after_seq
        self.on_input = on_input
        self._hub: InboxHub | None = None

    def __repr__(self) -> str:
        return f"<InboxWatcher session={self.session_id} after_seq={self.after_seq} watching={self._hub is not None}>"

    def start(self) -> InboxWatcher:
        self._hub = InboxHub.of(self.store)
        self._hub.add(self)
        return self

    async def stop(self) -> None:
        hub, self._hub = self._hub, None
        if hub is not None:
            hub.remove(self)

    def deliver(self, entries: list[Input]) -> None:
        for entry in entries:
            self.after_seq = max(self.after_seq, int(entry.seq))
            try:
                self.on_input(entry)
            except Exception:  # noqa: BLE001 - one bad entry must not stop the watch
                log.exception("handling inbox entry %s of %s failed", entry, self.session_id)


# The hubs of each running loop, by the store they read (a loop's store client is its own).
_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, InboxHub]] = weakref.WeakKeyDictionary()


class InboxHub:
    """Reads the inboxes of every watched session of one loop and store, in one call a turn."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self.watchers: dict[str, InboxWatcher] = {}
        self.reads = 0
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<InboxHub watching={len(self.watchers)} reads={self.reads}>"

    @classmethod
    def of(cls, store: SessionStore) -> InboxHub:
        """The running loop's hub for `store` (its underlying store, past any wrapper)."""
        base = getattr(store, "wrapped", store)
        hubs = _hubs.setdefault(asyncio.get_running_loop(), {})
        hub = hubs.get(id(base))
        if hub is None:
            # The hub holds `store`, so `base` lives (and its id stays its own) as long as it.
            hub = hubs[id(base)] = cls(store)
        return hub

    def add(self, watcher: InboxWatcher) -> None:
        self.watchers[watcher.session_id] = watcher
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="inbox-hub")

    def remove(self, watcher: InboxWatcher) -> None:
        if self.watchers.get(watcher.session_id) is watcher:
            del self.watchers[watcher.session_id]

    async def _run(self) -> None:
        while self.watchers:
            # The interval first: a watcher joins right after its claim read the inbox, so a
            # read at once would find nothing new (a turn shorter than the interval makes none).
            await asyncio.sleep(WATCH_INTERVAL_S)
            watched = dict(self.watchers)
            if not watched:
                return
            try:
                found = await self.store.watch_inboxes({sid: w.after_seq for sid, w in watched.items()})
            except FxStoreUnavailableError as exc:
                log.warning("watching %d inbox(es) failed (%s); retrying", len(watched), exc)
                continue
            except Exception:  # noqa: BLE001 - the hub must outlive one bad read
                log.exception("watching %d inbox(es) failed; retrying", len(watched))
                continue
            self.reads += 1
            for sid, entries in found.items():
                watcher = watched[sid]
                if self.watchers.get(sid) is watcher:  # not stopped while the read ran
                    watcher.deliver(entries)
