"""fxworker's error tree: every FX_LIMIT_* under one branch, one fenced stop."""

from __future__ import annotations

import inspect

from fxengine.errors import FxError, FxFencedError, FxLimitError
from fxworker import errors, runner
from fxworker.web.ndjson import StreamSlots


def test_every_fx_limit_error_is_an_fxlimiterror_and_an_fxworkererror() -> None:
    classes = [
        c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, FxError) and c.__module__ == errors.__name__
    ]
    limits = [c for c in classes if c.code.startswith("FX_LIMIT_")]
    assert {c.__name__ for c in limits} == {"FxQueueFullError", "FxBodyTooLargeError", "FxStreamsFullError"}
    for cls in limits:
        assert issubclass(cls, FxLimitError) and issubclass(cls, errors.FxWorkerError), cls


def test_a_full_stream_table_raises_the_limit_error() -> None:
    slots = StreamSlots(1)
    slots.take()
    try:
        slots.take()
    except FxLimitError as exc:
        assert isinstance(exc, errors.FxStreamsFullError) and exc.code == "FX_LIMIT_STREAMS"
    else:
        raise AssertionError("a second stream was let in past a limit of 1")


def test_the_runner_stops_on_the_one_fenced_error() -> None:
    assert issubclass(errors.FxLeaseLostError, FxFencedError)
    assert not hasattr(runner, "Fenced")
    assert errors.FxLeaseLostError in runner._STOPS
