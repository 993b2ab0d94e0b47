"""The one face of optimize: one worker's OPRO search, validation and validated winner, with its plan.

:func:`optimize` is ``opro.optimize`` and what ``opro optimize`` calls: the checks before a run
(:mod:`opro.workflows.preflight`), worker 0's plan and stored probe, the run itself
(:meth:`opro.experiment.Experiment.optimize`) and the calls a stored probe saved, in one function.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opro.config import OproConfig, load_config
from opro.data.dataset import split_shortfall
from opro.errors import ConfigError, DataError
from opro.experiment import Experiment
from opro.llm.client import CallLog
from opro.probe.plan import check, make_plan
from opro.probe.reuse import probe_saving, read_probe_calls
from opro.probe.store import pilot_noise, stored_probe
from opro.search import check_worker_spec
from opro.workflows.preflight import check_inputs, check_task_models

if TYPE_CHECKING:
    from opro.experiment import RunResult
    from opro.probe.reuse import ProbeSaving


@dataclass(frozen=True)
class OptimizeRun:
    """What a worker's ``optimize`` returned, with what the command says beside it."""

    result: RunResult
    config: OproConfig
    worker_index: int
    #: Questions of the optimization split (the search scores' sample).
    n_optimization: int
    #: What the dataset's split falls short of (None when nothing).
    shortfall: str | None
    #: The plan made before the search beside the run's usage (worker 0 only; empty otherwise).
    plan_check: tuple[str, ...]
    #: Files of the output folder an optimize writes (worker 0 only; empty otherwise).
    outputs: tuple[str, ...]
    #: The calls a stored probe's answers saved this run, counted by key (None: no probe kept its calls).
    probe_saving: ProbeSaving | None = None

    @property
    def proposed_nothing(self) -> bool:
        """Steps were asked for and the optimizer proposed no usable instruction (worker 0)."""
        return (self.config.optimizer.steps > 0 and self.worker_index == 0
                and not any(r.step > 0 for r in self.result.history))


def parse_worker(text: str) -> tuple[int, int]:
    """``--worker I/N`` as (I, N), refused when it names no worker."""
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise ConfigError(f"--worker must look like I/N (for example 0/2), got {text!r}") from None
    check_worker_spec(index, count)
    return index, count


def _before_the_search(exp: Any, notice: Callable[[str], None]) -> Any:
    """Worker 0 says (and keeps) the plan, and the stored probe's verdict (never a new probe)."""
    plan = make_plan(exp.config, documents=lambda: exp.documents, pilot_noise=pilot_noise(exp),
                     noise_digest=exp.noise_digest())
    notice("\n".join(plan.lines()))
    exp.run_dir.write_plan(plan.as_dict())
    if exp.run_dir.probe.is_file():
        probed, why = stored_probe(exp)
        notice("\n".join(probed.verdict_lines() if probed is not None else [f"probe: {why}"]))
    return plan


def _plan_check(plan: Any, used: Any, *, wall_s: float, workers: int) -> tuple[str, ...]:
    """The plan beside this run's calls (:func:`opro.probe.plan.check`); with several workers, said to be
    worker 0's only."""
    lines = check(plan.as_dict(), used, wall_s=wall_s)
    if workers > 1:
        lines.append(f"  (worker 0's calls only: the plan is for all {workers} workers, which count their own)")
    return tuple(lines)


def optimize(
    config: OproConfig | str | Path,
    *,
    worker_index: int = 0,
    num_workers: int = 1,
    progress: bool | None = None,
    fresh: bool = False,
    program: Any = None,
    notice: Callable[[str], None] = lambda _: None,
) -> OptimizeRun:
    """Run (or resume) worker ``worker_index`` of ``num_workers`` of the OPRO search an experiment
    config (a file, or a loaded :class:`~opro.config.OproConfig`) describes, its validation and its
    validated winner (the run's :class:`~opro.experiment.RunResult` is ``.result``).

    Before anything is spent, every input the config names is read and every task model asked to answer
    (a missing one refused by its key); worker 0 then makes the plan and reads the stored probe
    (``notice`` hears both). ``fresh`` archives the existing study first. ``program``: a program, or a
    function building a LlamaIndex query engine (:mod:`opro.program.factory`), to tune instead of the
    config's."""
    check_worker_spec(worker_index, num_workers)
    cfg = config if isinstance(config, OproConfig) else load_config(config)
    exp = Experiment(cfg, progress=progress, program=program)
    try:
        check_inputs(exp)  # a missing or unreadable input is said before the plan, by its key
        check_task_models(exp.config, backend=exp.pool.get)  # and a task model that cannot answer, by its table
        _ = exp.decisions  # the decision ledger reconciled, or a damaged one refused by its file and line
        plan = _before_the_search(exp, notice) if worker_index == 0 else None
        try:
            probed = read_probe_calls(exp.config.output_dir)
        except DataError as exc:  # bookkeeping: the run goes on without the count
            notice(f"probe: {exc}")
            probed = None
        started = time.perf_counter()
        # Every call's key, so the calls a probe's answers saved are counted, not estimated.
        with exp.usage.listen(CallLog()) as calls:
            result = exp.optimize(worker_index=worker_index, num_workers=num_workers, fresh=fresh)
        taken = time.perf_counter() - started
        # This run's requests (this process's), not the study's across runs (result.usage).
        used = exp.usage.as_dict()
    finally:
        exp.close()
    return OptimizeRun(
        result=result, config=exp.config, worker_index=worker_index,
        n_optimization=len(exp.dataset.examples_in("optimization")),
        shortfall=split_shortfall(exp.dataset.split) if exp.dataset.split is not None else None,
        plan_check=_plan_check(plan, used, wall_s=taken, workers=num_workers) if plan is not None else (),
        outputs=tuple(p.name for p in exp.run_dir.optimize_outputs()) if worker_index == 0 else (),
        probe_saving=None if probed is None else probe_saving(probed, calls),
    )


__all__ = ["OptimizeRun", "optimize", "parse_worker"]
