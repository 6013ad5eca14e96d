"""Building stores: the embedded default, settings, and refused configurations."""

from __future__ import annotations

import logging

import pytest

from fxworker.errors import FxConfigError
from fxworker.ids import new_session_id
from fxworker.settings import Settings
from fxworker.store import embedded_store, redis_store


async def test_no_redis_url_means_the_embedded_store(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="fxworker.store"):
        store = redis_store(settings=Settings(redis_url=None, prefix="fxfactory"))
    assert store.kind == "embedded" and store.prefix == "fxfactory"
    assert any("REDIS_URL is not set" in r.getMessage() for r in caplog.records)
    sid = new_session_id()
    await store.accept(sid, agent="default", message_id="m1", input="x")
    # Every embedded store of this process shares one fake server.
    assert (await embedded_store(prefix="fxfactory").state(sid)).pending == 1
    await store.aclose()


def test_refused_configurations() -> None:
    with pytest.raises(FxConfigError):
        redis_store("redis://127.0.0.1:1/0", ack="sometimes")
    with pytest.raises(FxConfigError):
        redis_store("redis://127.0.0.1:1/0", ack="replica", cluster=True)
    with pytest.raises(FxConfigError):
        redis_store(settings=Settings(redis_url=None, ack="aof"))
    with pytest.raises(ValueError):
        redis_store("redis://127.0.0.1:1/0", prefix="fx{x}")


async def test_one_client_only_says_what_is_missing() -> None:
    import fakeredis

    store = redis_store(client=fakeredis.FakeAsyncRedis(), prefix="fxone")
    with pytest.raises(FxConfigError):
        store.sync.state(new_session_id())
    await store.aclose()
