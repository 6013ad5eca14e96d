"""Ids and the wall clock they are stamped with (docs/design.md §2, §10).

`now_ms()` is the wall clock of the process, in milliseconds since the epoch: lease
deadlines, delivery deadlines and sweeps are all counted on it. One helper makes each
kind of id, `<prefix>_` + a ULID: sessions (`fxs_`), messages (`msg_`), steers
(`str_`), lease holders (`wkr_`) and idle-line requests (`res_`). The clock, the ULID
and the steer id are the engine's (`fxengine.ids`), so the engine's own ids have the
same form.

A generated session id is `fxs_` + a ULID: 26 Crockford base32 characters holding a
48-bit millisecond timestamp and 80 random bits, so ids sort by creation time and never
collide in practice. An application may name its sessions itself (`agent.session("user-42")`:
one per user, per ticket): 1-128 of `A-Z a-z 0-9 . _ -`, not only dots, and not starting
with `fxs_`, which is reserved for the generated form (an id that starts with it must be
one). Every store takes both; the memory store also takes `fxs_` ids of any form.

Message ids are 1-128 of `A-Z a-z 0-9 . _ : -` on every store.
"""

from __future__ import annotations

import re

# now_ms, new_ulid and new_steer_id are this module's public helpers as well.
from fxengine.ids import CROCKFORD as CROCKFORD, STEER_PREFIX as STEER_PREFIX, new_steer_id as new_steer_id
from fxengine.ids import new_ulid as new_ulid, now_ms as now_ms

from .errors import FxInvalidMessageIdError, FxInvalidSessionIdError

SESSION_PREFIX = "fxs_"
MESSAGE_PREFIX = "msg_"
HOLDER_PREFIX = "wkr_"
REQUEST_PREFIX = "res_"

# The first ULID character holds only the top 3 of 130 bits, so it is 0-7.
_ULID = r"[0-7][0-9A-HJKMNP-TV-Z]{25}"
_SESSION_ID = re.compile(rf"{SESSION_PREFIX}{_ULID}\Z")
_MEMORY_SESSION_ID = re.compile(r"[A-Za-z0-9._-]{1,128}\Z")
_ONLY_DOTS = re.compile(r"\.+\Z")  # `.` and `..` are path steps in a URL, never a session
_MESSAGE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}\Z")


def new_session_id(now_ms: int | None = None) -> str:
    """A fresh session id, `fxs_` + ULID."""
    return SESSION_PREFIX + new_ulid(now_ms)


def new_message_id(now_ms: int | None = None) -> str:
    """A fresh message id, `msg_` + ULID (a prompt's id when its caller gives none)."""
    return MESSAGE_PREFIX + new_ulid(now_ms)


def new_request_id() -> str:
    """A fresh request id, `res_` + ULID (the `requestId` of an idle line)."""
    return REQUEST_PREFIX + new_ulid()


def validate_session_id(session_id: object, *, memory: bool = False) -> str:
    """Returns `session_id` when the store can hold it; raises `FxInvalidSessionIdError`.

    A generated id (`fxs_` + ULID) or an application's own: 1-128 of `A-Z a-z 0-9 . _ -`,
    not only dots, not starting with the reserved `fxs_`. `memory=True` applies the memory
    store's looser rule (any 1-128 of `A-Za-z0-9._-`).
    """
    if not isinstance(session_id, str) or _MEMORY_SESSION_ID.match(session_id) is None:
        raise FxInvalidSessionIdError(
            f"invalid session id {session_id!r}: expected 1-128 of A-Z a-z 0-9 . _ - (or a generated fxs_ id)")
    if memory or _SESSION_ID.match(session_id) is not None:
        return session_id
    if session_id.startswith(SESSION_PREFIX):
        raise FxInvalidSessionIdError(
            f"invalid session id {session_id!r}: ids starting fxs_ are generated ones (fxs_ and 26 Crockford base32 "
            "characters); name your own sessions without that prefix")
    if _ONLY_DOTS.match(session_id) is not None:
        raise FxInvalidSessionIdError(f"invalid session id {session_id!r}: an id of dots only is a URL path step")
    return session_id


def validate_message_id(message_id: object) -> str:
    """Returns `message_id` when it is 1-128 of `A-Z a-z 0-9 . _ : -`; raises `FxInvalidMessageIdError`."""
    if not isinstance(message_id, str) or _MESSAGE_ID.match(message_id) is None:
        raise FxInvalidMessageIdError(f"invalid message id {message_id!r}: expected 1-128 of A-Z a-z 0-9 . _ : -")
    return message_id


def ulid_time_ms(session_id: str) -> int:
    """The creation time (ms since the epoch) encoded in a `fxs_` session id."""
    value = 0
    for char in session_id[len(SESSION_PREFIX) : len(SESSION_PREFIX) + 10]:
        value = value * 32 + CROCKFORD.index(char)
    return value


def new_holder_id(now_ms: int | None = None) -> str:
    """A fresh lease holder id, `wkr_` + ULID (one per claim attempt or worker run)."""
    return HOLDER_PREFIX + new_ulid(now_ms)
