"""The journal codec, on both builds."""

from __future__ import annotations

import importlib
import json
from types import ModuleType
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fxengine.errors import FxJournalError, FxJournalVersionError
from fxengine.journal import _codec_py


def _builds() -> list[Any]:
    params: list[Any] = [pytest.param(_codec_py, id="pure")]
    try:
        params.append(pytest.param(importlib.import_module("fxengine.journal._codec_c"), id="compiled"))
    except ImportError:
        params.append(pytest.param(None, id="compiled", marks=pytest.mark.skip(reason="extension not built")))
    return params


BUILDS = _builds()


@pytest.fixture(params=BUILDS)
def codec(request: pytest.FixtureRequest) -> ModuleType:
    return request.param  # type: ignore[no-any-return]


def test_record_layout_and_round_trip(codec: ModuleType) -> None:
    body = {"step": 3, "text": "héllo", "calls": [{"id": "c1", "input": {"q": None}}], "raw": b"\x00\xff", "ok": True, "f": 1.5}
    data = codec.encode_record("model_response", body)
    assert data[:4] == b"FXJ\x01" and codec.JOURNAL_VERSION == 1
    assert msgpack.unpackb(data[4:]) == ["model_response", body]
    assert codec.decode_record(data) == ("model_response", body)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text() | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=80, deadline=None)
@given(st.text(min_size=1, max_size=20), st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_round_trip_property(kind: str, body: dict[str, Any]) -> None:
    for build in BUILDS:
        if build.values[0] is None:
            continue
        mod = build.values[0]
        encoded = mod.encode_record(kind, body)
        assert encoded == _codec_py.encode_record(kind, body)
        assert mod.decode_record(encoded) == (kind, body)


def test_newer_version_raises_the_version_error(codec: ModuleType) -> None:
    data = b"FXJ\x02" + msgpack.packb(["x", {}])
    with pytest.raises(FxJournalVersionError) as info:
        codec.decode_record(data)
    assert info.value.code == "FX_JOURNAL_VERSION" and info.value.raw == data


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"FXJ",
        b"NOPE" + msgpack.packb(["x", {}]),
        b"FXJ\x00" + msgpack.packb(["x", {}]),
        b"FXJ\x01\xc1",  # a byte msgpack never uses
        b"FXJ\x01" + msgpack.packb(["x", {}]) + b"\x00",  # trailing bytes
        b"FXJ\x01" + msgpack.packb(["x", {}])[:-1] + b"\x92",  # truncated
        b"FXJ\x01" + msgpack.packb({"kind": "x"}),
        b"FXJ\x01" + msgpack.packb(["x", {}, 1]),
        b"FXJ\x01" + msgpack.packb([1, {}]),
        b"FXJ\x01" + msgpack.packb(["x", [1]]),
    ],
)
def test_malformed_records_raise_with_raw_bytes(codec: ModuleType, data: bytes) -> None:
    with pytest.raises(FxJournalError) as info:
        codec.decode_record(data)
    assert type(info.value) is FxJournalError
    assert info.value.code == "FX_JOURNAL_INVALID" and info.value.raw == data


def test_decode_accepts_memoryview(codec: ModuleType) -> None:
    data = codec.encode_record("k", {"a": 1})
    assert codec.decode_record(memoryview(data)) == ("k", {"a": 1})


def test_encode_line_is_compact_utf8_json(codec: ModuleType) -> None:
    line = codec.encode_line({"type": "text_delta", "delta": "é ✓ \n", "step": 1, "n": None})
    assert line == '{"type":"text_delta","delta":"é ✓ \\n","step":1,"n":null}'.encode()
    assert not line.endswith(b"\n") and json.loads(line)["delta"] == "é ✓ \n"
    with pytest.raises(TypeError):
        codec.encode_line({"x": object()})
