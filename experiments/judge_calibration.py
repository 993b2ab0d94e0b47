"""Judge calibration on the shared AlexNet dataset: does the embedded judge separate right from wrong?

For N seeded questions the judge scores
  (a) the reference answers themselves (should score high),
  (b) deliberately wrong answers: the reference answer of another question (should score low),
  (c) the embedded task model's answers through a BM25 RAG program (somewhere in between),
for each judge template and output variant. Per template it prints mean, distribution, invalid
count, separation mean(a) - mean(b), AUC of (a) vs (b) (probability a reference answer outscores
a wrong one, ties count half) and time per uncached judge call; it saves a plot of the score
distributions and a CSV of every verdict.

    .venv/bin/python experiments/judge_calibration.py --n 12 --templates llamaindex,prometheus,fewshot \\
        --cache /tmp/opro_calibration_cache.sqlite --out /tmp/judge_calibration

Calls go through a CallCache, so a rerun with the same settings is free.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from opro.cache import CallCache
from opro.judges import CorrectnessJudge
from opro.llm import ChatClient, UsageLedger
from opro.progress import progress_bar

DATA = Path(__file__).resolve().parents[1].parent / "shared/data/history_of_alexnet"
VARIANTS = {
    # name: (structured, reasoning_first)
    "json-score-first": (True, False),
    "json-reasoning-first": (True, True),
    "text": (False, False),
}
CONDITIONS = ("reference", "wrong", "task")


@dataclass(frozen=True)
class Verdict:
    template: str
    variant: str
    condition: str
    query: str
    answer: str
    score: float | None
    invalid_reason: str | None
    latency_s: float
    cached: bool
    completion_tokens: int


def auc(pos: list[float], neg: list[float]) -> float | None:
    """P(pos > neg) + 0.5 P(tie): the Mann-Whitney AUC."""
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def load_examples(path: Path, *, n: int, seed: int) -> list[dict[str, str]]:
    data = json.loads(path.read_text(encoding="utf-8"))["examples"]
    rng = random.Random(seed)
    picked = rng.sample(range(len(data)), k=min(n, len(data)))
    return [{"query": data[i]["query"], "reference": data[i]["reference_answer"]} for i in picked]


def task_answers(examples: list[dict[str, str]], *, cache: CallCache, n_threads: int | None) -> list[str]:
    from opro.documents import load_documents
    from opro.llamacpp_backend import LlamaCppLLM
    from opro.prompts import QATemplate
    from opro.rag import RAGProgram
    from opro.retrieval import build_retriever

    docs = load_documents(DATA / "source_files").documents
    retriever = build_retriever(
        documents=docs, kind="bm25", chunk_size=512, chunk_overlap=64, top_k=2, progress=False
    )
    task = LlamaCppLLM(model_path="qwen2.5-coder-0.5b-instruct", n_threads=n_threads)
    program = RAGProgram(retriever=retriever, llm=ChatClient(task, role="task", cache=cache), max_tokens=256)
    answers = [
        a.text
        for a in program.answer_many([e["query"] for e in examples], template=QATemplate(), progress=True)
    ]
    task.close()
    return answers


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20, help="questions (default 20)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--templates", default="llamaindex,prometheus,fewshot")
    ap.add_argument("--variants", default="json-score-first", help=f"comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--conditions", default=",".join(CONDITIONS), help="comma list of reference,wrong,task")
    ap.add_argument("--judge-model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--n-threads", type=int, default=None)
    ap.add_argument("--cache", default="/tmp/opro_calibration_cache.sqlite")
    ap.add_argument("--out", default="/tmp/judge_calibration")
    args = ap.parse_args(argv)

    dataset = DATA / "rag_dataset.json"
    if not dataset.is_file():
        print(f"shared dataset not found at {dataset}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = CallCache(args.cache)
    examples = load_examples(dataset, n=args.n, seed=args.seed)
    conditions = [c for c in args.conditions.split(",") if c]
    # (b): the next question's reference answer (a cyclic shift is a derangement for n >= 2).
    answers: dict[str, list[str]] = {
        "reference": [e["reference"] for e in examples],
        "wrong": [examples[(i + 1) % len(examples)]["reference"] for i in range(len(examples))],
    }
    if "task" in conditions:
        answers["task"] = task_answers(examples, cache=cache, n_threads=args.n_threads)

    from opro.llamacpp_backend import LlamaCppLLM

    judge_llm = LlamaCppLLM(model_path=args.judge_model, n_threads=args.n_threads)
    verdicts: list[Verdict] = []
    for template in args.templates.split(","):
        for variant in args.variants.split(","):
            structured, reasoning_first = VARIANTS[variant]
            client = ChatClient(judge_llm, role="judge", cache=cache, usage=UsageLedger())
            judge = CorrectnessJudge(
                client,
                template=template,
                structured=structured,
                reasoning_first=reasoning_first,
                max_tokens=args.max_tokens,
            )
            total = len(examples) * len(conditions)
            with progress_bar(f"{template}/{variant}", total=total) as bar:
                for condition in conditions:
                    for ex, answer in zip(examples, answers[condition], strict=True):
                        started = time.perf_counter()
                        result, completion = judge.evaluate_with_completion(
                            query=ex["query"], answer=answer, reference=ex["reference"]
                        )
                        verdicts.append(
                            Verdict(
                                template=template,
                                variant=variant,
                                condition=condition,
                                query=ex["query"],
                                answer=answer,
                                score=result.score,
                                invalid_reason=result.invalid_reason,
                                latency_s=completion.latency_s
                                if completion
                                else time.perf_counter() - started,
                                cached=bool(completion and completion.cached),
                                completion_tokens=completion.completion_tokens if completion else 0,
                            )
                        )
                        bar.advance()
    judge_llm.close()

    report(verdicts, conditions, out=out, n=len(examples))
    return 0


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def report(verdicts: list[Verdict], conditions: list[str], *, out: Path, n: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    console = Console(width=150)
    groups = sorted({(v.template, v.variant) for v in verdicts}, key=lambda g: (g[0], g[1]))
    table = Table(title=f"Embedded judge calibration (n={n} questions per condition)")
    for col in (
        "template",
        "variant",
        "condition",
        "mean",
        "dist 1/2/3/4/5",
        "invalid",
        "sep a-b",
        "AUC a vs b",
        "s/call",
        "tok/call",
    ):
        table.add_column(col)
    summary: list[dict[str, object]] = []
    for template, variant in groups:
        rows = [v for v in verdicts if v.template == template and v.variant == variant]
        by = {c: [v.score for v in rows if v.condition == c and v.score is not None] for c in conditions}
        mean = {c: (statistics.fmean(s) if s else None) for c, s in by.items()}
        sep = (
            mean["reference"] - mean["wrong"]
            if mean.get("reference") is not None and mean.get("wrong") is not None
            else None
        )
        area = auc(by.get("reference", []), by.get("wrong", []))
        for i, c in enumerate(conditions):
            sub = [v for v in rows if v.condition == c]
            dist = Counter(int(s + 0.5) for s in by[c])
            lat = [v.latency_s for v in sub if not v.cached]
            lat_all = [v.latency_s for v in sub]
            table.add_row(
                template if i == 0 else "",
                variant if i == 0 else "",
                c,
                _fmt(mean[c]),
                "/".join(str(dist.get(k, 0)) for k in range(1, 6)),
                str(sum(1 for v in sub if v.score is None)),
                _fmt(sep) if i == 0 else "",
                _fmt(area) if i == 0 else "",
                _fmt(statistics.fmean(lat) if lat else (statistics.fmean(lat_all) if lat_all else None)),
                f"{statistics.fmean(v.completion_tokens for v in sub):.0f}" if sub else "-",
            )
            summary.append(
                {
                    "template": template,
                    "variant": variant,
                    "condition": c,
                    "mean": mean[c],
                    "distribution": {k: dist.get(k, 0) for k in range(1, 6)},
                    "invalid": sum(1 for v in sub if v.score is None),
                    "separation": sep,
                    "auc": area,
                    "s_per_call": statistics.fmean(lat_all) if lat_all else None,
                }
            )
    console.print(table)
    invalid = [v for v in verdicts if v.score is None]
    for v in invalid[:5]:
        console.print(f"[yellow]invalid[/] {v.template}/{v.variant}/{v.condition}: {v.invalid_reason}")

    (out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    with (out / "verdicts.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(
            [
                "template",
                "variant",
                "condition",
                "query",
                "score",
                "invalid_reason",
                "latency_s",
                "cached",
                "answer",
            ]
        )
        for v in verdicts:
            writer.writerow(
                [
                    v.template,
                    v.variant,
                    v.condition,
                    v.query,
                    v.score,
                    v.invalid_reason,
                    f"{v.latency_s:.2f}",
                    v.cached,
                    v.answer,
                ]
            )
    plot(verdicts, groups, conditions, out / "score_distributions.png")
    console.print(f"wrote {out / 'summary.json'}, {out / 'verdicts.csv'}, {out / 'score_distributions.png'}")


def plot(verdicts: list[Verdict], groups: list[tuple[str, str]], conditions: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.4), squeeze=False, sharey=True)
    width = 0.8 / max(1, len(conditions))
    for ax, (template, variant) in zip(axes[0], groups, strict=True):
        for j, c in enumerate(conditions):
            scores = [
                int(v.score + 0.5)
                for v in verdicts
                if (v.template, v.variant, v.condition) == (template, variant, c) and v.score is not None
            ]
            counts = Counter(scores)
            xs = [k + (j - (len(conditions) - 1) / 2) * width for k in range(1, 6)]
            ax.bar(xs, [counts.get(k, 0) for k in range(1, 6)], width=width, label=c)
        ax.set_title(f"{template}\n{variant}", fontsize=9)
        ax.set_xticks(range(1, 6))
        ax.set_xlabel("judge score")
    axes[0][0].set_ylabel("answers")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
