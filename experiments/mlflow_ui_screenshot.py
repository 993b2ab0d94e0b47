"""Open MLflow's evaluation-run comparison of an `opro compare` in headless Chromium; check it; screenshot it.

Finds the comparison's evaluation runs (one per prompt, tagged ``opro.comparison``) in the config's
MLflow store, starts ``opro ui`` on that store, renders the comparison page of the first compared
prompt against the baseline, checks that every compared question and the judge's assessment column
are on the page, and writes a small PNG (for docs/).

    python experiments/mlflow_ui_screenshot.py experiments/quickstart.toml --comparison NAME \\
        --out docs/mlflow_evaluation_runs.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

from uicheck import check_evaluation_ui  # this folder is on sys.path when run as a script

from opro.config import load_config
from opro.tracking.genai import GenAILogger


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", type=Path)
    parser.add_argument("--comparison", required=True, help="the --name of the `opro compare` run")
    parser.add_argument("--out", type=Path, default=Path("docs/mlflow_evaluation_runs.png"))
    parser.add_argument("--size", default="2400x1000", help="window size WIDTHxHEIGHT (wide: the assessment columns show)")
    parser.add_argument("--colors", type=int, default=96, help="PNG palette size (smaller file)")
    args = parser.parse_args()
    cfg = load_config(args.config)
    log = GenAILogger(tracking_uri=cfg.mlflow_uri, experiment_name=cfg.tracking.mlflow_experiment or cfg.experiment.name,
                      dataset_prefix=cfg.experiment.name)
    runs = log.client.search_runs(
        [log.experiment_id], filter_string=f"tags.`opro.comparison` = '{args.comparison}'", order_by=["start_time ASC"]
    )
    baseline = [r for r in runs if r.data.tags.get("opro.role") == "baseline"]
    others = [r for r in runs if r.data.tags.get("opro.role") == "compared"]
    if not baseline or not others:
        raise SystemExit(f"no evaluation runs of comparison {args.comparison!r} in {cfg.mlflow_uri}")
    run, base = others[0], baseline[0]
    traces = log.client.search_traces(locations=[log.experiment_id], run_id=run.info.run_id, max_results=500)
    roots = [s for t in traces for s in t.data.spans if s.parent_id is None]
    questions = sorted({str((s.inputs or {}).get("question", "")) for s in roots} - {""})
    width, height = (int(x) for x in args.size.split("x"))
    shot = args.out.with_suffix(".raw.png")
    check = check_evaluation_ui(
        tracking_uri=cfg.mlflow_uri, experiment_id=log.experiment_id, run_id=run.info.run_id,
        compare_to=base.info.run_id, expect=[*questions, "correctness"], screenshot_path=shot,
        screenshot_size=(width, height),
    )
    cells = check.dom.count("correctness_assessment_column")
    print(f"{check.url}\nquestions on the page: {len(check.found) - ('correctness' in check.found)}/{len(questions)}; "
          f"judge assessment cells: {cells}; missing: {list(check.missing) or 'none'}")
    from PIL import Image

    with Image.open(shot) as img:
        img.convert("RGB").quantize(colors=args.colors).save(args.out, optimize=True)
    shot.unlink()
    print(f"screenshot: {args.out} ({args.out.stat().st_size / 1000:.0f} kB)")
    if not check.ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
