"""Django: blocking views with `StreamingHttpResponse` (wired in examples/django_urls.py).

    pip install 'fxworker[examples]'
    DJANGO_SETTINGS_MODULE=examples.django_settings django-admin runserver 127.0.0.1:8003
    curl -H 'Content-Type: application/json' -d '{"text": "Where is order 42?"}' 127.0.0.1:8003/chat

With REDIS_URL set, run `FX_AGENTS=examples.agents fx worker` beside it; without, the turn
runs in this process. examples/django_settings.py says why the views are CSRF-exempt.
"""

from __future__ import annotations

import json

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from examples.agents import support


@csrf_exempt  # a JSON API: the Content-Type check below is its CSRF defence
@require_POST
def chat(request: HttpRequest) -> HttpResponse:
    if request.content_type != "application/json":
        return HttpResponse("send Content-Type: application/json", status=415)
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
