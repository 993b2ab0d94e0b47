"""A start-up probe of the embedded engine: load a GGUF model the way opro does and decode a few tokens in
a child process, so that a crash of the native library (a segmentation fault in llama.cpp) is a result
here, not the death of the run.

Why: llama.cpp's *extra buffer types* (AMX tiles on recent Xeons, repacked weights for AVX2 / AVX-512)
crash some builds on some CPUs (llama.cpp issue 20824: SIGSEGV in ``ggml_backend_amx_mul_mat`` on
Sapphire Rapids and later; builds with GCC 11 are known to break the AMX code). llama-cpp-python builds
llama.cpp with ``-march=native``, so which kernels run depends on the machine it was built on and the
one it runs on. The probe runs once per machine, llama.cpp build and model; its result is kept in
``<cache>/probes/`` (``opro doctor`` shows it). ``[models.ROLE].extra_buffers``:

- ``"auto"`` (default): probe with extra buffers on (faster where they work); if the child crashes,
  probe with them off and use that; if that crashes too, one line says so (:class:`ModelPackError`).
- ``"on"`` / ``"off"``: that setting only, probed all the same: a crash is refused with the way out.

The child is ``python -m opro.llm.probe PATH MODE`` (``__main__.py``, the one part that imports the backend:
:mod:`opro.llm.llamacpp` imports this module to probe before it loads): a prompt of about 100 tokens
(prefill, through the batched kernels), a few greedy tokens (decode), and two answers decoded together
(the batched path of :meth:`LlamaCppLLM.generate_many`).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from opro.errors import ModelPackError
from opro.paths import cache_dir

ExtraBuffers = Literal["auto", "on", "off"]
EXTRA_BUFFERS: tuple[str, ...] = ("auto", "on", "off")

#: The child's time limit: a load of the 1.5B model from a cold disk and a few tokens take seconds.
PROBE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class ProbeResult:
    """One probe: ``mode`` ("on" / "off": extra buffers), whether it ``ok``, why not (``detail``), the
    model buffers llama.cpp reported (``buffers``: "CPU_REPACK model buffer size = 120.0 MiB", ...),
    its duration, whether the child died of a signal (``crashed``: a verdict on this machine and build,
    unlike a timeout), and whether it was read from the record of an earlier probe (``cached``)."""

    mode: str
    ok: bool
    detail: str
    buffers: tuple[str, ...] = ()
    seconds: float = 0.0
    crashed: bool = False
    cached: bool = False


def supports_extra_buffers_switch() -> bool:
    """Whether this llama-cpp-python's model parameters have ``use_extra_bufts`` (their layout changes
    between versions, so the field is looked for, not assumed)."""
    import llama_cpp

    return any(name == "use_extra_bufts" for name, *_ in llama_cpp.llama_model_params._fields_)


def engine_identity() -> dict[str, str]:
    """What decides whether a compiled kernel runs here: the CPU, llama-cpp-python's version and its
    shared library (path, size, mtime: a rebuild for another CPU changes them)."""
    import llama_cpp

    from opro.llm.cpu import cpu_info

    lib = getattr(getattr(llama_cpp.llama_cpp, "_lib", None), "_name", None) or llama_cpp.__file__
    try:
        st = os.stat(lib)
        built = f"{lib} {st.st_size} {st.st_mtime_ns}"
    except OSError:
        built = str(lib)
    return {"cpu": cpu_info().identity(), "llama_cpp_python": llama_cpp.__version__, "library": built}


def _record(sha256: str, mode: str) -> Path:
    key = json.dumps({**engine_identity(), "model": sha256, "mode": mode}, sort_keys=True)
    return cache_dir() / "probes" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def recorded(sha256: str, mode: str) -> ProbeResult | None:
    """The result of an earlier probe of this model and mode on this machine and build, if any."""
    try:
        data = json.loads(_record(sha256, mode).read_text(encoding="utf-8"))
        return ProbeResult(**{**data, "buffers": tuple(data.get("buffers", ())), "cached": True})
    except (OSError, ValueError, TypeError):
        return None


def _child_argv(path: Path, mode: str) -> list[str]:
    return [sys.executable, "-m", "opro.llm.probe", str(path), mode]


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def run_probe(path: Path, mode: str, *, timeout_s: float = PROBE_TIMEOUT_S) -> ProbeResult:
    """Probe ``path`` with extra buffers ``mode`` in a child process now (no record read or written)."""
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            _child_argv(path, mode), capture_output=True, text=True, errors="replace", timeout=timeout_s,
            stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        )
    except subprocess.TimeoutExpired:
        return ProbeResult(mode, False, f"no answer within {timeout_s:.0f} s", seconds=time.perf_counter() - started)
    seconds = time.perf_counter() - started
    buffers = tuple(
        line.split(":", 1)[1].strip() for line in proc.stderr.splitlines() if "model buffer size" in line and ":" in line
    )
    if proc.returncode < 0:
        detail = f"llama.cpp crashed ({_signal_name(proc.returncode)})"
        return ProbeResult(mode, False, detail, buffers, seconds, crashed=True)
    if proc.returncode != 0:
        last = [line for line in proc.stderr.strip().splitlines() if line.strip()][-1:] or ["no message"]
        return ProbeResult(mode, False, f"exit {proc.returncode}: {last[0][:300]}", buffers, seconds)
    return ProbeResult(mode, True, "decoded", buffers, seconds)


def probe(path: Path, sha256: str, mode: str, *, refresh: bool = False) -> ProbeResult:
    """The probe of this model with extra buffers ``mode`` ("on" / "off"), from its record when this
    machine and build ran it before (unless ``refresh``); a new result is recorded. A child that
    timed out is not recorded (the machine may have been busy)."""
    if not refresh:
        found = recorded(sha256, mode)
        if found is not None:
            return found
    result = run_probe(path, mode)
    if result.ok or result.crashed:
        target = _record(sha256, mode)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps({**asdict(result), "cached": False}), encoding="utf-8")
            os.replace(tmp, target)
        except OSError:
            pass  # a read-only cache: the probe runs again next time
    return result


def choose_extra_buffers(path: Path, sha256: str, setting: str, *, where: str = "") -> ProbeResult:
    """The extra-buffers mode to load ``path`` with under ``setting`` ("auto", "on", "off"), probed;
    a :class:`ModelPackError` of one line where no mode runs on this CPU. ``where`` names the setting
    (``[models.task].``) in the message."""
    if setting not in EXTRA_BUFFERS:
        raise ModelPackError(f"{where}extra_buffers must be one of {', '.join(EXTRA_BUFFERS)}, got {setting!r}")
    if setting == "auto" and not supports_extra_buffers_switch():
        modes = ["on"]  # the library has no switch: what it does is all there is
    else:
        modes = ["on", "off"] if setting == "auto" else [setting]
    tried = []
    for mode in modes:
        result = probe(path, sha256, mode)
        if result.ok:
            return result
        tried.append(f"extra buffers {mode}: {result.detail}")
    if setting == "auto":
        fix = "point the roles that use it at an OpenAI-compatible endpoint, or rebuild llama-cpp-python on this machine"
    else:
        table = where or "the [models.*] tables that use this model: "
        fix = f'set {table}extra_buffers = "auto" (it falls back to what runs here)'
    raise ModelPackError(f"{path.name} cannot run on this CPU ({'; '.join(tried)}); {fix}. `opro doctor` shows what it found.")
