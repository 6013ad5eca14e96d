"""A throwaway 3-primary Redis Cluster on free loopback ports, for the `cluster` tests."""

from __future__ import annotations

import shutil
import subprocess
import time

import redis

from tests.support.redis_server import RedisServer, free_port


class RedisClusterProcesses:
    """Three `redis-server --cluster-enabled yes` nodes joined by `redis-cli --cluster create`."""

    def __init__(self, *, timeout_s: float = 20.0) -> None:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli not found: it ships with redis-server (apt-get install redis-server)")
        self.nodes: list[RedisServer] = []
        try:
            for _ in range(3):
                port = free_port()
                # An explicit bus port: the default (port + 10000) fails for ports above 55535.
                self.nodes.append(RedisServer(port=port, args=(
                    "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                    "--cluster-port", str(free_port()), "--cluster-node-timeout", "2000",
                )))
            addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
            subprocess.run(
                [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout_s,
            )
            self._wait_ok(timeout_s)
        except BaseException:
            self.close()
            raise

    def _wait_ok(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            states = []
            for node in self.nodes:
                client = redis.Redis(host="127.0.0.1", port=node.port)
                try:
                    states.append(client.cluster("info").get("cluster_state"))
                finally:
                    client.close()
            if all(s == "ok" for s in states):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not reach state ok: {states}")
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}/0"

    def close(self) -> None:
        for node in self.nodes:
            node.close()
