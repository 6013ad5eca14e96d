"""The `FX_AGENTS` module of the MCP durable tests' workers: agent `mcp`.

At import (the worker's `worker_init`), it starts the test MCP server
(`tests.durable.mcp_server`) over stdio on the worker's process loop, where every turn and
tool call of the process runs, and makes agent `mcp` of its tools (`orders_*`; only
`orders_lookup_order` is marked idempotent) and instructions, on the scripted model at
`FX_TEST_MODEL_URL`. The connection is the process's for its whole life.
"""

from __future__ import annotations

from typing import Any

from fxengine.mcp import McpAdapter, create_mcp_adapter
from fxworker import Agent
from fxworker.tasks import process_loop
from tests.durable.mcp_client import McpConnection, server_env
from tests.durable.tooling import provider

CONNECT_TIMEOUT_S = 60.0


async def _connect() -> tuple[McpConnection, McpAdapter]:
    connection = McpConnection(server_env())
    session: Any = await connection.open()
    adapter = await create_mcp_adapter(session, prefix="orders_", idempotent={"lookup_order": True})
    return connection, adapter


CONNECTION, ADAPTER = process_loop().run(_connect(), timeout_s=CONNECT_TIMEOUT_S)

AGENT = Agent(
    "mcp",
    model="scripted",
    provider=provider(),
    tools=ADAPTER.tools,
    instructions=ADAPTER.instructions,
    api_key="test-key",
)
