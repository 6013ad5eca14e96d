"""The public surface of `fxworker.store` is pinned."""

from __future__ import annotations

import fxworker.store as store


def test_the_store_exports() -> None:
    assert sorted(store.__all__) == sorted([
        "redis_store", "embedded_store", "memory_store", "RedisStore", "SyncRedisStore", "StoreCore",
        "StorePersistence", "map_redis_errors", "parse_store_url", "store_clients", "store_kind", "StoreAddress", "Accepted", "Appended", "Claim", "Idle", "Input", "OpenTurn",
        "ReadySession", "Released", "Serving", "SessionState", "StoreRecord", "Unserved", "UNCHECKED", "READY_GRACE_MS",
        "CHECKPOINT_MAX_BYTES", "STEER_MAX_BYTES", "STEER_MAX_QUEUED", "STEER_MAX_QUEUED_BYTES",
    ])
    for name in store.__all__:
        assert hasattr(store, name), name
