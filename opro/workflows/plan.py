"""The plan of a run, with the probe folded in where asked (``opro plan``), and the probe alone
(``opro probe``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opro.probe.headroom import ProbeRun
    from opro.probe.plan import Plan
    from opro.probe.report import ProbeResult


@dataclass(frozen=True)
class Planned:
    """The plan; with ``--probe`` the probe too, whether it was read back (``reused``) and where it lies."""

    plan: Plan
    probe: ProbeResult | None = None
    reused: bool = False
    probe_files: tuple[Path, ...] = ()


def plan_experiment(config: str | Path, *, probe: bool = False, questions: int | None = None) -> Planned:
    """The plan of ``opro optimize config`` (no LLM call); with ``probe``, first the stored probe made with
    these settings, else a new one (``questions``: its pilot), so the plan takes the noise it measured."""
    from opro.experiment import Experiment
    from opro.probe.plan import make_plan
    from opro.probe.store import pilot_noise
    from opro.workflows.preflight import check_inputs

    exp = Experiment.from_file(config, progress=None if probe else False)
    try:
        check_inputs(exp)
        probed, reused = None, False
        if probe:
            from opro.probe.headroom import probe_or_stored

            probed, reused = probe_or_stored(exp, questions=questions)
        # After the probe: planned by the noise it measured.
        made = make_plan(exp.config, documents=lambda: exp.documents, pilot_noise=pilot_noise(exp),
                         noise_digest=exp.noise_digest())
    finally:
        exp.close()
    files = (exp.run_dir.probe, exp.run_dir.probe_report) if probed is not None else ()
    return Planned(plan=made, probe=probed, reused=reused, probe_files=files)


def probe_experiment(config: str | Path, *, questions: int | None = None, mlflow: bool = True,
                     progress: bool | None = None) -> ProbeRun:
    """``opro probe``: probe the experiment ``config``, write probe.json and probe.md, record it."""
    from opro.experiment import Experiment
    from opro.probe.headroom import run_probe
    from opro.tracking.factory import command_recorders
    from opro.workflows.preflight import check_inputs

    exp = Experiment.from_file(config, progress=progress)
    try:
        check_inputs(exp)
        return run_probe(exp, recorders=command_recorders(exp.config, mlflow=mlflow), questions=questions)
    finally:
        exp.close()
