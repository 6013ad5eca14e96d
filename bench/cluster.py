"""A Redis Cluster store against one Redis: turns per second, memory per idle session, and
how the commands spread over the cluster's primaries (is any key a hot spot?).

Starts, in the same run: one throwaway `redis-server` (store and broker: the baseline) and a
3-primary Redis Cluster (tests/support/redis_topology.py) whose store's broker is a second
standalone `redis-server`; the scripted model server; for each setup two Celery worker
processes (bench/_agents.py, deployment timings). Then, interleaved so load on the machine
hits both alike, `--rounds` times each: `--sessions` sessions at once, `--turns` two-step
tool turns each (zero model latency): turns/s, medians quoted. After the rounds: Redis
memory per session at rest (`used_memory` delta over the primaries, divided by the sessions
the rounds left), and each primary's share of the commands the cluster processed during the
rounds (the ready index and the session index live on one of them).

Run: ``.venv/bin/python bench/cluster.py [--rounds 3] [--json PATH]`` (about 2 minutes).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._harness import (  # noqa: E402
    ModelProcess,
    Row,
    add_json_arg,
    client_agent,
    new_prefix,
    print_rows,
    ratio_row,
    start_worker,
    write_json,
)
from bench.scale import turns_per_s  # noqa: E402
from fxworker.keys import index_keys  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402
from tests.support.redis_topology import RedisClusterProcesses  # noqa: E402


def used_memory(ports: list[int]) -> int:
    """`used_memory` summed over `ports`, less client buffers (a cluster client holds
    connections to every node: not the sessions' cost)."""
    total = 0
    for port in ports:
        client = redis.Redis(port=port)
        try:
            info = client.info("memory")
            total += int(info["used_memory"]) - int(info.get("mem_clients_normal", 0))
        finally:
            client.close()
    return total


def commands(ports: list[int]) -> dict[int, int]:
    out = {}
    for port in ports:
        client = redis.Redis(port=port)
        try:
            out[port] = int(client.info("stats")["total_commands_processed"])
        finally:
            client.close()
    return out


class Setup:
    """A store (and its broker) and two workers on it."""

    def __init__(self, name: str, broker: RedisServer, store_url: str, store_ports: list[int], model_url: str) -> None:
        self.name = name
        self.prefix = new_prefix()
        self.store_ports = store_ports
        env = {"FX_STORE_URL": store_url}
        self.workers = [start_worker(broker, self.prefix, model_url, concurrency=100, env=env) for _ in range(2)]
        self.broker_url, self.store_url, self.model_url = broker.url, store_url, model_url
        self.memory_before = used_memory(store_ports)
        self.sessions = 0
        self.rates: list[float] = []

    def round(self, sessions: int, turns: int, tag: str) -> None:
        # One agent of a name per process: each round makes its own.
        agent = client_agent(self.broker_url, self.prefix, self.model_url, store_url=self.store_url)
        try:
            rate, _ = turns_per_s(agent, sessions, turns, f"{self.name}{tag}")
        finally:
            from fxworker.agent import _loop

            _loop().run(agent.store.aclose(), timeout_s=10)
            agent.close()
        self.sessions += sessions
        self.rates.append(rate)

    def close(self) -> None:
        for w in self.workers:
            w.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--turns", type=int, default=3)
    add_json_arg(parser)
    args = parser.parse_args()

    one = RedisServer()
    cluster = RedisClusterProcesses(primaries=3)
    broker = RedisServer()
    model = ModelProcess()
    setups: list[Setup] = []
    try:
        cluster_ports = [n.port for n in cluster.nodes]
        setups = [Setup("one", one, one.url, [one.port], model.base_url),
                  Setup("cluster", broker, cluster.seed_url, cluster_ports, model.base_url)]
        for s in setups:
            s.round(10, 2, "warm")
        before = commands(cluster_ports)
        for r in range(args.rounds):
            for s in setups if r % 2 == 0 else reversed(setups):
                s.round(args.sessions, args.turns, f"r{r}")
        after = commands(cluster_ports)
        per_node = {port: after[port] - before[port] for port in cluster_ports}
        index_node = cluster.primary_of(index_keys(setups[1].prefix).ready).port
        memory = {s.name: (used_memory(s.store_ports) - s.memory_before) / s.sessions for s in setups}
    finally:
        for s in setups:
            s.close()
        model.close()
        broker.close()
        cluster.close()
        one.close()

    base, clus = (statistics.median(s.rates[1:]) for s in setups)
    share = {port: n / sum(per_node.values()) for port, n in per_node.items()}
    others = [v for port, v in share.items() if port != index_node]
    rows: list[Row] = [
        ratio_row("cluster", f"turns/s, 3-primary cluster store, {args.sessions} sessions", clus, "turns/s",
                  "one Redis, same run", base),
        ratio_row("cluster", "Redis memory per session at rest, cluster", memory["cluster"] / 1024, "KiB",
                  "one Redis", memory["one"] / 1024),
        ratio_row("cluster", "share of commands on the index's primary", share[index_node] * 100, "%",
                  "mean share of the other primaries", statistics.mean(others) * 100),
    ]
    print_rows(rows)
    write_json(args.json, "cluster", rows, {
        "rates": {s.name: s.rates for s in setups}, "memory_per_session_bytes": memory,
        "commands_per_node": per_node, "index_node": index_node, "sessions": args.sessions, "turns": args.turns,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
