"""The MLflow UI on an experiment's store, offline (``opro ui``)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from opro.errors import ConfigError
from opro.redaction import redact_url


def ui_store(config: str | Path | None = None, *, tracking_uri: str | None = None) -> str:
    """The store to browse: ``tracking_uri``, or else the config's; checked, and a SQLite store must exist."""
    from opro.config import check_mlflow_uri, load_config

    if tracking_uri is None:
        if config is None:
            raise ConfigError("give the experiment's config (opro ui CONFIG.toml) or --tracking-uri URI")
        tracking_uri = load_config(config).mlflow_uri
    check_mlflow_uri(tracking_uri, where="--tracking-uri")
    if tracking_uri.startswith("sqlite:///") and not Path(tracking_uri.removeprefix("sqlite:///")).is_file():
        raise ConfigError(
            f"no MLflow store at {tracking_uri.removeprefix('sqlite:///')}: run `opro optimize` first"
        )
    return tracking_uri


def serve_ui(
    config: str | Path | None = None,
    *,
    tracking_uri: str | None = None,
    host: str = "127.0.0.1",
    port: int = 5000,
    notice: Callable[[str], None] = lambda _: None,
) -> int:
    """Run ``mlflow server`` on the store (:func:`ui_store`) at ``host:port`` until it stops or this
    process is asked to stop (SIGINT, SIGTERM, SIGHUP); ``notice`` hears where it listens and, once, that
    it stopped. The server runs in this process's group and dies with it: on any of those signals it is
    stopped, and whatever it started, before this returns. Returns the server's exit code (0 after a
    signal)."""
    import os
    import socket
    import sys

    store = ui_store(config, tracking_uri=tracking_uri)
    if not 0 < port < 65536:
        raise ConfigError(f"--port {port} is not a TCP port (1-65535)")
    try:  # the server would log the failure and still exit 0
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port} ({exc.strerror or exc}): choose another --port or --host") from None
    # MLflow's server imports litellm (installed with dspy), which otherwise downloads its model
    # price map at import and hangs for good on an offline machine. Its job runner (a dozen worker
    # processes, ~3 GB, for server-side GenAI jobs) is not needed to browse runs: off unless asked.
    from opro.tracking import offline_environment

    env = offline_environment({"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ,
                               "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    notice(f"MLflow UI on http://{host}:{port} (store {redact_url(store)}); Ctrl-C stops it")
    argv = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store,
            "--host", host, "--port", str(port), "--workers", "1"]
    stopped = ""
    with _ServerTree() as tree:
        # The server's output passes through this process, so that once it is told to stop, its
        # shutdown chatter (and uvicorn's CancelledError traceback on a second Ctrl-C) stays out.
        server = subprocess.Popen(argv, env=tree.env(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, preexec_fn=tree.child_setup)
        relay = _Relay(server.stdout, sys.stderr)
        with _StopSignals() as stop:
            try:
                code = server.wait()
            except _Stopped as signal_:
                relay.mute()
                stopped, code = signal_.name, 0
            finally:
                stop.ignore()  # a second Ctrl-C during the shutdown must not leave it half done
                tree.stop(server)
                relay.join()
    if stopped:
        notice(f"{stopped}: stopped the MLflow UI on http://{host}:{port}")
    return code


class _Stopped(Exception):
    """Raised in the main thread by a stop signal (its name in ``name``)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class _StopSignals:
    """SIGINT, SIGTERM and SIGHUP raise :class:`_Stopped` (once) while inside; the previous handlers come
    back after. Outside the main thread (a library caller's thread) signals cannot be caught: a no-op."""

    _NAMES = ("SIGINT", "SIGTERM", "SIGHUP")

    def __init__(self) -> None:
        self._previous: dict[int, object] = {}
        self._raised = False

    def _raise(self, signum: int, _frame: object) -> None:
        import signal

        if not self._raised:
            self._raised = True
            raise _Stopped(signal.Signals(signum).name)

    def ignore(self) -> None:
        self._raised = True

    def __enter__(self) -> _StopSignals:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for name in self._NAMES:
                if hasattr(signal, name):
                    self._previous[getattr(signal, name)] = signal.signal(getattr(signal, name), self._raise)
        return self

    def __exit__(self, *_: object) -> None:
        import signal

        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]


class _Relay:
    """Copies a child's output to ``sink`` line by line on a thread until muted (then drains it unseen,
    so the child never blocks on a full pipe)."""

    def __init__(self, source: IO[bytes] | None, sink: IO[str]) -> None:
        import threading

        self._muted = threading.Event()
        self._thread = threading.Thread(target=self._copy, args=(source, sink), daemon=True,
                                        name="opro-ui-relay")
        self._thread.start()

    def _copy(self, source: IO[bytes] | None, sink: IO[str]) -> None:
        if source is None:
            return
        for line in source:
            if not self._muted.is_set():
                sink.write(line.decode(errors="replace"))
                sink.flush()

    def mute(self) -> None:
        self._muted.set()

    def join(self) -> None:
        self._thread.join(timeout=5)


class _ServerTree:
    """The server and every process it starts, known by a mark in their environment (``env`` adds it).
    On Linux this process is their child subreaper while inside (a grandchild whose parent died is
    reparented here, not to init, so it can still be found and stopped), and the server gets SIGTERM
    if this process dies without a word (SIGKILL). A caller's own other children are never touched."""

    _SUBREAPER, _PDEATHSIG = 36, 1  # prctl options (linux/prctl.h)

    def __init__(self) -> None:
        import ctypes
        import os
        import sys

        # The running process's own symbols hold libc's prctl (no library search, which runs a compiler).
        self._libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
        self._mark = f"OPRO_UI_SERVER={os.getpid()}-{os.urandom(6).hex()}"
        self._seen: set[int] = set()

    def __enter__(self) -> _ServerTree:
        if self._libc is not None:
            self._libc.prctl(self._SUBREAPER, 1, 0, 0, 0)
        return self

    def __exit__(self, *_: object) -> None:
        if self._libc is not None:
            self._libc.prctl(self._SUBREAPER, 0, 0, 0, 0)

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        name, _, value = self._mark.partition("=")
        return {**env, name: value}

    def child_setup(self) -> None:
        """In the forked server, before it runs: SIGTERM when its parent (this process) dies."""
        import signal

        if self._libc is not None:
            self._libc.prctl(self._PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)

    def members(self) -> dict[int, bool]:
        """The tree's processes under this one, and whether each is alive (not a zombie)."""
        import os

        for pid, alive in _descendants(os.getpid()).items():
            if alive and pid not in self._seen:
                with contextlib.suppress(OSError):
                    if self._mark.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                        self._seen.add(pid)
        tree = _descendants(os.getpid())
        return {pid: alive for pid, alive in tree.items() if pid in self._seen}

    def stop(self, server: subprocess.Popen[bytes], *, grace: float = 10.0) -> None:
        """SIGTERM to the server (``mlflow server`` passes it to uvicorn, which shuts down), then SIGKILL
        to whatever of the tree is left after ``grace`` seconds; returns once all of it is gone."""
        import os
        import signal

        self.members()  # learn the tree while its parents are alive
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(timeout=grace)
        self._wait_gone(grace)
        for pid, alive in self.members().items():
            if alive:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        if server.poll() is None:
            server.kill()
            server.wait()
        self._wait_gone(grace)

    def _wait_gone(self, seconds: float) -> None:
        """Until none of the tree is left (or ``seconds`` pass), reaping its orphans as they exit."""
        import os
        import time

        deadline = time.monotonic() + seconds
        while (tree := self.members()) and time.monotonic() < deadline:
            for pid, alive in tree.items():
                if not alive:
                    with contextlib.suppress(ChildProcessError, OSError):
                        os.waitpid(pid, os.WNOHANG)  # an orphan reparented here
            if any(tree.values()):
                time.sleep(0.05)


def _descendants(root: int) -> dict[int, bool]:
    """Every process under ``root``, from /proc, and whether it is alive (not a zombie); empty where
    there is no /proc."""
    children: dict[int, list[int]] = {}
    alive: dict[int, bool] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # it exited meanwhile
        pid = int(stat.parent.name)
        children.setdefault(int(fields[1]), []).append(pid)
        alive[pid] = fields[0] != "Z"
    found: dict[int, bool] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found[pid] = alive[pid]
        todo.extend(children.get(pid, []))
    return found
