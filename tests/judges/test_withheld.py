"""A task where the prompt matters: questions whose reference context is taken out of the corpus,
answered "not in the context", and scored by the requirement's rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import experiment_config, scripted_pool, write_toml

from opro.config import config_from_dict
from opro.errors import ConfigError
from opro.experiment import Experiment
from opro.judges import CorrectnessJudge
from opro.judges.withheld import NOT_IN_CONTEXT, requirement_score, says_not_in_context, withhold
from opro.llm import ChatClient, UsageLedger
from opro.llm.scripted import ScriptedLLM
from opro.program.retrieval import Chunk

TOPICS = ["rivers", "mountains", "forests", "deserts", "glaciers", "islands", "volcanoes", "lakes", "canyons", "reefs",
          "valleys", "plateaus", "marshes", "tundras", "savannas", "fjords", "caves", "dunes", "lagoons", "steppes"]


def _fact(i: int) -> str:
    topic = TOPICS[i]
    return (f"The survey of {topic} counted {i * 7 + 3} sites in the northern region. Every one of the {topic} "
            f"sites was mapped by team {i} during the spring expedition of year {1990 + i}.")


class _Ex:
    def __init__(self, i: int) -> None:
        self.query = f"How many {TOPICS[i]} sites did team {i} count in {1990 + i}?"  # distinct: not one group
        self.reference_contexts = (_fact(i),)
        self.reference_answer = f"{i * 7 + 3} sites."


def test_withholding_takes_out_the_chunks_that_hold_the_drawn_answers_and_nothing_else() -> None:
    examples = [_Ex(i) for i in range(20)]
    chunks = [Chunk(id=f"c{i}", text=_fact(i)) for i in range(20)]
    w = withhold(examples, chunks, fraction=0.25, seed=3)
    assert len(w.queries) == 5 and len(w.chunk_ids) == 5
    lost = {int(c[1:]) for c in w.chunk_ids}
    assert set(w.queries) == {examples[i].query for i in lost}  # one fact per chunk: exactly those questions
    assert w == withhold(examples, chunks, fraction=0.25, seed=3)  # seeded
    assert w != withhold(examples, chunks, fraction=0.25, seed=4)
    # A chunk holding two facts takes both questions with it.
    merged = [Chunk(id="both", text=_fact(0) + " " + _fact(1)), *chunks[2:]]
    w2 = withhold(examples, merged, fraction=0.05, seed=0)
    if "both" in w2.chunk_ids:
        assert {examples[0].query, examples[1].query} <= set(w2.queries)


@pytest.mark.parametrize(("answer", "score"), [
    ("The context does not contain the answer.", 5.0),
    ("The context doesn't mention how many sites were counted.", 5.0),
    ("I cannot determine this from the given information.", 5.0),
    ("There is no information about it in the context.", 5.0),
    ("Unknown.", 5.0),
    ("17 sites were counted.", 1.0),
    ("The survey counted 17 sites in the northern region.", 1.0),
    ("The context does not say it directly, " + "but judging from the other surveys it was probably " * 4 + "17.", 3.0),
])
def test_the_requirement_rule_rewards_saying_the_context_lacks_the_answer(answer: str, score: float) -> None:
    result = requirement_score(answer, name="correctness", threshold=4.0)
    assert result.score == score and result.passing == (score >= 4.0)
    assert says_not_in_context(answer) == (score > 1.0)


def test_the_correctness_judge_scores_a_not_in_context_question_by_the_rule_without_a_call(tmp_path: Path) -> None:
    llm = ScriptedLLM(default=json.dumps({"score": 5, "reasoning": "scripted"}))
    judge = CorrectnessJudge(ChatClient(llm, role="judge", usage=UsageLedger()))
    said = judge.measure(query="q?", answer="The context does not contain it.", reference=NOT_IN_CONTEXT)
    made_up = judge.measure(query="q?", answer="It was 17.", reference=NOT_IN_CONTEXT)
    assert (said.score, made_up.score) == (5.0, 1.0) and not llm.calls
    assert judge.measure(query="q?", answer="It was 17.", reference="17.").score == 5.0 and len(llm.calls) == 1


def _config(tmp_path: Path, **data: object) -> Path:
    rows = [{"query": _Ex(i).query, "reference_answer": _Ex(i).reference_answer,
             "reference_contexts": list(_Ex(i).reference_contexts)} for i in range(20)]
    (tmp_path / "rag.json").write_text(json.dumps({"examples": rows}))
    cfg = experiment_config(
        tmp_path, doc="\n\n".join(_fact(i) for i in range(20)),
        experiment={"name": "wh", "output_dir": "out", "progress": False},
        data={"dataset": "rag.json", "not_in_context": 0.25, "query_field": "", "answer_field": "",
              "split": {"exemplar": 4, "optimization": 4, "validation": 6, "heldout": 4, "seed": 1}, **data},
        rag={"chunk_size": 48, "chunk_overlap": 0, "top_k": 2, "initial_instructions": ["Answer the question."]},
    )
    return write_toml(cfg, tmp_path / "wh.toml")


def test_an_experiment_carries_unanswerable_questions_and_its_corpus_never_returns_their_context(tmp_path: Path) -> None:
    exp = Experiment.from_file(_config(tmp_path), pool=scripted_pool(), progress=False)
    try:
        lost = [e for e in exp.dataset.examples if e.reference_answer == NOT_IN_CONTEXT]
        assert 4 <= len(lost) <= 8 and all(e.reference_contexts for e in lost)  # where the answer was
        withheld = exp.withheld
        assert withheld is not None and {e.query for e in lost} == set(withheld.queries)
        assert (exp.dataset_dir / "withheld.json").is_file()
        for name in ("exemplar", "optimization", "validation", "heldout"):  # each split gets its share
            assert any(e.reference_answer == NOT_IN_CONTEXT for e in exp.dataset.examples_in(name)), name
        for e in lost:  # the numbers their answers needed are nowhere in what the retriever finds
            i = TOPICS.index(e.query.split()[2])
            found = " ".join(c.text for c in exp.retriever.retrieve(e.query, top_k=20))
            assert f"counted {i * 7 + 3} sites" not in found
        kept = [e for e in exp.dataset.examples if e.reference_answer != NOT_IN_CONTEXT]
        found = " ".join(c.text for c in exp.retriever.retrieve(kept[0].query, top_k=20))
        assert kept[0].reference_answer.split()[0] in found
    finally:
        exp.close()


def test_not_in_context_is_checked_on_load() -> None:
    with pytest.raises(ConfigError, match=r"not_in_context"):
        config_from_dict({"data": {"docs": ["d"], "not_in_context": 0.8}})


def test_a_demonstration_of_an_unanswerable_question_shows_what_the_retriever_finds() -> None:
    from opro.search.space import reference_demos

    class E:
        query, reference_contexts, reference_answer = "How many?", ("the withheld passage",), NOT_IN_CONTEXT

    (demo,) = reference_demos([E()], chars=100, retrieve=lambda q: ["an unrelated passage"])
    assert (demo.context, demo.answer) == ("an unrelated passage", NOT_IN_CONTEXT)


def test_a_stratified_split_gives_every_split_its_share_and_changes_nothing_unstratified() -> None:
    from opro.data.dataset import Example, make_split

    examples = [Example(query=f"Question number {i} about topic {i * 13}?", reference_answer="a") for i in range(40)]
    hard = {e.query for e in examples[:10]}  # a quarter, all at the front
    split = make_split(examples, exemplar=8, optimization=8, validation=12, heldout=12, seed=0,
                       stratify=lambda e: "hard" if e.query in hard else "easy")
    for name, size in (("exemplar", 8), ("optimization", 8), ("validation", 12), ("heldout", 12)):
        n_hard = sum(examples[i].query in hard for i in split.indices(name))
        assert abs(n_hard - size / 4) <= 1, (name, n_hard)
    plain = make_split(examples, exemplar=8, optimization=8, validation=12, heldout=12, seed=0)
    assert plain == make_split(examples, exemplar=8, optimization=8, validation=12, heldout=12, seed=0)


def test_another_chunking_withholds_the_same_answers_and_is_indexed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import opro.program.retrieval

    path = _config(tmp_path, )
    text = path.read_text() + '\n[search.space]\nchunk_size = [96]\n'
    path.write_text(text)
    exp = Experiment.from_file(path, pool=scripted_pool(), progress=False)
    try:
        lost = [e for e in exp.dataset.examples if e.reference_answer == NOT_IN_CONTEXT]
        wide = exp.retriever_at(96)
        assert wide is exp.retriever_at(96) and exp.retriever_at(48) is exp.retriever
        assert max(len(c.text) for c in wide.chunks) > max(len(c.text) for c in exp.retriever.chunks)  # another chunking
        for e in lost:  # the withheld numbers are in no chunk of the other chunking either
            i = TOPICS.index(e.query.split()[2])
            assert f"counted {i * 7 + 3} sites" not in " ".join(c.text for c in wide.retrieve(e.query, top_k=50))
        kept = [e for e in exp.dataset.examples if e.reference_answer != NOT_IN_CONTEXT]
        found = " ".join(c.text for c in wide.retrieve(kept[0].query, top_k=50))
        assert kept[0].reference_answer.split()[0] in found  # the rest of the corpus stays
    finally:
        exp.close()
    # Chunked and indexed once: another experiment over the same files loads both, chunking nothing.
    monkeypatch.setattr(opro.program.retrieval, "chunk_documents", lambda *a, **k: pytest.fail("chunked again"))
    again = Experiment.from_file(path, pool=scripted_pool(), progress=False)
    try:
        assert [c.id for c in again.retriever_at(96).chunks] == [c.id for c in wide.chunks]
    finally:
        again.close()


def test_a_chunk_size_must_exceed_the_overlap() -> None:
    with pytest.raises(ConfigError, match=r"\[search\.space\]\.chunk_size = 32 is not above \[rag\]\.chunk_overlap"):
        config_from_dict({"data": {"docs": ["d"]}, "rag": {"chunk_size": 128, "chunk_overlap": 32},
                          "search": {"space": {"chunk_size": [32]}}})
