"""MLflow as a :class:`opro.records.CommandRecorder`: one run per command record."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from opro.records import CommandRecord, CommandRecorder, Recorded
from opro.redaction import redact_url
from opro.tracking.mlflow import MlflowTracker

if TYPE_CHECKING:
    from opro.config import OproConfig


class MlflowCommandRecorder:
    """One MLflow run per record, in ``experiment_name`` of ``tracking_uri``: its params, metrics (step
    0), tags (``opro.kind`` = the record's kind) and files as artifacts (a folder's files under the
    folder given, or at the artifact root)."""

    name = "mlflow"

    def __init__(self, *, tracking_uri: str, experiment_name: str) -> None:
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name

    def record(self, record: CommandRecord) -> Recorded:
        tracker = MlflowTracker(tracking_uri=self.tracking_uri, experiment_name=self.experiment_name)
        run_id = tracker.start(run_name=record.name, params=record.params)
        try:
            tracker.set_tags({"opro.kind": record.kind, **record.tags})
            if record.metrics:
                tracker.log_metrics(record.metrics, step=0)
            for path, folder in record.files.items():
                tracker.log_artifact(path, artifact_path=folder)
        except BaseException:
            tracker.finish(status="FAILED")
            raise
        tracker.finish()
        return Recorded(recorder=self.name, ref=run_id,
                        where=f"MLflow run {run_id} in {redact_url(self.tracking_uri)}")


def command_recorders(config: OproConfig, *, mlflow: bool = True, tracking_uri: str | None = None
                      ) -> list[CommandRecorder]:
    """The recorders a command records through under ``config``: MLflow unless ``mlflow`` is off, in
    ``tracking_uri`` (a command's ``--tracking-uri``) or else the config's store."""
    if not mlflow:
        return []
    return [MlflowCommandRecorder(tracking_uri=tracking_uri or config.mlflow_uri,
                                  experiment_name=config.tracking.mlflow_experiment or config.experiment.name)]


def mlflow_run_of(recorded: Sequence[Recorded]) -> str | None:
    """The MLflow run a record (a command's or a search's) went to, among where it was recorded (None:
    not recorded in MLflow)."""
    return next((r.ref for r in recorded if r.recorder == MlflowCommandRecorder.name), None)


__all__ = ["MlflowCommandRecorder", "command_recorders", "mlflow_run_of"]
