"""fxworker: durable agent sessions on Redis streams and Celery worker pools."""

from __future__ import annotations

__all__: list[str] = []
