"""A child process that holds objects and runs their methods, one call at a time, in order.

For record keeping that is pure CPU inside a library and would otherwise take this process's GIL
from the work it records: MLflow's SQLAlchemy store spends about 0.1 s of CPU per trace, and a thread
doing that makes every thread of the search wait. In a child it runs on another core.

Each object is built in a fresh interpreter from a picklable factory; arguments, results and errors
cross a pipe. Not :mod:`multiprocessing`'s ``spawn``: it imports the parent's main script again in
the child, which runs a user's script that has no ``if __name__ == "__main__"`` guard a second time;
a fork of a threaded parent can deadlock. A child that dies takes its current call with it and the
caller gets an :class:`~opro.errors.OproError`. A parent that dies (killed: nothing of it runs) takes
the child with it within :data:`PARENT_WATCH_S`, whatever the child is doing: the pipe's end of file
only reaches a child once it has finished the call it is running (and any sent after it), and one
call (a prompt's evaluation run) could take minutes of MLflow writes racing a rerun. What the kill cut
short is recorded again by the rerun. The child ignores Ctrl-C: the parent decides what to finish.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import pickle
import threading
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opro.errors import OproError

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

logger = logging.getLogger(__name__)

#: How often the child checks that its parent is alive (seconds).
PARENT_WATCH_S = 0.25


class Sidecar:
    """A child process holding objects (:meth:`host`) whose methods :meth:`call` runs there.

    Calls block the calling thread until the child answers (callers that must not wait run them on
    a background thread) and are serialised, so the child sees them in the order they were made.
    Several owners can share one child: each :meth:`retain` is matched by a :meth:`release`, and the
    last release closes it. :meth:`close` lets the child finish and exit; it is idempotent.
    """

    def __init__(self, *, name: str) -> None:
        import subprocess
        import sys
        from multiprocessing.connection import Connection

        self.name = name
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-c", "from opro.tracking.sidecar import _main; _main()", str(to_child_r), str(from_child_w),
                 str(os.getpid())],
                pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL,
            )
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self._send = Connection(to_child_w, readable=False)
        self._recv = Connection(from_child_r, writable=False)
        # The child imports the factories' modules on this process's path (tests, notebooks, scripts).
        self._send.send(list(sys.path))
        # A call holds _call for its send and its reply, so replies match their calls; a host only
        # sends (the child answers it with nothing), so it does not wait for a call in flight.
        self._call = threading.Lock()
        self._send_lock = threading.Lock()
        self._owners_lock = threading.Lock()
        self._closed = False
        self._owners = 0

    def host(self, key: str, factory: Callable[[], Any]) -> None:
        """Build ``factory()`` in the child under ``key``, without waiting for it: a failure to build it
        is raised by every call to it."""
        payload = pickle.dumps(factory)  # an unpicklable factory fails here, in the caller
        with self._send_lock:
            if self._closed:
                raise OproError(f"the {self.name} process is closed; {key} was not started")
            self._send.send(("host", key, payload))

    def call(self, key: str, method: str, /, *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)`` on the child's ``key`` object: its result, or its exception raised here."""
        with self._call:
            if self._closed:
                raise OproError(f"the {self.name} process is closed; {key}.{method} was not run")
            try:
                with self._send_lock:
                    self._send.send(("call", key, method, args, kwargs))
                ok, value = self._recv.recv()
            except (EOFError, OSError) as exc:
                self._closed = True
                code = self._exit_code()
                raise OproError(
                    f"the {self.name} process ended during {key}.{method} (exit code {code}); "
                    "rerun the command: what it had recorded is kept and the rest is recorded again"
                ) from exc
        if not ok:
            raise value
        return value

    def proxy(self, key: str) -> Any:
        """A stand-in for the child's ``key`` object: ``proxy.method(...)`` is ``call(key, "method", ...)``."""
        return _Proxy(self, key)

    def retain(self) -> Sidecar:
        with self._owners_lock:
            self._owners += 1
        return self

    def release(self) -> None:
        """One owner is done; the last one closes the child."""
        with self._owners_lock:
            self._owners -= 1
            last = self._owners <= 0
        if last:
            self.close()

    def close(self, *, timeout: float = 30.0) -> None:
        """Wait for the child to finish its calls and exit (at most ``timeout`` seconds, then it is stopped)."""
        import subprocess

        with self._call, self._send_lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._send.send(None)
                if self._recv.poll(timeout):
                    self._recv.recv()  # its goodbye: everything it wrote is committed
            except (EOFError, OSError):
                pass
            self._send.close()
            self._recv.close()
        try:
            self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            logger.warning("the %s process did not finish within %.0f s; stopping it", self.name, timeout)
            self._process.kill()
            self._process.wait(timeout=5)

    def _exit_code(self) -> int | None:
        import subprocess

        try:
            return self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None


class _Proxy:
    def __init__(self, sidecar: Sidecar, key: str) -> None:
        self._sidecar = sidecar
        self._key = key

    def __getattr__(self, method: str) -> Callable[..., Any]:
        return functools.partial(self._sidecar.call, self._key, method)


def _main() -> None:
    """The child's entry point: ``python -c 'from opro.tracking.sidecar import _main; _main()' READ_FD WRITE_FD PARENT_PID``."""
    import signal
    import sys
    from multiprocessing.connection import Connection

    from opro.redaction import RedactingFilter

    _watch_parent(int(sys.argv[3]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Background work: where cores are short (workers beside each other, a local model) the
    # process it serves goes first; where a core is idle this changes nothing.
    with contextlib.suppress(OSError, AttributeError):
        os.nice(10)
    handler = logging.StreamHandler()
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter())  # the same redaction as the parent's log lines
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    recv = Connection(int(sys.argv[1]), writable=False)
    send = Connection(int(sys.argv[2]), readable=False)
    try:
        path = recv.recv()
    except (EOFError, OSError):
        os._exit(1)
    sys.path[:] = [*path, *(p for p in sys.path if p not in path)]
    _serve(recv, send)


def _watch_parent(parent: int, *, every_s: float = PARENT_WATCH_S) -> None:
    """Exit as soon as ``parent`` is gone (this process is handed to another parent), on a daemon thread.

    Polling the parent id works on every POSIX system and whichever thread started this process
    (Linux's PR_SET_PDEATHSIG fires when that *thread* ends, which may be a worker thread of a live
    parent). A write cut off here is a transaction SQLite rolls back; the rerun writes it again."""
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(1)

    threading.Thread(target=watch, name="opro-parent-watch", daemon=True).start()


def _serve(recv: Connection, send: Connection) -> None:
    """The child's loop: build objects and answer calls until told to stop or the parent is gone."""
    import sys

    objects: dict[str, Any] = {}
    failed: dict[str, Exception] = {}
    while True:
        try:
            message = recv.recv()
        except (EOFError, OSError):  # the parent is gone
            os._exit(1)
        if message is None:
            send.send((True, None))
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            # Its work is committed; tearing down MLflow's thousands of modules would only delay the
            # parent, which waits for this process to exit.
            os._exit(0)
        if message[0] == "host":
            _, key, payload = message
            try:
                objects[key] = pickle.loads(payload)()
                failed.pop(key, None)
            except Exception as exc:  # reported to every call: the parent decides what it means
                failed[key] = exc
            continue
        _, key, method, args, kwargs = message
        try:
            if key in failed:
                raise failed[key]
            if key not in objects:
                raise OproError(f"nothing is hosted under {key!r} in the sidecar process")
            reply = (True, getattr(objects[key], method)(*args, **kwargs))
        except Exception as exc:
            reply = (False, _portable(exc))
        try:
            send.send(reply)
        except (EOFError, OSError):  # the parent is gone
            os._exit(1)
        except Exception as exc:  # a result that cannot be pickled: nothing was written yet
            send.send((False, OproError(f"{key}.{method} returned what cannot be sent back "
                                        f"({type(exc).__name__}: {exc})")))


def _portable(exc: Exception) -> Exception:
    """``exc`` with the child's traceback as a note, or an OproError saying what it was if it cannot be pickled."""
    from opro.redaction import redact_text

    where = redact_text("".join(traceback.format_exception(exc)).rstrip())
    try:
        if not getattr(exc, "__notes__", None):  # a failed factory is raised again on every call
            exc.add_note(f"in the sidecar process:\n{where}")
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return OproError(redact_text(f"{type(exc).__name__}: {exc}") + f"\nin the sidecar process:\n{where}")


__all__ = ["Sidecar"]
