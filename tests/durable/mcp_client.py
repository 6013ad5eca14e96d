"""An MCP client connection to the test server (`tests.durable.mcp_server`), held open by a task.

anyio's cancel scopes must be left by the task that entered them, so the `stdio_client`
and `ClientSession` contexts live in one task of their own for the connection's life;
`open()` returns once the session is initialized, `close()` ends that task (and the
server process with it).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def server_params(env: dict[str, str] | None = None) -> Any:
    from mcp import StdioServerParameters

    extra = {"PYTHONPATH": str(ROOT), **(env or {})}
    return StdioServerParameters(command=sys.executable, args=["-m", "tests.durable.mcp_server"], cwd=str(ROOT),
                                 env=extra)


class McpConnection:
    """One stdio connection to the test server."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = env
        self.session: Any = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def open(self, timeout_s: float = 30.0) -> Any:
        ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._task = asyncio.get_running_loop().create_task(self._hold(ready), name="mcp-connection")
        self.session = await asyncio.wait_for(ready, timeout_s)
        return self.session

    async def _hold(self, ready: asyncio.Future[Any]) -> None:
        from mcp import ClientSession
        from mcp.client.stdio import stdio_client

        try:
            async with stdio_client(server_params(self.env), errlog=sys.stderr) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    ready.set_result(session)
                    await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            if not isinstance(exc, (asyncio.CancelledError, Exception)):
                raise

    async def close(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.wait_for(asyncio.shield(self._task), timeout_s)


def server_env() -> dict[str, str]:
    """The environment the servers of a worker get: its Redis and prefix."""
    return {"REDIS_URL": os.environ.get("REDIS_URL", ""), "FX_PREFIX": os.environ.get("FX_PREFIX", "fx")}
