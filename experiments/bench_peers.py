"""opro against DSPy's COPRO, MIPROv2 and GEPA on the same data, models and budget of calls.

Each method (opro; opro with ``exemplar_strategy = "failures"``; COPRO; MIPROv2, instruction only,
0 demos; GEPA) optimizes the instruction of the same RAG program with the config's task, judge and
optimizer (proposer) models, and may ask for at most ``--budget`` task + judge calls (cache hits
count too); a method that reaches it stops and returns its best-so-far. Then the initial instruction
and every winner are scored by opro's judge on the held-out split and compared with ``opro compare``'s
paired statistics (difference vs the initial instruction, 95% CI, Holm-adjusted p).

Writes to ``<output_dir>/peers/``: ``peers.md`` (the table), ``peers.json``, ``peers.png`` (per-question
held-out scores and paired differences), one MLflow run per row (experiment ``bench_peers``), and
``bench_peers.log``.

    python experiments/bench_peers.py                       # embedded models, budget 12
    python experiments/bench_peers.py --budget 40 --methods opro,gepa
    python experiments/bench_peers.py --config my_endpoint.toml   # any OpenAI-compatible models
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # DSPy imports LiteLLM: stay offline

# peers.py is beside this script (this folder is on sys.path when run as a script).
from peers import METHODS, BudgetedExperiment, PeerSettings, log_to_mlflow, run_peers

from opro.config import load_config
from opro.errors import OproError

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(HERE / "bench_peers.toml"))
    parser.add_argument("--budget", type=int, default=12, help="task + judge calls per method (default 12)")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, from {','.join(METHODS)}")
    parser.add_argument("--threads", type=int, default=1, help="DSPy evaluation threads (default 1)")
    args = parser.parse_args(argv)

    try:
        cfg = load_config(args.config)
    except OproError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = cfg.output_dir / "peers"
    out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=[logging.StreamHandler(sys.stderr), logging.FileHandler(out / "bench_peers.log")],
    )
    for noisy in ("httpx", "LiteLLM", "dspy", "optuna", "mlflow", "bm25s"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    settings = PeerSettings(
        budget=args.budget, methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()),
        num_threads=args.threads,
    )
    started = time.perf_counter()
    exp = BudgetedExperiment(cfg, progress=False)
    try:
        report = run_peers(exp, settings=settings, out_dir=out)
        from opro.heldout.report import plot_comparison

        plot = plot_comparison(report.comparison, out / "peers.png")
        (out / "peers.md").write_text(report.table(), encoding="utf-8")
        data = report.to_dict()
        data["usage"] = exp.usage.as_dict()
        data["wall_s"] = round(time.perf_counter() - started, 1)
        data["models"] = {role: exp.spec(role).safe_dict() for role in ("task", "judge", "optimizer")}
        (out / "peers.json").write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
        params = {"budget": settings.budget, "config": cfg.source, "seed": cfg.experiment.seed}
        for role in ("task", "judge", "optimizer"):
            params[f"models.{role}"] = exp.spec(role).model
        log_to_mlflow(report, tracking_uri=cfg.mlflow_uri, experiment_name="bench_peers", params=params,
                      artifacts=[out / "peers.md", plot])
    finally:
        exp.close()
    print(report.table())
    for r in report.results:
        print(f"{r.method}: {r.calls_used} task+judge calls ({r.calls_by_role}; {r.model_calls} answered by the "
              f"models, the rest by the cache), {r.proposer_calls} proposer calls, "
              f"{r.stopped}, {r.wall_s:.0f} s; instruction: {r.instruction}")
    usage = exp.usage.as_dict()
    real = sum(int(u["calls"]) for u in usage.values())
    hits = sum(int(u["cache_hits"]) for u in usage.values())
    print(f"wall time {time.perf_counter() - started:.0f} s; model calls {real} (cache hits {hits}); files in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
