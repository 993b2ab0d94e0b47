"""What the commands built on an experiment read from it: its config, dataset, program, judge and clients.

:class:`opro.experiment.Experiment` is the composition root (it builds everything and imports the
modules that run on it), so :mod:`opro.heldout.compare`, :mod:`opro.calibration.calibrate` and
:mod:`opro.tracking.evaluations` are typed against this protocol instead of importing it back.
``Experiment`` satisfies it as it is; a test may hand over any object with these members.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from opro.config import OproConfig
    from opro.data.dataset import Embed, GoldenDataset
    from opro.judges.correctness import CorrectnessJudge
    from opro.llm.cache import CallCache
    from opro.llm.client import ChatClient, UsageLedger
    from opro.llm.pool import ModelSpec
    from opro.program.cost import CostModel
    from opro.program.factory import FactoryProgram
    from opro.program.prompts import QATemplate
    from opro.program.rag import RAGProgram
    from opro.search.ledger import DecisionLedger


class Workbench(Protocol):
    """An experiment's parts, built on first use (read-only here: the experiment owns them)."""

    @property
    def config(self) -> OproConfig: ...
    @property
    def dataset(self) -> GoldenDataset:
        """The split golden dataset."""
        ...
    @property
    def dataset_dir(self) -> Path: ...
    @property
    def program(self) -> RAGProgram | FactoryProgram: ...
    @property
    def judge(self) -> CorrectnessJudge: ...
    @property
    def cache(self) -> CallCache | None:
        """The shared call cache (None when ``[experiment].cache`` is off)."""
        ...
    @property
    def usage(self) -> UsageLedger: ...
    @property
    def progress(self) -> bool: ...
    @property
    def decisions(self) -> DecisionLedger:
        """The user's decision ledger (and its copy beside the dataset): validation decisions and promotion
        attempts, shared by every output folder and copy of that dataset."""
        ...

    def client(self, role: str, *, task_model: str | None = None) -> ChatClient:
        """The chat client of ``role`` ("task", "judge", ...), over the shared cache and ledger; with
        ``task_model``, the client of the task model the config calls so."""
        ...

    def cost_model(self, names: Sequence[str] = ()) -> CostModel:
        """What an answer costs when the task models in play and ``names`` may answer."""
        ...

    def spec(self, role: str) -> ModelSpec: ...

    def template(self, instruction: str) -> QATemplate:
        """The QA template with ``instruction`` in the configured position."""
        ...

    def candidate_template(self, name: str) -> QATemplate:
        """The whole configuration of the search's candidate called ``name`` (its instruction and its
        settings, :mod:`opro.program.configurations`); the instruction ``name`` where no search knows it."""
        ...

    def run_params(self) -> dict[str, Any]:
        """Everything that defines the run, for MLflow (no secrets)."""
        ...

    def paraphrase_embed(self) -> Embed | None:
        """Embeds questions for the paraphrase checks (split and held-out guard) where
        ``[rag.embeddings]`` is configured; None elsewhere (the lexical checks only)."""
        ...


__all__ = ["Workbench"]
