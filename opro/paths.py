"""Where opro keeps per-user files (assembled models, the LLM call cache, built indexes)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$OPRO_CACHE_DIR``, else ``$XDG_CACHE_HOME/opro``, else ``~/.cache/opro``."""
    explicit = os.environ.get("OPRO_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "opro"


def default_call_cache_path() -> Path:
    return cache_dir() / "llm_calls.sqlite"
