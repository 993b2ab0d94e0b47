"""llama.cpp threads and buffer types on this machine, idle and with cores kept busy by other processes.

For each number of busy cores (another process spinning on each), each thread setting (a number, or
``auto``: opro's default, chosen at every call from the free usable cores) and each extra-buffers mode,
a fresh model answers through opro's backend:

- prefill: a new prompt of about ``--prompt-tokens`` tokens, one token generated (tokens/s of prompt);
- decode: the same prompt again (its prefix is kept), ``--decode-tokens`` generated (tokens/s).

Each figure is the median of ``--repeats``. "x best" is the setting's time over the best setting's
time in the same situation (prefill + decode of one prompt). Usage (about 6 minutes on 2 cores)::

    PYTHONPATH=$PWD python experiments/bench_threads.py
    PYTHONPATH=$PWD python experiments/bench_threads.py --model qwen2.5-coder-1.5b-instruct --busy 0,1
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time

from opro.llm import GenerationOptions, Message
from opro.llm.cpu import CpuShare, cpu_info, usable_cores
from opro.llm.llamacpp import LlamaCppLLM
from opro.llm.packs import EMBEDDED_TASK_MODEL

WORDS = ["river", "town", "mile", "bridge", "stone", "market", "north", "valley", "harbour", "mill", "road", "church", "field", "forest"]


def _prompt(i: int, n_words: int) -> tuple[Message, ...]:
    rng = random.Random(i)
    text = " ".join(rng.choice(WORDS) for _ in range(n_words))
    return (
        Message("system", f"Note {i}. Follow the instruction."),
        Message("user", f"{text}\nWrite the numbers from 1 to 300, separated by spaces."),
    )


def measure(llm: LlamaCppLLM, *, prompt_words: int, decode_tokens: int, repeats: int, offset: int) -> tuple[float, float, float, int]:
    """(prefill tok/s, decode tok/s, seconds per prompt, threads used) medians over ``repeats``."""
    prefill, decode, total = [], [], []
    for r in range(repeats):
        messages = _prompt(offset + r, prompt_words)
        first = llm.generate(messages, GenerationOptions(temperature=0.0, max_tokens=1))
        second = llm.generate(messages, GenerationOptions(temperature=0.0, max_tokens=decode_tokens))
        prefill.append(first.prompt_tokens / first.latency_s)
        decode.append(max(1, second.completion_tokens - 1) / second.latency_s)
        total.append(first.latency_s + second.latency_s)
    return statistics.median(prefill), statistics.median(decode), statistics.median(total), llm.threads_now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=EMBEDDED_TASK_MODEL)
    parser.add_argument("--threads", default="auto,1,2", help="comma-separated: numbers or auto")
    parser.add_argument("--busy", default="0,1", help="comma-separated numbers of cores kept busy")
    parser.add_argument("--extra-buffers", default="on,off")
    parser.add_argument("--prompt-words", type=int, default=200, help="about 1.2 tokens a word")
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    info, usable = cpu_info(), usable_cores()
    print(f"CPU: {info.model} [{' '.join(info.features)}]; {usable.why()}; model {args.model}")
    print()
    print("| busy cores | n_threads | extra buffers | prefill tok/s | decode tok/s | s per prompt | x best |")
    print("|---|---|---|---|---|---|---|")
    offset = 0
    for busy in [int(b) for b in args.busy.split(",")]:
        spinners = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL) for _ in range(busy)
        ]
        try:
            time.sleep(2.0 if busy else 0.0)
            rows = []
            for mode in args.extra_buffers.split(","):
                for setting in args.threads.split(","):
                    n = None if setting == "auto" else int(setting)
                    llm = LlamaCppLLM(
                        model_path=args.model, n_threads=n, extra_buffers=mode, prefix_cache_mb=0, n_ctx=2048,
                        cpu=CpuShare(),
                    )
                    measure(llm, prompt_words=40, decode_tokens=4, repeats=1, offset=10_000 + offset)  # load, warm
                    got = measure(
                        llm, prompt_words=args.prompt_words, decode_tokens=args.decode_tokens, repeats=args.repeats,
                        offset=offset,
                    )
                    offset += args.repeats
                    llm.close()
                    label = f"auto ({got[3]})" if n is None else str(n)
                    rows.append((label, mode, *got))
            best = min(r[4] for r in rows)
            for label, mode, pre, dec, secs, _ in rows:
                print(f"| {busy} | {label} | {mode} | {pre:.0f} | {dec:.1f} | {secs:.2f} | {secs / best:.2f} |", flush=True)
        finally:
            for p in spinners:
                p.kill()
                p.wait()
    print()
    print(f"python {sys.version.split()[0]}, pid {os.getpid()}")


if __name__ == "__main__":
    main()
