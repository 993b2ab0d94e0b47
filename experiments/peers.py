"""opro against its peers (DSPy's COPRO, MIPROv2, GEPA) on the same data, models and call budget.

Every method optimizes the same instruction of the same RAG program (:class:`~opro.program.dspy.OproRAG`
is opro's program as a DSPy module), with the same task, judge and proposer models, and the same
budget of task + judge calls, charged by :class:`~opro.llm.budget.BudgetedChatClient` whichever method
asks (a cache hit is charged too, so a warm rerun stops at the same point). A method that reaches
the budget is stopped there and keeps its best-so-far. The data is used alike:

- the questions shown to the proposer: the exemplar split (opro's exemplars; MIPROv2's and GEPA's
  ``trainset``);
- the questions candidates are scored and selected on: the optimization split (opro's search set;
  COPRO's ``trainset``; MIPROv2's and GEPA's ``valset``).

Then every winner and the initial instruction are scored again by opro's judge on the held-out split,
which no method saw, and compared with :func:`opro.heldout.compare.compare_prompts` (paired tests against the
initial instruction, Holm-corrected): the peers' own metric totals are reported only as their search
scores, never as the result.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from opro.errors import ConfigError
from opro.experiment import Experiment
from opro.llm import ChatClient
from opro.llm.budget import BudgetedChatClient, CallBudget, raised_by_budget
from opro.search.exemplars import ExemplarStrategy

if TYPE_CHECKING:
    from opro.heldout.report import ComparisonReport

logger = logging.getLogger(__name__)

Method = Literal["opro", "opro-failures", "copro", "miprov2", "gepa"]
METHODS: tuple[str, ...] = ("opro", "opro-failures", "copro", "miprov2", "gepa")
#: How each method is named in the table.
LABELS = {"opro": "opro", "opro-failures": "opro, failures", "copro": "COPRO", "miprov2": "MIPROv2", "gepa": "GEPA"}
BUDGETED_ROLES = ("task", "judge")


@dataclass(frozen=True)
class PeerSettings:
    """The budget and each method's knobs (sized so each can spend the budget, not far more)."""

    budget: int = 18
    methods: tuple[str, ...] = METHODS
    #: Threads of DSPy's evaluations (the embedded backend serializes calls anyway).
    num_threads: int = 1
    #: opro: steps cap (the budget normally stops it first) and candidates per step.
    opro_steps: int = 10
    opro_candidates: int = 2
    copro_breadth: int = 3
    copro_depth: int = 2
    mipro_candidates: int = 3
    mipro_trials: int = 4
    gepa_minibatch: int = 2
    #: Sampling temperature of the proposer (every method).
    temperature: float = 1.0
    proposer_max_tokens: int = 256

    def __post_init__(self) -> None:
        if self.budget < 2:
            raise ConfigError(f"the budget must allow at least one answer and its judgment (2 calls), got {self.budget}")
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ConfigError(f"unknown method(s) {unknown}; known: {', '.join(METHODS)}")


@dataclass(frozen=True)
class MethodResult:
    """What one method returned within the budget."""

    method: str
    instruction: str
    #: Task + judge calls the method asked for (cache hits included), at most the budget.
    calls_used: int
    calls_by_role: dict[str, int]
    #: Proposer (optimizer-role) calls asked for: not budgeted, reported for completeness.
    proposer_calls: int
    #: Of the task + judge calls, those the models answered (the rest came from opro's call cache).
    model_calls: int
    #: The winner's mean 1-5 judge score on the questions the method selected on, as it measured it.
    search_score: float | None
    search_questions: int
    #: ``budget``: stopped at the budget (best-so-far returned); ``finished``: the method ended by itself
    #: (opro: ``steps``); ``failed (Error)``: the method raised (best-so-far returned, see the log).
    stopped: str
    wall_s: float


@dataclass(frozen=True)
class PeersReport:
    budget: int
    results: tuple[MethodResult, ...]
    comparison: ComparisonReport
    initial_instruction: str
    wall_s: float
    files: dict[str, str] = field(default_factory=dict)

    def rows(self) -> list[dict[str, Any]]:
        """One row per prompt of the held-out comparison (the initial instruction first)."""
        by_label = {LABELS.get(r.method, r.method): r for r in self.results}
        rows = []
        for p, v in zip(self.comparison.prompts, self.comparison.versus, strict=True):
            r = by_label.get(p.label)
            stats = v.stats if v is not None else None
            rows.append({
                "method": p.label,
                "calls_used": None if r is None else r.calls_used,
                "search_score": None if r is None else r.search_score,
                "search_questions": None if r is None else r.search_questions,
                "stopped": None if r is None else r.stopped,
                "heldout_mean": None if p.mean is None else p.mean.estimate,
                "heldout_ci": None if p.mean is None else (p.mean.low, p.mean.high),
                "n_scored": p.n_scored,
                "difference": None if stats is None else stats.difference.estimate,
                "difference_ci": None if stats is None else (stats.difference.low, stats.difference.high),
                "p": None if stats is None else max(stats.p_wilcoxon, stats.p_test),
                "wall_s": None if r is None else r.wall_s,
                "instruction": p.instruction,
            })
        return rows

    def table(self) -> str:
        """The Markdown table of docs/benchmarks.md."""
        n = len(self.comparison.questions)
        head = (
            f"| method | task + judge calls (budget {self.budget}) | search score (1-5) | held-out mean, 95% CI "
            f"({n} questions) | difference vs initial, 95% CI | p (Holm) |\n|---|---|---|---|---|---|\n"
        )
        lines = []
        for row in self.rows():
            calls = "-" if row["calls_used"] is None else f"{row['calls_used']}" + (
                " (stopped)" if row["stopped"] == "budget" else ""
            ) + (f" {row['stopped']}" if str(row["stopped"]).startswith("failed") else "")
            search = "-" if row["search_score"] is None else f"{row['search_score']:.2f} on {row['search_questions']} q"
            mean = "-" if row["heldout_mean"] is None else (
                f"{row['heldout_mean']:.2f} [{row['heldout_ci'][0]:.2f}, {row['heldout_ci'][1]:.2f}]"
            )
            diff = "(baseline)" if row["difference"] is None else (
                f"{row['difference']:+.2f} [{row['difference_ci'][0]:+.2f}, {row['difference_ci'][1]:+.2f}]"
            )
            p = "-" if row["p"] is None else f"{row['p']:.3g}"
            lines.append(f"| {row['method']} | {calls} | {search} | {mean} | {diff} | {p} |")
        return head + "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "initial_instruction": self.initial_instruction,
            "methods": [dataclasses.asdict(r) for r in self.results],
            "rows": self.rows(),
            "comparison": self.comparison.to_dict(),
            "wall_s": round(self.wall_s, 1),
        }


class BudgetedExperiment(Experiment):
    """An :class:`Experiment` whose task and judge clients charge a swappable :class:`CallBudget`."""

    def client(self, role: str, *, task_model: str | None = None) -> ChatClient:
        if role not in BUDGETED_ROLES or task_model is not None:  # the peers' bench searches no task model
            return super().client(role, task_model=task_model)
        if role not in self._clients:
            self._clients[role] = self.models.client(self.spec(role), role=role, kind=BudgetedChatClient)
        return self._clients[role]

    def set_budget(self, budget: CallBudget | None) -> None:
        for role in BUDGETED_ROLES:
            client = self.client(role)
            assert isinstance(client, BudgetedChatClient)
            client.budget = budget


def _calls_since(exp: Experiment, before: Mapping[str, Mapping[str, Any]], roles: Sequence[str], *, hits: bool) -> int:
    """Calls of ``roles`` in the usage ledger since ``before`` (with cache hits when ``hits``)."""
    now: Mapping[str, Mapping[str, Any]] = exp.usage.as_dict()
    keys = ("calls", "cache_hits") if hits else ("calls",)
    return sum(int(now.get(r, {}).get(k, 0)) - int(before.get(r, {}).get(k, 0)) for r in roles for k in keys)


# -- opro ------------------------------------------------------------------------------------------


def run_opro(
    exp: BudgetedExperiment, *, budget: CallBudget, settings: PeerSettings, strategy: ExemplarStrategy, out_dir: Path,
    name: str,
) -> tuple[str, float | None, int, str]:
    """opro's search on the optimization split (exemplars from the exemplar split) until the budget
    is spent. Returns (instruction, search score, questions, stopped)."""
    from opro.experiment.settings import proposer_settings, pruner_settings, search_settings
    from opro.search import CandidateScorer, Search, SearchStudy, make_proposer, make_pruner, open_storage

    cfg = exp.config
    ds = exp.dataset
    opt_set = ds.examples_in("optimization")
    opt_settings = dataclasses.replace(
        cfg.optimizer, exemplar_strategy=strategy, finalists=0, patience=0, max_calls=0, max_tokens_budget=0,
        steps=settings.opro_steps, candidates_per_step=settings.opro_candidates, temperature=settings.temperature,
    )
    db = out_dir / f"{name}.optuna.db"
    db.unlink(missing_ok=True)  # a fresh search each run: the call cache makes a rerun free anyway
    study = SearchStudy.open(open_storage(f"sqlite:///{db}"), name=name, pruner=make_pruner(pruner_settings(opt_settings)))
    search = Search(
        make_proposer(settings=proposer_settings(opt_settings), llm=exp.client("optimizer"),
                      template_text=exp.template("<INS>").template_text, seed=cfg.experiment.seed),
        CandidateScorer(program=exp.program, judge=exp.judge, template=exp.template(""),
                        task_slots=exp.client("task").llm.max_concurrency),
        study, search_settings(opt_settings), usage=exp.usage, seed=cfg.experiment.seed, progress=False,
    )
    initial = cfg.rag.initial_instructions[0]
    stopped = "budget"
    try:
        result = search.run(initial=[initial], optimization_set=opt_set, exemplar_set=ds.examples_in("exemplar"))
        return result.best_instruction, result.best_search_score, len(opt_set), result.stopped_reason
    except Exception as exc:
        if not raised_by_budget(exc):
            logger.warning("%s failed: %s: %s", name, type(exc).__name__, str(exc)[:500])
            stopped = f"failed ({type(exc).__name__})"
    # Stopped mid-candidate by the budget: the best candidate that completed (the initial one if none).
    done = [r for r in study.records() if r.status == "complete" and r.score is not None]
    if not done:
        return initial, None, 0, stopped
    best = max(done, key=lambda r: (r.score, -r.trial_number))
    return best.instruction, best.score, len(opt_set), stopped


# -- DSPy ------------------------------------------------------------------------------------------


def run_dspy(
    exp: BudgetedExperiment, *, method: str, budget: CallBudget, settings: PeerSettings
) -> tuple[str, float | None, int, str]:
    """One DSPy optimizer on :class:`OproRAG` until it ends or the budget is spent."""
    import dspy

    from opro.program.dspy import OproLM, OproRAG, ScoreLog, judge_metric, to_dspy_examples
    from opro.program.rag import RAGProgram

    cfg = exp.config
    ds = exp.dataset
    initial = cfg.rag.initial_instructions[0]
    program = exp.program
    assert isinstance(program, RAGProgram), "the DSPy peers run on opro's own program"
    task_lm = OproLM(program.llm, temperature=program.temperature, max_tokens=program.max_tokens)
    proposer = OproLM(exp.client("optimizer"), temperature=settings.temperature, max_tokens=settings.proposer_max_tokens)
    student = OproRAG(program, instruction=initial, lm=task_lm)
    log = ScoreLog()
    metric = judge_metric(exp.judge, feedback=method == "gepa", log=log)
    shown = to_dspy_examples(ds.examples_in("exemplar"))
    scored = to_dspy_examples(ds.examples_in("optimization"))
    questions = [e.question for e in scored]
    seed = cfg.experiment.seed
    compiled: Any = None
    stopped = "finished"
    with dspy.context(lm=task_lm):
        try:
            if method == "copro":
                copro = dspy.COPRO(
                    prompt_model=proposer, metric=metric, breadth=settings.copro_breadth, depth=settings.copro_depth,
                    init_temperature=settings.temperature, track_stats=False,
                )
                compiled = copro.compile(
                    student, trainset=scored,
                    eval_kwargs={"num_threads": settings.num_threads, "display_progress": False},
                )
            elif method == "miprov2":
                mipro = dspy.MIPROv2(
                    metric=metric, prompt_model=proposer, task_model=task_lm, auto=None,
                    num_candidates=settings.mipro_candidates, max_bootstrapped_demos=0, max_labeled_demos=0,
                    num_threads=settings.num_threads, seed=seed, init_temperature=settings.temperature,
                    verbose=False, track_stats=False,
                )
                compiled = mipro.compile(
                    student, trainset=shown, valset=scored, num_trials=settings.mipro_trials, minibatch=False,
                    program_aware_proposer=False, data_aware_proposer=False, fewshot_aware_proposer=False,
                )
            elif method == "gepa":
                gepa = dspy.GEPA(
                    metric=metric, max_metric_calls=max(1, budget.limit // 2), reflection_lm=proposer,
                    reflection_minibatch_size=settings.gepa_minibatch, num_threads=settings.num_threads,
                    track_stats=False, seed=seed,
                )
                compiled = gepa.compile(student, trainset=shown, valset=scored)
            else:
                raise ConfigError(f"unknown DSPy method {method!r}")
        except Exception as exc:
            if not (raised_by_budget(exc) or budget.exhausted):
                # The method itself failed (e.g. the proposer's replies could not be parsed): report
                # it, with the best instruction it had judged, rather than lose the other methods.
                logger.warning("%s failed: %s: %s", method, type(exc).__name__, str(exc)[:500])
                stopped = f"failed ({type(exc).__name__})"
            else:
                stopped = "budget"
    if budget.exhausted or compiled is None:
        # Reached the budget (DSPy may also swallow the refused calls as errors and finish) or failed:
        # the best instruction judged on every scored question, by the log, not the optimizer's totals.
        stopped = "budget" if budget.exhausted else stopped
        best = log.best(questions)
        complete = best is not None and best[2] == len(questions)
        instruction = best[0] if complete and best is not None else initial
    else:
        instruction = str(compiled.generate.signature.instructions) if compiled is not None else initial
    per_q = log.scores(questions).get(instruction, {})
    score = sum(per_q.values()) / len(per_q) if per_q else None
    return instruction, score, len(per_q), stopped


# -- the whole comparison --------------------------------------------------------------------------


def run_method(exp: BudgetedExperiment, method: str, *, settings: PeerSettings, out_dir: Path) -> MethodResult:
    budget = CallBudget(settings.budget)
    exp.set_budget(budget)
    before = exp.usage.as_dict()
    started = time.perf_counter()
    try:
        if method in ("opro", "opro-failures"):
            strategy: ExemplarStrategy = "failures" if method == "opro-failures" else "random"
            instruction, score, n, stopped = run_opro(
                exp, budget=budget, settings=settings, strategy=strategy, out_dir=out_dir, name=method
            )
        else:
            instruction, score, n, stopped = run_dspy(exp, method=method, budget=budget, settings=settings)
    finally:
        exp.set_budget(None)
    result = MethodResult(
        method=method, instruction=" ".join(instruction.split()), calls_used=budget.used,
        calls_by_role=budget.by_role(), proposer_calls=_calls_since(exp, before, ["optimizer"], hits=True),
        model_calls=_calls_since(exp, before, BUDGETED_ROLES, hits=False), search_score=score,
        search_questions=n, stopped=stopped, wall_s=time.perf_counter() - started,
    )
    logger.info("%s: %d task + judge calls, %s; instruction %r", method, result.calls_used, stopped, result.instruction[:80])
    return result


def compare_winners(exp: Experiment, results: Sequence[MethodResult], *, seed: int) -> ComparisonReport:
    """The initial instruction and every winner, re-scored by opro's judge on the held-out split."""
    from opro.export.sources import resolve_prompt
    from opro.heldout.compare import compare_prompts

    cfg = exp.config
    initial = resolve_prompt(f"text:{cfg.rag.initial_instructions[0]}", config=cfg)
    prompts = [dataclasses.replace(initial, label="initial")]
    for r in results:
        p = resolve_prompt(f"text:{r.instruction}", config=cfg)
        prompts.append(dataclasses.replace(p, label=LABELS.get(r.method, r.method)))
    return compare_prompts(experiment=exp, prompts=prompts, baseline=0, split="heldout", seed=seed, progress=False)


def run_peers(exp: BudgetedExperiment, *, settings: PeerSettings, out_dir: Path) -> PeersReport:
    """Every method within the budget, then the held-out comparison of their winners."""
    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    results = tuple(run_method(exp, m, settings=settings, out_dir=out_dir) for m in settings.methods)
    over = [r for r in results if r.calls_used > settings.budget]
    if over:  # a bug, not a result: the budgeted clients refuse the call past the budget
        raise AssertionError(f"methods over the budget: {[(r.method, r.calls_used) for r in over]}")
    comparison = compare_winners(exp, results, seed=exp.config.experiment.seed)
    return PeersReport(
        budget=settings.budget, results=results, comparison=comparison,
        initial_instruction=exp.config.rag.initial_instructions[0], wall_s=time.perf_counter() - started,
    )


def log_to_mlflow(report: PeersReport, *, tracking_uri: str, experiment_name: str, params: dict[str, Any],
                  artifacts: Sequence[Path] = ()) -> list[str]:
    """One MLflow run per method (and one for the initial instruction), metrics from the held-out table."""
    from opro.tracking import MlflowTracker

    run_ids = []
    for row in report.rows():
        tracker = MlflowTracker(tracking_uri=tracking_uri, experiment_name=experiment_name)
        run_ids.append(tracker.start(run_name=f"peers: {row['method']}", params={**params, "method": row["method"]}))
        metrics: dict[str, float] = {}
        for key in ("calls_used", "search_score", "heldout_mean", "difference", "p", "wall_s"):
            value = row[key]
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                metrics[key] = float(value)
        if row["heldout_ci"] is not None:
            metrics["heldout_ci_low"], metrics["heldout_ci_high"] = row["heldout_ci"]
        tracker.log_metrics(metrics, step=0)
        tracker.set_tags({"opro.kind": "peers", "opro.instruction": str(row["instruction"])[:5000],
                          "opro.stopped": str(row["stopped"])})
        for path in artifacts:
            if path.exists():
                tracker.log_artifact(path)
        tracker.finish()
    return run_ids


__all__ = [
    "LABELS",
    "METHODS",
    "BudgetedExperiment",
    "MethodResult",
    "PeerSettings",
    "PeersReport",
    "compare_winners",
    "log_to_mlflow",
    "run_dspy",
    "run_method",
    "run_opro",
    "run_peers",
]
