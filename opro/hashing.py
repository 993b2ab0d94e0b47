"""The project's short content hash: what keys decisions, designs, fingerprints and question sets."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def sha(text: str) -> str:
    """The 16-hex-digit sha256 of ``text``: the digest that keys decisions, designs and question sets."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def short_hashes(hashes: Sequence[str]) -> tuple[str, ...]:
    """Question hashes cut to 16 hex digits (64 bits: no collision among any dataset's questions)."""
    return tuple(h[:16] for h in hashes)


__all__ = ["sha", "short_hashes"]
