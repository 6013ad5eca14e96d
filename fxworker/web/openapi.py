"""`GET /openapi.json`: the API of §3 as an OpenAPI 3.1 description.

The request bodies are the wire models of `bodies.py` (their JSON schema, camelCase
aliases); every error is `{"error": {"code": "FX_…", "message": "…"}}`. Written here once,
next to the routes, and checked against the running app by `tests/web/test_openapi.py`
(a property-based run: no 500, every answer in the description).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .bodies import CreateSessionBody, PromptBody, SteerBody

SESSION_ID = {"name": "session_id", "in": "path", "required": True,
              "schema": {"type": "string", "description": "fxs_ and a ULID"}}
ERROR = {"$ref": "#/components/schemas/Error"}
ACCEPTED = {"$ref": "#/components/schemas/Accepted"}
STATE = {"$ref": "#/components/schemas/State"}


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(s): {"description": "an FX_ error", "content": {"application/json": {"schema": ERROR}}}
            for s in statuses}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _body(model: Any) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
    return {"required": True, "content": {"application/json": {"schema": schema}}}


COMMON = (400, 401, 403, 404, 410, 413, 415, 503)


@cache
def document() -> dict[str, Any]:
    """The OpenAPI description of the app's routes."""
    ndjson = {"description": "NDJSON stream lines", "content": {"application/x-ndjson": {"schema": {"type": "string"}}}}
    session_ops = {
        "/v1/sessions": {
            "post": {"summary": "Create a session with its first prompt", "requestBody": _body(CreateSessionBody),
                     "responses": {"202": _json(ACCEPTED, "stored"), **_errors(*COMMON, 409)}},
            "get": {"summary": "Recent sessions, newest first",
                    "parameters": [{"name": "limit", "in": "query", "schema": {"type": "string"}}],
                    "responses": {"200": _json({"type": "object", "required": ["sessions"], "properties": {
                        "sessions": {"type": "array", "items": STATE}}}, "the sessions"), **_errors(*COMMON)}},
        },
        "/v1/sessions/{session_id}": {
            "get": {"summary": "A session's state", "parameters": [SESSION_ID],
                    "responses": {"200": _json(STATE, "its state"), **_errors(*COMMON)}},
        },
        "/v1/sessions/{session_id}/prompts": {
            "post": {"summary": "The next prompt", "parameters": [SESSION_ID], "requestBody": _body(PromptBody),
                     "responses": {"202": _json(ACCEPTED, "stored"), **_errors(*COMMON, 409)}},
        },
        "/v1/sessions/{session_id}/steer": {
            "post": {"summary": "Steer the running turn", "parameters": [SESSION_ID], "requestBody": _body(SteerBody),
                     "responses": {"202": _json({"type": "object", "required": ["sessionId", "messageId", "repeated"]},
                                                "stored"), **_errors(*COMMON, 409, 429)}},
        },
        "/v1/sessions/{session_id}/cancel": {
            "post": {"summary": "Cancel the running or waiting turn", "parameters": [SESSION_ID],
                     "responses": {"202": _json({"type": "object", "required": ["sessionId", "cancelRequested"]},
                                                "asked"), **_errors(*COMMON)}},
        },
        "/v1/sessions/{session_id}/timeline": {
            "get": {"summary": "What the session went through: turns, the workers that ran them, tool calls",
                    "parameters": [SESSION_ID],
                    "responses": {"200": _json({"type": "object", "required": ["sessionId", "turns"]}, "the timeline"),
                                  **_errors(*COMMON)}},
        },
        "/v1/sessions/{session_id}/stream": {
            "get": {"summary": "The session's lines after a cursor", "parameters": [
                SESSION_ID,
                {"name": "cursor", "in": "query", "schema": {"type": "string"}},
                {"name": "follow", "in": "query", "schema": {"type": "string"}},
            ], "responses": {"200": ndjson, **_errors(*COMMON)}},
        },
        "/healthz": {"get": {"summary": "Liveness, with a store round trip", "responses": {
            "200": _json({"type": "object", "required": ["ok", "store"]}, "healthy"), **_errors(503)}}},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "fxworker", "version": "1"},
        "paths": session_ops,
        "components": {"schemas": {
            "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                "type": "object", "required": ["code", "message"],
                "properties": {"code": {"type": "string", "pattern": "^FX_[A-Z_]+$"}, "message": {"type": "string"}},
            }}},
            "Accepted": {"type": "object", "required": ["sessionId", "messageId", "repeated", "cursor"], "properties": {
                "sessionId": {"type": "string"}, "messageId": {"type": "string"}, "repeated": {"type": "boolean"},
                "cursor": {"type": "integer"}}},
            "State": {"type": "object", "required": ["sessionId", "agent", "status", "cursor", "turns", "epoch"],
                      "properties": {"status": {"enum": ["idle", "waiting", "running"]}}},
        }},
    }


async def openapi_json(request: Request) -> Response:
    """`GET /openapi.json`: this description (open, like `/healthz`)."""
    return JSONResponse(document())
