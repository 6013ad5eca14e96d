"""Input checks and limits (docs/design.md §10 prompts, §6 steering), reused by the durable layer.

Every check raises before anything is sent or stored: `FxLimitError` (`FX_LIMIT_*`) for a
size or count over its limit, `FxInputError` (`FX_INVALID_INPUT`) for malformed input.
`check_prompt_input` returns the normalized form the engine and the stores keep:
a list of blocks, text as ``{"type": "text", "text"}`` and images as
``{"type": "image", "mimeType", "data"}`` with canonical base64 data.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeAlias, TypeGuard

from .codes import Code
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
INSTRUCTIONS_MAX_BYTES = 64 * KIB
# A session's tool context is stored with every input it sends and handed to every tool
# call: small by design (ids, a tenant, flags), and shallow enough for any JSON parser.
CONTEXT_MAX_BYTES = 64 * KIB
CONTEXT_MAX_DEPTH = 32

IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")

_MESSAGE_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")

# A normalized prompt block: ``{"type": "text", "text"}`` or ``{"type": "image", "mimeType",
# "data"}`` (base64).
Block = dict[str, str]
# A value JSON can carry, as `json.loads` gives it (a tool context is one).
JSONValue: TypeAlias = None | bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"]


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


def _image_bytes(block: Mapping[str, object], index: int, *, json_only: bool = False) -> bytes:
    data = block.get("data")
    if isinstance(data, (bytes, bytearray, memoryview)):
        if json_only:
            # A session stores its prompts as JSON before they run (§10).
            raise FxInputError(f"image block {index}: a session prompt carries image data as a base64 string")
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


def check_prompt_input(input: object, *, json_only: bool = False) -> list[Block]:
    """Validates a prompt and returns its normalized blocks.

    Args:
        input: a string, or a list of blocks ``{"type": "text", "text"}`` and
            ``{"type": "image", "data": bytes | base64 str, "mimeType" | "mime_type"}``.
        json_only: refuse image data given as bytes (a session prompt is stored as JSON).

    Raises:
        FxInputError: malformed input, an empty prompt, text with a lone surrogate, an
            image whose bytes are not the claimed type (`FX_INVALID_INPUT`).
        FxLimitError: text over 1 MiB (`FX_LIMIT_PROMPT_TEXT`), more than 8 images
            (`FX_LIMIT_IMAGE_COUNT`), an image over 3.75 MiB (`FX_LIMIT_IMAGE_SIZE`),
            images over 6 MiB together (`FX_LIMIT_IMAGES_TOTAL`).
    """
    blocks_in = _block_list(input)
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
            text_bytes += _utf8_size(value, f"text block {index}")
            if text_bytes > PROMPT_TEXT_MAX_BYTES:
                raise FxLimitError("prompt text is over 1 MiB", code=Code.LIMIT_PROMPT_TEXT)
            has_content = has_content or bool(value.strip())
            out.append({"type": "text", "text": value})
        elif kind == "image":
            images += 1
            if images > PROMPT_IMAGES_MAX:
                raise FxLimitError(f"a prompt takes at most {PROMPT_IMAGES_MAX} images", code=Code.LIMIT_IMAGE_COUNT)
            raw = _image_bytes(block, index, json_only=json_only)
            if len(raw) > IMAGE_MAX_BYTES:
                raise FxLimitError(f"image {index} is {len(raw)} bytes, over 3.75 MiB", code=Code.LIMIT_IMAGE_SIZE)
            image_bytes += len(raw)
            if image_bytes > IMAGES_TOTAL_MAX_BYTES:
                raise FxLimitError("prompt images are over 6 MiB together", code=Code.LIMIT_IMAGES_TOTAL)
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


def _block_list(input: object) -> list[object]:
    if isinstance(input, str):
        return [{"type": "text", "text": input}]
    if isinstance(input, (list, tuple)) or (isinstance(input, Sequence) and not isinstance(input, (bytes, bytearray))):
        return list(input)
    raise FxInputError("prompt input must be a string or a list of content blocks")


def has_images(blocks: Sequence[Mapping[str, object]]) -> bool:
    """True when normalized blocks hold an image."""
    return any(block.get("type") == "image" for block in blocks)


# A `resize_image` hook: ``{"bytes", "mime_type"}`` in, the same out (or an awaitable of it).
ResizeImage = Callable[[dict[str, object]], object]


def stage_prompt_input(input: object, *, json_only: bool = False) -> list[object]:
    """The checks a prompt passes before a `resize_image` hook sees it: its shape, at most
    8 images, each image's data as bytes or canonical base64 (base64 only with `json_only`).

    Returns the blocks with each image as ``{"type": "image", "bytes", "mime_type"}`` (the
    claimed type, or the sniffed one); text blocks are left for `check_prompt_input`.
    """
    out: list[object] = []
    images = 0
    for index, block in enumerate(_block_list(input)):
        if isinstance(block, Mapping) and block.get("type") == "image":
            images += 1
            if images > PROMPT_IMAGES_MAX:
                raise FxLimitError(f"a prompt takes at most {PROMPT_IMAGES_MAX} images", code=Code.LIMIT_IMAGE_COUNT)
            raw = _image_bytes(block, index, json_only=json_only)
            claimed = block.get("mimeType", block.get("mime_type"))
            if claimed is not None and not isinstance(claimed, str):
                raise FxInputError(f"image block {index}: the MIME type must be a string")
            out.append({"type": "image", "bytes": raw, "mime_type": claimed or sniff_image_type(raw)})
        else:
            out.append(block)
    return out


def _resized(result: object, index: int) -> dict[str, object]:
    if not isinstance(result, Mapping) or not isinstance(result.get("bytes"), (bytes, bytearray, memoryview)):
        raise FxInputError(f"resize_image must return {{'bytes', 'mime_type'}} (image {index})")
    mime = result.get("mime_type", result.get("mimeType"))
    if mime is not None and not isinstance(mime, str):
        raise FxInputError(f"resize_image returned a MIME type that is not a string (image {index})")
    return {"type": "image", "data": bytes(result["bytes"]), "mimeType": mime}


def resize_prompt_images(staged: list[object], resize_image: ResizeImage) -> list[object] | Awaitable[list[object]]:
    """Hands every staged image to `resize_image`; returns the blocks for `check_prompt_input`.

    A hook that answers at once gives the blocks at once; one that returns an awaitable
    (an async hook) gives an awaitable of them. A hook that raises fails the prompt with
    `FX_INVALID_INPUT`.
    """
    results: list[object] = []
    try:
        for index, block in enumerate(staged):
            if _is_staged_image(block):
                results.append(_call_hook(resize_image, block, index))
            else:
                results.append(block)
    except BaseException:
        for result in results:  # the awaitables already made are never awaited
            if inspect.iscoroutine(result):
                result.close()
        raise
    if not any(inspect.isawaitable(r) for r in results):
        return [_resized(r, i) if _is_staged_image(b) else r for i, (b, r) in enumerate(zip(staged, results))]

    async def settle() -> list[object]:
        out: list[object] = []
        try:
            for index, (block, result) in enumerate(zip(staged, results)):
                if inspect.isawaitable(result):
                    try:
                        result = await result
                    except FxInputError:
                        raise
                    except Exception as exc:
                        raise FxInputError(f"resize_image failed on image {index}: {exc}") from exc
                out.append(_resized(result, index) if _is_staged_image(block) else result)
        finally:
            for result in results[len(out) + 1:]:
                if inspect.iscoroutine(result):
                    result.close()
        return out

    return settle()


def _call_hook(resize_image: ResizeImage, block: Mapping[str, object], index: int) -> object:
    try:
        return resize_image({"bytes": block["bytes"], "mime_type": block["mime_type"]})
    except FxInputError:
        raise
    except Exception as exc:
        raise FxInputError(f"resize_image failed on image {index}: {exc}") from exc


def _is_staged_image(block: object) -> TypeGuard[Mapping[str, object]]:
    return isinstance(block, Mapping) and block.get("type") == "image" and "bytes" in block


async def prepare_prompt_input(
    input: object, *, resize_image: ResizeImage | None = None, json_only: bool = False
) -> list[Block]:
    """`check_prompt_input` after the `resize_image` hook (sync or async) saw each image.

    Every limit applies to what the hook returned; the shape, the image count and the
    input's own base64 are checked before it runs (`stage_prompt_input`).
    """
    if resize_image is None:
        return check_prompt_input(input, json_only=json_only)
    blocks = resize_prompt_images(stage_prompt_input(input, json_only=json_only), resize_image)
    if inspect.isawaitable(blocks):
        blocks = await blocks
    return check_prompt_input(blocks)


def prompt_text(blocks: list[Block]) -> str:
    """The text of normalized blocks, joined (for `turn_start.input` and logs)."""
    return "".join(b["text"] for b in blocks if b.get("type") == "text")


def check_steer_text(text: object, *, queued: int = 0, queued_bytes: int = 0) -> str:
    """Validates one steer against §6 limits, given what is already queued.

    Raises:
        FxInputError: not a non-empty string, or one with a lone surrogate.
        FxLimitError: over 64 KiB (`FX_LIMIT_STEER_SIZE`), a 65th queued steer
            (`FX_LIMIT_STEER_QUEUE`), or over 1 MiB queued (`FX_LIMIT_STEER_QUEUE_BYTES`).
    """
    if not isinstance(text, str) or not text.strip():
        raise FxInputError("steer text must be a non-empty string")
    size = _utf8_size(text, "steer text")
    if size > STEER_TEXT_MAX_BYTES:
        raise FxLimitError("a steer is at most 64 KiB", code=Code.LIMIT_STEER_SIZE)
    if queued + 1 > STEER_QUEUE_MAX:
        raise FxLimitError("steering queue is full (64 messages)", code=Code.LIMIT_STEER_QUEUE)
    if queued_bytes + size > STEER_QUEUE_MAX_BYTES:
        raise FxLimitError("steering queue is full (1 MiB)", code=Code.LIMIT_STEER_QUEUE_BYTES)
    return text


def check_message_id(message_id: object) -> str:
    """A message id: 1 to 128 of ``A-Z a-z 0-9 . _ : -`` (`FX_INVALID_INPUT` otherwise)."""
    if not isinstance(message_id, str) or not _MESSAGE_ID.fullmatch(message_id):
        raise FxInputError("a message id is 1 to 128 of A-Z a-z 0-9 . _ : -", code=Code.INVALID_MESSAGE_ID)
    return message_id


def _utf8_size(text: str, what: str) -> int:
    """The UTF-8 size of `text`; `FxInputError` for a lone surrogate (it cannot be stored)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise FxInputError(f"{what} contains a lone surrogate (text that is not valid Unicode)") from None


def is_utf8(text: str) -> bool:
    """True when `text` encodes to UTF-8 (no lone surrogate such as ``"\\ud800"``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_instructions(instructions: object) -> str | None:
    """Instructions (the system prompt): a string or a sequence of strings, joined by a
    blank line; at most 64 KiB of UTF-8. Returns the joined text (None when empty).

    Raises:
        FxInputError: not a string or a sequence of strings, or text with a lone surrogate.
        FxLimitError: over 64 KiB (`FX_LIMIT_INSTRUCTIONS`).
    """
    if instructions is None:
        return None
    if isinstance(instructions, Sequence) and not isinstance(instructions, (str, bytes, bytearray)):
        parts = list(instructions)
        if not all(isinstance(part, str) for part in parts):
            raise FxInputError("instructions must be a string or a list of strings")
        instructions = "\n\n".join(parts)
    if not isinstance(instructions, str):
        raise FxInputError(f"instructions must be a string or a list of strings, got {type(instructions).__name__}")
    if len(instructions.encode("utf-8", "surrogatepass")) > INSTRUCTIONS_MAX_BYTES:
        raise FxLimitError("instructions are over 64 KiB", code=Code.LIMIT_INSTRUCTIONS)
    if not is_utf8(instructions):
        raise FxInputError("instructions contain a lone surrogate (text that is not valid Unicode)")
    return instructions or None


def check_context(context: object) -> JSONValue:
    """A tool context: JSON values only, returned as a plain copy (tuples become lists).

    Objects need string keys; numbers must be finite (no NaN or Infinity, which JSON
    lacks); strings must be valid Unicode (no lone surrogates); nesting is at most
    `CONTEXT_MAX_DEPTH` (32) levels and the JSON text at most `CONTEXT_MAX_BYTES` (64 KiB).

    Raises:
        FxInputError: a value JSON cannot carry, named by its path (`FX_INVALID_INPUT`).
        FxLimitError: too deep or too large (`FX_LIMIT_CONTEXT`).
    """
    budget = [CONTEXT_MAX_BYTES]  # every value costs at least one byte of JSON

    def walk(value: object, path: str, depth: int) -> JSONValue:
        budget[0] -= 1
        if budget[0] < 0:
            raise FxLimitError(f"context is over {CONTEXT_MAX_BYTES // KIB} KiB of JSON", code=Code.LIMIT_CONTEXT)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            if not math.isfinite(value):
                raise FxInputError(f"context{path} is {value!r}: JSON has no NaN or Infinity")
            return float(value)
        if isinstance(value, str):
            if not is_utf8(value):
                raise FxInputError(f"context{path} contains a lone surrogate (text that is not valid Unicode)")
            return value
        if isinstance(value, (Mapping, list, tuple)):
            if depth >= CONTEXT_MAX_DEPTH:
                raise FxLimitError(f"context nests deeper than {CONTEXT_MAX_DEPTH} levels", code=Code.LIMIT_CONTEXT)
            if isinstance(value, Mapping):
                out: dict[str, JSONValue] = {}
                for key, item in value.items():
                    if not isinstance(key, str):
                        raise FxInputError(f"context{path} has a key {key!r}: JSON object keys are strings")
                    if not is_utf8(key):
                        raise FxInputError(f"context{path} has a key with a lone surrogate")
                    out[key] = walk(item, f"{path}.{key}", depth + 1)
                return out
            return [walk(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
        raise FxInputError(f"context{path} is a {type(value).__name__}, which is not JSON")

    if context is None:
        return None
    plain = walk(context, "", 0)
    size = len(json.dumps(plain, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8"))
    if size > CONTEXT_MAX_BYTES:
        raise FxLimitError(f"context is {size} bytes of JSON, over {CONTEXT_MAX_BYTES // KIB} KiB", code=Code.LIMIT_CONTEXT)
    return plain
