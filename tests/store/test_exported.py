"""The public surface of `fxworker.store` is pinned."""

from __future__ import annotations

import inspect

import fxworker.store as store


def test_the_store_exports() -> None:
    assert sorted(store.__all__) == sorted([
        "redis_store", "embedded_store", "memory_store", "RedisStore", "SyncRedisStore", "StoreCore",
        "StorePersistence", "map_redis_errors", "parse_store_url", "store_clients", "store_kind", "StoreAddress", "Accepted", "Appended", "Claim", "Idle", "Input", "OpenTurn",
        "ReadySession", "Released", "Serving", "SessionState", "StoreRecord", "Unserved", "UNCHECKED", "READY_GRACE_MS",
        "CHECKPOINT_MAX_BYTES", "STEER_MAX_BYTES", "STEER_MAX_QUEUED", "STEER_MAX_QUEUED_BYTES", "SessionStore",
    ])
    for name in store.__all__:
        assert hasattr(store, name), name


def test_a_redis_store_is_a_session_store() -> None:
    """Each call `SessionStore` declares is one a `RedisStore` answers, awaitable (mypy checks
    the signatures: store/redis.py)."""
    built = store.memory_store()
    declared = [name for name in vars(store.SessionStore) if not name.startswith("_")]
    assert sorted(declared) == ["append", "core", "list_sessions", "renew", "run_each", "save_checkpoint",
                                "watch_inboxes"]
    assert isinstance(built.core, store.StoreCore)
    for name in declared:
        if name != "core":
            assert inspect.iscoroutinefunction(getattr(built, name)), name
