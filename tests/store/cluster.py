"""A throwaway Redis Cluster for the `cluster` tests (tests/support/redis_topology.py)."""

from tests.support.redis_topology import RedisClusterProcesses

__all__ = ["RedisClusterProcesses"]
