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

import json
import logging
import math
import socket
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import optuna

from opro.config import OptimizerSection
from opro.errors import LLMError, OproError
from opro.llm import ChatClient, UsageLedger
from opro.metaprompt import (
    Exemplar,
    MetaPromptBuilder,
    ScoredInstruction,
    check_candidate,
    draw_exemplars,
    extract_candidate,
    normalize_instruction,
)
from opro.progress import progress_bar

if TYPE_CHECKING:
    from opro.tracking import MlflowTracker

logger = logging.getLogger(__name__)

OptimizerSettings = OptimizerSection
CandidateStatus = Literal["complete", "pruned", "budget", "failed"]


class _Example(Protocol):
    @property
    def query(self) -> str: ...
    @property
    def reference_answer(self) -> str: ...


class _Answer(Protocol):
    @property
    def text(self) -> str: ...


class _Program(Protocol):
    def answer(self, query: str, *, template: Any = ...) -> _Answer: ...


class _Verdict(Protocol):
    @property
    def score(self) -> float | None: ...
    @property
    def invalid(self) -> bool: ...


class _Judge(Protocol):
    def evaluate(self, *, query: str, answer: str, reference: str) -> Any: ...


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

    @property
    def pruned(self) -> bool:
        return self.status != "complete"


@dataclass(frozen=True)
class OptimizationResult:
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

    def summary(self) -> dict[str, Any]:
        return {
            "best_instruction": self.best_instruction,
            "best_template": self.best_template,
            "best_score": self.best_score,
            "initial_instruction": self.initial_instruction,
            "initial_score": self.initial_score,
            "n_candidates": len(self.history),
            "n_pruned": sum(1 for r in self.history if r.status == "pruned"),
            "stopped_reason": self.stopped_reason,
            "mlflow_run_id": self.mlflow_run_id,
            "study_name": self.study_name,
            "usage": self.usage,
            "wall_s": round(self.wall_s, 2),
        }


class BestSoFarPruner(optuna.pruners.BasePruner):
    """Prune a candidate whose running mean is ``margin`` below the best finished candidate.

    ``warmup`` minibatches are always run, so one unlucky question cannot end a candidate.
    """

    def __init__(self, *, margin: float = 0.5, warmup: int = 1) -> None:
        self.margin = margin
        self.warmup = warmup

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or step + 1 < self.warmup:
            return False
        finished = [
            t.value for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if t.value is not None
        ]
        if not finished:
            return False
        return trial.intermediate_values[step] < max(finished) - self.margin


def make_pruner(settings: OptimizerSettings) -> optuna.pruners.BasePruner:
    if settings.pruner == "none":
        return optuna.pruners.NopPruner()
    if settings.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=max(0, settings.prune_warmup_minibatches - 1))
    return BestSoFarPruner(margin=settings.prune_margin, warmup=settings.prune_warmup_minibatches)


@dataclass
class _Live:
    """A candidate being evaluated in the current step."""

    instruction: str
    trial: optuna.trial.Trial
    scores: list[float | None] = field(default_factory=list)
    n_errors: int = 0
    status: CandidateStatus = "complete"

    def mean(self) -> float | None:
        valid = [s for s in self.scores if s is not None]
        return sum(valid) / len(valid) if valid else None


def _chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class OPROOptimizer:
    """Optimize the instruction of a QA template. Settings here; program and data in :meth:`optimize`."""

    def __init__(
        self,
        *,
        optimizer_llm: ChatClient,
        judge: _Judge,
        make_template: Callable[[str], Any],
        template_text: Callable[[Any], str],
        settings: OptimizerSettings | None = None,
        storage: str,
        study_name: str,
        seed: int = 0,
        tracker: MlflowTracker | None = None,
        run_params: dict[str, Any] | None = None,
        output_dir: Path | None = None,
        usage: UsageLedger | None = None,
        task_workers: int = 1,
        judge_workers: int = 1,
        worker_index: int = 0,
        num_workers: int = 1,
        worker_timeout_s: float = 3600.0,
        progress: bool = True,
        register_prompt: tuple[str, str] | None = None,
    ) -> None:
        if not 0 <= worker_index < num_workers:
            raise OproError(f"worker index {worker_index} must be in [0, {num_workers})")
        self.optimizer_llm = optimizer_llm
        self.judge = judge
        self.make_template = make_template
        self.template_text = template_text
        self.settings = settings or OptimizerSettings()
        self.storage = storage
        self.study_name = study_name
        self.seed = seed
        self.tracker = tracker
        self.run_params = run_params or {}
        self.output_dir = output_dir
        self.usage = usage or optimizer_llm.usage
        self.task_workers = max(1, task_workers)
        self.judge_workers = max(1, judge_workers)
        self.worker_index = worker_index
        self.num_workers = num_workers
        self.worker_timeout_s = worker_timeout_s
        self.progress = progress
        self.register_prompt = register_prompt
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
        if self.storage.startswith("sqlite:///"):
            Path(self.storage.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        from sqlalchemy.exc import IntegrityError, OperationalError

        for attempt in range(5):
            try:
                return optuna.create_study(
                    storage=self.storage,
                    study_name=self.study_name,
                    direction="maximize",
                    pruner=make_pruner(self.settings),
                    load_if_exists=True,
                )
            except (OperationalError, IntegrityError):
                # Workers starting together race to create the schema or the study; the loser retries.
                if attempt == 4:
                    raise
                time.sleep(0.5 * (attempt + 1))
        raise AssertionError("unreachable")

    @staticmethod
    def _records(study: optuna.Study) -> list[CandidateRecord]:
        out = []
        for t in study.get_trials(deepcopy=False):
            attrs = t.user_attrs
            if "instruction" not in attrs or t.state == optuna.trial.TrialState.RUNNING:
                continue
            if t.state == optuna.trial.TrialState.FAIL and attrs.get("status") != "failed":
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
                )
            )
        return sorted(out, key=lambda r: r.trial_number)

    def _fail_stale_trials(self, study: optuna.Study) -> None:
        """Trials this worker left RUNNING when it was interrupted: mark them failed, they are re-run."""

        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            if t.user_attrs.get("worker") == self.worker_index:
                study.tell(t.number, state=optuna.trial.TrialState.FAIL)

    # -- proposals ---------------------------------------------------------------------------
    def _propose(
        self, study: optuna.Study, step: int, history: Sequence[CandidateRecord], exemplar_pool: Sequence[Exemplar]
    ) -> list[str]:
        key = f"proposals:{step}"
        stored = study.user_attrs.get(key)
        if stored is not None:
            return list(stored)
        if self.worker_index != 0:
            # Worker 0 proposes; the others read its proposals from the shared study.
            return list(self._wait_for(lambda: study.user_attrs.get(key), what=f"worker 0's proposals for step {step}"))
        scored = [ScoredInstruction(r.instruction, r.score) for r in history if r.score is not None and r.status == "complete"]
        exemplars = draw_exemplars(exemplar_pool, k=self.settings.exemplars, step=step, seed=self.seed)
        meta_prompt = self.meta.render(history=scored, exemplars=exemplars)
        if self.output_dir is not None:
            (self.output_dir / "metaprompts").mkdir(parents=True, exist_ok=True)
            (self.output_dir / "metaprompts" / f"step_{step:03d}.txt").write_text(meta_prompt, encoding="utf-8")
        seen = {normalize_instruction(r.instruction) for r in history}
        accepted: list[str] = []
        rejected: list[dict[str, str]] = []
        k = self.settings.candidates_per_step
        # A few extra samples make up for rejected candidates; bounded so a bad optimizer cannot loop.
        for sample_index in range(3 * k):
            if len(accepted) >= k:
                break
            reply = self.optimizer_llm.complete(
                meta_prompt,
                temperature=self.settings.temperature,
                max_tokens=self.settings.max_tokens,
                sample_index=step * 1000 + sample_index,
            )
            verdict = check_candidate(
                extract_candidate(reply.text, answer_format=self.settings.answer_format),
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

    def _wait_for(self, probe: Callable[[], Any], *, what: str) -> Any:
        deadline = time.monotonic() + self.worker_timeout_s
        while time.monotonic() < deadline:
            value = probe()
            if value is not None:
                return value
            time.sleep(1.0)
        raise OproError(f"worker {self.worker_index}: timed out after {self.worker_timeout_s:.0f}s waiting for {what}")

    # -- evaluation --------------------------------------------------------------------------
    def _budget_left(self) -> bool:
        s = self.settings
        if s.max_calls and self.usage.total_calls() >= s.max_calls:
            return False
        return not (s.max_tokens_budget and self.usage.total_tokens() >= s.max_tokens_budget)

    def _score_pair(self, program: _Program, instruction: str, example: _Example) -> float | LLMError | None:
        try:
            answer = program.answer(example.query, template=self.make_template(instruction))
            verdict: _Verdict = self.judge.evaluate(
                query=example.query, answer=answer.text, reference=example.reference_answer
            )
        except LLMError as exc:
            logger.warning("candidate %r, question %r: %s", instruction[:60], example.query[:60], exc)
            return exc
        return None if verdict.invalid else verdict.score

    def _evaluate_step(
        self,
        study: optuna.Study,
        step: int,
        instructions: Sequence[str],
        program: _Program,
        examples: Sequence[_Example],
    ) -> list[CandidateRecord]:
        live: list[_Live] = []
        for idx, instruction in enumerate(instructions):
            trial = study.ask()
            trial.set_user_attr("instruction", instruction)
            trial.set_user_attr("step", step)
            trial.set_user_attr("index", idx)
            trial.set_user_attr("worker", self.worker_index)
            trial.set_user_attr("host", socket.gethostname())
            live.append(_Live(instruction, trial))
        batches = _chunks(examples, self.settings.minibatch_size)
        workers = max(self.task_workers, 1)
        with progress_bar(
            f"step {step}: {len(live)} candidate(s)", total=len(live) * len(examples), enabled=self.progress
        ) as bar:
            for b, batch in enumerate(batches):
                active = [c for c in live if c.status == "complete"]
                if not active:
                    break
                if not self._budget_left():
                    for c in active:
                        c.status = "budget"
                    break
                # Question-major order: consecutive calls share the retrieved context (KV-prefix reuse).
                pairs = [(c, ex) for ex in batch for c in active]
                with ThreadPoolExecutor(max_workers=workers) as pool:
                    results = list(pool.map(lambda p: self._score_pair(program, p[0].instruction, p[1]), pairs))
                for (c, _), result in zip(pairs, results, strict=True):
                    if isinstance(result, LLMError):
                        c.n_errors += 1
                        c.scores.append(None)
                    else:
                        c.scores.append(result)
                    bar.advance()
                for c in active:
                    mean = c.mean()
                    if mean is None:
                        continue
                    c.trial.report(mean, b)
                    if b + 1 < len(batches) and c.trial.should_prune():
                        c.status = "pruned"
                        bar.advance(len(examples) - len(c.scores))
        records = []
        for c in live:
            mean = c.mean()
            n_scored = sum(1 for s in c.scores if s is not None)
            n_invalid = len(c.scores) - n_scored - c.n_errors
            status: CandidateStatus = c.status if mean is not None else "failed"
            attrs = {
                "score": mean,
                "n_scored": n_scored,
                "n_invalid": n_invalid,
                "n_errors": c.n_errors,
                "status": status,
                "scores": list(c.scores),
            }
            for k, v in attrs.items():
                c.trial.set_user_attr(k, v)
            if status == "complete":
                study.tell(c.trial, mean)
            elif status == "failed":
                study.tell(c.trial, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(c.trial, state=optuna.trial.TrialState.PRUNED)
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
                )
            )
        return records

    # -- the loop ----------------------------------------------------------------------------
    def optimize(
        self,
        *,
        program: _Program,
        optimization_set: Sequence[_Example],
        exemplar_set: Sequence[_Example] = (),
        initial_instructions: Sequence[str],
    ) -> OptimizationResult:
        if not optimization_set:
            raise OproError("the optimization split is empty: give the dataset an optimization split")
        if not initial_instructions:
            raise OproError("give at least one initial instruction")
        started = time.perf_counter()
        study = self._study()
        self._fail_stale_trials(study)
        history = self._records(study)
        run_id = study.user_attrs.get("mlflow_run_id") if self.worker_index == 0 else None
        if self.tracker is not None and self.worker_index == 0:
            run_id = self.tracker.start(run_name=self.study_name, params=self.run_params, resume_run_id=run_id)
            study.set_user_attr("mlflow_run_id", run_id)
        exemplar_pool = [Exemplar(e.query, e.reference_answer) for e in exemplar_set]
        stopped = "steps"
        best_so_far = -math.inf
        steps_without_gain = 0
        try:
            for step in range(self.settings.steps + 1):
                done_here = {normalize_instruction(r.instruction) for r in history if r.step == step}
                if step == 0:
                    proposals = list(dict.fromkeys(i.strip() for i in initial_instructions if i.strip()))
                else:
                    if not self._budget_left():
                        stopped = "budget"
                        break
                    proposals = self._propose(study, step, history, exemplar_pool)
                mine = [
                    p for i, p in enumerate(proposals)
                    if i % self.num_workers == self.worker_index and normalize_instruction(p) not in done_here
                ]
                if mine:
                    new = self._evaluate_step(study, step, mine, program, optimization_set)
                    history.extend(new)
                    self._log_candidates(new)
                if self.num_workers > 1:
                    history = self._wait_for_step(study, step, len(proposals))
                step_best = max((r.score for r in history if r.step == step and r.status == "complete" and r.score is not None), default=-math.inf)
                if step_best > best_so_far + 1e-9:
                    best_so_far = step_best
                    steps_without_gain = 0
                elif step > 0:
                    steps_without_gain += 1
                if self.tracker is not None and self.worker_index == 0 and best_so_far > -math.inf:
                    self.tracker.log_metrics({"best_score": best_so_far}, step=step)
                if any(r.status == "budget" for r in history) or not self._budget_left():
                    stopped = "budget"
                    break
                if self.settings.patience and steps_without_gain >= self.settings.patience:
                    stopped = "patience"
                    break
        except BaseException:
            if self.tracker is not None and self.worker_index == 0:
                self.tracker.finish(status="KILLED")
            raise
        history = self._records(study)
        result = self._result(history, stopped=stopped, run_id=run_id, wall_s=time.perf_counter() - started,
                              initial=initial_instructions[0])
        if self.worker_index == 0:
            self._write_outputs(result)
        return result

    def _wait_for_step(self, study: optuna.Study, step: int, n: int) -> list[CandidateRecord]:
        def probe() -> list[CandidateRecord] | None:
            records = self._records(study)
            return records if sum(1 for r in records if r.step == step) >= n else None

        return list(self._wait_for(probe, what=f"the other workers to finish step {step}"))

    def _log_candidates(self, records: Sequence[CandidateRecord]) -> None:
        if self.tracker is None:
            return
        for r in records:
            metrics = {"candidate_score": r.score} if r.score is not None else {}
            metrics["candidate_step"] = float(r.step)
            self.tracker.log_metrics(metrics, step=r.trial_number)

    def _result(
        self, history: list[CandidateRecord], *, stopped: str, run_id: str | None, wall_s: float, initial: str
    ) -> OptimizationResult:
        complete = [r for r in history if r.status == "complete" and r.score is not None]
        if not complete:
            raise OproError(
                "no candidate was scored: every judge reply was invalid or every call failed; "
                "check the judge model and the logs"
            )
        # Highest mean; ties go to the earlier candidate (the initial instruction first).
        best = max(complete, key=lambda r: (r.score, -r.trial_number))
        initial_rec = next((r for r in history if r.step == 0 and r.instruction == initial.strip()), None)
        return OptimizationResult(
            best_instruction=best.instruction,
            best_template=self.template_text(self.make_template(best.instruction)),
            best_score=float(best.score),  # type: ignore[arg-type]
            initial_instruction=initial.strip(),
            initial_score=initial_rec.score if initial_rec else None,
            history=tuple(history),
            usage=self.usage.as_dict(),
            stopped_reason=stopped,
            mlflow_run_id=run_id,
            study_name=self.study_name,
            storage=self.storage,
            wall_s=wall_s,
            output_dir=self.output_dir,
        )

    def _write_outputs(self, result: OptimizationResult) -> None:
        out = self.output_dir
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "best_prompt.txt").write_text(result.best_template, encoding="utf-8")
            with (out / "history.jsonl").open("w", encoding="utf-8") as fh:
                for r in result.history:
                    fh.write(json.dumps({**asdict(r), "pruned": r.pruned}) + "\n")
            (out / "summary.json").write_text(json.dumps(result.summary(), indent=2), encoding="utf-8")
            from opro.tracking import plot_trajectory

            plot_trajectory(
                steps=[r.step for r in result.history],
                scores=[r.score for r in result.history],
                pruned=[r.pruned for r in result.history],
                path=out / "score_trajectory.png",
            )
        if self.tracker is None:
            return
        self.tracker.log_metrics(
            {"best_score": result.best_score, **({"initial_score": result.initial_score} if result.initial_score is not None else {})},
            step=max((r.step for r in result.history), default=0),
        )
        for role, u in result.usage.items():
            self.tracker.log_metrics(
                {f"{role}_calls": u["calls"], f"{role}_cache_hits": u["cache_hits"],
                 f"{role}_tokens": u["prompt_tokens"] + u["completion_tokens"]},
                step=0,
            )
        if out is not None:
            for name in ("best_prompt.txt", "history.jsonl", "summary.json", "score_trajectory.png"):
                self.tracker.log_artifact(out / name)
            if (out / "metaprompts").is_dir():
                self.tracker.log_artifact(out / "metaprompts", artifact_path="metaprompts")
        self.tracker.set_tags({"opro.best_instruction": result.best_instruction[:5000]})
        if self.register_prompt is not None:
            name, alias = self.register_prompt
            version = self.tracker.register_prompt(
                name=name,
                template_text=result.best_template,
                alias=alias,
                commit_message=f"opro best of study {self.study_name}: score {result.best_score:.3f}",
                tags={"opro.score": f"{result.best_score:.4f}", "opro.run_id": str(result.mlflow_run_id)},
            )
            self.tracker.set_tags({"opro.prompt_uri": f"prompts:/{name}/{version}"})
        self.tracker.finish()


__all__ = [
    "BestSoFarPruner",
    "CandidateRecord",
    "OPROOptimizer",
    "OptimizationResult",
    "OptimizerSettings",
    "make_pruner",
]
