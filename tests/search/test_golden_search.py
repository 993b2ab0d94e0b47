"""A fixed-seed scripted search leaves byte-identical records across refactors of the search.

The golden files in ``tests/data/golden_search/`` were written by the code before the search moved
into ``opro/search/`` (``OPRO_WRITE_GOLDEN=1 pytest tests/search/test_golden_search.py`` rewrites them,
which only a change of behaviour that is meant may do). The world has headroom (keywords in the
instruction raise the judge's score, question by question with noise), so the run proposes, races,
prunes, picks exemplars and validates finalists: every part of the search shows in its records.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from fakes import experiment_config, write_toml
from fault_server import instruction_of

from opro.experiment import Experiment
from opro.llm import GenerationOptions, Message
from opro.llm.pool import ModelPool
from opro.llm.scripted import ScriptedLLM

GOLDEN = Path(__file__).parents[1] / "data" / "golden_search"
WORDS = ("context", "precise", "cite", "brief", "names", "numbers")


def _noise(*parts: object) -> int:
    return int(hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:8], 16)


def _task(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    prompt = messages[-1].content.lower()
    query = re.search(r"fact number (\d+)", prompt)
    held = [w for w in WORDS if w in instruction_of(messages[-1].content).lower()]
    return f"Answer {query.group(1) if query else '?'} ({', '.join(held) or 'plain'})."


def _judge(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    text = messages[-1].content.lower()
    answer = re.findall(r"answer \d+ \([^)]*\)", text)
    answer = answer[-1] if answer else ""
    held = sum(1 for w in WORDS[:4] if w in answer)
    score = max(1, min(5, 1 + held + _noise(answer) % 3 - 1))
    return json.dumps({"score": score, "reasoning": f"{held} keyword(s)"})


def _optimizer(messages: tuple[Message, ...], options: GenerationOptions) -> str:
    i = (options.seed or 0) % 1000
    picks = [WORDS[(i + j * 5) % len(WORDS)] for j in range(1 + _noise(i, "n") % 3)]
    return "<INS>Answer well; be " + ", ".join(picks) + f" (v{i}).</INS>"


def _run(tmp_path: Path) -> Path:
    cfg = experiment_config(
        tmp_path,
        data={"split": {"exemplar": 3, "optimization": 6, "validation": 8, "heldout": 3, "seed": 3}},
        optimizer={"steps": 3, "candidates_per_step": 3, "minibatch_size": 2, "pruner": "race",
                   "finalists": 2, "exemplars": 2, "alpha": 0.2},
    )
    path = write_toml(cfg, tmp_path / "golden.toml")
    pool = ModelPool(scripted={
        "task": ScriptedLLM(default=_task, model="task"),
        "judge": ScriptedLLM(default=_judge, model="judge"),
        "optimizer": ScriptedLLM(default=_optimizer, model="optimizer"),
    })
    exp = Experiment.from_file(path, pool=pool, progress=False)
    try:
        exp.optimize()
    finally:
        exp.close()
    return tmp_path / "out"


def _records(out: Path) -> dict[str, str]:
    """The search's records, less what measures time or the machine (and the judge-noise note, which
    names the config's path, and the noise digest, which follows the fingerprint's entries)."""
    files = {"history.jsonl": (out / "history.jsonl").read_text(encoding="utf-8"),
             "best_prompt.txt": (out / "best_prompt.txt").read_text(encoding="utf-8")}
    for meta in sorted((out / "metaprompts").iterdir()):
        files[f"metaprompts/{meta.name}"] = meta.read_text(encoding="utf-8")
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    for key in ("wall_s", "usage", "mlflow_run_id", "split_record", "judge_noise", "noise_digest"):
        summary.pop(key, None)
    files["summary.json"] = json.dumps(summary, indent=2, sort_keys=True) + "\n"
    return files


def test_a_fixed_seed_scripted_search_leaves_the_golden_records(tmp_path: Path) -> None:
    got = _records(_run(tmp_path))
    if os.environ.get("OPRO_WRITE_GOLDEN"):
        for name, text in got.items():
            (GOLDEN / name).parent.mkdir(parents=True, exist_ok=True)
            (GOLDEN / name).write_text(text, encoding="utf-8")
    want = {str(p.relative_to(GOLDEN)): p.read_text(encoding="utf-8") for p in sorted(GOLDEN.rglob("*")) if p.is_file()}
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], f"{name} differs from the golden record"
    history = [json.loads(line) for line in want["history.jsonl"].splitlines()]
    # The world exercises the search: several steps, a pruned candidate, finalists validated.
    assert {r["step"] for r in history} == {0, 1, 2, 3}
    assert any(r["status"] == "pruned" for r in history)
    assert json.loads(want["summary.json"])["validation"]["finalists"]
