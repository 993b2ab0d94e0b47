"""What pruning saves: the same optimization with and without the Optuna pruner.

Counts LLM *requests* per role (real calls + cache hits), so the numbers do not depend on what the
call cache already holds. Both runs share the golden dataset and the call cache.

    python experiments/bench_pruning.py experiments/quickstart.toml
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from opro.config import load_config
from opro.experiment import Experiment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", type=Path)
    parser.add_argument("--pruners", default="none,best", help="comma-separated pruners to compare")
    parser.add_argument("--margin", type=float, default=None, help="override [optimizer].prune_margin")
    parser.add_argument("--minibatch", type=int, default=None, help="override [optimizer].minibatch_size")
    args = parser.parse_args()
    base = load_config(args.config)
    table = Table(title=f"pruning on {args.config}")
    for col in ("pruner", "candidates", "pruned", "task requests", "judge requests", "best score", "initial", "wall s"):
        table.add_column(col, justify="right")
    for pruner in args.pruners.split(","):
        cfg = dataclasses.replace(
            base,
            optimizer=dataclasses.replace(
                base.optimizer,
                pruner=pruner,  # type: ignore[arg-type]
                prune_margin=base.optimizer.prune_margin if args.margin is None else args.margin,
                minibatch_size=base.optimizer.minibatch_size if args.minibatch is None else args.minibatch,
            ),
            experiment=dataclasses.replace(base.experiment, output_dir=f"{base.experiment.output_dir}-prune-{pruner}"),
        )
        exp = Experiment(cfg)
        # Reuse the base experiment's golden dataset so both runs score the same questions.
        base_dataset = base.output_dir / "dataset"
        if base_dataset.exists() and not (cfg.output_dir / "dataset").exists():
            import shutil

            shutil.copytree(base_dataset, cfg.output_dir / "dataset")
        started = time.perf_counter()
        result = exp.optimize()
        wall = time.perf_counter() - started
        usage = exp.usage.snapshot()
        exp.close()
        req = {role: u.calls + u.cache_hits for role, u in usage.items()}
        table.add_row(
            pruner,
            str(len(result.history)),
            str(sum(1 for r in result.history if r.status == "pruned")),
            str(req.get("task", 0)),
            str(req.get("judge", 0)),
            f"{result.best_score:.3f}",
            f"{result.initial_score:.3f}" if result.initial_score is not None else "n/a",
            f"{wall:.0f}",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
