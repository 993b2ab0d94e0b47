"""What the MLflow 3 GenAI records cost `opro optimize`: the same run with ``[tracking].genai`` on and off.

The models are a loopback fake OpenAI-compatible server (tests/fault_server.py) that answers every
call after a fixed latency, so the LLM side costs the same in both modes and the difference is
opro's MLflow work: registering the dataset splits as evaluation datasets and recording the
validation stage (initial instruction + finalists) as evaluation runs with one trace per question.
Each run is a fresh ``opro optimize`` process (imports included) in a fresh output folder with a
fresh call cache; modes alternate so drift on a shared machine hits both.

    python experiments/bench_genai_logging.py --repeats 3 --latency 0.5
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from _loopback import KEY_ENV, write_config, write_data  # noqa: E402  (this folder is on sys.path as a script)
from fault_server import FaultServer  # noqa: E402

KEY = "bench-key"


def bench_config(folder: Path, *, base_url: str, genai: bool, questions: int, validation: int, steps: int,
                 candidates: int, concurrency: int) -> Path:
    write_data(folder, questions)
    return write_config(
        folder / "bench.toml", name="bench", url=base_url, concurrency=concurrency, output_dir="out",
        cache_path="calls.sqlite",
        split={"exemplar": 2, "optimization": questions - 2 - validation - 2, "validation": validation, "heldout": 2},
        optimizer={"steps": steps, "candidates_per_step": candidates, "pruner": "none"},
        tracking={"genai": genai},
    )


def run_once(server: FaultServer, *, genai: bool, args: argparse.Namespace) -> tuple[float, float, int]:
    with tempfile.TemporaryDirectory(prefix="bench-genai-") as tmp:
        config = bench_config(Path(tmp), base_url=server.base_url, genai=genai, questions=args.questions,
                              validation=args.validation, steps=args.steps, candidates=args.candidates,
                              concurrency=args.concurrency)
        env = {**os.environ, KEY_ENV: KEY, "PYTHONPATH": str(ROOT), "OPRO_CACHE_DIR": str(Path(tmp) / "cache")}
        before = sum(server.counts.values())
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "opro.cli", "optimize", str(config), "--no-progress"],
                              env=env, capture_output=True, text=True, timeout=1800)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime + after.ru_stime) - (usage.ru_utime + usage.ru_stime)
        if proc.returncode != 0:
            raise SystemExit(f"optimize failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return wall, cpu, sum(server.counts.values()) - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.5, help="seconds the fake server waits per call")
    parser.add_argument("--questions", type=int, default=24)
    parser.add_argument("--validation", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--candidates", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    walls: dict[bool, list[float]] = {True: [], False: []}
    cpus: dict[bool, list[float]] = {True: [], False: []}
    calls: dict[bool, list[int]] = {True: [], False: []}
    with FaultServer(key=KEY, latency_s=args.latency, max_requests=1_000_000, lifetime_s=7200) as server:
        for i in range(args.repeats):
            for genai in ((False, True) if i % 2 == 0 else (True, False)):
                wall, cpu, n = run_once(server, genai=genai, args=args)
                walls[genai].append(wall)
                cpus[genai].append(cpu)
                calls[genai].append(n)
                print(f"repeat {i + 1}: genai={'on ' if genai else 'off'} wall {wall:7.2f} s, CPU {cpu:6.2f} s, "
                      f"{n} LLM requests", flush=True)
    off, on = statistics.median(walls[False]), statistics.median(walls[True])
    print(f"\nlatency {args.latency} s per call, {args.questions} questions ({args.validation} validation), "
          f"{args.steps} steps x {args.candidates} candidates, concurrency {args.concurrency}, {args.repeats} repeats")
    print(f"median wall: genai off {off:.2f} s, on {on:.2f} s; overhead {on - off:+.2f} s = {100 * (on - off) / off:+.1f}%")
    c_off, c_on = statistics.median(cpus[False]), statistics.median(cpus[True])
    print(f"median CPU (opro process): genai off {c_off:.2f} s, on {c_on:.2f} s; overhead {c_on - c_off:+.2f} s")
    print(f"LLM requests per run: off {sorted(set(calls[False]))}, on {sorted(set(calls[True]))}")


if __name__ == "__main__":
    main()
