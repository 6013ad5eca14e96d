"""Where the session store lives, read from its URL (`FX_STORE_URL`, default `REDIS_URL`).

    redis://[user:password@]host:port/db        one Redis (a Redis Cluster node: detected)
    rediss://...                                the same over TLS
    redis+cluster://[user:password@]host:port,host:port/0
                                                a Redis Cluster, from these seed nodes
    redis+sentinel://[user:password@]host:port,host:port/<master>[/db][?sentinel_password=...]
                                                the primary the sentinels name `<master>`

`rediss+cluster://` and `rediss+sentinel://` use TLS. The user and password are the data
nodes'; sentinels that require a password of their own take `sentinel_password`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qs, unquote

from .errors import FxConfigError

Kind = Literal["redis", "cluster", "sentinel"]
DEFAULT_PORT = {"redis": 6379, "cluster": 6379, "sentinel": 26379}


@dataclass(frozen=True, slots=True)
class StoreAddress:
    """A parsed store URL: its kind, the nodes it names (cluster seeds or sentinels), and
    what the data nodes need (credentials, TLS, database, the sentinel's master name)."""

    kind: Kind
    url: str
    nodes: tuple[tuple[str, int], ...] = ()
    username: str | None = None
    password: str | None = None
    tls: bool = False
    db: int = 0
    master: str | None = None
    sentinel_password: str | None = None

    def __repr__(self) -> str:
        return f"<StoreAddress {self.kind} {masked(self.url)}>"

    @property
    def first_url(self) -> str:
        """A `redis://` URL of the first node named (a sentinel's for `sentinel`)."""
        if self.kind == "redis":
            return self.url
        host, port = self.nodes[0]
        auth = ""
        if self.kind == "cluster" and (self.username or self.password):
            auth = f"{self.username or ''}:{self.password or ''}@"
        return f"{'rediss' if self.tls else 'redis'}://{auth}{host}:{port}/{self.db if self.kind == 'cluster' else 0}"


def masked(url: str) -> str:
    """`url` with its password replaced by `***`, for logs and messages."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    userinfo, _, tail = rest.partition("@")
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{tail}"


def parse_store_url(url: str) -> StoreAddress:
    """The address `url` names; `FxConfigError` saying what is wrong with one it cannot read."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise FxConfigError(f"the store URL {masked(url)!r} has no scheme: use redis://, rediss://, "
                            "redis+cluster:// or redis+sentinel://")
    if scheme in ("redis", "rediss", "unix"):
        return StoreAddress("redis", url, tls=scheme == "rediss")
    base, _, variant = scheme.partition("+")
    if base not in ("redis", "rediss") or variant not in ("cluster", "sentinel"):
        raise FxConfigError(f"the store URL scheme {scheme!r} is not one the store takes: use redis://, rediss://, "
                            "redis+cluster:// or redis+sentinel://")
    kind: Kind = "cluster" if variant == "cluster" else "sentinel"
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    username = password = None
    if "@" in netloc:
        userinfo, _, netloc = netloc.rpartition("@")
        user, _, pw = userinfo.partition(":")
        username, password = unquote(user) or None, unquote(pw) or None
    nodes = tuple(_host_port(part, DEFAULT_PORT[kind], url) for part in netloc.split(",") if part.strip())
    if not nodes:
        raise FxConfigError(f"the store URL {masked(url)!r} names no node")
    segments = [unquote(s) for s in path.split("/") if s]
    options = {k: v[-1] for k, v in parse_qs(query).items()}
    master = None
    if kind == "sentinel":
        if not segments:
            raise FxConfigError(f"the store URL {masked(url)!r} names no master: "
                                "redis+sentinel://host:26379,host:26379/<master>[/db]")
        master = segments.pop(0)
    if len(segments) > 1 or (segments and not segments[0].isdigit()):
        raise FxConfigError(f"the store URL {masked(url)!r} has a path the store cannot read: "
                            "one database number at most")
    db = int(segments[0]) if segments else 0
    if kind == "cluster" and db != 0:
        raise FxConfigError(f"a Redis Cluster has database 0 only; the store URL {masked(url)!r} names {db}")
    return StoreAddress(kind, url, nodes, username, password, base == "rediss", db, master,
                        options.get("sentinel_password"))


def _host_port(part: str, default_port: int, url: str) -> tuple[str, int]:
    host, sep, port = part.strip().rpartition(":")
    if not sep:
        return part.strip(), default_port
    if not port.isdigit():
        raise FxConfigError(f"the store URL {masked(url)!r} has a node without a port number: {part!r}")
    return host.strip("[]"), int(port)
