"""The opro exception tree.

    OproError
    ├── ConfigError            a config file, key or value is wrong (names the key and what is allowed)
    ├── DataError              a document, dataset file or field is unusable (names the file / field)
    │   ├── LeakageError       held-out questions were seen by an optimization: a held-out claim is refused
    │   └── LedgerError        a decision ledger file is damaged (names the file and the line)
    ├── ModelPackError         an embedded model pack is missing or corrupt (names the package to install)
    ├── PromptError            a template or instruction is malformed
    └── LLMError               a call to a language model failed (carries model and provider)
        ├── LLMRateLimitError  429; carries retry_after when the server sent one
        ├── LLMTimeoutError    the call, or its retries, ran out of time
        ├── LLMConnectionError the server could not be reached
        ├── LLMServerError     5xx
        ├── LLMAuthError       401 / 403: not retried
        └── LLMBadRequestError 400 / 404 / 422 or an invalid request: not retried

Backends convert their library's exceptions into these at the boundary (``raise ... from exc``).
"""

from __future__ import annotations


class OproError(Exception):
    """Base class of every error opro raises on purpose."""


class ConfigError(OproError):
    """A configuration value is missing, unknown or out of range."""


class DataError(OproError):
    """A document, dataset file or record cannot be used."""


class LeakageError(DataError):
    """Questions to be called held-out were seen by an optimization (or its split changed since):
    every command refuses it the same way (exit 2)."""


class LedgerError(DataError):
    """A decision ledger file holds a line no crash can leave (bytes that are not text, a record of the
    wrong shape): until it is mended, no decision can be trusted to be refused or resumed."""


class ModelPackError(OproError):
    """An embedded model pack is missing, incomplete or fails its checksum."""


class PromptError(OproError):
    """A prompt template or instruction is malformed."""


class LLMError(OproError):
    """A language-model call failed.

    ``role`` (task, judge, optimizer, generator) is filled in by the :class:`~opro.llm.ChatClient`
    that made the call, so a message says which ``[models.ROLE]`` table to fix. ``permanent``
    errors (a bad key, a bad request, an unknown model) fail the same way on every call: callers
    stop at the first one instead of paying for the rest of a run.
    """

    permanent = False

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        provider: str | None = None,
        status: int | None = None,
    ) -> None:
        self.detail = message
        self.model = model
        self.provider = provider
        self.status = status
        self.role: str | None = None
        super().__init__(message)

    def __str__(self) -> str:
        where = ", ".join(p for p in (self.provider, self.model) if p)
        text = f"{self.detail} [{where}]" if where else self.detail
        if self.role:
            text = f"{self.role} model: {text}"
            if self.permanent:
                text += f"; fix [models.{self.role}] (model, base_url, api_key_env) and rerun: finished work is kept"
        return text


class LLMRateLimitError(LLMError):
    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: object) -> None:
        self.retry_after = retry_after
        super().__init__(message, **kwargs)  # type: ignore[arg-type]


class LLMTimeoutError(LLMError):
    pass


class LLMConnectionError(LLMError):
    pass


class LLMServerError(LLMError):
    pass


class LLMAuthError(LLMError):
    permanent = True


class LLMBadRequestError(LLMError):
    permanent = True


__all__ = [
    "ConfigError",
    "DataError",
    "LLMAuthError",
    "LLMBadRequestError",
    "LLMConnectionError",
    "LLMError",
    "LLMRateLimitError",
    "LLMServerError",
    "LLMTimeoutError",
    "LedgerError",
    "ModelPackError",
    "OproError",
    "PromptError",
]
