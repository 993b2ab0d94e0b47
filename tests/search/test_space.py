"""The search space beside the wording: Optuna's sampler proposes demonstrations and settings for each
new candidate, the study and MLflow record them, the validated gate decides between whole
configurations, and the returned configuration exports and reloads with all its dimensions."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from fakes import EMBEDDINGS, HashEmbedder, experiment_config, mlflow_client, run_together, write_toml

from opro.errors import ConfigError, LeakageError
from opro.experiment import Experiment
from opro.llm import GenerationOptions, Message
from opro.llm.pool import ModelPool
from opro.llm.scripted import ScriptedLLM
from opro.program.prompts import Demo, QATemplate
from opro.search.results import CandidateRecord
from opro.search.space import SearchSpace, reference_demos

DOC = "AlexNet won the ImageNet challenge in 2012. It was designed by Alex Krizhevsky. It used ReLU and dropout.\n"


def _shown_a_demo(prompt: str) -> bool:
    return prompt.count("Query:") > 1  # a demonstration is the base template filled once more


def demo_task_reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    # Only a worked example shows this task model the answer's form; wording alone changes nothing.
    return "As in the example: yes." if _shown_a_demo(messages[-1].content) else "Yes."


def demo_judge_reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    return json.dumps({"score": 5 if "As in the example" in messages[-1].content else 2, "reasoning": "scripted"})


def plain_optimizer_reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    return f"<INS>Answer the question, variant {(options.seed or 0) % 1000}.</INS>"


def _llms() -> dict[str, ScriptedLLM]:
    return {
        "task": ScriptedLLM(default=demo_task_reply, model="task"),
        "judge": ScriptedLLM(default=demo_judge_reply, model="judge"),
        "optimizer": ScriptedLLM(default=plain_optimizer_reply, model="optimizer"),
    }


def _pool(llms: dict[str, ScriptedLLM] | None = None) -> ModelPool:
    return ModelPool(scripted=llms or _llms())


def _config(tmp_path: Path, **space: object) -> Path:
    cfg = experiment_config(
        tmp_path, questions=40, doc=DOC,
        experiment={"name": "space", "output_dir": "out", "progress": False},
        data={"split": {"exemplar": 4, "optimization": 4, "validation": 16, "heldout": 8, "seed": 1}},
        optimizer={"steps": 3, "candidates_per_step": 2, "minibatch_size": 2, "patience": 0},
        search={"space": {"demos": [0, 1, 2], "top_k": [1, 3], "answer_max_tokens": [32, 64], "chunk_size": [32], **space}},
    )
    return write_toml(cfg, tmp_path / "space.toml")


def _optimize(path: Path) -> tuple[Experiment, object]:
    exp = Experiment.from_file(path, pool=_pool(), progress=False)
    return exp, exp.optimize()


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    tmp = tmp_path_factory.mktemp("space")
    path = _config(tmp)
    exp, result = _optimize(path)
    exp.close()
    return path, result


def test_demonstrations_and_settings_are_searched_and_the_validated_gate_returns_a_whole_configuration(
        searched: tuple[Path, object]) -> None:
    path, result = searched
    history = result.history  # type: ignore[attr-defined]
    initial = history[0]
    assert initial.step == 0 and initial.params == {"demos": 0, "top_k": 2, "answer_max_tokens": 128, "chunk_size": 64}
    assert all(set(r.params) == {"demos", "top_k", "answer_max_tokens", "chunk_size"} for r in history)
    assert {r.params["chunk_size"] for r in history} == {32, 64}  # each chunking was tried
    assert all(r.params["demos"] in (0, 1, 2) and r.params["top_k"] in (1, 2, 3) for r in history)
    # Only a demonstration moves this task model: the gate returns a configuration with one, on
    # validation questions that did not choose it.
    assert result.validated and result.gain > 1.0  # type: ignore[attr-defined, operator]
    assert result.best_params["demos"] >= 1  # type: ignore[attr-defined]
    config = result.best_configuration  # type: ignore[attr-defined]
    assert len(config["demos"]) == result.best_params["demos"]  # type: ignore[attr-defined]
    assert config["top_k"] == result.best_params["top_k"]  # type: ignore[attr-defined]
    template = QATemplate.from_json(config)
    assert template.template_text == result.best_template  # type: ignore[attr-defined]
    # Demonstrations come from the exemplar split only.
    exp = Experiment.from_file(path, pool=_pool(), progress=False)
    try:
        exemplars = {e.query for e in exp.dataset.examples_in("exemplar")}
        assert {d.query for d in template.demos} <= exemplars
    finally:
        exp.close()


def test_each_trial_records_its_values_in_optuna_and_mlflow(searched: tuple[Path, object]) -> None:
    path, result = searched
    study = optuna.load_study(study_name="space", storage=f"sqlite:///{path.parent / 'out' / 'optuna.db'}")
    complete = [t for t in study.get_trials() if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == len(result.history)  # type: ignore[attr-defined]
    for t in complete:
        assert set(t.params) == {"demos", "top_k", "answer_max_tokens", "chunk_size"}
        assert isinstance(t.distributions["demos"], optuna.distributions.CategoricalDistribution)
    frame = study.trials_dataframe()
    assert {"params_demos", "params_top_k", "params_answer_max_tokens", "params_chunk_size"} <= set(frame.columns)
    client = mlflow_client(path)
    run = client.search_runs([client.get_experiment_by_name("space").experiment_id])[0]
    best = result.best_params  # type: ignore[attr-defined]
    assert run.data.params["best.demos"] == str(best["demos"])
    assert run.data.params["search.space.top_k"] == "(1, 3)"
    demos = [m.value for m in client.get_metric_history(run.info.run_id, "candidate_demos")]
    assert sorted(demos) == sorted(float(r.params["demos"]) for r in result.history)  # type: ignore[attr-defined]


def test_a_rerun_resumes_the_same_configurations_without_a_call(searched: tuple[Path, object]) -> None:
    path, result = searched
    llms = _llms()
    exp = Experiment.from_file(path, pool=_pool(llms), progress=False)
    try:
        again = exp.optimize()
    finally:
        exp.close()
    assert [r.params for r in again.history] == [r.params for r in result.history]  # type: ignore[attr-defined]
    assert again.best_configuration == result.best_configuration  # type: ignore[attr-defined]
    assert all(not llm.calls for llm in llms.values())


def test_another_space_is_another_study(searched: tuple[Path, object]) -> None:
    path, _ = searched
    text = path.read_text().replace("top_k = [1, 3]", "top_k = [1, 4]")
    other = path.with_name("other.toml")
    other.write_text(text)
    exp = Experiment.from_file(other, pool=_pool(), progress=False)
    try:
        with pytest.raises(ConfigError, match=r"search\.space"):
            exp.optimize()
    finally:
        exp.close()


def test_the_returned_configuration_exports_and_reloads_answering_the_same(
        searched: tuple[Path, object], tmp_path: Path) -> None:
    from opro.export import (
        export_prompt,
        load_dspy_program,
        load_llamaindex_prompt,
        load_llamaindex_settings,
        load_prompt_json,
    )
    from opro.export.sources import resolve_prompt
    from opro.program.dspy import OproRAG
    from opro.program.rag import RAGProgram, as_llama_index_retriever, chat_client_llm

    path, _ = searched
    llms = _llms()
    exp = Experiment.from_file(path, pool=_pool(llms), progress=False)
    try:
        best = resolve_prompt("best", config=exp.config)
        template = best.template
        assert template.demos and template.settings.keys() >= {"top_k", "answer_max_tokens", "chunk_size"}
        files = {f: export_prompt(best, format=f, out=tmp_path / f, config=exp.config).paths[0]  # type: ignore[arg-type]
                 for f in ("json", "llamaindex", "dspy")}
        assert load_prompt_json(files["json"]) == template
        question = exp.dataset.examples_in("heldout")[0].query
        task = llms["task"]
        opro_answer = exp.program.answer(question, template=template)
        # Every later call of the same question must be a hit of this one's cache entry (keyed by the
        # messages and the options): exactly the same call, or the scripted model would be asked anew.
        asked = len(task.calls)
        assert asked and "Query:" in task.calls[-1][0][-1].content
        # LlamaIndex: the exported template (demonstrations in it) over a retriever with its chunking and
        # top_k and an LLM with its max_tokens asks the task model exactly the same call.
        from llama_index.core.query_engine import RetrieverQueryEngine

        settings = load_llamaindex_settings(files["llamaindex"])
        assert settings == {"similarity_top_k": template.setting("top_k"), "max_tokens": template.setting("answer_max_tokens"),
                            "chunk_size": template.setting("chunk_size")}
        engine = RetrieverQueryEngine.from_args(
            retriever=as_llama_index_retriever(exp.retriever_at(settings["chunk_size"]), top_k=settings["similarity_top_k"]),
            llm=chat_client_llm(exp.client("task"), max_tokens=settings["max_tokens"]),
            text_qa_template=load_llamaindex_prompt(files["llamaindex"]),
        )
        li_answer = str(engine.query(question))
        assert li_answer.strip() == opro_answer.text and len(task.calls) == asked
        # DSPy: a Predict with the demonstrations in its own demo fields, in opro's frame.
        predict = load_dspy_program(files["dspy"])
        assert [d.question for d in predict.demos] == [d.query for d in template.demos]
        program = RAGProgram(retriever=exp.retriever, llm=exp.client("task"), max_tokens=exp.config.rag.answer_max_tokens,
                             template=template, chunked=exp.retriever_at)
        module = OproRAG(program, instruction=template.instruction)
        module.generate.demos = predict.demos
        assert module(question=question).answer == opro_answer.text and len(task.calls) == asked
    finally:
        exp.close()


def test_a_held_out_question_shown_as_a_demonstration_is_refused(searched: tuple[Path, object], tmp_path: Path) -> None:
    from opro.heldout.compare import compare_prompts

    path, _ = searched
    exp = Experiment.from_file(path, pool=_pool(), progress=False)
    try:
        held = exp.dataset.examples_in("heldout")[0]
        leaky = QATemplate(instruction="Answer.", demos=(Demo(query=held.query, context="c", answer="a"),))
        file = tmp_path / "leaky.json"
        file.write_text(json.dumps({"format": "opro.prompt/v1", **leaky.to_json(), "template": leaky.template_text}))
        with pytest.raises(LeakageError, match="as demonstrations"):
            compare_prompts(prompts=["initial", str(file)], experiment=exp, split="heldout")
    finally:
        exp.close()


def test_the_sampler_is_seeded_and_keeps_to_the_choices() -> None:
    space = SearchSpace(dimensions={"top_k": [1, 3], "demos": [0, 2]}, initial={"top_k": 2, "demos": 0},
                        demos=[Demo(query=f"q{i}", context="c", answer="a") for i in range(2)], seed=3)
    assert space.choices == {"top_k": (1, 2, 3), "demos": (0, 2)}  # the initial value is always a choice
    history = [CandidateRecord(step=0, instruction="a", score=2.0, n_scored=2, n_invalid=0, n_errors=0,
                               status="complete", trial_number=0, params={"top_k": 2, "demos": 0})]
    first = space.sample(history, 4, step=1)
    assert first == space.sample(history, 4, step=1)
    assert all(p["top_k"] in (1, 2, 3) and p["demos"] in (0, 2) for p in first)
    configured = space.configure(QATemplate(instruction="x"), {"top_k": 3, "demos": 2})
    assert configured.setting("top_k") == 3 and len(configured.demos) == 2
    assert space.configure(QATemplate(instruction="x"), {}).demos == ()  # the initial configuration's
    with pytest.raises(ConfigError, match="exemplar"):
        SearchSpace(dimensions={"demos": [3]}, initial={"demos": 0}, demos=[])


def test_reference_demonstrations_use_the_reference_context_else_the_retrieved_one() -> None:
    class E:
        def __init__(self, q: str, ctx: tuple[str, ...]) -> None:
            self.query, self.reference_contexts, self.reference_answer = q, ctx, f"answer to {q}"

    demos = reference_demos([E("a?", ("its   own context",)), E("b?", ())], chars=10,
                            retrieve=lambda q: [f"found for {q}"])
    assert [(d.context, d.answer) for d in demos] == [("its own co", "answer to a?"), ("found for ", "answer to b?")]


@pytest.mark.embedded
def test_on_the_embedded_model_the_exports_answer_as_opro_does(tmp_path: Path, embedded_task_llm: object) -> None:
    """LlamaIndex and DSPy, rebuilt from the exports alone, decode the same answer as opro's program
    on the real 0.5B model (no call cache: each answer is decoded anew)."""
    from llama_index.core.query_engine import RetrieverQueryEngine

    from opro.export import export_prompt, load_dspy_program, load_llamaindex_prompt, load_llamaindex_settings
    from opro.export.sources import ResolvedPrompt
    from opro.llm import ChatClient, UsageLedger
    from opro.program.dspy import OproRAG
    from opro.program.rag import RAGProgram, as_llama_index_retriever, chat_client_llm
    from opro.program.retrieval import RetrievedContext

    class Fixed:
        texts = ("The break statement terminates the nearest enclosing loop.",
                 "The continue statement skips to the next cycle of the loop.",
                 "The pass statement does nothing.")

        def retrieve(self, query: str, *, top_k: int | None = None) -> list[RetrievedContext]:
            return [RetrievedContext(text=t, score=1.0, metadata={}, chunk_id=f"c{i}")
                    for i, t in enumerate(self.texts[: top_k or 3])]

        def describe(self) -> dict[str, str]:
            return {"kind": "fixed"}

    template = QATemplate(
        instruction="Answer in one short sentence.", position="after", settings={"top_k": 1, "answer_max_tokens": 24},
        demos=(Demo(query="What does pass do?", context="The pass statement does nothing.", answer="Nothing."),),
    )
    client = ChatClient(embedded_task_llm, role="task", usage=UsageLedger())  # type: ignore[arg-type]
    program = RAGProgram(retriever=Fixed(), llm=client, max_tokens=128, template=template)  # type: ignore[arg-type]
    question = "What does the break statement do?"
    opro_answer = program.answer(question).text
    assert opro_answer
    prompt = ResolvedPrompt(spec="test", kind="file", label="test", template=template)
    li, dsp = (export_prompt(prompt, format=f, out=tmp_path / f).paths[0] for f in ("llamaindex", "dspy"))  # type: ignore[arg-type]
    settings = load_llamaindex_settings(li)
    engine = RetrieverQueryEngine.from_args(
        retriever=as_llama_index_retriever(Fixed(), top_k=settings["similarity_top_k"]),  # type: ignore[arg-type]
        llm=chat_client_llm(client, max_tokens=settings["max_tokens"]), text_qa_template=load_llamaindex_prompt(li),
    )
    assert str(engine.query(question)).strip() == opro_answer
    module = OproRAG(program, instruction=template.instruction)
    module.generate.demos = load_dspy_program(dsp).demos
    assert module(question=question).answer == opro_answer


def test_two_workers_evaluate_the_single_workers_configurations(
        searched: tuple[Path, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    import opro.search.steps

    source, result = searched
    # Scripted calls are instant, so whichever worker reaches a step first could take all of it (a
    # slot that would idle claims the next candidate). Worker 0 claims step 1 only once worker 1 has
    # claimed there: an event, not a race that load decides.
    worker_1_claimed = threading.Event()
    claim = opro.search.steps.claim

    def claim_after_worker_1(study: object, **kw: object) -> list:  # type: ignore[type-arg]
        if kw["worker"] == 0 and kw["step"] == 1 and kw.get("part") is None:
            assert worker_1_claimed.wait(timeout=120), "worker 1 never claimed a candidate of step 1"
        won = claim(study, **kw)  # type: ignore[arg-type]
        if kw["worker"] == 1 and kw["step"] >= 1 and won:
            worker_1_claimed.set()
        return won

    monkeypatch.setattr(opro.search.steps, "claim", claim_after_worker_1)
    path = tmp_path / "space.toml"
    for name in ("space.toml", "qa.jsonl"):
        (tmp_path / name).write_text((source.parent / name).read_text())
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "alexnet.txt").write_text((source.parent / "docs" / "alexnet.txt").read_text())
    results: dict[int, object] = {}

    def worker(i: int) -> None:
        exp = Experiment.from_file(path, pool=_pool(), progress=False)
        try:
            results[i] = exp.optimize(worker_index=i, num_workers=2)
        finally:
            exp.close()

    errors = run_together(worker, threads=2, timeout_s=300)
    assert not errors, errors
    lead = results[0]
    assert [(r.instruction, dict(r.params)) for r in lead.history] == \
        [(r.instruction, dict(r.params)) for r in result.history]  # type: ignore[attr-defined]
    assert lead.best_configuration == result.best_configuration  # type: ignore[attr-defined]
    study = optuna.load_study(study_name="space", storage=f"sqlite:///{tmp_path / 'out' / 'optuna.db'}")
    by_worker = {t.user_attrs.get("worker") for t in study.get_trials() if t.params}
    assert by_worker == {0, 1}  # both evaluated candidates, each trial with its configuration's params


def test_optimize_shows_each_row_with_its_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    import opro.experiment
    from opro.cli import app

    monkeypatch.setattr(opro.experiment, "ModelPool", lambda: _pool())
    monkeypatch.setenv("COLUMNS", "400")  # rich's table, unwrapped
    config = _config(tmp_path)
    result = CliRunner().invoke(app, ["optimize", str(config), "--no-progress"], terminal_width=240)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "[demos 0, top_k 2, answer_max_tokens 128, chunk_size 64]" in said  # the initial configuration
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    best = summary["best_params"]
    assert ("[" + ", ".join(f"{k} {best[k]}" for k in ("demos", "top_k", "answer_max_tokens", "chunk_size")) + "]") in said


def test_bootstrapped_demonstrations_are_the_task_models_answers_the_judge_passed(tmp_path: Path) -> None:
    import re

    def odd(text: str) -> bool:
        m = re.search(r"Fact number (\d+) ", text)
        return bool(m) and int(m.group(1)) % 2 == 1

    def judge(messages: tuple[Message, ...], options: GenerationOptions) -> str:
        return json.dumps({"score": 5 if odd(messages[-1].content) else 2, "reasoning": "scripted"})

    llms = {**_llms(), "judge": ScriptedLLM(default=judge, model="judge")}
    path = _config(tmp_path, demos=[0, 1], demo_source="bootstrapped")
    exp = Experiment.from_file(path, pool=_pool(llms), progress=False)
    try:
        space = exp.search_space
        assert space is not None
        want = [e.query for e in exp.dataset.examples_in("exemplar") if odd(e.query)]
        assert want  # the split gives this world an odd exemplar
        assert [d.query for d in space.demos] == want  # those the judge passed, in the split's order
        assert all(d.answer == "Yes." and d.context for d in space.demos)  # the model's own answer and context
    finally:
        exp.close()
    (tmp_path / "out").rename(tmp_path / "first")
    (tmp_path / "calls.sqlite").rename(tmp_path / "first.sqlite")  # another judge: its verdicts are not cached
    none = {**_llms(), "judge": ScriptedLLM(default=lambda m, o: json.dumps({"score": 1, "reasoning": "no"}),
                                            model="judge")}
    exp = Experiment.from_file(path, pool=_pool(none), progress=False)
    try:
        with pytest.raises(ConfigError, match=r"exemplar split gives 0 \(bootstrapped\)"):
            _ = exp.search_space
    finally:
        exp.close()


def test_the_retriever_kind_lands_through_the_table_searched_exported_and_planned(tmp_path: Path) -> None:
    """A dimension declared once (opro/program/dimensions.py) and implemented in retrieval.py: [search.space]
    opens it, the sampler proposes it, the template carries it, the exports and the plan show it."""
    from opro.config import load_config
    from opro.export import export_prompt, load_llamaindex_settings, load_prompt_json
    from opro.export.sources import resolve_prompt
    from opro.probe.plan import make_plan

    path = _config(tmp_path, retriever=["bm25", "hybrid"])
    path.write_text(path.read_text() + "\n[rag.embeddings]\n" + "".join(f"{k} = {v!r}\n".replace("'", '"')
                                                                        for k, v in EMBEDDINGS.items()))
    exp = Experiment.from_file(path, pool=_pool(), progress=False)
    exp.__dict__["_configured_embedder"] = HashEmbedder()  # the endpoint's stand-in
    try:
        result = exp.optimize()
        assert all(r.params["retriever"] in ("bm25", "hybrid") for r in result.history)
        assert result.history[0].params["retriever"] == "bm25"  # [rag].retriever, the initial configuration's
        assert {r.params["retriever"] for r in result.history} == {"bm25", "hybrid"}
        best = resolve_prompt("best", config=exp.config)
        assert best.template.setting("retriever") == result.best_params["retriever"]
        files = {f: export_prompt(best, format=f, out=tmp_path / f, config=exp.config).paths[0]  # type: ignore[arg-type]
                 for f in ("json", "llamaindex")}
        assert load_prompt_json(files["json"]).setting("retriever") == best.template.setting("retriever")
        assert load_llamaindex_settings(files["llamaindex"])["retriever"] == best.template.setting("retriever")
        hybrid = exp.program.retriever_for(best.template.with_settings(retriever="hybrid", chunk_size=64))
        assert hybrid.kind == "hybrid" and hybrid is exp.retriever_at(64, retriever="hybrid")
    finally:
        exp.close()
    said = "\n".join(make_plan(load_config(path)).lines())
    assert "retriever ['bm25', 'hybrid']" in said and "the same tokens for every kind" in said
