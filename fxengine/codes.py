"""Every `FX_` error code of fxengine and fxworker, in one place.

An error carries its code as `code` (`FxError.code`, and `"code"` in an error body, a
`turn_end` line and an HTTP error); each code names one cause and what to do about it is
in the docs (README.md and docs/, checked by tests/deploy/test_codes.py). A `Code` is a
`str`: it compares, serializes and prints as its value.

    raise FxProviderError("the model provider timed out", code=Code.PROVIDER_TIMEOUT)
"""

from __future__ import annotations

from enum import StrEnum


class Code(StrEnum):
    """The registry: a new code is added here, used by name, and documented."""

    # -- any error ------------------------------------------------------------------------
    ERROR = "FX_ERROR"
    INTERNAL = "FX_INTERNAL"
    CONFIG = "FX_CONFIG"

    # -- input refused before anything was sent or stored ----------------------------------
    INVALID_INPUT = "FX_INVALID_INPUT"
    INVALID_SESSION_ID = "FX_INVALID_SESSION_ID"
    INVALID_MESSAGE_ID = "FX_INVALID_MESSAGE_ID"
    INVALID_CURSOR = "FX_INVALID_CURSOR"
    INVALID_REQUEST = "FX_INVALID_REQUEST"
    MESSAGE_ID_IN_USE = "FX_MESSAGE_ID_IN_USE"
    TOOL_INVALID = "FX_TOOL_INVALID"
    SKILL_INVALID = "FX_SKILL_INVALID"
    STEER_NEXT_TURN = "FX_STEER_NEXT_TURN"
    TURN_ENDED = "FX_TURN_ENDED"
    TURN_RUNNING = "FX_TURN_RUNNING"
    ENGINE_CLOSED = "FX_ENGINE_CLOSED"
    DETACHED = "FX_DETACHED"

    # -- limits ------------------------------------------------------------------------------
    LIMIT = "FX_LIMIT"
    LIMIT_BODY = "FX_LIMIT_BODY"
    LIMIT_CONTEXT = "FX_LIMIT_CONTEXT"
    LIMIT_IMAGES_TOTAL = "FX_LIMIT_IMAGES_TOTAL"
    LIMIT_IMAGE_COUNT = "FX_LIMIT_IMAGE_COUNT"
    LIMIT_IMAGE_SIZE = "FX_LIMIT_IMAGE_SIZE"
    LIMIT_INPUT = "FX_LIMIT_INPUT"
    LIMIT_INSTRUCTIONS = "FX_LIMIT_INSTRUCTIONS"
    LIMIT_PROMPT_TEXT = "FX_LIMIT_PROMPT_TEXT"
    LIMIT_QUEUE = "FX_LIMIT_QUEUE"
    LIMIT_STEER_QUEUE = "FX_LIMIT_STEER_QUEUE"
    LIMIT_STEER_QUEUE_BYTES = "FX_LIMIT_STEER_QUEUE_BYTES"
    LIMIT_STEER_SIZE = "FX_LIMIT_STEER_SIZE"
    LIMIT_STREAMS = "FX_LIMIT_STREAMS"

    # -- models and providers ----------------------------------------------------------------
    MODEL_UNKNOWN = "FX_MODEL_UNKNOWN"
    MODEL_NO_IMAGES = "FX_MODEL_NO_IMAGES"
    MODEL_UNSUPPORTED = "FX_MODEL_UNSUPPORTED"
    MODEL_UNSUPPORTED_EFFORT = "FX_MODEL_UNSUPPORTED_EFFORT"
    MODEL_UNSUPPORTED_FAST = "FX_MODEL_UNSUPPORTED_FAST"
    MODEL_UNSUPPORTED_ULTRAFAST = "FX_MODEL_UNSUPPORTED_ULTRAFAST"
    PROVIDER_ERROR = "FX_PROVIDER_ERROR"
    PROVIDER_INVALID = "FX_PROVIDER_INVALID"
    PROVIDER_NO_CREDENTIALS = "FX_PROVIDER_NO_CREDENTIALS"
    PROVIDER_AUTH = "FX_PROVIDER_AUTH"
    PROVIDER_ACCOUNT_MISMATCH = "FX_PROVIDER_ACCOUNT_MISMATCH"
    PROVIDER_REFRESH_LOCK = "FX_PROVIDER_REFRESH_LOCK"
    PROVIDER_RATE_LIMITED = "FX_PROVIDER_RATE_LIMITED"
    PROVIDER_REJECTED = "FX_PROVIDER_REJECTED"
    PROVIDER_UNAVAILABLE = "FX_PROVIDER_UNAVAILABLE"
    PROVIDER_UNREACHABLE = "FX_PROVIDER_UNREACHABLE"
    PROVIDER_TIMEOUT = "FX_PROVIDER_TIMEOUT"
    PROVIDER_STREAM_CUT = "FX_PROVIDER_STREAM_CUT"
    API_ERROR = "FX_API_ERROR"
    SIGN_IN_FAILED = "FX_SIGN_IN_FAILED"
    SIGN_IN_EXPIRED = "FX_SIGN_IN_EXPIRED"

    # -- the journal -------------------------------------------------------------------------
    FENCED = "FX_FENCED"
    JOURNAL_APPEND_FAILED = "FX_JOURNAL_APPEND_FAILED"
    JOURNAL_INVALID = "FX_JOURNAL_INVALID"
    JOURNAL_TOO_LARGE = "FX_JOURNAL_TOO_LARGE"
    JOURNAL_VERSION = "FX_JOURNAL_VERSION"

    # -- sessions, turns and workers ---------------------------------------------------------
    UNKNOWN_SESSION = "FX_UNKNOWN_SESSION"
    UNKNOWN_AGENT = "FX_UNKNOWN_AGENT"
    AGENT_EXISTS = "FX_AGENT_EXISTS"
    NO_AGENT = "FX_NO_AGENT"
    SESSION_INCOMPLETE = "FX_SESSION_INCOMPLETE"
    TURN_FAILED = "FX_TURN_FAILED"
    TURN_INTERRUPTED = "FX_TURN_INTERRUPTED"
    POISON_TURN = "FX_POISON_TURN"
    NO_PROGRESS = "FX_NO_PROGRESS"
    DEADLINE_CUTOFFS = "FX_DEADLINE_CUTOFFS"
    WORKER_ERROR = "FX_WORKER_ERROR"

    # -- the store ---------------------------------------------------------------------------
    STORE_UNAVAILABLE = "FX_STORE_UNAVAILABLE"
    STORE_FULL = "FX_STORE_FULL"
    READ_ONLY = "FX_READ_ONLY"
    ACK_UNSUPPORTED = "FX_ACK_UNSUPPORTED"

    # -- the HTTP API and the fx client ------------------------------------------------------
    UNAUTHORIZED = "FX_UNAUTHORIZED"
    FORBIDDEN = "FX_FORBIDDEN"
    FORBIDDEN_HOST = "FX_FORBIDDEN_HOST"
    FORBIDDEN_ORIGIN = "FX_FORBIDDEN_ORIGIN"
    NOT_FOUND = "FX_NOT_FOUND"
    METHOD_NOT_ALLOWED = "FX_METHOD_NOT_ALLOWED"
    NOT_ACCEPTABLE = "FX_NOT_ACCEPTABLE"
    UNSUPPORTED_MEDIA_TYPE = "FX_UNSUPPORTED_MEDIA_TYPE"
    HTTP = "FX_HTTP"
    CONNECT = "FX_CONNECT"
    WAKE_UNSIGNED = "FX_WAKE_UNSIGNED"
    WAKE_SIGNATURE = "FX_WAKE_SIGNATURE"
    WAKE_EXPIRED = "FX_WAKE_EXPIRED"
    WAKE_REPLAYED = "FX_WAKE_REPLAYED"
