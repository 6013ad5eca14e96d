"""A separate client process for the durable tests (prompting, streaming, steering, cancelling).

    python -m tests.durable._client REDIS_URL PREFIX SESSION_ID COMMAND [ARGS...]

Commands: `prompt ID1 ID2 ...` (prompts `p:<id>` with message id `<id>`, one after the
other, printing each acceptance as a JSON line), `stream` (prints every line of the
session as JSON until the first `turn_end`), `steer TEXT`, `cancel`.
"""

from __future__ import annotations

import json
import sys

from fxworker import Agent, Settings
from fxworker.celery_app import make_celery_app
from fxworker.store import redis_store
from fxworker.wakers import CeleryWaker


def main(argv: list[str]) -> int:
    redis_url, prefix, session_id, command, *args = argv
    settings = Settings(redis_url=redis_url, prefix=prefix)
    agent = Agent(
        "default",
        model="scripted",
        store=redis_store(redis_url, prefix=prefix),
        waker=CeleryWaker(make_celery_app(settings)),
        settings=settings,
    )
    session = agent.blocking_session(session_id)
    if command == "prompt":
        for message_id in args:
            turn = session.prompt(f"p:{message_id}", message_id=message_id)
            print(json.dumps({"messageId": turn.message_id, "repeated": turn.repeated}), flush=True)
    elif command == "stream":
        for line in session.stream(0):
            print(json.dumps(line), flush=True)
            if line.get("type") == "turn_end":
                break
    elif command == "steer":
        session.steer(args[0])
    elif command == "cancel":
        session.cancel()
    else:
        print(f"unknown command {command}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
