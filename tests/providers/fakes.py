"""Local fake servers for the provider tests, over real HTTP on loopback.

`FakePlan` is one threaded HTTP server playing a plan's three sides:

- the OAuth issuer: ``/oauth/authorize`` and ``/oauth2/authorize`` (redirect to the
  redirect URI with a code), ``/oauth2/userinfo`` (the `sub` of an access token),
  ``/oauth/token`` (authorization code with PKCE, refresh token with rotation, RFC 8628
  device code), the Codex device flow (``/api/accounts/deviceauth/*``) and the RFC 8628
  device start (``/oauth2/device/code``);
- the Codex API: ``/backend-api/codex/responses`` streaming Responses events;
- a Chat Completions API (Grok): ``/v1/chat/completions``.

The APIs accept only access tokens the issuer handed out and has not revoked; a 401
body quotes the token back (as some servers do), so masking is tested. Tokens are
unsigned JWTs naming the account (`sub` and OpenAI's auth claim).

`FakeGateway` serves ``/v1/models`` and a Chat Completions endpoint that answers 400
quoting the key it was sent.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

HOLD_TIMEOUT_S = 10.0


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt(claims: dict[str, Any]) -> str:
    """An unsigned JWT with `claims` (and a random nonce, so every token differs)."""
    header = b64url(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    payload = b64url(json.dumps({**claims, "nonce": secrets.token_hex(8)}).encode())
    return f"{header}.{payload}.sig{secrets.token_hex(4)}"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Base:
    """A threaded HTTP server whose handler calls `self.handle(method, path, query, headers, body)`."""

    def __init__(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _run(self, method: str) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, out_headers, body = owner.handle(method, parts.path, parse_qs(parts.query), headers, raw)
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                for name, value in out_headers.items():
                    self.send_header(name, value)
                if "Content-Type" not in out_headers:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._run("GET")

            def do_POST(self) -> None:
                self._run("POST")

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []

    def handle(self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str],
               raw: bytes) -> tuple[int, dict[str, str], Any]:
        raise NotImplementedError

    def start(self) -> Any:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def record(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> None:
        with self.lock:
            self.requests.append((method, path, headers, raw))

    def paths(self) -> list[str]:
        with self.lock:
            return [path for _, path, _, _ in self.requests]


def _form(raw: bytes) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(raw.decode()).items()}


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return {}


def _sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


class FakePlan(_Base):
    """The OAuth issuer and the model APIs of one plan (see the module docstring).

    Attributes:
        account: the account the issuer signs users into.
        refresh_account: the account a refresh answers for (another one to test the
            same-account check); None means `account`.
        expires_in: lifetime of issued access tokens, seconds.
        refreshes: refresh-token grants answered (200 or not).
        reject_all: the APIs refuse every token (a revoked grant).
        hold_refresh: when set, a refresh waits for it (bounded) before answering.
        opaque: issue opaque access tokens and no id token (the account is known only
            from ``/oauth2/userinfo``).
        reply: the model reply: ``("text", str)`` or ``("tool", name, arguments)`` then text.
    """

    def __init__(self, *, account: str = "acct-1") -> None:
        super().__init__()
        self.account = account
        self.refresh_account: str | None = None
        self.expires_in = 3600
        self.refreshes = 0
        self.reject_all = False
        self.hold_refresh: threading.Event | None = None
        self.opaque = False
        self._subjects: dict[str, str] = {}  # access token -> account
        self.on_refresh: Callable[[], None] | None = None
        self._codes: dict[str, dict[str, str]] = {}
        self._refresh_tokens: dict[str, str] = {}  # live refresh token -> account
        self._access: set[str] = set()
        self.revoked: set[str] = set()
        self._devices: dict[str, dict[str, Any]] = {}
        self.issued: list[dict[str, Any]] = []
        self.api_calls: list[dict[str, Any]] = []

    # -- tokens

    def _tokens(self, account: str) -> dict[str, Any]:
        claims = {"sub": account, "https://api.openai.com/auth": {"chatgpt_account_id": account},
                  "exp": int(time.time()) + self.expires_in}
        access = f"at-{secrets.token_hex(16)}" if self.opaque else jwt(claims)
        refresh = f"rt-{secrets.token_hex(16)}"
        self._access.add(access)
        self._subjects[access] = account
        self._refresh_tokens[refresh] = account
        tokens = {"access_token": access, "refresh_token": refresh, "expires_in": self.expires_in, "token_type": "Bearer"}
        if not self.opaque:
            tokens["id_token"] = jwt(claims)
        self.issued.append(tokens)
        return tokens

    def seed_credentials(self, *, expires_in_s: float = 3600) -> dict[str, Any]:
        """Credentials as a finished sign-in would hold them, expiring in `expires_in_s`."""
        with self.lock:
            tokens = self._tokens(self.account)
        creds = {"access_token": tokens["access_token"], "refresh_token": tokens["refresh_token"],
                 "account_id": self.account, "expires_at": int((time.time() + expires_in_s) * 1000)}
        if "id_token" in tokens:
            creds["id_token"] = tokens["id_token"]
        return creds

    def approve_device(self, user_code: str) -> None:
        """The user entered `user_code` on the verification page."""
        with self.lock:
            for device in self._devices.values():
                if device["user_code"] == user_code:
                    device["approved"] = True

    def revoke(self, access_token: str) -> None:
        with self.lock:
            self.revoked.add(access_token)

    # -- routes

    def handle(self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str],
               raw: bytes) -> tuple[int, dict[str, str], Any]:
        self.record(method, path, headers, raw)
        if path in ("/oauth/authorize", "/oauth2/authorize"):
            return self._authorize(query)
        if path == "/oauth2/userinfo":
            token = headers.get("authorization", "").removeprefix("Bearer ")
            with self.lock:
                account = self._subjects.get(token) if token not in self.revoked else None
            return (200, {}, {"sub": account, "email": f"{account}@example.test"}) if account else (401, {}, {})
        if path in ("/oauth/token", "/oauth2/token"):
            return self._token(_form(raw))
        if path == "/api/accounts/deviceauth/usercode":
            return self._device_start(openai=True)
        if path == "/oauth2/device/code":
            return self._device_start(openai=False)
        if path == "/api/accounts/deviceauth/token":
            return self._device_poll_openai(_json(raw))
        if path == "/backend-api/codex/responses":
            return self._api(headers, _json(raw), responses=True)
        if path == "/v1/chat/completions":
            return self._api(headers, _json(raw), responses=False)
        return 404, {}, {"error": {"message": f"no route {path}"}}

    def _authorize(self, query: dict[str, list[str]]) -> tuple[int, dict[str, str], Any]:
        q = {k: v[0] for k, v in query.items()}
        if q.get("code_challenge_method") != "S256" or not q.get("code_challenge"):
            return 400, {}, {"error": "invalid_request"}
        code = f"code-{secrets.token_hex(8)}"
        with self.lock:
            self._codes[code] = {"challenge": q["code_challenge"], "redirect_uri": q["redirect_uri"],
                                 "client_id": q["client_id"]}
        location = f"{q['redirect_uri']}?{urlencode({'code': code, 'state': q['state']})}"
        return 302, {"Location": location}, b""

    def _token(self, form: dict[str, str]) -> tuple[int, dict[str, str], Any]:
        grant = form.get("grant_type")
        if grant == "authorization_code":
            with self.lock:
                issued = self._codes.pop(form.get("code", ""), None)
                if issued is None:
                    return 400, {}, {"error": "invalid_grant"}
                challenge = b64url(hashlib.sha256(form.get("code_verifier", "").encode()).digest())
                if challenge != issued["challenge"] or form.get("redirect_uri") != issued["redirect_uri"]:
                    return 400, {}, {"error": "invalid_grant", "error_description": "PKCE verifier mismatch"}
                return 200, {}, self._tokens(self.account)
        if grant == "refresh_token":
            return self._refresh(form.get("refresh_token", ""))
        if grant == "urn:ietf:params:oauth:grant-type:device_code":
            with self.lock:
                device = self._devices.get(form.get("device_code", ""))
                if device is None:
                    return 400, {}, {"error": "invalid_grant"}
                if not device["approved"]:
                    return 400, {}, {"error": "authorization_pending"}
                del self._devices[form["device_code"]]
                return 200, {}, self._tokens(self.account)
        return 400, {}, {"error": "unsupported_grant_type"}

    def _refresh(self, refresh_token: str) -> tuple[int, dict[str, str], Any]:
        with self.lock:
            self.refreshes += 1
            hold = self.hold_refresh
        if self.on_refresh is not None:
            self.on_refresh()
        if hold is not None:
            hold.wait(HOLD_TIMEOUT_S)
        with self.lock:
            account = self._refresh_tokens.pop(refresh_token, None)  # rotation: a refresh token works once
            if account is None:
                return 400, {}, {"error": "invalid_grant",
                                 "error_description": f"refresh token {refresh_token} was already used"}
            return 200, {}, self._tokens(self.refresh_account or account)

    def _device_start(self, *, openai: bool) -> tuple[int, dict[str, str], Any]:
        device_code = f"dc-{secrets.token_hex(8)}"
        user_code = f"{secrets.token_hex(2).upper()}-{secrets.token_hex(2).upper()}"
        with self.lock:
            self._devices[device_code] = {"user_code": user_code, "approved": False}
        if openai:
            return 200, {}, {"device_auth_id": device_code, "user_code": user_code, "interval": "1"}
        return 200, {}, {"device_code": device_code, "user_code": user_code, "verification_uri": f"{self.url}/device",
                         "expires_in": 600, "interval": 1}

    def _device_poll_openai(self, body: Any) -> tuple[int, dict[str, str], Any]:
        with self.lock:
            device = self._devices.get(body.get("device_auth_id", ""))
            if device is None or device["user_code"] != body.get("user_code"):
                return 400, {}, {"error": "invalid_request"}
            if not device["approved"]:
                return 403, {}, {"error": {"code": "deviceauth_authorization_pending"}}
            del self._devices[body["device_auth_id"]]
            verifier = b64url(secrets.token_bytes(32))
            code = f"code-{secrets.token_hex(8)}"
            challenge = b64url(hashlib.sha256(verifier.encode()).digest())
            self._codes[code] = {"challenge": challenge, "redirect_uri": f"{self.url}/deviceauth/callback",
                                 "client_id": "device"}
            return 200, {}, {"authorization_code": code, "code_challenge": challenge, "code_verifier": verifier}

    # -- the model APIs

    def _api(self, headers: dict[str, str], body: Any, *, responses: bool) -> tuple[int, dict[str, str], Any]:
        token = headers.get("authorization", "").removeprefix("Bearer ")
        with self.lock:
            self.api_calls.append({"headers": headers, "body": body, "token": token})
            ok = token in self._access and token not in self.revoked and not self.reject_all
        if not ok:
            return 401, {}, {"error": {"message": f"Invalid or expired token: {token}", "type": "invalid_request_error"}}
        sse = {"Content-Type": "text/event-stream"}
        if responses:
            return 200, sse, _sse(self._responses_reply(body))
        return 200, sse, _sse(self._chat_reply(body)) + b"data: [DONE]\n\n"

    def _has_tool_result(self, body: Any, *, responses: bool) -> bool:
        if responses:
            return any(item.get("type") == "function_call_output" for item in body.get("input") or [])
        return any(m.get("role") == "tool" for m in body.get("messages") or [])

    def _responses_reply(self, body: Any) -> list[dict[str, Any]]:
        usage = {"input_tokens": 11, "output_tokens": 3, "input_tokens_details": {"cached_tokens": 2},
                 "output_tokens_details": {"reasoning_tokens": 1}}
        if body.get("tools") and not self._has_tool_result(body, responses=True):
            item = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": body["tools"][0]["name"],
                    "arguments": json.dumps({"q": "x"})}
            return [{"type": "response.created", "response": {"id": "resp_1"}},
                    {"type": "response.output_item.added", "item": {**item, "arguments": ""}},
                    {"type": "response.output_item.done", "item": item},
                    {"type": "response.completed", "response": {"id": "resp_1", "model": body["model"], "usage": usage}}]
        return [{"type": "response.created", "response": {"id": "resp_2"}},
                {"type": "response.reasoning_summary_text.delta", "delta": "thinking"},
                {"type": "response.output_text.delta", "delta": "hello "},
                {"type": "response.output_text.delta", "delta": "from codex"},
                {"type": "response.completed", "response": {"id": "resp_2", "model": body["model"], "usage": usage}}]

    def _chat_reply(self, body: Any) -> list[dict[str, Any]]:
        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": body.get("model")}
        return [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hello from grok"},
                                      "finish_reason": None}]},
                {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                 "usage": {"prompt_tokens": 5, "completion_tokens": 3}}]


class FakeGateway(_Base):
    """AI Gateway's catalog and a Chat Completions endpoint that refuses (400) quoting the key."""

    def __init__(self, catalog: dict[str, Any]) -> None:
        super().__init__()
        self.catalog = catalog

    def handle(self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str],
               raw: bytes) -> tuple[int, dict[str, str], Any]:
        self.record(method, path, headers, raw)
        key = headers.get("authorization", "").removeprefix("Bearer ")
        if path == "/v1/models":
            if not key:
                return 401, {}, {"error": {"message": "missing key"}}
            return 200, {}, self.catalog
        if path == "/v1/chat/completions":
            return 400, {}, {"error": {"message": f"Incorrect API key provided: {key}. Find your key at ...",
                                       "type": "invalid_request_error"}}
        return 404, {}, {"error": {"message": f"no route {path}"}}
