"""Where opro keeps per-user files: what may be deleted to free space (the cache: assembled models, the
LLM call cache, built indexes) apart from what must outlive it (the data folder: the decision ledger)."""

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


def data_dir() -> Path:
    """``$OPRO_DATA_DIR``, else the platform's user data folder (``$XDG_DATA_HOME/opro``, by default
    ``~/.local/share/opro`` on Linux; ``~/Library/Application Support/opro`` on macOS). Users clear
    caches to free space; the decisions kept here are never a cache (deleting them would let the same
    questions decide again)."""
    explicit = os.environ.get("OPRO_DATA_DIR")
    if explicit:
        return Path(explicit).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("opro", appauthor=False))


def default_call_cache_path() -> Path:
    return cache_dir() / "llm_calls.sqlite"
