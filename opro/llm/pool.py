"""Which backend serves a role: :class:`ModelSpec` (validated settings) and :class:`ModelPool`.

A pool is passed explicitly (no process-wide cache): it owns what it loaded, shares one loaded
llama.cpp model between the roles that name the same GGUF file with the same settings (the 1.5B
model serves as judge, optimizer and generator but is loaded once), and frees it on ``close()``.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, get_args

from opro.errors import ConfigError
from opro.llm.client import LLM
from opro.llm.cpu import CpuShare
from opro.llm.packs import EMBEDDED_STRONG_MODEL, EMBEDDED_TASK_MODEL

Backend = Literal["llamacpp", "openai", "scripted"]
BACKENDS: tuple[str, ...] = get_args(Backend)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

def check_endpoint(*, base_url: str | None, api_key_env: str, where: str = "") -> None:
    """An OpenAI-compatible endpoint's ``base_url`` (unless None) is an http(s) URL and ``api_key_env``
    names a variable (the key itself is never echoed). ``where`` prefixes the keys, e.g.
    ``[rag.embeddings].``."""
    if base_url is not None and not re.match(r"^https?://", base_url):
        raise ConfigError(f"{where}base_url must start with http:// or https://, got {base_url!r}.")
    if not _ENV_NAME.match(api_key_env):
        raise ConfigError(
            f"{where}api_key_env must be the NAME of an environment variable (like OPENAI_API_KEY), got "
            f"{api_key_env[:4]!r}...; never put the key itself in a config."
        )


#: Embedded defaults per role: the small model answers, the larger one judges and writes prompts.
DEFAULT_ROLE_MODELS: dict[str, str] = {
    "task": EMBEDDED_TASK_MODEL,
    "judge": EMBEDDED_STRONG_MODEL,
    "optimizer": EMBEDDED_STRONG_MODEL,
    "generator": EMBEDDED_STRONG_MODEL,
}


@dataclass(frozen=True)
class ModelSpec:
    """The backend and model of one role.

    - ``llamacpp``: ``model`` is an embedded model name or a GGUF path; uses ``n_threads``,
      ``n_ctx``, ``logprobs``, ``batch_width``, ``prefix_cache_mb``, ``draft_fill`` and ``extra_buffers``.
    - ``openai``: ``model`` is the server's model id; uses ``base_url``, ``api_key_env``,
      ``timeout_s``, ``max_concurrency`` (logprobs are always available there).
    - ``scripted``: ``model`` names a backend registered with the pool (tests) or a recording file.
    """

    backend: Backend = "llamacpp"
    model: str = EMBEDDED_TASK_MODEL
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    n_threads: int | None = None
    n_ctx: int = 4096
    timeout_s: float = 60.0
    max_concurrency: int | None = None
    #: llamacpp only: keep every position's logits so ``top_logprobs`` works (costs memory).
    logprobs: bool = False
    #: openai only: constrain JSON replies with ``response_format`` ``json_schema``. Set it to false
    #: for servers that reject that type (llama-cpp-python's server accepts only text/json_object);
    #: the judges then ask for JSON in the prompt and parse the text.
    json_schema: bool = True
    #: USD per million prompt and completion tokens, for cost estimates (`opro plan`) and the usage
    #: ledger; None: the ledger's built-in table, where it knows the model.
    price_prompt: float | None = None
    price_completion: float | None = None
    #: llamacpp only: the most greedy answers of one question decoded together (1: one at a time).
    batch_width: int = 4
    #: llamacpp only: memory (MB) for saved KV prefixes, reused by later prompts that share them (0: off).
    prefix_cache_mb: int = 512
    #: llamacpp only: batched decode steps of 2 or more answers are filled up to a multiple of this many
    #: tokens with tokens drafted from the prompt, kept where greedy decoding agrees (0 or 1: off).
    draft_fill: int = 4
    #: llamacpp only: llama.cpp's extra buffer types (AMX, repacked weights): "auto" probes them in a
    #: child process once per machine and falls back to plain buffers where they crash; "on" / "off".
    extra_buffers: Literal["auto", "on", "off"] = "auto"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend {self.backend!r} is not one of {', '.join(BACKENDS)}.")
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError(f"model must be a non-empty string (backend {self.backend!r}), got {self.model!r}.")
        if self.base_url is not None and self.backend != "openai":
            raise ConfigError(f"base_url is only used by backend 'openai', not {self.backend!r}.")
        check_endpoint(base_url=self.base_url, api_key_env=self.api_key_env)
        if self.n_threads is not None and (not isinstance(self.n_threads, int) or self.n_threads < 1):
            raise ConfigError(
                f"n_threads must be a positive integer or None (the usable cores other processes leave free), "
                f"got {self.n_threads!r}."
            )
        if self.extra_buffers not in ("auto", "on", "off"):
            raise ConfigError(f'extra_buffers must be "auto", "on" or "off", got {self.extra_buffers!r}.')
        if not isinstance(self.n_ctx, int) or self.n_ctx < 256:
            raise ConfigError(f"n_ctx must be an integer >= 256, got {self.n_ctx!r}.")
        if not isinstance(self.batch_width, int) or isinstance(self.batch_width, bool) or self.batch_width < 1:
            raise ConfigError(f"batch_width must be a positive integer (1: no batching), got {self.batch_width!r}.")
        if not isinstance(self.prefix_cache_mb, int) or isinstance(self.prefix_cache_mb, bool) or self.prefix_cache_mb < 0:
            raise ConfigError(f"prefix_cache_mb must be an integer >= 0 (0: off), got {self.prefix_cache_mb!r}.")
        if not isinstance(self.draft_fill, int) or isinstance(self.draft_fill, bool) or self.draft_fill < 0:
            raise ConfigError(f"draft_fill must be an integer >= 0 (0 or 1: off), got {self.draft_fill!r}.")
        for name in ("price_prompt", "price_completion"):
            price = getattr(self, name)
            if price is not None and (isinstance(price, bool) or not isinstance(price, int | float) or price < 0):
                raise ConfigError(f"{name} must be a number >= 0 (USD per million tokens), got {price!r}.")
        if (self.price_prompt is None) != (self.price_completion is None):
            raise ConfigError("give both price_prompt and price_completion (USD per million tokens), or neither.")
        if not isinstance(self.timeout_s, int | float) or self.timeout_s <= 0:
            raise ConfigError(f"timeout_s must be a positive number of seconds, got {self.timeout_s!r}.")
        if self.max_concurrency is not None and (not isinstance(self.max_concurrency, int) or self.max_concurrency < 1):
            raise ConfigError(f"max_concurrency must be a positive integer or None, got {self.max_concurrency!r}.")
        if not isinstance(self.json_schema, bool):
            raise ConfigError(f"json_schema must be true or false, got {self.json_schema!r}.")
        if not self.json_schema and self.backend == "llamacpp":
            raise ConfigError("json_schema = false is only used by backend 'openai' (llama.cpp always supports schemas).")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, where: str = "model") -> ModelSpec:
        """Build from a config table; unknown keys are an error naming ``where``."""
        allowed = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - allowed)
        if unknown:
            import difflib

            close = difflib.get_close_matches(unknown[0], sorted(allowed), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"unknown key(s) {unknown} in [{where}]{hint}; allowed: {sorted(allowed)}.")
        try:
            return cls(**dict(data))
        except ConfigError as exc:
            raise ConfigError(f"[{where}]: {exc}") from exc

    @classmethod
    def embedded(cls, role: str = "task", **overrides: Any) -> ModelSpec:
        """The embedded default of a role (task -> 0.5B, judge / optimizer / generator -> 1.5B)."""
        if role not in DEFAULT_ROLE_MODELS:
            raise ConfigError(f"unknown role {role!r}; roles: {', '.join(DEFAULT_ROLE_MODELS)}.")
        return cls(backend="llamacpp", model=DEFAULT_ROLE_MODELS[role], **overrides)

    def safe_dict(self) -> dict[str, Any]:
        """For logging / run parameters: the key's variable name, never the key; URLs redacted."""
        from opro.redaction import redact

        return {f.name: redact(getattr(self, f.name)) for f in fields(self)}


class ModelPool:
    """Creates backends from specs and shares loaded llama.cpp models between roles.

    ``scripted`` maps names to ready-made backends for ``backend='scripted'`` specs (tests).
    OpenAI settings that specs do not carry (retries) are pool settings.
    """

    def __init__(
        self,
        *,
        scripted: Mapping[str, LLM] | None = None,
        n_batch: int = 512,
        verbose: bool = False,
        max_retries: int = 5,
        max_retry_wait_s: float = 120.0,
    ) -> None:
        self._scripted = dict(scripted or {})
        self.n_batch = n_batch
        self.verbose = verbose
        self.max_retries = max_retries
        self.max_retry_wait_s = max_retry_wait_s
        self._lock = threading.Lock()
        self._shared: dict[tuple[Any, ...], LLM] = {}
        self._cpu: CpuShare | None = None  # this pool's llama.cpp models share it; made with the first one

    def get(self, spec: ModelSpec) -> LLM:
        """The backend for ``spec``; llama.cpp and openai backends are reused for equal settings."""
        if spec.backend == "scripted":
            return self._scripted_backend(spec)
        key = self._key(spec)
        with self._lock:
            llm = self._shared.get(key)
            if llm is None:
                llm = self._create(spec)
                self._shared[key] = llm
            return llm

    def _key(self, spec: ModelSpec) -> tuple[Any, ...]:
        if spec.backend == "llamacpp":
            from opro.llm.packs import EMBEDDED_MODELS

            # Same file -> same model, whether named by pack name or by path.
            ident = EMBEDDED_MODELS[spec.model].target() if spec.model in EMBEDDED_MODELS else spec.model
            path = Path(ident).expanduser().resolve()
            return ("llamacpp", str(path), spec.n_ctx, spec.n_threads, spec.logprobs, spec.batch_width,
                    spec.prefix_cache_mb, spec.draft_fill, spec.extra_buffers)
        return (
            "openai", spec.base_url, spec.model, spec.api_key_env, spec.timeout_s, spec.max_concurrency, spec.json_schema
        )

    def _create(self, spec: ModelSpec) -> LLM:
        if spec.backend == "llamacpp":
            from opro.llm.llamacpp import LlamaCppLLM

            if self._cpu is None:
                self._cpu = CpuShare()
            return LlamaCppLLM(
                model_path=spec.model,
                n_threads=spec.n_threads,
                n_ctx=spec.n_ctx,
                n_batch=self.n_batch,
                verbose=self.verbose,
                logprobs=spec.logprobs,
                batch_width=spec.batch_width,
                prefix_cache_mb=spec.prefix_cache_mb,
                draft_fill=spec.draft_fill,
                extra_buffers=spec.extra_buffers,
                cpu=self._cpu,
            )
        from opro.llm.openai import OpenAILLM

        return OpenAILLM(
            model=spec.model,
            base_url=spec.base_url,
            api_key_env=spec.api_key_env,
            timeout_s=spec.timeout_s,
            max_retries=self.max_retries,
            max_retry_wait_s=self.max_retry_wait_s,
            max_concurrency=spec.max_concurrency or 8,
            json_schema=spec.json_schema,
        )

    def _scripted_backend(self, spec: ModelSpec) -> LLM:
        if spec.model in self._scripted:
            return self._scripted[spec.model]
        if os.path.isfile(spec.model):
            from opro.llm.scripted import ScriptedLLM

            with self._lock:
                key = ("scripted", str(Path(spec.model).resolve()))
                llm = self._shared.get(key)
                if llm is None:
                    llm = ScriptedLLM(recording=spec.model, model=Path(spec.model).stem)
                    self._shared[key] = llm
                return llm
        known = ", ".join(sorted(self._scripted)) or "none registered"
        raise ConfigError(
            f"scripted model {spec.model!r} is neither a registered scripted backend ({known}) nor a recording file."
        )

    def loaded(self) -> list[LLM]:
        with self._lock:
            return list(self._shared.values())

    def close(self) -> None:
        with self._lock:
            llms = list(self._shared.values())
            self._shared.clear()
        for llm in llms:
            llm.close()

    def __enter__(self) -> ModelPool:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def create_llm(spec: ModelSpec, *, pool: ModelPool | None = None) -> LLM:
    """One backend for ``spec``; pass a pool to share loaded models between roles."""
    return (pool if pool is not None else ModelPool()).get(spec)


__all__ = [
    "BACKENDS",
    "DEFAULT_ROLE_MODELS",
    "EMBEDDED_STRONG_MODEL",
    "EMBEDDED_TASK_MODEL",
    "Backend",
    "ModelPool",
    "ModelSpec",
    "create_llm",
]
