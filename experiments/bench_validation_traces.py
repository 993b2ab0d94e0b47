"""Are a validation stage's MLflow traces complete and the same in identical runs? (issue 49, item 5)

Runs ``opro optimize`` as real processes (sidecar on, ``[tracking].genai = true``) on scripted models
whose judge keeps the finalist only slightly ahead (ahead on every ``--ahead-every``-th confirmation
question, tied on the others), so the validation goes through its looks: with ``--validation 48`` the
finalist answers 48 questions and the initial instruction 44, the sizes the fault harness measured.
Prints, per run, each validation evaluation run's questions and traces, and the traces of the
experiment (those in no run included).

    python experiments/bench_validation_traces.py --runs 5 --validation 48 --ahead-every 10
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

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "experiments")]

from children import argv  # noqa: E402  (tests/ is on sys.path as a script)
from fakes import COMPARE_DOC, experiment_config, mlflow_client, scripted_pool, write_toml  # noqa: E402


def world(folder: Path, *, validation: int, unused: int, ahead_every: int) -> Path:
    """The experiment's config in ``folder`` and its ``tied.txt`` (the confirmation questions it is tied on)."""
    from opro.experiment import Experiment

    split = {"exemplar": 2, "optimization": 3, "validation": validation, "heldout": 4, "seed": 1}
    cfg = experiment_config(folder, questions=9 + validation + unused, doc=COMPARE_DOC,
                            data={"dataset": "qa.jsonl", "split": split},
                            experiment={"name": "t", "output_dir": "out", "progress": False},
                            models={"task": {"backend": "scripted", "model": "task"}}, optimizer={"steps": 1},
                            tracking={"prompt_name": "qa-t", "genai": True, "sidecar": True})
    path = write_toml(cfg, folder / "t.toml")
    exp = Experiment.from_file(path, pool=scripted_pool(), progress=False)
    try:
        confirmation = [e.query for e in exp.dataset.examples_in("validation")][4:]
    finally:
        exp.close()
    (folder / "tied.txt").write_text("".join(f"{q}\n" for i, q in enumerate(confirmation) if i % ahead_every != 1))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--validation", type=int, default=48)
    parser.add_argument("--unused", type=int, default=0, help="questions in no split (the extension's pool)")
    parser.add_argument("--ahead-every", type=int, default=10)
    args = parser.parse_args()
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            folder = Path(tmp) / f"run{i}"
            folder.mkdir()
            config = world(folder, validation=args.validation, unused=args.unused, ahead_every=args.ahead_every)
            started = time.perf_counter()
            done = subprocess.run(argv("cli_on_close_call_models", str(folder / "tied.txt"), "optimize", str(config),
                                       "--no-progress"), capture_output=True, text=True, env=env, timeout=1800)
            wall = time.perf_counter() - started
            client = mlflow_client(config)
            exp_id = client.get_experiment_by_name("t").experiment_id
            runs = client.search_runs([exp_id], filter_string="tags.`opro.source` = 'validation'")
            traced = {r.data.tags["opro.prompt_label"]: (
                int(r.data.params.get("n_questions", -1)),
                len(client.search_traces(locations=[exp_id], run_id=r.info.run_id, max_results=1000)))
                for r in runs}
            every = len(client.search_traces(locations=[exp_id], max_results=5000))
            looks = [x["n"] for x in json.loads((folder / "out" / "summary.json").read_text())["validation"]["looks"]] \
                if done.returncode == 0 else []
            print(f"run {i}: rc {done.returncode}, {wall:.0f} s, looks at {looks}; (questions, traces) per prompt "
                  f"{dict(sorted(traced.items()))}; traces in the experiment {every}", flush=True)
            if done.returncode:
                print(done.stderr[-2000:], file=sys.stderr)


if __name__ == "__main__":
    main()
