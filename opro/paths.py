"""Where opro keeps per-user files: what may be deleted to free space (the cache: assembled models, the
LLM call cache, built indexes) apart from what must outlive it (the data folder: the decision ledger).

The run directory (``[experiment].output_dir``): :class:`RunDir`, the one place that knows its layout.

Everything an optimization, a comparison, an evaluation, a calibration or an export leaves in the
output folder is named here, and the files other commands read back (the summary, the split record,
the saved dataset, the newest comparison reports) are read here::

    OUTPUT_DIR/
      summary.json  history.jsonl  best_prompt.txt      what `opro optimize` returned
      plan.json                                         what it planned to ask (`opro plan`)
      score_trajectory.png  optimism.png  pareto.png    its plots (pareto.png: cost objective)
      metaprompts/step_NNN.txt                          every meta-prompt sent to the optimizer
      split_record.json                                 the split the search saw (held-out guard)
      dataset/                                          the split golden dataset every command uses
      compare/NAME/   evaluate/   export/              later commands' outputs
      judge_calibration.json  judge_calibration/        `opro judge calibrate`
      probe.json  probe.md                              `opro probe` (read back by `opro plan --probe`
                                                        and `opro optimize`)
      probe_calls.json                                  the keys of the calls it made (`opro optimize`
                                                        counts those it found in the call cache)
      promotions.json                                   this folder's `compare --promote` attempts (the
                                                        budget is kept in the user's decision ledger:
                                                        opro.search.ledger)
      validation_rows/                                  each validation prompt's answers, until MLflow has them
      task_rates.json                                   the task models' seconds per token (several models)
      .opro.lock  .opro-worker-I.lock                   one process per folder (and worker)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opro.errors import DataError


def cache_dir() -> Path:
    """``$OPRO_CACHE_DIR``, else ``$XDG_CACHE_HOME/opro``, else ``~/.cache/opro``."""
    explicit = os.environ.get("OPRO_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "opro"


def data_dir() -> Path:
    """``$OPRO_DATA_DIR``, else the platform's user data folder (``$XDG_DATA_HOME/opro``, by default
    ``~/.local/share/opro`` on Linux; ``~/Library/Application Support/opro`` on macOS). Users clear
    caches to free space; the decisions kept here are never a cache (deleting them would let the same
    questions decide again)."""
    explicit = os.environ.get("OPRO_DATA_DIR")
    if explicit:
        return Path(explicit).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("opro", appauthor=False))


def default_call_cache_path() -> Path:
    return cache_dir() / "llm_calls.sqlite"

SUMMARY_FILE = "summary.json"
HISTORY_FILE = "history.jsonl"
BEST_PROMPT_FILE = "best_prompt.txt"
PLAN_FILE = "plan.json"
TRAJECTORY_PLOT = "score_trajectory.png"
OPTIMISM_PLOT = "optimism.png"
PARETO_PLOT = "pareto.png"
METAPROMPTS_DIR = "metaprompts"
SPLIT_RECORD_FILE = "split_record.json"
DATASET_DIR = "dataset"
COMPARE_DIR = "compare"
EVALUATE_DIR = "evaluate"
EXPORT_DIR = "export"
CALIBRATION_FILE = "judge_calibration.json"
CALIBRATION_DIR = "judge_calibration"
PROMOTIONS_FILE = "promotions.json"
#: Each task model's seconds per token, as this folder's first command measured them (opro.llm.speed).
TASK_RATES_FILE = "task_rates.json"
PROBE_FILE = "probe.json"
PROBE_REPORT = "probe.md"
PROBE_CALLS = "probe_calls.json"
VALIDATION_ROWS_DIR = "validation_rows"

#: What `opro optimize` writes at the top of the folder, in the order it is listed and logged.
OPTIMIZE_OUTPUTS = (BEST_PROMPT_FILE, HISTORY_FILE, SUMMARY_FILE, TRAJECTORY_PLOT, OPTIMISM_PLOT, PARETO_PLOT)


def _writable(path: Path) -> bool:
    """Whether opro may write ``path``: this user may (``os.access``), and its mode grants some write bit
    (root may write anywhere, but a folder whose owner took its write bits away is not opro's to change)."""
    return os.access(path, os.W_OK) and bool(path.stat().st_mode & 0o222)


def unwritable(path: Path, *, folder: bool) -> str | None:
    """Why ``path`` (a folder, or else a file) cannot be written or created; None: it can. The one check
    a command makes before any call or file: an output folder (``--out``), an MLflow store."""
    if path.exists():
        if folder and not path.is_dir():
            return f"{path} is not a folder"
        if not folder and not path.is_file():
            return f"{path} is not a file"
        if not _writable(path):
            return f"{path} is read-only"
        if not folder and not _writable(path.parent):  # SQLite writes its journal beside the file
            return f"{path.parent} is read-only"
        return None
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a folder"
    return None if _writable(parent) else f"{path} cannot be created: {parent} is read-only"


@dataclass(frozen=True)
class RunDir:
    """Paths in, and reads and writes of, one output folder."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    # -- paths -------------------------------------------------------------------------------
    @property
    def summary(self) -> Path:
        return self.root / SUMMARY_FILE

    @property
    def history(self) -> Path:
        return self.root / HISTORY_FILE

    @property
    def plan(self) -> Path:
        return self.root / PLAN_FILE

    @property
    def best_prompt(self) -> Path:
        return self.root / BEST_PROMPT_FILE

    @property
    def trajectory_plot(self) -> Path:
        return self.root / TRAJECTORY_PLOT

    @property
    def optimism_plot(self) -> Path:
        return self.root / OPTIMISM_PLOT

    @property
    def pareto_plot(self) -> Path:
        return self.root / PARETO_PLOT

    @property
    def metaprompts(self) -> Path:
        return self.root / METAPROMPTS_DIR

    @property
    def split_record(self) -> Path:
        return self.root / SPLIT_RECORD_FILE

    @property
    def task_rates(self) -> Path:
        return self.root / TASK_RATES_FILE

    @property
    def dataset(self) -> Path:
        return self.root / DATASET_DIR

    @property
    def compare(self) -> Path:
        return self.root / COMPARE_DIR

    @property
    def evaluate(self) -> Path:
        return self.root / EVALUATE_DIR

    @property
    def export(self) -> Path:
        return self.root / EXPORT_DIR

    @property
    def calibration(self) -> Path:
        return self.root / CALIBRATION_FILE

    @property
    def calibration_dir(self) -> Path:
        return self.root / CALIBRATION_DIR

    @property
    def probe(self) -> Path:
        return self.root / PROBE_FILE

    @property
    def probe_report(self) -> Path:
        return self.root / PROBE_REPORT

    @property
    def probe_calls(self) -> Path:
        return self.root / PROBE_CALLS

    @property
    def validation_rows(self) -> Path:
        return self.root / VALIDATION_ROWS_DIR

    def lock(self, *, worker_index: int = 0, num_workers: int = 1) -> Path:
        return self.root / (".opro.lock" if num_workers == 1 else f".opro-worker-{worker_index}.lock")

    def optimize_outputs(self) -> list[Path]:
        """The files of :data:`OPTIMIZE_OUTPUTS` that exist."""
        return [self.root / name for name in OPTIMIZE_OUTPUTS if (self.root / name).is_file()]

    def has_dataset(self) -> bool:
        return (self.dataset / "rag_dataset.json").is_file()

    # -- writes ------------------------------------------------------------------------------
    def write_plan(self, plan: Mapping[str, Any]) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        self.plan.write_text(json.dumps(plan, indent=2) + "\n", encoding="utf-8")
        return self.plan

    def write_metaprompt(self, step: int, text: str) -> Path:
        self.metaprompts.mkdir(parents=True, exist_ok=True)
        path = self.metaprompts / f"step_{step:03d}.txt"
        path.write_text(text, encoding="utf-8")
        return path

    def write_result(self, *, best_template: str, history: Iterable[Mapping[str, Any]]) -> None:
        """``best_prompt.txt`` and ``history.jsonl`` (one record a line)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.best_prompt.write_text(best_template, encoding="utf-8")
        with self.history.open("w", encoding="utf-8") as fh:
            for record in history:
                fh.write(json.dumps(record) + "\n")

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.summary.write_text(json.dumps(summary, indent=2), encoding="utf-8")

    @property
    def promotions(self) -> Path:
        return self.root / PROMOTIONS_FILE

    def read_promotions(self) -> list[dict[str, Any]]:
        """Every recorded `compare --promote` attempt (``promotions.json``), oldest first."""
        if not self.promotions.is_file():
            return []
        data = self.read_json(self.promotions)
        return [dict(x) for x in data] if isinstance(data, list) else []

    def add_promotion(self, attempt: Mapping[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.promotions.with_name(f".{PROMOTIONS_FILE}.tmp")
        tmp.write_text(json.dumps([*self.read_promotions(), dict(attempt)], indent=2), encoding="utf-8")
        tmp.replace(self.promotions)

    def write_split_record(self, record: Mapping[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.split_record.write_text(json.dumps(record, indent=2), encoding="utf-8")

    def keep_split_record(self, record: Mapping[str, Any], *, kept_stands: bool) -> dict[str, Any]:
        """Write ``record`` (what this optimization sees) and return it; where ``kept_stands`` (a study
        was scored on the kept one) and one is kept, the kept one instead."""
        if not (kept_stands and self.split_record.is_file()):
            self.write_split_record(record)
            return dict(record)
        # The study's record stands: a changed split is refused by the fingerprint check, and
        # overwriting the record first would let compare's guard accept the new split.
        kept: dict[str, Any] = json.loads(self.split_record.read_text(encoding="utf-8"))
        # A record kept from before the validation could extend (or with a smaller pool) gains the
        # questions this run may ask: the guard only ever learns more, never less.
        for part in ("questions", "normalized"):
            have = list((kept.get(part) or {}).get("extension") or [])
            more = [x for x in (record.get(part) or {}).get("extension") or [] if x not in have]
            if more:
                kept.setdefault(part, {})["extension"] = have + more
        self.write_split_record(kept)
        return kept

    # -- reads -------------------------------------------------------------------------------
    def read_json(self, path: Path) -> Any:
        """A JSON file of this folder; a clear :class:`DataError` when it cannot be read."""
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DataError(f"{path}: cannot be read as JSON ({exc}); delete it and run `opro optimize` again") from exc

    def read_split_record(self) -> dict[str, Any] | None:
        """The split record `opro optimize` left (``split_record.json``, else the one in ``summary.json``)."""
        for path, key in ((self.split_record, None), (self.summary, "split_record")):
            if not path.is_file():
                continue
            data = self.read_json(path)
            record = data.get(key) if key and isinstance(data, Mapping) else data
            if record is None and key:
                continue
            if not (
                isinstance(record, Mapping)
                and isinstance(record.get("split_sha256"), str)
                and isinstance(record.get("questions"), Mapping)
            ):
                raise DataError(f"{path}: not a split record (needs 'split_sha256' and 'questions'); run `opro optimize` again")
            return dict(record)
        return None

    def comparison_reports(self) -> list[Path]:
        """Every ``compare/*/report.json``, newest first."""
        return sorted(self.compare.glob("*/report.json"), key=lambda p: p.stat().st_mtime, reverse=True)


__all__ = [
    "BEST_PROMPT_FILE",
    "CALIBRATION_DIR",
    "CALIBRATION_FILE",
    "OPTIMIZE_OUTPUTS",
    "PROBE_CALLS",
    "PROBE_FILE",
    "PROBE_REPORT",
    "PROMOTIONS_FILE",
    "SPLIT_RECORD_FILE",
    "SUMMARY_FILE",
    "RunDir",
    "cache_dir",
    "data_dir",
    "default_call_cache_path",
    "unwritable",
]
