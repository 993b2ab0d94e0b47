"""What a search leaves behind, behind one seam: recorders the OPRO loop calls at its events.

In the spirit of Optuna's callbacks, :class:`~opro.optimizer.OPROOptimizer` proposes, scores and
stops; it knows nothing of the output folder, MLflow or the Prompt Registry. The composition root
(:class:`~opro.experiment.Experiment`) builds the recorders and hands them over, in order:

- :class:`RunDirRecorder` writes the run directory (meta-prompts, ``best_prompt.txt``,
  ``history.jsonl``, ``summary.json``, the plots);
- :class:`MlflowRecorder` keeps the MLflow run (parameters, per-candidate metrics, result metrics,
  the run directory's files as artifacts, tags) and registers the returned prompt;
- :class:`opro.genai.ValidationTraces` records the validation stage as MLflow GenAI evaluation runs.

Who calls what: every worker of a shared study gets ``on_search_start`` (``lead`` says whether it
is worker 0, which proposes and records), ``on_search_end``, ``annotate`` and, when the search
fails, ``on_search_failed``; only the lead gets ``on_meta_prompt``, ``on_step`` and ``on_result``.
A recorder keeps what it needs to resume (which steps it logged, whether it recorded the result)
in the study's user attributes, as the search does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from opro.rundir import RunDir

if TYPE_CHECKING:
    import optuna

    from opro.optimizer import CandidateRecord, OptimizationResult
    from opro.sidecar import Sidecar
    from opro.tracking import MlflowTracker

logger = logging.getLogger(__name__)


T = TypeVar("T")


class Recorder(Protocol):
    """Hooks of the search; every one is optional (the defaults do nothing). A hook that raises stops
    the search as any other error would (recorders that must not slow the search queue their work)."""

    def prepare(self, *, lead: bool) -> None:
        """The run begins; its documents, chunks and study come next. Slow set-up that needs none of
        them (a process, imports) can start here, to overlap that work instead of the first step's
        requests. Followed by :meth:`on_search_start`, or by :meth:`discard` when the run fails first."""
        return None

    def discard(self) -> None:
        """The run failed before its search started (or ended): release what :meth:`prepare` started.
        May follow any other hook, so it must be safe to call twice."""
        return None

    def on_search_start(self, study: optuna.Study, *, lead: bool) -> None:
        """The study is open and its history read; the first step is about to run."""
        return None

    def on_meta_prompt(self, *, step: int, text: str) -> None:
        """The lead rendered the meta-prompt that asks the optimizer LLM for ``step``'s candidates."""
        return None

    def on_step(
        self, study: optuna.Study, *, step: int, history: Sequence[CandidateRecord], best_score: float
    ) -> None:
        """Step ``step`` is finished (by every worker); ``history`` is every candidate so far and
        ``best_score`` the best complete score so far (``-inf`` when none)."""
        return None

    def on_search_end(self, study: optuna.Study) -> None:
        """The steps are over; the validation stage (lead only) comes next."""
        return None

    def on_validated(self, study: optuna.Study, *, label: str, instruction: str) -> None:
        """The validation stage scored every question of one prompt (``label``: ``initial`` or
        ``finalist K``); its scores are in the study. Not called for prompts a rerun found scored."""
        return None

    def annotate(self, result: OptimizationResult) -> OptimizationResult:
        """The result with the fields this recorder fills in (where it recorded the search)."""
        return result

    def on_result(self, study: optuna.Study, result: OptimizationResult) -> None:
        """The lead's final result (its summary is already in the study)."""
        return None

    def on_search_failed(self, study: optuna.Study, error: BaseException, *, abandoned: bool) -> None:
        """The search stopped on ``error`` (``KeyboardInterrupt`` when the user stopped it);
        ``abandoned``: this worker gave up waiting for a lead that is gone."""
        return None


class RunDirRecorder(Recorder):
    """The run directory: every meta-prompt as it is sent, then the result's files and plots."""

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir

    def on_meta_prompt(self, *, step: int, text: str) -> None:
        self.run_dir.write_metaprompt(step, text)

    def annotate(self, result: OptimizationResult) -> OptimizationResult:
        return dataclasses.replace(result, output_dir=self.run_dir.root)

    def on_result(self, study: optuna.Study, result: OptimizationResult) -> None:
        from opro.optimizer import optimism_points
        from opro.plots import plot_optimism, plot_trajectory

        out = self.run_dir
        out.write_result(
            best_template=result.best_template,
            history=[{**asdict(r), "pruned": r.pruned, "partial": r.partial} for r in result.history],
            summary=result.summary(),
        )
        plot_trajectory(
            steps=[r.step for r in result.history],
            scores=[r.score for r in result.history],
            pruned=[r.pruned for r in result.history],
            path=out.trajectory_plot,
        )
        if result.validation is not None and result.validation.finalists:
            plot_optimism(optimism_points(result), path=out.optimism_plot)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


class MlflowRecorder(Recorder):
    """One MLflow run per study, resumed by the run id kept in the study, and the Prompt Registry.

    Tracking calls run on one background thread, in order, so MLflow's store set-up and writes never
    hold the search up; a failed call is raised at the next step boundary. ``params`` are logged when
    the lead starts a new run. ``run_dir``: whose files become the run's artifacts. ``register_prompt``:
    ``(name, alias)`` to register the returned template under. ``sidecar``: the lead's MLflow work
    (imports, store set-up, writes: seconds of CPU) runs in a child process (:attr:`sidecar`, which
    :class:`opro.genai.ValidationTraces` shares), so it never takes this process's GIL from the
    search; without it, on the thread of this process (cheaper where MLflow is already imported).
    """

    def __init__(
        self,
        tracker: MlflowTracker,
        *,
        params: Mapping[str, Any] | None = None,
        run_dir: RunDir | None = None,
        register_prompt: tuple[str, str] | None = None,
        sidecar: bool = False,
    ) -> None:
        self.tracker = tracker
        self.params = dict(params or {})
        self.run_dir = run_dir
        self.register_prompt = register_prompt
        self.use_sidecar = sidecar
        self._sidecar: Sidecar | None = None
        #: Where the tracking calls go: ``tracker`` itself, or its stand-in for the one in the sidecar.
        self._mlflow: Any = tracker
        self._lead = False
        #: The run id the study held when this worker started (a resume continues that run).
        self._run_id: str | None = None
        self._started: Future[str] | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._jobs: list[Future[Any]] = []
        self._released = False

    # -- the tracking thread -------------------------------------------------------------------
    def in_background(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn`` on the one tracking thread, in order, while the search goes on: the tracking
        calls and other MLflow work that should not hold the search up (one thread, so no two import
        MLflow at once). A failure is raised at the next step boundary or when the jobs are drained."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="opro-mlflow")
        job = self._pool.submit(fn, *args)
        self._jobs.append(job)
        return job

    @property
    def sidecar(self) -> Sidecar | None:
        """The child process the MLflow work goes to, once the lead's search started (None: in this process)."""
        return self._sidecar

    def _release(self) -> None:
        if self._sidecar is not None and not self._released:
            self._released = True
            self._sidecar.release()

    def _check(self) -> None:
        """Raise the error of a tracking call that failed (a broken MLflow store)."""
        for job in self._jobs:
            if job.done() and job.exception() is not None:
                self._drain()

    def _drain(self) -> None:
        """Wait for every queued tracking call; raise the first failure."""
        jobs, self._jobs = self._jobs, []
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for job in jobs:
            job.result()

    def _start_sidecar(self) -> None:
        if not self.use_sidecar or self._sidecar is not None:
            return
        import functools

        from opro.sidecar import Sidecar
        from opro.tracking import MlflowTracker

        self._sidecar = Sidecar(name="opro-mlflow").retain()
        self._sidecar.host("tracker", functools.partial(
            MlflowTracker, tracking_uri=self.tracker.tracking_uri, experiment_name=self.tracker.experiment_name))
        self._mlflow = self._sidecar.proxy("tracker")

    # -- hooks -----------------------------------------------------------------------------------
    def prepare(self, *, lead: bool) -> None:
        # The sidecar imports MLflow and opens its store (about 4 s of CPU) while this process loads
        # and chunks the documents, not beside the first step's requests.
        if lead:
            from opro.tracking import check_server

            check_server(self.tracker.tracking_uri)  # before the search spends calls, not after
        if lead and self.use_sidecar:
            self._start_sidecar()
            self.in_background(self._mlflow.open)

    def discard(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._jobs = []
        self._release()

    def on_search_start(self, study: optuna.Study, *, lead: bool) -> None:
        self._lead = lead
        run_id = study.user_attrs.get("mlflow_run_id")
        self._run_id = None if run_id is None else str(run_id)
        if not lead:
            return
        resume = self._run_id
        self._start_sidecar()

        def start_run() -> str:
            rid: str = self._mlflow.start(run_name=study.study_name, params=self.params, resume_run_id=resume)
            self.tracker.run_id = rid  # mirrored here: which run the later calls write to
            study.set_user_attr("mlflow_run_id", rid)
            return rid

        # MLflow's store set-up and run start take seconds: done beside the first step's requests.
        self._started = self.in_background(start_run)

    def on_step(
        self, study: optuna.Study, *, step: int, history: Sequence[CandidateRecord], best_score: float
    ) -> None:
        self.in_background(self._log_step, study, step, list(history), best_score)
        self._check()

    def _log_step(self, study: optuna.Study, step: int, history: Sequence[CandidateRecord], best: float) -> None:
        """Every candidate of a finished step, whichever worker evaluated it, once per run.

        The MLflow step of a candidate is its position in the (step, proposal index) order, the
        same with any number of workers."""
        if self.tracker.run_id is None:
            return
        key = f"mlflow_logged:{self.tracker.run_id}"
        logged = list(study.user_attrs.get(key) or [])
        if step in logged:
            return
        for position, r in enumerate(history):
            if r.step != step:
                continue
            metrics = {"candidate_score": r.score} if r.score is not None else {}
            metrics["candidate_step"] = float(r.step)
            self._mlflow.log_metrics(metrics, step=position)
        if best > -math.inf:
            self._mlflow.log_metrics({"search_best_score": best}, step=step)
        study.set_user_attr(key, [*logged, step])

    def on_search_end(self, study: optuna.Study) -> None:
        if self._started is not None:
            self._run_id = self._started.result()

    @property
    def run_id(self) -> str | None:
        """The MLflow run of the search, once the search ended (None without a run)."""
        return self._run_id

    def annotate(self, result: OptimizationResult) -> OptimizationResult:
        return dataclasses.replace(result, mlflow_run_id=self._run_id)

    def on_result(self, study: optuna.Study, result: OptimizationResult) -> None:
        try:
            self._drain()
            # A rerun of a finished study changes nothing: no second registry version, no repeated metrics.
            digest = _sha(json.dumps(
                {k: v for k, v in result.summary().items() if k not in ("usage", "wall_s")}, sort_keys=True, default=str
            ))
            if study.user_attrs.get("recorded_result") != digest:
                self._log_result(result)
                study.set_user_attr("recorded_result", digest)
            self._mlflow.finish()
        finally:
            self._release()

    def on_search_failed(self, study: optuna.Study, error: BaseException, *, abandoned: bool) -> None:
        # Never leave the MLflow run RUNNING: KILLED when the user stopped it, FAILED otherwise;
        # another worker ends it FAILED when it gives up on a worker 0 that is gone.
        if self._lead:
            try:
                with contextlib.suppress(Exception):  # the tracking store may be what failed
                    self._drain()
                self._mlflow.finish(status="KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED")
            except Exception as exc:  # the search's own error is what the user must see
                logger.warning("the MLflow run %s could not be ended (%s: %s)", self.tracker.run_id,
                               type(exc).__name__, exc)
            finally:
                self._release()
        elif abandoned and self._run_id:
            with contextlib.suppress(Exception):
                self.tracker.run_id = self._run_id
                self.tracker.finish(status="FAILED")

    def _log_result(self, result: OptimizationResult) -> None:
        tracker = self._mlflow
        metrics: dict[str, float] = {"best_score": result.best_score}
        if result.best_search_score is not None:
            metrics["best_search_score"] = result.best_search_score
        if result.initial_score is not None:
            metrics["initial_score"] = result.initial_score
        v = result.validation
        if v is not None:
            if v.initial_score is not None:
                metrics["initial_validation_score"] = v.initial_score
            metrics["gain"] = result.gain if result.gain is not None else 0.0
            for i, f in enumerate(v.finalists):
                if f.validation_score is not None:
                    tracker.log_metrics(
                        {"finalist_search_score": f.search_score, "finalist_validation_score": f.validation_score,
                         "finalist_p_adjusted": f.p_adjusted},
                        step=i,
                    )
        tracker.log_metrics(metrics, step=max((r.step for r in result.history), default=0))
        for role, u in result.usage.items():
            tracker.log_metrics(
                {f"{role}_calls": u["calls"], f"{role}_cache_hits": u["cache_hits"],
                 f"{role}_tokens": u["prompt_tokens"] + u["completion_tokens"]},
                step=0,
            )
        if self.run_dir is not None:
            for path in self.run_dir.optimize_outputs():
                tracker.log_artifact(path)
            if self.run_dir.metaprompts.is_dir():
                tracker.log_artifact(self.run_dir.metaprompts, artifact_path="metaprompts")
        tracker.set_tags({
            "opro.best_instruction": result.best_instruction[:5000],
            "opro.score_basis": result.score_basis,
            "opro.validated": str(result.validated).lower(),
            "opro.headline": result.headline()[:5000],
        })
        if self.register_prompt is not None:
            name, alias = self.register_prompt
            version = tracker.register_prompt(
                name=name,
                template_text=result.best_template,
                alias=alias,
                commit_message=(
                    f"opro study {result.study_name}: {result.score_basis} score {result.best_score:.3f}"
                    + ("" if result.validated or result.score_basis == "search" else " (initial instruction: no validated gain)")
                ),
                tags={
                    "opro.score": f"{result.best_score:.4f}",
                    "opro.score_basis": result.score_basis,
                    "opro.validated": str(result.validated).lower(),
                    "opro.run_id": str(result.mlflow_run_id),
                },
            )
            tracker.set_tags({"opro.prompt_uri": f"prompts:/{name}/{version}"})


__all__ = ["MlflowRecorder", "Recorder", "RunDirRecorder"]
