from __future__ import annotations

import pytest

from opro.search.metaprompt import (
    Exemplar,
    MetaPromptBuilder,
    ScoredInstruction,
    check_candidate,
    draw_exemplars,
    extract_candidate,
    normalize_instruction,
)

TEMPLATE = "<INS>\n---------------------\n{context_str}\n---------------------\nQuery: {query_str}\nAnswer: "


def _history(n: int) -> list[ScoredInstruction]:
    return [ScoredInstruction(f"instruction number {i}", 1.0 + (i % 9) * 0.5) for i in range(n)]


def test_history_sorted_ascending_best_last_and_capped() -> None:
    builder = MetaPromptBuilder(template_text=TEMPLATE, max_history=5)
    chosen = builder.select_history(_history(30))
    assert len(chosen) == 5
    scores = [c.score for c in chosen]
    assert scores == sorted(scores)
    assert scores[-1] == 5.0  # the best is last
    assert min(scores) >= 4.0  # only the top 5 survive


def test_low_scores_dropped_and_duplicates_keep_best() -> None:
    builder = MetaPromptBuilder(template_text=TEMPLATE, min_score=2.0)
    history = [
        ScoredInstruction("Answer briefly.", 1.5),
        ScoredInstruction("Be precise.", 3.0),
        ScoredInstruction("be precise", 4.0),
    ]
    chosen = builder.select_history(history)
    assert [c.score for c in chosen] == [4.0]


def test_render_contains_scores_template_exemplars_and_honest_scale() -> None:
    builder = MetaPromptBuilder(template_text=TEMPLATE)
    text = builder.render(
        history=[ScoredInstruction("Be precise.", 3.25), ScoredInstruction("Cite the context.", 4.5)],
        exemplars=[Exemplar("What is AlexNet?", "A convolutional network.")],
    )
    assert text.index("Be precise.") < text.index("Cite the context.")  # ascending
    assert "3.25" in text and "4.50" in text
    assert "[retrieved context]" in text and "<INS>" in text and "{context_str}" not in text
    assert "What is AlexNet?" in text and "A convolutional network." in text
    assert "from 1" in text and "to 5" in text
    assert "score 0" not in text and "score of 1" not in text  # the reference notebook's 0/1 flaw is gone
    assert "<INS> and </INS>" in text


def test_render_0_100_scale() -> None:
    builder = MetaPromptBuilder(template_text=TEMPLATE, score_scale="0-100")
    text = builder.render(history=[ScoredInstruction("Be precise.", 3.0)], exemplars=[])
    assert "\n50\n" in text and "0 (every answer wrong) .. 100" in text


def test_exemplars_redrawn_each_step_and_reproducible() -> None:
    pool = [Exemplar(f"q{i}", f"a{i}") for i in range(20)]
    a = draw_exemplars(pool, k=3, step=1, seed=7)
    assert a == draw_exemplars(pool, k=3, step=1, seed=7)
    assert len(a) == 3
    draws = {tuple(e.query for e in draw_exemplars(pool, k=3, step=s, seed=7)) for s in range(1, 6)}
    assert len(draws) > 1
    assert draw_exemplars(pool, k=0, step=1, seed=0) == []
    assert len(draw_exemplars(pool[:2], k=3, step=1, seed=0)) == 2


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("<INS>Answer using only the context.</INS>", "Answer using only the context."),
        ("Sure! Here is a new instruction:\n<INS>\nRead the context carefully, then answer.\n</INS>", "Read the context carefully, then answer."),
        ('<INS>"Quote the relevant sentence, then answer."</INS>', "Quote the relevant sentence, then answer."),
        ("Instruction: Answer in one sentence.", "Answer in one sentence."),
        ("\n\n**New instruction:** Be factual and brief.\nThis should score higher.", "Be factual and brief."),
        ("<INS>Answer from the context only.", "Answer from the context only."),
        ("```\nUse the context.\n```", "Use the context."),
    ],
)
def test_extract_candidate_from_real_looking_outputs(reply: str, expected: str) -> None:
    assert extract_candidate(reply) == expected


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ("Sure! Here's an improved instruction:\nAnswer from the context.\nIt should score higher.", "lines"),
        ("Answer briefly.\nAnswer with a quote from the context.", "lines"),
        ("1. Answer briefly.\n2. Quote the context.\n3. Say when unsure.", "lines"),
        ("Sure! Here's an improved instruction: answer from the context.", "chat"),
        ("Here is my suggestion.", "chat"),
        ("Option 1: answer briefly. Option 2: quote the context.", "alternative"),
        ("Answer briefly. Alternatively, quote the context.", "alternative"),
    ],
)
def test_untagged_chatty_or_multiple_replies_rejected_with_reason(reply: str, reason: str) -> None:
    verdict = check_candidate(extract_candidate(reply), seen=set(), max_chars=500)
    assert not verdict.accepted
    assert reason in verdict.reason


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Sure! Here's an improved instruction:\nAnswer from the context only.", "Answer from the context only."),
        ("Answer from the context only, citing the sentence you used.", "Answer from the context only, citing the sentence you used."),
        ("Based on the context, answer in one sentence.", "Based on the context, answer in one sentence."),
    ],
)
def test_untagged_single_instruction_accepted(reply: str, expected: str) -> None:
    verdict = check_candidate(extract_candidate(reply), seen=set(), max_chars=500)
    assert verdict.accepted, verdict.reason
    assert verdict.instruction == expected


def test_extract_candidate_brackets() -> None:
    assert extract_candidate("New one: [Answer with facts from the context.]", answer_format="brackets") == (
        "Answer with facts from the context."
    )


def test_candidate_hygiene() -> None:
    seen = {normalize_instruction("Answer the query.")}
    assert check_candidate("", seen=seen, max_chars=100).reason == "empty"
    assert not check_candidate("x" * 101, seen=seen, max_chars=100).accepted
    assert check_candidate("answer the QUERY!", seen=seen, max_chars=100).reason == "duplicate"
    assert "template variable" in check_candidate("Use {context_str} well.", seen=seen, max_chars=100).reason
    assert "braces" in check_candidate("Answer {like this.", seen=seen, max_chars=100).reason
    assert check_candidate("Answer using the context only.", seen=seen, max_chars=100).accepted
