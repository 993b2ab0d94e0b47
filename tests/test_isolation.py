"""The suite runs in a home of its own (tests/conftest.py): no call cache, index, probe or decision of the
tests reaches the user's home, where a test's decision could refuse or resume the user's own runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fakes import experiment_config, scripted_pool

ROOT = Path(__file__).resolve().parents[1]


def test_a_run_on_every_default_keeps_its_files_in_the_suites_own_home(tmp_path: Path) -> None:
    from opro.config import config_from_dict
    from opro.experiment import Experiment
    from opro.paths import cache_dir, data_dir
    from opro.search.ledger import LEDGER_FILE

    user, home = Path(os.environ["OPRO_TESTS_USER_HOME"]), Path.home()
    assert home != user and cache_dir().is_relative_to(home)
    cfg = experiment_config(tmp_path, experiment={"name": "t", "output_dir": "out", "progress": False},
                            optimizer={"steps": 1})
    cfg["experiment"].pop("cache_path")  # the per-user call cache
    exp = Experiment(config_from_dict(cfg, base_dir=tmp_path, source="t.toml"), pool=scripted_pool(), progress=False)
    try:
        exp.optimize()
    finally:
        exp.close()
    assert (cache_dir() / "llm_calls.sqlite").is_file()
    assert (data_dir() / LEDGER_FILE).is_file()  # the user data folder of this home, not the cache


def test_the_suite_leaves_nothing_in_the_home_it_was_started_in(tmp_path: Path) -> None:
    """A run of the suite (here, the test above) with HOME an empty folder leaves it empty, but for the folder
    the assembled embedded models are kept in."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPRO_", "XDG_"))}
    env.update(HOME=str(home), LITELLM_LOCAL_MODEL_COST_MAP="True")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/test_isolation.py::test_a_run_on_every_default_keeps_its_files_in_the_suites_own_home"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    left = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    assert left == [".cache", ".cache/opro", ".cache/opro/models"], left
