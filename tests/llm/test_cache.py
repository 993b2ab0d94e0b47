"""CallCache: persistence, threads and several processes on one SQLite file."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

from fakes import run_together

from opro.llm import Completion
from opro.llm.cache import CallCache


def _completion(i: int) -> Completion:
    return Completion(text=f"answer {i}", model="m", prompt_tokens=i, completion_tokens=1, latency_s=0.1)


def test_put_get_roundtrip_marks_cached(tmp_path: Path) -> None:
    cache = CallCache(tmp_path / "c.sqlite")
    assert cache.get("k") is None
    cache.put("k", _completion(3))
    got = cache.get("k")
    assert got is not None and got.cached and got.text == "answer 3" and got.prompt_tokens == 3
    assert len(cache) == 1
    cache.clear()
    assert len(cache) == 0 and cache.get("k") is None
    cache.close()


def test_persists_across_instances(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "c.sqlite"
    a = CallCache(path)
    a.put("k", _completion(1))
    a.close()
    b = CallCache(path)
    hit = b.get("k")
    assert hit is not None and hit.text == "answer 1"
    b.close()


def test_many_threads_write_and_read(tmp_path: Path) -> None:
    cache = CallCache(tmp_path / "c.sqlite")

    def work(t: int) -> None:
        for i in range(50):
            key = f"t{t}-{i}"
            cache.put(key, _completion(i))
            hit = cache.get(key)
            assert hit is not None and hit.text == f"answer {i}"

    assert run_together(work, threads=8) == []
    assert len(cache) == 400
    cache.close()


def _writer(path: str, worker: int, n: int) -> None:
    cache = CallCache(path)
    for i in range(n):
        cache.put(f"p{worker}-{i}", _completion(i))
        # Read what the other process wrote so far, to interleave reads and writes.
        cache.get(f"p{1 - worker}-{i}")
    cache.close()


def test_two_processes_share_one_file(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite"
    CallCache(path).close()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(path), w, 100)) for w in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    cache = CallCache(path)
    assert len(cache) == 200
    hit = cache.get("p1-99")
    assert hit is not None and hit.text == "answer 99"
    cache.close()


def test_concurrent_callers_share_a_bounded_number_of_connections_and_see_their_own_writes(tmp_path: Path) -> None:
    cache = CallCache(tmp_path / "c.sqlite", max_readers=2)

    def work(t: int) -> None:
        for i in range(30):
            cache.put(f"t{t}-{i}", _completion(i))
            hit = cache.get(f"t{t}-{i}")  # visible at once, committed or not
            assert hit is not None and hit.text == f"answer {i}"

    errors = run_together(work, threads=16)
    assert errors == [] and cache._n_readers <= 2
    cache.delete("t0-0")
    assert cache.get("t0-0") is None
    cache.close()
    # Everything queued was committed by close(): a fresh instance (another process) reads it all.
    again = CallCache(tmp_path / "c.sqlite")
    assert len(again) == 16 * 30 - 1 and again.get("t15-29") is not None
    again.close()


def test_openers_of_a_new_cache_file_at_the_same_instant_all_open_it(tmp_path: Path) -> None:
    """Switching a new file to WAL takes an exclusive lock: two openers at one instant must not read the
    loser's "database is locked" as "not a SQLite file" (20 fresh files, 2 threads each, a barrier)."""
    for i in range(20):
        path = tmp_path / f"calls-{i}.sqlite"
        errors = run_together(lambda _, path=path: CallCache(path).close())
        assert not errors, (i, errors)
