"""The MLflow recorder: one MLflow run per study, resumed by the run id kept in the study, and the
Prompt Registry version of the returned prompt; and :func:`search_recorders`, the recorders a search
records through under a config (the composition root never names them).

What the MLflow recorder keeps in the study (:meth:`~opro.search.study.SearchStudy.recorder_state`),
so a rerun or another worker resumes into the same run and logs nothing twice::

    mlflow_run_id             the MLflow run of the search
    mlflow_logged:<run id>    steps whose candidates that run has logged
    recorded_result           digest of the result the MLflow recorder recorded
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final, TypeVar

from opro.paths import RunDir
from opro.program.dimensions import SETTINGS
from opro.redaction import redact_url
from opro.search.records import Recorded, Recorder

if TYPE_CHECKING:
    from opro.search.results import CandidateRecord, OptimizationResult
    from opro.search.study import SearchStudy
    from opro.tracking.mlflow import MlflowTracker
    from opro.tracking.sidecar import Sidecar

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: What a registered version says when the run returned the initial instruction (no finalist shown better).
INITIAL_NOTE: Final = "initial instruction, no gain shown"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


class _State:
    """The MLflow recorder's keys in the study (the module docstring lists them; byte for byte the
    names earlier versions stored, so their studies resume into the same run)."""

    RUN_ID: Final = "mlflow_run_id"
    RESULT: Final = "recorded_result"

    @staticmethod
    def logged(run_id: str) -> str:
        return f"mlflow_logged:{run_id}"


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

    #: Where it records, as :class:`opro.search.records.Recorded` names it (the command recorder's name too).
    name = "mlflow"

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

        from opro.tracking.mlflow import MlflowTracker
        from opro.tracking.sidecar import Sidecar

        self._sidecar = Sidecar(name="opro-mlflow").retain()
        self._sidecar.host("tracker", functools.partial(
            MlflowTracker, tracking_uri=self.tracker.tracking_uri, experiment_name=self.tracker.experiment_name))
        self._mlflow = self._sidecar.proxy("tracker")

    # -- hooks -----------------------------------------------------------------------------------
    def prepare(self, *, lead: bool) -> None:
        # The sidecar imports MLflow and opens its store (about 4 s of CPU) while this process loads
        # and chunks the documents, not beside the first step's requests.
        if lead:
            from opro.tracking.mlflow import check_server

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

    def on_search_start(self, study: SearchStudy, *, lead: bool) -> None:
        self._lead = lead
        stored = study.recorder_state(_State.RUN_ID)
        self._run_id = None if stored is None else str(stored)
        if not lead:
            return
        resume = self._run_id
        self._start_sidecar()

        def start_run() -> str:
            rid: str = self._mlflow.start(run_name=study.name, params=self.params, resume_run_id=resume)
            self.tracker.run_id = rid  # mirrored here: which run the later calls write to
            study.set_recorder_state(_State.RUN_ID, rid)
            return rid

        # MLflow's store set-up and run start take seconds: done beside the first step's requests.
        self._started = self.in_background(start_run)

    def on_step(
        self, study: SearchStudy, *, step: int, history: Sequence[CandidateRecord], best_score: float
    ) -> None:
        self.in_background(self._log_step, study, step, list(history), best_score)
        self._check()

    def _log_step(self, study: SearchStudy, step: int, history: Sequence[CandidateRecord], best: float) -> None:
        """Every candidate of a finished step, whichever worker evaluated it, once per run.

        The MLflow step of a candidate is its position in the (step, proposal index) order, the
        same with any number of workers."""
        if self.tracker.run_id is None:
            return
        logged = [int(s) for s in study.recorder_state(_State.logged(self.tracker.run_id)) or []]
        if step in logged:
            return
        for position, r in enumerate(history):
            if r.step != step:
                continue
            metrics = {"candidate_score": r.score} if r.score is not None else {}
            metrics["candidate_step"] = float(r.step)
            # Its values of the open search dimensions, one series each (the trial's Optuna params).
            metrics.update({f"candidate_{name}": float(v) for name, v in r.params.items()
                            if not isinstance(v, str)})  # a choice of strings: in the trial's params, not a metric
            if r.cost is not None:  # means per answer of its task calls (opro.program.cost)
                metrics.update({"candidate_cost": r.cost.cost, "candidate_prompt_tokens": r.cost.prompt_tokens,
                                "candidate_completion_tokens": r.cost.completion_tokens, "candidate_seconds": r.cost.seconds})
            self._mlflow.log_metrics(metrics, step=position)
        if best > -math.inf:
            self._mlflow.log_metrics({"search_best_score": best}, step=step)
        study.set_recorder_state(_State.logged(self.tracker.run_id), [*logged, step])

    def on_search_end(self, study: SearchStudy) -> None:
        if self._started is not None:
            self._run_id = self._started.result()

    @property
    def run_id(self) -> str | None:
        """The MLflow run of the search, once the search ended (None without a run)."""
        return self._run_id

    def recorded(self) -> Recorded | None:
        if self._run_id is None:
            return None
        return Recorded(recorder=self.name, ref=self._run_id,
                        where=f"MLflow run {self._run_id} in {redact_url(self.tracker.tracking_uri)}")

    def on_result(self, study: SearchStudy, result: OptimizationResult) -> None:
        try:
            self._drain()
            # A rerun of a finished study changes nothing: no second registry version, no repeated metrics.
            digest = _sha(json.dumps(
                {k: v for k, v in result.summary().items() if k not in ("usage", "wall_s")}, sort_keys=True, default=str
            ))
            if study.recorder_state(_State.RESULT) != digest:
                self._log_result(result)
                study.set_recorder_state(_State.RESULT, digest)
            self._mlflow.finish()
        finally:
            self._release()

    def on_search_failed(self, study: SearchStudy, error: BaseException, *, abandoned: bool) -> None:
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
        # Every metric names its basis (search: the optimization questions, in-sample; validation:
        # questions the search never selected on); best_score's is the opro.score_basis tag. No
        # claimed gain is no "gain" metric and the tag opro.gain = none, never a gain of 0.
        metrics: dict[str, float] = {"best_score": result.best_score}
        if result.best_search_score is not None:
            metrics["best_search_score"] = result.best_search_score
        if result.initial_score is not None:
            metrics["initial_search_score"] = result.initial_score
        v = result.validation
        if v is not None:
            if v.initial_score is not None:
                metrics["initial_validation_score"] = v.initial_score
            metrics["validation_questions"] = v.n_questions
            if result.gain is not None:
                metrics["gain"] = result.gain
                if result.gain_ci is not None:
                    low, high = result.gain_ci
                    if math.isfinite(low):  # open below (a claim too rare to simulate lower): no lower end
                        metrics["gain_ci_low"] = low
                    metrics["gain_ci_high"] = high
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
        if result.best_params:  # the returned configuration's values of the open search dimensions
            tracker.log_params({f"best.{name}": v for name, v in result.best_params.items()})
        tracker.set_tags({
            "opro.best_instruction": result.best_instruction[:5000],
            "opro.score_basis": result.score_basis,
            "opro.score_label": result.score_label,
            "opro.gain": "none" if result.gain is None else f"{result.gain:.4f}",
            "opro.validated": str(result.validated).lower(),
            "opro.headline": result.headline()[:5000],
            **({"opro.re_decided": "true"} if v is not None and v.re_decided else {}),  # seen_validation = "label"
        })
        if self.register_prompt is not None:
            name, alias = self.register_prompt
            version = tracker.register_prompt(
                name=name,
                template_text=result.best_template,
                alias=alias,
                # The alias moves to what the run returns, the initial instruction included (what `best`
                # resolves to), but then says so: a reader of the registry must not take it for a tuned prompt.
                commit_message=(
                    f"opro study {result.study_name}: {result.score_basis} score {result.best_score:.3f}"
                    + (f" ({INITIAL_NOTE})" if result.returned_is_initial else "")
                ),
                tags={
                    "opro.score": f"{result.best_score:.4f}",
                    "opro.score_basis": result.score_basis,
                    "opro.score_label": result.score_label,
                    "opro.gain": "none" if result.gain is None else f"{result.gain:.4f}",
                    "opro.validated": str(result.validated).lower(),
                    "opro.run_id": str(self._run_id),
                    **({"opro.returned": INITIAL_NOTE} if result.returned_is_initial else {}),
                    **({"opro.run_dir": str(self.run_dir.root.resolve())} if self.run_dir is not None else {}),
                    # Not text of the template, answered with it (the demonstrations are in the text).
                    **{f"opro.{k}": str(v) for k, v in result.best_configuration.items()
                       if k in SETTINGS},
                },
            )
            tracker.set_tags({"opro.prompt_uri": f"prompts:/{name}/{version}"})


__all__ = ["INITIAL_NOTE", "MlflowRecorder"]
