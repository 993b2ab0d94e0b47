"""opro: Optimization by PROmpting for retrieval-augmented question answering.

The public names below are imported lazily (PEP 562), so ``import opro`` stays fast and a user of
the OpenAI backend never loads llama.cpp, MLflow or LlamaIndex before they need them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # models and calls
    "LLM": "opro.llm",
    "ChatClient": "opro.llm",
    "Completion": "opro.llm",
    "Message": "opro.llm",
    "UsageLedger": "opro.llm",
    "CallCache": "opro.llm.cache",
    "ScriptedLLM": "opro.llm.scripted",
    "ModelSpec": "opro.llm.pool",
    "ModelPool": "opro.llm.pool",
    # configuration and the main job
    "OproConfig": "opro.config",
    "load_config": "opro.config",
    "Experiment": "opro.experiment",
    "optimize": "opro.workflows.optimize",
    "Search": "opro.search",
    "OptimizationResult": "opro.search",
    "RunResult": "opro.experiment",
    "OptimizeRun": "opro.workflows.optimize",
    "CandidateRecord": "opro.search",
    # the RAG program and its data
    "QATemplate": "opro.program.prompts",
    "Demo": "opro.program.prompts",
    "DEFAULT_INSTRUCTION": "opro.program.prompts",
    "DEFAULT_BASE_TEMPLATE": "opro.program.prompts",
    "load_documents": "opro.data.documents",
    "build_retriever": "opro.program.retrieval",
    "RAGProgram": "opro.program.rag",
    "Example": "opro.data.dataset",
    "GoldenDataset": "opro.data.dataset",
    "load_dataset": "opro.data.dataset",
    "generate_dataset": "opro.data.generation",
    # judging, comparing, exporting
    "CorrectnessJudge": "opro.judges",
    "FaithfulnessJudge": "opro.judges",
    "RelevancyJudge": "opro.judges",
    "MetricResult": "opro.judges.metrics",
    "evaluate_examples": "opro.evaluation.batch",
    "resolve_prompt": "opro.export.sources",
    "compare_prompts": "opro.heldout.compare",
    "export_prompt": "opro.export",
    # errors
    "OproError": "opro.errors",
    "ConfigError": "opro.errors",
    "DataError": "opro.errors",
    "ModelPackError": "opro.errors",
    "PromptError": "opro.errors",
    "LeakageError": "opro.errors",
    "LLMError": "opro.errors",
}

__all__ = [
    "DEFAULT_BASE_TEMPLATE",
    "DEFAULT_INSTRUCTION",
    "LLM",
    "CallCache",
    "CandidateRecord",
    "ChatClient",
    "Completion",
    "ConfigError",
    "CorrectnessJudge",
    "DataError",
    "Demo",
    "Example",
    "Experiment",
    "FaithfulnessJudge",
    "GoldenDataset",
    "LLMError",
    "LeakageError",
    "Message",
    "MetricResult",
    "ModelPackError",
    "ModelPool",
    "ModelSpec",
    "OproConfig",
    "OproError",
    "OptimizationResult",
    "OptimizeRun",
    "PromptError",
    "QATemplate",
    "RAGProgram",
    "RelevancyJudge",
    "RunResult",
    "ScriptedLLM",
    "Search",
    "UsageLedger",
    "build_retriever",
    "compare_prompts",
    "evaluate_examples",
    "export_prompt",
    "generate_dataset",
    "load_config",
    "load_dataset",
    "load_documents",
    "optimize",
    "resolve_prompt",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'opro' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from opro.config import OproConfig, load_config
    from opro.data.dataset import Example, GoldenDataset, load_dataset
    from opro.data.documents import load_documents
    from opro.data.generation import generate_dataset
    from opro.errors import (
        ConfigError,
        DataError,
        LeakageError,
        LLMError,
        ModelPackError,
        OproError,
        PromptError,
    )
    from opro.evaluation.batch import evaluate_examples
    from opro.experiment import Experiment, RunResult
    from opro.export import export_prompt
    from opro.export.sources import resolve_prompt
    from opro.heldout.compare import compare_prompts
    from opro.judges import CorrectnessJudge, FaithfulnessJudge, RelevancyJudge
    from opro.judges.metrics import MetricResult
    from opro.llm import LLM, ChatClient, Completion, Message, UsageLedger
    from opro.llm.cache import CallCache
    from opro.llm.pool import ModelPool, ModelSpec
    from opro.llm.scripted import ScriptedLLM
    from opro.program.prompts import DEFAULT_BASE_TEMPLATE, DEFAULT_INSTRUCTION, Demo, QATemplate
    from opro.program.rag import RAGProgram
    from opro.program.retrieval import build_retriever
    from opro.search import CandidateRecord, OptimizationResult, Search
    from opro.workflows.optimize import OptimizeRun, optimize
