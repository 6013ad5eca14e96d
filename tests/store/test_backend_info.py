"""`fxworker.backend_info()` says what a process would use and creates nothing: no
connection (its URLs may name servers that do not exist), no store, no agent, no worker."""

from __future__ import annotations

import pytest

import fxworker
from fxengine import BUILD
from fxworker import Settings, backend_info
from fxworker.embedded import embedded_workers
from fxworker.errors import FxConfigError
from fxworker.store import _default_stores


def test_the_embedded_default() -> None:
    assert backend_info(Settings()) == {"build": BUILD, "store": "embedded", "store_url": None, "broker_url": None,
                                        "waker": "in-process", "ack": "primary", "prefix": "fx"}


@pytest.mark.parametrize(("settings", "store", "waker"), [
    (Settings(redis_url="redis://:s3cret@127.0.0.1:9/0", ack="replica"), "redis", "celery"),
    (Settings(store_url="redis+cluster://127.0.0.1:9,127.0.0.1:10/0"), "cluster", "in-process"),
    (Settings(store_url="redis+sentinel://:s3cret@127.0.0.1:9/mymaster", broker_url="amqp://u:s3cret@127.0.0.1:9//"),
     "sentinel", "celery"),
])
def test_servers_are_named_not_reached(settings: Settings, store: str, waker: str) -> None:
    stores, workers, agents = dict(_default_stores), list(embedded_workers()), dict(fxworker.agents())
    info = backend_info(settings)  # port 9 answers nothing: a connection attempt would fail or hang
    assert (info["store"], info["waker"], info["ack"]) == (store, waker, settings.ack)
    assert "s3cret" not in repr(info)
    assert dict(_default_stores) == stores and list(embedded_workers()) == workers and dict(fxworker.agents()) == agents


def test_a_bad_setting_is_a_config_error() -> None:
    with pytest.raises(FxConfigError):
        backend_info(Settings(store_url="http://127.0.0.1:9"))
