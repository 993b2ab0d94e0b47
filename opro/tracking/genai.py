"""MLflow 3 GenAI records of finished evaluations: evaluation datasets, evaluation runs, traces, assessments.

opro's evaluations (``opro compare``, ``opro evaluate``, the validation stage of ``opro optimize``)
end in per-question rows: the question, the retrieved chunks, the answer, token usage and the
judge's score and reasoning. This module turns those finished rows into the objects MLflow 3's
GenAI UI is built on:

- each split of the golden dataset as an *evaluation dataset* (inputs: ``question``; expectations:
  ``expected_response``, the reference answer, and ``reference_contexts``) linked to the experiment;
- each prompt's evaluation as an *evaluation run* made by :func:`mlflow.genai.evaluate`, whose rows
  are traces (a retriever span with the chunks, an LLM span with the rendered prompt, the answer
  and token usage) carrying the judge's verdict as feedback assessments;
- the prompt as a Prompt Registry version linked to its runs and traces.

Nothing is asked of an LLM here: ``mlflow.genai.evaluate`` gets a *replay* ``predict_fn`` that
re-emits each finished row as a trace, and a scorer that returns the verdict the judge already
gave. Re-scoring would be a new judge call (or, with opro's call cache, a lookup) for the same
number. The search's candidates stay numeric metrics of the optimization run: only finished
evaluations are traced, so the search loop is never slowed (see experiments/bench_genai_logging.py).

``mlflow.genai.evaluate`` and the tracing API read MLflow's process-wide tracking URI and active
experiment; :func:`_use_store` sets both for the duration of one call under a lock and restores
them, so the rest of opro keeps its explicit per-store clients.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from opro.errors import OproError
from opro.records import Recorded
from opro.redaction import redact_text, redact_url
from opro.search.recorder import Recorder
from opro.tracking.commands import mlflow_run_of
from opro.tracking.recorder import MlflowRecorder

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from opro.data.dataset import Example, GoldenDataset
    from opro.evaluation.batch import EvaluationReport, EvaluationRow
    from opro.judges.metrics import Metric
    from opro.judges.mlflow_correctness import MlflowCorrectnessJudge
    from opro.llm import ChatClient
    from opro.program.prompts import QATemplate
    from opro.records import Recorded
    from opro.search.results import OptimizationResult
    from opro.search.study import SearchStudy
    from opro.tracking.sidecar import Sidecar
    from opro.workbench import Workbench

logger = logging.getLogger(__name__)

#: The expectation key MLflow's built-in Correctness judge reads the reference answer from.
EXPECTED_RESPONSE = "expected_response"
REFERENCE_CONTEXTS = "reference_contexts"
#: Feedback names on each trace.
CORRECTNESS = "correctness"
PASSING = "passing"

_STORE_LOCK = threading.RLock()


@contextmanager
def _use_store(tracking_uri: str, experiment_id: str) -> Iterator[None]:
    """MLflow's global tracking URI, registry URI and active experiment, for one call, restored after."""
    # mlflow.genai imports litellm, which otherwise downloads its price map and hangs offline.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import sys

    import mlflow
    from mlflow.tracking import _model_registry, fluent
    from mlflow.tracking._tracking_service import utils as tracking_utils

    _import_harness()
    # The replay always emits its trace: MLflow's check that predict_fn traces (one extra call) is moot.
    # One harness worker: the replay is CPU, not waiting on a model, and ten workers writing traces and
    # assessments into one SQLite file held every connection of SQLAlchemy's pool (15) waiting on its
    # write lock; after 30 s MLflow dropped the trace ("QueuePool limit ... reached"), a different number
    # of them each run (issue 49: 24-29 of 48 traces kept, on a loaded machine).
    env = {"MLFLOW_EXPERIMENT_ID": experiment_id, "MLFLOW_GENAI_EVAL_SKIP_TRACE_VALIDATION": "True",
           "MLFLOW_GENAI_EVAL_MAX_WORKERS": "1"}
    # Each evaluate imports the Databricks SDK first (5-30 s on a busy 2-core machine) so that its
    # worker threads could use it; off Databricks nothing does. Hide it for the call unless loaded.
    hide_sdk = not tracking_uri.startswith("databricks") and "databricks.sdk" not in sys.modules
    # Each predict_fn call runs in MLflow's retry context, which imports litellm (3-10 s of CPU, 2,400
    # modules with openai) to ask whether litellm's retries are active; opro's replay and scorers
    # make no LLM calls. Hidden for the call unless something already loaded it.
    hide_litellm = "litellm" not in sys.modules
    # Each evaluate turns autologging on for every installed flavor through post-import hooks, which
    # imports them (mlflow.llama_index pulls in llama_index.core, NLTK, SciPy) while holding MLflow's
    # import-hook lock; every other import in the process waits on that lock, so an import on another
    # thread at that moment can deadlock with it. The replay makes no LLM call there is to trace:
    # autologging stays off for the call (as if disabled by the user), restored after.
    from mlflow.ml_package_versions import FLAVOR_TO_MODULE_NAME
    from mlflow.utils.autologging_utils import AUTOLOGGING_INTEGRATIONS

    with _STORE_LOCK:
        old_autolog = {flavor: AUTOLOGGING_INTEGRATIONS.get(flavor) for flavor in FLAVOR_TO_MODULE_NAME}
        for flavor, conf in old_autolog.items():
            AUTOLOGGING_INTEGRATIONS[flavor] = {**(conf or {}), "disable": True}
        if hide_sdk:
            sys.modules["databricks.sdk"] = None  # type: ignore[assignment]
        if hide_litellm:
            sys.modules["litellm"] = None  # type: ignore[assignment]
        old_experiment = fluent._active_experiment_id
        # mlflow.set_registry_uri also exports MLFLOW_REGISTRY_URI, which would outlive the call.
        old_env = {k: os.environ.get(k) for k in (*env, "MLFLOW_REGISTRY_URI")}
        old_registry = _model_registry.utils._registry_uri
        try:
            with tracking_utils._use_tracking_uri(tracking_uri):
                mlflow.set_registry_uri(tracking_uri)
                mlflow.set_experiment(experiment_id=experiment_id)
                os.environ.update(env)
                yield
        finally:
            fluent._active_experiment_id = old_experiment
            for k, v in old_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            _model_registry.utils._registry_uri = old_registry
            for flavor, conf in old_autolog.items():
                if conf is None:
                    AUTOLOGGING_INTEGRATIONS.pop(flavor, None)
                else:
                    AUTOLOGGING_INTEGRATIONS[flavor] = conf
            if hide_sdk and sys.modules.get("databricks.sdk", 0) is None:
                del sys.modules["databricks.sdk"]
            if hide_litellm and sys.modules.get("litellm", 0) is None:
                del sys.modules["litellm"]


def _import_harness() -> None:
    """Import MLflow's evaluation harness without importing litellm, unless something else already did.

    The harness imports litellm eagerly (3-10 s) only so that LLM scorers in its worker threads never
    import it for the first time there; opro's scorers make no LLM calls. Blocking the import for
    this one module load keeps ``opro compare`` and ``opro optimize`` that much faster.
    """
    import sys

    if "mlflow.genai.evaluation.harness" in sys.modules or "litellm" in sys.modules:
        return
    sys.modules["litellm"] = None  # type: ignore[assignment]  # `import litellm` raises ImportError
    try:
        import mlflow.genai.evaluation.harness  # noqa: F401
    finally:
        del sys.modules["litellm"]


@dataclass(frozen=True)
class PromptEvaluation:
    """One prompt's finished evaluation: the template it ran with and its per-question rows."""

    label: str
    template: QATemplate
    report: EvaluationReport
    #: Extra tags for its evaluation run (``opro.spec``, ``opro.role``...).
    tags: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EvaluationRunRecord:
    label: str
    run_id: str
    prompt_uri: str | None
    trace_ids: tuple[str, ...]


@dataclass(frozen=True)
class GenAIRecord:
    """What :meth:`GenAILogger.log_evaluations` wrote."""

    experiment_id: str
    dataset_name: str
    dataset_id: str
    runs: tuple[EvaluationRunRecord, ...]

    @property
    def run_ids(self) -> tuple[str, ...]:
        return tuple(r.run_id for r in self.runs)

    def recorded(self, tracking_uri: str) -> tuple[Recorded, ...]:
        """Where each evaluation run went, as every recorder says it (:class:`opro.records.Recorded`)."""
        return tuple(Recorded(recorder="mlflow", ref=r.run_id, where=f"MLflow evaluation run {r.run_id} "
                              f"({len(r.trace_ids)} traces) in {redact_url(tracking_uri)}") for r in self.runs)


def dataset_name(prefix: str, split: str, content_hash: str) -> str:
    """One evaluation dataset per split and dataset content: a changed dataset never merges into an old one."""
    return f"{prefix}.{split}.{content_hash[:8]}"


def _records(examples: Sequence[Any]) -> list[dict[str, Any]]:
    return [
        {
            "inputs": {"question": redact_text(e.query)},
            "expectations": {
                EXPECTED_RESPONSE: redact_text(e.reference_answer),
                REFERENCE_CONTEXTS: [redact_text(c) for c in e.reference_contexts],
            },
        }
        for e in examples
    ]


class GenAILogger:
    """Writes evaluation datasets and evaluation runs into one MLflow store and experiment."""

    def __init__(
        self,
        *,
        tracking_uri: str,
        experiment_name: str,
        dataset_prefix: str,
        prompt_name: str | None = None,
        task_model: str = "",
        judge_name: str = CORRECTNESS,
        judge_model: str = "",
        judge_threshold: float = 4.0,
        context_separator: str = "\n\n",
    ) -> None:
        from opro.tracking.mlflow import MlflowTracker

        self.tracking_uri = tracking_uri
        self._tracker = MlflowTracker(tracking_uri=tracking_uri, experiment_name=experiment_name)
        self.client: MlflowClient = self._tracker.client
        self.dataset_prefix = dataset_prefix
        self.prompt_name = prompt_name
        self.task_model = task_model
        self.judge_name = judge_name
        self.judge_model = judge_model
        self.judge_threshold = judge_threshold
        self.context_separator = context_separator

    @property
    def experiment_id(self) -> str:
        return self._tracker.experiment_id()

    # -- datasets ----------------------------------------------------------------------------
    def register_dataset(self, dataset: GoldenDataset, *, split: str, extension: Sequence[Example] = ()) -> Any:
        """The ``split`` of ``dataset`` as an MLflow evaluation dataset linked to the experiment; with
        ``extension`` (questions in no split that a validation stage asked beyond its split), the split
        and those questions, as a dataset of their own (``<prefix>.validation+extension.<hash>``): the
        split's own dataset keeps exactly the split's questions.

        Idempotent: an existing dataset of the same name (split + content hash) is reused, and
        records merge by their inputs, so a rerun adds nothing.
        """
        from mlflow.genai import datasets as mlflow_datasets

        examples = [*dataset.examples_in(split), *extension]  # type: ignore[arg-type]
        name = dataset_name(self.dataset_prefix, split, dataset.content_hash)
        if extension:
            digest = hashlib.sha256("\n".join([dataset.content_hash, *(e.query for e in extension)]).encode())
            name = dataset_name(self.dataset_prefix, f"{split}+extension", digest.hexdigest())
        exp_id = self.experiment_id
        with _use_store(self.tracking_uri, exp_id):
            found = mlflow_datasets.search_datasets(experiment_ids=[exp_id], filter_string=f"name = '{name}'")
            existing = [d for d in found if d.name == name]
            if existing:
                ds = existing[0]
            else:
                ds = mlflow_datasets.create_dataset(
                    name=name,
                    experiment_id=[exp_id],
                    tags={"opro.split": split, "opro.dataset_hash": dataset.content_hash,
                          "opro.n_questions": str(len(examples)),
                          **({"opro.extension_questions": str(len(extension))} if extension else {})},
                )
            if examples and _record_count(ds) < len(examples):
                ds.merge_records(_records(examples))
        return ds

    def records(self, dataset_id: str) -> list[dict[str, Any]]:
        """The records of an evaluation dataset in this store (``inputs``, ``expectations``...)."""
        from mlflow.genai import datasets as mlflow_datasets

        with _use_store(self.tracking_uri, self.experiment_id):
            df = mlflow_datasets.get_dataset(dataset_id=dataset_id).to_df()
        return list(df.to_dict(orient="records"))

    def register_datasets(self, dataset: GoldenDataset) -> dict[str, Any]:
        """Every non-empty split of ``dataset`` (see :meth:`register_dataset`)."""
        from opro.data.dataset import SPLIT_NAMES

        return {s: self.register_dataset(dataset, split=s) for s in SPLIT_NAMES if dataset.examples_in(s)}

    # -- prompts -----------------------------------------------------------------------------
    def prompt_version(self, template_text: str, *, commit_message: str) -> Any | None:
        """The registry version holding ``template_text``: an existing one, else a new version."""
        if not self.prompt_name:
            return None
        from mlflow.exceptions import MlflowException

        from opro.tracking.mlflow import to_mlflow_template

        wanted = to_mlflow_template(template_text)

        def find() -> Any | None:
            token = None
            while True:
                try:
                    page = self.client.search_prompt_versions(self.prompt_name, max_results=100, page_token=token)
                except MlflowException:
                    return None  # no such prompt yet
                for v in page:
                    if str(v.template) == wanted:
                        return v
                token = page.token
                if not token:
                    return None

        found = find()
        if found is not None:
            return found
        number = self._tracker.register_prompt(
            name=self.prompt_name, template_text=template_text, alias=None, commit_message=commit_message,
            tags={"opro.source": "evaluation"},
        )
        return self.client.get_prompt_version(self.prompt_name, number)

    # -- the validation stage of a search ------------------------------------------------------
    def prewarm(self, dataset: GoldenDataset) -> None:
        """The records' fixed costs, paid before the first evaluation: MLflow's evaluation harness
        imported and every split of ``dataset`` registered."""
        _import_harness()
        import mlflow.genai.scorers  # noqa: F401  (what evaluate imports on its first call)

        self.register_datasets(dataset)

    def set_run_tag(self, run_id: str, key: str, value: str) -> None:
        self.client.set_tag(run_id, key, redact_text(value))

    def validation_recorded(self, *, label: str, optimization_run_id: str) -> bool:
        """Whether the optimization run's validation stage already has a finished run for ``label``."""
        return any(r.info.status == "FINISHED" for r in self._validation_runs(label, optimization_run_id))

    def _validation_runs(self, label: str, optimization_run_id: str) -> list[Any]:
        return list(self.client.search_runs(
            [self.experiment_id],
            filter_string=(f"tags.`opro.optimization_run_id` = '{optimization_run_id}' and tags.`opro.source` = "
                           f"'validation' and tags.`opro.prompt_label` = '{label}'"),
            max_results=100,
        ))

    def log_validation(
        self, evaluation: PromptEvaluation, *, dataset: GoldenDataset, study_name: str,
        optimization_run_id: str | None,
    ) -> GenAIRecord | None:
        """One prompt of a search's validation stage as an evaluation run, once per optimization run
        (None: a rerun, already recorded). A run cut short (killed) is not finished: it is written again."""
        tags = {"opro.study": study_name}
        if optimization_run_id:
            tags["opro.optimization_run_id"] = optimization_run_id
            earlier = self._validation_runs(evaluation.label, optimization_run_id)
            if any(r.info.status == "FINISHED" for r in earlier):
                return None
            for r in earlier:  # cut short (killed, failed): replaced by this one, one run per prompt
                self.client.delete_run(r.info.run_id)
        # The questions of its extension look, if it reached one (in no split): recorded with the split's.
        asked = {r.query for r in evaluation.report.rows}
        extension = [e for e in dataset.unused() if e.query in asked]
        return self.log_evaluations([evaluation], dataset=dataset, split="validation", source="validation",
                                    run_name_prefix=f"validate {study_name}: ", tags=tags, extension=extension)

    # -- evaluation runs ---------------------------------------------------------------------
    def log_evaluations(
        self,
        evaluations: Sequence[PromptEvaluation],
        *,
        dataset: GoldenDataset,
        split: str,
        source: str,
        run_name_prefix: str = "",
        tags: Mapping[str, str] | None = None,
        extension: Sequence[Example] = (),
    ) -> GenAIRecord:
        """One ``mlflow.genai.evaluate`` run per prompt over the split's evaluation dataset (with
        ``extension``: the split's and those questions', see :meth:`register_dataset`), one trace per
        question the prompt answered."""
        ds = self.register_dataset(dataset, split=split, extension=extension)
        questions = {e.query for e in [*dataset.examples_in(split), *extension]}  # type: ignore[arg-type]
        runs = []
        for ev in evaluations:
            outside = [r.query for r in ev.report.rows if r.query not in questions]
            if outside:
                where = f"the {split} split" + (" or its extension" if extension else "")
                raise OproError(
                    f"evaluation of {ev.label!r}: {len(outside)} question(s) are not in {where} "
                    f"(first: {outside[0][:80]!r}); log an evaluation of that split's questions"
                )
            runs.append(self._log_one(ev, ds=ds, split=split, source=source, prefix=run_name_prefix,
                                      tags=dict(tags or {})))
        return GenAIRecord(experiment_id=self.experiment_id, dataset_name=ds.name, dataset_id=ds.dataset_id,
                           runs=tuple(runs))

    def _log_one(
        self, ev: PromptEvaluation, *, ds: Any, split: str, source: str, prefix: str, tags: dict[str, str]
    ) -> EvaluationRunRecord:
        import mlflow

        version = self.prompt_version(
            ev.template.template_text, commit_message=f"opro {source}: {ev.label[:80]} on the {split} split"
        )
        rows = {r.query: r for r in ev.report.rows}
        replay = _Replay(rows=rows, template=ev.template, separator=self.context_separator, model=self.task_model,
                         prompt=version)
        verdict = _recorded_verdict_scorer(rows, judge_model=self.judge_model, threshold=self.judge_threshold)
        exp_id = self.experiment_id
        run_tags = {
            "opro.kind": "evaluation",
            "opro.source": source,
            "opro.split": split,
            "opro.prompt_label": redact_text(ev.label)[:250],
            "opro.judge": self.judge_name,
            **{k: redact_text(str(v))[:5000] for k, v in {**tags, **ev.tags}.items()},
        }
        if version is not None:
            run_tags["opro.prompt_uri"] = f"prompts:/{version.name}/{version.version}"
        run = self.client.create_run(exp_id, run_name=f"{prefix}{ev.label}"[:250], tags=run_tags)
        run_id = run.info.run_id
        warnings: list[logging.LogRecord] = []
        try:
            with _use_store(self.tracking_uri, exp_id), mlflow.start_run(run_id=run_id), _quiet(warnings):
                mlflow.log_params({"template": redact_text(ev.template.template_text)[:6000], "split": split,
                                   "n_questions": len(rows)})
                if version is not None:
                    self.client.link_prompt_version_to_run(run_id, version)
                # The questions this prompt answered, not the dataset's others (the initial instruction
                # never answers the selection questions): a question without a row would be a failed
                # prediction without a trace. The dataset stays the run's input.
                data: Any = ds
                if len(rows) < _record_count(ds):
                    frame = ds.to_df()
                    data = frame[[redact_text(str(i.get("question", ""))) in replay.rows for i in frame["inputs"]]]
                    mlflow.log_input(ds)
                # The bound method, not the instance: MLflow identifies the agent by its source, and for an
                # instance inspect.getsource parses and walks this whole module (0.5 s per run).
                result = mlflow.genai.evaluate(data=data, predict_fn=replay.__call__, scorers=[verdict])
                summary = _summary_metrics(ev.report)
                if summary:
                    mlflow.log_metrics(summary)
            # Traces may be queued for a background writer: in the store before this returns, so that a
            # command leaving through os._exit (the CLI) loses none, and the count below is the real one.
            mlflow.flush_trace_async_logging(terminate=False)
            traces = self.client.search_traces(locations=[exp_id], run_id=run_id, max_results=1000)
            if len(traces) < len(rows):
                # MLflow drops a trace it failed to write with a warning and goes on: never silently here.
                why = "; ".join(dict.fromkeys(redact_text(w.getMessage())[:300] for w in warnings)) or "no reason given"
                raise OproError(
                    f"MLflow kept {len(traces)} of the {len(rows)} traces of the evaluation of {ev.label!r} "
                    f"(run {run_id}, marked FAILED; MLflow said: {why}); rerun to record it again"
                )
        except Exception:
            self.client.set_terminated(run_id, status="FAILED")
            raise
        for w in warnings:
            logger.debug("MLflow, evaluation run %s: %s", run_id, w.getMessage())
        trace_ids = tuple(t.info.trace_id for t in traces)
        logger.info("evaluation run %s: %d traces, metrics %s", run_id, len(trace_ids), result.metrics)
        return EvaluationRunRecord(
            label=ev.label,
            run_id=run_id,
            prompt_uri=None if version is None else f"prompts:/{version.name}/{version.version}",
            trace_ids=trace_ids,
        )


# -- judges both ways: opro's as MLflow scorers, MLflow's correctness judge as opro's ------------


def _feedback(result: Any, *, name: str, source_id: str) -> Any:
    from mlflow.entities import AssessmentError, AssessmentSource, AssessmentSourceType, Feedback

    source = AssessmentSource(source_type=AssessmentSourceType.LLM_JUDGE, source_id=redact_text(source_id) or "opro")
    if result.invalid or result.score is None:
        return Feedback(name=name, source=source, rationale=redact_text(result.feedback) or None,
                        error=AssessmentError(error_code="INVALID_JUDGE_REPLY",
                                              error_message=redact_text(result.invalid_reason or "no score")))
    return Feedback(name=name, value=float(result.score), rationale=redact_text(result.feedback) or None,
                    source=source)


def _first_text(value: Any, keys: Sequence[str]) -> str:
    if isinstance(value, Mapping):
        for k in keys:
            if value.get(k) is not None:
                return str(value[k])
        texts = [v for v in value.values() if isinstance(v, str)]
        return texts[0] if len(texts) == 1 else json.dumps(value, default=str)
    return "" if value is None else str(value)


def _retrieved(trace: Any) -> list[str]:
    """The chunks of a trace's retriever spans (MLflow's Document dicts), in order."""
    out: list[str] = []
    for span in getattr(getattr(trace, "data", None), "spans", None) or []:
        if span.span_type == "RETRIEVER" and isinstance(span.outputs, list):
            out.extend(str(d.get("page_content", "")) for d in span.outputs if isinstance(d, Mapping))
    return out


def judge_scorer(judge: Metric, *, name: str | None = None) -> Any:
    """An opro :class:`~opro.judges.metrics.Metric` (judge or not) as an MLflow scorer:
    ``mlflow.genai.evaluate(data, scorers=[judge_scorer(judge)])``.

    Works with :class:`~opro.judges.CorrectnessJudge` (question, answer, ``expected_response``) and
    with the context judges (:class:`~opro.judges.FaithfulnessJudge`, :class:`~opro.judges.RelevancyJudge`),
    which read the retrieved chunks from the trace's retriever spans. The judge keeps its own client, so
    calls go through opro's call cache: scoring answers opro already judged makes no new LLM call.
    The question is read from ``inputs`` (``question`` or ``query``), the reference from
    ``expectations`` (``expected_response``).
    """
    from mlflow.genai.scorers import scorer

    label = name or str(getattr(judge, "name", type(judge).__name__))
    model = str(getattr(getattr(judge, "llm", None), "model", "") or "")

    def score(inputs: dict[str, Any], outputs: Any, expectations: dict[str, Any] | None = None,
              trace: Any = None) -> Any:
        query = _first_text(inputs, ("question", "query"))
        answer = _first_text(outputs, ("answer", "response", "content"))
        reference = _first_text(expectations or {}, (EXPECTED_RESPONSE, "reference", "reference_answer"))
        result = judge.measure(query=query, answer=answer, reference=reference or None, contexts=_retrieved(trace))
        return _feedback(result, name=label, source_id=model)

    return scorer(score, name=label)


def mlflow_correctness_judge(client: ChatClient) -> MlflowCorrectnessJudge:
    """MLflow's built-in correctness judge (:class:`opro.judges.MlflowCorrectnessJudge`) on ``client``,
    asking with the installed MLflow's own prompt text."""
    from opro.judges.factory import build_mlflow_correctness

    return build_mlflow_correctness(client, prompt=_mlflow_correctness_prompt)


def _mlflow_correctness_prompt(*, request: str, response: str, expected_response: str) -> str:
    from mlflow.genai.judges.prompts.correctness import get_prompt

    return str(get_prompt(request=request, response=response, expected_response=expected_response))


# -- the three places opro records evaluations -------------------------------------------------


def genai_logger(experiment: Workbench, *, tracking_uri: str | None = None) -> GenAILogger:
    """A logger on the experiment's MLflow store (or ``tracking_uri``), experiment and prompt name."""
    return GenAILogger(**_logger_settings(experiment, tracking_uri=tracking_uri))


def _logger_settings(experiment: Workbench, *, tracking_uri: str | None = None) -> dict[str, Any]:
    """:func:`genai_logger`'s arguments: plain values, so a logger can be built in another process."""
    from opro.program.rag import CONTEXT_SEPARATOR

    cfg = experiment.config
    return dict(
        tracking_uri=tracking_uri or cfg.mlflow_uri,
        experiment_name=cfg.tracking.mlflow_experiment or cfg.experiment.name,
        dataset_prefix=cfg.experiment.name,
        prompt_name=cfg.prompt_name,
        task_model=experiment.spec("task").model,
        judge_name=f"{CORRECTNESS} ({cfg.judge.template})",
        judge_model=experiment.spec("judge").model,
        judge_threshold=cfg.judge.threshold,
        context_separator=CONTEXT_SEPARATOR,
    )


class ComparedPrompt(Protocol):
    """One prompt of a comparison, as :func:`log_comparison_evaluations` reads it."""

    @property
    def label(self) -> str: ...
    @property
    def spec(self) -> str: ...
    @property
    def template_text(self) -> str: ...
    @property
    def evaluation(self) -> EvaluationReport: ...


class Comparison(Protocol):
    """What :func:`log_comparison_evaluations` reads from a :class:`opro.heldout.report.ComparisonReport`. Named
    here, not imported: compare calls this module to record its report, so the import goes one way."""

    @property
    def split(self) -> str: ...
    @property
    def prompts(self) -> Sequence[ComparedPrompt]: ...
    @property
    def baseline(self) -> int: ...


def log_comparison_evaluations(
    report: Comparison,
    *,
    experiment: Workbench,
    name: str,
    tracking_uri: str | None = None,
    recorded: Sequence[Recorded] = (),
) -> GenAIRecord:
    """One evaluation run per compared prompt, so MLflow's evaluation-run comparison pairs them by question;
    each is tagged with the comparison's own MLflow run, where ``recorded`` has one."""
    from opro.program.prompts import QATemplate

    evaluations = [
        PromptEvaluation(
            label=p.label,
            template=QATemplate.from_template_text(p.template_text),
            report=p.evaluation,
            tags={"opro.spec": p.spec, "opro.role": "baseline" if i == report.baseline else "compared"},
        )
        for i, p in enumerate(report.prompts)
    ]
    tags = {"opro.comparison": name}
    if comparison_run_id := mlflow_run_of(recorded):
        tags["opro.comparison_run_id"] = comparison_run_id
    return genai_logger(experiment, tracking_uri=tracking_uri).log_evaluations(
        evaluations, dataset=experiment.dataset, split=report.split, source="compare",
        run_name_prefix=f"compare {name}: ", tags=tags,
    )


class ValidationTraces(Recorder):
    """The recorder that logs the validation stage of the search as evaluation runs, one per prompt
    (the initial instruction and each finalist). Goes after ``tracking``, whose run it links to.

    With ``tracking``'s sidecar process (:attr:`MlflowRecorder.sidecar`) the MLflow part (about 0.1 s
    of CPU per trace in its SQLAlchemy store, plus seconds of imports) runs there, so it never takes
    this process's GIL from the search: when the search starts the sidecar imports MLflow's
    evaluation harness and registers the dataset splits while the search waits on its models. Each
    prompt is sent as soon as the validation stage has scored it (:meth:`on_validated`), with the
    answers and verdicts the scoring produced (nothing is asked again), on ``tracking``'s background
    thread (in order with the run it links to), and written while the later prompts are still being
    asked. Without a sidecar the same work runs on that thread. A prompt a rerun found already scored
    was recorded by the run that scored it; nothing is asked again to record it.
    """

    def __init__(self, experiment: Workbench, *, tracking: MlflowRecorder) -> None:
        self.experiment = experiment
        self.tracking = tracking
        self._log: Any = None
        self._sidecar: Sidecar | None = None
        self._prewarmed: Future[None] | None = None
        #: Label -> the queued record of that prompt's evaluation run (None: already recorded before).
        self._logged: dict[str, Future[GenAIRecord | None]] = {}

    def on_search_start(self, study: SearchStudy, *, lead: bool) -> None:
        self._sidecar = self.tracking.sidecar
        if self._sidecar is not None:
            self._sidecar.retain()
            self._sidecar.host("genai", functools.partial(GenAILogger, **_logger_settings(self.experiment)))
            self._log = self._sidecar.proxy("genai")
        self._prewarmed = self.tracking.in_background(self._prewarm)

    def _logger(self) -> Any:
        """The GenAILogger, or its stand-in for the one in the sidecar: built on the tracking thread."""
        if self._log is None:
            self._log = genai_logger(self.experiment)
        return self._log

    def _prewarm(self) -> None:
        self._logger().prewarm(self.experiment.dataset)

    def on_search_end(self, study: SearchStudy) -> None:
        if self._sidecar is None:
            # In this process: waited for before it imports anything else (the plots import matplotlib,
            # which imports IPython when installed, as MLflow's harness does): two threads importing one
            # package at once can meet it partially initialised.
            self._wait_for_prewarm()

    def _wait_for_prewarm(self) -> None:
        if self._prewarmed is None:  # not started by on_search_start: queue it now
            self._prewarmed = self.tracking.in_background(self._prewarm)
        self._prewarmed.result()  # it registered the dataset splits (a done future answers at once)

    def on_validation_end(self, study: SearchStudy) -> None:
        if self._sidecar is None:
            # In this process the records finish before any recorder's on_result runs (the plots import
            # matplotlib; see on_search_end). A sidecar writes them while the plots are drawn.
            for job in self._logged.values():
                job.exception()

    def on_validation_batch(
        self, study: SearchStudy, *, label: str, instruction: str, rows: Sequence[EvaluationRow]
    ) -> None:
        # Each scored batch joins the prompt's batches kept so far: a run killed between two batches
        # leaves the first on disk, and its rerun, which finds them scored and asks them no more,
        # scores the rest here, so the prompt is recorded whole from the two runs' rows (_recover).
        part = self._part_file(study, label, instruction)
        earlier = _kept_rows(part) or ()
        asked = {r.query for r in rows}
        _keep_rows(part, [*(r for r in earlier if r.query not in asked), *rows])

    def on_validated(
        self, study: SearchStudy, *, label: str, instruction: str, rows: Sequence[EvaluationRow]
    ) -> None:
        # Kept on disk first: a run killed before MLflow has them is recorded from them by the rerun,
        # which finds the scores in the study and asks nothing again.
        kept = self._rows_file(study, label, instruction)
        _keep_rows(kept, rows)
        _drop_rows(self._part_file(study, label, instruction))  # whole now
        evaluation = self._evaluation(label, instruction, rows)
        self._logged[label] = self.tracking.in_background(
            self._record, evaluation, study.name, self.tracking.run_id, kept)

    def _evaluation(self, label: str, instruction: str, rows: Sequence[EvaluationRow]) -> PromptEvaluation:
        from opro.evaluation.rows import EvaluationReport
        from opro.judges.metrics import metric_name

        report = EvaluationReport(rows=tuple(rows), judge=metric_name(self.experiment.judge))
        return _validation_prompt(label, self.experiment.candidate_template(instruction), instruction, report)

    def _rows_file(self, study: SearchStudy, label: str, instruction: str) -> Path:
        key = hashlib.sha256("\0".join((study.name, label, instruction)).encode()).hexdigest()[:16]
        return self._rows_dir / f"{key}.json"

    def _part_file(self, study: SearchStudy, label: str, instruction: str) -> Path:
        full = self._rows_file(study, label, instruction)
        return full.with_name(full.stem + ".part.json")

    @property
    def _rows_dir(self) -> Path:
        from opro.rundir import RunDir

        return RunDir(self.experiment.config.output_dir).validation_rows

    def _recover(self, study: SearchStudy, result: OptimizationResult,
                 recorded: dict[str, GenAIRecord | None]) -> None:
        """The validation prompts an earlier, killed run scored but MLflow lacks: written again from the
        answers kept on disk, and the ones whose answers were not kept named (their scores are in the
        study and summary.json)."""
        v, run_id = result.validation, self.tracking.run_id
        if v is None or run_id is None:
            return
        from opro.search.validation import validation_prompts

        answered = {label: ins for (label, ins), f in zip(
            validation_prompts(result.initial_instruction, [f.instruction for f in v.finalists])[1:], v.finalists,
            strict=True) if f.chosen or v.selection_questions}
        # How many questions each prompt answered in all: its rows are whole when the batches kept on
        # disk by the runs that scored them add up to it.
        asked = {label: v.selection_questions + (len(f.scores) if f.chosen else 0)
                 for label, f in zip([f"finalist {i}" for i in range(1, len(v.finalists) + 1)], v.finalists,
                                     strict=True)}
        if v.initial_scores:
            answered["initial"] = result.initial_instruction.strip()  # as the validation stage names it
            asked["initial"] = len(v.initial_scores)
        log = self._logger()
        rewritten, lost = [], []
        for label, ins in answered.items():
            if label in recorded:
                continue
            kept = self._rows_file(study, label, ins)
            if log.validation_recorded(label=label, optimization_run_id=run_id):
                _drop_rows(kept)  # written after all (the killed run's sidecar finished it)
                continue
            rows = _kept_rows(kept)
            if rows is None:
                rows = _kept_rows(self._part_file(study, label, ins))
                if rows is None or len(rows) < asked[label]:
                    lost.append(label)
                    continue
                _keep_rows(kept, rows)  # whole: recorded like a prompt one run scored
                _drop_rows(self._part_file(study, label, ins))
            recorded[label] = self._record(self._evaluation(label, ins, rows), study.name, run_id, kept)
            rewritten.append(label)
        if rewritten:
            logger.warning("MLflow lacked the validation evaluation run(s) of %s (an earlier run was stopped "
                           "before writing them): written again from the answers kept in %s",
                           ", ".join(rewritten), self._rows_dir)
        if lost:
            logger.warning("MLflow has no validation evaluation run for %s: an earlier run scored them and did not "
                           "record them (stopped first, or [tracking].genai was off) and their answers were not kept; "
                           "their scores are in the study and summary.json, without per-question traces",
                           ", ".join(lost))

    def _record(self, evaluation: PromptEvaluation, study_name: str, run_id: str | None,
                kept: Path | None = None) -> GenAIRecord | None:
        record: GenAIRecord | None = self._logger().log_validation(
            evaluation, dataset=self.experiment.dataset, study_name=study_name, optimization_run_id=run_id)
        if kept is not None:  # MLflow has them now
            _drop_rows(kept)
        return record

    def on_result(self, study: SearchStudy, result: OptimizationResult) -> None:
        try:
            self._wait_for_prewarm()
            recorded = {label: job.result() for label, job in self._logged.items()}
            self._recover(study, result, recorded)
            log_validation_evaluations(result, recorded=recorded, log=self._logger())
        finally:
            self._release()

    def on_search_failed(self, study: SearchStudy, error: BaseException, *, abandoned: bool) -> None:
        # After ``tracking``'s, which drains the queued records first: what was sent is written.
        self._release()

    def _release(self) -> None:
        if self._sidecar is not None:
            self._sidecar.release()
            self._sidecar = None


def _keep_rows(path: Path, rows: Sequence[EvaluationRow]) -> None:
    """``rows`` as JSON at ``path`` (redacted, as every record is), written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = [{k: redact_text(v) if isinstance(v, str) else v for k, v in dataclasses.asdict(r).items()} for r in rows]
    for row in data:
        row["contexts"] = [redact_text(c) for c in row["contexts"]]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)


def _drop_rows(path: Path) -> None:
    """Delete the rows kept at ``path``, and their folder once it is empty."""
    path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        path.parent.rmdir()


def _kept_rows(path: Path) -> tuple[EvaluationRow, ...] | None:
    """The rows :func:`_keep_rows` wrote at ``path`` (None: none kept, or unreadable)."""
    from opro.evaluation.rows import EvaluationRow

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return tuple(EvaluationRow(**{**r, "contexts": tuple(r["contexts"])}) for r in data)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _validation_prompt(label: str, template: QATemplate, instruction: str, report: EvaluationReport) -> PromptEvaluation:
    role = "initial" if label == "initial" else "finalist"
    return PromptEvaluation(label=label, template=template, report=report,
                            tags={"opro.role": role, "opro.instruction": instruction[:5000]})


def log_validation_evaluations(
    result: OptimizationResult,
    *,
    recorded: Mapping[str, GenAIRecord | None],
    log: GenAILogger,
) -> GenAIRecord | None:
    """The validation stage's evaluation runs, recorded while it ran (``recorded``, by label), with
    the returned finalist tagged ``opro.role = returned finalist``; one record over all of them.

    A prompt is recorded from the rows its scoring made, never by asking again: one whose questions
    a rerun found already scored was recorded by the run that scored them (or, if that run died
    first, is not recorded; its scores are in the study)."""
    v = result.validation
    if v is None:
        return None
    from opro.search.validation import validation_prompts

    records = []
    for label, instruction in validation_prompts(result.initial_instruction, [f.instruction for f in v.finalists]):
        record = recorded.get(label)
        if record is None:
            continue
        if v.winner is not None and instruction == v.winner.instruction:
            log.set_run_tag(record.runs[0].run_id, "opro.role", "returned finalist")
        records.append(record)
    if not records:
        return None
    # Every prompt's run is on the same dataset (the validation split): its name and id come with them.
    return dataclasses.replace(records[0], runs=tuple(run for r in records for run in r.runs))


def _record_count(ds: Any) -> int:
    try:
        return len(ds.to_df())
    except Exception:  # a new, empty dataset has no frame yet
        return 0


def _summary_metrics(report: EvaluationReport) -> dict[str, float]:
    out: dict[str, float] = {
        "opro/n_questions": float(report.n),
        "opro/n_scored": float(report.n_scored),
        "opro/n_invalid": float(report.n_invalid),
        "opro/n_errors": float(report.n_errors),
    }
    if report.mean is not None:
        out["opro/mean_score"] = report.mean
    if report.pass_rate is not None:
        out["opro/pass_rate"] = report.pass_rate
    return out


@contextmanager
def _quiet(warnings: list[logging.LogRecord]) -> Iterator[None]:
    """mlflow.genai.evaluate prints a summary (stdout) and a progress bar (stderr); opro prints its own
    report. MLflow's own log lines go to whatever ``sys.stderr`` is when they are written, so they
    would vanish with the bar: its warnings (a trace it failed to write) are kept in ``warnings``."""
    mlflow_logger = logging.getLogger("mlflow")
    handler = _Collect(warnings)
    mlflow_logger.addHandler(handler)
    try:
        with redirect_stdout(StringIO()), redirect_stderr(StringIO()):
            yield
    finally:
        mlflow_logger.removeHandler(handler)


class _Collect(logging.Handler):
    def __init__(self, into: list[logging.LogRecord]) -> None:
        super().__init__(level=logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record)


class _Replay:
    """A ``predict_fn`` that re-emits a finished row as a trace: retrieval, then the LLM call."""

    def __init__(self, *, rows: Mapping[str, EvaluationRow], template: Any, separator: str, model: str,
                 prompt: Any | None) -> None:
        self.rows = {redact_text(q): r for q, r in rows.items()}
        self.template = template
        self.separator = separator
        self.model = model
        self.prompt = prompt

    def __call__(self, question: str) -> str:
        import mlflow
        from mlflow.entities import Document, SpanType
        from mlflow.tracing.constant import SpanAttributeKey

        row = self.rows[question]
        with mlflow.start_span(name="rag", span_type=SpanType.CHAIN) as root:
            root.set_inputs({"question": question})
            root.set_attribute("opro.replayed", True)
            if self.prompt is not None:
                # What mlflow.genai.load_prompt does inside a trace, without its registry lookup and
                # run link per row (the run is linked once): the version is linked to this trace.
                from mlflow.tracing.trace_manager import InMemoryTraceManager

                InMemoryTraceManager.get_instance().register_prompt(trace_id=root.trace_id, prompt=self.prompt)
            contexts = [redact_text(c) for c in row.contexts]
            with mlflow.start_span(name="retrieve", span_type=SpanType.RETRIEVER) as span:
                span.set_inputs({"query": question})
                span.set_outputs([Document(page_content=c, metadata={"rank": i + 1}).to_dict()
                                  for i, c in enumerate(contexts)])
            if row.error is not None:
                raise _ReplayedError(redact_text(row.error))
            prompt = redact_text(self.template.format(context_str=self.separator.join(row.contexts), query_str=row.query))
            with mlflow.start_span(name="answer", span_type=SpanType.LLM) as span:
                span.set_inputs({"messages": [{"role": "user", "content": prompt}]})
                span.set_outputs({"choices": [{"index": 0, "message": {"role": "assistant",
                                                                      "content": redact_text(row.answer)}}]})
                span.set_attribute(SpanAttributeKey.CHAT_USAGE, {
                    "input_tokens": row.prompt_tokens,
                    "output_tokens": row.completion_tokens,
                    "total_tokens": row.prompt_tokens + row.completion_tokens,
                })
                if self.model:
                    span.set_attribute(SpanAttributeKey.MODEL, redact_text(self.model))
                span.set_attribute("opro.latency_s", row.latency_s)
            answer = redact_text(row.answer)
            root.set_outputs(answer)
        return answer


class _ReplayedError(RuntimeError):
    """The row's own failure (an LLM error on that question), re-raised so the trace shows it."""


def _recorded_verdict_scorer(rows: Mapping[str, EvaluationRow], *, judge_model: str, threshold: float) -> Any:
    """A scorer that returns the verdict opro's judge gave each question (no new judge call)."""
    from mlflow.entities import AssessmentError, AssessmentSource, AssessmentSourceType, Feedback
    from mlflow.genai.scorers import scorer

    by_question = {redact_text(q): r for q, r in rows.items()}
    source = AssessmentSource(source_type=AssessmentSourceType.LLM_JUDGE, source_id=redact_text(judge_model) or "opro")

    @scorer(name=CORRECTNESS)
    def correctness(inputs: dict[str, Any]) -> list[Feedback]:
        row = by_question[inputs["question"]]
        if row.error is not None or row.invalid or row.score is None:
            why = row.error or row.invalid_reason or "no score"
            code = "LLM_ERROR" if row.error is not None else "INVALID_JUDGE_REPLY"
            return [Feedback(name=CORRECTNESS, error=AssessmentError(error_code=code, error_message=redact_text(why)),
                             source=source, rationale=redact_text(row.feedback) or None)]
        feedbacks = [
            Feedback(name=CORRECTNESS, value=float(row.score), rationale=redact_text(row.feedback) or None,
                     source=source, metadata={"scale": "1-5", "threshold": str(threshold)}),
            Feedback(name=PASSING, value=bool(row.passing), source=source,
                     rationale=f"judge score {row.score:g} {'>=' if row.passing else '<'} threshold {threshold:g}"),
        ]
        for name, value in row.metrics.items():
            if value is not None:
                feedbacks.append(Feedback(name=name, value=float(value), source=source))
        return feedbacks

    return correctness


__all__ = [
    "CORRECTNESS",
    "EXPECTED_RESPONSE",
    "PASSING",
    "REFERENCE_CONTEXTS",
    "EvaluationRunRecord",
    "GenAILogger",
    "GenAIRecord",
    "PromptEvaluation",
    "ValidationTraces",
    "dataset_name",
    "genai_logger",
    "judge_scorer",
    "log_comparison_evaluations",
    "log_validation_evaluations",
    "mlflow_correctness_judge",
]
