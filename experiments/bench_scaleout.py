"""Scale-out: wall time of 1, 2 and 4 `opro optimize --worker I/N` processes on one study.

Every worker is its own process with its own output folder and cold call cache (as on separate
machines) and the same per-worker concurrency (``--concurrency``, the models' ``max_concurrency``);
they share the Optuna study (a SQLite file here, or ``--storage postgresql+psycopg2://...``). All
talk to one loopback OpenAI-compatible server (tests/fault_server.py) that answers every request
after ``--latency`` seconds. Per N the table gives:

- wall s: first worker started to last worker exited (process start-up included);
- window s: the server's first request to its last reply; requests; req/s in total and per worker;
- speed-up: the single worker's wall time over this one's, and wall / single wall;
- history: whether worker 0's history.jsonl (step, index, instruction, score, status, per-question
  scores) equals the single worker's.

Usage (about 4 minutes at the defaults):

    PYTHONPATH=$PWD LITELLM_LOCAL_MODEL_COST_MAP=True python experiments/bench_scaleout.py --latency 0.2

It is a benchmark, not a test: nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _loopback import write_config, write_data  # this folder is on sys.path when run as a script

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-bench-0123456789abcdef"


def _config(base: Path, name: str, url: str, storage: str, study: str, args: argparse.Namespace) -> Path:
    return write_config(
        base / f"{name}.toml", name=name, url=url, concurrency=args.concurrency,
        split={"exemplar": 3, "optimization": args.questions, "validation": 0, "heldout": 2},
        optimizer={"steps": args.steps, "candidates_per_step": args.candidates, "minibatch_size": args.minibatch,
                   "pruner": args.pruner, "finalists": 0},
        tracking={"optuna_storage": storage, "study_name": study, "register_prompt": False},
    )


def _history(folder: Path) -> list[tuple[Any, ...]]:
    rows = [json.loads(line) for line in (folder / "history.jsonl").read_text().splitlines()]
    return [(r["step"], r["index"], r["instruction"], r["score"], r["status"], tuple(r["scores"])) for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, default=0.2, help="seconds the server takes per request")
    parser.add_argument("--workers", default="1,2,4", help="numbers of worker processes to compare")
    parser.add_argument("--concurrency", type=int, default=4, help="max_concurrency of each worker's models")
    parser.add_argument("--questions", type=int, default=24, help="optimization questions")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--minibatch", type=int, default=4)
    parser.add_argument("--pruner", default="race", choices=("none", "median", "best", "race"))
    parser.add_argument("--storage", default="", help="shared Optuna storage URL [default: a SQLite file here]")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT / "tests"))  # the loopback fake server the network tests use
    from fault_server import FaultServer

    env = {**os.environ, "OPRO_BENCH_KEY": KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    opro = [sys.executable, "-c", "from opro.cli import main; main()"]
    rows: list[list[str]] = []
    single: tuple[float, list[tuple[Any, ...]]] | None = None
    with tempfile.TemporaryDirectory(prefix="opro-bench-scaleout-") as tmp, FaultServer(
        key=KEY, latency_s=args.latency, max_requests=10**7, lifetime_s=6 * 3600, keep_alive=True,
        distinct=True,
    ) as server:
        base = Path(tmp)
        write_data(base, 5 + args.questions)
        storage = args.storage or f"sqlite:///{base / 'optuna.db'}"
        for n in (int(x) for x in args.workers.split(",")):
            study = f"bench-{n}-{int(time.time())}"
            configs = [_config(base, f"n{n}-w{i}", server.base_url, storage, study, args) for i in range(n)]
            with server.lock:
                server.counts.clear()
                server.first_s = server.last_s = None
            started = time.time()
            procs = []
            for i, cfg in enumerate(configs):
                # Each worker its own cold call cache, as on its own machine.
                wenv = {**env, "OPRO_CACHE_DIR": str(base / f"cache-n{n}-w{i}")}
                procs.append(subprocess.Popen([*opro, "optimize", str(cfg), "--worker", f"{i}/{n}", "--no-progress"],
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=wenv,
                                              cwd=base))
            outs = [p.communicate()[0] for p in procs]
            wall = time.time() - started
            failed = [i for i, p in enumerate(procs) if p.returncode != 0]
            for i in failed:
                print(f"worker {i}/{n} exited {procs[i].returncode}:\n{outs[i][-3000:]}", file=sys.stderr)
            requests = sum(server.counts.values())
            window = (server.last_s or started) - (server.first_s or started)
            history = _history(base / f"n{n}-w0") if not failed else []
            if single is None:
                single = (wall, history)
            rps = requests / window if window > 0 else 0.0
            rows.append([
                str(n), f"{wall:.1f}", f"{window:.1f}", str(requests), f"{rps:.1f}", f"{rps / n:.1f}",
                f"{single[0] / wall:.2f}x", f"{wall / single[0]:.2f}",
                "failed" if failed else ("identical" if history == single[1] else "DIFFERENT"),
                f"{sum(1 for r in history if r[4] == 'pruned')}/{len(history)}",
            ])
    head = ["workers", "wall s", "window s", "requests", "req/s", "req/s per worker", "speed-up", "wall / single",
            "history vs 1 worker", "pruned/candidates"]
    print(f"\nL = {args.latency:g} s; concurrency {args.concurrency} per worker; {args.questions} questions; "
          f"{args.steps} steps x {args.candidates} candidates; pruner {args.pruner}; storage "
          f"{'SQLite' if not args.storage else args.storage.split(':')[0]}\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
