"""How far an embedded optimization run is from this machine's hardware floor.

    PYTHONPATH=$PWD python experiments/bench_floor.py experiments/quickstart.toml [--batch-width 4]
        [--position before|after] [--prefix-cache-mb 512] [--draft-fill 4] [--out runs/bench_floor] [--rates-only]

Runs ``opro optimize`` on CONFIG in a fresh output directory with its own call cache (so the run is
cold by construction), recording every call of each embedded (llama.cpp) model: the prompt's token
ids (the chat rendered with the GGUF's template, as llama.cpp evaluates it) and the generated
tokens. Then, per model:

- *sent* prompt tokens: what a model without any KV reuse would prefill;
- *unique* prompt tokens: the tokens not already a prefix of an earlier prompt of the same model
  (a prefix tree over the run's prompts): what a perfect prefix cache must still prefill;
- generated tokens, greedy (decodable in a batch) and sampled or constrained (one at a time);
- this machine's rates, measured on the loaded model right after the run: prefill tokens/s
  (a cold ~768-token prompt), decode tokens/s of one sequence and of ``batch_width`` sequences
  decoded together (``generate_many``, the path the engine uses).

floor = unique prefill / prefill rate + greedy decode / batched decode rate + other decode / decode
rate, summed over the models: the time the run's LLM work needs at least on this machine, with
nothing evaluated twice (the run's saved-prefix restores, ``prefix_cache_mb``, are printed beside it:
the prompt tokens a restored KV state spared, and how many restores; and the tokens drafted into
batched decode steps, ``draft_fill``, with those greedy decoding kept). Printed beside the measured wall time (and the time spent inside model
calls), with the ratio. Non-LLM work (PDF, chunking, BM25, Optuna, MLflow, plots) is in the wall time
and not in the floor. The load average before and after is printed: on a shared machine every rate
and time is slower, the ratio less so. A JSON copy goes to ``<out>/floor.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opro.config import load_config
from opro.experiment import Experiment
from opro.llm import ROLES, Completion, GenerationOptions, Message
from opro.llm.llamacpp import LlamaCppLLM

FILLER = (
    "AlexNet is a convolutional neural network designed by Alex Krizhevsky with Ilya Sutskever and "
    "Geoffrey Hinton. It competed in the ImageNet Large Scale Visual Recognition Challenge in 2012 and "
    "achieved a top-5 error of 15.3%, more than 10.8 percentage points lower than the runner up. "
)


@dataclass
class ModelTally:
    """What one model was asked during the run."""

    model: str
    roles: set[str] = field(default_factory=set)
    calls: int = 0
    sent: int = 0
    unique: int = 0
    greedy_decode: int = 0
    other_decode: int = 0
    call_s: float = 0.0
    # The prefix tree of every prompt so far: token -> child node.
    _trie: dict[int, Any] = field(default_factory=dict, repr=False)

    def add(self, tokens: Sequence[int], completion: Completion, *, greedy: bool) -> None:
        node = self._trie
        new = 0
        for token in tokens:
            child = node.get(token)
            if child is None:
                child = node[token] = {}
                new += 1
            node = child
        self.calls += 1
        self.sent += len(tokens)
        self.unique += new
        if greedy:
            self.greedy_decode += completion.completion_tokens
        else:
            self.other_decode += completion.completion_tokens
        self.call_s += completion.latency_s


class Recorder:
    """Wraps the call methods of llama.cpp backends (on the instances) to tally their calls."""

    def __init__(self) -> None:
        self.tallies: dict[int, ModelTally] = {}
        self._lock = threading.Lock()
        self._inside = threading.local()
        #: Off while the rates are measured: those calls are not the run's.
        self.enabled = True

    def attach(self, llm: LlamaCppLLM, role: str) -> None:
        tally = self.tallies.get(id(llm))
        if tally is not None:
            tally.roles.add(role)
            return
        tally = self.tallies[id(llm)] = ModelTally(model=llm.model, roles={role})
        generate, generate_many, choice_logprobs = llm.generate, llm.generate_many, llm.choice_logprobs

        def record(messages: tuple[Message, ...], completion: Completion, *, prefix: str = "", greedy: bool) -> None:
            if not self.enabled:
                return
            tokens = llm.prompt_tokens(messages, prefix=prefix)
            with self._lock:
                tally.add(tokens, completion, greedy=greedy)

        def greedy(options: GenerationOptions) -> bool:
            return options.temperature == 0.0 and options.json_schema is None and not options.top_logprobs

        def recorded_generate(messages: tuple[Message, ...], options: GenerationOptions) -> Completion:
            completion = generate(messages, options)
            if not getattr(self._inside, "many", False):  # generate_many records its own calls
                record(messages, completion, greedy=greedy(options))
            return completion

        def recorded_generate_many(calls: Sequence[tuple[tuple[Message, ...], GenerationOptions]]) -> list[Any]:
            self._inside.many = True
            try:
                results = generate_many(calls)
            finally:
                self._inside.many = False
            for (messages, options), result in zip(calls, results, strict=True):
                if isinstance(result, Completion):
                    record(messages, result, greedy=greedy(options))
            return results

        def recorded_choice_logprobs(messages: tuple[Message, ...], *, prefix: str, choices: tuple[str, ...]) -> Completion:
            completion = choice_logprobs(messages, prefix=prefix, choices=choices)
            record(messages, completion, prefix=prefix, greedy=True)
            return completion

        llm.generate = recorded_generate  # type: ignore[method-assign]
        llm.generate_many = recorded_generate_many  # type: ignore[method-assign]
        llm.choice_logprobs = recorded_choice_logprobs  # type: ignore[method-assign]


@dataclass(frozen=True)
class Rates:
    prefill: float
    decode: float
    decode_batched: float
    width: int


def _best(fn: Callable[[], float], repeats: int) -> float:
    """The best of ``repeats`` measurements: the floor is what the machine can do."""
    return max(fn() for _ in range(repeats))


def measure_rates(llm: LlamaCppLLM, *, repeats: int = 3, prefill_tokens: int = 768, decode_tokens: int = 48) -> Rates:
    """Prefill and decode tokens/s of one loaded model, as the run's calls see them."""
    reuse = llm.kv_reuse

    def prefill() -> float:
        text = FILLER * (prefill_tokens // 60 + 1)
        messages = (Message("user", text),)
        n = len(llm.prompt_tokens(messages, prefix='{"score": '))
        llm.kv_reuse = False  # cold: every token evaluated
        try:
            c = llm.choice_logprobs(messages, prefix='{"score": ', choices=("1",))
        finally:
            llm.kv_reuse = reuse
        return n / c.latency_s

    counting = (Message("user", "Count from 1 to 500, separated by commas, and nothing else."),)
    options = GenerationOptions(max_tokens=decode_tokens)
    llm.generate(counting, options)  # the prompt is now in the KV cache: what follows is decoding

    def decode_one() -> float:
        c = llm.generate(counting, options)
        return c.completion_tokens / c.latency_s

    width = llm.batch_width

    def decode_batched() -> float:
        started = time.perf_counter()
        results = llm.generate_many([(counting, options)] * width)
        wall = time.perf_counter() - started
        return sum(r.completion_tokens for r in results if isinstance(r, Completion)) / wall

    one = _best(decode_one, repeats)
    return Rates(
        prefill=_best(prefill, repeats),
        decode=one,
        decode_batched=_best(decode_batched, repeats) if width > 1 else one,
        width=width,
    )


def _fresh_config(
    path: Path, out: Path, *, batch_width: int | None, position: Any, prefix_cache_mb: int | None, draft_fill: int | None
) -> Any:
    config = load_config(path)
    out.mkdir(parents=True, exist_ok=False)
    experiment = dataclasses.replace(
        config.experiment, output_dir=str(out.resolve()), cache=True, cache_path=str((out / "calls.sqlite").resolve())
    )
    models = config.models
    given = (("batch_width", batch_width), ("prefix_cache_mb", prefix_cache_mb), ("draft_fill", draft_fill))
    overrides = {k: v for k, v in given if v is not None}
    if overrides:
        models = dataclasses.replace(
            models, **{r: dataclasses.replace(getattr(models, r), **overrides) for r in ROLES}
        )
    rag = config.rag if position is None else dataclasses.replace(config.rag, instruction_position=position)
    return dataclasses.replace(config, experiment=experiment, models=models, rag=rag)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", type=Path)
    p.add_argument("--out", type=Path, default=None, help="fresh output directory (default runs/bench_floor/<name>-<time>)")
    p.add_argument("--batch-width", type=int, default=None, help="override [models.*].batch_width")
    p.add_argument("--prefix-cache-mb", type=int, default=None, help="override [models.*].prefix_cache_mb (0: off)")
    p.add_argument("--draft-fill", type=int, default=None, help="override [models.*].draft_fill (0: off)")
    p.add_argument("--position", choices=("before", "after"), default=None, help="override [rag].instruction_position")
    p.add_argument("--repeats", type=int, default=3, help="rate measurements per model (the best is kept)")
    p.add_argument("--rates-only", action="store_true", help="measure the models' rates, run nothing")
    args = p.parse_args()

    name = load_config(args.config).experiment.name
    out = args.out or Path("runs/bench_floor") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    config = _fresh_config(args.config, out, batch_width=args.batch_width, position=args.position,
                           prefix_cache_mb=args.prefix_cache_mb, draft_fill=args.draft_fill)
    load_before = os.getloadavg()
    exp = Experiment(config, progress=False)
    recorder = Recorder()
    for role in ROLES:
        llm = exp.pool.get(exp.spec(role))
        if isinstance(llm, LlamaCppLLM):
            recorder.attach(llm, role)
    wall = 0.0
    summary: dict[str, Any] = {}
    try:
        if not args.rates_only:
            started = time.perf_counter()
            result = exp.optimize()
            wall = time.perf_counter() - started
            summary = {
                "best_instruction": result.best_instruction,
                "best_score": result.best_score,
                "initial_score": result.initial_score,
                "usage": exp.usage.as_dict(),
            }
        load_after = os.getloadavg()
        recorder.enabled = False
        rows = []
        for key, tally in recorder.tallies.items():
            llm = next(m for m in exp.pool.loaded() if id(m) == key)
            assert isinstance(llm, LlamaCppLLM)
            if args.rates_only:
                llm.load()
            elif tally.calls == 0:
                continue
            # Before the rate measurements add any.
            restored = (llm._saved.restored_tokens, llm._saved.hits, llm.drafted, llm.draft_hits)
            rates = measure_rates(llm, repeats=args.repeats)
            floor = (
                tally.unique / rates.prefill
                + tally.greedy_decode / rates.decode_batched
                + tally.other_decode / rates.decode
            )
            rows.append((tally, rates, floor, restored))
    finally:
        exp.close()

    print(f"config {args.config} -> {out}; load average before {load_before[0]:.1f}, after the run {load_after[0]:.1f} "
          f"(2-minute-ish averages; {os.cpu_count()} CPUs)")
    print()
    print("| model (roles) | calls | prompt tokens sent | unique prompt tokens | generated greedy / other | "
          "restored tokens (restores) | drafted / kept | prefill tok/s | decode tok/s (1 / W) | W | floor s | "
          "time in calls s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for tally, rates, floor, (restored, hits, drafted, kept) in rows:
        print(f"| {tally.model} ({', '.join(sorted(tally.roles))}) | {tally.calls} | {tally.sent} | {tally.unique} | "
              f"{tally.greedy_decode} / {tally.other_decode} | {restored} ({hits}) | {drafted} / {kept} | {rates.prefill:.0f} | "
              f"{rates.decode:.1f} / {rates.decode_batched:.1f} | {rates.width} | {floor:.0f} | {tally.call_s:.0f} |")
    total_floor = sum(row[2] for row in rows)
    in_calls = sum(row[0].call_s for row in rows)
    if not args.rates_only:
        print()
        print(f"floor {total_floor:.0f} s; time in model calls {in_calls:.0f} s; wall {wall:.0f} s "
              f"({wall / 60:.1f} min); wall / floor = {wall / total_floor:.2f}; calls / floor = "
              f"{in_calls / total_floor:.2f}" if total_floor else f"wall {wall:.0f} s; no embedded calls")
    record = {
        "config": str(args.config),
        "out": str(out),
        "batch_width": args.batch_width,
        "position": args.position,
        "prefix_cache_mb": args.prefix_cache_mb,
        "draft_fill": args.draft_fill,
        "load_before": load_before,
        "load_after": load_after,
        "wall_s": wall,
        "floor_s": total_floor,
        "in_calls_s": in_calls,
        "models": [
            {
                "model": t.model,
                "roles": sorted(t.roles),
                "calls": t.calls,
                "sent": t.sent,
                "unique": t.unique,
                "greedy_decode": t.greedy_decode,
                "other_decode": t.other_decode,
                "call_s": t.call_s,
                "restored_tokens": restored,
                "restores": hits,
                "drafted": drafted,
                "drafts_kept": kept,
                "rates": dataclasses.asdict(r),
                "floor_s": f,
            }
            for t, r, f, (restored, hits, drafted, kept) in rows
        ],
        "run": summary,
    }
    (out / "floor.json").write_text(json.dumps(record, indent=2, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
