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
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import pytest
from fault_server import instruction_of

from opro.llm import GenerationOptions, Message
from opro.llm.pool import ModelPool
from opro.llm.scripted import ScriptedLLM
from opro.program.retrieval import Embedder

if TYPE_CHECKING:
    pass

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


def side_by_side_judge_reply(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    """:func:`judge_reply` for one answer; for a side-by-side call (both answers, opro/judges/sidebyside.py)
    4 for an answer given under a "context" instruction and 3 for another: a difference of 1 where
    the pointwise judge sees 3, so a test can tell which judge a decision read."""
    found = re.search(r"^Answer A: (.*?)\n\nAnswer B: (.*?)\n\n", messages[-1].content, re.S | re.M)
    if found is None:
        return judge_reply(messages, options)
    a, b = (4 if "context" in answer.lower() else 3 for answer in found.groups())
    return json.dumps({"score_a": a, "score_b": b})


def scripted_pool(*, judge: ScriptedLLM | None = None) -> ModelPool:
    """The scripted task, judge (:func:`judge_reply`, or ``judge``) and optimizer models."""
    return ModelPool(
        scripted={
            "task": ScriptedLLM(default=task_reply, model="task"),
            "judge": judge or ScriptedLLM(default=judge_reply, model="judge"),
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


# -- the keyword world: the OPRO loop on scripted models (test_loop, test_workers) ---------------
# It ships in the package (opro.testing.worlds), where the contract suites run on it; the tests import
# it from here as before (the names are re-exported, hence the aliases).
from opro.testing.backend_contract import run_together as run_together  # noqa: E402
from opro.testing.worlds import KEYWORDS as KEYWORDS  # noqa: E402
from opro.testing.worlds import EchoProgram as EchoProgram  # noqa: E402
from opro.testing.worlds import Ex as Ex  # noqa: E402
from opro.testing.worlds import KeywordJudge as KeywordJudge  # noqa: E402
from opro.testing.worlds import Rig as Rig  # noqa: E402
from opro.testing.worlds import SearchRig as SearchRig  # noqa: E402
from opro.testing.worlds import TextTemplate as TextTemplate  # noqa: E402
from opro.testing.worlds import Verdict as Verdict  # noqa: E402
from opro.testing.worlds import history_of as history_of  # noqa: E402
from opro.testing.worlds import keyword_examples as keyword_examples  # noqa: E402
from opro.testing.worlds import keyword_judge_reply as keyword_judge_reply  # noqa: E402
from opro.testing.worlds import keyword_optimizer as keyword_optimizer  # noqa: E402
from opro.testing.worlds import keyword_optimizer_reply as keyword_optimizer_reply  # noqa: E402
from opro.testing.worlds import keyword_task_reply as keyword_task_reply  # noqa: E402

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
