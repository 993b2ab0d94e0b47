"""A scripted backend for fast unit tests: answers by rule, in order, or from a recorded file.

Like DSPy's ``DummyLM``: it ships in the package so users can test their own pipelines too.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from opro.errors import LLMBadRequestError
from opro.llm.client import LLM, Completion, GenerationOptions, Message, cache_key

Responder = Callable[[tuple[Message, ...], GenerationOptions], str]
#: For :meth:`ScriptedLLM.choice_logprobs`: messages and assistant prefix -> ``{choice: probability}``.
ChoiceResponder = Callable[[tuple[Message, ...], str], Mapping[str, float]]


class ScriptedLLM(LLM):
    """Answers calls without a model.

    - ``rules``: ``(pattern, reply)`` pairs; the first regex found in the last user message (or
      a callable taking messages and options) gives the reply.
    - ``replies``: replies returned in order, then ``default``.
    - ``recording``: a JSONL file of ``{"key": ..., "text": ...}`` keyed like the call cache.
    - ``choices``: a callable giving next-token probabilities for :meth:`choice_logprobs` (logit
      judges); without it the backend cannot score choices, like a remote chat API.
    """

    provider = "scripted"
    max_concurrency = 4
    supports_json_schema = True
    supports_logprobs = False

    def __init__(
        self,
        *,
        rules: Iterable[tuple[str, str | Responder]] = (),
        replies: Iterable[str] = (),
        default: str | Responder | None = None,
        recording: str | Path | None = None,
        model: str = "scripted",
        choices: ChoiceResponder | None = None,
    ) -> None:
        self._choices = choices
        self.supports_choice_logprobs = choices is not None
        self._rules = [(re.compile(p, re.S), r) for p, r in rules]
        self._replies = list(replies)
        self._default = default
        self._model = model
        self._recorded: dict[str, str] = {}
        if recording is not None:
            for line in Path(recording).read_text(encoding="utf-8").splitlines():
                if line.strip():
                    item = json.loads(line)
                    self._recorded[item["key"]] = item["text"]
        self._lock = threading.Lock()
        self.calls: list[tuple[tuple[Message, ...], GenerationOptions]] = []

    @property
    def model(self) -> str:
        return self._model

    def _reply(self, messages: tuple[Message, ...], options: GenerationOptions) -> str:
        if self._recorded:
            key = cache_key(self.identity, messages, options, 0)
            if key in self._recorded:
                return self._recorded[key]
        last_user = next((m.content for m in reversed(messages) if m.role == "user"), "")
        for pattern, reply in self._rules:
            if pattern.search(last_user):
                return reply(messages, options) if callable(reply) else reply
        with self._lock:
            if self._replies:
                return self._replies.pop(0)
        if self._default is None:
            raise LLMBadRequestError(
                f"ScriptedLLM has no reply for: {last_user[:120]!r}", model=self._model, provider=self.provider
            )
        return self._default(messages, options) if callable(self._default) else self._default

    def generate(self, messages: tuple[Message, ...], options: GenerationOptions) -> Completion:
        with self._lock:
            self.calls.append((messages, options))
        text = self._reply(messages, options)
        prompt_tokens = sum(len(m.content.split()) for m in messages)
        return Completion(
            text=text,
            model=self._model,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(text.split()),
            latency_s=1e-6,
            finish_reason="stop",
        )

    def choice_logprobs(self, messages: tuple[Message, ...], *, prefix: str, choices: tuple[str, ...]) -> Completion:
        if self._choices is None:
            return super().choice_logprobs(messages, prefix=prefix, choices=choices)
        with self._lock:
            self.calls.append((messages, GenerationOptions(max_tokens=0)))
        probs = self._choices(messages, prefix)
        logprobs = {c: math.log(p) if (p := float(probs.get(c, 0.0))) > 0 else -1e9 for c in choices}
        return Completion(
            text=max(logprobs, key=lambda c: logprobs[c]),
            model=self._model,
            prompt_tokens=sum(len(m.content.split()) for m in messages),
            latency_s=1e-6,
            top_logprobs=(logprobs,),
            finish_reason="choices",
        )

    @staticmethod
    def record(path: str | Path, entries: Mapping[str, str]) -> None:
        """Write a recording file from ``{cache_key: text}``."""
        with Path(path).open("w", encoding="utf-8") as fh:
            for key, text in entries.items():
                fh.write(json.dumps({"key": key, "text": text}) + "\n")
