"""An experiment: everything a config names, built once and shared by optimize / evaluate / compare.

Collaborators are built lazily and passed explicitly (no global settings): the model pool, one :class:`ChatClient`
per role over a shared call cache and usage ledger, the corpus and retriever, the split dataset, the program, the judge.
This module is the wiring; beside it, :mod:`~opro.experiment.fingerprints` (what defines a run and what changes
its scores), :mod:`~opro.experiment.summary` (``summary.json``) and :mod:`~opro.experiment.result`
(:class:`RunResult`); the study store and its archive are :mod:`opro.search.storage`'s.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opro.calibration.calibrate import judge_noise_note
from opro.config import BUILTIN_PYTHON_REFERENCE, OproConfig, load_config

# Modules, not their functions: what a test (or a plug-in) replaces in them is what is called.
from opro.data import documents as corpus_files
from opro.data.corpus import write_quickstart_corpus
from opro.data.dataset import (
    GoldenDataset,
    check_split_fits,
    folder_split_warning,
    load_dataset,
    question_hashes,
    split_record,
    split_shortfall,
)
from opro.data.pool import extension_questions
from opro.errors import ConfigError, DataError, ModelPackError
from opro.evaluation.batch import evaluate_templates
from opro.experiment import fingerprints
from opro.experiment.result import RunResult
from opro.experiment.settings import proposer_settings, pruner_settings, search_settings
from opro.experiment.summary import SummaryWriter
from opro.judges import CorrectnessJudge, build_judge, build_paired_judge
from opro.judges.factory import judge_template
from opro.judges.templates import get_template
from opro.judges.withheld import Withheld, apply_withheld, withheld_at, withhold
from opro.llm import ChatClient, UsageLedger
from opro.llm.factory import ClientFactory, open_cache
from opro.llm.pool import ModelPool, ModelSpec
from opro.llm.rates import rates_path
from opro.locking import FileLock
from opro.paths import RunDir, cache_dir, data_dir
from opro.program import retrieval  # a module too, for its chunk_documents
from opro.program.choices import model_key, rates_here, task_spec
from opro.program.dimensions import DIMENSIONS, answer_cost, dimension, initial_values
from opro.program.factory import FactoryProgram, check_opened, load_factory
from opro.program.prompts import DEFAULT_BASE_TEMPLATE, QATemplate
from opro.program.rag import RAGProgram
from opro.program.retrieval import (
    OpenAIEmbedder,
    Retriever,
    SentenceTransformerEmbedder,
    build_retriever,
    files_chunks_key,
    kept_chunks,
)
from opro.search import CandidateScorer, Search, SearchStudy, WorkerPlan, make_proposer, make_pruner
from opro.search.ledger import DecisionLedger
from opro.search.records import Recorder
from opro.search.space import SearchSpace, bootstrapped_demos, reference_demos
from opro.search.storage import archive_study, open_storage
from opro.search.workers import shared_sqlite_warning
from opro.tracking.factory import search_recorders
from opro.tracking.rundir_recorder import RunDirRecorder

if TYPE_CHECKING:
    from llama_index.core import Document

    from opro.data.dataset import Example
    from opro.program.cost import CostModel

logger = logging.getLogger(__name__)


class Experiment:
    """Builds and holds the parts of one experiment config."""

    def __init__(self, config: OproConfig, *, pool: ModelPool | None = None, progress: bool | None = None,
                 program: Any = None) -> None:  # program: a program or a factory (opro.program.factory)
        self.config, self._given_program = config, program
        self.run_dir = RunDir(config.output_dir)
        self.progress = config.experiment.progress if progress is None else progress
        exp = config.experiment
        self.models = ClientFactory(
            pool=pool or ModelPool(),
            cache=open_cache(config.resolve(exp.cache_path) if exp.cache_path else None, enabled=exp.cache),
            usage=UsageLedger(prices=config.prices()),
            seed=exp.seed,
            rates=rates_path(config.call_cache_path),  # each model's measured speed, for the next plan
        )
        self.pool, self.cache, self.usage = self.models.pool, self.models.cache, self.models.usage
        self._clients: dict[str, ChatClient] = {}
        self._study_storage: Any = None
        self._retrievers: dict[tuple[Any, ...], Retriever] = {}  # by index: the config's, and searched ones
        self._retrievers_lock = threading.RLock()
        #: The scorer of the latest :meth:`search` (it knows each candidate's configuration by name).
        self._scorer: CandidateScorer | None = None

    @classmethod
    def from_file(cls, path: str | Path, **kwargs: Any) -> Experiment:
        return cls(load_config(path), **kwargs)

    # -- models ------------------------------------------------------------------------------
    def spec(self, role: str) -> ModelSpec:
        return getattr(self.config.models, role)  # type: ignore[no-any-return]

    def client(self, role: str, *, task_model: str | None = None) -> ChatClient:
        """``role``'s client; with ``task_model``, that task model's (:func:`opro.program.choices.task_spec`)."""
        spec = self.spec(role) if task_model is None else task_spec(self.config, task_model)
        key = role if spec == self.spec(role) else f"{role}:{task_model}"
        if key not in self._clients:
            try:
                self._clients[key] = self.models.client(spec, role=role)
            except ModelPackError as exc:  # say which table names the model
                where = model_key(self.config, task_model) if task_model else f"[models.{role}]"
                raise ModelPackError(f"{where}.model: {exc}") from None
        return self._clients[key]

    def cost_model(self, names: Sequence[str] = ()) -> CostModel:
        """What an answer costs with the task models in play and ``names``, at rates measured here where
        seconds price them (:func:`opro.program.choices.rates_here`)."""
        return self.config.cost_model(names, rates=rates_here(self.config, names, backend=self.pool.get,
                                                              notice=logger.warning))

    # -- documents, retrieval, program -------------------------------------------------------
    @functools.cached_property
    def document_paths(self) -> list[Path]:
        """``[data].docs`` as paths (the built-in corpus rendered into the cache folder)."""
        paths: list[Path] = []
        for entry in self.config.data.docs:
            if entry == BUILTIN_PYTHON_REFERENCE:
                # Not into the output folder: `opro plan` only prints, and a run that fails its inputs
                # leaves that folder as it was. Rendered anew each time (it follows this Python's pydoc).
                paths.append(write_quickstart_corpus(cache_dir() / "corpus"))
            else:
                paths.append(self.config.resolve(entry))
        return paths

    @functools.cached_property
    def documents(self) -> list[Document]:
        result = corpus_files.load_documents(self.document_paths, skip_bad=self.config.data.skip_bad)
        for skipped in result.skipped:
            logger.warning("skipped %s: %s", skipped.path, skipped.reason)
        return list(result.documents)

    @functools.cached_property
    def _chunks(self) -> list[Any]:
        """The corpus's chunks at ``[rag].chunk_size``, all of them."""
        return self._chunks_at(self.config.rag.chunk_size)

    def _chunks_at(self, chunk_size: int) -> list[Any]:
        """The corpus chunked at ``chunk_size`` (kept on disk, keyed by the files' bytes and the chunking)."""
        rag = self.config.rag
        # Keyed by the files' bytes, so a run whose chunks are kept (resume, compare, another worker)
        # loads no document: no PDF parsing and no LlamaIndex import (seconds of start-up).
        key = files_chunks_key(corpus_files.source_files(self.document_paths), chunk_size=chunk_size,
                               chunk_overlap=rag.chunk_overlap, skip_bad=self.config.data.skip_bad)
        return list(kept_chunks(
            cache_dir() / "indexes" / f"chunks-files-{key[:24]}.json",
            lambda: retrieval.chunk_documents(self.documents, chunk_size=chunk_size, chunk_overlap=rag.chunk_overlap),
        ))

    @property
    def withheld(self) -> Withheld | None:
        """What ``[data].not_in_context`` took out of the corpus (recorded with the dataset), or None."""
        if not self.config.data.not_in_context:
            return None
        _ = self.dataset  # prepared (and the record written) first
        path = self.dataset_dir / "withheld.json"
        if not path.is_file():
            raise DataError(f"{path} is missing: the dataset was prepared without it; delete {self.dataset_dir} "
                            "and run again")
        return Withheld.from_json(json.loads(path.read_text(encoding="utf-8")))

    @property
    def retriever(self) -> Retriever:
        """The retriever over the corpus as ``[rag]`` indexes it (``[rag].chunk_size``, ...)."""
        return self.retriever_at()

    def retriever_at(self, chunk_size: int | None = None, **index: Any) -> Retriever:
        """The retriever over the corpus indexed with these values of the table's ``index`` dimensions
        (``[search.space].chunk_size``, ...; one not given: ``[rag]``'s): chunked and indexed once,
        kept on disk; without what ``[data].not_in_context`` withholds."""
        settings: dict[str, Any] = {d.keyword(): d.initial(self.config) for d in DIMENSIONS if d.applies == "index"}
        settings.update({dimension(k).keyword(): v for k, v in {**index, "chunk_size": chunk_size}.items()
                         if v is not None})
        key = tuple(sorted(settings.items()))
        with self._retrievers_lock:  # candidates are answered concurrently: one build per index
            if key not in self._retrievers:
                self._retrievers[key] = self._build_retriever(settings)
            return self._retrievers[key]

    def _build_retriever(self, settings: dict[str, Any]) -> Retriever:
        rag = self.config.rag
        chunk_size = settings["chunk_size"]
        chunks = self._chunks_at(chunk_size)
        withheld = self.withheld
        if withheld is not None:  # the chunks that held the withheld questions' answers are not searched
            gone = set(withheld.chunk_ids)
            if chunk_size != rag.chunk_size:  # the same text taken out of another chunking
                lost = set(withheld.queries)
                gone = set(withheld_at(
                    chunks, removed=[c.text for c in self._chunks if c.id in gone],
                    contexts=[c for e in self.dataset.examples if e.query in lost for c in e.reference_contexts],
                ))
            chunks = [c for c in chunks if c.id not in gone]
        settings = {"kind": rag.retriever, **settings}
        return build_retriever(
            chunks=chunks,
            chunk_overlap=rag.chunk_overlap,
            top_k=rag.top_k,
            index_dir=cache_dir() / "indexes",
            embedder=None if settings["kind"] == "bm25" else self._configured_embedder,
            progress=self.progress,
            **settings,
        )

    @functools.cached_property
    def _configured_embedder(self) -> Any:
        emb = self.config.rag.embeddings
        if emb is None:
            return None
        if emb.local_path:
            return SentenceTransformerEmbedder(model_path=self.config.resolve(emb.local_path))
        return OpenAIEmbedder(model=emb.model, base_url=emb.base_url or None, api_key_env=emb.api_key_env)

    def paraphrase_embed(self) -> Any:
        """The configured embeddings' ``embed`` (paraphrase checks of the split and the held-out guard),
        whatever the retriever; None without ``[rag.embeddings]``."""
        embedder = self._configured_embedder
        return None if embedder is None else embedder.embed

    def template(self, instruction: str) -> QATemplate:
        return QATemplate(instruction=instruction, base=DEFAULT_BASE_TEMPLATE, position=self.config.rag.instruction_position)

    def candidate_template(self, name: str) -> QATemplate:
        """The whole configuration of the search's candidate called ``name`` (its instruction with its
        values: :mod:`opro.program.configurations`), as the search scores it; before a search, or for a
        name it never configured, the instruction ``name`` under the initial configuration."""
        scorer = self._scorer
        return scorer.template(name) if scorer is not None else self.template(name)  # type: ignore[return-value]

    @functools.cached_property
    def search_space(self) -> SearchSpace | None:
        """``[search.space]`` with its demonstration pool (exemplar questions only), or None when only
        the wording is searched."""
        sp, rag = self.config.search.space, self.config.rag
        if not sp.dimensions:
            return None
        exemplars = self.dataset.examples_in("exemplar")
        demos: tuple[Any, ...] = ()
        if "demos" in sp.dimensions and sp.demo_source == "references":
            demos = reference_demos(exemplars, chars=sp.demo_chars,
                                    retrieve=lambda q: [c.text for c in self.retriever.retrieve(q)])
        elif "demos" in sp.dimensions:
            # The task model's answers under the initial configuration, judged (cached calls, counted).
            report = evaluate_templates(program=self.program, templates=[self.template(rag.initial_instructions[0])],
                                        examples=exemplars, judge=self.judge, progress=self.progress)[0]
            rows = {r.query: r for r in report.rows if r.error is None and not r.invalid}
            demos = bootstrapped_demos(exemplars, answer=lambda e: rows.get(e.query), chars=sp.demo_chars)
        return SearchSpace(
            dimensions=sp.dimensions, demos=demos, sampler=sp.sampler, seed=self.config.experiment.seed,
            demo_source=sp.demo_source, objective=self.config.optimizer.objective,
            initial=initial_values(self.config), price=functools.partial(answer_cost, self.config),
        )

    @functools.cached_property
    def program(self) -> RAGProgram | FactoryProgram:
        """opro's RAG program, or the user's (:meth:`_user_program`: checked, before any call)."""
        return self._user_program() or RAGProgram(
            retriever=self.retriever, llm=self.client("task"), max_tokens=self.config.rag.answer_max_tokens,
            chunked=self.retriever_at, models=lambda name: self.client("task", task_model=name))

    def _user_program(self) -> Any:
        """The user's program: the one given where it is one (it has ``answer``), else the :class:`FactoryProgram`
        of the factory given (from Python) or of ``[program].factory``; None: opro's own program. Its task calls
        go through :meth:`client`; an open ``[search.space]`` setting the factory does not take is refused."""
        given, named = self._given_program, self.config.program.factory
        if given is not None and hasattr(given, "answer"):
            return given
        if given is None and not named:
            return None
        built = given if given is not None else load_factory(named, base_dir=self.config.base_dir)
        program = FactoryProgram(factory=built, llm=self.client("task"), initial=initial_values(self.config),
                                 name=named or None, max_tokens=self.config.rag.answer_max_tokens,
                                 models=lambda name: self.client("task", task_model=name))
        return check_opened(program, opened=self.config.search.space.dimensions, source=self.config.source)

    def _judge_template(self) -> str | Path:
        """``[judge].template``: a built-in template's name, or its file resolved against the config."""
        # The same resolution build_judge applies, so the fingerprint hashes the template the judge reads.
        return judge_template(section=self.config.judge, resolve=self.config.resolve)

    @functools.cached_property
    def judge(self) -> CorrectnessJudge:
        return build_judge(section=self.config.judge, client=self.client("judge"), resolve=self.config.resolve)

    # -- dataset -----------------------------------------------------------------------------
    @functools.cached_property
    def decisions(self) -> DecisionLedger:
        """The user's decision ledger (:meth:`opro.search.ledger.DecisionLedger.of_user`), reconciled with
        its copies (and the home an earlier opro kept it in, beside the call cache) on first use."""
        data = self.config.data.dataset
        ledger = DecisionLedger.of_user(data_dir(), origin=f"output folder {self.run_dir.root}",
                                        dataset=self.config.resolve(data) if data else None,
                                        earlier_homes=(self.config.call_cache_path.parent,))
        ledger.reconcile(questions=question_hashes(e.query for e in self.dataset.examples) if ledger.copies else None)
        return ledger

    @property
    def dataset_dir(self) -> Path:
        return self.run_dir.dataset

    def _dataset_fingerprint(self) -> str:
        embedder = self._configured_embedder
        return fingerprints.dataset_fingerprint(self.config, paraphrases=embedder.identity if embedder else None)

    @functools.cached_property
    def source_dataset(self) -> GoldenDataset | None:
        """``[data].dataset`` as read from the user's file or folder (nothing written; None: the dataset is
        generated from ``[data].docs``). Read once: the preflight parses it before anything is planned."""
        d = self.config.data
        if not d.dataset:
            return None
        # Only the fields the user named: the others are detected, as `opro dataset import` does.
        names = {"query_field": d.query_field, "answer_field": d.answer_field, "contexts_field": d.contexts_field}
        return load_dataset(self.config.resolve(d.dataset), **{k: v for k, v in names.items() if v})

    @functools.cached_property
    def dataset(self) -> GoldenDataset:
        """The split golden dataset, saved in ``<output_dir>/dataset`` so every command sees one split."""
        marker = self.dataset_dir / "opro_settings.txt"
        fingerprint = self._dataset_fingerprint()
        if marker.exists() and marker.read_text().strip() == fingerprint:
            return load_dataset(self.dataset_dir)
        d = self.config.data
        if self.source_dataset is not None:
            raw = self.source_dataset
            if raw.split is not None:  # an opro dataset folder: its own split.json wins over [data.split]
                if d.not_in_context:
                    raise ConfigError(
                        f"{self.config.source}: [data].not_in_context needs a dataset without a split (it changes "
                        f"reference answers before splitting); {d.dataset} has its own split.json"
                    )
                if (said := folder_split_warning(raw, asked=d.split, source=self.config.source, name=d.dataset)):
                    logger.warning("%s", said)
                raw.save(self.dataset_dir)
                marker.write_text(fingerprint)
                return raw
        else:
            # Imported here: LlamaIndex's question generation is seconds of imports that a prepared dataset never needs.
            from opro.data.generation import generate_dataset

            chunks = retrieval.chunk_documents(
                self.documents, chunk_size=self.config.rag.chunk_size, chunk_overlap=self.config.rag.chunk_overlap
            )
            raw = generate_dataset(
                chunks=chunks,
                llm=self.client("generator"),
                questions_per_chunk=d.questions_per_chunk,
                max_chunks=d.max_chunks or None,
                progress=self.progress,
            )
        withheld = None
        if d.not_in_context:
            withheld = withhold(raw.examples, self._chunks, fraction=d.not_in_context, seed=d.split.seed)
            raw = apply_withheld(raw, withheld)
            logger.info("%d of %d questions are now unanswerable from the corpus (%d chunks withheld)",
                        len(withheld.queries), len(raw), len(withheld.chunk_ids))
        check_split_fits(raw, d.split.sizes, where=self.config.source,
                         more="" if d.dataset else " or raise [data].max_chunks / questions_per_chunk")
        s = d.split
        # With withheld questions, every split gets its share of them (the search must see some).
        lost: set[str] = set() if withheld is None else set(withheld.queries)
        stratify = None if withheld is None else (lambda e: "withheld" if e.query in lost else "kept")
        split = raw.with_split(
            exemplar=s.exemplar, optimization=s.optimization, validation=s.validation, heldout=s.heldout, seed=s.seed,
            embed=self.paraphrase_embed(), stratify=stratify,
        )
        split.save(self.dataset_dir)
        if withheld is not None:
            (self.dataset_dir / "withheld.json").write_text(json.dumps(withheld.to_json(), indent=1), encoding="utf-8")
        marker.write_text(fingerprint)
        assert split.split is not None
        shrunk = split_shortfall(split.split)
        if shrunk:
            logger.warning("%s: %s", self.config.source, shrunk)
        return split

    # -- optimization ------------------------------------------------------------------------
    def run_params(self) -> dict[str, Any]:
        """Everything that defines the run, for MLflow (:func:`opro.experiment.fingerprints.run_params`)."""
        return fingerprints.run_params(self.config, dataset=self.dataset)

    def fingerprint(self) -> dict[str, str]:
        """Everything that changes a score, stored with the study so a resume never mixes settings."""
        return fingerprints.fingerprint(self._score_settings(), space=self.search_space)

    def noise_digest(self) -> str | None:
        """What the paired noise of two prompts depends on (:func:`opro.experiment.fingerprints.noise_digest`), kept with a
        probe and a run's summary so a plan takes only this task's noise; None while the dataset is
        unprepared (no call is made to find it)."""
        marker = self.dataset_dir / "opro_settings.txt"
        if not (marker.is_file() and marker.read_text().strip() == self._dataset_fingerprint()):
            return None
        return fingerprints.noise_digest(self._score_settings())

    def _score_settings(self) -> dict[str, str]:
        """The fingerprint but the search space (:func:`opro.experiment.fingerprints.score_settings`)."""
        dataset, judge = self.dataset, get_template(self._judge_template())
        user = self.config.program.factory or self._given_program is not None
        return fingerprints.score_settings(self.config, dataset=dataset, judge=judge,
                                           program=getattr(self.program, "describe", dict)() if user else None)

    def _storage(self) -> Any:
        """The config's Optuna study store, opened once (a clear error when it cannot be)."""
        if self._study_storage is None:
            self._study_storage = open_storage(self.config.optuna_storage)
        return self._study_storage

    def _study_exists(self) -> bool:
        return SearchStudy.load(self._storage(), name=self.config.study_name) is not None

    def archive_study(self) -> str | None:
        """Copy the config's study to ``<name>-archived-<time>`` and delete it, so the next run starts fresh."""
        return archive_study(self._storage(), name=self.config.study_name)

    def recorders(self, *, worker_index: int = 0, num_workers: int = 1,
                  split_record: dict[str, Any] | None = None) -> list[Recorder]:
        """What the search leaves behind, in order: the run directory's files, ``summary.json`` (which
        says where the trackers after it recorded the run), then the trackers' recorders
        (:func:`opro.tracking.factory.search_recorders`: their artifacts are the run directory's files)."""
        trackers = search_recorders(self, run_dir=self.run_dir, params=self.run_params() if worker_index == 0 else None,
                                    worker_index=worker_index, num_workers=num_workers)
        summary = SummaryWriter(self.run_dir, recorded_by=trackers, split_record=split_record,
                                noise_digest=self.noise_digest, judge_noise=lambda: judge_noise_note(self.config))
        return [RunDirRecorder(self.run_dir, cost=self.cost_model()), summary, *trackers]

    def open_study(self) -> SearchStudy:
        """The config's study (created on the first run), refused when it was scored under other settings."""
        study = SearchStudy.open(self._storage(), name=self.config.study_name, pruner=make_pruner(pruner_settings(self.config.optimizer)))
        study.check_fingerprint(self.fingerprint())
        return study

    def search(
        self, *, study: SearchStudy, workers: WorkerPlan | None = None, recorders: Sequence[Recorder] = ()
    ) -> Search:
        """The search over ``study``: the configured proposer, the scorer (this program and judges), the recorders."""
        cfg = self.config
        scorer = CandidateScorer(program=self.program, judge=self.judge, template=self.template(""),
                                 task_slots=self.client("task").llm.max_concurrency, space=self.search_space, cost=self.cost_model(),
                                 paired=build_paired_judge(section=cfg.judge, client=self.client("judge"), seed=cfg.experiment.seed))
        self._scorer = scorer  # what candidate_template resolves names with (the validation traces)
        proposer = make_proposer(settings=proposer_settings(cfg.optimizer), llm=self.client("optimizer"),
                                 template_text=self.template("<INS>").template_text, seed=cfg.experiment.seed)
        return Search(proposer, scorer, study, search_settings(cfg.optimizer), usage=self.usage, workers=workers,
                      recorders=recorders, seed=cfg.experiment.seed, progress=self.progress, ledger=self.decisions)

    def optimize(self, *, worker_index: int = 0, num_workers: int = 1, fresh: bool = False) -> RunResult:
        """Run (or resume) the optimization; ``fresh`` archives an existing study first. One process per
        output folder and worker index: a second one is refused at once, naming the holder, instead of
        racing the first on the stores and evaluating everything twice."""
        plan = WorkerPlan(index=worker_index, count=num_workers, timeout_s=self.config.tracking.worker_wait_s)
        lock = FileLock(
            self.run_dir.lock(worker_index=worker_index, num_workers=num_workers),
            what=f"the output folder {self.config.output_dir}" + (f" (worker {worker_index})" if num_workers > 1 else ""),
            hint="wait for that run to finish (a rerun then resumes it) or stop it; to run two optimizations "
            "side by side give them different [experiment].output_dir",
        )
        with lock:
            _ = self.program if self.config.program.factory or self._given_program is not None else None  # checked
            ds = self.dataset
            _ = self.decisions  # the ledger reconciled, or a damaged one refused, before anything is recorded
            if not ds.examples_in("optimization") and ds.split is not None:
                why = split_shortfall(ds.split)
                if why:  # all questions in groups too big for it: say so, not just "empty"
                    raise DataError(f"the optimization split is empty: {why}")
            if fresh:
                self.archive_study()
            record = self._record_split() if plan.lead else None
            recorders = self.recorders(worker_index=worker_index, num_workers=num_workers, split_record=record)
            summary = next(r for r in recorders if isinstance(r, SummaryWriter))
            shared = shared_sqlite_warning(self.config.optuna_storage, num_workers=num_workers)
            if shared:
                logger.warning("%s", shared)
            for recorder in recorders:
                recorder.prepare(lead=plan.lead)
            try:
                study = self.open_study()
                result = self.search(study=study, workers=plan, recorders=recorders).run(
                    initial=self.config.rag.initial_instructions,
                    optimization_set=ds.examples_in("optimization"),
                    exemplar_set=ds.examples_in("exemplar"),
                    validation_set=ds.examples_in("validation"),
                    extension_set=(extension := self.extension_set()), pooled=max(0, len(extension) - len(ds.unused())),
                )
            except BaseException:
                for recorder in recorders:
                    recorder.discard()
                raise
            return summary.run_result(result)

    def extension_set(self) -> tuple[Example, ...]:
        """The questions in no split that the validation stage may extend into (up to ``[optimizer].validation_extension``;
        none without a validation stage): the split's unused ones, then the dataset's pool (:mod:`opro.data.pool`)."""
        o, ds = self.config.optimizer, self.dataset
        if not o.finalists or not o.validation_extension or not ds.examples_in("validation"):
            return ()
        return extension_questions(ds, self.config.pool_folder)[: o.validation_extension]

    def _record_split(self) -> dict[str, Any]:
        """What this optimization saw (:func:`opro.data.dataset.split_record`), for the held-out guard of
        compare / evaluate: ``split_record.json`` before the search (so a crashed run is covered), then
        ``summary.json`` and the Optuna study after it."""
        record = split_record(self.dataset, extension=self.extension_set())
        return self.run_dir.keep_split_record(record, kept_stands=self.run_dir.split_record.is_file()
                                              and self._study_exists())

    def close(self) -> None:
        self.models.close()
        if self._study_storage is not None:
            self._study_storage.engine.dispose()
            self._study_storage = None


__all__ = ["Experiment", "RunResult"]
