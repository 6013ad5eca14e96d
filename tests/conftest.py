"""Suite-wide fixtures: one throwaway Redis for the run, a key prefix per test."""

from __future__ import annotations

import os
import sys
import traceback
import uuid
from collections.abc import Iterator

import pytest

from tests.support.redis_server import RedisServer, delete_prefix, external_redis_url

if sys.version_info[:2] == (3, 11):
    # CPython 3.11 keeps one AST-construction depth counter per interpreter. Formatting a
    # traceback parses its source lines (for the ^^^ carets); when that happens inside
    # another ast.parse (a garbage-collected asyncio task logging its exception while
    # pytest parses a module, or a server thread logging at the same time), the outer
    # parse fails with "SystemError: AST constructor recursion depth mismatch" and can
    # end the run with an internal error. Without carets, tracebacks never parse.
    traceback._extract_caret_anchors_from_line_segment = lambda segment: None  # type: ignore[attr-defined]


# An agent built with no store and no REDIS_URL uses the default store: in this process's
# memory for the suite (the local store on disk, `fxworker.store.local`, has tests of its own,
# which pass FX_DATA_DIR; a subprocess given an environment of its own chooses for itself).
os.environ.setdefault("FX_DATA_DIR", ":memory:")


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The URL of the suite's Redis: a `redis-server` this run started, or FX_TEST_REDIS_URL."""
    url = external_redis_url()
    if url:
        yield url
        return
    server = RedisServer()
    try:
        yield server.url
    finally:
        server.close()


@pytest.fixture
def key_prefix(redis_url: str) -> Iterator[str]:
    """A prefix no other test uses; every key under it is deleted afterwards."""
    prefix = f"fxt{uuid.uuid4().hex[:10]}"
    yield prefix
    delete_prefix(redis_url, prefix)
