"""The walkthrough notebook runs end to end at tiny size on the embedded models, so it cannot rot."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from fakes import require_embedded

NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "opro_walkthrough.ipynb"


def _require_embedded_task_model() -> None:
    require_embedded("qwen2.5-coder-0.5b-instruct")


@pytest.mark.embedded
def test_walkthrough_notebook_runs_at_tiny_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _require_embedded_task_model()
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")

    # A kernelspec for *this* interpreter (the project venv), found through JUPYTER_PATH only.
    spec_dir = tmp_path / "jupyter" / "kernels" / "opro-test"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(
        json.dumps(
            {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
             "display_name": "opro test", "language": "python"}
        )
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("OPRO_NOTEBOOK_TINY", "1")
    monkeypatch.setenv("OPRO_NOTEBOOK_OUT", str(tmp_path / "out"))
    monkeypatch.setenv("OPRO_CACHE_DIR", str(tmp_path / "cache"))  # real calls, not a warm cache
    monkeypatch.setenv("MPLBACKEND", "Agg")

    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, kernel_name="opro-test", timeout=600, resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    started = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - started

    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["best_instruction"]
    reports = list((out / "compare" / "notebook").glob("report.json"))
    assert reports, "the comparison wrote no report"
    report = json.loads(reports[0].read_text())
    assert report["split"] == "heldout" and report["leakage_checked"]
    assert [p["spec"] for p in report["prompts"]] == ["initial", "best"]
    assert (out / "export" / "prompt.llamaindex.json").is_file() and (out / "export" / "prompt.dspy.json").is_file()
    outputs = "".join(
        o.get("text", "") for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
    )
    assert "registered prompts:/notebook-qa/" in outputs
    print(f"notebook executed in {elapsed:.0f}s")
