"""Batched greedy decoding for the ``llamacpp`` backend, token by token: one sequence's state
(:class:`Seq`), filling a ``llama_batch``, the stop rules of ``create_chat_completion`` applied to
each new token, and the drafted tokens of prompt lookup decoding (:mod:`opro.llm.llamacpp` runs the
batches; the why of each is in its docstring).

Drafted tokens (``draft_fill``): on a CPU, llama.cpp multiplies the weights by 4 token columns at a
time and by fewer one column at a time, so a decode step of 3 tokens costs about what one of 4 costs
(80 and 76 ms for the 0.5B model on 2 cores, ``experiments/bench_drafts.py``) and one of 2 twice one
of 1. Steps with 2 or 3 live answers are filled to 4 tokens (generally: to a multiple of
``draft_fill``) with guesses from each answer's own prompt and text (prompt lookup decoding); greedy
verification keeps a guess only where it is the arg-max, so the stop rules are applied token by
token and the text is greedy decoding's (up to a batch's floating-point sums, as above).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llama_cpp import Llama


@dataclass
class Seq:
    """One sequence of a batched generation: its prompt, the tokens so far and how it ended."""

    index: int
    prompt: list[int]
    max_tokens: int
    stops: list[bytes]
    tokens: list[int] = field(default_factory=list)
    text: bytes = b""
    finish: str | None = None
    multibyte_fix: int = 0


def decode(llama: Llama, batch: Any) -> None:
    import llama_cpp

    if llama_cpp.llama_decode(llama._ctx.ctx, batch) != 0:
        raise RuntimeError("llama_decode failed (the KV cache may be full: lower batch_width or raise n_ctx)")

def draft_tokens(live: list[Seq], *, fill: int, n_batch: int) -> list[list[int]]:
    """Tokens to try after each live sequence's last one this step (prompt lookup decoding).

    On a CPU llama.cpp multiplies the weights by 4 token columns at a time (and by fewer one column
    at a time), so a step of 3 tokens costs about what one of 4 costs, and one of 2 twice one of 1.
    Such steps are filled up to a multiple of ``fill`` tokens with guesses: what followed the
    latest earlier occurrence of the sequence's last 3 (else 2, else 1) tokens in its prompt and
    answer. A guess costs nearly nothing and is kept only where greedy decoding would have chosen
    it. A sequence decoding alone is not filled: one token is the cheapest step there is.
    """
    drafts: list[list[int]] = [[] for _ in live]
    if fill < 2 or len(live) < 2:
        return drafts
    # At most what one llama_decode takes (n_batch tokens).
    need = max(0, min(-len(live) % fill, n_batch - len(live)))
    guesses = [lookup(seq.prompt + seq.tokens, need) for seq in live]
    while need:
        grown = False
        for guess, draft in zip(guesses, drafts, strict=True):
            if need and len(draft) < len(guess):
                draft.append(guess[len(draft)])
                need -= 1
                grown = True
        if not grown:
            break
    return drafts

def take_token(llama: Llama, vocab: Any, seq: Seq, token: int) -> bool:
    """Take ``token`` as create_completion does; False once the sequence is finished."""
    import llama_cpp

    if llama_cpp.llama_vocab_is_eog(vocab, token):
        seq.text = llama.detokenize(seq.tokens, prev_tokens=seq.prompt)
        seq.finish = "stop"
        return False
    seq.tokens.append(token)
    all_text = llama.detokenize(seq.tokens, prev_tokens=seq.prompt)
    # An incomplete UTF-8 character is neither a stop nor the end (create_completion's rule).
    for k, char in enumerate(all_text[-3:]):
        k = 3 - k
        for num, pattern in ((2, 192), (3, 224), (4, 240)):
            if num > k and pattern & char == pattern:
                seq.multibyte_fix = num - k
    if seq.multibyte_fix > 0:
        seq.multibyte_fix -= 1
        return True
    hits = [s for s in seq.stops if s in all_text]
    if hits:
        seq.text = all_text[: all_text.index(hits[0])]
        seq.finish = "stop"
        return False
    if len(seq.tokens) >= seq.max_tokens:
        seq.text = all_text
        seq.finish = "length"
        return False
    return True

def groups(seqs: list[Seq], *, width: int, n_ctx: int, fill: int) -> list[list[Seq]]:
    """At most ``width`` sequences whose prompts and replies fit the KV cache together."""
    groups: list[list[Seq]] = []
    current: list[Seq] = []
    for seq in seqs:
        trial = [*current, seq]
        prefix = common_prefix([s.prompt for s in trial])
        # A sequence's drafted tokens take cells past its answer for one step.
        need = prefix + sum(len(s.prompt) - prefix + s.max_tokens + fill for s in trial)
        if current and (len(trial) > width or need > n_ctx):
            groups.append(current)
            trial = [seq]
        current = trial
    if current:
        groups.append(current)
    return groups


def fill_batch(batch: Any, pending: list[tuple[int, list[int], int]], capacity: int) -> list[tuple[int, int]]:
    """Put the pending (sequence, tokens, first position) runs into ``batch``, up to ``capacity``
    tokens; what does not fit stays in ``pending`` for the next decode. Returns (sequence, batch
    row) of each run that ended in this batch: its last token's logits are computed."""
    n = 0
    rows: list[tuple[int, int]] = []
    rest: list[tuple[int, list[int], int]] = []
    for j, tokens, pos in pending:
        take = tokens[: capacity - n]
        for k, token in enumerate(take):
            put_token(batch, n, token=token, pos=pos + k, seq_id=j + 1, logits=False)
            n += 1
        if len(take) < len(tokens):
            rest.append((j, tokens[len(take) :], pos + len(take)))
        else:
            batch.logits[n - 1] = True
            rows.append((j, n - 1))
    batch.n_tokens = n
    pending[:] = rest
    return rows


def put_token(batch: Any, row: int, *, token: int, pos: int, seq_id: int, logits: bool) -> None:
    """Row ``row`` of a llama_batch: ``token`` at ``pos`` of one sequence, logits computed or not."""
    batch.token[row] = token
    batch.pos[row] = pos
    batch.n_seq_id[row] = 1
    batch.seq_id[row][0] = seq_id
    batch.logits[row] = logits


def lookup(tokens: Sequence[int], size: int) -> list[int]:
    """Up to ``size`` tokens that followed the latest earlier occurrence of the last 3 (else 2, else 1)
    of ``tokens``: an answer that quotes its context continues as the context did."""
    for n in (3, 2, 1):
        if len(tokens) <= n:
            continue
        tail = list(tokens[-n:])
        for i in range(len(tokens) - n - 1, -1, -1):
            if tokens[i] == tail[0] and list(tokens[i : i + n]) == tail:
                return list(tokens[i + n : i + n + size])
    return []


def common_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the longest token prefix all ``prompts`` share."""
    if not prompts:
        return 0
    first = prompts[0]
    n = min(len(p) for p in prompts)
    for i in range(n):
        token = first[i]
        if any(p[i] != token for p in prompts[1:]):
            return i
    return n


__all__ = ["Seq", "common_prefix", "decode", "draft_tokens", "fill_batch", "groups", "lookup", "put_token", "take_token"]
