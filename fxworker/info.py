"""`backend_info()`: what a process would use, found without creating anything.

The counterpart of libfx's `getBackendInfo()`: it reads the settings and the fxengine
build, and opens no connection, sends no request and creates no agent, store or worker.

    >>> fxworker.backend_info()
    {'build': 'compiled', 'store': 'embedded', 'store_url': None, 'broker_url': None,
     'waker': 'in-process', 'ack': 'primary', 'prefix': 'fx'}
"""

from __future__ import annotations

from typing import Any

from fxengine import BUILD

from .settings import Settings
from .urls import masked, parse_store_url


def backend_info(settings: Settings | None = None) -> dict[str, Any]:
    """The build, store, broker, waker and ack level this process would use.

    `store` is `embedded` (no `FX_STORE_URL` / `REDIS_URL`), `redis`, `cluster` or
    `sentinel`, as the URL's scheme says (a `redis://` URL naming a Cluster node is found
    to be one on first connect); URLs are shown with their passwords masked.

    Raises:
        FxConfigError: a setting (`FX_ACK`, a store URL, ...) that is not valid.
    """
    settings = settings or Settings.from_env()
    store_url = settings.store_url
    return {
        "build": BUILD,
        "store": parse_store_url(store_url).kind if store_url else "embedded",
        "store_url": masked(store_url) if store_url else None,
        "broker_url": masked(settings.broker_url) if settings.broker_url else None,
        "waker": "celery" if settings.broker_url else "in-process",
        "ack": settings.ack,
        "prefix": settings.prefix,
    }
