"""Building stores: the embedded default, settings, and refused configurations."""

from __future__ import annotations

import logging

import pytest

from fxworker.errors import FxConfigError
from fxworker.ids import new_session_id
from fxworker.settings import Settings
from fxworker.store import parse_store_url, embedded_store, redis_store


async def test_no_redis_url_means_the_embedded_store(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="fxworker.store"):
        store = redis_store(settings=Settings(redis_url=None, prefix="fxfactory"))
    assert store.kind == "embedded" and store.prefix == "fxfactory"
    assert any("no FX_STORE_URL or REDIS_URL" in r.getMessage() for r in caplog.records)
    sid = new_session_id()
    await store.accept(sid, agent="default", message_id="m1", input="x")
    # Every embedded store of this process shares one fake server.
    assert (await embedded_store(prefix="fxfactory").state(sid)).pending == 1
    await store.aclose()


def test_refused_configurations() -> None:
    with pytest.raises(FxConfigError):
        redis_store("redis://127.0.0.1:1/0", ack="sometimes")
    for url in ("127.0.0.1:6379", "http://127.0.0.1:6379", "redis+cluster://127.0.0.1:7000/1",
                "redis+sentinel://127.0.0.1:26379", "redis+sentinel://127.0.0.1:26379/main/x",
                "redis+cluster://h:port/0", "redis+cluster:///0"):
        with pytest.raises(FxConfigError):
            redis_store(url)
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


def test_store_urls_name_their_topology() -> None:
    one = parse_store_url("rediss://u:p@h:6380/2")
    assert (one.kind, one.tls, one.url) == ("redis", True, "rediss://u:p@h:6380/2")
    cluster = parse_store_url("redis+cluster://u:s%40cret@a:7000,b:7001,c/0")
    assert cluster.kind == "cluster" and cluster.nodes == (("a", 7000), ("b", 7001), ("c", 6379))
    assert (cluster.username, cluster.password, cluster.db) == ("u", "s@cret", 0)
    sentinel = parse_store_url("rediss+sentinel://:pw@s1:26379,s2/main/3?sentinel_password=sp")
    assert sentinel.kind == "sentinel" and sentinel.tls and sentinel.master == "main" and sentinel.db == 3
    assert sentinel.nodes == (("s1", 26379), ("s2", 26379)) and sentinel.password == "pw"
    assert sentinel.sentinel_password == "sp"
    assert "pw" not in repr(sentinel) and "s@cret" not in repr(cluster)
