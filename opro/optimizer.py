"""The OPRO loop: propose instructions with a meta-prompt, score them with a judge, keep the history.

Every candidate is an Optuna trial (instruction and step as attributes, mean judge score as the
value) in a study whose storage may be a local SQLite file or a shared RDB. Candidates of a step are
evaluated in lockstep minibatches, question-major, so that (a) the running mean of every candidate is
reported after each minibatch and a pruner can stop clearly worse ones, and (b) consecutive task
calls share the retrieved context, which a llama.cpp backend reuses as a KV prefix when the
instruction sits after the query.

Resume: proposals are stored in the study before they are evaluated and finished trials are read
back on start, so re-running an interrupted optimization re-evaluates nothing that finished and the
call cache makes the replay of a half-evaluated candidate free.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import optuna

from opro.claims import RETRY_STATUSES as RETRY_STATUSES  # where it was defined before; re-exported
from opro.config import OptimizerSection
from opro.engine import EvaluationEngine, Gate, Pair, Scored, answer_then_judge, role_limit
from opro.errors import ConfigError, LLMError, OproError
from opro.evaluation import Judge, Program, QAExample
from opro.exemplars import ExemplarOutcome, ExemplarPicker
from opro.llm import ChatClient, Request, UsageLedger
from opro.locking import waiting_lock
from opro.metaprompt import (
    Exemplar,
    MetaPromptBuilder,
    ScoredInstruction,
    check_candidate,
    extract_candidate,
    normalize_instruction,
)
from opro.progress import progress_bar
from opro.redaction import redact_url

if TYPE_CHECKING:
    from opro.recorders import Recorder

logger = logging.getLogger(__name__)

#: How often, at most, a worker waiting on the study looks again (proposals, other workers' candidates):
#: each second of polling is a second both workers may sit idle at every step's end.
_MAX_POLL_S = 0.2

OptimizerSettings = OptimizerSection
CandidateStatus = Literal["complete", "pruned", "budget", "failed", "incomplete"]


@dataclass(frozen=True)
class CandidateRecord:
    """One evaluated instruction."""

    step: int
    instruction: str
    score: float | None
    n_scored: int
    n_invalid: int
    n_errors: int
    status: CandidateStatus
    trial_number: int
    scores: tuple[float | None, ...] = ()
    #: Position among the step's proposals: the order of the history and the tie-breaker, whichever
    #: worker evaluated the candidate and whatever its trial number.
    index: int = 0

    @property
    def pruned(self) -> bool:
        return self.status != "complete"

    @property
    def partial(self) -> bool:
        """Stopped by the pruner: ``score`` is a running mean over the questions it was asked."""
        return self.status == "pruned"


@dataclass(frozen=True)
class FinalistRecord:
    """A finalist of the search re-scored on the validation split, paired with the initial instruction."""

    instruction: str
    trial_number: int
    search_score: float
    validation_score: float | None
    validation_ci: tuple[float, float] | None
    #: Mean of (finalist - initial) over the validation questions both scored validly.
    difference: float | None
    difference_ci: tuple[float, float] | None
    n_pairs: int
    #: The larger of the one-sided (finalist better) Wilcoxon and permutation p-values, before and after Holm.
    p_value: float
    p_adjusted: float
    significant: bool
    scores: tuple[float | None, ...] = ()


@dataclass(frozen=True)
class ValidationResult:
    """The validation stage: the initial instruction and the finalists on the same questions."""

    n_questions: int
    alpha: float
    initial_score: float | None
    initial_ci: tuple[float, float] | None
    initial_scores: tuple[float | None, ...]
    finalists: tuple[FinalistRecord, ...]
    winner: FinalistRecord | None
    verdict: str


@dataclass(frozen=True)
class OptimizationResult:
    """What a search returns. ``best_score`` is measured on ``score_basis`` data (see ``score_label``).

    With a validation stage, ``best_instruction`` is a finalist only if it beat the initial
    instruction on the validation questions by a paired test (Holm-corrected over the finalists);
    otherwise it is the initial instruction and ``gain`` is ``None``.
    """

    best_instruction: str
    best_template: str
    best_score: float
    initial_instruction: str
    initial_score: float | None
    history: tuple[CandidateRecord, ...]
    usage: dict[str, dict[str, Any]]
    stopped_reason: str
    mlflow_run_id: str | None
    study_name: str
    storage: str
    wall_s: float
    output_dir: Path | None = None
    #: "validation": held out from the search; "search": the in-sample mean the search maximized.
    score_basis: Literal["validation", "search"] = "search"
    best_score_ci: tuple[float, float] | None = None
    #: The returned instruction's mean on the optimization questions (in-sample, optimistic).
    best_search_score: float | None = None
    #: Paired validation difference to the initial instruction, only when it is significant.
    gain: float | None = None
    gain_ci: tuple[float, float] | None = None
    validation: ValidationResult | None = None
    rejected: tuple[dict[str, str], ...] = ()

    @property
    def validated(self) -> bool:
        return self.gain is not None

    @property
    def score_label(self) -> str:
        if self.score_basis == "validation" and self.validation is not None:
            return f"validation score ({self.validation.n_questions} questions not used by the search)"
        return "search score (in-sample: the questions the search selected on; optimistic)"

    def headline(self) -> str:
        """One honest sentence: what was returned, on which data, and whether a gain is supported."""
        ci = f" [{self.best_score_ci[0]:.2f}, {self.best_score_ci[1]:.2f}]" if self.best_score_ci else ""
        score = f"{self.best_score:.2f}{ci} ({self.score_label})"
        if self.validation is None:
            return f"best instruction by search score {score}; no validation stage, so no gain is claimed"
        return f"{self.validation.verdict}; returned instruction: {score}"

    def summary(self) -> dict[str, Any]:
        v = self.validation
        return {
            "best_instruction": self.best_instruction,
            "best_template": self.best_template,
            "best_score": self.best_score,
            "score_basis": self.score_basis,
            "score_label": self.score_label,
            "best_score_ci": list(self.best_score_ci) if self.best_score_ci else None,
            "best_search_score": self.best_search_score,
            "gain": self.gain,
            "gain_ci": list(self.gain_ci) if self.gain_ci else None,
            "validated": self.validated,
            "headline": self.headline(),
            "initial_instruction": self.initial_instruction,
            "initial_score": self.initial_score,
            "validation": None if v is None else {
                **{k: val for k, val in asdict(v).items() if k not in ("finalists", "winner")},
                "finalists": [asdict(f) for f in v.finalists],
                "winner": None if v.winner is None else v.winner.instruction,
            },
            "n_candidates": len(self.history),
            "n_pruned": sum(1 for r in self.history if r.status == "pruned"),
            "rejected": list(self.rejected),
            "stopped_reason": self.stopped_reason,
            "mlflow_run_id": self.mlflow_run_id,
            "study_name": self.study_name,
            "usage": self.usage,
            "wall_s": round(self.wall_s, 2),
        }

    def rich_table(self, *, title: str) -> Any:
        """Initial, finalists and the returned instruction: search score beside validation score."""
        from rich.markup import escape
        from rich.table import Table

        table = Table(title=title)
        table.add_column("")
        table.add_column("search score\n(in-sample)", justify="right")
        table.add_column("validation score\n[95% CI]", justify="right")
        table.add_column("vs initial\n(Holm p)", justify="right")
        table.add_column("instruction")

        def fmt(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.2f}"

        def with_ci(x: float | None, ci: tuple[float, float] | None) -> str:
            return fmt(x) + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")

        v = self.validation
        if v is None:
            table.add_row("initial", fmt(self.initial_score), "-", "-", escape(self.initial_instruction))
            table.add_row("best (search)", fmt(self.best_search_score), "-", "not validated", escape(self.best_instruction))
            return table
        table.add_row("initial", fmt(self.initial_score), with_ci(v.initial_score, v.initial_ci), "",
                      escape(self.initial_instruction), style="bold" if not self.validated else None)
        for i, f in enumerate(v.finalists, start=1):
            diff = "n/a" if f.difference is None else f"{f.difference:+.2f} (p={f.p_adjusted:.2g})"
            returned = v.winner is not None and f.instruction == v.winner.instruction
            table.add_row(f"finalist {i}" + (" *" if returned else ""), fmt(f.search_score),
                          with_ci(f.validation_score, f.validation_ci), diff, escape(f.instruction),
                          style="bold" if returned else None)
        return table

    def usage_table(self) -> Any:
        """Calls, cache hits, tokens and wall time per role."""
        from rich.table import Table

        usage = Table(title="LLM usage by role")
        for col in ("role", "calls", "cache hits", "prompt tok", "completion tok", "wall s"):
            usage.add_column(col, justify="right")
        for role, u in self.usage.items():
            usage.add_row(role, str(u["calls"]), str(u["cache_hits"]), str(u["prompt_tokens"]),
                          str(u["completion_tokens"]), f"{u['wall_s']:.1f}")
        return usage


def _step_of(trial: optuna.trial.FrozenTrial) -> int:
    return int(trial.user_attrs.get("step", 0))


def _complete_before(study: optuna.Study, step: int) -> list[optuna.trial.FrozenTrial]:
    """Complete candidates of the steps before ``step``: what a pruning decision may compare with.

    Candidates of the same step are left out: which of them finished first depends on timing and on
    how many workers share the step, and a decision must not.
    """
    return [
        t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if t.value is not None and _step_of(t) < step
    ]


@dataclass(frozen=True)
class RunningCandidate:
    """What a pruning decision reads of a candidate being evaluated: its running means by minibatch
    and its per-question scores so far (None: not validly scored)."""

    intermediate_values: Mapping[int, float]
    scores: Sequence[float | None]

    @property
    def last_step(self) -> int | None:
        return max(self.intermediate_values) if self.intermediate_values else None

    @classmethod
    def of(cls, trial: optuna.trial.FrozenTrial) -> RunningCandidate:
        return cls(dict(trial.intermediate_values), list(trial.user_attrs.get("scores") or []))


class EarlierStepsPruner(optuna.pruners.BasePruner):
    """A pruner whose decision reads only the candidate and the complete candidates of earlier steps.

    So the optimizer decides in-process (:meth:`decide`, with the earlier steps read once per step)
    and writes the reports to the study beside the requests; Optuna's ``prune`` gives the same answer
    from the study.
    """

    def decide(self, candidate: RunningCandidate, earlier: Sequence[optuna.trial.FrozenTrial]) -> bool:
        raise NotImplementedError

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        return self.decide(RunningCandidate.of(trial), _complete_before(study, _step_of(trial)))


def _rank(t: optuna.trial.FrozenTrial) -> tuple[float, int, int]:
    """Best first by value, ties to the earlier step, then the lower proposal index (not trial number)."""
    return (float(t.value or 0.0), -_step_of(t), -int(t.user_attrs.get("index", 0)))


class BestSoFarPruner(EarlierStepsPruner):
    """Prune a candidate whose running mean is ``margin`` below the best candidate of earlier steps.

    ``warmup`` minibatches are always run, so one unlucky question cannot end a candidate.
    """

    def __init__(self, *, margin: float = 0.5, warmup: int = 1) -> None:
        self.margin = margin
        self.warmup = warmup

    def decide(self, candidate: RunningCandidate, earlier: Sequence[optuna.trial.FrozenTrial]) -> bool:
        step = candidate.last_step
        if step is None or step + 1 < self.warmup:
            return False
        finished = [float(t.value) for t in earlier if t.value is not None]
        if not finished:
            return False
        return candidate.intermediate_values[step] < max(finished) - self.margin


class EarlierStepsMedianPruner(EarlierStepsPruner):
    """Optuna's median rule over the candidates of earlier steps: prune when the best running mean so
    far is below the median of their running means after the same minibatch."""

    def __init__(self, *, warmup: int = 1) -> None:
        self.warmup = warmup

    def decide(self, candidate: RunningCandidate, earlier: Sequence[optuna.trial.FrozenTrial]) -> bool:
        step = candidate.last_step
        if step is None or step + 1 < self.warmup:
            return False
        others = [t.intermediate_values[step] for t in earlier if step in t.intermediate_values]
        others = [v for v in others if not math.isnan(v)]
        if not others:
            return False
        import numpy as np

        best = max(v for k, v in candidate.intermediate_values.items() if k <= step)
        return bool(best < float(np.median(others)))


def validation_prompts(initial: str, finalists: Sequence[str]) -> list[tuple[str, str]]:
    """(label, instruction) of a validation stage: ``initial``, then ``finalist 1``, ``finalist 2``..."""
    return [("initial", initial), *((f"finalist {i}", f) for i, f in enumerate(finalists, start=1))]


def check_worker_spec(worker_index: int, num_workers: int) -> None:
    """Refuse a ``--worker I/N`` that names no worker (``0/0``, ``2/2``), saying what to write instead."""
    if num_workers < 1:
        raise ConfigError(
            f"--worker {worker_index}/{num_workers}: N is the number of workers sharing the study and must be "
            ">= 1 (for one process leave --worker out, for two start --worker 0/2 and --worker 1/2)"
        )
    if not 0 <= worker_index < num_workers:
        raise ConfigError(
            f"--worker {worker_index}/{num_workers}: the index I must be within 0..{num_workers - 1} "
            f"(workers are numbered from 0: --worker 0/{num_workers} to --worker {num_workers - 1}/{num_workers})"
        )


def paired_valid(a: Sequence[float | None], b: Sequence[float | None]) -> tuple[list[float], list[float]]:
    """The scores of ``a`` and ``b`` on the questions (positions) both scored validly."""
    pairs = [(x, y) for x, y in zip(a, b, strict=False) if x is not None and y is not None]
    return [x for x, _ in pairs], [y for _, y in pairs]


class RacingPruner(EarlierStepsPruner):
    """Stop a candidate once it is confidently worse than the incumbent on the same questions.

    The incumbent is the best complete candidate of an *earlier* step, so a decision never depends
    on which candidate of the same step (or which worker) finished first. After ``warmup``
    minibatches and at least ``min_pairs`` paired questions, the candidate is stopped when the
    one-sided ``confidence`` upper bound of the mean paired difference (Student t, with the spread
    floored at ``noise_floor`` because a few equal differences would otherwise give zero width) is
    below zero. The per-question scores are read from the trials' ``scores`` attribute.
    """

    def __init__(
        self, *, confidence: float = 0.95, warmup: int = 1, min_pairs: int = 3, noise_floor: float = 0.5
    ) -> None:
        self.confidence = confidence
        self.warmup = warmup
        self.min_pairs = min_pairs
        self.noise_floor = noise_floor

    def upper_bound(self, differences: Sequence[float]) -> float:
        from scipy.stats import t

        n = len(differences)
        mean = sum(differences) / n
        sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / (n - 1)) if n > 1 else 0.0
        return mean + float(t.ppf(self.confidence, n - 1)) * max(sd, self.noise_floor) / math.sqrt(n)

    def decide(self, candidate: RunningCandidate, earlier: Sequence[optuna.trial.FrozenTrial]) -> bool:
        step = candidate.last_step
        if step is None or step + 1 < self.warmup:
            return False
        if not earlier:
            return False
        incumbent = max(earlier, key=_rank)
        a, b = paired_valid(candidate.scores, incumbent.user_attrs.get("scores") or [])
        if len(a) < max(2, self.min_pairs):
            return False
        return self.upper_bound([x - y for x, y in zip(a, b, strict=True)]) < 0.0


def make_pruner(settings: OptimizerSettings) -> EarlierStepsPruner | optuna.pruners.NopPruner:
    if settings.pruner == "none":
        return optuna.pruners.NopPruner()
    if settings.pruner == "median":
        return EarlierStepsMedianPruner(warmup=settings.prune_warmup_minibatches)
    if settings.pruner == "best":
        return BestSoFarPruner(margin=settings.prune_margin, warmup=settings.prune_warmup_minibatches)
    return RacingPruner(confidence=settings.race_confidence, warmup=settings.prune_warmup_minibatches)


#: Steps in a row whose samples were all rejected (repeats, invalid) before the search stops.
_MAX_STEPS_WITHOUT_CANDIDATES = 3


def open_storage(url: str, *, where: str = "[tracking].optuna_storage") -> optuna.storages.BaseStorage:
    """The Optuna study store at ``url``; a :class:`ConfigError` naming ``where`` (URL redacted) when it
    cannot be opened: a missing driver, a database that does not answer, a file that is not SQLite.

    SQLite runs in WAL mode with ``synchronous=NORMAL``: the search writes a few attributes per
    candidate and minibatch, and a full fsync each (tens of ms) would stall the requests. A commit
    still survives a killed process; only a power cut can lose the last ones."""
    from sqlalchemy import event
    from sqlalchemy.exc import (
        ArgumentError,
        DatabaseError,
        IntegrityError,
        NoSuchModuleError,
        OperationalError,
    )

    sqlite = url.startswith("sqlite:///")
    if sqlite:
        path = Path(url.removeprefix("sqlite:///"))
        if path.is_dir():
            raise ConfigError(f"{where} = {url!r} names a folder: name a database file in it (.../optuna.db)")
        path.parent.mkdir(parents=True, exist_ok=True)  # an OSError names the path in the CLI
    for attempt in range(5):
        try:
            # Schema creation of a SQLite file happens under a file lock (as the MLflow store's), so
            # processes and threads starting together do not race on it; a server retries below.
            with waiting_lock(path.with_name(path.name + ".lock")) if sqlite else contextlib.nullcontext():
                storage = optuna.storages.RDBStorage(
                    url, engine_kwargs={"connect_args": {"timeout": 60}} if sqlite else None
                )
            break
        except (OperationalError, IntegrityError) as exc:
            # Workers starting together race to create the schema: the loser sees a table that now
            # exists (OperationalError), a locked database, or the winner's alembic_version row
            # (IntegrityError: UNIQUE constraint failed), and retries against the finished schema. A
            # database that does not answer fails the same way every time.
            if attempt < 4:
                time.sleep(0.5 * (attempt + 1))
                continue
            why = str(exc.orig or exc).strip().splitlines()[0]
            hint = (
                "another process kept changing its schema; run again once it has started"
                if isinstance(exc, IntegrityError)
                else "check that the database server is up and the URL's host, port, user and database"
            )
        except (ImportError, ArgumentError, NoSuchModuleError) as exc:
            why, hint = str(exc), (
                "for PostgreSQL install the driver (pip install 'opro[postgres]') and name it in the URL "
                "(postgresql+psycopg2://...)"
            )
        except (DatabaseError, RuntimeError) as exc:  # not a database; or a schema of another Optuna
            why = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
            hint = "point it at a new file, or move that file away (`optuna storage upgrade` for an older study)"
        raise ConfigError(f"cannot open the Optuna study store {redact_url(url)} ({where}): {why}; {hint}") from None
    if sqlite:

        def pragmas(conn: Any, _record: Any) -> None:
            cursor = conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        event.listen(storage.engine, "connect", pragmas)
        storage.engine.dispose()  # connections opened while creating the schema get the pragmas too
    return storage


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass
class _Part:
    """Questions ``lo``..``hi`` of a split candidate (whoever owns it), claimed by this worker."""

    index: int
    part: int
    lo: int
    hi: int
    instruction: str
    template: Any
    trial: optuna.trial.Trial
    got: dict[int, float | LLMError | None] = field(default_factory=dict)
    lost: bool = False


#: A part's outcome of a call that failed, as stored in the study ("error") and read back.
_PART_ERROR = "error"


def _part_outcome(value: Any) -> float | LLMError | None:
    if value == _PART_ERROR:
        return LLMError("a call of this question failed on the worker that evaluated it")
    return None if value is None else float(value)


@dataclass
class _Live:
    """A candidate being evaluated in the current step."""

    instruction: str
    trial: optuna.trial.Trial
    template: Any = None
    index: int = 0
    #: Another worker took this candidate over (this one's heartbeat was missed): its results are dropped.
    lost: bool = False
    #: Results by question index as they arrive (a score, None for an invalid judgment, or the error).
    got: dict[int, float | LLMError | None] = field(default_factory=dict)
    #: Minibatches whose running mean was reported (the prefix of questions in ``scores``).
    reported: int = 0
    #: Running mean after each reported minibatch (what the study's intermediate values will hold).
    means: dict[int, float] = field(default_factory=dict)
    scores: list[float | None] = field(default_factory=list)
    n_errors: int = 0
    status: CandidateStatus = "complete"
    #: Questions per part when the candidate is split among the workers (0: this worker asks them all).
    split: int = 0

    def mean(self) -> float | None:
        valid = [s for s in self.scores if s is not None]
        return sum(valid) / len(valid) if valid else None

    def n_valid(self) -> int:
        return sum(1 for s in self.scores if s is not None)


class OPROOptimizer:
    """Optimize the instruction of a QA template. Settings here; program and data in :meth:`optimize`."""

    def __init__(
        self,
        *,
        optimizer_llm: ChatClient,
        judge: Judge,
        make_template: Callable[[str], Any],
        template_text: Callable[[Any], str],
        settings: OptimizerSettings | None = None,
        storage: str,
        study_name: str,
        seed: int = 0,
        usage: UsageLedger | None = None,
        task_workers: int = 1,
        judge_workers: int | None = None,
        worker_index: int = 0,
        num_workers: int = 1,
        worker_timeout_s: float = 3600.0,
        progress: bool = True,
        fingerprint: Mapping[str, str] | None = None,
        recorders: Sequence[Recorder] = (),
    ) -> None:
        check_worker_spec(worker_index, num_workers)
        self.optimizer_llm = optimizer_llm
        self.judge = judge
        self.make_template = make_template
        self.template_text = template_text
        self.settings = settings or OptimizerSettings()
        self.storage = storage
        self.study_name = study_name
        self.seed = seed
        self.usage = usage or optimizer_llm.usage
        self.task_workers = max(1, task_workers)
        #: None: the judge backend's max_concurrency (what its endpoint accepts).
        self.judge_workers = None if judge_workers is None else max(1, judge_workers)
        self._engine: EvaluationEngine | None = None
        self.worker_index = worker_index
        self.num_workers = num_workers
        self.worker_timeout_s = worker_timeout_s
        self.progress = progress
        #: What the search leaves behind (run directory, MLflow, ...), called in this order.
        self.recorders = tuple(recorders)
        self.fingerprint = dict(fingerprint or {})
        #: This process's lease token (see :meth:`optimize`): its claims on candidates carry it.
        self._token = ""
        self._abandoned = False
        self._n_questions = 0
        # Usage recorded in the study by earlier processes: budgets and totals cover the whole study.
        self._prior_usage: dict[str, dict[str, Any]] = {}
        self._others_usage: dict[str, dict[str, Any]] = {}
        self.exemplar_picker = ExemplarPicker(
            strategy=self.settings.exemplar_strategy, k=self.settings.exemplars, seed=seed
        )
        self.meta = MetaPromptBuilder(
            template_text=template_text(make_template("<INS>")),
            max_history=self.settings.max_history,
            min_score=self.settings.min_history_score,
            score_scale=self.settings.score_scale,
            answer_format=self.settings.answer_format,
        )

    # -- study helpers -----------------------------------------------------------------------
    def _study(self) -> optuna.Study:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        from sqlalchemy.exc import IntegrityError, OperationalError

        for attempt in range(5):
            try:
                return optuna.create_study(
                    storage=open_storage(self.storage),
                    study_name=self.study_name,
                    direction="maximize",
                    pruner=make_pruner(self.settings),
                    load_if_exists=True,
                )
            except (OperationalError, IntegrityError):
                # Workers starting together race to create the study; the loser retries.
                if attempt == 4:
                    raise
                time.sleep(0.5 * (attempt + 1))
        raise AssertionError("unreachable")

    @staticmethod
    def _records(study: optuna.Study) -> list[CandidateRecord]:
        out = []
        for t in study.get_trials(deepcopy=False):
            attrs = t.user_attrs
            if "instruction" not in attrs or "part" in attrs or t.state == optuna.trial.TrialState.RUNNING:
                continue  # running, or a part of a split candidate (its candidate's trial has the result)
            if t.state == optuna.trial.TrialState.FAIL and attrs.get("status") not in ("failed", "incomplete"):
                continue  # an interrupted attempt; it is re-run
            out.append(
                CandidateRecord(
                    step=int(attrs["step"]),
                    instruction=attrs["instruction"],
                    score=attrs.get("score"),
                    n_scored=int(attrs.get("n_scored", 0)),
                    n_invalid=int(attrs.get("n_invalid", 0)),
                    n_errors=int(attrs.get("n_errors", 0)),
                    status=attrs.get("status", "complete"),
                    trial_number=t.number,
                    scores=tuple(attrs.get("scores", ())),
                    index=int(attrs.get("index", 0)),
                )
            )
        # A rerun re-evaluates failed and budget-stopped candidates: the latest attempt stands.
        latest: dict[tuple[int, str], CandidateRecord] = {}
        for r in sorted(out, key=lambda r: r.trial_number):
            latest[(r.step, normalize_instruction(r.instruction))] = r
        # By (step, proposal index): the same order whichever worker evaluated what, and after restarts.
        return sorted(latest.values(), key=lambda r: (r.step, r.index, r.trial_number))

    def _fail_stale_trials(self, study: optuna.Study) -> None:
        """Trials this worker left RUNNING when it was interrupted: mark them failed, they are re-run."""

        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            if t.user_attrs.get("worker") == self.worker_index:
                study.tell(t.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)

    # -- proposals ---------------------------------------------------------------------------
    def _exemplar_outcome(self, program: Program, instruction: str, exemplar: Exemplar) -> ExemplarOutcome:
        """An exemplar answered with ``instruction`` and judged, for the feedback-aware strategies."""
        pair = Pair(key="exemplar", index=0, template=self.make_template(instruction),
                    example={"query": exemplar.query, "reference_answer": exemplar.answer})
        scored = answer_then_judge(program=program, judge=self.judge, pair=pair)  # permanent errors raise
        row = scored.row
        if scored.error is not None:
            logger.warning("exemplar %r: %s", exemplar.query[:60], scored.error)
            return ExemplarOutcome(answer="", score=None, passing=None)
        if row.invalid:
            return ExemplarOutcome(answer=row.answer, score=None, passing=None)
        return ExemplarOutcome(answer=row.answer, score=row.score, passing=row.passing, reason=row.feedback)

    def _propose(
        self,
        study: optuna.Study,
        step: int,
        history: Sequence[CandidateRecord],
        exemplar_pool: Sequence[Exemplar],
        program: Program | None = None,
    ) -> list[str]:
        key = f"proposals:{step}"
        stored = study.user_attrs.get(key)
        if stored is not None:
            return list(stored)
        # Pruned candidates stay visible with their running mean, marked partial.
        scored = [
            ScoredInstruction(
                r.instruction, r.score, partial=r.partial, n_scored=len(r.scores), n_total=self._n_questions
            )
            for r in history
            if r.score is not None and r.status in ("complete", "pruned")
        ]
        complete = [r for r in history if r.status == "complete" and r.score is not None]
        best = max(complete, key=lambda r: (r.score, -r.step, -r.index)).instruction if complete else None
        exemplars = self.exemplar_picker.pick(
            exemplar_pool, step=step, best_instruction=best,
            scorer=None if program is None else (lambda ins, ex: self._exemplar_outcome(program, ins, ex)),
        )
        meta_prompt = self.meta.render(history=scored, exemplars=exemplars)
        for recorder in self.recorders:
            recorder.on_meta_prompt(step=step, text=meta_prompt)
        seen = {normalize_instruction(r.instruction) for r in history}
        accepted: list[str] = []
        rejected: list[dict[str, str]] = []
        k = self.settings.candidates_per_step
        # k samples at once, then as many more as were rejected, read in index order: the same indices
        # and the same accepted candidates as asking one at a time. A few extra samples make up for
        # rejected candidates; bounded so a bad optimizer cannot loop.
        asked = 0
        while len(accepted) < k and asked < 3 * k:
            want = min(k - len(accepted), 3 * k - asked)
            indices = [step * 1000 + asked + j for j in range(want)]
            if asked == 0:
                replies = self._shared_samples(study, step, meta_prompt, indices)
            else:  # the few top-ups for rejected samples: this worker alone
                replies = self._ask_samples(meta_prompt, indices)
            asked += want
            for reply in replies:
                verdict = check_candidate(
                    extract_candidate(reply, answer_format=self.settings.answer_format),
                    seen=seen,
                    max_chars=self.settings.max_instruction_chars,
                )
                if verdict.accepted:
                    accepted.append(verdict.instruction)
                    seen.add(normalize_instruction(verdict.instruction))
                else:
                    rejected.append({"instruction": verdict.instruction[:200], "reason": verdict.reason})
        study.set_user_attr(key, accepted)
        study.set_user_attr(f"rejected:{step}", rejected)
        return accepted

    def _ask_samples(self, meta_prompt: str, indices: Sequence[int]) -> list[str]:
        """The optimizer's replies to ``meta_prompt`` for these sample indices, asked concurrently."""
        return [c.text for c in self.optimizer_llm.map([
            Request(meta_prompt, temperature=self.settings.temperature, max_tokens=self.settings.max_tokens,
                    sample_index=i)
            for i in indices
        ])]

    def _shared_samples(self, study: optuna.Study, step: int, meta_prompt: str, indices: Sequence[int]) -> list[str]:
        """The texts of a step's first samples. Live workers waiting for the step's proposals ask for
        some of them (the samples dealt to the live workers in turn, by index) and store the texts in
        the study, so that N workers take 1/N of the rounds of the optimizer's concurrency; this worker
        asks for its own and for any that a helper failed, left, or is late with."""
        from opro.claims import live_workers

        live = live_workers(study.user_attrs)
        helpers = sorted(w for w in live if w != self.worker_index)
        if not helpers or len(indices) < 2:
            return self._ask_samples(meta_prompt, indices)
        order = [self.worker_index, *helpers]
        dealt = {i: order[n % len(order)] for n, i in enumerate(indices)}
        tag = _sha(meta_prompt)
        study.set_user_attr(f"sampling:{step}", {
            "tag": tag, "prompt": meta_prompt,
            "dealt": {str(i): {"worker": w, "token": live[w].get("token")} for i, w in dealt.items() if w in live},
        })
        started = time.monotonic()
        mine = [i for i in indices if dealt[i] == self.worker_index]
        texts = dict(zip(mine, self._ask_samples(meta_prompt, mine), strict=True))
        # A helper gets as long again as this worker's own share took (at least 2 s) before its
        # samples are asked for here too.
        patience = max(2.0, 2 * (time.monotonic() - started))
        poll = 0.02
        while True:
            attrs = study.user_attrs
            alive = live_workers(attrs)
            late = time.monotonic() - started > patience
            ask: list[int] = []
            for i in indices:
                if i in texts:
                    continue
                got = attrs.get(f"sample:{step}:{tag}:{i}") or {}
                held = alive.get(dealt[i]) or {}
                if "text" in got:
                    texts[i] = str(got["text"])
                elif "error" in got or late or held.get("token") != live[dealt[i]].get("token"):
                    ask.append(i)
            if ask:
                texts.update(zip(ask, self._ask_samples(meta_prompt, ask), strict=True))
            if len(texts) == len(indices):
                return [texts[i] for i in indices]
            time.sleep(poll)
            poll = min(_MAX_POLL_S, poll * 1.5)

    def _help_sample(self, study: optuna.Study, step: int, attrs: Mapping[str, Any]) -> None:
        """Ask for the samples worker 0 dealt to this worker (see :meth:`_shared_samples`; ``attrs``:
        the study's attributes as just read) and store their texts in the study (or that the call
        failed, for worker 0 to ask again)."""
        sampling = attrs[f"sampling:{step}"]
        tag, prompt = str(sampling.get("tag")), str(sampling.get("prompt"))
        mine = sorted(
            int(i) for i, d in (sampling.get("dealt") or {}).items()
            if d.get("worker") == self.worker_index and d.get("token") == self._token
            and f"sample:{step}:{tag}:{i}" not in attrs
        )
        if not mine or _sha(prompt) != tag:
            return
        try:
            got: list[dict[str, str]] = [{"text": text} for text in self._ask_samples(prompt, mine)]
        except LLMError as exc:
            logger.warning("worker %d: the optimizer samples of step %d failed here (%s); worker 0 asks again",
                           self.worker_index, step, exc)
            got = [{"error": str(exc)[:200]} for _ in mine]
        self._save_usage(study)  # first, so that worker 0, seeing the samples, counts their calls
        for i, value in zip(mine, got, strict=True):
            study.set_user_attr(f"sample:{step}:{tag}:{i}", value)

    def _await_proposals(self, study: optuna.Study, step: int) -> list[str] | None:
        """Worker 0's proposals for ``step`` (worker 0 proposes; the others ask for the samples it deals
        them, then read the proposals from the study), or None when worker 0 stopped the search before
        ``step``. Waits as long as worker 0 runs, and
        ``worker_timeout_s`` for a worker 0 that does not."""
        from opro.claims import describe_lease
        from opro.locking import lease_alive

        key = f"proposals:{step}"
        missing_since: float | None = None
        last_note = time.monotonic()
        poll = 0.05
        helped: object = None  # the dealing this worker helped with
        while True:
            attrs = study.user_attrs
            if key in attrs:
                return list(attrs[key])
            sampling = attrs.get(f"sampling:{step}")
            if isinstance(sampling, dict) and sampling != helped:
                self._help_sample(study, step, attrs)
                helped, poll = sampling, 0.05
                continue
            held = attrs.get("holder:w0") or {}
            stop = attrs.get(f"stopped:{step}") or {}
            if stop.get("token") and stop["token"] in (held.get("token"), held.get("released")):
                logger.info("worker %d: worker 0 stopped the search before step %d (%s)", self.worker_index, step,
                            stop.get("reason"))
                return None
            now = time.monotonic()
            if lease_alive(held):
                missing_since = None
            elif missing_since is None:
                missing_since = now
            elif now - missing_since > self.worker_timeout_s:
                self._abandoned = True
                raise OproError(
                    f"worker {self.worker_index}: waited {self.worker_timeout_s:.0f} s for the proposals of step {step}, "
                    f"but {describe_lease(0, held, now=time.time())} is not running: start it (`opro optimize CONFIG "
                    f"--worker 0/{self.num_workers}` resumes the study) and rerun this worker; finished work is kept. "
                    "[tracking].worker_wait_s sets how long a worker waits for a missing one"
                )
            if now - last_note > 30:
                logger.warning("worker %d: waiting for the proposals of step %d from %s", self.worker_index, step,
                               describe_lease(0, held, now=time.time()))
                last_note = now
            time.sleep(poll)
            poll = min(_MAX_POLL_S, poll * 1.5)

    def _evaluate_claimed(
        self, study: optuna.Study, step: int, proposals: Sequence[str], program: Program, examples: Sequence[QAExample]
    ) -> list[CandidateRecord]:
        """Claim and evaluate candidates of ``step`` until every proposal has a result, by this worker
        or another; claims of stopped workers are taken over. Returns this worker's new records."""
        from opro.claims import claim, describe_lease, live_workers, part_state, release_stale, step_state

        n = len(proposals)
        mine: list[CandidateRecord] = []
        poll, last_note = 0.05, time.monotonic()
        # Only earlier steps decide pruning, so whether this step can prune is known before it starts.
        can_prune = self._pruning(study, step) is not None
        # A step that cannot prune (step 0, or the pruner off) with fewer candidates than workers is
        # shared question by question: its candidates are split into parts, claimed one at a time
        # (by the number of workers the study was started for: the others may not have started yet).
        splittable = not self._budgeted and not can_prune
        part_size = max(self.settings.minibatch_size, math.ceil(len(examples) / 8))

        def split(won: list[tuple[int, str, optuna.trial.Trial]]) -> list[tuple[int, str, optuna.trial.Trial]]:
            if splittable and n < max(self.num_workers, len(live_workers(study.user_attrs))):
                for _, _, trial in won:
                    trial.set_user_attr("parts", part_size)
            return won

        while True:
            state = step_state(study, step, proposals)
            if release_stale(study, state):
                continue
            free = state.free(n)
            if free:
                # With other workers: first as many candidates as keep this worker's slots busy, then
                # one more whenever a slot would idle (a pruned candidate, a minibatch waiting for
                # its last judgment), so workers whose candidates end early take more of the step.
                # Each starts at its own place in the free list, so that workers rarely reach for the
                # same candidates. Alone (or with a budget, which checks minibatches in order) it
                # takes its even share at once.
                workers = max(1, len(live_workers(study.user_attrs)))
                share = max(1, math.ceil(n / workers))
                refill = workers > 1 and not self._budgeted
                if refill:
                    width = min(len(examples), self.settings.minibatch_size) if can_prune else len(examples)
                    slots = self._engine_for(program).task_slots
                    share = min(share, math.ceil(slots / max(1, width)) + 1)
                start = (self.worker_index * share) % len(free)
                take = sorted((free[start:] + free[:start])[:share])
                won = split(claim(study, step=step, items=[(i, proposals[i]) for i in take], token=self._token,
                                  worker=self.worker_index))

                def claim_next() -> list[tuple[int, str, optuna.trial.Trial]]:
                    while True:
                        state = step_state(study, step, proposals)
                        free = state.free(n)
                        if not free:
                            return []
                        i = free[self.worker_index % len(free)]
                        got = claim(study, step=step, items=[(i, proposals[i])], token=self._token,
                                    worker=self.worker_index)
                        if got:
                            return split(got)

                if won:
                    new = self._evaluate_step(study, step, won, program, examples,
                                              claim_next=claim_next if refill else None,
                                              proposals=proposals if splittable else None)
                    mine.extend(new)
                    if new and all(r.status == "failed" and r.n_errors for r in new):
                        # The endpoint is down, not the candidates bad: stop before paying for more.
                        raise OproError(
                            f"every call of step {step} failed ({sum(r.n_errors for r in new)} errors; see the "
                            "warnings above): fix the endpoint and rerun the same command; finished work is kept "
                            "and the failed candidates are evaluated again"
                        )
                    poll = 0.05
                continue
            if len(state.done) >= n:
                return mine
            if splittable and part_state(study, step, proposals).free(len(examples)):
                # Every candidate is taken, but a split one has parts left: help with those.
                self._evaluate_step(study, step, [], program, examples, proposals=proposals)
                poll = 0.05
                continue
            now = time.monotonic()
            if now - last_note > 30:
                attrs = study.user_attrs
                who = sorted({int(t.user_attrs.get("worker", -1)) for t in state.claimed.values()})
                logger.warning(
                    "worker %d: step %d waits for %d candidate(s) of %s", self.worker_index, step, len(state.claimed),
                    ", ".join(describe_lease(w, attrs.get(f"holder:w{w}") or {}, now=time.time()) for w in who),
                )
                last_note = now
            time.sleep(poll)
            poll = min(_MAX_POLL_S, poll * 1.5)

    # -- evaluation --------------------------------------------------------------------------
    def study_usage(self) -> dict[str, dict[str, Any]]:
        """Usage of every process and worker that worked on this study, this one included."""
        return merge_usage(self._others_usage, merge_usage(self._prior_usage, self.usage.as_dict()))

    def _save_usage(self, study: optuna.Study) -> None:
        study.set_user_attr(f"usage:w{self.worker_index}", merge_usage(self._prior_usage, self.usage.as_dict()))

    def _load_usage(self, study: optuna.Study) -> None:
        self._prior_usage = dict(study.user_attrs.get(f"usage:w{self.worker_index}") or {})
        self._load_others_usage(study)

    def _load_others_usage(self, study: optuna.Study) -> None:
        """The other workers' usage as they last saved it (before telling their candidates' trials)."""
        mine = f"usage:w{self.worker_index}"
        others: dict[str, dict[str, Any]] = {}
        for key, value in study.user_attrs.items():
            if key.startswith("usage:w") and key != mine:
                others = merge_usage(others, value)
        self._others_usage = others

    @property
    def _budgeted(self) -> bool:
        """A call or token budget is set: minibatches then start in order, each after a budget check."""
        return bool(self.settings.max_calls or self.settings.max_tokens_budget)

    def _budget_left(self) -> bool:
        s = self.settings
        usage = self.study_usage()
        calls = sum(int(u.get("calls", 0)) for u in usage.values())
        tokens = sum(int(u.get("prompt_tokens", 0)) + int(u.get("completion_tokens", 0)) for u in usage.values())
        if s.max_calls and calls >= s.max_calls:
            return False
        return not (s.max_tokens_budget and tokens >= s.max_tokens_budget)

    def _check_fingerprint(self, study: optuna.Study) -> None:
        """Refuse to resume a study whose scores were made under other settings."""
        if not self.fingerprint:
            return
        stored = study.user_attrs.get("fingerprint")
        if stored is None:
            study.set_user_attr("fingerprint", self.fingerprint)
            return
        keys = sorted(set(stored) | set(self.fingerprint))
        changed = [k for k in keys if stored.get(k) != self.fingerprint.get(k)]
        if changed:
            shown = "; ".join(f"{k}: {stored.get(k)!r} -> {self.fingerprint.get(k)!r}" for k in changed[:8])
            raise ConfigError(
                f"study {self.study_name!r} was scored under other settings ({len(changed)} changed: {shown}"
                f"{'; ...' if len(changed) > 8 else ''}); its scores would not be comparable. Rerun with --fresh to "
                "archive that study and start a new one, restore the settings, or set [tracking].study_name"
            )

    def _engine_for(self, program: Program) -> EvaluationEngine:
        """The search's long-lived engine (one per :meth:`optimize`), or a fresh one for ``program``."""
        if self._engine is not None and self._engine.program is program:
            return self._engine
        judge_slots = self.judge_workers if self.judge_workers is not None else role_limit(self.judge)
        self._engine = EvaluationEngine(
            program=program, judge=self.judge, task_slots=self.task_workers, judge_slots=judge_slots
        )
        return self._engine

    def _close_engine(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None

    def _outcome(self, scored: Scored, instruction: str) -> float | LLMError | None:
        if scored.error is not None:
            logger.warning("candidate %r, question %r: %s", instruction[:60], scored.row.query[:60], scored.error)
            return scored.error
        return scored.score

    @staticmethod
    def _pruning(study: optuna.Study, step: int) -> tuple[EarlierStepsPruner, list[optuna.trial.FrozenTrial]] | None:
        """The pruner that can stop a candidate in this step, with the complete candidates of earlier
        steps it compares with (fixed while the step runs: a step starts once the one before it is
        done), or None: no pruner, or nothing to compare with, so minibatches need not wait for the
        running mean."""
        pruner = study.pruner
        if isinstance(pruner, optuna.pruners.NopPruner):
            return None
        if not isinstance(pruner, EarlierStepsPruner):
            raise TypeError(f"opro's search needs an EarlierStepsPruner, got {type(pruner).__name__}")
        earlier = _complete_before(study, step)
        return (pruner, earlier) if earlier else None

    def _evaluate_step(
        self,
        study: optuna.Study,
        step: int,
        claimed: Sequence[tuple[int, str, optuna.trial.Trial]],
        program: Program,
        examples: Sequence[QAExample],
        claim_next: Callable[[], list[tuple[int, str, optuna.trial.Trial]]] | None = None,
        proposals: Sequence[str] | None = None,
    ) -> list[CandidateRecord]:
        """Evaluate the candidates this worker claimed (proposal index, instruction, trial), and those
        ``claim_next`` claims whenever a slot would idle. With ``proposals`` (a step whose candidates
        may be split), parts of split candidates are claimed too, whoever owns them, and this worker's
        own split candidates are finished once all their parts are in."""
        from opro.claims import claim, part_key, part_state, release_stale

        def candidate(idx: int, instruction: str, trial: optuna.trial.Trial) -> _Live:
            # Its claim says whether it is split (only where a step may split: a storage read).
            split = int(trial.user_attrs.get("parts") or 0) if proposals is not None else 0
            return _Live(instruction, trial, template=self.make_template(instruction), index=idx, split=split)

        live = [candidate(idx, instruction, trial) for idx, instruction, trial in claimed]
        jobs: list[_Part] = []
        n, size = len(examples), self.settings.minibatch_size
        n_batches = max(1, math.ceil(n / size))
        pruning = self._pruning(study, step)
        can_prune = pruning is not None
        # With a budget, minibatch b starts only once minibatch b-1 is finished and the budget is
        # checked, as a plain loop would: where a run stops must not depend on timing.
        budgeted = self._budgeted
        budget_checked: set[int] = set()

        def batch_done(b: int) -> bool:
            lo, hi = b * size, min(n, (b + 1) * size)
            return all(all(i in c.got for i in range(lo, hi)) for c in live if c.status == "complete")

        def gate(pair: Pair) -> Gate:
            if isinstance(pair.key, tuple):  # a part: never pruned (split steps cannot prune)
                return "drop" if jobs[pair.key[1]].lost else "run"
            c = live[int(pair.key)]  # type: ignore[call-overload]
            if c.status != "complete" or c.lost:
                return "drop"  # pruned, out of budget or taken over: its queued questions are never asked
            b = pair.index // size
            if budgeted and b not in budget_checked:
                if b > 0 and not batch_done(b - 1):
                    return "hold"
                budget_checked.add(b)
                if not self._budget_left():
                    for other in live:
                        if other.status == "complete":
                            other.status = "budget"
                    return "drop"
            # A candidate that may be pruned after minibatch b-1 waits for that decision; with
            # lookahead its next minibatch is answered meanwhile on task slots that would idle (its
            # judgments wait for the decision), so its minibatches do not run answer-then-judge in
            # series. Scores and decisions are the same; a pruned candidate may have cost the answers
            # of one more minibatch.
            if can_prune and c.reported < b:
                ahead = self.settings.lookahead and not budgeted and c.reported == b - 1
                return "spare" if ahead else "hold"
            return "run"

        total = sum(n for c in live if not c.split)
        with progress_bar(f"step {step}: {len(live)} candidate(s)", total=total, enabled=self.progress) as bar:

            def on_scored(scored: Scored) -> None:
                if isinstance(scored.pair.key, tuple):
                    job = jobs[scored.pair.key[1]]
                    if job.lost:
                        return
                    bar.advance()
                    job.got[scored.pair.index] = self._outcome(scored, job.instruction)
                    if len(job.got) == job.hi - job.lo:
                        reports.append(bookkeeper.submit(self._finish_part, study, job, step))
                    return
                c = live[int(scored.pair.key)]  # type: ignore[call-overload]
                if c.status != "complete" or c.lost:
                    return
                bar.advance()
                c.got[scored.pair.index] = self._outcome(scored, c.instruction)
                report_ready(c)

            def report_ready(c: _Live) -> None:
                """Report every minibatch whose questions are all in, in order."""
                while c.reported < n_batches and c.status == "complete":
                    b = c.reported
                    hi = min(n, (b + 1) * size)
                    if any(i not in c.got for i in range(b * size, hi)):
                        break
                    results = [c.got[i] for i in range(b * size, hi)]
                    c.n_errors += sum(1 for r in results if isinstance(r, LLMError))
                    c.scores.extend(None if isinstance(r, LLMError) else r for r in results)
                    c.reported += 1
                    mean = c.mean()
                    if mean is None:
                        continue
                    c.means[b] = mean
                    # The decision is made here from the candidate's own results and the earlier
                    # steps (the pruner's whole input), so nobody waits for the storage write: it
                    # runs beside the requests, in order, on the bookkeeping thread.
                    reports.append(bookkeeper.submit(self._report, c, mean, b, step,
                                                     list(c.scores) if pruning is not None else None))
                    if pruning is None or b + 1 >= n_batches:
                        continue
                    pruner, earlier = pruning
                    if pruner.decide(RunningCandidate(dict(c.means), list(c.scores)), earlier):
                        c.status = "pruned"
                        bar.advance(n - len(c.scores))

            def claim_part() -> list[Pair]:
                """Claim a free part of a split candidate of this step (its own first); its pairs."""
                assert proposals is not None
                while True:
                    state = part_state(study, step, proposals)
                    if release_stale(study, state):
                        continue
                    free = state.free(n)
                    if not free:
                        return []
                    own = [f for f in free if any(c.index == f[0] and c.split for c in live)]
                    i, b = (own or free)[0 if own else self.worker_index % len(free)]
                    won = claim(study, step=step, items=[(i, proposals[i])], token=self._token,
                                worker=self.worker_index, part=part_key(b, state.size[i]))
                    if not won:
                        continue
                    lo, hi = b * state.size[i], min(n, (b + 1) * state.size[i])
                    jobs.append(_Part(i, b, lo, hi, proposals[i], self.make_template(proposals[i]), won[0][2]))
                    bar.add_total(hi - lo)
                    return [Pair(key=("part", len(jobs) - 1), index=q, template=jobs[-1].template, example=examples[q])
                            for q in range(lo, hi)]

            def more() -> list[Pair]:
                if proposals is not None:
                    part = claim_part()
                    if part:
                        return part
                if claim_next is None:
                    return []
                got = claim_next()
                for idx, instruction, trial in got:
                    live.append(candidate(idx, instruction, trial))
                    if live[-1].split:
                        return more()  # its questions come part by part
                    bar.add_total(n)
                return [Pair(key=k, index=i, template=live[k].template, example=ex)
                        for k in range(len(live) - len(got), len(live)) for i, ex in enumerate(examples)]

            # Question-major order: consecutive calls share the retrieved context (KV-prefix reuse).
            pairs = [Pair(key=k, index=i, template=c.template, example=ex)
                     for i, ex in enumerate(examples) for k, c in enumerate(live) if not c.split]
            reports: list[Future[None]] = []
            refill = claim_next is not None or proposals is not None
            poll, last_note = 0.05, time.monotonic()
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="opro-study") as bookkeeper:
                while True:
                    self._engine_for(program).run(pairs, on_scored=on_scored, gate=gate, more=more if refill else None)
                    pairs = []
                    for job in reports:
                        job.result()  # this worker's parts are in the study before they are read back
                    reports.clear()
                    waiting = [c for c in live if c.split and c.status == "complete" and not c.lost and len(c.got) < n]
                    if not waiting:
                        break
                    # This worker's split candidates: their other parts come from the other workers
                    # (or from this one, once a stopped worker's claim is released).
                    state = part_state(study, step, proposals or ())
                    for c in waiting:
                        parts = [state.done.get((c.index, b)) for b in range(math.ceil(n / c.split))]
                        if all(t is not None for t in parts):
                            for b, t in enumerate(parts):
                                for q, v in enumerate(t.user_attrs.get("part_scores") or ()):  # type: ignore[union-attr]
                                    c.got[b * c.split + q] = _part_outcome(v)
                            report_ready(c)
                    if any(len(c.got) < n for c in waiting):
                        if time.monotonic() - last_note > 30:
                            logger.warning("worker %d: step %d waits for parts of %d candidate(s) that other "
                                           "workers are asking", self.worker_index, step, len(waiting))
                            last_note = time.monotonic()
                        time.sleep(poll)
                        poll = min(_MAX_POLL_S, poll * 1.5)
            for job in reports:
                job.result()
        # Usage first, then the trials: a worker that sees every candidate finished sees its usage too.
        self._save_usage(study)
        records = []
        for c in live:
            if c.lost:
                continue
            mean = c.mean()
            n_scored = c.n_valid()
            n_invalid = len(c.scores) - n_scored - c.n_errors
            status: CandidateStatus = c.status
            if mean is None:
                status = "failed" if c.n_errors or not c.scores else "incomplete"
            elif status == "complete" and n_scored < self.settings.min_coverage * len(examples):
                # Coverage rule: a mean over a few valid judgments must not compete with full ones.
                status = "failed" if c.n_errors else "incomplete"
                logger.warning(
                    "candidate %r: only %d of %d questions scored validly (%d invalid, %d errors): not complete",
                    c.instruction[:60], n_scored, len(examples), n_invalid, c.n_errors,
                )
            attrs = {
                "score": mean,
                "n_scored": n_scored,
                "n_invalid": n_invalid,
                "n_errors": c.n_errors,
                "status": status,
                "scores": list(c.scores),
            }
            try:
                for k, v in attrs.items():
                    c.trial.set_user_attr(k, v)
                if status == "complete":
                    study.tell(c.trial, mean)
                elif status in ("failed", "incomplete"):
                    study.tell(c.trial, state=optuna.trial.TrialState.FAIL)
                else:
                    study.tell(c.trial, state=optuna.trial.TrialState.PRUNED)
            except (optuna.exceptions.UpdateFinishedTrialError, ValueError):
                self._lost(c, step)
                continue
            records.append(
                CandidateRecord(
                    step=step,
                    instruction=c.instruction,
                    score=mean,
                    n_scored=n_scored,
                    n_invalid=n_invalid,
                    n_errors=c.n_errors,
                    status=status,
                    trial_number=c.trial.number,
                    scores=tuple(c.scores),
                    index=c.index,
                )
            )
        return records

    def _finish_part(self, study: optuna.Study, job: _Part, step: int) -> None:
        """Store a part's outcomes on its trial, for the candidate's owner to add up."""
        outcomes = [job.got[i] for i in range(job.lo, job.hi)]
        errors = any(isinstance(r, LLMError) for r in outcomes)
        try:
            job.trial.set_user_attr("part_scores", [_PART_ERROR if isinstance(r, LLMError) else r for r in outcomes])
            # "failed" stands only while this worker runs: a rerun asks the part's questions again.
            job.trial.set_user_attr("status", "failed" if errors else "complete")
            study.tell(job.trial, state=optuna.trial.TrialState.FAIL)  # a part is never a result of its own
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError):
            job.lost = True
            logger.warning("worker %d: part %d of candidate %d of step %d was taken over by another worker",
                           self.worker_index, job.part, job.index, step)

    def _report(self, c: _Live, mean: float, b: int, step: int, scores: list[float | None] | None) -> None:
        try:
            if scores is not None:  # the per-question scores the racing pruner reads, kept beside the mean
                c.trial.set_user_attr("scores", scores)
            c.trial.report(mean, b)
        except optuna.exceptions.UpdateFinishedTrialError:
            self._lost(c, step)

    def _lost(self, c: _Live, step: int) -> None:
        c.lost = True
        logger.warning(
            "worker %d: candidate %d of step %d was taken over by another worker (this worker's heartbeat was "
            "missed): its result here is dropped", self.worker_index, c.index, step,
        )

    # -- the loop ----------------------------------------------------------------------------
    def optimize(
        self,
        *,
        program: Program,
        optimization_set: Sequence[QAExample],
        exemplar_set: Sequence[QAExample] = (),
        validation_set: Sequence[QAExample] = (),
        initial_instructions: Sequence[str],
    ) -> OptimizationResult:
        """Search on ``optimization_set``; then re-score the finalists on ``validation_set``.

        The returned instruction is a finalist only if it beats the initial instruction on the
        validation questions (paired, Holm-corrected); otherwise it is the initial instruction.
        """
        if not optimization_set:
            raise OproError("the optimization split is empty: give the dataset an optimization split")
        if not initial_instructions:
            raise OproError("give at least one initial instruction")
        if self.settings.finalists > 0 and not validation_set:
            raise ConfigError(
                f"[optimizer].finalists = {self.settings.finalists} needs validation questions, but the validation "
                "split is empty: set [data.split].validation (e.g. 8; more questions detect smaller gains), "
                "or set [optimizer].finalists = 0 to skip validation (then no gain is claimed)"
            )
        self._n_questions = len(optimization_set)
        started = time.perf_counter()
        if self.num_workers > 1 and self.storage.startswith("sqlite"):
            logger.warning(
                "%d workers share the study through a SQLite file: that works only for processes on this machine "
                "and serializes every write; for workers on several machines use PostgreSQL "
                "([tracking].optuna_storage = \"postgresql+psycopg2://...\", see the README's Scaling out)",
                self.num_workers,
            )
        study = self._study()
        from opro.locking import StudyLease

        # One process per (study, worker index), wherever it runs: a second one would mark the
        # first's running trials failed and evaluate everything twice.
        worker = f" as worker {self.worker_index}/{self.num_workers}" if self.num_workers > 1 else ""
        lease = StudyLease(study, key=f"holder:w{self.worker_index}", what=f"study {self.study_name!r}{worker}",
                           info={"of": self.num_workers})
        with lease:
            self._token = lease.token
            self._check_workers(study)
            return self._optimize_study(
                study, program=program, optimization_set=optimization_set, exemplar_set=exemplar_set,
                validation_set=validation_set, initial_instructions=initial_instructions, started=started,
            )

    def _check_workers(self, study: optuna.Study) -> None:
        """Refuse to work beside live workers started with another N (each must say the same
        ``--worker I/N``); record N in the study. Checked after taking the lease, so of two processes
        starting together at least one sees the other."""
        from opro.claims import live_workers

        others = {i: h for i, h in live_workers(study.user_attrs).items() if i != self.worker_index}
        wrong = {i: h for i, h in others.items() if h.get("of") != self.num_workers}
        if wrong:
            shown = ", ".join(
                f"--worker {i}/{h.get('of', '?')} (pid {h.get('pid')} on {h.get('host')})" for i, h in sorted(wrong.items())
            )
            raise ConfigError(
                f"study {self.study_name!r} is being worked on by {shown}, but this process was started as "
                f"--worker {self.worker_index}/{self.num_workers}: every worker of a study must be started with the "
                "same N. Stop this one and start it with the N the others use (or stop the others first)"
            )
        study.set_user_attr("workers", self.num_workers)

    def _optimize_study(
        self,
        study: optuna.Study,
        *,
        program: Program,
        optimization_set: Sequence[QAExample],
        exemplar_set: Sequence[QAExample],
        validation_set: Sequence[QAExample],
        initial_instructions: Sequence[str],
        started: float,
    ) -> OptimizationResult:
        self._check_fingerprint(study)
        self._load_usage(study)
        self._fail_stale_trials(study)
        history = self._records(study)
        lead = self.worker_index == 0
        for recorder in self.recorders:
            recorder.on_search_start(study, lead=lead)
        exemplar_pool = [Exemplar(e.query, e.reference_answer) for e in exemplar_set]
        stopped = "steps"
        best_so_far = -math.inf
        steps_without_gain = 0
        steps_without_candidates = 0
        try:
            for step in range(self.settings.steps + 1):
                self._load_others_usage(study)
                if step == 0:
                    proposals: list[str] | None = list(
                        dict.fromkeys(i.strip() for i in initial_instructions if i.strip())
                    )
                elif self.worker_index == 0:
                    if not self._budget_left():
                        stopped = self._stop(study, step, "budget")
                        break
                    proposals = self._propose(study, step, history, exemplar_pool, program)
                else:
                    proposals = self._await_proposals(study, step)
                if proposals is None:  # worker 0 stopped the search (its budget, or no new candidates)
                    stopped = str((study.user_attrs.get(f"stopped:{step}") or {}).get("reason") or "budget")
                    break
                self._evaluate_claimed(study, step, proposals, program, optimization_set)
                history = self._records(study)
                step_best = max(
                    (r.score for r in history if r.step == step and r.status == "complete" and r.score is not None),
                    default=-math.inf,
                )
                if step_best > best_so_far + 1e-9:
                    best_so_far = step_best
                    steps_without_gain = 0
                elif step > 0:
                    steps_without_gain += 1
                if lead:
                    for recorder in self.recorders:
                        recorder.on_step(study, step=step, history=history, best_score=best_so_far)
                if any(r.status == "budget" and r.step == step for r in history):
                    stopped = "budget"
                    break
                if self.worker_index == 0 and not self._budget_left():
                    # Only worker 0 decides from the usage totals (each worker's view of them lags);
                    # the others read its decision from the study.
                    stopped = self._stop(study, step + 1, "budget")
                    break
                if self.settings.patience and steps_without_gain >= self.settings.patience:
                    stopped = "patience"
                    break
                # An optimizer that only repeats earlier instructions would otherwise be asked again
                # for every remaining step (however many were configured), evaluating nothing.
                steps_without_candidates = steps_without_candidates + 1 if step > 0 and not proposals else 0
                if self.worker_index == 0 and steps_without_candidates >= _MAX_STEPS_WITHOUT_CANDIDATES:
                    stopped = self._stop(study, step + 1, "no new candidates")
                    logger.warning(
                        "stopping after step %d: the optimizer proposed no new instruction in %d steps in a row "
                        "(every sample repeated an earlier one or was invalid; see the rejected samples); a higher "
                        "[optimizer].temperature gives more varied samples", step, steps_without_candidates,
                    )
                    break
            history = self._records(study)
            self._load_others_usage(study)
            for recorder in self.recorders:
                recorder.on_search_end(study)
            validation = None
            if self.worker_index == 0 and self.settings.finalists > 0:
                validation = self._validate(study, program, validation_set, history, initial_instructions[0].strip())
            result = self._result(history, stopped=stopped, wall_s=time.perf_counter() - started,
                                  initial=initial_instructions[0], validation=validation,
                                  rejected=self._rejections(study))
            for recorder in self.recorders:
                result = recorder.annotate(result)
            self._close_engine()
        except BaseException as exc:
            self._close_engine()
            with contextlib.suppress(Exception):  # the study store may be what failed
                self._save_usage(study)
            for recorder in self.recorders:
                recorder.on_search_failed(study, exc, abandoned=self._abandoned)
            raise
        self._save_usage(study)
        if lead:
            self._record_result(result, study)
        return result

    def _stop(self, study: optuna.Study, step: int, reason: str) -> str:
        """Worker 0 records that the search stops before ``step``, for the workers waiting for its proposals."""
        study.set_user_attr(f"stopped:{step}", {"reason": reason, "token": self._token})
        return reason

    @staticmethod
    def _rejections(study: optuna.Study) -> tuple[dict[str, str], ...]:
        out: list[dict[str, str]] = []
        for key, value in sorted(study.user_attrs.items()):
            if key.startswith("rejected:"):
                out.extend({"step": key.split(":", 1)[1], **r} for r in value)
        return tuple(out)

    # -- validation --------------------------------------------------------------------------
    def _score_on(
        self,
        study: optuna.Study,
        program: Program,
        prompts: Sequence[tuple[str, str]],
        examples: Sequence[QAExample],
    ) -> dict[str, list[float | None]]:
        """Per-question validation scores of each (label, instruction), kept in the study so a rerun
        asks nothing. Each prompt is handed to the recorders' ``on_validated`` as soon as all its
        questions are scored without an LLM error (a prompt with errors is asked again by a rerun)."""
        out: dict[str, list[float | None]] = {}
        todo: list[tuple[str, str]] = []
        for label, ins in prompts:
            stored = study.user_attrs.get(f"validation:{_sha(normalize_instruction(ins))}")
            if stored is not None and len(stored) == len(examples):
                out[ins] = list(stored)
            else:
                todo.append((label, ins))
        if not todo:
            return out
        engine = self._engine_for(program)
        templates = [self.make_template(ins) for _, ins in todo]
        if engine.serial:
            # Question-major, like the search: one question's prompts are answered in one batch.
            order = [(k, i) for i in range(len(examples)) for k in range(len(todo))]
        else:
            # Prompt by prompt: the first prompts are done (and recorded, e.g. as MLflow traces)
            # while the later ones are still being asked.
            order = [(k, i) for k in range(len(todo)) for i in range(len(examples))]
        pairs = [Pair(key=k, index=i, template=templates[k], example=examples[i]) for k, i in order]
        got: dict[tuple[int, int], float | LLMError | None] = {}
        left = [len(examples)] * len(todo)

        def finish(k: int) -> None:
            label, ins = todo[k]
            results = [got[(k, i)] for i in range(len(examples))]
            out[ins] = [None if isinstance(r, LLMError) else r for r in results]
            if not any(isinstance(r, LLMError) for r in results):  # a rerun retries the questions that failed
                study.set_user_attr(f"validation:{_sha(normalize_instruction(ins))}", out[ins])
                for recorder in self.recorders:
                    recorder.on_validated(study, label=label, instruction=ins)

        with progress_bar(
            f"validation: {len(todo)} prompt(s) x {len(examples)} questions", total=len(pairs), enabled=self.progress
        ) as bar:

            def on_scored(scored: Scored) -> None:
                k = int(scored.pair.key)  # type: ignore[call-overload]
                got[(k, scored.pair.index)] = self._outcome(scored, todo[k][1])
                bar.advance()
                left[k] -= 1
                if not left[k]:
                    finish(k)

            engine.run(pairs, on_scored=on_scored)
        return out

    def _validate(
        self,
        study: optuna.Study,
        program: Program,
        validation_set: Sequence[QAExample],
        history: Sequence[CandidateRecord],
        initial: str,
    ) -> ValidationResult:
        from opro.stats import bootstrap_mean_ci, compare_paired, holm

        s = self.settings
        initial_key = normalize_instruction(initial)
        complete = [r for r in history if r.status == "complete" and r.score is not None]
        finalists = sorted(
            (r for r in complete if normalize_instruction(r.instruction) != initial_key),
            key=lambda r: (-(r.score or 0.0), r.step, r.index),
        )[: s.finalists]
        n = len(validation_set)
        scores = self._score_on(
            study, program, validation_prompts(initial, [f.instruction for f in finalists]), validation_set
        )
        init_scores = scores[initial]
        init_valid = [x for x in init_scores if x is not None]

        def ci(values: Sequence[float]) -> tuple[float, float] | None:
            if not values:
                return None
            c = bootstrap_mean_ci(values, seed=self.seed)
            return (c.low, c.high)

        raw: list[tuple[CandidateRecord, list[float | None], Any]] = []
        for f in finalists:
            a, b = paired_valid(scores[f.instruction], init_scores)
            cmp = compare_paired(a, b, seed=self.seed, alpha=s.alpha) if a else None
            raw.append((f, scores[f.instruction], cmp))
        # One-sided: the question is only whether a finalist is *better* than the initial instruction.
        # Both nulls are symmetric, so the one-sided p-value is half the two-sided one in that direction.
        p_raw = [
            (max(c.wilcoxon.p_value, c.permutation.p_value) / 2 if c.difference.estimate > 0 else 1.0)
            if c is not None and c.n else 1.0
            for _, _, c in raw
        ]
        p_adj = holm(p_raw) if p_raw else []
        records = []
        for (f, f_scores, cmp), p, q in zip(raw, p_raw, p_adj, strict=True):
            valid = [x for x in f_scores if x is not None]
            covered = len(valid) >= s.min_coverage * n and len(init_valid) >= s.min_coverage * n
            diff = cmp.difference if cmp is not None else None
            records.append(
                FinalistRecord(
                    instruction=f.instruction,
                    trial_number=f.trial_number,
                    search_score=float(f.score or 0.0),
                    validation_score=sum(valid) / len(valid) if valid else None,
                    validation_ci=ci(valid),
                    difference=None if diff is None else diff.estimate,
                    difference_ci=None if diff is None else (diff.low, diff.high),
                    n_pairs=cmp.n if cmp is not None else 0,
                    p_value=p,
                    p_adjusted=q,
                    significant=bool(covered and diff is not None and diff.estimate > 0 and q < s.alpha),
                    scores=tuple(f_scores),
                )
            )
        winners = [r for r in records if r.significant]
        # Ties to the better search rank (the finalists' order), not to a trial number.
        winner = (
            max(winners, key=lambda r: (r.validation_score or 0.0, -records.index(r))) if winners else None
        )
        if not finalists:
            verdict = "no candidate besides the initial instruction completed the search: nothing to validate"
        elif winner is None:
            best = max(records, key=lambda r: r.difference if r.difference is not None else -math.inf)
            d = "n/a" if best.difference is None else f"{best.difference:+.2f}"
            verdict = (
                f"no finalist beat the initial instruction on {n} validation questions "
                f"(best difference {d}, one-sided Holm-adjusted p={best.p_adjusted:.3g} >= alpha {s.alpha:g} "
                f"over {len(records)} finalist(s)): the initial instruction is returned and no gain is claimed"
            )
        else:
            lo, hi = winner.difference_ci or (math.nan, math.nan)
            verdict = (
                f"a finalist beat the initial instruction on {n} validation questions by {winner.difference:+.2f} "
                f"(95% CI {lo:+.2f} to {hi:+.2f}, one-sided Holm-adjusted p={winner.p_adjusted:.3g} "
                f"over {len(records)} finalist(s), alpha {s.alpha:g})"
            )
        logger.info("validation: %s", verdict)
        return ValidationResult(
            n_questions=n,
            alpha=s.alpha,
            initial_score=sum(init_valid) / len(init_valid) if init_valid else None,
            initial_ci=ci(init_valid),
            initial_scores=tuple(init_scores),
            finalists=tuple(records),
            winner=winner,
            verdict=verdict,
        )

    def _result(
        self,
        history: list[CandidateRecord],
        *,
        stopped: str,
        wall_s: float,
        initial: str,
        validation: ValidationResult | None,
        rejected: tuple[dict[str, str], ...],
    ) -> OptimizationResult:
        complete = [r for r in history if r.status == "complete" and r.score is not None]
        if not complete:
            raise OproError(
                "no candidate was scored: every judge reply was invalid or every call failed; "
                "check the judge model and the logs"
            )
        initial = initial.strip()
        initial_rec = next((r for r in history if r.step == 0 and r.instruction == initial), None)
        common = {
            "initial_instruction": initial,
            "initial_score": initial_rec.score if initial_rec else None,
            "history": tuple(history),
            "usage": self.study_usage(),
            "stopped_reason": stopped,
            "mlflow_run_id": None,  # where the search was recorded: filled in by the recorders' annotate
            "study_name": self.study_name,
            "storage": self.storage,
            "wall_s": wall_s,
            "validation": validation,
            "rejected": rejected,
        }
        if validation is None:
            # No validation stage: the search's arg-max, labelled as the in-sample score it is.
            best = max(complete, key=lambda r: (r.score, -r.step, -r.index))
            return OptimizationResult(
                best_instruction=best.instruction,
                best_template=self.template_text(self.make_template(best.instruction)),
                best_score=float(best.score),  # type: ignore[arg-type]
                score_basis="search",
                best_search_score=best.score,
                **common,  # type: ignore[arg-type]
            )
        w = validation.winner
        instruction = w.instruction if w is not None else initial
        search: float | None
        if w is not None:
            score, score_ci, search = w.validation_score, w.validation_ci, w.search_score
        else:
            score, score_ci = validation.initial_score, validation.initial_ci
            search = initial_rec.score if initial_rec else None
        if score is None:
            raise OproError(
                f"no validation question was scored validly for the initial instruction ({validation.n_questions} "
                "asked): check the judge model and the logs, then rerun (finished work is kept)"
            )
        return OptimizationResult(
            best_instruction=instruction,
            best_template=self.template_text(self.make_template(instruction)),
            best_score=float(score),
            score_basis="validation",
            best_score_ci=score_ci,
            best_search_score=search,
            gain=None if w is None else w.difference,
            gain_ci=None if w is None else w.difference_ci,
            **common,  # type: ignore[arg-type]
        )

    def _record_result(self, result: OptimizationResult, study: optuna.Study) -> None:
        # The summary in the study too: `opro compare best` / `opro export best` work from the stores
        # on any machine, not only in the lead's output folder.
        study.set_user_attr("summary", json.loads(json.dumps(result.summary(), default=str)))
        if result.rejected and not any(r.step > 0 for r in result.history):
            reasons = sorted({r["reason"] for r in result.rejected})
            logger.warning(
                "the optimizer proposed no usable instruction: %d proposal(s) rejected (%s)",
                len(result.rejected), "; ".join(reasons),
            )
        for recorder in self.recorders:
            recorder.on_result(study, result)


def merge_usage(a: Mapping[str, Mapping[str, Any]], b: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per-role usage of ``a`` and ``b`` added up (``cost_usd`` stays ``None`` where both are unknown)."""
    out: dict[str, dict[str, Any]] = {role: dict(u) for role, u in a.items()}
    for role, u in b.items():
        if role not in out:
            out[role] = dict(u)
            continue
        for k, v in u.items():
            if isinstance(v, int | float) or out[role].get(k) is None:
                prev = out[role].get(k)
                out[role][k] = v if prev is None else (prev + v if v is not None else prev)
    return out


def optimism_points(result: OptimizationResult) -> list[dict[str, Any]]:
    """Search vs validation score of the initial instruction and every finalist, for the optimism plot."""
    v = result.validation
    if v is None:
        return []
    points = [{
        "label": "initial", "search": result.initial_score, "validation": v.initial_score,
        "returned": not result.validated,
    }]
    for i, f in enumerate(v.finalists, start=1):
        points.append({
            "label": f"finalist {i}", "search": f.search_score, "validation": f.validation_score,
            "returned": v.winner is not None and f.instruction == v.winner.instruction,
        })
    return points


__all__ = [
    "BestSoFarPruner",
    "CandidateRecord",
    "EarlierStepsMedianPruner",
    "EarlierStepsPruner",
    "FinalistRecord",
    "OPROOptimizer",
    "OptimizationResult",
    "OptimizerSettings",
    "RacingPruner",
    "RunningCandidate",
    "ValidationResult",
    "make_pruner",
    "optimism_points",
    "validation_prompts",
]
