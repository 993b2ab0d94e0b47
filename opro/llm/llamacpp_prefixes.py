"""Saved KV prefixes of the ``llamacpp`` backend (``prefix_cache_mb``): the KV states of prompt
prefixes several prompts share, kept in memory one per prompt family, least recently used out
first (:mod:`opro.llm.llamacpp` saves and restores them).

Saved prefixes (``prefix_cache_mb``): the KV state of a prefix that several prompts share (the
common prefix of a batch; where a judge prompt leaves the previous one) is copied out
(``llama_state_seq_get_data``) and kept in memory, one per prompt family, least recently used out
first. A later prompt that shares more with a saved state than with what the context holds starts
from it (``llama_state_seq_set_data``, cut to the shared length): a question's retrieved context
(instruction after it), or the judge's template with the question and reference, is prefilled once
per run instead of once per step.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class SavedPrefixes:
    """KV states of sequence 0 by the tokens they hold, within ``capacity`` bytes, least recently
    used out first. One state per prompt family: saving tokens that agree with a saved state up to
    (nearly) the end of the shorter of the two replaces it (the same question a step later)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._states: OrderedDict[tuple[int, ...], bytearray] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.restored_tokens = 0  # prefill avoided by restoring, in tokens

    def best(self, tokens: Sequence[int]) -> tuple[tuple[int, ...], bytearray, int] | None:
        """The saved state sharing the longest prefix with ``tokens``: (its tokens, state, shared)."""
        from llama_cpp import Llama

        found: tuple[tuple[int, ...], bytearray, int] | None = None
        for key, state in self._states.items():
            n = Llama.longest_token_prefix(key, tokens)
            if n and (found is None or n > found[2]):
                found = (key, state, n)
        if found is not None:
            self._states.move_to_end(found[0])
        return found

    def put(self, tokens: Sequence[int], state: bytearray) -> None:
        from llama_cpp import Llama

        key = tuple(tokens)
        for old in [k for k in self._states if Llama.longest_token_prefix(k, key) >= min(len(k), len(key)) - 16]:
            self._bytes -= len(self._states.pop(old))
        if len(state) > self.capacity:
            return
        self._states[key] = state
        self._bytes += len(state)
        while self._bytes > self.capacity:
            _, dropped = self._states.popitem(last=False)
            self._bytes -= len(dropped)


__all__ = ["SavedPrefixes"]
