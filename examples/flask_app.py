"""Flask: the blocking twin of the session API.

    pip install flask fxworker
    REDIS_URL=redis://localhost:6379/0 flask --app examples.flask_app run
    REDIS_URL=redis://localhost:6379/0 FX_AGENTS=examples.agents fx worker
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
