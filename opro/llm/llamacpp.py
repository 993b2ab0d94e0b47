"""Backend ``llamacpp``: a GGUF model run in-process by ``llama-cpp-python``.

- The chat template comes from the GGUF (``create_chat_completion``).
- JSON-schema constrained output through a llama.cpp grammar (``response_format`` with a schema).
- One lock per loaded model: llama.cpp contexts are not thread-safe, so calls run one at a time
  (``max_concurrency = 1``); any number of threads may call :meth:`generate`.
- KV-prefix reuse is left on: llama-cpp-python keeps the evaluated tokens between calls and only
  evaluates the part of the next prompt that differs, so we never call ``reset()``. Prompts that
  share a long prefix (one instruction, many questions) get cheaper.
- :meth:`LlamaCppLLM.choice_logprobs` renders the chat with the GGUF's template, appends an
  assistant prefix and reads the next-token logits at the last position only (no ``logits_all``,
  nothing decoded): a judge's score distribution for the price of a prefill, with the same
  KV-prefix reuse as generation.
- The model loads lazily on the first call, so a run whose calls all hit the cache never loads it.
- ``identity`` is ``llamacpp:<sha256 of the GGUF>``, taken from the pack's known checksum or a
  hash cached by path, size and mtime (:func:`opro.llm.packs.gguf_sha256`).
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opro.errors import ConfigError, LLMBadRequestError, LLMError, ModelPackError
from opro.llm import LLM, Completion, GenerationOptions, Message
from opro.llm.packs import EMBEDDED_MODELS, gguf_sha256
from opro.llm.packs import model_path as resolve_model_path

if TYPE_CHECKING:
    from llama_cpp import Llama

_OVERFLOW = re.compile(r"Requested tokens \((\d+)\) exceed context window of (\d+)")


def _import_llama() -> Any:
    try:
        import llama_cpp
    except ImportError as exc:
        raise ConfigError(
            "the llamacpp backend needs llama-cpp-python: pip install llama-cpp-python "
            "(or use backend 'openai' with any OpenAI-compatible server)."
        ) from exc
    return llama_cpp


class LlamaCppLLM(LLM):
    """Chat completions from a local GGUF model."""

    provider = "llamacpp"
    max_concurrency = 1
    supports_json_schema = True
    supports_choice_logprobs = True

    def __init__(
        self,
        *,
        model_path: str | os.PathLike[str],
        n_threads: int | None = None,
        n_ctx: int = 4096,
        n_batch: int = 512,
        verbose: bool = False,
        logprobs: bool = False,
        kv_reuse: bool = True,
    ) -> None:
        """``model_path``: an embedded model name (assembled on demand) or a path to a GGUF file.

        ``logprobs=True`` makes llama.cpp keep the logits of every position (``logits_all``):
        needed for ``top_logprobs``, but it costs ``n_ctx * vocab * 4`` bytes of memory (about
        2.5 GB for Qwen2.5 at n_ctx 4096, committed only for evaluated positions) and some
        prefill speed, so it is off by default.

        ``kv_reuse=False`` evaluates every prompt from scratch. With reuse on (the default, much
        faster for prompts sharing a prefix) the logits can differ in the last bits from a cold
        evaluation, so a *sampled* (temperature > 0) reply may depend on the previous call; the
        call cache, not the seed, is what makes reruns reproduce. Greedy replies are stable in
        practice.
        """
        if n_ctx < 256:
            raise ConfigError(f"n_ctx must be >= 256, got {n_ctx}")
        if n_batch < 1:
            raise ConfigError(f"n_batch must be >= 1, got {n_batch}")
        if n_threads is not None and n_threads < 1:
            raise ConfigError(f"n_threads must be >= 1 or None (all cores), got {n_threads}")
        name = os.fspath(model_path)
        self.path: Path = resolve_model_path(name)
        self._model = name if name in EMBEDDED_MODELS else self.path.stem
        pack = EMBEDDED_MODELS.get(name)
        self.sha256 = pack.sha256 if pack is not None else gguf_sha256(self.path)
        self.n_threads = n_threads or os.cpu_count() or 1
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.verbose = verbose
        self.supports_logprobs = logprobs
        self.kv_reuse = kv_reuse
        self._lock = threading.Lock()
        self._llama: Llama | None = None
        self._formatter: Any = None
        self.load_s: float | None = None

    # -- identity ------------------------------------------------------------------------------

    @property
    def model(self) -> str:
        return self._model

    @property
    def identity(self) -> str:
        return f"llamacpp:{self.sha256}"

    def describe(self) -> dict[str, str]:
        return {
            "provider": self.provider,
            "model": self._model,
            "path": str(self.path),
            "sha256": self.sha256,
            "n_ctx": str(self.n_ctx),
            "n_threads": str(self.n_threads),
        }

    def __repr__(self) -> str:
        return f"LlamaCppLLM(model={self._model!r}, n_ctx={self.n_ctx}, n_threads={self.n_threads})"

    # -- loading -------------------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        return self._llama is not None

    def load(self) -> Llama:
        """Load the model now (otherwise the first call does)."""
        with self._lock:
            return self._load_locked()

    def _load_locked(self) -> Llama:
        if self._llama is None:
            llama_cpp = _import_llama()
            started = time.perf_counter()
            try:
                self._llama = llama_cpp.Llama(
                    model_path=str(self.path),
                    n_ctx=self.n_ctx,
                    n_batch=self.n_batch,
                    n_threads=self.n_threads,
                    n_threads_batch=self.n_threads,
                    logits_all=self.supports_logprobs,
                    verbose=self.verbose,
                )
            except (ValueError, RuntimeError, OSError) as exc:
                raise ModelPackError(f"llama.cpp cannot load {self.path}: {exc}") from exc
            self.load_s = time.perf_counter() - started
        return self._llama

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` in this model's vocabulary (loads the model)."""
        with self._lock:
            llama = self._load_locked()
            return len(llama.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    # -- calls ---------------------------------------------------------------------------------

    def _kwargs(self, messages: tuple[Message, ...], options: GenerationOptions) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "temperature": options.temperature,
            "max_tokens": options.max_tokens,
            "stop": list(options.stop) or None,
        }
        if options.seed is not None:
            kwargs["seed"] = options.seed
        schema = options.schema()
        if schema is not None:
            kwargs["response_format"] = {"type": "json_object", "schema": schema}
        if options.top_logprobs and self.supports_logprobs:
            kwargs["logprobs"] = True
            kwargs["top_logprobs"] = options.top_logprobs
        return kwargs

    def _error(self, exc: BaseException) -> LLMError:
        where: dict[str, Any] = {"model": self._model, "provider": self.provider}
        text = str(exc)
        m = _OVERFLOW.search(text)
        if m:
            return LLMBadRequestError(
                f"the prompt has {m.group(1)} tokens but the context window (n_ctx) is {m.group(2)}; "
                "shorten the prompt (fewer or smaller retrieved chunks) or raise n_ctx",
                **where,
            )
        if isinstance(exc, ValueError | TypeError | KeyError):
            return LLMBadRequestError(f"llama.cpp rejected the request: {type(exc).__name__}: {text}", **where)
        return LLMError(f"llama.cpp failed: {type(exc).__name__}: {text}", **where)

    def generate(self, messages: tuple[Message, ...], options: GenerationOptions) -> Completion:
        kwargs = self._kwargs(messages, options)
        with self._lock:
            llama = self._load_locked()
            if not self.kv_reuse:
                llama.reset()
            started = time.perf_counter()
            try:
                response: Any = llama.create_chat_completion(**kwargs)
            except Exception as exc:
                raise self._error(exc) from exc
            latency = time.perf_counter() - started
        choice = response["choices"][0]
        usage = response.get("usage") or {}
        top: tuple[dict[str, float], ...] | None = None
        content = (choice.get("logprobs") or {}).get("content") if options.top_logprobs else None
        if content:
            top = tuple(
                {alt["token"]: float(alt["logprob"]) for alt in (tok.get("top_logprobs") or [])} for tok in content
            )
        return Completion(
            text=choice["message"].get("content") or "",
            model=self._model,
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            latency_s=latency,
            top_logprobs=top,
            finish_reason=choice.get("finish_reason"),
        )

    def _render(self, llama: Llama, messages: tuple[Message, ...]) -> str:
        """The prompt text ``create_chat_completion`` would build: the GGUF's own chat template."""
        if self._formatter is None:
            template = llama.metadata.get("tokenizer.chat_template")
            if not template:
                raise LLMBadRequestError(
                    f"{self.path.name} carries no chat template (tokenizer.chat_template), so its prompt cannot "
                    "be rendered for logit scoring; use a judge that generates its score",
                    model=self._model,
                    provider=self.provider,
                )
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            def text(token: int) -> str:
                return llama._model.token_get_text(token) if token != -1 else ""

            self._formatter = Jinja2ChatFormatter(
                template=template, eos_token=text(llama.token_eos()), bos_token=text(llama.token_bos())
            )
        prompt: str = self._formatter(messages=[{"role": m.role, "content": m.content} for m in messages]).prompt
        return prompt

    def _choice_tokens(self, llama: Llama, choices: tuple[str, ...]) -> list[int]:
        ids: list[int] = []
        for choice in choices:
            tokens = llama.tokenize(choice.encode("utf-8"), add_bos=False, special=False)
            if len(tokens) != 1:
                raise LLMBadRequestError(
                    f"choice {choice!r} is {len(tokens)} tokens in {self._model}'s vocabulary; logit scoring "
                    "needs single-token choices (such as the digits 1..5)",
                    model=self._model,
                    provider=self.provider,
                )
            ids.append(tokens[0])
        return ids

    def choice_logprobs(self, messages: tuple[Message, ...], *, prefix: str, choices: tuple[str, ...]) -> Completion:
        import numpy as np

        if not choices:
            raise LLMBadRequestError("choice_logprobs needs at least one choice", model=self._model, provider=self.provider)
        with self._lock:
            llama = self._load_locked()
            started = time.perf_counter()
            try:
                # Tokenized as the chat handler does (the template adds its special tokens itself).
                tokens = llama.tokenize(
                    (self._render(llama, messages) + prefix).encode("utf-8"), add_bos=False, special=True
                )
                if len(tokens) > self.n_ctx:
                    raise ValueError(f"Requested tokens ({len(tokens)}) exceed context window of {self.n_ctx}")
                ids = self._choice_tokens(llama, choices)
                # KV-prefix reuse as in Llama.generate: keep the evaluated tokens this prompt shares
                # (at least one token is evaluated so the last position's logits are fresh).
                keep = 0
                if self.kv_reuse:
                    keep = min(llama.longest_token_prefix(llama._input_ids.tolist(), tokens), len(tokens) - 1)
                llama.n_tokens = keep
                llama.eval(tokens[keep:])
                # Without logits_all llama.cpp keeps the logits of the batch's last position only.
                logits = np.ctypeslib.as_array(llama._ctx.get_logits_ith(-1), shape=(llama.n_vocab(),))
                logits = logits.astype(np.float64)
                top = float(logits.max())
                log_norm = top + float(np.log(np.exp(logits - top).sum()))
            except LLMError:
                raise
            except Exception as exc:
                raise self._error(exc) from exc
            latency = time.perf_counter() - started
        logprobs = {choice: float(logits[i]) - log_norm for choice, i in zip(choices, ids, strict=True)}
        return Completion(
            text=max(logprobs, key=lambda c: logprobs[c]),
            model=self._model,
            prompt_tokens=len(tokens),
            completion_tokens=0,
            latency_s=latency,
            top_logprobs=(logprobs,),
            finish_reason="choices",
        )

    def close(self) -> None:
        with self._lock:
            if self._llama is not None:
                self._llama.close()
                self._llama = None
                self._formatter = None


__all__ = ["LlamaCppLLM"]
