"""Shared fixtures: the real embedded models, loaded once per test session.

Build role clients from them in tests: ``ChatClient(embedded_task_llm, role="task")``. They skip
(with the reason) when llama-cpp-python or the model packs are not installed.

The suite runs in a home of its own (:func:`_own_home`): nothing it does reaches the user's cache or
decision ledger, where a test's decision could refuse or resume the user's own runs on the same questions.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The contract suites ship in opro.testing: their asserts explain a failure as the tests' own do.
pytest.register_assert_rewrite("opro.testing")


def _own_home() -> Path:
    """Point HOME, the XDG folders and opro's own variables at a temporary home for this run (children
    inherit it), and return the user's real home (also in ``$OPRO_TESTS_USER_HOME``). The assembled embedded models (1.6 GB, minutes to
    assemble) are the one thing shared with the user: the temporary cache's models/ links to the user's."""
    import atexit
    import shutil
    import tempfile

    from opro.llm.packs import models_dir

    real_home, models = Path.home(), models_dir()
    os.environ["OPRO_TESTS_USER_HOME"] = str(real_home)  # for tests/test_isolation.py (children see it too)
    root = Path(tempfile.mkdtemp(prefix="opro-tests-home-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    for name in ("OPRO_CACHE_DIR", "OPRO_DATA_DIR", "XDG_CONFIG_HOME", "DSPY_CACHEDIR", "MPLCONFIGDIR"):
        os.environ.pop(name, None)
    os.environ.update(HOME=str(root), XDG_CACHE_HOME=str(root / ".cache"), XDG_DATA_HOME=str(root / ".local" / "share"))
    models.mkdir(parents=True, exist_ok=True)
    (root / ".cache" / "opro").mkdir(parents=True)
    (root / ".cache" / "opro" / "models").symlink_to(models, target_is_directory=True)
    return real_home


_own_home()


@pytest.fixture(autouse=True, scope="module")
def _module_decision_ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A module's own fixtures (a search shared by its tests) decide in a ledger of the module's: the
    scripted datasets of every module hold the same questions."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPRO_DATA_DIR", str(tmp_path_factory.mktemp("module-user-data")))
        yield


@pytest.fixture(autouse=True)
def _own_decision_ledger(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test is a user of its own: a decision one test makes never refuses another's."""
    monkeypatch.setenv("OPRO_DATA_DIR", str(tmp_path_factory.mktemp("user-data")))

from opro.llm import LLM  # noqa: E402  (after the rewrite hook)


def _embedded(name: str) -> Iterator[LLM]:
    from fakes import require_embedded, unavailable

    from opro.errors import ModelPackError
    from opro.llm.llamacpp import LlamaCppLLM

    require_embedded(name)
    try:
        llm = LlamaCppLLM(model_path=name, n_ctx=4096)
    except ModelPackError as exc:
        unavailable(f"embedded model {name} unavailable: {exc}")
    yield llm
    llm.close()


@pytest.fixture
def shared_alexnet() -> Path:
    """The shared AlexNet dataset's folder: a skip where it is missing, a failure in CI."""
    from fakes import require_shared_alexnet

    return require_shared_alexnet()


@pytest.fixture(scope="session")
def embedded_task_llm() -> Iterator[LLM]:
    """The 0.5B task model (qwen2.5-coder-0.5b-instruct) on llama.cpp, n_ctx 4096."""
    yield from _embedded("qwen2.5-coder-0.5b-instruct")


@pytest.fixture(scope="session")
def embedded_strong_llm() -> Iterator[LLM]:
    """The 1.5B strong model (qwen2.5-coder-1.5b-instruct): judge, optimizer, generator."""
    yield from _embedded("qwen2.5-coder-1.5b-instruct")


@pytest.fixture(scope="session")
def genai_compared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Any]:
    """A scripted optimization with the MLflow GenAI records on, then `compare` of initial vs best
    (saved as "pair"): (config path, ComparisonReport, SavedComparison). Shared by test_genai and
    test_uicheck, so the optimization runs once per session."""
    from fakes import optimized, scripted_pool

    from opro.experiment import Experiment
    from opro.heldout.compare import compare_prompts, save_comparison

    config = optimized(tmp_path_factory.mktemp("genai"), genai=True)
    exp = Experiment.from_file(config, pool=scripted_pool(), progress=False)
    try:
        report = compare_prompts(experiment=exp, prompts=["initial", "best"])
        saved = save_comparison(report, experiment=exp, name="pair")
    finally:
        exp.close()
    return config, report, saved


# -- the embedded engine's start-up probe, with a child that crashes on demand -----------------------------

@pytest.fixture
def fake_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The probe runs :func:`children.fake_probe` (set ``CRASH`` to the modes that crash) and keeps its
    records in a fresh folder (the assembled models stay where they are); the file its runs are counted in."""
    from children import argv

    from opro.llm import probe as probe_module

    monkeypatch.setattr(probe_module, "cache_dir", lambda: tmp_path / "cache")
    runs = tmp_path / "runs.txt"
    runs.touch()
    monkeypatch.setenv("RUNS", str(runs))
    monkeypatch.setattr(probe_module, "_child_argv", lambda path, mode: argv("fake_probe", path, mode))
    monkeypatch.setattr(probe_module, "supports_extra_buffers_switch", lambda: True)
    return runs
