"""A deployment of both trees' processes on one private Redis, one prefix and one scripted
model (the fault responder, `tests.chaos.faults.responder`), started and stopped as a
deploy does."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from fxengine.testing import Reply, ScriptedModel
from tests.chaos.faults import responder
from tests.support.redis_server import RedisServer
from tests.upgrade.previous import Tree
from tests.upgrade.processes import TreeWeb, TreeWorker, trouble

# Short leases and a fast sweep: a session a stopped worker held moves on in seconds.
PROCESS_ENV = {
    "FX_AGENTS": "tests.chaos.agents",  # in both trees, with the tools of tests.chaos.tooling
    "FX_LEASE_S": "2",
    "FX_SWEEP_S": "0.5",
    "FX_RESERVE_S": "4",
    "FX_DELIVERY_TIMEOUT_S": "60",
    "FX_LOG_LEVEL": "WARNING",
}


class Deployment:
    """Web and worker processes of either tree, started and stopped as a deploy does."""

    def __init__(self, old: Tree, new: Tree, *, agents: str = "tests.chaos.agents",
                 model_responder: Callable[[Any], Reply] = responder) -> None:
        self.old = old
        self.new = new
        self.prefix = f"fxu{uuid.uuid4().hex[:10]}"
        self.redis = RedisServer()
        self.model = ScriptedModel(responder=model_responder).start()
        self.env = {**PROCESS_ENV, "FX_AGENTS": agents, "REDIS_URL": self.redis.url, "FX_PREFIX": self.prefix,
                    "FX_TEST_MODEL_URL": self.model.base_url}
        self.webs: list[TreeWeb] = []
        self.workers: list[TreeWorker] = []

    def web(self, tree: Tree) -> TreeWeb:
        web = TreeWeb(tree, env=self.env)
        self.webs.append(web)
        return web.wait_ready()

    def worker(self, tree: Tree, *, queues: tuple[str, ...] = ("default",)) -> TreeWorker:
        worker = TreeWorker(tree, redis_url=self.redis.url, prefix=self.prefix, env=self.env, queues=queues)
        self.workers.append(worker)
        return worker.start()

    def release_of_pid(self) -> dict[int, str]:
        """Worker pid -> "old" or "new" (the model sees each worker's pid, `x-fx-pid`)."""
        return {w.pid: w.tree.label for w in self.workers if w.pid is not None}

    def trouble(self) -> dict[str, list[str]]:
        """Each process's log lines that look like trouble (read before the logs go)."""
        found = {f"{w.tree.label} worker {w.hostname}": trouble(w.log_path) for w in self.workers}
        found.update({f"{web.label} :{web.port}": trouble(web.log_path) for web in self.webs})
        return {name: lines for name, lines in found.items() if lines}

    def close(self) -> None:
        for web in self.webs:
            web.close()
        for worker in self.workers:
            worker.stop(timeout_s=10.0)
            worker.close()
        self.model.close()
        self.redis.close()
