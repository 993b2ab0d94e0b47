"""Shared test doubles: scripted task / judge / optimizer models, an experiment config on them, a
TOML writer, and the "keyword world" the OPRO loop is tested in. Imported by the tests
(``from fakes import ...``) and by the child processes they start; fixtures built on them are in
``conftest.py``."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import pytest
from bench_selection import TextTemplate  # the bench and the tests share one
from fault_server import instruction_of

from opro.config import OptimizerSection
from opro.llm import ChatClient, GenerationOptions, Message, UsageLedger
from opro.llm.cache import CallCache
from opro.llm.pool import ModelPool
from opro.llm.scripted import Responder, ScriptedLLM
from opro.program.retrieval import Embedder
from opro.recorders import RunDirRecorder
from opro.rundir import RunDir

if TYPE_CHECKING:
    from opro.search import Search, SearchStudy

SECRET = "sk-test-DO-NOT-LOG-7f3a9c"

DOC = """AlexNet won the ImageNet challenge in 2012. It was designed by Alex Krizhevsky.
It used ReLU activations and dropout. It was trained on two GPUs.
The network has five convolutional layers and three fully connected layers.
"""


def qa_file(tmp_path: Path, n: int = 20) -> Path:
    rows = [{"question": f"Fact number {i} about AlexNet?", "answer": f"Answer {i}."} for i in range(n)]
    path = tmp_path / "qa.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def judge_reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    text = messages[-1].content
    # Answers produced under an instruction mentioning "context" score 5, others 2.
    score = 5 if "context" in text.lower() else 2
    return json.dumps({"score": score, "reasoning": "scripted"})


def task_reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    return "Using the context: yes." if "context" in instruction_of(messages[-1].content).lower() else "Yes."


def optimizer_reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    i = (options.seed or 0) % 1000
    return f"<INS>Answer from the context, variant {i}.</INS>" if i % 2 else f"<INS>Answer plainly, variant {i}.</INS>"


def scripted_pool() -> ModelPool:
    return ModelPool(
        scripted={
            "task": ScriptedLLM(default=task_reply, model="task"),
            "judge": ScriptedLLM(default=judge_reply, model="judge"),
            "optimizer": ScriptedLLM(default=optimizer_reply, model="optimizer"),
        }
    )


def experiment_config(tmp_path: Path, *, questions: int = 24, doc: str = DOC, **overrides: dict) -> dict:
    """A scripted experiment as a dict (for :func:`write_toml` or ``config_from_dict``), its document
    ``doc`` and its ``questions`` questions written into ``tmp_path``. ``overrides``: per section, keys
    that replace the defaults (a nested table, such as ``data.split``, is replaced whole)."""
    (tmp_path / "docs").mkdir(parents=True, exist_ok=True)
    (tmp_path / "docs" / "alexnet.txt").write_text(doc)
    cfg = {
        "experiment": {"name": "t", "output_dir": "out", "cache_path": "calls.sqlite"},
        "data": {
            "docs": ["docs"],
            "dataset": str(qa_file(tmp_path, questions)),
            "query_field": "question",
            "answer_field": "answer",
            "split": {"exemplar": 2, "optimization": 3, "validation": 12, "heldout": 4, "seed": 1},
        },
        "rag": {"chunk_size": 64, "chunk_overlap": 0, "initial_instructions": ["Answer the question."]},
        "models": {
            "task": {"backend": "scripted", "model": "task", "api_key_env": "OPENAI_API_KEY"},
            "judge": {"backend": "scripted", "model": "judge"},
            "optimizer": {"backend": "scripted", "model": "optimizer"},
            "generator": {"backend": "scripted", "model": "optimizer"},
        },
        "optimizer": {"steps": 2, "candidates_per_step": 2, "minibatch_size": 2},
        # The MLflow GenAI records (evaluation runs, traces) are tested in test_genai; off here for speed.
        "tracking": {"prompt_name": "qa-test", "genai": False, "sidecar": False},
    }
    for section, values in overrides.items():
        cfg.setdefault(section, {}).update(values)
    return cfg


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return str(v)


def write_toml(data: dict, path: Path) -> Path:
    lines: list[str] = []

    def table(prefix: str, d: dict) -> None:
        scalars = {k: v for k, v in d.items() if not isinstance(v, dict)}
        if prefix:
            lines.append(f"[{prefix}]")
        lines.extend(f"{k} = {toml_value(v)}" for k, v in scalars.items())
        for k, v in d.items():
            if isinstance(v, dict):
                table(f"{prefix}.{k}" if prefix else k, v)

    table("", data)
    path.write_text("\n".join(lines) + "\n")
    return path


# -- the keyword world: the OPRO loop on scripted models (test_optimizer, test_claims) ---------------
#: An instruction scores one point per keyword it holds; candidates without one score 1 everywhere.
KEYWORDS = ("context", "precise", "cite", "brief")


@dataclass(frozen=True)
class Ex:
    query: str
    reference_answer: str


class EchoProgram:
    """Answers with the instruction itself, through a real ChatClient (cache, usage)."""

    def __init__(self, client: ChatClient) -> None:
        self.client = client

    def answer(self, query: str, *, template: Any) -> Any:
        return self.client.complete(f"{template}\nQuery: {query}")


@dataclass(frozen=True)
class Verdict:
    score: float | None
    invalid: bool


class KeywordJudge:
    """Scores an answer by how many keywords its instruction has, through a real ChatClient."""

    def __init__(self, client: ChatClient) -> None:
        self.client = client

    def measure(self, *, query: str, answer: str, reference: str | None, contexts: Sequence[str] = ()) -> Verdict:
        reply = self.client.complete(f"Grade.\nAnswer: {answer}\nReference: {reference}").text
        score = float(reply) if reply.strip() else None
        return Verdict(score, score is None)


def keyword_task_reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    return messages[-1].content.split("\nQuery:")[0]


def keyword_judge_reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    text = messages[-1].content
    answer = text.split("Answer: ", 1)[1].split("\nReference:")[0].lower()
    hits = sum(1 for k in KEYWORDS if k in answer)
    found = re.search(r"ref(\d+)", text)
    qnum = int(found.group(1)) if found else 0
    # Candidates with no keyword do badly on every question; others gain one point per keyword.
    return str(min(5, 1 + hits + (qnum % 2 if hits else 0)))


def keyword_optimizer_reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    words = ["Use the context", "Be precise", "Cite sources", "Be brief", "Answer well", "Try hard"]
    i = (options.seed or 0) % 1000
    picks = [words[(i + j) % len(words)] for j in range(1 + i % 3)]
    return "<INS>" + ". ".join(picks) + f" (v{i}).</INS>"


def keyword_examples(n: int) -> list[Ex]:
    return [Ex(f"question {i}?", f"ref{i}") for i in range(n)]


@dataclass
class Rig:
    """The scripted models behind a keyword optimizer, and its usage ledger."""

    task: ScriptedLLM
    judge: ScriptedLLM
    optimizer: ScriptedLLM
    usage: UsageLedger


class SearchRig:
    """Builds a :class:`opro.search.Search` from the collaborators a test gives, over a SQLite study,
    and runs it on a program given per run (as ``Experiment`` does for a config)."""

    def __init__(self, *, optimizer_llm: ChatClient, judge: Any, settings: OptimizerSection, storage: str,
                 study_name: str, usage: UsageLedger, recorders: Sequence[Any] = (), seed: int = 0,
                 template: Any = None, fingerprint: dict[str, str] | None = None, ledger: Any = None) -> None:
        self.optimizer_llm, self.judge, self.settings = optimizer_llm, judge, settings
        self.storage, self.study_name, self.usage, self.seed = storage, study_name, usage, seed
        self.recorders = tuple(recorders)
        self.template = template or TextTemplate("")
        self.fingerprint = fingerprint or {}
        self.ledger = ledger
        self.worker_index, self.num_workers, self.worker_timeout_s = 0, 1, 3600.0
        self.task_workers, self.judge_workers = 1, None
        self.last: Search | None = None

    def study(self) -> SearchStudy:
        from opro.search import SearchStudy, make_pruner, open_storage

        return SearchStudy.open(open_storage(self.storage), name=self.study_name, pruner=make_pruner(self.settings))

    def _study(self) -> Any:
        return self.study().optuna

    def search(self, program: Any) -> Search:
        from opro.search import CandidateScorer, Search, WorkerPlan, make_proposer

        study = self.study()
        study.check_fingerprint(self.fingerprint)
        scorer = CandidateScorer(program=program, judge=self.judge, template=self.template,
                                 task_slots=self.task_workers, judge_slots=self.judge_workers)
        proposer = make_proposer(settings=self.settings, llm=self.optimizer_llm,
                                 template_text=self.template.with_instruction("<INS>").template_text, seed=self.seed)
        self.last = Search(proposer, scorer, study, self.settings, usage=self.usage,
                           workers=WorkerPlan(index=self.worker_index, count=self.num_workers,
                                              timeout_s=self.worker_timeout_s),
                           recorders=self.recorders, seed=self.seed, progress=False, ledger=self.ledger)
        return self.last

    def coordinator(self, *, token: str) -> tuple[Any, Callable[[str, Sequence[int]], list[str]]]:
        """This worker's coordinator holding the lease ``token``, and its proposer's sampler."""
        search = self.search(None)
        search.coordinator.token = token
        return search.coordinator, search.proposer.ask

    def optimize(self, *, program: Any, optimization_set: Sequence[Any], exemplar_set: Sequence[Any] = (),
                 validation_set: Sequence[Any] = (), extension_set: Sequence[Any] = (),
                 initial_instructions: Sequence[str]) -> Any:
        return self.search(program).run(initial=initial_instructions, optimization_set=optimization_set,
                                        exemplar_set=exemplar_set, validation_set=validation_set,
                                        extension_set=extension_set)


def keyword_optimizer(
    tmp_path: Path, *, cache: CallCache | None = None, judge_reply: Responder = keyword_judge_reply, **settings: object
) -> tuple[SearchRig, Rig, EchoProgram]:
    """A search in the keyword world, recording into ``tmp_path/out``, its study in
    ``tmp_path/optuna.db`` (study "test"). ``judge_reply``: the judge model (a slower one, say);
    ``settings`` override the [optimizer] section."""
    usage = UsageLedger()
    task = ScriptedLLM(default=keyword_task_reply)
    judge_llm = ScriptedLLM(default=judge_reply)
    opt_llm = ScriptedLLM(default=keyword_optimizer_reply)
    program = EchoProgram(ChatClient(task, role="task", cache=cache, usage=usage))
    judge = KeywordJudge(ChatClient(judge_llm, role="judge", cache=cache, usage=usage))
    # The search itself (no validation stage: tests/search/test_selection.py covers that).
    base: dict[str, Any] = {"steps": 3, "candidates_per_step": 3, "minibatch_size": 2, "pruner": "none", "finalists": 0}
    base.update(settings)
    opt = SearchRig(
        optimizer_llm=ChatClient(opt_llm, role="optimizer", cache=cache, usage=usage),
        judge=judge,
        settings=OptimizerSection(**base),
        storage=f"sqlite:///{tmp_path / 'optuna.db'}",
        study_name="test",
        usage=usage,
        recorders=[RunDirRecorder(RunDir(tmp_path / "out"))],
    )
    return opt, Rig(task, judge_llm, opt_llm, usage), program


def history_of(result: Any) -> list[tuple[object, ...]]:
    """What must not depend on workers or timing: every candidate's step, instruction, score, status,
    scores and cost per answer (a split candidate's parts bring their task calls' usage with them)."""
    return [(r.step, r.instruction, r.score, r.status, r.scores, r.cost) for r in result.history]


# -- a scripted experiment on disk (compare, genai, docs) -----------------------------------------------
COMPARE_DOC = """AlexNet won the ImageNet challenge in 2012. It was designed by Alex Krizhevsky.
It used ReLU activations and dropout. It was trained on two GPUs.
"""


def write_config(
    tmp_path: Path, *, name: str = "t", out: str = "out", heldout: int = 10, seed: int = 1, genai: bool = False,
    questions: int = 28,
) -> Path:
    """A scripted experiment TOML over ``questions`` questions (:func:`experiment_config`, one search
    step), written as ``tmp_path/<name>.toml``; returns its path. ``genai``: the MLflow GenAI records
    (tested in test_genai; off elsewhere for speed)."""
    split = {"exemplar": 2, "optimization": 3, "validation": 12, "heldout": heldout, "seed": seed}
    cfg = experiment_config(
        tmp_path,
        questions=questions,
        doc=COMPARE_DOC,
        experiment={"name": name, "output_dir": out, "progress": False},
        data={"dataset": "qa.jsonl", "split": split},
        models={"task": {"backend": "scripted", "model": "task"}},
        optimizer={"steps": 1},
        tracking={"prompt_name": f"qa-{name}", "genai": genai, "sidecar": genai},
    )
    return write_toml(cfg, tmp_path / f"{name}.toml")


def optimized(tmp_path: Path, **kwargs: object) -> Path:
    """:func:`write_config`, then a finished scripted optimization of it; returns the config path."""
    from opro.experiment import Experiment

    path = write_config(tmp_path, **kwargs)  # type: ignore[arg-type]
    exp = Experiment.from_file(path, pool=scripted_pool(), progress=False)
    try:
        result = exp.optimize()
    finally:
        exp.close()
    assert result.best_score == 5.0 and result.initial_score == 2.0
    return path


def mlflow_client(config: Path) -> Any:
    """An MlflowClient on the store of a :func:`write_config` experiment (``out/mlflow.db``)."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{config.parent / 'out' / 'mlflow.db'}"
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


# -- `opro` processes against the loopback fault server (test_faults, test_scaleout) --------------------
#: The key the fault server accepts; configs name it as OPRO_FAULT_KEY.
FAULT_KEY = "sk-fault-test-0123456789abcdef"


def _default_sigint() -> None:
    # A shell without job control starts background commands with SIGINT ignored, and a child
    # inherits that: Python then never raises KeyboardInterrupt. A user's Ctrl-C reaches opro with
    # the default disposition, so the child gets that, however pytest was started.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def opro_process(*args: str, **kwargs: object) -> subprocess.Popen[str]:
    """``opro ARGS`` in a child process with OPRO_FAULT_KEY set and SIGINT at its default (as from a
    terminal, whatever started the tests); stdout and stderr together."""
    env = {**os.environ, "OPRO_FAULT_KEY": FAULT_KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return subprocess.Popen(
        [sys.executable, "-c", "from opro.cli import main; main()", *args], preexec_fn=_default_sigint,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, **kwargs,  # type: ignore[call-overload]
    )


# -- what a test needs that the repository does not hold ----------------------------------------------------

#: The shared labelled AlexNet dataset, beside the repository (../shared/data/history_of_alexnet).
SHARED_ALEXNET = Path(__file__).parents[1].parent / "shared/data/history_of_alexnet"


def unavailable(reason: str) -> NoReturn:
    """A test's real dependency (the embedded models, the shared data, a service) is missing: a skip on a
    developer's machine, a failure in CI (``CI`` set), where the install provides everything."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must run this test, but: {reason}")
    pytest.skip(reason)


def require_embedded(name: str) -> None:
    """llama-cpp-python and the embedded model ``name`` are installed (or :func:`unavailable`)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        unavailable("llama-cpp-python is not installed (pip install -e '.[local]')")
    from opro.llm.packs import EMBEDDED_MODELS, INSTALL_HINT, is_assembled

    pack = EMBEDDED_MODELS[name]
    missing = [] if is_assembled(pack) else pack.missing()
    if missing:
        part, why = missing[0]
        unavailable(f"embedded model {name} is not installed ({part.package}: {why}); {INSTALL_HINT}")


def require_shared_alexnet() -> Path:
    """The shared AlexNet dataset's folder (or :func:`unavailable`)."""
    if not (SHARED_ALEXNET / "rag_dataset.json").is_file():
        unavailable(f"the shared AlexNet dataset is not at {SHARED_ALEXNET} (../shared beside the repository)")
    return SHARED_ALEXNET


def run_together(fn: Callable[[int], object], *, threads: int = 2, timeout_s: float = 60.0) -> list[BaseException]:
    """Run ``fn(i)`` in thread ``i`` of ``threads``, all released at one instant (a barrier): what
    workers starting together do. The exceptions they raised (none: an empty list)."""
    start = threading.Barrier(threads)
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            start.wait(timeout=timeout_s)
            fn(index)
        except BaseException as exc:  # handed to the caller
            errors.append(exc)

    started = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in started:
        t.start()
    for t in started:
        t.join(timeout=timeout_s)
    return errors


# -- embeddings without a model (the retriever kind's tests) ---------------------------------------------

#: An embeddings table whose server is never asked (tests hand the retriever :class:`HashEmbedder`).
EMBEDDINGS = {"model": "fake-embed", "base_url": "http://127.0.0.1:9/v1", "api_key_env": "OPRO_TEST_NO_KEY"}


class HashEmbedder(Embedder):
    """A deterministic vector per distinct text (sha256-seeded): no two texts are paraphrases."""

    @property
    def identity(self) -> str:
        return "test:hash"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        rows = [np.random.default_rng(int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)).normal(size=32) for t in texts]
        return np.asarray(rows, dtype=np.float32)
