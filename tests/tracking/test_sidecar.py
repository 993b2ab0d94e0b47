"""The sidecar process: one object in a child interpreter, its methods called in order across a pipe."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from children import Counter, argv

from opro.errors import DataError, OproError
from opro.tracking.sidecar import Sidecar


class Broken:
    def __init__(self) -> None:
        raise DataError("the store is unusable")


def test_calls_run_in_a_child_in_order_with_its_state() -> None:
    car = Sidecar(name="test-sidecar")
    car.host("a", functools.partial(Counter, start=10))
    car.host("b", Counter)
    try:
        assert car.call("a", "pid") != os.getpid()
        assert car.call("a", "pid") == car.call("b", "pid")  # one child holds both
        assert [car.call("a", "add", n, times=2) for n in (1, 2, 3)] == [12, 16, 22]
        assert car.call("b", "add", 1) == 1  # each object its own state
        with pytest.raises(DataError, match="bad input") as info:
            car.call("a", "fail", "input")
        assert any("in the sidecar process" in note for note in info.value.__notes__)
        assert car.call("a", "add", 0) == 22  # an error leaves the object as it was
        with pytest.raises(OproError, match="nothing is hosted under 'c'"):
            car.call("c", "pid")
        with pytest.raises(OproError, match=r"a\.unpicklable_result returned what cannot be sent back"):
            car.call("a", "unpicklable_result")
        assert car.call("a", "add", 0) == 22  # the child lives on
    finally:
        car.close()
    car.close()  # idempotent
    with pytest.raises(OproError, match="test-sidecar process is closed"):
        car.call("a", "pid")


def test_the_last_owner_to_release_it_closes_it() -> None:
    car = Sidecar(name="test-sidecar").retain().retain()
    car.host("a", Counter)
    car.release()
    assert car.call("a", "add", 2) == 2  # still open for the other owner
    car.release()
    assert car._process.poll() == 0
    with pytest.raises(OproError, match="is closed"):
        car.call("a", "pid")


def test_owners_and_new_objects_do_not_wait_for_a_call_in_flight() -> None:
    """The search's thread hosts the GenAI logger while the MLflow thread waits seconds on a call."""
    import threading

    car = Sidecar(name="test-sidecar")
    car.host("a", Counter)
    try:
        car.call("a", "pid")  # started
        busy = threading.Thread(target=car.call, args=("a", "sleep", 3.0))
        busy.start()
        time.sleep(0.3)
        t = time.monotonic()
        car.retain()
        car.host("b", functools.partial(Counter, start=5))
        assert time.monotonic() - t < 1.0
        assert car.call("b", "add", 1) == 6  # after the call in flight, in order
        busy.join()
    finally:
        car.close()


def test_errors_that_cannot_cross_the_pipe_arrive_as_opro_errors_without_secrets() -> None:
    car = Sidecar(name="test-sidecar")
    car.host("a", Counter)
    try:
        with pytest.raises(OproError, match="Local: local trouble") as info:
            car.call("a", "unpicklable_failure")
        assert "sk-secret-99" not in str(info.value)
    finally:
        car.close()


def test_a_factory_that_fails_fails_every_call() -> None:
    car = Sidecar(name="test-sidecar")
    car.host("a", Broken)
    car.host("b", Counter)
    try:
        for _ in range(2):
            with pytest.raises(DataError, match="the store is unusable"):
                car.call("a", "anything")
        assert car.call("b", "add", 3) == 3  # the others are unaffected
    finally:
        car.close()


def test_a_child_that_dies_is_an_opro_error_naming_it() -> None:
    car = Sidecar(name="test-sidecar")
    car.host("a", Counter)
    with pytest.raises(OproError, match=r"test-sidecar process ended during a.die \(exit code 3\)"):
        car.call("a", "die")
    car.close()


def test_the_child_does_not_run_the_parents_main_script_again(tmp_path: Path) -> None:
    """multiprocessing's spawn would import an unguarded user script in the child and run it twice."""
    marker = tmp_path / "runs.txt"
    script = Path(__file__).with_name("unguarded_script.py")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OPRO_TEST_MARKER": str(marker),  # tests/: where children.py is
                              "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1]),
                                                                          os.environ.get("PYTHONPATH")]))})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "2"
    assert marker.read_text() == "run\n"


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z":
                return True  # exited; a zombie until init reaps it
        time.sleep(0.1)
    os.kill(pid, 9)
    return False


def test_the_child_exits_when_its_parent_is_killed() -> None:
    out = subprocess.run(argv("sidecar_parent_killed"), capture_output=True, text=True, timeout=120)
    assert out.returncode == -9
    assert _gone_within(int(out.stdout.strip()), 30), "the sidecar outlived its parent"


def test_the_child_exits_when_its_parent_is_killed_during_a_call() -> None:
    """Issue 49: killed during the MLflow writes, `opro optimize`'s sidecar went on for 95-156 s (the
    pipe's end of file reaches the child only once its call in progress is done; the test above kills
    the parent of an idle child), racing a rerun on the store. It watches its parent: gone within
    seconds, whatever it was doing."""
    out = subprocess.run(argv("sidecar_parent_killed_mid_call"), capture_output=True, text=True, timeout=120)
    assert out.returncode == -9
    assert _gone_within(int(out.stdout.strip()), 5), "the sidecar outlived its parent by its call"
