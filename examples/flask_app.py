"""Flask: the blocking twin of the session API.

    pip install 'fxworker[examples]'
    flask --app examples.flask_app run --port 8002
    curl -H 'Content-Type: application/json' -d '{"text": "Where is order 42?"}' 127.0.0.1:8002/chat

With REDIS_URL set, run `FX_AGENTS=examples.agents fx worker` beside it; without, the turn
runs in this process (the embedded mode).
"""

from __future__ import annotations

import json

from flask import Flask, Response, request

from examples.agents import support

app = Flask(__name__)


@app.post("/chat")
def chat() -> Response:
    session = support.blocking_session(request.args.get("session_id"))
    turn = session.prompt(request.get_json()["text"])  # stored before this returns
    return Response(turn.ndjson(), mimetype="application/x-ndjson", headers={"X-Session-Id": turn.session_id})


@app.get("/chat/<session_id>")
def follow(session_id: str) -> Response:
    cursor = int(request.args.get("cursor", "0"))
    lines = (json.dumps(line) + "\n" for line in support.blocking_session(session_id).stream(cursor))
    return Response(lines, mimetype="application/x-ndjson")
