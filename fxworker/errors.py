"""fxworker's exceptions. Each class says when it is raised and carries its `FX_` code.

    fxengine.FxError
    ├── FxWorkerError                  base of fxworker's own failures
    │   ├── FxInvalidSessionIdError    a session id the store cannot hold (FX_INVALID_SESSION_ID)
    │   ├── FxInvalidMessageIdError    a message id outside §10's rule (FX_INVALID_MESSAGE_ID)
    │   ├── FxInvalidCursorError       a cursor that is not a non-negative integer (FX_INVALID_CURSOR)
    │   ├── FxMessageIdInUseError      a steer reusing a prompt's id, or the reverse (FX_MESSAGE_ID_IN_USE)
    │   ├── FxUnknownSessionError      no such session in the store (FX_UNKNOWN_SESSION)
    │   ├── FxStoreUnavailableError    Redis could not be reached or answered an error (FX_STORE_UNAVAILABLE)
    │   │   └── FxStoreFullError       Redis refused a write at its memory limit (FX_STORE_FULL)
    │   ├── FxSessionIncompleteError   some of a session's keys are gone (evicted, deleted) (FX_SESSION_INCOMPLETE)
    │   ├── FxAckUnsupportedError      the acknowledgement level needs a newer Redis (FX_ACK_UNSUPPORTED)
    │   ├── FxAgentExistsError         two Agents with one name in one process (FX_AGENT_EXISTS)
    │   ├── FxNoAgentError             this process has no agent of the session's name (FX_NO_AGENT)
    │   ├── FxConfigError              a setting has a value that cannot be used (FX_CONFIG)
    │   ├── FxUnknownAgentError        a request names an agent this web app does not serve (FX_UNKNOWN_AGENT)
    │   ├── FxInvalidRequestError      an HTTP body that is not JSON or not the expected shape (FX_INVALID_REQUEST)
    │   ├── FxUnauthorizedError        no or a wrong bearer token (FX_UNAUTHORIZED)
    │   ├── FxForbiddenError           the `authorize` hook refused the request (FX_FORBIDDEN)
    │   ├── FxWakeRefusedError         a wake not signed, signed wrong, too old or replayed (FX_WAKE_*)
    │   └── (the three limits below are FxWorkerErrors too)
    ├── fxengine.FxInputError
    │   └── fxengine.FxLimitError      every FX_LIMIT_* code: the engine's (FX_LIMIT_PROMPT_TEXT, ...) and the
    │       │                          store's (FX_LIMIT_INPUT, FX_LIMIT_STEER_SIZE), raised as FxLimitError
    │       ├── FxQueueFullError       a session's steer queue is full (FX_LIMIT_QUEUE)
    │       ├── FxBodyTooLargeError    an HTTP body over the 8 MiB cap, refused unparsed (FX_LIMIT_BODY)
    │       └── FxStreamsFullError     a web process has its most streams open (FX_LIMIT_STREAMS)
    └── fxengine.FxFencedError         a write that is not the head of the session's log (FX_FENCED)
        └── FxLeaseLostError           this worker no longer heads the session's epoch chain (FX_FENCED);
                                       the one fenced stop, raised by the store and by the runner alike

Control-flow signals (fenced, yielded, cancelled) are kept apart from failures: a fenced
worker stops quietly, a yield is a stop reason, not an exception.

Codes a turn ends with (`turn_end.error.code`, with a `session_error` line; never raised):
FX_POISON_TURN (stop reason `cancelled`: its workers died 3 times with no progress
between, §6; `error`: they died 3 times before its turn opened, and the prompt was
dropped), FX_DEADLINE_CUTOFFS (`cancelled`: its model request was cut off by the deadline
3 times in a row) and FX_TURN_FAILED (`error`: the delivery raised an exception that has
no `FX_` code of its own; one that has ends the turn with that code).
"""

from __future__ import annotations

from fxengine.codes import Code
from fxengine.errors import FxError, FxFencedError, FxLimitError


class FxWorkerError(FxError):
    """Base class of fxworker's own failures."""

    code = Code.WORKER_ERROR


class FxInvalidSessionIdError(FxWorkerError, ValueError):
    """Raised when a session id does not match the store's id rule (§2)."""

    code = Code.INVALID_SESSION_ID


class FxInvalidMessageIdError(FxWorkerError, ValueError):
    """Raised when a message id is not 1-128 of `A-Z a-z 0-9 . _ : -` (§10)."""

    code = Code.INVALID_MESSAGE_ID


class FxInvalidCursorError(FxWorkerError, ValueError):
    """Raised when a stream cursor is not a non-negative integer (§10)."""

    code = Code.INVALID_CURSOR


class FxMessageIdInUseError(FxWorkerError):
    """Raised when a message id already names another kind of input (a steer reusing a prompt's id)."""

    code = Code.MESSAGE_ID_IN_USE


class FxUnknownSessionError(FxWorkerError, LookupError):
    """Raised when the store holds no session with this id."""

    code = Code.UNKNOWN_SESSION


class FxStoreUnavailableError(FxWorkerError):
    """Raised when Redis cannot be reached or fails mid-call; the script either ran whole or not at all."""

    code = Code.STORE_UNAVAILABLE


class FxStoreFullError(FxStoreUnavailableError):
    """Raised when Redis refuses a write because it reached `maxmemory` (an OOM reply); nothing was stored."""

    code = Code.STORE_FULL


class FxSessionIncompleteError(FxWorkerError):
    """Raised when some of a session's keys are gone (evicted or deleted): it is not served on a half-gone history."""

    code = Code.SESSION_INCOMPLETE


class FxAckUnsupportedError(FxWorkerError):
    """Raised when `ack="aof"` is asked of a Redis older than 7.2."""

    code = Code.ACK_UNSUPPORTED


class FxAgentExistsError(FxWorkerError):
    """Raised when a second Agent is created with a name this process already has."""

    code = Code.AGENT_EXISTS


class FxNoAgentError(FxWorkerError):
    """Raised by the delivery handler when this process has no agent of the session's name;
    `retry_at_ms`, when set, is when the store's backoff wants the session woken again, and
    `spare` says another wake is due then already (this one need not be delivered again)."""

    code = Code.NO_AGENT

    def __init__(self, message: str, *, retry_at_ms: int | None = None, spare: bool = False) -> None:
        super().__init__(message)
        self.retry_at_ms = retry_at_ms
        self.spare = spare


class FxQueueFullError(FxWorkerError, FxLimitError):
    """Raised when a steer would exceed the queued-steer limits of §6."""

    code = Code.LIMIT_QUEUE


class FxConfigError(FxWorkerError):
    """Raised when a setting (usually an `FX_` variable) has a value that cannot be used."""

    code = Code.CONFIG


class FxLeaseLostError(FxFencedError):
    """Raised when a write comes from a worker that no longer heads the epoch chain."""

    code = Code.FENCED


class FxUnknownAgentError(FxWorkerError, LookupError):
    """Raised by the web app when a request names an agent it does not serve."""

    code = Code.UNKNOWN_AGENT


class FxInvalidRequestError(FxWorkerError, ValueError):
    """Raised when an HTTP request body is not JSON or does not have the documented fields."""

    code = Code.INVALID_REQUEST


class FxBodyTooLargeError(FxWorkerError, FxLimitError):
    """Raised when an HTTP request body exceeds the 8 MiB cap; it is refused before parsing."""

    code = Code.LIMIT_BODY


class FxStreamsFullError(FxWorkerError, FxLimitError):
    """Raised when a web process already has its most NDJSON streams open (503, try again shortly)."""

    code = Code.LIMIT_STREAMS


class FxUnauthorizedError(FxWorkerError):
    """Raised when a request lacks the bearer token the web app requires, or carries a wrong one."""

    code = Code.UNAUTHORIZED


class FxForbiddenError(FxWorkerError):
    """Raised when the embedder's `authorize(request, session_id, action)` hook refuses a request."""

    code = Code.FORBIDDEN


class FxWakeRefusedError(FxWorkerError):
    """Raised for a wake delivery that is unsigned (FX_WAKE_UNSIGNED), signed wrong (FX_WAKE_SIGNATURE),
    too old or too far ahead (FX_WAKE_EXPIRED) or already seen (FX_WAKE_REPLAYED)."""

    code = Code.WAKE_SIGNATURE
