from __future__ import annotations

import math

import pytest

from opro.errors import ConfigError
from opro.judges.metrics import (
    EmbeddingSimilarity,
    ExactMatch,
    MetricResult,
    TokenF1,
    cosine_similarity,
    exact_match,
    normalize_answer,
    token_f1,
)


def test_normalize_answer_squad_rules() -> None:
    assert normalize_answer("The  Cat, an apple & A dog!") == "cat apple dog"
    # Articles only as whole words: "theory" keeps its "the".
    assert normalize_answer("Theory of an Anthem") == "theory of anthem"


@pytest.mark.parametrize(
    ("answer", "reference", "expected"),
    [
        # identical after normalization
        ("The Eiffel Tower.", "eiffel tower", 1.0),
        # pred {alexnet, won, in, 2012} vs ref {alexnet, won, imagenet, 2012}: overlap 3,
        # P = 3/4, R = 3/4, F1 = 0.75
        ("AlexNet won in 2012", "AlexNet won ImageNet 2012", 0.75),
        # pred 2 tokens {deep, learning}, ref 4 tokens {deep, learning, is, popular}: overlap 2,
        # P = 1, R = 0.5, F1 = 2*0.5/1.5 = 2/3
        ("deep learning", "Deep learning is popular", 2 / 3),
        # multiset: pred "a a a b" -> {b} after dropping article "a"; use words: "x x y" vs "x y y"
        # common = min counts: x:1, y:1 -> 2; P = 2/3, R = 2/3 -> F1 = 2/3
        ("x x y", "x y y", 2 / 3),
        ("completely different", "nothing shared here", 0.0),
        ("", "", 1.0),
        ("", "something", 0.0),
        ("the", "a", 1.0),  # both normalize to empty
    ],
)
def test_token_f1_hand_computed(answer: str, reference: str, expected: float) -> None:
    result = token_f1(answer=answer, reference=reference)
    assert result.score == pytest.approx(expected)
    assert result.name == "token_f1"
    assert result.passing == (expected >= 0.5)
    assert TokenF1()(answer=answer, reference=reference).score == pytest.approx(expected)


def test_exact_match() -> None:
    assert exact_match(answer="The Eiffel Tower!", reference="eiffel tower").score == 1.0
    assert exact_match(answer="Eiffel", reference="eiffel tower").score == 0.0
    assert ExactMatch()(answer="a b", reference="b").passing is True


def test_cosine_similarity() -> None:
    assert cosine_similarity([1, 0], [0, 1]) == pytest.approx(0.0)
    assert cosine_similarity([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert cosine_similarity([1, 1], [1, 0]) == pytest.approx(1 / math.sqrt(2))
    with pytest.raises(ConfigError, match="length"):
        cosine_similarity([1, 2], [1, 2, 3])
    with pytest.raises(ConfigError, match="zero vector"):
        cosine_similarity([0, 0], [1, 0])


def test_embedding_similarity_uses_embedder() -> None:
    seen: list[list[str]] = []

    def embed(texts: list[str]) -> list[list[float]]:
        seen.append(list(texts))
        return [[1.0, 0.0] if "cat" in t else [1.0, 1.0] for t in texts]

    metric = EmbeddingSimilarity(embed, threshold=0.9)
    result = metric(answer="a cat", reference="a dog")
    assert seen == [["a cat", "a dog"]]
    assert result.score == pytest.approx(1 / math.sqrt(2))
    assert result.passing is False
    assert metric(answer=" ", reference="x").invalid
    with pytest.raises(ConfigError):
        EmbeddingSimilarity("not callable")  # type: ignore[arg-type]


def test_invalid_result_shape() -> None:
    r = MetricResult.invalid_result("correctness", "no score")
    assert r.score is None and r.passing is None and r.invalid and r.invalid_reason == "no score"
