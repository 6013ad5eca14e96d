"""`GET /openapi.json`: the API of §3 as an OpenAPI 3.1 description.

The request bodies are the wire models of `bodies.py` (their JSON schema, camelCase
aliases); every error is `{"error": {"code": "FX_…", "message": "…"}}`. Written here once,
next to the routes, and checked against the running app by `tests/web/test_openapi.py`
(a property-based run: no 500, every answer in the description).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from fxworker.timeline import DEFAULT_PAGE_TURNS, MAX_PAGE_TURNS

from .bodies import CreateSessionBody, DecisionBody, PromptBody, SteerBody

SESSION_ID = {"name": "session_id", "in": "path", "required": True,
              "schema": {"type": "string", "description": "fxs_ and a ULID, or an application's own id (1-128 of A-Z a-z 0-9 . _ -)"}}
ERROR = {"$ref": "#/components/schemas/Error"}
ACCEPTED = {"$ref": "#/components/schemas/Accepted"}
STATE = {"$ref": "#/components/schemas/State"}
TIMELINE = {"$ref": "#/components/schemas/Timeline"}
_INT = {"type": "integer"}
_STEP = {"type": ["integer", "null"]}
# `fxworker.timeline`: a page of turns, each with the parts (epochs) that ran it, its steps
# and tool calls, and the cursor of the next page.
TIMELINE_SCHEMA: dict[str, object] = {
    "type": "object", "required": ["sessionId", "turns", "next"], "properties": {
        "sessionId": {"type": "string"},
        "next": {"type": ["integer", "null"], "minimum": 0,
                 "description": "the cursor to read the next page after; null: this page reaches the end"},
        "turns": {"type": "array", "items": {
            "type": "object",
            "required": ["messageId", "input", "stopReason", "error", "deliveries", "steps", "tools", "steers",
                         "waits", "delegations"],
            "properties": {
                "messageId": {"type": "string"},
                "input": {"type": ["string", "null"], "maxLength": 200},
                "stopReason": {"type": ["string", "null"]},
                "error": {"type": ["object", "null"]},
                "steers": _INT,
                "deliveries": {"type": "array", "items": {
                    "type": "object", "required": ["epoch", "startCursor", "endCursor", "how"], "properties": {
                        "epoch": _INT, "startCursor": _INT, "endCursor": _INT,
                        "how": {"enum": ["ended", "yielded", "cut off", "died", "paused", "running"]}}}},
                "steps": {"type": "array", "items": {
                    "type": "object", "required": ["step", "epoch", "textChars", "reasoningChars", "withdrawn"],
                    "properties": {"step": _INT, "epoch": _INT, "textChars": _INT, "reasoningChars": _INT,
                                   "withdrawn": {"type": "boolean"}}}},
                "tools": {"type": "array", "items": {
                    "type": "object", "required": ["id", "name", "step", "epochs", "outcome", "isError"],
                    "properties": {
                        "id": {"type": "string"}, "name": {"type": "string"}, "step": _STEP,
                        "epochs": {"type": "array", "items": _INT},
                        "outcome": {"enum": ["ran", "rerun", "may have partly run", "running", "unfinished"]},
                        "isError": {"type": ["boolean", "null"]}}}},
                "waits": {"type": "array", "items": {
                    "type": "object", "required": ["id", "name", "kind", "decision", "by", "reason", "pausedAtMs",
                                                   "decidedAtMs", "waitedMs"],
                    "properties": {
                        "id": {"type": "string"}, "name": {"type": "string"}, "kind": {"type": "string"},
                        "decision": {"type": ["string", "null"]}, "by": {"type": ["string", "null"]},
                        "reason": {"type": ["string", "null"]}, "pausedAtMs": _STEP, "decidedAtMs": _STEP,
                        "waitedMs": _STEP}}},
                "delegations": {"type": "array", "items": {
                    "type": "object", "required": ["callId", "sessionId", "agent", "childMessageId", "depth",
                                                   "stopReason", "usage", "error"],
                    "properties": {
                        "callId": {"type": "string"}, "sessionId": {"type": "string"}, "agent": {"type": "string"},
                        "childMessageId": {"type": ["string", "null"]}, "depth": _INT,
                        "stopReason": {"type": ["string", "null"]}, "usage": {"type": ["object", "null"]},
                        "error": {"type": ["object", "null"]},
                        "turn": {"description": "with children=1: the child's turn, as a turn of this page "
                                                "(null: not found)"}}}},
            }}},
    }}


def _errors(*statuses: int) -> dict[str, object]:
    return {str(s): {"description": "an FX_ error", "content": {"application/json": {"schema": ERROR}}}
            for s in statuses}


def _json(schema: Mapping[str, object], description: str) -> dict[str, object]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _body(model: type[BaseModel]) -> dict[str, object]:
    schema = model.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
    return {"required": True, "content": {"application/json": {"schema": schema}}}


COMMON = (400, 401, 403, 404, 410, 413, 415, 503)


@cache
def document() -> dict[str, object]:
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
        "/v1/sessions/{session_id}/calls/{call_id}": {
            "post": {"summary": "Decide a call the session's parked turn waits on: approve, deny, or an external "
                               "tool's result", "parameters": [
                                   SESSION_ID, {"name": "call_id", "in": "path", "required": True,
                                                "schema": {"type": "string"}}],
                     "requestBody": _body(DecisionBody),
                     "responses": {"202": _json({"type": "object", "required": [
                         "sessionId", "callId", "messageId", "repeated", "turnId", "cursor"]}, "stored"),
                         **_errors(*COMMON, 409, 503)}},
        },
        "/v1/sessions/{session_id}/timeline": {
            "get": {"summary": "What the session went through, a page of turns at a time: each turn, the workers "
                               "(epochs) that ran it and how each part ended, its steps and tool calls, read from "
                               "its stored lines",
                    "parameters": [
                        SESSION_ID,
                        {"name": "cursor", "in": "query", "schema": {"type": "string"},
                         "description": "the turns after this stream cursor (0, or a page's next)"},
                        {"name": "limit", "in": "query", "schema": {"type": "string"},
                         "description": f"at most this many turns, 1 to {MAX_PAGE_TURNS} "
                                        f"(default {DEFAULT_PAGE_TURNS})"},
                        {"name": "children", "in": "query", "schema": {"type": "string", "enum": ["0", "1"]},
                         "description": "1: each delegation's child turn nested in it (`turn`), down the chain"},
                    ],
                    "responses": {"200": _json(TIMELINE, "the timeline"), **_errors(*COMMON)}},
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
            "Timeline": TIMELINE_SCHEMA,
            "State": {"type": "object", "required": ["sessionId", "agent", "status", "cursor", "turns", "epoch"],
                      "properties": {"status": {"enum": ["idle", "waiting", "running", "paused"]},
                                     "pendingCalls": {"type": "array", "items": {"type": "string"}}}},
        }},
    }


async def openapi_json(request: Request) -> Response:
    """`GET /openapi.json`: this description (open, like `/healthz`)."""
    return JSONResponse(document())
