"""Tools and provider of the durable tests, shared by the workers' agents module and the tests.

- `lookup` (idempotent): answers `found:<q>`;
- `send` (not idempotent): records each real execution in the Redis list
  `<FX_PREFIX>:test:sent` (`<execution_id>|<epoch>|<to>`) on `FX_TEST_EFFECTS_URL`
  (default `REDIS_URL`), so a test can count them;
- `slow` (idempotent): sleeps `seconds`, then answers `slept`; aborts with the turn;
- `refund` (not idempotent, waits for approval): records each real execution in
  `<FX_PREFIX>:test:refunds` as `send` does, answers `refunded <amount>`;
- `pick_file` (external: a client gives its result; no body runs here).
"""

from __future__ import annotations

import asyncio
import os

import redis

from fxengine.tools import Tool

PREFIX = os.environ.get("FX_PREFIX", "fx")
REDIS_URL = os.environ.get("FX_TEST_EFFECTS_URL") or os.environ.get("REDIS_URL", "")
MODEL_URL = os.environ.get("FX_TEST_MODEL_URL", "http://127.0.0.1:9/v1")

_client: redis.Redis | None = None


def sent_key(prefix: str = PREFIX) -> str:
    return f"{prefix}:test:sent"


def refunds_key(prefix: str = PREFIX) -> str:
    return f"{prefix}:test:refunds"


def _redis() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(REDIS_URL)
    return _client


async def _lookup(input: dict, ctx) -> str:
    return f"found:{input.get('q', '')}"


def _send(input: dict, ctx) -> str:
    _redis().rpush(sent_key(), f"{ctx.execution_id}|{ctx.epoch}|{input.get('to', '')}")
    return f"sent to {input.get('to', '')}"


def _refund(input: dict, ctx) -> str:
    _redis().rpush(refunds_key(), f"{ctx.execution_id}|{ctx.epoch}|{input.get('amount', 0)}")
    return f"refunded {input.get('amount', 0)}"


def _external(input: dict, ctx) -> str:
    raise AssertionError("an external tool's body never runs")


async def _slow(input: dict, ctx) -> str:
    seconds = float(input.get("seconds", 1))
    try:
        await asyncio.wait_for(ctx.signal.wait(), timeout=seconds)
    except asyncio.TimeoutError:
        return "slept"
    return "aborted"


def tools() -> list[Tool]:
    obj = {"type": "object", "properties": {}}
    return [
        Tool("lookup", "Looks something up.", {**obj, "properties": {"q": {"type": "string"}}}, idempotent=True, execute=_lookup),
        Tool("send", "Sends a message (an effect).", {**obj, "properties": {"to": {"type": "string"}}}, idempotent=False, execute=_send),
        Tool("slow", "Takes a while.", {**obj, "properties": {"seconds": {"type": "number"}}}, idempotent=True, execute=_slow),
        Tool("refund", "Refunds an order (a person approves it first).",
             {**obj, "properties": {"amount": {"type": "integer"}}}, idempotent=False, execute=_refund, approval=True),
        Tool("pick_file", "Lets the user pick a file on their machine.",
             {**obj, "properties": {"pattern": {"type": "string"}}}, idempotent=False, execute=_external, external=True),
    ]


def provider(model_url: str = MODEL_URL) -> dict:
    return {
        "name": "scripted",
        "base_url": model_url,
        "models": {"scripted": {"context_window": 100_000, "max_output_tokens": 4096, "supports_tools": True}},
    }

