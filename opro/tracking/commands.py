"""MLflow as a :class:`opro.search.records.Recorder` of commands: one run per command record."""

from __future__ import annotations

from collections.abc import Sequence

from opro.redaction import redact_url
from opro.search.records import CommandRecord, Recorded, Recorder
from opro.tracking.mlflow import MlflowTracker


class MlflowCommandRecorder(Recorder):
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


def mlflow_run_of(recorded: Sequence[Recorded]) -> str | None:
    """The MLflow run a record (a command's or a search's) went to, among where it was recorded (None:
    not recorded in MLflow)."""
    return next((r.ref for r in recorded if r.recorder == MlflowCommandRecorder.name), None)


__all__ = ["MlflowCommandRecorder", "mlflow_run_of"]
