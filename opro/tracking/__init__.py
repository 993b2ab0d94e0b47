"""Everything opro records, where it records it, and the one part of opro that imports MLflow.

The run directory: its layout is :class:`opro.paths.RunDir` (the one place that knows it);
:mod:`~opro.tracking.rundir_recorder` (what a search leaves there) and :mod:`~opro.tracking.plots`.
The seam every command records through: :mod:`~opro.search.records` (a command's record, its recorders
and where each recorded it). MLflow: :mod:`~opro.tracking.mlflow` (runs, params, metrics, artifacts, the
prompt registry), :mod:`~opro.tracking.genai` (evaluation datasets, per-question traces and judge
assessments for the GenAI UI) and :mod:`~opro.tracking.sidecar` (the child process that does MLflow's CPU
work off the search's GIL). The tracker's names are re-exported so ``from opro.tracking import
MlflowTracker`` reads as before; the other modules are imported by their own names (each imports MLflow
only when called).
"""

import os

from opro.tracking.mlflow import (
    MlflowTracker,
    check_server,
    check_writable,
    from_mlflow_template,
    load_registered_prompt,
    load_registered_template,
    offline_environment,
    safe_params,
    to_mlflow_template,
)

# Every import of MLflow in opro goes through this package (tests/test_architecture.py), and MLflow
# decides on its telemetry when it is imported: off from here on, unless the user's environment says.
offline_environment(os.environ)

__all__ = [
    "MlflowTracker",
    "check_server",
    "check_writable",
    "from_mlflow_template",
    "load_registered_prompt",
    "load_registered_template",
    "offline_environment",
    "safe_params",
    "to_mlflow_template",
]
