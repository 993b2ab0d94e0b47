"""Loading the ``llamacpp`` backend's model: importing llama-cpp-python, refusing settings out of
range before anything loads, and switching llama.cpp's extra buffer types on or off while a
``Llama`` is built (:mod:`opro.llm.probe` decides which)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from opro.errors import ConfigError, ModelPackError


def import_llama() -> Any:
    try:
        import llama_cpp
    except ImportError as exc:
        raise ConfigError(
            "the llamacpp backend needs llama-cpp-python: pip install llama-cpp-python "
            "(or use backend 'openai' with any OpenAI-compatible server)."
        ) from exc
    return llama_cpp


def check_settings(*, n_ctx: int, n_batch: int, batch_width: int, n_threads: int | None, extra_buffers: str,
                    prefix_cache_mb: int, draft_fill: int) -> None:
    """Refuse a :class:`LlamaCppLLM` setting out of range, before the model is resolved or loaded."""
    if n_ctx < 256:
        raise ConfigError(f"n_ctx must be >= 256, got {n_ctx}")
    if n_batch < 1:
        raise ConfigError(f"n_batch must be >= 1, got {n_batch}")
    if batch_width < 1:
        raise ConfigError(f"batch_width must be >= 1, got {batch_width}")
    if n_threads is not None and n_threads < 1:
        raise ConfigError(f"n_threads must be >= 1 or None (the free usable cores), got {n_threads}")
    from opro.llm.probe import EXTRA_BUFFERS

    if extra_buffers not in EXTRA_BUFFERS:
        raise ConfigError(f"extra_buffers must be one of {', '.join(EXTRA_BUFFERS)}, got {extra_buffers!r}")
    if prefix_cache_mb < 0:
        raise ConfigError(f"prefix_cache_mb must be >= 0 (0: off), got {prefix_cache_mb}")
    if draft_fill < 0:
        raise ConfigError(f"draft_fill must be >= 0 (0 or 1: off), got {draft_fill}")


#: llama-cpp-python's ``Llama`` builds its model parameters inside its constructor and ignores keywords it
#: does not know, so ``use_extra_bufts`` is set on the parameters as they reach the model's loader.
LOADER_LOCK = threading.Lock()


@contextlib.contextmanager
def extra_buffers(llama_cpp: Any, mode: str) -> Iterator[None]:
    """While a ``Llama`` is constructed in this block, its model loads with extra buffers ``mode``
    ("on" / "off"; "auto" leaves llama.cpp's default). The parameters keep the value, so
    ``llama.model_params.use_extra_bufts`` reads it back."""
    from opro.llm.probe import supports_extra_buffers_switch

    if mode == "auto" or not supports_extra_buffers_switch():
        if mode == "off":
            raise ModelPackError(
                f"llama-cpp-python {llama_cpp.__version__} has no switch for extra buffer types "
                "(model parameter use_extra_bufts); upgrade it, or set extra_buffers = \"auto\""
            )
        yield
        return
    internals = llama_cpp._internals
    with LOADER_LOCK:
        real = internals.LlamaModel

        def loader(*args: Any, **kwargs: Any) -> Any:
            params = kwargs["params"] if "params" in kwargs else args[1]
            params.use_extra_bufts = mode == "on"
            return real(*args, **kwargs)

        internals.LlamaModel = loader
        try:
            yield
        finally:
            internals.LlamaModel = real


__all__ = ["LOADER_LOCK", "check_settings", "extra_buffers", "import_llama"]
