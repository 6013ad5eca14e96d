"""The provider-neutral messages of a conversation's history (see `fxengine.conversation`).

    {"role": "user", "blocks": [...]}
    {"role": "assistant", "content", "tool_calls": [{id, name, arguments}]}
    {"role": "tool", "id", "name", "content", "isError", "images"?}

`models.openai_chat.wire_messages` turns them into a Chat Completions request; a
checkpoint stores them as they are.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from .limits import Block
from .tools.runner import ToolCall


class UserMessage(TypedDict):
    """A prompt, a steer or the resume notice: normalized blocks (`limits.check_prompt_input`)."""

    role: Literal["user"]
    blocks: list[Block]


class AssistantMessage(TypedDict):
    """A model response with text or tool calls (a response with neither is not kept)."""

    role: Literal["assistant"]
    content: str
    tool_calls: list[ToolCall]


class ToolResult(TypedDict):
    """A call's answer; the history keeps it as a `ToolMessage` (`{"role": "tool", **result}`)."""

    id: str
    name: str
    content: str
    isError: bool
    images: NotRequired[list[dict[str, str]]]  # {"mimeType", "data"} (base64)


class ToolMessage(ToolResult):
    role: Literal["tool"]


Message = UserMessage | AssistantMessage | ToolMessage
