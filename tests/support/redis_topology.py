"""Throwaway Redis topologies on free loopback ports: a Redis Cluster (with or without
replicas) and a Sentinel-managed primary with a replica, for the `cluster` tests, the
scale-out tests and the benches. Each part is a real `redis-server` process."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from tests.support.redis_server import RedisServer, free_port, redis_server_binary


def _cli() -> str:
    cli = shutil.which("redis-cli")
    if cli is None:
        raise RuntimeError("redis-cli not found: it ships with redis-server (apt-get install redis-server)")
    return cli


def _info(port: int, section: str) -> dict[str, object]:
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, socket_connect_timeout=1)
    try:
        return dict(client.info(section))
    finally:
        client.close()


def replica_online(port: int) -> bool:
    """Whether the primary at `port` has a replica done with its first sync (WAIT counts it)."""
    replica = _info(port, "replication").get("slave0")
    return isinstance(replica, dict) and replica.get("state") == "online"


class RedisClusterProcesses:
    """`primaries` `redis-server --cluster-enabled yes` nodes (each with `replicas`
    replicas) joined by `redis-cli --cluster create`."""

    def __init__(self, *, primaries: int = 3, replicas: int = 0, timeout_s: float = 30.0,
                 node_timeout_ms: int = 2000) -> None:
        cli = _cli()
        self.nodes: list[RedisServer] = []
        try:
            for _ in range(primaries * (1 + replicas)):
                port = free_port()
                # An explicit bus port: the default (port + 10000) fails for ports above 55535.
                self.nodes.append(RedisServer(port=port, args=(
                    "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                    "--cluster-port", str(free_port()), "--cluster-node-timeout", str(node_timeout_ms),
                )))
            addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
            subprocess.run(
                [cli, "--cluster", "create", *addresses, "--cluster-replicas", str(replicas), "--cluster-yes"],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout_s,
            )
            self.wait_ok(timeout_s)
            if replicas:
                self._wait_replicas(timeout_s)
        except BaseException:
            self.close()
            raise

    def live(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def wait_ok(self, timeout_s: float) -> float:
        """Waits until every live node says `cluster_state:ok` and all slots are served;
        returns the seconds it took."""
        started = time.monotonic()
        deadline = started + timeout_s
        while True:
            states = []
            for node in self.live():
                client = redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=1, socket_connect_timeout=1)
                try:
                    info = client.cluster("info")
                    states.append((info.get("cluster_state"), int(info.get("cluster_slots_ok", 0))))
                except redis.RedisError as exc:
                    states.append((type(exc).__name__, 0))
                finally:
                    client.close()
            if states and all(s == ("ok", 16384) for s in states):
                return time.monotonic() - started
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not reach state ok: {states}")
            time.sleep(0.05)

    def kill(self, node: RedisServer, *, timeout_s: float = 30.0) -> float:
        """kill -9 of `node`; waits until its replica serves its slots and every live node
        says the cluster is ok. Returns the seconds from the kill."""
        started = time.monotonic()
        node.stop(kill=True)
        deadline = started + timeout_s
        while True:
            try:
                owners = self._slot_owners()
                if node.port not in owners and len(owners) == len(self.primaries()):
                    break
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"no replica took over from {node!r}")
            time.sleep(0.05)
        self.wait_ok(max(1.0, deadline - time.monotonic()))
        return time.monotonic() - started

    def promote(self, replica: RedisServer, *, timeout_s: float = 30.0) -> float:
        """`CLUSTER FAILOVER FORCE` on `replica`: it takes its primary's slots without
        waiting for that primary to agree (or to have sent it everything); waits until
        it serves them and the cluster is ok. Returns the seconds."""
        started = time.monotonic()
        client = redis.Redis(host="127.0.0.1", port=replica.port)
        try:
            client.execute_command("CLUSTER", "FAILOVER", "FORCE")
        finally:
            client.close()
        deadline = started + timeout_s
        while _info(replica.port, "replication").get("role") != "master" or replica.port not in self._slot_owners():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{replica!r} did not take over its primary's slots")
            time.sleep(0.05)
        self.wait_ok(max(1.0, deadline - time.monotonic()))
        return time.monotonic() - started

    def _slot_owners(self) -> set[int]:
        owners: set[int] = set()
        for live in self.live():
            client = redis.Redis(host="127.0.0.1", port=live.port, socket_timeout=1, socket_connect_timeout=1)
            try:
                owners |= {int(primary[1]) for _, _, primary, *_ in client.cluster("slots")}
            finally:
                client.close()
        return owners

    def _wait_replicas(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(replica_online(p.port) for p in self.primaries()):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster's replicas did not connect")
            time.sleep(0.05)

    def replica_of(self, primary: RedisServer) -> RedisServer:
        """The live node replicating `primary`."""
        [replica] = [n for n in self.live() if n.port != primary.port
                     and _info(n.port, "replication").get("master_port") == primary.port]
        return replica

    def primaries(self) -> list[RedisServer]:
        return [n for n in self.live() if _info(n.port, "replication").get("role") == "master"]

    def primary_of(self, key: str) -> RedisServer:
        """The live node that serves `key`'s slot."""
        client = redis.Redis(host="127.0.0.1", port=self.live()[0].port)
        try:
            slot = client.cluster("keyslot", key)
            for node in self.primaries():
                c = redis.Redis(host="127.0.0.1", port=node.port)
                try:
                    for start, end, *_ in c.cluster("slots"):
                        if start <= slot <= end:
                            owner_port = _[0][1]
                            return next(n for n in self.live() if n.port == owner_port)
                finally:
                    c.close()
        finally:
            client.close()
        raise RuntimeError(f"no node serves {key!r}")

    @property
    def url(self) -> str:
        """A node's plain URL (the store asks the server and finds it is a cluster)."""
        return f"redis://127.0.0.1:{self.nodes[0].port}/0"

    @property
    def seed_url(self) -> str:
        """`redis+cluster://` with every node as a seed."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes) + "/0"

    def close(self) -> None:
        for node in self.nodes:
            node.close()


class SentinelProcess:
    """One `redis-server --sentinel` watching `master` at `primary_port`."""

    def __init__(self, master: str, primary_port: int, *, down_after_ms: int = 1000) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise RuntimeError("redis-server not found: apt-get install redis-server")
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="fx-sentinel-"))
        conf = self.dir / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.dir}\n"
            f"sentinel monitor {master} 127.0.0.1 {primary_port} 2\n"
            f"sentinel down-after-milliseconds {master} {down_after_ms}\n"
            f"sentinel failover-timeout {master} 10000\n"
            f"sentinel parallel-syncs {master} 1\n"
        )
        self.proc = subprocess.Popen([binary, str(conf), "--sentinel", "--logfile", str(self.dir / "sentinel.log")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.2)
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.RedisError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"sentinel did not start: {(self.dir / 'sentinel.log').read_text()[-2000:]}")
                    time.sleep(0.02)
        finally:
            client.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class SentinelGroup:
    """A primary, its replica and three sentinels watching them as `master`."""

    def __init__(self, *, master: str = "fxmain", down_after_ms: int = 1000) -> None:
        self.master = master
        self.servers: list[RedisServer] = []
        self.sentinels: list[SentinelProcess] = []
        try:
            primary = RedisServer()
            self.servers.append(primary)
            self.servers.append(RedisServer(args=("--replicaof", "127.0.0.1", str(primary.port))))
            self._wait_replica(primary.port)
            self.sentinels = [SentinelProcess(master, primary.port, down_after_ms=down_after_ms) for _ in range(3)]
            self._wait_sentinels_know_each_other()
        except BaseException:
            self.close()
            raise

    def _wait_replica(self, port: int, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not replica_online(port):
            if time.monotonic() > deadline:
                raise RuntimeError("the replica did not connect")
            time.sleep(0.05)

    def _wait_sentinels_know_each_other(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            counts = []
            for s in self.sentinels:
                client = redis.Redis(host="127.0.0.1", port=s.port, decode_responses=True)
                try:
                    info = client.sentinel_master(self.master)
                    counts.append((int(info.get("num-other-sentinels", 0)), int(info.get("num-slaves", 0))))
                finally:
                    client.close()
            if all(c == (2, 1) for c in counts):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the sentinels did not find each other and the replica: {counts}")
            time.sleep(0.1)

    def primary_port(self) -> int:
        client = redis.Redis(host="127.0.0.1", port=self.sentinels[0].port, decode_responses=True)
        try:
            host, port = client.sentinel_get_master_addr_by_name(self.master)
            return int(port)
        finally:
            client.close()

    def primary(self) -> RedisServer:
        port = self.primary_port()
        return next(s for s in self.servers if s.port == port)

    def wait_new_primary(self, old_port: int, timeout_s: float = 30.0) -> float:
        """Waits until the sentinels name another primary and it takes writes; returns the seconds."""
        started = time.monotonic()
        deadline = started + timeout_s
        while True:
            try:
                port = self.primary_port()
                if port != old_port and _info(port, "replication").get("role") == "master":
                    return time.monotonic() - started
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the sentinels did not promote the replica")
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels) + f"/{self.master}/0"

    def close(self) -> None:
        for s in self.sentinels:
            s.close()
        for server in self.servers:
            server.close()
