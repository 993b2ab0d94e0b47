"""Progress bars (counts and ETA) for long work, on stderr so stdout stays parseable.

A bar's total is the work planned before it starts: work found unneeded on the way (a pruned
candidate's questions, a chunk that gave fewer questions than asked) is :meth:`ProgressBar.skip`-ped,
which lowers the total, so a bar never reaches 100% and then grows. Its ETA is the measured rate of
the units done so far applied to those left (:meth:`LineProgress`; Rich's bar: its recent speed)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

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

    def skip(self, n: int) -> None:
        """``n`` planned units will not be done: the total falls by ``n`` (done units are not counted)."""
        if self._progress is not None and self._task_id is not None and n > 0:
            task = self._progress.tasks[self._task_id]  # type: ignore[index]
            self._progress.update(self._task_id, total=max(task.completed, (task.total or 0) - n))  # type: ignore[arg-type]

    def add_total(self, n: int) -> None:
        """Work that joins after the start and could not be planned (another worker's candidate this
        worker takes over): the only way a total grows."""
        if self._progress is not None and self._task_id is not None:
            task = self._progress.tasks[self._task_id]  # type: ignore[index]
            self._progress.update(self._task_id, total=(task.total or 0) + n)  # type: ignore[arg-type]


#: Seconds between two progress lines where stderr is not a terminal (a log file, CI, nohup).
LINE_EVERY_S = 30.0


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"


class LineProgress(ProgressBar):
    """Progress for a log: where a bar cannot redraw (stderr is a file or a pipe, where Rich shows it
    only once it ends), one line at the start, one at most every ``every_s`` seconds as work is done,
    and one at the end, so a long run in CI or under nohup is visibly alive."""

    def __init__(self, description: str, total: int | None, *, out: TextIO, every_s: float) -> None:
        super().__init__(None, None)
        self._description, self._total, self._out, self._every_s = description, total, out, every_s
        self._done = 0
        self._started = self._printed = time.monotonic()
        self._lock = threading.Lock()  # workers advance it from their threads
        self._line()

    def _line(self) -> None:
        elapsed = time.monotonic() - self._started
        text = f"{self._description}: {self._done}"
        if self._total:
            text += f"/{self._total} ({100 * self._done / self._total:.0f}%)"
        text += f", {_clock(elapsed)} elapsed"
        if self._total and 0 < self._done < self._total:
            text += f", eta {_clock(elapsed * (self._total - self._done) / self._done)}"
        print(text, file=self._out, flush=True)
        self._printed = time.monotonic()

    def advance(self, n: int = 1) -> None:
        with self._lock:
            self._done += n
            if time.monotonic() - self._printed >= self._every_s:
                self._line()

    def describe(self, text: str) -> None:
        with self._lock:
            self._description = text

    def skip(self, n: int) -> None:
        with self._lock:
            if self._total is not None and n > 0:
                self._total = max(self._done, self._total - n)

    def add_total(self, n: int) -> None:
        with self._lock:
            self._total = (self._total or 0) + n

    def finish(self) -> None:
        with self._lock:
            self._line()


@contextmanager
def progress_bar(description: str, *, total: int | None, enabled: bool = True) -> Iterator[ProgressBar]:
    """``with progress_bar("judging", total=n) as bar: ... bar.advance()``."""
    if not enabled:
        yield ProgressBar(None, None)
        return
    console = Console(file=sys.stderr)
    if not console.is_terminal:
        lines = LineProgress(description, total, out=sys.stderr, every_s=LINE_EVERY_S)
        try:
            yield lines
        finally:
            lines.finish()
        return
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
