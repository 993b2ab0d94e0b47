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

The three places opro records evaluations call :class:`GenAILogger`: ``opro compare`` and ``opro
evaluate`` through the command recorder of :mod:`opro.tracking.evaluations`, the validation stage
through :class:`opro.tracking.validation_traces.ValidationTraces`; :mod:`opro.tracking.scorers` turns
judges into MLflow scorers and back.

``mlflow.genai.evaluate`` and the tracing API read MLflow's process-wide tracking URI and active
experiment; :func:`_use_store` sets both for the duration of one call under a lock and restores
them, so the rest of opro keeps its explicit per-store clients.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from io import StringIO
from typing import TYPE_CHECKING, Any

from opro.errors import OproError
from opro.redaction import redact_text, redact_url
from opro.search.records import Recorded

# The judges both ways live in their own module; imported here by the names docs/mlflow.md shows.
from opro.tracking.scorers import EXPECTED_RESPONSE, judge_scorer, mlflow_correctness_judge

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from opro.data.dataset import Example, GoldenDataset
    from opro.evaluation.batch import EvaluationReport, EvaluationRow
    from opro.program.prompts import QATemplate
    from opro.search.records import Recorded

logger = logging.getLogger(__name__)

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
        """Where each evaluation run went, as every recorder says it (:class:`opro.search.records.Recorded`)."""
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
    "dataset_name",
    "judge_scorer",
    "mlflow_correctness_judge",
]
