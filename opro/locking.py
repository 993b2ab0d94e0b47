"""Advisory file locks: one writer per output folder, one creator per MLflow SQLite store.

``fcntl.flock`` locks belong to the open file, so the kernel releases them when the holder exits,
kill -9 included: a lock can never go stale on one machine. The lock file records who holds it
(host, pid, since) so a refused process can say whom it waited for.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from opro.errors import OproError


class LockedError(OproError):
    """Another process holds the lock."""


class FileLock:
    """``with FileLock(path, what="the output folder runs/x"):`` held for the block; never waits."""

    def __init__(self, path: Path, *, what: str, hint: str = "") -> None:
        self.path = path
        self.what = what
        self.hint = hint
        self._fd: int | None = None

    def holder(self) -> dict[str, str]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8") or "{}")
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            h = self.holder()
            who = f"pid {h.get('pid', '?')} on {h.get('host', '?')} since {h.get('since', '?')}"
            raise LockedError(
                f"{self.what} is in use by another opro process ({who}; lock file {self.path}): "
                + (self.hint or "wait for it to finish or stop it, then rerun")
            ) from None
        os.ftruncate(fd, 0)
        info = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        os.write(fd, json.dumps(info).encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


@contextlib.contextmanager
def waiting_lock(path: Path, *, timeout_s: float = 120.0) -> Iterator[None]:
    """A blocking lock for short critical sections (creating a store), bounded in time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LockedError(f"timed out after {timeout_s:.0f} s waiting for the lock {path}") from None
                time.sleep(0.05)
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


__all__ = ["FileLock", "LockedError", "waiting_lock"]
