"""LLM judges: the correctness judge (1-5 against a reference) and the yes/no judges (faithfulness,
relevancy), their templates and the parsers that read their replies."""

from opro.judges.correctness import (
    BUILTIN_TEMPLATES,
    SCORE_SOURCES,
    CorrectnessJudge,
    FaithfulnessJudge,
    JudgeTemplate,
    ParsedScore,
    RelevancyJudge,
    correctness_schema,
    expected_score_from_logprobs,
    get_template,
    pack_contexts,
    parse_score,
    parse_yes_no,
    score_distribution,
)

__all__ = [
    "BUILTIN_TEMPLATES",
    "SCORE_SOURCES",
    "CorrectnessJudge",
    "FaithfulnessJudge",
    "JudgeTemplate",
    "ParsedScore",
    "RelevancyJudge",
    "correctness_schema",
    "expected_score_from_logprobs",
    "get_template",
    "pack_contexts",
    "parse_score",
    "parse_yes_no",
    "score_distribution",
]
