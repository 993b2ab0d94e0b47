"""LLM judges: the correctness judge (1-5 against a reference), the yes/no judges (faithfulness,
relevancy) and MLflow's correctness judge, their templates and the parsers that read their replies.

:mod:`~opro.judges.templates` (prompts as data), :mod:`~opro.judges.parsing` (reading replies),
:mod:`~opro.judges.correctness`, :mod:`~opro.judges.yesno` and :mod:`~opro.judges.mlflow_correctness`
(one module per kind of judge), and :mod:`~opro.judges.factory`, the one place judges are built
(:func:`build_judge`, :func:`build_metric`, :func:`build_mlflow_correctness`, :func:`make_extra_metrics`).
"""

from opro.judges.correctness import (
    SCORE_SOURCES,
    CorrectnessJudge,
    ScoreFrom,
    check_score_from,
    correctness_schema,
)
from opro.judges.factory import (
    EXTRA_METRICS,
    METRIC_JUDGES,
    REFERENCE_METRICS,
    build_judge,
    build_metric,
    build_mlflow_correctness,
    build_paired_judge,
    judge_template,
    make_extra_metrics,
)
from opro.judges.mlflow_correctness import MlflowCorrectnessJudge
from opro.judges.parsing import (
    ParsedScore,
    expected_score_from_logprobs,
    parse_score,
    parse_yes_no,
    parse_yes_no_verdict,
    score_distribution,
)
from opro.judges.sidebyside import PairVerdict, SideBySideJudge
from opro.judges.templates import BUILTIN_TEMPLATES, JudgeTemplate, get_template
from opro.judges.yesno import FaithfulnessJudge, RelevancyJudge, pack_contexts

__all__ = [
    "BUILTIN_TEMPLATES",
    "EXTRA_METRICS",
    "METRIC_JUDGES",
    "REFERENCE_METRICS",
    "SCORE_SOURCES",
    "CorrectnessJudge",
    "FaithfulnessJudge",
    "JudgeTemplate",
    "MlflowCorrectnessJudge",
    "PairVerdict",
    "ParsedScore",
    "RelevancyJudge",
    "ScoreFrom",
    "SideBySideJudge",
    "build_judge",
    "build_metric",
    "build_mlflow_correctness",
    "build_paired_judge",
    "check_score_from",
    "correctness_schema",
    "expected_score_from_logprobs",
    "get_template",
    "judge_template",
    "make_extra_metrics",
    "pack_contexts",
    "parse_score",
    "parse_yes_no",
    "parse_yes_no_verdict",
    "score_distribution",
]
