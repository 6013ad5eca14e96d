"""The API against its own OpenAPI description (`GET /openapi.json`), property-based:
schemathesis generates requests for every operation (bodies from the wire models, path
and query values of every shape), sends them to the app on a real Redis store, and checks
that none is answered 500 and that every answer is one the description lists, each error
an `FX_` body."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from fxworker.agent import Agent
from fxworker.settings import Settings
from fxworker.store import redis_store
from fxworker.web import create_app

pytestmark = [pytest.mark.redis, pytest.mark.slow]

PROVIDER = {"name": "scripted", "base_url": "http://127.0.0.1:9/v1", "models": {"scripted": {"supports_tools": True}}}


class NoWake:
    def wake(self, session_id: str, *, agent: str, reason: str) -> None:
        pass


@pytest.fixture(scope="module")
def app(redis_url: str) -> Any:
    prefix = f"fxoa{uuid.uuid4().hex[:8]}"
    agent = Agent(f"oa-{uuid.uuid4().hex[:6]}", model="scripted", provider=PROVIDER,
                  store=redis_store(redis_url, prefix=prefix), waker=NoWake())
    yield create_app(agents={"default": agent}, settings=Settings(redis_url=redis_url, prefix=prefix))
    agent.close()


def test_no_operation_answers_500_or_off_the_description(app: Any) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 10

    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case: Any) -> None:
            response = case.call()
            where = f"{case.method} {case.formatted_path}"
            assert response.status_code < 500 or response.status_code == 503, (where, response.status_code,
                                                                                response.text[:500])
            if response.status_code >= 400:
                assert response.json()["error"]["code"].startswith("FX_"), (where, response.text[:300])
            case.validate_response(response)

        check()
