"""What every command shares: errors for people (:func:`errors`), the listing of long texts."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import typer

from opro.redaction import redact_text


def _fail(exc: Exception, *, code: int | None = None) -> typer.Exit:
    """Print an error for people (no traceback) and return the exit to raise.

    Exit 2 for a usage or configuration error, a refused held-out claim and a damaged decision ledger
    (whichever command meets them), 1 for a failure while working.
    """
    from rich.console import Console
    from rich.markup import escape

    from opro.errors import ConfigError, LeakageError, LedgerError

    if isinstance(exc, LeakageError | LedgerError):
        code = 2
    elif code is None:
        code = 2 if isinstance(exc, ConfigError | ValueError) else 1

    # Escape: messages name config keys like [optimizer].steps, which rich would take for markup.
    # soft_wrap: an error names files and keys that must stay greppable and copyable whole.
    Console(stderr=True).print(f"[bold red]error:[/] {escape(redact_text(str(exc)))}", soft_wrap=True)
    return typer.Exit(code=code)


_Command = TypeVar("_Command", bound=Callable[..., None])

_PATH_HINTS: dict[type[OSError], str] = {
    FileExistsError: "a file is where a folder is needed: choose another path, or move that file away",
    NotADirectoryError: "a file is where a folder is needed: choose another path, or move that file away",
    IsADirectoryError: "a folder is where a file is needed: name a file",
    PermissionError: "choose a path this user may read or write, or change its permissions",
    FileNotFoundError: "check the path",
}


def _os_error(exc: OSError) -> tuple[Exception, int]:
    """An OSError as one line naming its path(s) and what to do; exit 2 when the path is the user's to fix."""
    where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
    what = exc.strerror or type(exc).__name__
    hint = next((h for t, h in _PATH_HINTS.items() if isinstance(exc, t)), None)
    text = f"{what}: {where}" if where else str(exc) or what
    return OSError(f"{text} ({hint})" if hint else text), 2 if hint else 1


def _errors(*, code: int | None = None) -> Callable[[_Command], _Command]:
    """A command's :class:`~opro.errors.OproError` becomes one line for people and an exit code
    (see :func:`_fail`; ``code`` fixes it) instead of a traceback."""

    def decorate(command: _Command) -> _Command:
        @functools.wraps(command)
        def run(*args: Any, **kwargs: Any) -> None:
            from opro.errors import OproError

            try:
                command(*args, **kwargs)
            except OproError as exc:
                raise _fail(exc, code=code) from exc
            except OSError as exc:  # a path the user gave that cannot be read or written
                error, rc = _os_error(exc)
                raise _fail(error, code=rc) from exc

        return cast(_Command, run)

    return decorate



class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises :class:`KeyboardInterrupt`, so a command stopped by ``kill`` (a
    scheduler, a container's stop) unwinds, keeps what it finished and says how to resume as after Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Inside, SIGTERM raises :class:`Terminated` (in the main thread, as SIGINT does); the previous
    handler comes back after. A library caller's thread cannot take signals: then nothing changes."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: object) -> None:
        raise Terminated(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupted_exit(exc: KeyboardInterrupt) -> int:
    """The exit code of a command stopped by ``exc``: 128 plus the signal's number, as a shell reports a
    process the signal ended (130 after Ctrl-C, 143 after SIGTERM)."""
    import signal

    return 128 + (exc.signum if isinstance(exc, Terminated) else int(signal.SIGINT))


def _listing(texts: list[tuple[str, str]]) -> Any:
    """Long texts outside a table's grid: each under the number of its row (``#1``), wrapped at the
    console's width with a hanging indent, so a table stays one short row per entry at 80 columns."""
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for number, text in texts:
        grid.add_row(number, Text(text))
    return grid



#: Stands in for a space inside a `quoted command` while a line is wrapped (never in opro's output).
_GLUE = "\x00"


def wrap_line(line: str, width: int, *, indent: str = "", more: str = "  ") -> list[str]:
    """``line`` wrapped at ``width``: the lines after the first under ``indent`` plus ``more``. Words are
    never broken, and a `quoted command` is kept whole, so a key, path, URL or command stays copyable
    (one longer than the width stands alone on its line)."""
    import re
    import textwrap

    if len(line) <= width:
        return [line]
    glued = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", _GLUE), line.strip())
    return [shown.replace(_GLUE, " ") for shown in textwrap.wrap(
        glued, width=width, initial_indent=indent, subsequent_indent=indent + more,
        break_long_words=False, break_on_hyphens=False)]


def say(out: Any, text: str) -> None:
    """Print ``text`` on the console ``out`` wrapped at its width (80 in a log, where no terminal tells
    it) by :func:`wrap_line`: a line that does not fit goes on under its own indent plus two spaces."""
    for line in text.splitlines() or [""]:
        for shown in wrap_line(line, out.width, indent=line[: len(line) - len(line.lstrip())]):
            out.print(shown, markup=False, highlight=False, emoji=False, soft_wrap=True)


def wrapped_log_format(fmt: str) -> Any:
    """A logging formatter whose records are wrapped as :func:`say` wraps (at stderr's width, 80 in a
    log), so a library's warning reads at 80 columns beside the command's own lines."""
    import logging

    from rich.console import Console

    class Wrapped(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            width = Console(stderr=True).width
            return "\n".join(shown for line in super().format(record).splitlines()
                             for shown in wrap_line(line, width))

    return Wrapped(fmt)


def console(*, stderr: bool = False) -> Any:
    """The rich console a command prints through (stdout unless ``stderr``)."""
    from rich.console import Console

    return Console(stderr=stderr)


def split_list(text: str) -> list[str]:
    """A comma-separated option (``--metrics a,b``) as its non-blank items."""
    return [m for m in text.split(",") if m.strip()]


def no_progress_option() -> Any:
    """The ``--no-progress`` flag, worded once for every command that shows progress bars."""
    return typer.Option(False, "--no-progress", help="Hide progress bars.")
