"""Answer types of the typed-turn tests (tests/durable/test_typed.py, test_typed_celery.py).

Module-level classes, so a worker (in-process or a Celery process) imports each by the
name a prompt stores, ``"tests.durable.typed_models:Invoice"``. `Missing` is deliberately
not defined here: a stored input naming it cannot be run.
"""

from __future__ import annotations

from pydantic import BaseModel


class Invoice(BaseModel):
    """What the typed agents answer: `total` is required, so ``{"number": ...}`` alone is
    an answer that does not validate."""

    number: str
    total: int


class Receipt(BaseModel):
    """A prompt's own answer type, in place of its agent's (or of none)."""

    shop: str
    items: list[str]
