"""Locks: one writer per output folder, one creator per MLflow SQLite store, one process per
(study, worker index) even across machines.

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
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

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


def lease_alive(held: dict[str, Any], *, stale_s: float = 300.0) -> bool:
    """Whether the process that holds the lease ``held`` still runs: on this host by its pid, from
    another host by a heartbeat younger than ``stale_s``. A released lease (no token) is not alive."""
    if not held.get("token"):
        return False
    if held.get("host") == socket.gethostname():
        try:
            os.kill(int(held.get("pid", 0)), 0)
        except ProcessLookupError:
            return False
        except (PermissionError, ValueError, OverflowError):
            return True
        return True
    return time.time() - float(held.get("beat", 0.0)) < stale_s


class LeaseStore(Protocol):
    """Where a lease is kept (one worker's slot in a study: :meth:`opro.search.study.SearchStudy.lease_slot`)."""

    @property
    def name(self) -> str: ...

    def read(self) -> dict[str, Any]: ...

    def write(self, value: dict[str, Any]) -> None: ...


class StudyLease:
    """``with StudyLease(slot, what=...):`` one process per lease slot of a study, across machines.

    Workers on several machines share a study through its storage (PostgreSQL), not a file system,
    so the lease lives in the study: the holder's host, pid and a heartbeat refreshed every
    ``beat_s``. A lease is taken over only when its holder is gone: a dead pid on this host, or no
    heartbeat for ``stale_s`` from another host (kill -9 leaves no release behind).
    """

    def __init__(
        self,
        slot: LeaseStore,
        *,
        what: str,
        stale_s: float = 300.0,
        beat_s: float = 30.0,
        info: dict[str, Any] | None = None,
    ) -> None:
        self.slot = slot
        #: Extra fields kept in the lease (a worker's N), for the other processes to check.
        self.info = dict(info or {})
        self.what = what
        self.stale_s = stale_s
        self.beat_s = beat_s
        self.token = uuid.uuid4().hex
        self.since = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _alive(self, held: dict[str, Any]) -> bool:
        return lease_alive(held, stale_s=self.stale_s)

    def _beat(self) -> None:
        self.slot.write({
            "host": socket.gethostname(), "pid": os.getpid(), "since": self.since, "beat": time.time(),
            "token": self.token, **self.info,
        })

    def __enter__(self) -> StudyLease:
        held = self.slot.read()
        if held.get("token") and held["token"] != self.token and self._alive(held):
            raise LockedError(
                f"{self.what} is being run by another opro process (pid {held.get('pid')} on {held.get('host')} "
                f"since {held.get('since')}): wait for it or stop it, then rerun; a stopped process's lease is "
                f"taken over at once on its own host, after {self.stale_s:.0f} s without a heartbeat from another"
            )
        self._beat()
        self._thread = threading.Thread(target=self._run, name=f"opro-lease-{self.slot.name}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.beat_s):
            with contextlib.suppress(Exception):  # a missed beat only shortens the lease
                self._beat()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(Exception):
            # No token: nobody holds it. ``released`` says which process let it go, cleanly.
            self.slot.write({"released": self.token})


__all__ = ["FileLock", "LeaseStore", "LockedError", "StudyLease", "lease_alive", "waiting_lock"]
