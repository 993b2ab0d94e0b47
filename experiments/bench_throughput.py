"""Throughput of `opro optimize` / `opro compare` and DSPy on one loopback OpenAI-compatible server.

The server (tests/fault_server.py) answers every request after ``--latency`` seconds, per role
(task, judge, optimizer: told apart by the model name; DSPy's requests get replies in its chat
format) and counts the requests in flight. Each run is a separate process started here; the table
gives, per run:

- requests: what the server answered; window: first request to last reply (seconds);
- req/s inside the window, the ideal W/L (W requests in flight, each taking L) and their ratio;
  above the table, the most req/s opro optimize's own dependency chain allows at each W (see
  :func:`chain_rounds`): at large W the work of a step no longer fills W slots, so W/L is out of reach;
- peak: most requests in flight at the server;
- CPU ms/req: the client's CPU time (its process and its children: opro's MLflow sidecar) inside the
  window per request (/proc sampling);
- start / end: process start to first request, last reply to process exit (fixed cost).

The "bare HTTP chain" rows send exactly the requests of opro optimize's dependency chain, round by round
(:func:`chain_sizes`), from threads that do nothing but HTTP: what a threaded Python client that costs
nothing but its requests reaches on this machine and this server, a measured ceiling beside the computed one.

Usage (about 10 minutes at L = 0.2 s, most of it the W = 1 runs; ``--workers 32,128`` for a quick look):

    PYTHONPATH=$PWD LITELLM_LOCAL_MODEL_COST_MAP=True python experiments/bench_throughput.py --latency 0.2

It is a benchmark, not a test: nothing here is asserted.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from _loopback import write_config, write_data  # this folder is on sys.path when run as a script

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-bench-0123456789abcdef"
TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Row:
    run: str
    workers: int
    requests: int
    window_s: float
    peak: int
    cpu_s: float
    start_s: float
    end_s: float
    rc: int

    def cells(self, latency: float) -> list[str]:
        rps = self.requests / self.window_s if self.window_s > 0 else 0.0
        ideal = self.workers / latency if latency > 0 else float("nan")
        return [
            self.run, str(self.workers), str(self.requests), f"{self.window_s:.1f}", f"{rps:.1f}",
            f"{ideal:.0f}" if latency > 0 else "-", f"{rps / ideal:.2f}" if latency > 0 else "-", str(self.peak),
            f"{1000 * self.cpu_s / max(1, self.requests):.2f}", f"{self.start_s:.1f}", f"{self.end_s:.1f}",
            "" if self.rc == 0 else f"exit {self.rc}",
        ]


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _descendants(pid: int) -> list[int]:
    """Live descendants of ``pid`` (a scan of /proc: this kernel has no /proc/PID/task/TID/children)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = int(fields[1])
    out, frontier = [], [pid]
    while frontier:
        kids = [p for p, parent in parents.items() if parent in frontier]
        out += kids
        frontier = kids
    return out


def _cpu_s(pids: list[int]) -> float | None:
    """CPU seconds of the client ``pids[0]`` and its descendants ``pids[1:]``: the client's own, its
    waited-for children's (cutime, cstime) and its live descendants' (opro's MLflow sidecar is client
    CPU too). A descendant that exited was waited for by its parent, so its time moved into that
    parent's cutime: the sum stays continuous."""
    total = 0.0
    for i, pid in enumerate(pids):
        fields = _stat(pid)
        if fields is None:
            if i == 0:
                return None
            continue
        total += sum(int(f) for f in fields[11:15]) / TICK  # utime + stime + cutime + cstime
    return total


def _measure(server: object, cmd: list[str], *, run: str, workers: int, env: dict[str, str]) -> Row:
    with server.lock:  # type: ignore[attr-defined]
        server.counts.clear()  # type: ignore[attr-defined]
        server.peak.clear()  # type: ignore[attr-defined]
        server.peak_total = 0  # type: ignore[attr-defined]
        server.first_s = server.last_s = None  # type: ignore[attr-defined]
    started = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    samples: list[tuple[float, float]] = []

    def sample() -> None:  # the client's CPU clock, to charge it only for the window
        pids, scanned = [proc.pid], 0.0
        while proc.poll() is None:
            if time.time() - scanned > 0.25:  # new children (the sidecar) are found within 0.25 s
                pids, scanned = [proc.pid, *_descendants(proc.pid)], time.time()
            cpu = _cpu_s(pids)
            if cpu is not None:
                samples.append((time.time(), cpu))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = proc.communicate()
    ended = time.time()
    sampler.join()
    if proc.returncode != 0:
        print(out[-3000:], file=sys.stderr)
    first, last = server.first_s or started, server.last_s or ended  # type: ignore[attr-defined]

    def cpu_at(t: float) -> float:
        before = [c for s, c in samples if s <= t]
        return before[-1] if before else (samples[0][1] if samples else 0.0)

    return Row(
        run=run, workers=workers, requests=sum(server.counts.values()), window_s=last - first,  # type: ignore[attr-defined]
        peak=server.peak_total, cpu_s=cpu_at(last) - cpu_at(first), start_s=first - started,  # type: ignore[attr-defined]
        end_s=ended - last, rc=proc.returncode,
    )


def chain_rounds(*, questions: int, steps: int, candidates: int, w: int) -> int:
    """Latencies L that ``opro optimize`` (pruner off) must wait one after another with W slots per
    role, however fast the client: step 0 (the initial instruction on every question: its answers in
    ceil(q/W) rounds, then the last judge round), and per later step the optimizer's samples
    (ceil(k/W) rounds; they need the previous step's scores) and the step (ceil(k q / W) + 1)."""
    rounds = math.ceil(questions / w) + 1
    for _ in range(steps):
        rounds += math.ceil(candidates / w) + math.ceil(candidates * questions / w) + 1
    return rounds


def chain_sizes(*, questions: int, steps: int, candidates: int, w: int) -> list[list[str]]:
    """The requests of each of :func:`chain_rounds`'s rounds, by role, when every request takes one
    round: a step's answers fill W task slots, each answer's judgment goes into the next round (W
    judge slots), and the optimizer's samples come between steps."""

    def step(pairs: int) -> list[list[str]]:
        rounds: list[list[str]] = []
        asked = judged = 0
        while judged < pairs:
            tasks = min(w, pairs - asked)
            judges = min(w, asked - judged)
            rounds.append(["task"] * tasks + ["judge"] * judges)
            asked += tasks
            judged += judges
        return rounds

    out = step(questions)
    for _ in range(steps):
        for done in range(0, candidates, w):
            out.append(["optimizer"] * min(w, candidates - done))
        out += step(candidates * questions)
    return out


def _config(base: Path, name: str, url: str, workers: int, args: argparse.Namespace) -> Path:
    return write_config(
        base / f"{name}.toml", name=name, url=url, concurrency=workers,
        split={"exemplar": 3, "optimization": args.questions, "validation": 0, "heldout": args.questions},
        optimizer={"steps": args.steps, "candidates_per_step": args.candidates, "minibatch_size": args.minibatch,
                   "pruner": "none", "finalists": 0},
    )


def dspy_child(args: argparse.Namespace) -> None:
    """Runs inside its own process: DSPy's Evaluate or COPRO on the bench server."""
    import dspy
    from dspy.teleprompt import COPRO

    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)

    def lm(role: str, **kw: object) -> dspy.LM:
        return dspy.LM(f"openai/{role}-model", api_base=args.base_url, api_key=KEY, cache=False, num_retries=0, **kw)

    task, judge, prompt_model = lm("task"), lm("judge"), lm("optimizer")
    dspy.configure(lm=task)
    facts = [f"Fact {d}-{i}: the value of item {d}-{i} is {d * 100 + i}." for d in range(8) for i in range(60)]
    examples = [
        dspy.Example(context=facts[(i % 8) * 60 + i % 60], question=f"What is the value of item {i % 8}-{i % 60}?",
                     reference=f"{(i % 8) * 100 + i % 60}.").with_inputs("context", "question")
        for i in range(args.questions)
    ]
    grader = dspy.Predict("question, answer, reference -> score: int")

    def metric(example: dspy.Example, pred: dspy.Prediction, trace: object = None) -> float:
        with dspy.context(lm=judge):
            return float(grader(question=example.question, answer=pred.answer, reference=example.reference).score) / 5

    program = dspy.Predict("context, question -> answer")
    if args.dspy_child == "evaluate":
        dspy.Evaluate(devset=examples, metric=metric, num_threads=args.threads, display_progress=False)(program)
    else:
        COPRO(prompt_model=prompt_model, metric=metric, breadth=args.candidates, depth=args.steps,
              init_temperature=1.0).compile(
            program, trainset=examples, eval_kwargs={"num_threads": args.threads, "display_progress": False}
        )


def bare_child(args: argparse.Namespace) -> None:
    """Runs inside its own process: the requests of opro optimize's dependency chain
    (:func:`chain_sizes`), round after round, by threads that do nothing but HTTP (``http.client``, one
    kept-alive connection each, no cache, no prompts, no bookkeeping): how close a threaded Python
    client that costs nothing but its requests gets to the chain's bound on this machine and server."""
    import http.client
    import json
    from urllib.parse import urlsplit

    rounds = chain_sizes(questions=args.questions, steps=args.steps, candidates=args.candidates, w=args.threads)
    url = urlsplit(args.base_url)
    path = url.path.rstrip("/") + "/chat/completions"
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    facts = "\n".join(f"Fact 0-{i}: the value of item 0-{i} is {i}." for i in range(12))  # about one chunk
    width = max(len(r) for r in rounds)
    start = threading.Barrier(width + 1, timeout=120)

    def worker(k: int) -> None:
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
        try:
            for n, roles in enumerate(rounds):
                start.wait()
                if k < len(roles):
                    prompt = f"{facts}\nQuery: What is the value of item 0-{k % 12}?\nAnswer (round {n}):"
                    body = json.dumps({"model": f"{roles[k]}-model", "messages": [{"role": "user", "content": prompt}],
                                       "temperature": 0, "max_tokens": 64, "seed": k}).encode()
                    conn.request("POST", path, body=body, headers=headers)
                    reply = conn.getresponse()
                    reply.read()
                    if reply.status != 200:
                        raise RuntimeError(f"bare HTTP chain: status {reply.status}")
        except BaseException:
            start.abort()  # the other threads and the main one stop at once instead of waiting
            raise

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(width)]
    for t in threads:
        t.start()
    for _ in rounds:
        start.wait()  # a round starts when every request of the one before has its reply
    for t in threads:
        t.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, default=0.2, help="seconds the server takes per request")
    parser.add_argument("--workers", default="1,8,32,128", help="max_concurrency / num_threads values")
    parser.add_argument("--questions", type=int, default=40, help="optimization (and held-out) questions")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument("--minibatch", type=int, default=2)
    parser.add_argument("--runs", default="optimize,compare,dspy-evaluate,dspy-copro,bare", help="which runs")
    parser.add_argument("--dspy-child", choices=("evaluate", "copro"), help=argparse.SUPPRESS)
    parser.add_argument("--bare-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dspy_child:
        dspy_child(args)
        return
    if args.bare_child:
        bare_child(args)
        return

    sys.path.insert(0, str(ROOT / "tests"))  # the loopback fake server the network tests use
    from fault_server import FaultServer

    runs = args.runs.split(",")
    env = {**os.environ, "OPRO_BENCH_KEY": KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="opro-bench-") as tmp, FaultServer(
        key=KEY, latency_s=args.latency, max_requests=10**7, lifetime_s=6 * 3600, keep_alive=True,
        distinct=True,
    ) as server:
        base = Path(tmp)
        write_data(base, 3 + 2 * args.questions)
        env["OPRO_CACHE_DIR"] = str(base / "cache")  # a cold call cache: every run pays for its calls
        opro = [sys.executable, "-c", "from opro.cli import main; main()"]
        for w in (int(x) for x in args.workers.split(",")):
            cfg = _config(base, f"w{w}", server.base_url, w, args)
            if "optimize" in runs or "compare" in runs:
                rows.append(_measure(server, [*opro, "optimize", str(cfg), "--no-progress"],
                                     run="opro optimize", workers=w, env=env))
            if "compare" in runs:
                prompts = [f"text:Answer from the context, variant {i}." for i in range(args.candidates)]
                cmd = [*opro, "compare", str(cfg), "--no-progress", "--no-mlflow",
                       *(x for p in prompts for x in ("-p", p)), "--baseline", "initial"]
                rows.append(_measure(server, cmd, run="opro compare", workers=w, env=env))
            child = [sys.executable, __file__, "--base-url", server.base_url, "--threads", str(w),
                     "--questions", str(args.questions), "--steps", str(args.steps), "--candidates", str(args.candidates)]
            if "dspy-evaluate" in runs:
                rows.append(_measure(server, [*child, "--dspy-child", "evaluate"], run="dspy Evaluate", workers=w, env=env))
            if "dspy-copro" in runs:
                rows.append(_measure(server, [*child, "--dspy-child", "copro"], run="dspy COPRO", workers=w, env=env))
            if "bare" in runs:
                rows.append(_measure(server, [*child, "--bare-child"], run="bare HTTP chain", workers=w, env=env))
    head = ["run", "W", "requests", "window s", "req/s", "W/L", "ratio", "peak", "CPU ms/req", "start s", "end s", ""]
    table = [head, *(r.cells(args.latency) for r in rows)]
    print(f"\nL = {args.latency:g} s; {args.questions} questions; {args.steps} steps x {args.candidates} candidates\n")
    if args.latency > 0:
        for w in sorted({r.workers for r in rows if r.run == "opro optimize"}):
            n = next(r.requests for r in rows if r.run == "opro optimize" and r.workers == w)
            rounds = chain_rounds(questions=args.questions, steps=args.steps, candidates=args.candidates, w=w)
            best = n / (rounds * args.latency)
            print(f"opro optimize at W = {w}: its dependency chain is {rounds} rounds of L, so at most {best:.0f} req/s "
                  f"(ratio {best / (w / args.latency):.2f} of W/L) with a client and a server that cost nothing")
        print()
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for cells in table[1:]:
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
