"""After turns run through the Redis store by an in-process worker, with credentials
refreshed on the way, no credential is in any Redis value, key, line or event."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import redis

from fxengine.providers import grok
from fxengine.providers.oauth import OAuthConfig
from fxworker import Agent, Settings, embedded
from fxworker.embedded import InProcessWaker
from fxworker.store import redis_store
from tests.providers.conftest import CredentialStore
from tests.providers.fakes import FakePlan
from tests.support.stored import unpacked


def _dump(client: redis.Redis) -> bytes:
    """Every key and value of the database, as bytes."""
    out: list[bytes] = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        out.append(key)
        if kind == b"string":
            out.append(client.get(key) or b"")
        elif kind == b"hash":
            for field, value in client.hgetall(key).items():
                out += [field, unpacked(key, field, value)]  # a checkpoint packed at rest, unpacked
        elif kind == b"list":
            out += client.lrange(key, 0, -1)
        elif kind == b"set":
            out += list(client.smembers(key))
        elif kind == b"zset":
            out += [member for member, _ in client.zrange(key, 0, -1, withscores=True)]
        elif kind == b"stream":
            for entry_id, fields in client.xrange(key):
                out.append(entry_id)
                for field, value in fields.items():
                    out += [field, unpacked(key, field, value)]  # lines packed at rest, expanded
    return b"\n".join(out)


@pytest.fixture
def worker() -> Any:
    embedded.start_embedded_workers(1)
    try:
        yield
    finally:
        embedded.stop_embedded_workers()


async def test_no_credential_reaches_redis(plan: FakePlan, grok_config: OAuthConfig, redis_url: str,
                                           key_prefix: str, worker: Any) -> None:
    creds = plan.seed_credentials(expires_in_s=5)  # refreshed in the first turn
    plan.revoke(creds["access_token"])
    store = CredentialStore(creds)
    events: list[dict] = []
    agent = Agent(
        f"plan-{uuid.uuid4().hex[:8]}",
        model="grok-4",
        provider=grok.provider(credentials=store.load, on_credentials=store.save, oauth_config=grok_config,
                               base_url=f"{plan.url}/v1"),
        store=redis_store(redis_url, prefix=key_prefix),
        waker=InProcessWaker(),
        settings=Settings(redis_url=redis_url, prefix=key_prefix, lease_s=5.0, reserve_s=4.0),
        on_event=events.append,
    )
    try:
        session = agent.session(context={"user": "u1"})
        first = await (await session.prompt("hello")).result()
        plan.revoke(store.creds["access_token"])  # the second turn meets a 401 and refreshes again
        second = await (await session.prompt("again")).result()
        lines = [line async for line in session.stream(0, follow=False)]
    finally:
        agent.close()

    assert (first.stop_reason, second.stop_reason) == ("end_turn", "end_turn"), (first.error, second.error)
    assert plan.refreshes == 2 and len(store.saved) == 2
    dump = _dump(redis.Redis.from_url(redis_url))
    assert b"hello from grok" in dump and key_prefix.encode() in dump  # the turns are stored here
    secrets = [t for tokens in plan.issued for t in (tokens["access_token"], tokens["refresh_token"], tokens["id_token"])]
    assert len(secrets) == 9
    for secret in secrets:
        assert secret.encode() not in dump
        assert secret not in json.dumps(lines)
        assert secret not in json.dumps(events, default=str)
