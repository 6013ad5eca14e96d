"""Poison broker messages: what the nemesis's `poison` fault pushes into the workers' queues.

A worker must survive any bytes in its Celery queue lists: an entry it cannot decode is
moved to the dead-letter list and the worker goes on serving. Each message carries a
marker, `chaos-poison-<seed>-<n>`, by which the run finds it again (in the dead-letter list,
or still queued). The kinds:

- `garbage`: bytes that are not JSON (nor UTF-8);
- `json`: JSON that is not a kombu envelope (an object without its fields, a list, a string);
- `base64`: a kombu envelope whose body (`body_encoding: base64`) does not decode;
- `wake`: a well-formed envelope of the task `fxworker.wake` whose arguments are wrong (a
  payload that is not a dict, a session id that is not a string, or two arguments).

The envelope is the one kombu's Redis transport writes for `CeleryWaker.wake` (protocol 2
headers, a base64 body of `[args, kwargs, embed]`).
"""

from __future__ import annotations

import base64
import binascii
import json
import random
import uuid
from typing import Any

from fxworker.keys import queue_name

KINDS = ("garbage", "json", "base64", "wake")
TASK = "fxworker.wake"
_B64_ALPHABET = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")


def marker(seed: int, n: int) -> str:
    return f"chaos-poison-{seed}-{n}"


def message(kind: str, mark: str, rng: random.Random) -> tuple[bytes, str]:
    """(the raw list entry, which variant of the kind) of one poison message."""
    if kind == "garbage":
        noise = bytes(rng.randrange(128, 256) for _ in range(rng.randint(4, 24)))
        return b"\xff\xfe" + mark.encode() + b" {not json " + noise, "bytes"
    if kind == "json":
        variant = rng.choice(("object", "list", "string"))
        value: Any = {"object": {"poison": mark, "hello": [1, 2]}, "list": [mark, 1, None], "string": mark}[variant]
        return json.dumps(value).encode(), variant
    if kind == "base64":
        return json.dumps(envelope(mark, not_base64(f"%% {mark} is not base64 %%"))).encode(), "body"
    if kind == "wake":
        variant = rng.choice(("not-a-dict", "session-not-a-string", "two-arguments"))
        args: list[Any] = {"not-a-dict": [mark],
                           "session-not-a-string": [{"sessionId": 7, "agent": "default", "reason": mark}],
                           "two-arguments": [mark, mark]}[variant]
        body = json.dumps([args, {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}])
        encoded = base64.b64encode(body.encode()).decode()
        return json.dumps(envelope(mark, encoded, argsrepr=repr(args))).encode(), variant
    raise ValueError(f"no poison kind {kind!r}")


def envelope(mark: str, body: str, *, argsrepr: str | None = None) -> dict[str, Any]:
    """A kombu message of the task `fxworker.wake` on the `default` queue, with this body."""
    task_id = f"{mark}-{uuid.uuid4().hex[:8]}"
    return {
        "body": body,
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {"lang": "py", "task": TASK, "id": task_id, "shadow": None, "eta": None, "expires": None,
                    "group": None, "group_index": None, "retries": 0, "timelimit": [None, None],
                    "root_id": task_id, "parent_id": None, "argsrepr": argsrepr or f"[{mark!r}]", "kwargsrepr": "{}",
                    "origin": "chaos-nemesis", "ignore_result": None, "replaced_task_nesting": 0,
                    "stamped_headers": None, "stamps": {}},
        "properties": {"correlation_id": task_id, "reply_to": str(uuid.uuid4()), "delivery_mode": 2,
                       "delivery_info": {"exchange": "", "routing_key": queue_name("default")}, "priority": 0,
                       "body_encoding": "base64", "delivery_tag": str(uuid.uuid4())},
    }


def not_base64(text: str) -> str:
    """`text` padded so that `base64.b64decode` refuses it (it drops what is not in the
    alphabet, then fails on 4n+1 characters)."""
    kept = sum(1 for b in text.encode() if b in _B64_ALPHABET)
    return text + "A" * ((1 - kept) % 4)


def decodes_as_base64(text: str) -> bool:
    try:
        base64.b64decode(text)
    except (binascii.Error, ValueError):
        return False
    return True
