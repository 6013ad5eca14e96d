"""fxengine's exceptions. Every failure carries an `FX_` code.

    FxError                         base of every fxengine failure (code FX_ERROR)
    ├── FxInputError                bad input refused before anything was sent or stored
    │   ├── FxLimitError            a documented limit was exceeded (FX_LIMIT_*)
    │   ├── FxModelUnsupportedError a model setting the catalog lacks (FX_MODEL_UNSUPPORTED_*)
    │   ├── FxToolDefinitionError   a tool, an MCP tool or a skill is malformed (FX_TOOL_INVALID, FX_SKILL_INVALID)
    │   └── FxSteerDeferredError    a steer with images runs as the next turn (FX_STEER_NEXT_TURN)
    ├── FxProviderError             the model provider failed (FX_PROVIDER_*)
    ├── FxJournalError              a journal or checkpoint cannot be read (FX_JOURNAL_INVALID)
    │   └── FxJournalVersionError   written by a newer fxengine (FX_JOURNAL_VERSION)
    ├── FxJournalAppendError        the store refused or lost an append; the turn stopped
    └── FxFencedError               another writer heads this session (FX_FENCED)

Control-flow outcomes (cancelled, yielded) are stop reasons, not exceptions.
"""

from __future__ import annotations

from .codes import Code


class FxError(Exception):
    """Base class; `code` is the stable machine-readable `FX_` code."""

    code: str = Code.ERROR

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""

    def to_dict(self) -> dict[str, object]:
        """`{code, message}`, the `error` of a turn's end (`FxModelUnsupportedError` adds its fields)."""
        return {"code": self.code, "message": self.message}


class FxInputError(FxError, ValueError):
    """Raised for input refused before anything was sent to a model or stored."""

    code = Code.INVALID_INPUT


class FxLimitError(FxInputError):
    """Raised when input exceeds a documented limit of docs/design.md §10."""

    code = Code.LIMIT


class FxModelUnsupportedError(FxInputError):
    """Raised when a model's catalog entry does not offer a setting (docs/design.md §8).

    Attributes:
        model: the model id.
        capability: ``"effort"``, ``"fast"`` or ``"ultrafast"``.
        supported: for effort, the levels the model offers (else empty).
    """

    code = Code.MODEL_UNSUPPORTED

    def __init__(self, message: str, *, code: str | None = None, model: str, capability: str,
                 supported: tuple[str, ...] = ()) -> None:
        super().__init__(message, code=code)
        self.model = model
        self.capability = capability
        self.supported = tuple(supported)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {**super().to_dict(), "model": self.model, "capability": self.capability}
        if self.capability == "effort":
            out["supported"] = list(self.supported)
        return out


class FxToolDefinitionError(FxInputError):
    """Raised at creation when a tool is malformed (for example, no `idempotent`)."""

    code = Code.TOOL_INVALID


class FxSteerDeferredError(FxInputError):
    """Raised by `Turn.steer` for a steer with images: it cannot join the running turn, which
    ends at its next safe point; the caller runs the steer as the next prompt."""

    code = Code.STEER_NEXT_TURN


class FxProviderError(FxError):
    """Raised when the model provider fails in a way the turn cannot recover from."""

    code = Code.PROVIDER_ERROR


class FxJournalError(FxError):
    """Raised when a journal record or checkpoint does not parse."""

    code = Code.JOURNAL_INVALID


class FxJournalVersionError(FxJournalError):
    """Raised when a journal or checkpoint was written by a newer fxengine."""

    code = Code.JOURNAL_VERSION


class FxFencedError(FxError):
    """Raised by a store when the writer no longer heads the session (stale `expected` or epoch)."""

    code = Code.FENCED


class FxJournalAppendError(FxError):
    """Raised by a turn whose journal append failed; `__cause__` is the store's error."""

    code = Code.JOURNAL_APPEND_FAILED
