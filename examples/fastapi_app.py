"""FastAPI: call the library from your own routes (async), or mount the built-in API.

    pip install 'fxworker[examples]'
    uvicorn examples.fastapi_app:app --port 8001
    curl -H 'Content-Type: application/json' -d '{"text": "Where is order 42?"}' 127.0.0.1:8001/chat

With REDIS_URL set, run `FX_AGENTS=examples.agents fx worker` beside it; without, the turn
runs in this process (the embedded mode). The built-in API and page are under /fx/.
"""

from __future__ import annotations

import json

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from examples.agents import support
from fxworker.web import create_app

app = FastAPI()


@app.post("/chat")
async def chat(request: Request, session_id: str | None = None) -> StreamingResponse:
    body = await request.json()
    # Check here that the caller may use this session.
    turn = await support.session(session_id).prompt(body["text"])  # returns once the prompt is stored
    return StreamingResponse(turn.ndjson(), media_type="application/x-ndjson", headers={"X-Session-Id": turn.session_id})


@app.get("/chat/{session_id}")
async def follow(session_id: str, cursor: int = 0) -> StreamingResponse:
    async def lines():
        async for line in support.session(session_id).stream(cursor):
            yield (json.dumps(line) + "\n").encode()

    return StreamingResponse(lines(), media_type="application/x-ndjson")


async def allow_signed_in(request: Request, session_id: str | None, action: str) -> bool:
    return request.headers.get("x-user") is not None  # your own check


# The whole §3 API and the page under /fx/ (open /fx/), guarded by your hook instead of FX_API_TOKEN.
app.mount("/fx", create_app(agents=[support], authorize=allow_signed_in))
