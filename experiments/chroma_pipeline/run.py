"""Build the Chroma collection, then `opro optimize`, `opro compare` and `opro export --format llamaindex` on the
engine rag.py builds, and load the export back into that engine (docs/pipeline.md). Each step's time is printed.

    PYTHONPATH=$PWD python experiments/chroma_pipeline/run.py           # the whole PDF, chroma_pipeline.toml
    PYTHONPATH=$PWD python experiments/chroma_pipeline/run.py --quick   # 5 pages, 16 questions, the 0.5B model
                                                                        # in every role: chroma_pipeline_quick.toml

The collection is built on the first run only; later runs read it from disk (run.py says which), and the call
cache makes a rerun's optimize and compare answer from it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def step(name: str, started: float) -> None:
    print(f"[run.py] {name}: {time.perf_counter() - started:.0f} s", flush=True)


def opro(*args: str) -> None:
    """Run one opro command; where it fails, stop with its exit code (its own message is above, no traceback)."""
    started = time.perf_counter()
    code = subprocess.run([sys.executable, "-m", "opro.cli", *args], check=False).returncode
    if code != 0:
        print(f"[run.py] opro {args[0]} failed (exit {code}): its message is above; later steps not run", flush=True)
        raise SystemExit(code)
    step(f"opro {args[0]}", started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the first pages and their questions only")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    import rag

    config = HERE / ("chroma_pipeline_quick.toml" if args.quick else "chroma_pipeline.toml")
    build = rag.build_quick_query_engine if args.quick else rag.build_query_engine
    started = time.perf_counter()
    if args.quick:
        rag.quick_dataset()  # the questions of those pages, which the config names
    rag.index(rag.QUICK_PAGES if args.quick else None)  # built once, then read from disk
    step("collection", started)
    opro("optimize", str(config), "--no-progress")
    opro("compare", str(config), "-p", "best")
    out = ROOT / "runs" / config.stem / "export"
    opro("export", "best", "--config", str(config), "--format", "llamaindex", "--out", str(out))

    from opro.experiment import Experiment
    from opro.export.load import load_llamaindex_prompt, load_llamaindex_settings
    from opro.program.rag import TEXT_QA_KEY, chat_client_llm

    started = time.perf_counter()
    exp = Experiment.from_file(config)
    settings = load_llamaindex_settings(out / "prompt.llamaindex.json")  # empty where it keeps the config's
    top_k = int(settings.get("similarity_top_k", exp.config.rag.top_k))
    llm = chat_client_llm(exp.client("task"), max_tokens=int(settings.get("max_tokens", exp.config.rag.answer_max_tokens)))
    engine = build(llm, top_k=top_k)
    engine.update_prompts({TEXT_QA_KEY: load_llamaindex_prompt(out / "prompt.llamaindex.json")})
    question = "Who designed AlexNet?"
    print(f"the exported prompt loaded back into {build.__name__} (similarity_top_k {top_k}): {question} -> "
          f"{str(engine.query(question)).strip()!r}", flush=True)
    step("export loaded back and queried", started)
    exp.close()


if __name__ == "__main__":
    main()
