"""MLflow's usage telemetry stays off in opro unless the user turns it on (opro runs offline first)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from children import argv
from fakes import write_config

#: Variables under which MLflow turns its telemetry off by itself (pytest's own among them): a user's
#: shell has none of them.
_CI_VARIABLES = ("PYTEST_CURRENT_TEST", "CI", "GITHUB_ACTIONS", "GITLAB_CI", "JENKINS_URL", "BUILDKITE", "TF_BUILD",
                 "TRAVIS", "CIRCLECI", "BITBUCKET_BUILD_NUMBER", "CODEBUILD_BUILD_ARN", "TEAMCITY_VERSION")


def test_a_command_that_records_to_mlflow_writes_no_telemetry_id(tmp_path: Path) -> None:
    """Issue 49: MLflow wrote an installation id to ~/.config/mlflow/telemetry.json at import (and would
    send usage events). `opro evaluate`, recording its evaluation run, as a user runs it: nothing there."""
    config = write_config(tmp_path, genai=True)
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in (*_CI_VARIABLES, "XDG_CONFIG_HOME", "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK")}
    env.update(HOME=str(home), LITELLM_LOCAL_MODEL_COST_MAP="True")
    done = subprocess.run(argv("cli_on_scripted_models", "evaluate", str(config), "--prompt", "initial",
                               "--split", "exemplar", "--no-progress"),
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert "MLflow evaluation run" in done.stdout  # it did record to MLflow
    assert not (home / ".config" / "mlflow").exists(), sorted(p.name for p in (home / ".config" / "mlflow").iterdir())
