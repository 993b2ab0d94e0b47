"""The CPU as the engine sees it: features, usable cores (affinity, cgroup quota), cores busy with other
processes, and the thread count each model gets."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes import run_together

from opro.llm.cpu import CpuLoad, CpuShare, UsableCores, _busy_ticks, _cgroup_quota, cpu_info, usable_cores


def test_cpu_info_reads_model_and_the_features_that_pick_kernels(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8488C\n"
        "flags\t\t: fpu sse2 avx avx2 fma avx512f avx512_vnni amx_tile amx_int8 amx_bf16\n\n"
        "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8488C\nflags\t\t: fpu\n"
    )
    info = cpu_info(cpuinfo)
    assert info.model == "Intel(R) Xeon(R) Platinum 8488C"
    assert info.features == ("avx", "avx2", "fma", "avx512f", "avx512_vnni", "amx_tile", "amx_int8", "amx_bf16")
    assert info.has_amx
    assert not cpu_info(tmp_path / "absent").has_amx  # no /proc: no features, no crash


def test_cgroup_quota_v2_and_v1_the_smallest_along_the_path(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("0::/user/job\n")
    (tmp_path / "fs" / "user" / "job").mkdir(parents=True)
    (tmp_path / "fs" / "user" / "job" / "cpu.max").write_text("max 100000\n")
    (tmp_path / "fs" / "user" / "cpu.max").write_text("150000 100000\n")
    assert _cgroup_quota(tmp_path / "fs", proc) == 1.5
    (tmp_path / "fs" / "user" / "cpu.max").write_text("max 100000\n")
    assert _cgroup_quota(tmp_path / "fs", proc) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu,cpuacct" / "docker" / "abc").mkdir(parents=True)
    (v1 / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us").write_text("50000\n")
    (v1 / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_period_us").write_text("100000\n")
    proc.write_text("4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n")
    assert _cgroup_quota(v1, proc) == 0.5


def test_usable_cores_take_the_quota_and_the_affinity() -> None:
    assert UsableCores(frozenset({0, 1, 2, 3}), None).count == 4
    assert UsableCores(frozenset({0, 1, 2, 3}), 1.5).count == 2
    assert UsableCores(frozenset({0, 1}), 8.0).count == 2
    assert UsableCores(frozenset({0}), 0.2).count == 1
    here = usable_cores()
    assert here.cpus and 1 <= here.count <= len(here.cpus)
    assert "affinity" in here.why()


def test_busy_ticks_count_only_the_usable_cores(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  30 0 30 900 5 0 0 0 0 0\n"
        "cpu0 10 0 10 500 5 0 0 0 0 0\n"
        "cpu1 20 0 20 400 0 0 0 3 0 0\n"
        "intr 1 2 3\n"
    )
    assert _busy_ticks(frozenset({0}), stat) == 20
    assert _busy_ticks(frozenset({1}), stat) == 43  # steal counts as busy: another guest has the core
    assert _busy_ticks(frozenset({0, 1}), stat) == 63


class _Load:
    def __init__(self, others: float) -> None:
        self.others = others

    def sample(self, *, force: bool = False) -> float:
        return self.others


def test_default_threads_leave_out_busy_cores_and_share_among_models_computing_at_once() -> None:
    four = UsableCores(frozenset(range(4)), None)
    assert CpuShare(usable=four, load=_Load(0.0)).choose().n_threads == 4  # type: ignore[arg-type]
    assert CpuShare(usable=four, load=_Load(1.0)).choose().n_threads == 3  # type: ignore[arg-type]
    assert CpuShare(usable=four, load=_Load(4.0)).choose().n_threads == 1  # type: ignore[arg-type]
    quota = UsableCores(frozenset(range(16)), 2.0)
    assert CpuShare(usable=quota, load=_Load(8.0)).choose().n_threads == 2  # type: ignore[arg-type]
    two = UsableCores(frozenset(range(2)), None)
    share = CpuShare(usable=two, load=_Load(0.0))  # type: ignore[arg-type]
    choice = share.choose(sharing=2)
    assert choice.n_threads == 1 and "2 models" in choice.why
    with share.threads() as alone:
        assert alone == 2
        with share.threads() as beside:  # a second model computing at the same time
            assert beside == 1
        with share.threads(fixed=2) as fixed:
            assert fixed == 2  # a model's own n_threads setting wins
    with share.threads() as again:
        assert again == 2


def test_the_load_sees_another_process_keeping_a_core_busy_and_not_our_own_work() -> None:
    load = CpuLoad(usable_cores(), window_s=0.0)
    # Our own work is not "others".
    stop = time.monotonic() + 0.6
    while time.monotonic() < stop:
        pass
    own = load.sample(force=True)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        load.sample(force=True)
        time.sleep(1.0)
        others = load.sample(force=True)
    finally:
        spinner.kill()
        spinner.wait()
    assert others >= 0.6, others
    assert own <= others - 0.4, (own, others)


def test_concurrent_threads_requests_are_counted_safely() -> None:
    share = CpuShare(usable=UsableCores(frozenset(range(8)), None), load=_Load(0.0))  # type: ignore[arg-type]
    seen: list[int] = []

    def run(_: int) -> None:
        for _ in range(200):
            with share.threads() as n:
                seen.append(n)

    assert run_together(run, threads=4) == []
    assert min(seen) >= 2 and max(seen) <= 8
    with share.threads() as n:
        assert n == 8  # every request was released


@pytest.mark.parametrize("busy", [0.0, 1.0])
def test_two_cores_one_busy_gives_one_thread(busy: float) -> None:
    share = CpuShare(usable=UsableCores(frozenset({0, 1}), None), load=_Load(busy))  # type: ignore[arg-type]
    assert share.choose().n_threads == (2 if busy == 0 else 1)
