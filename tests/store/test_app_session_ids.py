"""Sessions an application names itself (`user-42`) on real stores: standalone Redis, a
Redis Cluster of the test's own and the embedded store (the same Lua on fakeredis).

Such an id is accepted, claimed and read back through the store API, its turns run on an
in-process worker against the scripted model (`agent.session("user-42")`), and on the
cluster 60 of them spread over the primaries with every key of one session in one slot
(its hash tag). The refused forms are refused with their code both where a session object
is made and where the store accepts an input, and nothing is stored for them. The memory
store keeps its looser rule (`fxs_` ids of any form, ids of dots only).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import pytest
import redis

from fxengine.testing import ScriptedModel
from fxworker import Agent, Settings, embedded
from fxworker.embedded import InProcessWaker
from fxworker.errors import FxInvalidSessionIdError, FxUnknownSessionError
from fxworker.keys import SESSION_KEY_NAMES, session_keys
from fxworker.store import RedisStore, embedded_store, memory_store, redis_store
from tests.durable.conftest import responder
from tests.durable.tooling import provider, tools
from tests.store.cluster import RedisClusterProcesses
from tests.support.redis_server import delete_prefix

pytestmark = pytest.mark.timeout(90)

TURN_S = 20.0

# Each refused on every Redis-backed store (embedded included); the memory store takes the first three.
REFUSED = ["fxs_user", "..", ".", "a/b", "x" * 129, "a b", "{x}", ""]
MEMORY_ONLY = ["fxs_user", "..", "."]

DURABLE_KINDS = [
    pytest.param("redis", marks=pytest.mark.redis),
    "embedded",
    pytest.param("cluster", marks=[pytest.mark.cluster, pytest.mark.redis]),
]


def new_prefix() -> str:
    return f"fxa{uuid.uuid4().hex[:10]}"


def make_store(kind: str, request: pytest.FixtureRequest, prefix: str) -> RedisStore:
    """A store of `kind` under `prefix`, on the wall clock (its turns run on real leases)."""
    if kind == "redis":
        return redis_store(request.getfixturevalue("redis_url"), prefix=prefix)
    if kind == "cluster":
        cluster: RedisClusterProcesses = request.getfixturevalue("redis_cluster")
        return redis_store(cluster.url, prefix=prefix, cluster=True)
    if kind == "embedded":
        return embedded_store(prefix=prefix)
    return memory_store(prefix=prefix)


@pytest.fixture(params=DURABLE_KINDS)
async def durable(request: pytest.FixtureRequest) -> AsyncIterator[RedisStore]:
    """A Redis-backed store (standalone, cluster, embedded) under a prefix of its own."""
    prefix = new_prefix()
    built = make_store(request.param, request, prefix)
    try:
        yield built
    finally:
        await built.aclose()
        if request.param == "redis":
            delete_prefix(request.getfixturevalue("redis_url"), prefix)


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as m:
        m.responder = responder  # "echo:<prompt>" for a plain prompt
        yield m


class NoWake:
    """A waker that sends nothing: the tests that use it look at what is stored and refused."""

    def wake(self, session_id: str, *, agent: str, reason: str) -> None:
        pass


def plain_agent(model: ScriptedModel, store: RedisStore) -> Agent:
    return Agent(f"ids-{uuid.uuid4().hex[:6]}", model="scripted", provider=provider(model.base_url),
                 api_key="test-key", store=store, waker=NoWake())


@contextmanager
def running_agent(model: ScriptedModel, store: RedisStore) -> Iterator[Agent]:
    """The agent `default` on `store`, its turns run by one in-process worker (as the
    embedded mode does), stopped and closed after."""
    agent = Agent("default", model="scripted", provider=provider(model.base_url), api_key="test-key",
                  tools=tools(), store=store, waker=InProcessWaker(start_workers=False),
                  settings=Settings(lease_s=2.0, reserve_s=4.0, sweep_s=0.5))
    embedded.start_embedded_workers(1)
    try:
        yield agent
    finally:
        embedded.stop_embedded_workers()
        agent.close()


# ---------------------------------------------------------------------------- accepted


@pytest.mark.parametrize("kind", [*DURABLE_KINDS, "memory"])
async def test_an_applications_own_id_is_accepted_claimed_and_read_back(kind: str,
                                                                        request: pytest.FixtureRequest) -> None:
    store = make_store(kind, request, prefix := new_prefix())
    try:
        first = await store.accept("user-42", agent="default", message_id="m1", input="hello")
        again = await store.accept("user-42", agent="default", message_id="m1", input="hello")
        second = await store.accept("user-42", agent="default", message_id="m2", input="then this")
        assert (first.created, first.repeated) == (True, False)
        assert (again.repeated, again.seq) == (True, first.seq)
        assert (second.created, second.repeated) == (False, False)
        state = await store.state("user-42")
        assert (state.session_id, state.agent, state.status, state.pending) == ("user-42", "default", "waiting", 2)
        claim = await store.claim("user-42", holder="w1", lease_ms=5000)
        assert claim is not None
        assert [(i.message_id, i.input) for i in claim.pending] == [("m1", "hello"), ("m2", "then this")]
        assert (await store.state("user-42")).lease_holder == "w1"
        # An application's id and a generated one live side by side.
        generated = f"fxs_{'0' * 26}"
        await store.accept(generated, agent="default", message_id="m1", input="x")
        assert (await store.state(generated)).pending == 1
        assert sorted(await store.list_sessions()) == sorted([generated, "user-42"])
    finally:
        await store.aclose()
        if kind == "redis":
            delete_prefix(request.getfixturevalue("redis_url"), prefix)


async def test_its_turns_run_and_agent_session_names_it(durable: RedisStore, model: ScriptedModel) -> None:
    with running_agent(model, durable) as agent:
        session = agent.session("user-42")
        assert session.id == "user-42"
        first = await (await session.prompt("hi")).result()
        assert first.stop_reason == "end_turn"
        # Another object of the same id is the same session: its next turn sees the first.
        later = agent.session("user-42")
        turn = await later.prompt("again")
        assert turn.session_id == "user-42"
        texts = [e["delta"] async for e in turn if e["type"] == "text_delta"]
        assert "".join(texts) == "echo:again"
        assert (await turn.result()).stop_reason == "end_turn"
        info = await later.state()
        assert (info["status"], info["agent"], info["turns"]) == ("idle", "default", 2)
        sent = [m["content"] for m in model.requests[-1].body["messages"] if m["role"] == "user"]
        assert "hi" in str(sent) and "again" in str(sent)
        lines = [line async for line in later.stream(0, follow=False)]
        assert [line["type"] for line in lines].count("turn_end") == 2
        state = await durable.state("user-42")
        assert (state.turns, state.lease_holder, state.pending) == (2, None, 0)


# ---------------------------------------------------------------------------- the cluster


@pytest.mark.cluster
@pytest.mark.redis
async def test_own_ids_spread_over_the_primaries_and_each_session_keeps_one_slot(
        redis_cluster: RedisClusterProcesses) -> None:
    prefix = new_prefix()
    store = redis_store(redis_cluster.url, prefix=prefix, cluster=True)
    ids = [f"user-{i}" for i in range(60)]
    try:
        for sid in ids:
            accepted = await store.accept(sid, agent="default", message_id="m1", input=f"hello {sid}")
            assert accepted.created
        primaries = {node.port for node in redis_cluster.primaries()}
        assert len(primaries) == 3
        any_node = redis.Redis(host="127.0.0.1", port=redis_cluster.nodes[0].port)
        clients = {port: redis.Redis(host="127.0.0.1", port=port) for port in primaries}
        try:
            owner_of_slot: dict[int, int] = {}
            for start, end, primary, *_ in any_node.cluster("slots"):
                for slot in range(int(start), int(end) + 1):
                    owner_of_slot[slot] = int(primary[1])
            owners: dict[str, int] = {}
            for sid in ids:
                keys = session_keys(prefix, sid)
                slots = {int(any_node.cluster("keyslot", getattr(keys, name))) for name in SESSION_KEY_NAMES}
                assert slots == {int(any_node.cluster("keyslot", f"{{{sid}}}"))}, (sid, slots)  # the hash tag's slot
                [slot] = slots
                owners[sid] = owner_of_slot[slot]
                # The session's keys are stored on that primary, and on no other.
                for port, client in clients.items():
                    held = list(client.scan_iter(match=f"{prefix}:{{{sid}}}:*", count=1000))
                    assert bool(held) == (port == owners[sid]), (sid, port, owners[sid], held)
            used = set(owners.values())
            assert used <= primaries and len(used) >= 2, owners
        finally:
            any_node.close()
            for client in clients.values():
                client.close()
        for sid in ids:
            assert (await store.state(sid)).pending == 1
    finally:
        await store.aclose()


# ---------------------------------------------------------------------------- refused


@pytest.mark.parametrize("bad", REFUSED, ids=repr)
async def test_refused_forms_are_refused_at_the_session_and_at_accept(durable: RedisStore, model: ScriptedModel,
                                                                      bad: str) -> None:
    agent = plain_agent(model, durable)
    try:
        with pytest.raises(FxInvalidSessionIdError) as made:
            agent.session(bad)
        assert made.value.code == "FX_INVALID_SESSION_ID"
        with pytest.raises(FxInvalidSessionIdError) as accepted:
            await durable.accept(bad, agent=agent.name, message_id="m1", input="hi")
        assert accepted.value.code == "FX_INVALID_SESSION_ID"
        with pytest.raises(FxInvalidSessionIdError):
            await durable.state(bad)
        assert await durable.list_sessions() == []  # nothing was stored
    finally:
        agent.close()


async def test_the_reserved_prefix_is_refused_with_its_reason(durable: RedisStore, model: ScriptedModel) -> None:
    agent = plain_agent(model, durable)
    try:
        with pytest.raises(FxInvalidSessionIdError, match="generated"):
            agent.session("fxs_user-42")
        with pytest.raises(FxInvalidSessionIdError, match="generated"):
            await durable.accept("fxs_user-42", agent=agent.name, message_id="m1", input="hi")
        # A generated id is the form the prefix is kept for.
        own = agent.session(agent.new_session_id())
        assert own.id.startswith("fxs_")
    finally:
        agent.close()


async def test_an_own_id_not_yet_used_is_an_unknown_session(durable: RedisStore) -> None:
    with pytest.raises(FxUnknownSessionError):
        await durable.accept("user-404", agent="default", message_id="m1", input="a", create=False)
    with pytest.raises(FxUnknownSessionError):
        await durable.state("user-404")


async def test_the_memory_store_keeps_its_looser_rule(model: ScriptedModel) -> None:
    store = memory_store(prefix=new_prefix())
    agent = plain_agent(model, store)
    try:
        for loose in [*MEMORY_ONLY, "user-42"]:
            assert agent.session(loose).id == loose
            accepted = await store.accept(loose, agent=agent.name, message_id="m1", input="hi")
            assert accepted.created, loose
            assert (await store.state(loose)).session_id == loose
        assert sorted(await store.list_sessions()) == sorted([*MEMORY_ONLY, "user-42"])
        for bad in [b for b in REFUSED if b not in MEMORY_ONLY]:
            with pytest.raises(FxInvalidSessionIdError) as caught:
                agent.session(bad)
            assert caught.value.code == "FX_INVALID_SESSION_ID"
            with pytest.raises(FxInvalidSessionIdError):
                await store.accept(bad, agent=agent.name, message_id="m1", input="hi")
    finally:
        agent.close()
        await store.aclose()
