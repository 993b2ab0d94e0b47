"""A user's own query engine, named by ``[program].factory``, tuned like opro's program: optimized end to end
on the scripted models, its settings searched through the factory's parameters, answered concurrently on
engines of its own, and a factory that cannot give an engine refused before any model call."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pipelines
import pytest
from fakes import experiment_config, scripted_pool, task_reply

from opro.config import config_from_dict
from opro.errors import ConfigError, PromptError
from opro.experiment import Experiment
from opro.llm import ChatClient
from opro.llm.scripted import ScriptedLLM
from opro.program.factory import FactoryProgram
from opro.program.prompts import QATemplate


def _config(tmp_path: Path, factory: str = "pipelines:build_query_engine", out: str = "out", **overrides: dict):
    cfg = experiment_config(tmp_path, experiment={"name": "t", "output_dir": out, "cache_path": "calls.sqlite",
                                                  "progress": False}, program={"factory": factory}, **overrides)
    del cfg["data"]["docs"]  # the user's engine holds the documents
    return config_from_dict(cfg, base_dir=tmp_path, source="t.toml")


def _optimized(tmp_path: Path, **kwargs: object) -> tuple[Experiment, object]:
    exp = Experiment(_config(tmp_path, **kwargs), pool=scripted_pool(), progress=False)  # type: ignore[arg-type]
    try:
        return exp, exp.optimize()
    finally:
        exp.close()


def test_a_named_factory_is_optimized_end_to_end_and_a_warm_rerun_makes_no_call(tmp_path: Path) -> None:
    exp, result = _optimized(tmp_path)
    assert isinstance(exp.program, FactoryProgram)
    # The scripted task model answers from the context only under an instruction that says so: the
    # search found one through the user's engine, and the validation stage confirmed it.
    assert result.initial_score == 2.0 and result.best_score == 5.0 and result.validated  # type: ignore[attr-defined]
    assert exp.usage.total_calls() > 0 and exp.fingerprint()["program"].startswith('{"factory": "pipelines:')
    # Another output folder (a fresh study) over the same call cache: every call is the cache's.
    again = Experiment(_config(tmp_path, out="again"), pool=scripted_pool(), progress=False)
    try:
        second = again.optimize()
    finally:
        again.close()
    assert again.usage.total_calls() == 0
    assert (second.best_instruction, second.best_score) == (result.best_instruction, result.best_score)  # type: ignore[attr-defined]


def test_top_k_is_searched_through_the_factory_parameter(tmp_path: Path) -> None:
    pipelines.CALLS.clear()
    space = {"space": {"top_k": [1, 3]}}
    exp, _ = _optimized(tmp_path, search=space, rag={"chunk_size": 64, "chunk_overlap": 0, "top_k": 2,
                                                          "initial_instructions": ["Answer the question."]})
    # The factory was called with each value the search chose, and its engines retrieved that many chunks.
    assert {c["top_k"] for c in pipelines.CALLS} == {1, 2, 3}
    assert exp.program.takes == ("top_k",)  # type: ignore[union-attr]
    for k in (1, 3):
        answer = exp.program.answer("Who designed AlexNet?", template=QATemplate(settings={"top_k": k}))
        assert len(answer.contexts) == k


def test_response_mode_is_searched_through_the_factory_parameter_and_reaches_its_engine(tmp_path: Path) -> None:
    pipelines.CALLS.clear()
    space = {"space": {"response_mode": ["refine", "simple_summarize"]}}
    exp, _ = _optimized(tmp_path, factory="pipelines:with_response_mode", search=space,
                        rag={"top_k": 2, "initial_instructions": ["Answer the question."]})
    assert exp.program.takes == ("top_k", "response_mode")  # type: ignore[union-attr]
    # The initial configuration's mode (LlamaIndex's default) and each one the search chose reached the factory.
    assert {c["response_mode"] for c in pipelines.CALLS} == {"compact", "refine", "simple_summarize"}
    llm = ScriptedLLM(default=task_reply, model="task")
    program = FactoryProgram(factory=pipelines.with_response_mode, llm=ChatClient(llm, role="task"),
                             initial={"top_k": 2, "response_mode": "compact"})
    made = {}
    for mode in ("compact", "refine", "simple_summarize"):
        before = len(llm.calls)
        answer = program.answer("Who designed AlexNet?", template=QATemplate().with_settings(response_mode=mode))
        made[mode] = len(llm.calls) - before
        assert len(answer.contexts) == 2
    # compact packs both chunks in one call, refine asks once per chunk, simple_summarize once.
    assert made == {"compact": 1, "refine": 2, "simple_summarize": 1}


def test_response_mode_is_refused_for_opros_own_program(tmp_path: Path) -> None:
    cfg = experiment_config(tmp_path, search={"space": {"response_mode": ["refine"]}})
    with pytest.raises(ConfigError, match=r"\[search.space\].response_mode = 'refine' is a setting of a LlamaIndex "
                       r"query engine's response synthesizer, which opro's own program does not have"):
        config_from_dict(cfg, base_dir=tmp_path, source="t.toml")
    own = Experiment(config_from_dict(experiment_config(tmp_path), base_dir=tmp_path, source="t.toml"),
                     pool=scripted_pool(), progress=False)
    with pytest.raises(PromptError, match="sets response_mode = 'refine', which opro's own program does not take"):
        own.program.answer("Who designed AlexNet?", template=QATemplate().with_settings(response_mode="refine"))


def test_a_dimension_the_factory_does_not_take_is_refused_before_any_call(tmp_path: Path) -> None:
    cfg = _config(tmp_path, search={"space": {"answer_max_tokens": [32, 64]}})
    exp = Experiment(cfg, pool=scripted_pool(), progress=False)
    with pytest.raises(ConfigError, match=r"\[search.space\].answer_max_tokens is open, but \[program\].factory = "
                       r"'pipelines:build_query_engine' takes no answer_max_tokens parameter.*it takes: top_k"):
        exp.optimize()
    assert exp.usage.total_calls() == 0


@pytest.mark.parametrize(("factory", "said"), [
    ("pipelines:raising", r"'pipelines:raising' raised RuntimeError when called with the LLM, top_k|the vector "
                          r"database is down"),
    ("pipelines:not_an_engine", r"'pipelines:not_an_engine' returned VectorStoreIndex, not a LlamaIndex query engine"),
    ("pipelines:nowhere", r"'pipelines:nowhere': 'pipelines' has no 'nowhere'"),
    ("no_such_pipelines:build", r"no module 'no_such_pipelines'"),
])
def test_a_factory_that_cannot_give_an_engine_fails_before_any_call(tmp_path: Path, factory: str, said: str) -> None:
    exp = Experiment(_config(tmp_path, factory=factory), pool=scripted_pool(), progress=False)
    with pytest.raises(ConfigError, match=r"\[program\].factory") as raised:
        exp.optimize()
    assert re.search(said, str(raised.value)), str(raised.value)
    assert exp.usage.total_calls() == 0 and not (tmp_path / "out" / "summary.json").exists()


def test_an_engine_that_does_not_call_the_llm_it_was_given_is_refused(tmp_path: Path) -> None:
    exp = Experiment(_config(tmp_path, factory="pipelines:own_llm"), pool=scripted_pool(), progress=False)
    with pytest.raises(ConfigError, match="answered without calling the LLM it was given"):
        exp.program.answer("Who designed AlexNet?")


def test_a_factory_module_beside_the_config_is_imported_from_there(tmp_path: Path) -> None:
    (tmp_path / "beside_the_config_rag.py").write_text(
        "from pipelines import build_query_engine as build\n")
    exp = Experiment(_config(tmp_path, factory="beside_the_config_rag:build"), pool=scripted_pool(), progress=False)
    answer = exp.program.answer("Who designed AlexNet?", template=QATemplate(instruction="Answer plainly."))
    assert answer.text == "Yes." and answer.contexts


def test_a_setting_the_factory_does_not_take_is_refused_by_the_program(tmp_path: Path) -> None:
    exp = Experiment(_config(tmp_path), pool=scripted_pool(), progress=False)
    with pytest.raises(PromptError, match="takes no answer_max_tokens parameter"):
        exp.program.answer("q", template=QATemplate(settings={"answer_max_tokens": 8}))


def test_answers_are_made_concurrently_on_engines_of_their_own() -> None:
    peak, running, lock = [0], [0], threading.Lock()

    def slow(messages, options):  # type: ignore[no-untyped-def]
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return task_reply(messages, options)

    llm = ScriptedLLM(default=slow, model="task")
    llm.max_concurrency = 4
    program = FactoryProgram(factory=pipelines.build_query_engine, llm=ChatClient(llm, role="task"),
                             initial={"top_k": 2})
    under = QATemplate(instruction="Answer from the context.")
    answers = program.answer_many([f"Question {i} about AlexNet?" for i in range(12)], template=under, progress=False)
    assert peak[0] == 4 and program.engines() <= 4  # one engine per answer in flight, never shared
    assert [a.text for a in answers] == ["Using the context: yes."] * 12
    assert [a.query for a in answers] == [f"Question {i} about AlexNet?" for i in range(12)]
    plainly = program.answer("Question 0 about AlexNet?", template=QATemplate(instruction="Answer plainly."))
    assert plainly.text == "Yes." and program.engines() <= 4  # another template on a reused engine


def test_a_question_asked_again_is_not_tokenized_again_and_answers_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    import llama_index.core
    from llama_index.core.utils import get_tokenizer

    counted: list[str] = []
    tokenizer = get_tokenizer()
    monkeypatch.setattr(llama_index.core, "global_tokenizer", lambda text: counted.append(text) or tokenizer(text))
    llm = ScriptedLLM(default=task_reply, model="task")
    program = FactoryProgram(factory=pipelines.build_query_engine, llm=ChatClient(llm, role="task"),
                             initial={"top_k": 2})
    under = QATemplate(instruction="Answer from the context.")
    first = program.answer("Who designed AlexNet?", template=under)
    assert counted and len(counted) == len(set(counted))  # LlamaIndex's counts, each text tokenized once
    del counted[:]
    again = program.answer("Who designed AlexNet?", template=under)
    # The compact synthesizer counted the same context and prompt again, from the program's memory.
    assert counted == [] and (again.text, again.contexts) == (first.text, first.contexts)
    assert len(llm.calls) == 2 and llm.calls[0][0] == llm.calls[1][0]  # the same prompt sent


def test_a_factory_given_in_python_is_named_in_the_fingerprint_with_what_it_reports(tmp_path: Path) -> None:
    cfg = config_from_dict(experiment_config(tmp_path), base_dir=tmp_path, source="t.toml")  # no [program]
    exp = Experiment(cfg, pool=scripted_pool(), progress=False, program=pipelines.described)
    said = json.loads(exp.fingerprint()["program"])
    assert said["factory"] == "pipelines:described" and said["takes"] == ["top_k"]
    assert said["reports"] == {"embedding": "hash", "index": "memory"}
    assert "program" not in Experiment(cfg, pool=scripted_pool(), progress=False).fingerprint()  # opro's own


def test_an_engine_that_retrieves_nothing_answers_without_a_call_and_is_not_refused() -> None:
    from llama_index.core.base.base_retriever import BaseRetriever
    from llama_index.core.query_engine import RetrieverQueryEngine

    class Nothing(BaseRetriever):
        def _retrieve(self, query_bundle):  # type: ignore[no-untyped-def]
            return []

    llm = ScriptedLLM(default=task_reply, model="task")
    program = FactoryProgram(factory=lambda llm: RetrieverQueryEngine.from_args(retriever=Nothing(), llm=llm),
                             llm=ChatClient(llm, role="task"), initial={})
    answer = program.answer("Who designed AlexNet?")
    assert answer.text == "Empty Response" and answer.contexts == () and not llm.calls


def test_the_plan_says_which_settings_the_factory_opens_and_which_stay_closed(tmp_path: Path) -> None:
    from opro.probe.plan import make_plan

    warnings = make_plan(_config(tmp_path)).warnings
    said = [w for w in warnings if w.startswith("[program].factory")]
    assert said == ["[program].factory = 'pipelines:build_query_engine' takes top_k as parameters; answer_max_tokens, "
                    "chunk_size, retriever, task_model, response_mode stay closed (the factory does not take them)"]
