"""The CPU as the embedded engine finds it: features, the cores this process may use, and how many of
them other processes keep busy, so that llama.cpp's thread count fits the machine as it is.

Why it matters: ggml's worker threads wait for each other at every step of a graph, spinning. A thread
that the OS cannot schedule (its core is busy with another process, or with another of our own models)
stalls all the others, so two threads on two cores with one kept busy run several times slower than one
thread (``experiments/bench_threads.py``; the table is in docs/benchmarks.md). The default thread count
is therefore taken, at every call, from

- the cores this process may use: its CPU affinity (``os.sched_getaffinity``) capped by the cgroup CPU
  quota (``cpu.max`` in cgroup v2, ``cpu.cfs_quota_us`` in v1), as a container sees them;
- minus the cores other processes kept busy over the last second or so (``/proc/stat`` for the usable
  cores, less this process's own CPU time);
- shared among this process's models that are computing at that moment (:class:`CpuShare`).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

#: The instruction-set features that decide which llama.cpp kernels run (x86-64 names of /proc/cpuinfo).
FEATURES: tuple[str, ...] = (
    "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
    "avx_vnni", "amx_tile", "amx_int8", "amx_bf16",
)


@dataclass(frozen=True)
class CpuInfo:
    """What the CPU is: its model name, the features of :data:`FEATURES` it has, and an identity."""

    model: str
    features: tuple[str, ...]

    @property
    def has_amx(self) -> bool:
        return "amx_tile" in self.features

    def identity(self) -> str:
        """Model and features: the part of a machine that decides whether compiled kernels run."""
        return f"{self.model} [{' '.join(self.features)}]"


def cpu_info(cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuInfo:
    """The CPU of this machine (its first processor's entry); empty where /proc/cpuinfo is absent."""
    model, flags = "", set[str]()
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    if not model:
        import platform

        model = platform.processor() or platform.machine()
    return CpuInfo(model=model, features=tuple(f for f in FEATURES if f in flags))


@dataclass(frozen=True)
class UsableCores:
    """The cores this process may use: ``cpus`` (its affinity) and ``quota`` (cgroup CPU quota in
    cores, None where unlimited); ``count`` is the smaller, as a number of threads."""

    cpus: frozenset[int]
    quota: float | None

    @property
    def count(self) -> int:
        n = len(self.cpus)
        if self.quota is not None:
            n = min(n, max(1, math.floor(self.quota + 0.5)))
        return max(1, n)

    def why(self) -> str:
        text = f"{len(self.cpus)} core(s) in this process's CPU affinity"
        if self.quota is not None:
            text += f", cgroup CPU quota {self.quota:g} core(s)"
        return text


def _cgroup_quota(root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup in cores, the smallest along its path (v2 ``cpu.max``,
    v1 ``cpu.cfs_quota_us``); None where there is none. A container sees its own cgroup at the root."""
    folders: list[tuple[Path, str]] = []
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "":  # v2
            base = root
        elif "cpu" in controllers.split(","):  # v1
            base = root / controllers
        else:
            continue
        folder = base / rel.lstrip("/")
        while True:
            folders.append((folder, "v2" if controllers == "" else "v1"))
            if folder == base:
                break
            folder = folder.parent
    folders += [(root, "v2"), (root / "cpu", "v1"), (root / "cpu,cpuacct", "v1")]
    quotas = []
    for folder, kind in folders:
        try:
            if kind == "v2":
                quota, period = (folder / "cpu.max").read_text().split()[:2]
                if quota != "max":
                    quotas.append(int(quota) / int(period))
            else:
                quota_us = int((folder / "cpu.cfs_quota_us").read_text())
                period_us = int((folder / "cpu.cfs_period_us").read_text())
                if quota_us > 0 and period_us > 0:
                    quotas.append(quota_us / period_us)
        except (OSError, ValueError):
            continue
    return min(quotas) if quotas else None


def usable_cores() -> UsableCores:
    """The cores this process may use now (affinity and cgroup quota)."""
    try:
        cpus = frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = frozenset(range(os.cpu_count() or 1))
    return UsableCores(cpus=cpus, quota=_cgroup_quota())


def _busy_ticks(cpus: frozenset[int], stat: Path = Path("/proc/stat")) -> int | None:
    """Busy clock ticks (user, nice, system, irq, softirq, steal) summed over ``cpus``; None: unknown."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    total = 0
    for line in lines:
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *values = line.split()
        try:
            index = int(name[3:])
        except ValueError:
            continue
        if index in cpus:
            v = [int(x) for x in values[:8]] + [0] * 8
            total += v[0] + v[1] + v[2] + v[5] + v[6] + v[7]  # idle (3) and iowait (4) are free time
    return total


class CpuLoad:
    """How many of the usable cores other processes keep busy, from ``/proc/stat`` deltas less this
    process's own CPU time, over windows of at least ``window_s`` seconds (cheap: two small reads)."""

    def __init__(self, usable: UsableCores, *, window_s: float = 1.0) -> None:
        self.usable = usable
        self.window_s = window_s
        self._hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._lock = threading.Lock()
        self._last: tuple[float, int, float] | None = None
        self._others = 0.0
        self.sample()

    def _now(self) -> tuple[float, int, float] | None:
        busy = _busy_ticks(self.usable.cpus)
        if busy is None:
            return None
        times = os.times()
        return time.monotonic(), busy, times.user + times.system

    def sample(self, *, force: bool = False) -> float:
        """Cores busy with other processes (0 .. len(cpus)), re-measured once a window has passed."""
        with self._lock:
            now = self._now()
            if now is None:
                return 0.0
            last = self._last
            if last is None:
                self._last = now
            elif force or now[0] - last[0] >= self.window_s:
                wall = now[0] - last[0]
                if wall > 0:
                    system = (now[1] - last[1]) / self._hz
                    own = now[2] - last[2]
                    self._others = min(float(len(self.usable.cpus)), max(0.0, (system - own) / wall))
                self._last = now
            return self._others


@dataclass(frozen=True)
class ThreadChoice:
    """A thread count and the reason for it, as ``opro doctor`` and the model's description show it."""

    n_threads: int
    why: str


class CpuShare:
    """The threads each llama.cpp model gets: the usable cores not busy with other processes, shared
    among the models of this process that compute at the same moment. One per :class:`ModelPool`.

    ``threads(fixed)`` is a context manager around one computation; ``fixed`` (a model's
    ``n_threads`` setting) wins when given."""

    def __init__(self, *, usable: UsableCores | None = None, load: CpuLoad | None = None) -> None:
        self.usable = usable or usable_cores()
        self.load = load or CpuLoad(self.usable)
        self._lock = threading.Lock()
        self._active = 0

    def choose(self, *, sharing: int = 1) -> ThreadChoice:
        """The default thread count now, for a model computing beside ``sharing - 1`` others."""
        others = self.load.sample()
        free = len(self.usable.cpus) - others
        if self.usable.quota is not None:
            free = min(free, self.usable.quota)
        n = max(1, math.floor(free / max(1, sharing) + 0.5))
        why = f"{self.usable.why()}, {others:.1f} busy with other processes"
        if sharing > 1:
            why += f", shared by {sharing} models computing at once"
        return ThreadChoice(n, why)

    @contextmanager
    def threads(self, fixed: int | None = None) -> Iterator[int]:
        with self._lock:
            self._active += 1
            sharing = self._active
        try:
            yield fixed if fixed is not None else self.choose(sharing=sharing).n_threads
        finally:
            with self._lock:
                self._active -= 1


__all__ = ["FEATURES", "CpuInfo", "CpuLoad", "CpuShare", "ThreadChoice", "UsableCores", "cpu_info", "usable_cores"]
