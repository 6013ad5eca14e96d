"""The `FX_AGENTS` module of tests/durable/test_typed_celery.py's worker processes.

Agents on the scripted model at `FX_TEST_MODEL_URL`, each model request carrying the
process's pid (header `x-fx-pid`), each agent's instructions naming it:

- `invoicer`: every answer is a `tests.durable.typed_models.Invoice` (tool mode: the
  scripted model's catalog entry has no `supports_structured_output`), one retry;
- `native`: the same type asked for by a JSON-schema response format
  (`output_mode="native"`), the answer's text being the object;
- `plain`: untyped (a prompt may type its own turn with a type of `typed_models`).
"""

from __future__ import annotations

from typing import Any

from fxworker import Agent
from tests.durable.approval_tooling import provider
from tests.durable.typed_models import Invoice


def _agents() -> dict[str, Agent[Any]]:
    common: dict[str, Any] = dict(model="scripted", provider=provider(), api_key="test-key")
    invoicer = Agent("invoicer", instructions="You are invoicer.", output_type=Invoice, **common)
    native = Agent("native", instructions="You are native.", output_type=Invoice, output_mode="native", **common)
    plain = Agent("plain", instructions="You are plain.", **common)
    return {a.name: a for a in (invoicer, native, plain)}


AGENTS = _agents()
