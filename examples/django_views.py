"""Django: blocking views with `StreamingHttpResponse` (wire them in your urls.py).

    urlpatterns = [path("chat", views.chat), path("chat/<str:session_id>", views.follow)]
    REDIS_URL=redis://localhost:6379/0 FX_AGENTS=examples.agents fx worker
"""

from __future__ import annotations

import json

from django.http import HttpRequest, StreamingHttpResponse
from django.views.decorators.http import require_GET, require_POST

from examples.agents import support


@require_POST
def chat(request: HttpRequest) -> StreamingHttpResponse:
    session = support.blocking_session(request.GET.get("session_id"))
    turn = session.prompt(json.loads(request.body)["text"])  # stored before this returns
    response = StreamingHttpResponse(turn.ndjson(), content_type="application/x-ndjson")
    response["X-Session-Id"] = turn.session_id
    return response


@require_GET
def follow(request: HttpRequest, session_id: str) -> StreamingHttpResponse:
    cursor = int(request.GET.get("cursor", "0"))
    lines = (json.dumps(line) + "\n" for line in support.blocking_session(session_id).stream(cursor))
    return StreamingHttpResponse(lines, content_type="application/x-ndjson")
