"""The contract every LLM backend keeps (opro.llm.client.LLM), one suite run against each of them: the
scripted backend, the OpenAI-compatible backend against the loopback server (tests/fault_server.py),
and the embedded llama.cpp backend (marked ``embedded``: it runs in CI). Only what the protocol
promises is asserted; a backend added to opro joins the ``backend`` fixture's parameters."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from fault_server import FaultServer

from opro.llm import LLM, GenerationOptions, Message
from opro.llm.scripted import ScriptedLLM
from opro.testing.backend_contract import *  # noqa: F403

KEY = "sk-contract-0123456789abcdef"


def _scripted_model(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    """A stand-in model for the scripted backend: 24 words drawn from the question (and from the seed
    when sampling), cut as a model's reply is: before the first stop string, then at ``max_tokens``
    words (the scripted backend counts words as tokens)."""
    prompt = messages[-1].content
    rng = random.Random(prompt if options.temperature == 0 else f"{prompt}|{options.seed}")
    text = " ".join(f"{rng.choice(prompt.split())}{rng.randrange(100)}" for _ in range(24))
    cuts = [text.index(s) for s in options.stop if s in text]
    text = text[: min(cuts)] if cuts else text
    return " ".join(text.split()[: options.max_tokens])


@pytest.fixture(
    params=["scripted", "openai", pytest.param("llamacpp", marks=pytest.mark.embedded)],
)
def llm(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[LLM]:
    if request.param == "scripted":
        yield ScriptedLLM(rules=[(r"\A(?!UNANSWERABLE)", _scripted_model)], model="contract")
    elif request.param == "openai":
        from opro.llm.openai import OpenAILLM

        monkeypatch.setenv("OPRO_CONTRACT_KEY", KEY)
        with FaultServer(key=KEY, distinct=True) as server:
            server.prompt_faults["UNANSWERABLE"] = "500"
            backend = OpenAILLM(model="task-model", base_url=server.base_url, api_key_env="OPRO_CONTRACT_KEY",
                                max_retries=0)
            try:
                yield backend
            finally:
                backend.close()
    else:
        yield request.getfixturevalue("embedded_task_llm")  # shared by the session: not closed here
