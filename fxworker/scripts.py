"""The Lua scripts of `fxworker/lua/`, their loader and one typed wrapper per script.

Every write the store makes is one script run with EVALSHA, by its SHA1; the transport
loads them all again when Redis answers NOSCRIPT (it forgets them when it restarts).

A wrapper (`accept(...)`, `append(...)`, ...) turns typed arguments into a `Call`: the
script, its KEYS and ARGV; a `Command` is a plain Redis command beside them. The store's
plans put them in order and parse their replies (`fxworker.store._senders`, `_workers`,
`_readers`); its transport sends them (`fxworker.store._transport`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import NamedTuple, Union

from .keys import IndexKeys, SessionKeys

Arg = Union[str, bytes, int]


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua file: its name (the file stem), source and SHA1 (what EVALSHA names)."""

    name: str
    source: str
    sha: str


def _load_all() -> dict[str, Script]:
    """Every `lua/<name>.lua`; a file whose name starts with `_` is a part that scripts
    include (a line `-- include: _part.lua` is replaced by that file), not a script."""
    folder = resources.files("fxworker").joinpath("lua")
    parts = {e.name: e.read_text(encoding="utf-8") for e in folder.iterdir() if e.name.startswith("_")}
    scripts: dict[str, Script] = {}
    for entry in folder.iterdir():
        if entry.name.endswith(".lua") and not entry.name.startswith("_"):
            source = _INCLUDE.sub(lambda found: parts[found.group(1)], entry.read_text(encoding="utf-8"))
            name = entry.name[: -len(".lua")]
            scripts[name] = Script(name, source, hashlib.sha1(source.encode()).hexdigest())
    return scripts


_INCLUDE = re.compile(r"^-- include: (\S+)$", re.MULTILINE)


SCRIPTS: dict[str, Script] = _load_all()
_ACCEPT = SCRIPTS["accept"]


class Call(NamedTuple):
    """One script invocation: what EVALSHA sends (a tuple: built on every store call)."""

    script: Script
    keys: Sequence[str]
    args: Sequence[Arg]

    def evalsha_args(self) -> tuple[Arg, ...]:
        return (self.script.sha, len(self.keys), *self.keys, *self.args)


class Command(NamedTuple):
    """A plain Redis command (XREAD, WAIT, ...); `key` routes it on a cluster."""

    args: tuple[Arg, ...]
    key: str | None = None


Step = Union[Call, Command]


# -- one typed wrapper per script -------------------------------------------------------


def accept(
    keys: SessionKeys,
    *,
    kind: str,
    message_id: str,
    input_json: str,
    context_json: str,
    settings_json: str,
    agent: str,
    now_ms: int,
    create: bool,
    steer_max_bytes: int,
    steer_max_count: int,
    steer_max_total_bytes: int,
    ready: IndexKeys | None = None,
    session_id: str = "",
    steer_bytes: int | None = None,
    traceparent: str = "",
    call_id: str = "",
    expired: bool = False,
    decision: str = "",
    needs: int = 0,
) -> Call:
    """accept.lua: store a prompt (`kind="p"`), steer (`"s"`) or decision (`"d"`, for
    `call_id`; `expired`: the wait's timeout; `decision`: "a" approve, "d" deny, "r" a
    result) once per message id.

    `steer_bytes` is what a steer counts against its limits: the UTF-8 bytes of its text
    (the script checks it and keeps the queued totals); without it, its JSON's length.
    `needs`: the stored layout level a claim must read to run the input (a delegated turn's).

    With `ready` (standalone Redis only: those keys sit in another cluster slot) the same
    script first marks `session_id` ready, as `mark_ready` does; without it the caller
    runs `mark_ready` before this call.
    """
    args: list[Arg] = [kind, message_id, input_json, agent, now_ms, "1" if create else "0", session_id]
    # Trailing arguments are sent only when needed: most prompts carry no context or
    # settings, and only a steer is checked against the limits.
    if kind == "d":
        args += (context_json, settings_json, "", "", "", "", traceparent, call_id, "1" if expired else "0",
                 decision)
    elif kind == "s" or traceparent:
        args += (context_json, settings_json, steer_max_bytes, steer_max_count, steer_max_total_bytes,
                 steer_bytes if steer_bytes is not None else "")
        if traceparent:
            args.append(traceparent)
    elif context_json or settings_json:
        args += (context_json, settings_json)
    if needs:
        args += [""] * (17 - len(args))
        args.append(needs)
    return Call(_ACCEPT, keys.names if ready is None else keys.names + ready.names, args)


def mark_ready(index: IndexKeys, *, session_id: str, now_ms: int) -> Call:
    """mark_ready.lua: put a session in the ready set and the session index."""
    return Call(SCRIPTS["mark_ready"], index.names, [session_id, now_ms])


def clear_ready(index: IndexKeys, *, session_id: str, older_than_ms: int, forget: bool = False) -> Call:
    """clear_ready.lua: drop a ready mark no newer than `older_than_ms` (and the index entry if `forget`)."""
    return Call(SCRIPTS["clear_ready"], index.names, [session_id, older_than_ms, "1" if forget else "0"])


def claim(
    keys: SessionKeys, *, holder: str, lease_ms: int, now_ms: int, only_work: bool = False,
    agents: Sequence[str] = (), give_up_ms: int = 0, retry_max_ms: int = 0, outage_ms: int = 0,
    reads: int | None = None,
) -> Call:
    """claim.lua: take the lease when no live one stands; bumps the epoch; reads the session.

    With `only_work`, a session with no open turn, no waiting input and no lease held is
    left as it is (reply `idle`). With `agents`, a session another agent owns is not
    claimed (reply `unserved`) until it waited `give_up_ms` (then `give_up` is set).
    `outage_ms`: when the caller last met a store outage; a takeover from a holder silent
    since before it counts no death. `reads`: the newest layout level the caller reads; a
    session a holder let go for a newer one is not claimed below it (reply `newer`).
    """
    args: list[Arg] = [holder, lease_ms, now_ms, "1" if only_work else "0",
                       ",".join(agents), give_up_ms, retry_max_ms, outage_ms, "" if reads is None else reads]
    return Call(SCRIPTS["claim"], keys.names, args)


def append(
    keys: SessionKeys,
    *,
    epoch: int,
    now_ms: int,
    ttl_ms: int,
    expected: str | None,
    check_expected: bool,
    records: Sequence[tuple[str, bytes, str, Sequence[tuple[str, str]]]],
    marks: Sequence[tuple[str, str | bytes]],
    lines: Sequence[tuple[str, str]],
    call_key: str = "",
    ready: IndexKeys | None = None,
) -> Call:
    """append.lua: the fenced write. `records` are (key, data, marks JSON, flat marks);
    `marks` apply without a record; `lines` are (JSON text without its last brace, the
    message id a `turn_end` line ends or ""); `call_key` is the idempotency key of a call
    with no records (a line-only flush), "" for none. `ready` (standalone Redis only)
    goes with a `release` mark: a release that leaves nothing to run leaves that set."""
    args: list[Arg] = [epoch, now_ms, ttl_ms, (expected or "0") if check_expected else "", len(records),
                       len(lines), len(marks), call_key]
    for key, data, marks_json, flat in records:
        args += [key, data, marks_json, len(flat)]
        for name, value in flat:
            args += [name, value]
    for mark, mark_value in marks:
        args += [mark, mark_value]
    for text, ends in lines:
        args += [text, ends]
    return Call(SCRIPTS["append"], keys.names if ready is None else [*keys.names, ready.names[0]], args)


def renew(keys: SessionKeys, *, epoch: int, lease_ms: int, now_ms: int) -> Call:
    """renew.lua: extend the head's lease; refused once released, expired or claimed again."""
    return Call(SCRIPTS["renew"], keys.names, [epoch, lease_ms, now_ms])


def release(
    keys: SessionKeys, *, epoch: int, cutoff: bool, now_ms: int, ttl_ms: int,
    ready: IndexKeys | None = None, session_id: str = "", newer: int | None = None, input_at_rest: bool = False,
) -> Call:
    """release.lua: let the session go, counting a deadline cut-off when `cutoff`;
    `input_at_rest`: a parked turn's input may go into `rest` with its log (every live
    process reads stored layout 2).

    With `ready` (standalone Redis only), a release that leaves nothing to run also takes
    `session_id` out of the ready set.
    """
    names = keys.names if ready is None else [*keys.names, ready.names[0]]
    return Call(SCRIPTS["release"], names, [epoch, "1" if cutoff else "0", now_ms, ttl_ms, session_id,
                                            "" if newer is None else newer, "1" if input_at_rest else "0"])


def save_checkpoint(
    keys: SessionKeys, *, epoch: int, now_ms: int, through: int, data: bytes, max_bytes: int, ttl_ms: int
) -> Call:
    """save_checkpoint.lua: store a checkpoint through a log cursor and trim what it covers."""
    return Call(SCRIPTS["save_checkpoint"], keys.names, [epoch, now_ms, through, data, max_bytes, ttl_ms])


def cancel(keys: SessionKeys, *, now_ms: int, message_id: str | None = None) -> Call:
    """cancel.lua: target the open (or next waiting) turn, or `message_id`'s while it is
    open or waiting, and notify the inbox."""
    return Call(SCRIPTS["cancel"], keys.names, [now_ms, message_id or ""])


def woken(keys: SessionKeys, *, now_ms: int, trust_ms: int = 0) -> Call:
    """woken.lua: note a wake of the session queued at `now_ms` (untaken till a claim),
    unless one noted less than `trust_ms` ago is outstanding (reply 0: send none)."""
    return Call(SCRIPTS["woken"], (keys.meta,), [now_ms, trust_ms])


def state(keys: SessionKeys) -> Call:
    """state.lua: one atomic snapshot of a session."""
    return Call(SCRIPTS["state"], keys.names, [])


def ack_read(keys: SessionKeys, *, after: int) -> Call:
    """ack_read.lua: after a read of `keys`' lines after cursor `after`, the write a WAIT
    on its connection waits for (none when no line follows `after`)."""
    return Call(SCRIPTS["ack_read"], (keys.meta,), [after])


def load(keys: SessionKeys) -> Call:
    """load.lua: the checkpoint, the log and `rest` of a session, in one atomic read."""
    return Call(SCRIPTS["load"], keys.names, [])
