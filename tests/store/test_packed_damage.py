"""Damaged packed values are refused, never read as other data (§5 "Packed at rest").

A corruption fuzz over real chunks and checkpoints as the store packs them, on real Redis
(chunks carry SHA-1) and on the embedded store (Adler-32): every truncation length of
every chunk and a seeded sample of single-byte changes, each read back through the store.
Each case must read back the same lines, or be refused with its code; none may read as
other lines or raise an error without one."""

from __future__ import annotations

import random
import zlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis

from fxengine.codes import Code
from fxengine.errors import FxError, FxJournalError
from fxworker.errors import FxSessionIncompleteError
from fxworker.ids import new_session_id
from fxworker.keys import session_keys
from fxworker.store import RedisStore, embedded_store, redis_store
from fxworker.store._packed import (
    CHECKPOINT_MAGIC,
    CHUNK_MAX_LINES,
    LINES_FORMAT,
    expand,
    pack_checkpoint,
    unpack_checkpoint,
)
from fxworker.store.embedded import new_server
from tests.store.test_packed import _turn

SEED = 36
CHANGES_PER_CHUNK = 200


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.redis), "embedded"])
def stores(request: pytest.FixtureRequest) -> Iterator[tuple[str, RedisStore, Any]]:
    """(kind, the store, a raw client of the same server)."""
    if request.param == "redis":
        url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("key_prefix")
        store, raw = redis_store(url, prefix=prefix), redis.Redis.from_url(url)
    else:
        server, prefix = new_server(), "fxz"
        store, raw = embedded_store(prefix=prefix, server=server), fakeredis.FakeRedis(server=server)
    try:
        yield request.param, store, raw
    finally:
        raw.close()
        store.close()


def _outcome(read: Any, expected: list[Any]) -> str:
    try:
        got = read()
    except FxError as exc:
        return str(exc.code)
    except Exception as exc:  # noqa: BLE001 - counted, and the test fails on it
        return f"uncoded {type(exc).__name__}"
    return "same" if got == expected else "other lines"


async def _packed_session(store: RedisStore, sid: str) -> None:
    """Three claims' lines packed: one small chunk, then a full chunk and its remainder."""
    for n, n_lines in enumerate((6, CHUNK_MAX_LINES + 20), 1):
        appended, lines = await _turn(store, sid, n, n_lines)
        assert appended.packed == len(lines)


async def test_every_cut_and_a_sample_of_byte_changes_of_a_chunk_is_refused_or_reads_the_same(
    stores: tuple[str, RedisStore, Any],
) -> None:
    kind, store, raw = stores
    sid = new_session_id()
    await _packed_session(store, sid)
    keys = session_keys(store.prefix, sid)
    pristine = [(entry_id, dict(fields)) for entry_id, fields in raw.xrange(keys.ui)]
    assert len(pristine) == 3 and all(b"z" in f and (b"s" if kind == "redis" else b"a") in f for _, f in pristine)
    expected = await store.read_raw_lines(sid, 0, count=10_000)
    assert [c for c, _ in expected] == list(range(1, len(expected) + 1))

    def store_entries(entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        pipe = raw.pipeline(transaction=True)
        pipe.delete(keys.ui)
        for entry_id, fields in entries:
            pipe.xadd(keys.ui, fields, id=entry_id)
        pipe.execute()

    async def read_back(entries: list[tuple[bytes, dict[bytes, bytes]]]) -> str:
        store_entries(entries)
        try:
            got = await store.read_raw_lines(sid, 0, count=10_000)
        except FxError as exc:
            return str(exc.code)
        except Exception as exc:  # noqa: BLE001
            return f"uncoded {type(exc).__name__}"
        return "same" if got == expected else "other lines"

    rng = random.Random(SEED)
    outcomes: dict[str, Counter[str]] = {"cut": Counter(), "byte": Counter(), "gone": Counter()}
    for i, (entry_id, fields) in enumerate(pristine):
        z = fields[b"z"]
        for length in range(len(z)):
            damaged = [*pristine[:i], (entry_id, {**fields, b"z": z[:length]}), *pristine[i + 1:]]
            outcomes["cut"][await read_back(damaged)] += 1
        for _ in range(CHANGES_PER_CHUNK):
            at, flip = rng.randrange(len(z)), rng.randrange(1, 256)
            changed = z[:at] + bytes([z[at] ^ flip]) + z[at + 1:]
            damaged = [*pristine[:i], (entry_id, {**fields, b"z": changed}), *pristine[i + 1:]]
            outcomes["byte"][await read_back(damaged)] += 1
        # A chunk gone (the last one too: the session counted its lines).
        outcomes["gone"][await read_back([*pristine[:i], *pristine[i + 1:]])] += 1
    store_entries(pristine)
    print(f"\n{kind}: {len(pristine)} chunks of {[len(f[b'z']) for _, f in pristine]} bytes; "
          + "; ".join(f"{name}: {dict(c)}" for name, c in outcomes.items()))
    for name, counted in outcomes.items():
        assert set(counted) <= {"same", Code.SESSION_INCOMPLETE, Code.JOURNAL_VERSION}, (name, counted)
    # Only a change can leave what decodes the same (the padding bits of the last byte).
    assert outcomes["cut"]["same"] == 0 and outcomes["gone"][Code.SESSION_INCOMPLETE] == len(pristine)
    assert await store.read_raw_lines(sid, 0, count=10_000) == expected


async def test_a_chunk_read_from_inside_it_is_checked_whole(stores: tuple[str, RedisStore, Any]) -> None:
    _, store, raw = stores
    sid = new_session_id()
    await _packed_session(store, sid)
    keys = session_keys(store.prefix, sid)
    entries = raw.xrange(keys.ui)
    entry_id, fields = entries[1]
    raw.delete(keys.ui)
    for i, (eid, f) in enumerate(entries):
        raw.xadd(keys.ui, {**f, b"z": f[b"z"][:-3]} if i == 1 else f, id=eid)
    first = int(fields[b"f"])
    for cursor in (first - 1, first + 5, int(entry_id.split(b"-")[0]) - 1):
        with pytest.raises(FxSessionIncompleteError, match="cut short"):
            await store.read_raw_lines(sid, cursor)
    # The lines before the damaged chunk read as they are, and a reader past it reads on.
    assert [c for c, _ in await store.read_raw_lines(sid, 0, count=first - 1)] == list(range(1, first))
    assert [c for c, _ in await store.read_raw_lines(sid, int(entry_id.split(b"-")[0]))]


def test_a_chunk_of_a_newer_format_is_refused_as_newer_and_one_of_the_previous_release_reads() -> None:
    sid = new_session_id()
    from fxworker.store._packed import pack_lines

    [mark] = pack_lines(sid, 1, 1, ['{"type":"text_delta","delta":"a"', '{"type":"text_delta","delta":"b"'])
    first, last, sha1, adler32, z = mark.split(b":", 4)
    assert z[:1] == LINES_FORMAT
    checked = {b"f": first, b"z": z, b"s": sha1}
    lines = expand(sid, [(2, checked)], 0)
    # The previous release stored no checksum: read with the other checks.
    assert expand(sid, [(2, {b"f": first, b"z": z})], 0) == lines
    assert expand(sid, [(2, {b"f": first, b"z": z, b"a": adler32})], 0) == lines
    newer = {**checked, b"z": b"\x02" + z[1:]}
    with pytest.raises(FxJournalError) as raised:
        expand(sid, [(2, newer)], 0)
    assert raised.value.code == Code.JOURNAL_VERSION and "newer fxworker" in str(raised.value)
    # A checksum that does not match, and lines whose cursors are not the entry's.
    with pytest.raises(FxSessionIncompleteError, match="SHA-1"):
        expand(sid, [(2, {**checked, b"s": b"0" * 40})], 0)
    with pytest.raises(FxSessionIncompleteError):
        expand(sid, [(3, {b"f": b"2", b"z": z})], 1)


def test_every_cut_and_a_sample_of_byte_changes_of_a_checkpoint_is_refused_or_reads_the_same() -> None:
    # A checkpoint as the engine writes one (a header, then JSON), over both windows.
    rng = random.Random(SEED)
    outcomes: Counter[str] = Counter()
    for size in (600, 20_000):
        words = " ".join(rng.choice(("the", "model", "said", "tool", "result", str(rng.random()))) for _ in range(size))
        data = b"FXJ\x01" + words.encode()[:size]
        stored = pack_checkpoint(data)
        assert stored.startswith(CHECKPOINT_MAGIC) and len(stored) < len(data)
        cases = [stored[:n] for n in range(len(CHECKPOINT_MAGIC), len(stored))]
        for _ in range(1000):
            at = rng.randrange(len(CHECKPOINT_MAGIC), len(stored))
            cases.append(stored[:at] + bytes([stored[at] ^ rng.randrange(1, 256)]) + stored[at + 1:])
        for case in cases:
            outcomes[_outcome(lambda: unpack_checkpoint(case, session_id="s"), data)] += 1
    print(f"\ncheckpoints: {dict(outcomes)}")
    assert set(outcomes) <= {"same", Code.JOURNAL_INVALID}, outcomes
    # A value stored by the previous release (no CRC-32 after the stream) still reads.
    packer = zlib.compressobj(6, zlib.DEFLATED, -15)
    assert unpack_checkpoint(CHECKPOINT_MAGIC + packer.compress(b"old" * 100) + packer.flush()) == b"old" * 100


async def test_a_damaged_checkpoint_is_claimed_once_with_its_error_and_refused_by_load(
    stores: tuple[str, RedisStore, Any],
) -> None:
    """The claim that meets a damaged checkpoint has taken the lease by then: it answers a
    Claim carrying the error (the runner ends what heads the session with it), never an
    exception that would leave the lease to expire and the sweeper to claim it again."""
    from fxengine.journal.records import encode_checkpoint

    kind, store, raw = stores
    sid = new_session_id()
    state = {"messages": [{"role": "user", "content": f"question {i}"} for i in range(40)]}
    data = encode_checkpoint(state=state, tools="t", model="scripted")
    await _turn(store, sid, 1, 2, checkpoint=data)
    keys = session_keys(store.prefix, sid)
    stored = raw.hget(keys.ckpt, "data")
    assert stored.startswith(CHECKPOINT_MAGIC)
    rng = random.Random(SEED)
    cases = [stored[:n] for n in range(len(CHECKPOINT_MAGIC), len(stored))]
    for _ in range(CHANGES_PER_CHUNK):
        at = rng.randrange(len(CHECKPOINT_MAGIC), len(stored))
        cases.append(stored[:at] + bytes([stored[at] ^ rng.randrange(1, 256)]) + stored[at + 1:])
    outcomes: Counter[str] = Counter()
    for case in cases:
        raw.hset(keys.ckpt, "data", case)
        claim = await store.claim(sid, holder="w", lease_ms=10_000)
        assert claim is not None
        await store.release(sid, claim.epoch)
        if claim.unreadable is not None:
            outcomes[str(claim.unreadable.code)] += 1
            with pytest.raises(FxJournalError):
                await store.load(sid)
            with pytest.raises(FxJournalError):
                claim.loaded()
        else:
            assert claim.checkpoint is not None
            outcomes["same" if claim.checkpoint.data == data else "other"] += 1
    print(f"\n{kind} claims of a damaged checkpoint: {len(cases)} claims, {dict(outcomes)}")
    assert set(outcomes) <= {"same", Code.JOURNAL_INVALID} and outcomes["same"] <= 2, outcomes
