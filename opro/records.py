"""One recording seam for every command that is not a search: what a command recorded, and where.

A command (compare, judge calibrate, probe, ...) builds one :class:`CommandRecord` (its kind, params,
metrics, tags and files) and hands it to each :class:`CommandRecorder`; each says where it recorded it
(:class:`Recorded`). The command never knows which trackers exist: MLflow is one recorder
(:class:`opro.tracking.commands.MlflowCommandRecorder`), made by :func:`opro.tracking.commands.command_recorders`
from the config, and a test or a notebook can pass its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class CommandRecord:
    """What one command did. ``kind`` becomes the ``opro.kind`` tag (``probe``, ``judge-calibration``,
    ``comparison``); ``files`` maps each file to the folder it is filed under (``None``: the record's
    root). A folder among ``files`` stands for the files in it, filed under that folder as they lie."""

    kind: str
    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[Path, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Recorded:
    """Where a recorder put a record: ``recorder`` (``mlflow``), ``ref`` (its own id, e.g. the run id)
    and ``where`` (words for a person, secrets redacted)."""

    recorder: str
    ref: str
    where: str


@runtime_checkable
class CommandRecorder(Protocol):
    """Records one command's :class:`CommandRecord` and says where."""

    name: str

    def record(self, record: CommandRecord) -> Recorded: ...


def record_all(recorders: Sequence[CommandRecorder], record: CommandRecord) -> tuple[Recorded, ...]:
    """``record`` through every recorder, in order; a recorder's failure is raised (a command that
    was asked to record and could not must say so, not pretend it did)."""
    return tuple(r.record(record) for r in recorders)


def finite_metrics(values: Mapping[str, float | None]) -> dict[str, float]:
    """The metrics that have a value (trackers take numbers, not ``None`` or NaN)."""
    return {k: float(v) for k, v in values.items() if v is not None and v == v}


__all__ = ["CommandRecord", "CommandRecorder", "Recorded", "finite_metrics", "record_all"]
