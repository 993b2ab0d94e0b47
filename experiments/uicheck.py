"""A browser check of the MLflow UI: what a user sees, not only what the API returns.

:func:`check_evaluation_ui` starts ``opro ui`` on a store, opens MLflow's evaluation-run comparison
page for two runs in headless Chromium (Debian's ``chromium``), and reports which of the expected
texts (the questions, the judge assessment name) the rendered page shows. It can save a screenshot.
Everything binds 127.0.0.1, and every step has a time bound (generous: parsing MLflow's scripts takes
Chromium minutes on a busy 2-core machine, seconds on an idle one); the server is stopped on exit.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from opro.errors import OproError

#: Flags for a headless Chromium that never reaches the network and keeps no state between runs.
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", "--disable-dev-shm-usage",
)


def find_chromium() -> str:
    """The Chromium executable, or an error that says how to install it."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise OproError("no Chromium found for the browser check: install it (Debian: apt-get install -y chromium)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def mlflow_ui(tracking_uri: str, *, timeout_s: float = 120.0) -> Iterator[str]:
    """``opro ui`` on ``tracking_uri`` at a free loopback port; yields its base URL, stops it after."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", "from opro.cli import main; main()", "ui", "--tracking-uri", tracking_uri,
         "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                out = proc.communicate(timeout=10)[0]
                raise OproError(f"opro ui exited with {proc.returncode} before answering: {out[-2000:]}")
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise OproError(f"the MLflow UI did not answer within {timeout_s:.0f} s")
            time.sleep(0.5)
        yield base
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.communicate(timeout=10)


def comparison_url(base: str, *, experiment_id: str, run_id: str, compare_to: str) -> str:
    """MLflow's evaluation-run comparison page: two runs' traces side by side, question by question."""
    return (f"{base}/#/experiments/{experiment_id}/evaluation-runs"
            f"?selectedRunUuid={run_id}&compareToRunUuid={compare_to}")


def _chromium(args: Sequence[str], *, timeout_s: float) -> str:
    with tempfile.TemporaryDirectory(prefix="opro-chromium-") as profile:
        try:
            proc = subprocess.run(
                [find_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                capture_output=True, text=True, timeout=timeout_s,
            )
        except subprocess.TimeoutExpired as exc:
            raise OproError(f"headless Chromium did not finish within {timeout_s:.0f} s") from exc
    if proc.returncode != 0:
        raise OproError(f"headless Chromium failed ({proc.returncode}): {proc.stderr[-1500:]}")
    return proc.stdout


def render(url: str, *, budget_ms: int = 25_000, timeout_s: float = 300.0) -> str:
    """The page's DOM after its scripts ran for ``budget_ms`` of virtual time."""
    return _chromium([f"--virtual-time-budget={budget_ms}", "--dump-dom", url], timeout_s=timeout_s)


def screenshot(url: str, path: Path, *, size: tuple[int, int] = (1400, 900), budget_ms: int = 25_000,
               timeout_s: float = 300.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    _chromium([f"--virtual-time-budget={budget_ms}", f"--window-size={size[0]},{size[1]}",
               f"--screenshot={path.resolve()}", url], timeout_s=timeout_s)
    if not path.is_file():
        raise OproError(f"headless Chromium wrote no screenshot at {path}")
    return path


def _on_page(text: str, dom: str) -> bool:
    """Whether ``text`` is on the page as it is, or as the UI shows it inside JSON (a request column
    renders ``{"question": ...}``, so a question with quotes or backslashes appears escaped)."""
    import json

    return text in dom or json.dumps(text, ensure_ascii=False)[1:-1] in dom


@dataclass(frozen=True)
class UICheck:
    url: str
    found: tuple[str, ...]
    missing: tuple[str, ...]
    #: The rendered page (HTML entities unescaped).
    dom: str

    @property
    def ok(self) -> bool:
        return not self.missing


def check_evaluation_ui(
    *,
    tracking_uri: str,
    experiment_id: str,
    run_id: str,
    compare_to: str,
    expect: Sequence[str],
    screenshot_path: Path | None = None,
    screenshot_size: tuple[int, int] = (1400, 900),
    attempts: int = 2,
) -> UICheck:
    """Open the evaluation-run comparison of ``run_id`` against ``compare_to`` and look for ``expect``
    (retried as :func:`check_pages` does)."""
    with mlflow_ui(tracking_uri) as base:
        url = comparison_url(base, experiment_id=experiment_id, run_id=run_id, compare_to=compare_to)
        check = _check(url, expect, attempts=attempts)
        if screenshot_path is not None:
            screenshot(url, screenshot_path, size=screenshot_size)
    return check


def check_pages(*, tracking_uri: str, pages: Mapping[str, Sequence[str]], attempts: int = 2) -> dict[str, UICheck]:
    """Open each page of the MLflow UI (``pages``: the part of the URL after ``#/``, e.g.
    ``experiments/1/datasets`` or ``experiments/1/runs/RUN_ID``) and look for its expected texts."""
    with mlflow_ui(tracking_uri) as base:
        return {page: _check(f"{base}/#/{page}", expect, attempts=attempts) for page, expect in pages.items()}


def _check(url: str, expect: Sequence[str], *, attempts: int) -> UICheck:
    """The page loads its data asynchronously; a render that misses some texts is retried (up to
    ``attempts``) with a longer script budget before they are reported missing."""
    import html

    dom = ""
    missing: list[str] = list(expect)
    for attempt in range(attempts):
        dom = html.unescape(render(url, budget_ms=25_000 * (attempt + 1)))
        missing = [t for t in expect if not _on_page(t, dom)]
        if not missing:
            break
    return UICheck(url=url, found=tuple(t for t in expect if t not in missing), missing=tuple(missing), dom=dom)


__all__ = [
    "CHROMIUM_FLAGS",
    "UICheck",
    "check_evaluation_ui",
    "check_pages",
    "comparison_url",
    "find_chromium",
    "mlflow_ui",
    "render",
    "screenshot",
]
