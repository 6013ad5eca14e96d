"""A small MCP server over stdio, written with the `mcp` SDK, for the MCP tests.

Run as ``python -m tests.durable.mcp_server``. Tools:

- `lookup_order(id)`: answers ``order <id>: shipped``;
- `snapshot()`: answers a text and a 1x1 PNG image;
- `charge(order)`: an effect. With `REDIS_URL` and `FX_PREFIX` set it records its start
  in the list `<prefix>:test:mcp:starts` (``<order>|<server pid>``), waits (bounded) for
  the key `<prefix>:test:mcp:release:<order>`, then records ``<order>`` in
  `<prefix>:test:mcp:done`; without Redis it answers at once.

Every server process adds its pid to `<prefix>:test:mcp:pids`, so a test can end the
servers its workers left behind.
"""

from __future__ import annotations

import asyncio
import base64
import os

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.utilities.types import Image

PNG_1X1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYPj/HwADAgH/kZ0ivgAAAABJRU5ErkJggg=="
)
INSTRUCTIONS = "The orders server: call lookup_order before saying anything about an order."
RELEASE_WAIT_S = 60.0

PREFIX = os.environ.get("FX_PREFIX", "fx")
REDIS_URL = os.environ.get("REDIS_URL", "")


def starts_key(prefix: str = PREFIX) -> str:
    return f"{prefix}:test:mcp:starts"


def done_key(prefix: str = PREFIX) -> str:
    return f"{prefix}:test:mcp:done"


def release_key(order: str, prefix: str = PREFIX) -> str:
    return f"{prefix}:test:mcp:release:{order}"


def pids_key(prefix: str = PREFIX) -> str:
    return f"{prefix}:test:mcp:pids"


server = MCPServer("orders", instructions=INSTRUCTIONS)


@server.tool()
def lookup_order(id: str) -> str:
    """Looks up an order by id."""
    return f"order {id}: shipped"


@server.tool(structured_output=False)
def snapshot() -> list[object]:
    """A picture of the warehouse."""
    return ["the warehouse", Image(data=PNG_1X1, format="png")]


@server.tool()
async def charge(order: str) -> str:
    """Charges an order (an effect: it must not run twice)."""
    if not REDIS_URL:
        return f"charged {order}"
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        await client.rpush(starts_key(), f"{order}|{os.getpid()}")
        deadline = asyncio.get_running_loop().time() + RELEASE_WAIT_S
        while not await client.exists(release_key(order)):
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError("never released")
            await asyncio.sleep(0.02)
        await client.rpush(done_key(), order)
    finally:
        await client.aclose()
    return f"charged {order}"


def main() -> None:
    if REDIS_URL:
        import redis

        redis.Redis.from_url(REDIS_URL).rpush(pids_key(), str(os.getpid()))
    server.run("stdio")


if __name__ == "__main__":
    main()
