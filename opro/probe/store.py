"""The stored probe: ``probe.json`` and ``probe.md`` in the output folder (and, beside them, the keys of
the calls it made: :mod:`opro.probe.reuse`), read back by ``opro plan`` and ``opro optimize`` only where
its signature (:func:`probe_signature`) is this experiment's, and the paired noise it measured.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from opro.errors import DataError
from opro.paths import RunDir
from opro.probe.pilot import MIN_PILOT
from opro.probe.proposer import CONTRAST_PROMPT, N_PROPOSALS
from opro.probe.report import ProbeResult
from opro.probe.task_limits import FORMAT_INSTRUCTION
from opro.probe.verdicts import INERT_WITHIN

if TYPE_CHECKING:
    from opro.experiment import Experiment
    from opro.llm.client import CallLog
    from opro.probe.plan import MeasuredNoise


def probe_signature(experiment: Experiment) -> str:
    """A hash of what the probe's figures depend on: the experiment's fingerprint (dataset, split, models,
    retrieval, judge, search space) and the optimizer settings that shape its proposals and the pilot."""
    o = experiment.config.optimizer
    blob = {"fingerprint": experiment.fingerprint(),
            "optimizer": {k: getattr(o, k) for k in ("proposer", "temperature", "max_tokens", "answer_format",
                                                      "max_instruction_chars", "exemplars", "finalists",
                                                      "validation_extension", "objective", "margin")},
            # The last entry is the verdicts' version (2: a verdict says when it may be chance after Holm;
            # 3: a contrast identical to the initial configuration, and all-tied differences without an
            # interval; 4: never inert outside the band, "cheaper and not worse" only on a non-inferiority test;
            # 5: the search's first moves among the contrasts, each contrast's saving, verdicts about cost;
            # 6: differences side by side under [judge].paired, tests on clusters of a source passage).
            "probe": [FORMAT_INSTRUCTION, CONTRAST_PROMPT, N_PROPOSALS, INERT_WITHIN, 6]}
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:16]


def write_probe(result: ProbeResult, *, output_dir: Path, calls: CallLog | None = None) -> dict[str, Path]:
    """``<output_dir>/probe.json`` (read back by ``opro plan`` and ``opro optimize``) and ``probe.md``;
    with ``calls`` (what :func:`opro.probe.headroom.probe` asked), ``probe_calls.json``: the keys of the
    calls it made, by which ``opro optimize`` counts the calls the probe saved it (:mod:`opro.probe.reuse`)."""
    from opro.probe.reuse import write_probe_calls
    from opro.redaction import redact_text

    run = RunDir(output_dir)
    run.root.mkdir(parents=True, exist_ok=True)
    if calls is not None:
        write_probe_calls(calls, output_dir=output_dir)
    run.probe.write_text(redact_text(json.dumps(result.to_dict(), indent=2, ensure_ascii=False)), encoding="utf-8")
    run.probe_report.write_text(redact_text(result.markdown()), encoding="utf-8")
    return {"json": run.probe, "report": run.probe_report}


def read_probe(output_dir: Path) -> ProbeResult | None:
    """The probe stored in an output folder, whatever its settings (None: there is none)."""
    run = RunDir(output_dir)
    if not run.probe.is_file():
        return None
    return ProbeResult.from_dict(run.read_json(run.probe), where=str(run.probe))


def pilot_noise(experiment: Experiment) -> MeasuredNoise | None:
    """The paired sd the stored probe measured on its pilot (the median over its contrasts), on how many
    pairs and whose it is, for :func:`opro.probe.plan.make_plan`: only where it measured this task (its
    noise digest is this experiment's: the same dataset content, split, task and judge models, judge and
    template; other settings may differ) on at least :data:`MIN_PILOT` questions."""
    from opro.probe.plan import MeasuredNoise

    try:
        found = read_probe(experiment.config.output_dir)
    except DataError:  # an unreadable probe measured nothing a plan can use; `opro probe` rewrites it
        return None
    if (found is None or not found.noise_digest or found.noise_digest != experiment.noise_digest()
            or found.judge.pilot_sd is None or found.judge.pilot_sd <= 0 or found.pilot.n < MIN_PILOT):
        return None
    pairs = [e.n for e in found.effects if e.sd is not None and e.n >= 3]
    n = int(statistics.median(pairs)) if pairs else found.pilot.n
    return MeasuredNoise(found.judge.pilot_sd, n,
                         f"opro probe's pilot ({found.pilot.n} questions, the median over its contrasts)")


def stored_probe(experiment: Experiment, *, questions: int | None = None) -> tuple[ProbeResult | None, str | None]:
    """The stored probe when it was made with this experiment's settings (and ``questions``, if given),
    else None and why (None, None: there is none)."""
    found = read_probe(experiment.config.output_dir)
    if found is None:
        return None, None
    if found.signature != probe_signature(experiment):
        return None, (f"the stored probe ({found.created}) was made with other settings: run `opro probe "
                      f"{experiment.config.source}` again")
    if questions is not None and found.pilot.n != min(questions, found.pilot.available):
        return None, f"the stored probe has {found.pilot.n} pilot questions, not {questions}"
    return found, None


__all__ = ["pilot_noise", "probe_signature", "read_probe", "stored_probe", "write_probe"]
