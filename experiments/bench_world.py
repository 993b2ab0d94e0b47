"""The scripted world the selection benchmarks share (:mod:`bench_selection`, :mod:`bench_cost_space`): the
initial instruction, a program that echoes its prompt to a scripted model, a judge that reads its score from
the reply, and the seeded draws that script them (a question is :class:`opro.testing.worlds.Ex`)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opro.llm import ChatClient

INITIAL = "Answer the question."


@dataclass(frozen=True)
class Verdict:
    score: float | None
    invalid: bool


def _normal(*parts: object) -> float:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    u1 = (int.from_bytes(digest[:8], "big") + 1) / (2**64 + 2)
    u2 = int.from_bytes(digest[8:16], "big") / 2**64
    return math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)


def _uniform(*parts: object) -> float:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass(frozen=True)
class Echoed:
    """An answer with the call that made it (its tokens: what an answer costs)."""

    text: str
    completion: Any


class EchoProgram:
    def __init__(self, client: ChatClient) -> None:
        self.client = client

    def answer(self, query: str, *, template: Any) -> Any:
        completion = self.client.complete(f"{template}\nQuery: {query}")
        return Echoed(completion.text, completion)


class ReplyJudge:
    def __init__(self, client: ChatClient) -> None:
        self.client = client

    def measure(self, *, query: str, answer: str, reference: str | None, contexts: Sequence[str] = ()) -> Verdict:
        reply = self.client.complete(f"Grade.\nQuestion: {query}\nAnswer: {answer}\nReference: {reference}").text
        return Verdict(float(reply), False)
