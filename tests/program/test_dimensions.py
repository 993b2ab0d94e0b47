"""The table of search dimensions (opro/program/dimensions.py), shown with the retriever kind: a dimension
declared once is parsed from [search.space], searched, carried by the template, exported and planned."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import EMBEDDINGS, HashEmbedder, experiment_config

from opro.config import config_from_dict
from opro.errors import ConfigError, PromptError
from opro.program.dimensions import DIMENSIONS, SETTINGS, dimension
from opro.program.prompts import QATemplate
from opro.program.retrieval import Chunk, HybridRetriever, build_retriever


def test_a_dimension_is_looked_up_by_name_and_an_unknown_one_names_the_table() -> None:
    assert [d.name for d in DIMENSIONS][:4] == ["demos", "top_k", "answer_max_tokens", "chunk_size"]
    assert dimension("retriever").kind == "choice" and dimension("retriever").choices == ("bm25", "dense", "hybrid")
    with pytest.raises(ConfigError, match=r"no search dimension 'rerank'; the dimensions: demos, top_k, .*retriever"):
        dimension("rerank")
    assert "retriever" in SETTINGS and "demos" not in SETTINGS


@pytest.mark.parametrize(("space", "rag", "message"), [
    ({"rerank": [0, 1]}, {}, r"unknown key \[search.space\].rerank; the dimensions: demos, top_k, .*retriever"),
    ({"top_k": ["2"]}, {}, r"\[search.space\].top_k value '2' must be an integer \(top_k is an int dimension\)"),
    ({"top_k": [0, 2]}, {}, r"\[search.space\].top_k values must be >= 1, got 0"),
    ({"retriever": ["bm25", "sparse"]}, {}, r"\[search.space\].retriever value 'sparse' must be one of 'bm25', 'dense', 'hybrid'"),
    ({"retriever": "hybrid"}, {}, r"retriever = 'hybrid' needs a \[rag.embeddings\] table"),
    ({"retriever": ["bm25", "bm25"]}, {"embeddings": EMBEDDINGS}, "lists a value twice"),
])
def test_search_space_values_are_checked_by_the_table(space: dict, rag: dict, message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_dict(experiment_config(tmp_path, rag={"chunk_size": 64, "chunk_overlap": 0, **rag},
                                           search={"space": space}))


def test_a_searched_retriever_parses_and_the_template_carries_it() -> None:
    cfg = config_from_dict({"rag": {"embeddings": EMBEDDINGS}, "search": {"space": {"retriever": ["bm25", "hybrid"]}}})
    assert cfg.search.space.dimensions == {"retriever": ("bm25", "hybrid")}
    assert cfg.search.space.retriever == ("bm25", "hybrid") and cfg.search.space.top_k == ()
    t = QATemplate(settings={"top_k": 3}).with_settings(top_k=3, retriever="hybrid")
    assert t.setting("retriever") == "hybrid" and t.settings == {"top_k": 3, "retriever": "hybrid"}
    assert QATemplate.from_json(t.to_json()) == t and t.to_json()["retriever"] == "hybrid"
    with pytest.raises(PromptError, match="retriever must be one of 'bm25', 'dense', 'hybrid' or unset"):
        t.with_settings(retriever="sparse")
    with pytest.raises(PromptError, match="a prompt has no setting 'rerank'"):
        t.with_settings(rerank="on")


def _chunks() -> list[Chunk]:
    texts = {"chess": "The king is checkmated when attacked and cannot escape.",
             "bread": "Bread rises because yeast ferments the sugars in the dough.",
             "rain": "Rain falls when droplets in clouds grow too heavy to float."}
    return [Chunk(id=k, text=v) for k, v in texts.items()]


def test_hybrid_retrieval_fuses_bm25_and_dense_and_reuses_their_indexes(tmp_path: Path) -> None:
    emb = HashEmbedder()
    hybrid = build_retriever(chunks=_chunks(), kind="hybrid", embedder=emb, index_dir=tmp_path, top_k=2, progress=False)
    assert isinstance(hybrid, HybridRetriever) and not hybrid.loaded_from_disk
    found = hybrid.retrieve("why does yeast make bread rise")
    assert found[0].chunk_id == "bread" and len(found) == 2  # BM25's only match first, then dense's best
    assert 1 / 61 < found[0].score <= 2 / 61
    again = build_retriever(chunks=_chunks(), kind="dense", embedder=emb, index_dir=tmp_path, progress=False)
    assert again.loaded_from_disk  # the dense index hybrid built is the dense retriever's own
    with pytest.raises(ConfigError, match="kind='hybrid' needs an embedder"):
        build_retriever(chunks=_chunks(), kind="hybrid")


def test_the_plan_lists_each_retriever_kind_at_the_same_tokens(tmp_path: Path) -> None:
    from opro.probe.plan import make_plan

    cfg = config_from_dict(experiment_config(
        tmp_path, rag={"chunk_size": 64, "chunk_overlap": 0, "embeddings": EMBEDDINGS},
        search={"space": {"retriever": ["bm25", "dense", "hybrid"]}}), base_dir=tmp_path)
    plan = make_plan(cfg)
    assert plan.cost is not None
    costs = {c.value: c.cost for c in plan.cost.choices if c.dimension == "retriever"}
    assert set(costs) == {"bm25", "dense", "hybrid"} and len(set(costs.values())) == 1
    said = "\n".join(plan.lines())
    assert "retriever ['bm25', 'dense', 'hybrid']" in said
    assert "  retriever: bm25: " in said and "the same tokens for every kind" in said


def test_a_new_dimension_needs_no_list_elsewhere() -> None:
    """The architecture check sees a hand-kept list (it can fail)."""
    import ast

    from opro.program.dimensions import names

    tree = ast.parse('OPEN = ("top_k", "retriever")')
    named = {e.value for e in tree.body[0].value.elts if isinstance(e, ast.Constant)}  # type: ignore[attr-defined]
    assert named <= set(names()) and len(named) == 2
