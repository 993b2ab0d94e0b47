"""Build the Chroma collection, then `opro optimize`, `opro compare` and `opro export --format llamaindex` on the
engine rag.py builds, and load the export back into that engine (docs/pipeline.md).

    PYTHONPATH=$PWD python experiments/chroma_pipeline/run.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "chroma_pipeline.toml"


def opro(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "opro.cli", *args], check=True)


def main() -> None:
    sys.path.insert(0, str(HERE))
    import rag

    rag.index()  # built once, then read from disk
    opro("optimize", str(CONFIG))
    opro("compare", str(CONFIG), "-p", "best")
    out = HERE.parents[1] / "runs" / "chroma_pipeline" / "export"
    opro("export", "best", "--config", str(CONFIG), "--format", "llamaindex", "--out", str(out))

    from opro.experiment import Experiment
    from opro.export.load import load_llamaindex_prompt, load_llamaindex_settings
    from opro.program.rag import TEXT_QA_KEY, chat_client_llm

    exp = Experiment.from_file(CONFIG)
    settings = load_llamaindex_settings(out / "prompt.llamaindex.json")
    engine = rag.build_query_engine(chat_client_llm(exp.client("task")), top_k=int(settings.get("similarity_top_k", 2)))
    engine.update_prompts({TEXT_QA_KEY: load_llamaindex_prompt(out / "prompt.llamaindex.json")})
    print(engine.query("Who designed AlexNet?"))
    exp.close()


if __name__ == "__main__":
    main()
