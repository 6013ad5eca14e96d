"""Input checks and limits (DESIGN §10 prompts, §6 steering), reused by the durable layer.

Every check raises before anything is sent or stored: `FxLimitError` (`FX_LIMIT_*`) for a
size or count over its limit, `FxInputError` (`FX_INVALID_INPUT`) for malformed input.
`check_prompt_input` returns the normalized form the engine and the stores keep:
a list of blocks, text as ``{"type": "text", "text"}`` and images as
``{"type": "image", "mimeType", "data"}`` with canonical base64 data.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import FxInputError, FxLimitError

KIB = 1024
MIB = 1024 * 1024

PROMPT_TEXT_MAX_BYTES = 1 * MIB
PROMPT_IMAGES_MAX = 8
IMAGE_MAX_BYTES = 3_932_160  # 3.75 MiB of raw image bytes
IMAGES_TOTAL_MAX_BYTES = 6 * MIB
STEER_TEXT_MAX_BYTES = 64 * KIB
STEER_QUEUE_MAX = 64
STEER_QUEUE_MAX_BYTES = 1 * MIB
MESSAGE_ID_MAX_CHARS = 128
TOOL_INPUT_PREVIEW_MAX_BYTES = 64 * KIB

IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")

_MESSAGE_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")

Block = dict[str, Any]


def sniff_image_type(data: bytes) -> str | None:
    """The MIME type the leading bytes show (PNG, JPEG, GIF, WebP), or None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def _image_bytes(block: Mapping[str, Any], index: int) -> bytes:
    data = block.get("data")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if not isinstance(data, str):
        raise FxInputError(f"image block {index} needs `data` as bytes or a base64 string")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise FxInputError(f"image block {index} data is not valid base64") from None
    if base64.b64encode(raw).decode("ascii") != data:
        raise FxInputError(f"image block {index} data is not canonical base64 (padding, line breaks or stray bits)")
    return raw


def check_prompt_input(input: str | list[Any] | tuple[Any, ...]) -> list[Block]:
    """Validates a prompt and returns its normalized blocks.

    Args:
        input: a string, or a list of blocks ``{"type": "text", "text"}`` and
            ``{"type": "image", "data": bytes | base64 str, "mimeType"}``.

    Raises:
        FxInputError: malformed input, an empty prompt, an image whose bytes are not
            the claimed type (`FX_INVALID_INPUT`).
        FxLimitError: text over 1 MiB (`FX_LIMIT_PROMPT_TEXT`), more than 8 images
            (`FX_LIMIT_IMAGE_COUNT`), an image over 3.75 MiB (`FX_LIMIT_IMAGE_SIZE`),
            images over 6 MiB together (`FX_LIMIT_IMAGES_TOTAL`).
    """
    if isinstance(input, str):
        blocks_in: list[Any] = [{"type": "text", "text": input}]
    elif isinstance(input, (list, tuple)) or (isinstance(input, Sequence) and not isinstance(input, (bytes, bytearray))):
        blocks_in = list(input)
    else:
        raise FxInputError("prompt input must be a string or a list of content blocks")
    out: list[Block] = []
    text_bytes = 0
    image_bytes = 0
    images = 0
    has_content = False
    for index, block in enumerate(blocks_in):
        if isinstance(block, str):
            block = {"type": "text", "text": block}
        if not isinstance(block, Mapping):
            raise FxInputError(f"prompt block {index} must be an object")
        kind = block.get("type")
        if kind == "text":
            value = block.get("text")
            if not isinstance(value, str):
                raise FxInputError(f"text block {index} needs `text` as a string")
            text_bytes += len(value.encode("utf-8", "surrogatepass"))
            if text_bytes > PROMPT_TEXT_MAX_BYTES:
                raise FxLimitError("prompt text is over 1 MiB", code="FX_LIMIT_PROMPT_TEXT")
            has_content = has_content or bool(value.strip())
            out.append({"type": "text", "text": value})
        elif kind == "image":
            images += 1
            if images > PROMPT_IMAGES_MAX:
                raise FxLimitError(f"a prompt takes at most {PROMPT_IMAGES_MAX} images", code="FX_LIMIT_IMAGE_COUNT")
            raw = _image_bytes(block, index)
            if len(raw) > IMAGE_MAX_BYTES:
                raise FxLimitError(f"image {index} is {len(raw)} bytes, over 3.75 MiB", code="FX_LIMIT_IMAGE_SIZE")
            image_bytes += len(raw)
            if image_bytes > IMAGES_TOTAL_MAX_BYTES:
                raise FxLimitError("prompt images are over 6 MiB together", code="FX_LIMIT_IMAGES_TOTAL")
            sniffed = sniff_image_type(raw)
            if sniffed is None:
                raise FxInputError(f"image {index} is not PNG, JPEG, GIF or WebP")
            claimed = block.get("mimeType", block.get("mime_type"))
            if claimed is not None and claimed != sniffed:
                raise FxInputError(f"image {index} claims {claimed!r} but its bytes are {sniffed}")
            has_content = True
            out.append({"type": "image", "mimeType": sniffed, "data": base64.b64encode(raw).decode("ascii")})
        else:
            raise FxInputError(f"prompt block {index} has unknown type {kind!r}")
    if not has_content:
        raise FxInputError("the prompt is empty")
    return out


def prompt_text(blocks: list[Block]) -> str:
    """The text of normalized blocks, joined (for `turn_start.input` and logs)."""
    return "".join(b["text"] for b in blocks if b.get("type") == "text")


def check_steer_text(text: object, *, queued: int = 0, queued_bytes: int = 0) -> str:
    """Validates one steer against §6 limits, given what is already queued.

    Raises:
        FxInputError: not a non-empty string.
        FxLimitError: over 64 KiB (`FX_LIMIT_STEER_SIZE`), a 65th queued steer
            (`FX_LIMIT_STEER_QUEUE`), or over 1 MiB queued (`FX_LIMIT_STEER_QUEUE_BYTES`).
    """
    if not isinstance(text, str) or not text.strip():
        raise FxInputError("steer text must be a non-empty string")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > STEER_TEXT_MAX_BYTES:
        raise FxLimitError("a steer is at most 64 KiB", code="FX_LIMIT_STEER_SIZE")
    if queued + 1 > STEER_QUEUE_MAX:
        raise FxLimitError("steering queue is full (64 messages)", code="FX_LIMIT_STEER_QUEUE")
    if queued_bytes + size > STEER_QUEUE_MAX_BYTES:
        raise FxLimitError("steering queue is full (1 MiB)", code="FX_LIMIT_STEER_QUEUE_BYTES")
    return text


def check_message_id(message_id: object) -> str:
    """A message id: 1 to 128 of ``A-Z a-z 0-9 . _ : -`` (`FX_INVALID_INPUT` otherwise)."""
    if not isinstance(message_id, str) or not _MESSAGE_ID.fullmatch(message_id):
        raise FxInputError("a message id is 1 to 128 of A-Z a-z 0-9 . _ : -", code="FX_INVALID_MESSAGE_ID")
    return message_id
