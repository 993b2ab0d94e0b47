"""One recording seam for every command that is not a search: what a command recorded, and where.

A command (compare, judge calibrate, probe, ...) builds one :class:`CommandRecord` (its kind, params,
metrics, tags and files) and hands it to each :class:`CommandRecorder`; each says where it recorded it
(:class:`Recorded`). The command never knows which trackers exist: MLflow is one recorder
(:class:`opro.tracking.commands.MlflowCommandRecorder`), made by :func:`opro.tracking.factory.command_recorders`
from the config, and a test or a notebook can pass its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class EvaluatedPrompt:
    """One prompt a command evaluated, question by question: its label, template (a
    :class:`~opro.program.prompts.QATemplate`), the :class:`~opro.evaluation.rows.EvaluationReport`
    of its rows and the tags its own record takes. Most recorders keep a command's figures only; one
    that keeps every question (MLflow's GenAI evaluation runs) records these."""

    label: str
    template: Any
    report: Any
    tags: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CommandRecord:
    """What one command did. ``kind`` becomes the ``opro.kind`` tag (``probe``, ``judge-calibration``,
    ``comparison``); ``files`` maps each file to the folder it is filed under (``None``: the record's
    root). A folder among ``files`` stands for the files in it, filed under that folder as they lie.
    ``evaluations``: the prompts it evaluated on the questions of ``split``, question by question."""

    kind: str
    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[Path, str | None] = field(default_factory=dict)
    evaluations: tuple[EvaluatedPrompt, ...] = ()
    split: str | None = None
    #: Where the recorders before this one recorded it (:func:`record_all` says), for a recorder that
    #: links its record to another's (an evaluation run to its command's MLflow run).
    earlier: tuple[Recorded, ...] = ()


@dataclass(frozen=True)
class Recorded:
    """Where a recorder put a record: ``recorder`` (``mlflow``), ``ref`` (its own id, e.g. the run id)
    and ``where`` (words for a person, secrets redacted)."""

    recorder: str
    ref: str
    where: str


@runtime_checkable
class CommandRecorder(Protocol):
    """Records one command's :class:`CommandRecord` and says where (None: nothing of this record is
    this recorder's to keep, as an evaluation recorder says of a record without evaluations)."""

    name: str

    def record(self, record: CommandRecord) -> Recorded | None: ...


def record_all(recorders: Sequence[CommandRecorder], record: CommandRecord) -> tuple[Recorded, ...]:
    """``record`` through every recorder, in order, each told where the ones before it recorded it
    (:attr:`CommandRecord.earlier`); a recorder's failure is raised (a command that was asked to record
    and could not must say so, not pretend it did)."""
    done: list[Recorded] = []
    for r in recorders:
        where = r.record(replace(record, earlier=tuple(done)) if done else record)
        if where is not None:
            done.append(where)
    return tuple(done)


def finite_metrics(values: Mapping[str, float | None]) -> dict[str, float]:
    """The metrics that have a value (trackers take numbers, not ``None`` or NaN)."""
    return {k: float(v) for k, v in values.items() if v is not None and v == v}


__all__ = ["CommandRecord", "CommandRecorder", "EvaluatedPrompt", "Recorded", "finite_metrics", "record_all"]
