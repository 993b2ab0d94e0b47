"""Progress bars (counts and ETA) for long work, on stderr so stdout stays parseable."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class ProgressBar:
    """A counter that a worker advances; a no-op when disabled."""

    def __init__(self, progress: Progress | None, task_id: int | None) -> None:
        self._progress = progress
        self._task_id = task_id

    def advance(self, n: int = 1) -> None:
        if self._progress is not None and self._task_id is not None:
            self._progress.advance(self._task_id, n)  # type: ignore[arg-type]

    def describe(self, text: str) -> None:
        if self._progress is not None and self._task_id is not None:
            self._progress.update(self._task_id, description=text)  # type: ignore[arg-type]

    def add_total(self, n: int) -> None:
        if self._progress is not None and self._task_id is not None:
            task = self._progress.tasks[self._task_id]  # type: ignore[index]
            self._progress.update(self._task_id, total=(task.total or 0) + n)  # type: ignore[arg-type]


@contextmanager
def progress_bar(description: str, *, total: int | None, enabled: bool = True) -> Iterator[ProgressBar]:
    """``with progress_bar("judging", total=n) as bar: ... bar.advance()``."""
    if not enabled:
        yield ProgressBar(None, None)
        return
    console = Console(file=sys.stderr)
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )
    with progress:
        task_id = progress.add_task(description, total=total)
        yield ProgressBar(progress, task_id)  # type: ignore[arg-type]
