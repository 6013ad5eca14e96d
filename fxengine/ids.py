"""The wall clock and the one id format: `<prefix>_` + a ULID (docs/design.md §2).

A ULID is 26 Crockford base32 characters holding a 48-bit millisecond timestamp and 80
random bits, so ids sort by creation time and never collide in practice. The engine
names its turns (`turn_`) and steers (`str_`) this way when the caller gives no id;
`fxworker.ids` makes the durable layer's ids (sessions, messages, holders, requests)
with the same `new_ulid`.
"""

from __future__ import annotations

import os
import time

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
TURN_PREFIX = "turn_"
STEER_PREFIX = "str_"


def now_ms() -> int:
    """The wall clock, in milliseconds since the epoch."""
    return int(time.time() * 1000)


def new_ulid(at_ms: int | None = None) -> str:
    """A ULID: 10 characters of millisecond time, then 16 of randomness."""
    ms = now_ms() if at_ms is None else at_ms
    value = (ms & ((1 << 48) - 1)) << 80 | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def new_turn_id() -> str:
    """A fresh turn id, `turn_` + ULID (a prompt's when its caller gives none)."""
    return TURN_PREFIX + new_ulid()


def new_steer_id() -> str:
    """A fresh steer id, `str_` + ULID (a steer's when its caller gives none)."""
    return STEER_PREFIX + new_ulid()
