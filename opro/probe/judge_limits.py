"""The judge's limits: what ``opro judge calibrate`` stored (or how long it takes), the paired noise on
the pilot, and the smallest gain the validation stage confirms at the plan's noise and at the pilot's.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opro.errors import DataError
from opro.probe.effects import Effect, num

if TYPE_CHECKING:
    from opro.config import OproConfig
    from opro.probe.plan import Plan


@dataclass(frozen=True)
class JudgeLimits:
    calibrated: bool
    #: What ``opro judge calibrate`` stored (or why there is nothing), one line each.
    calibration: tuple[str, ...]
    #: Median over the contrasts of the sd of per-question differences from the initial configuration.
    pilot_sd: float | None
    plan_sd: float
    plan_sd_basis: str
    #: The plan's smallest gain the validation stage confirms (80% power), and the same at the pilot's sd.
    detectable: float | None
    detectable_at_pilot_sd: float | None
    heldout_detectable: float | None

    def lines(self) -> list[str]:
        out = [f"judge: {line}" for line in self.calibration]
        det = "no gain can be confirmed" if self.detectable is None else f"{self.detectable:+.2f}"
        line = (f"detectable: the validation stage confirms {det} (80% power; paired sd {self.plan_sd:.2f}: "
                f"{self.plan_sd_basis})")
        if self.pilot_sd is not None:
            line += f"; paired noise on the pilot: sd {self.pilot_sd:.2f} (median over the contrasts)"
            if self.detectable_at_pilot_sd is not None:
                line += f", at which it confirms {self.detectable_at_pilot_sd:+.2f}"
        out.append(line)
        return out


def calibration_lines(config: Any, *, judge_seconds: float, task_seconds: float) -> tuple[bool, tuple[str, ...]]:
    """What the stored judge calibration says (every condition it holds, with whatever it measured of
    it), or that there is none and how long ``opro judge calibrate`` takes."""
    from opro.calibration.calibrate import judge_signature, load_calibration

    try:
        report = load_calibration(config.output_dir)
    except DataError as exc:
        return False, (f"calibration unreadable ({exc})",)
    # The defaults of `opro judge calibrate`: 40 questions, reference / wrong / task and the near misses
    # (about 2 of the 3 apply to a question), 5 retests each of the first three.
    minutes = ((40 * 5 + 15) * judge_seconds + 40 * task_seconds) / 60
    took = "under a minute" if minutes < 1 else f"about {round(minutes)} min"
    how = f"`opro judge calibrate {config.source}` takes {took}"
    if report is None:
        return False, (f"not calibrated: {how}",)
    if report.signature and report.signature != judge_signature(config):
        return False, (f"the stored calibration ({report.created}) is for other judge settings: {how}",)
    out = [f"calibrated ({report.method}, {report.n_questions} questions): AUC right vs wrong {num(report.auc, '.2f')}, "
           f"separation {num(report.separation)}"
           + (f", test-retest sd {num(report.retest.sd)}" if report.retest and report.retest.sd is not None else "")]
    for c in report.conditions:
        # Against the reference (near misses above all: what separates two good prompts): AUC, how often
        # the reference scored higher on the same question, and by how much.
        vs = report.contrast(c.condition)
        shown = "" if vs is None or not vs.pairs else (
            f"; against the reference: AUC {num(vs.auc, '.2f')}, reference higher in {vs.wins} of {vs.pairs}"
            + (f" ({vs.ties} tied)" if vs.ties else "") + f", mean drop {num(vs.mean_drop)}")
        out.append(f"  {c.condition}: mean {num(c.mean)} on {c.n}{shown}")
    return True, tuple(out)


def judge_limits(cfg: OproConfig, *, plan: Plan, effects: Sequence[Effect]) -> JudgeLimits:
    """The stored calibration, the pilot's paired noise and what the plan can detect at it."""
    from opro.experiment.settings import claim
    from opro.judges.parsing import SCORE_MAX, SCORE_MIN
    from opro.probe.plan import POWER
    from opro.stats.sequential import design_power

    o = cfg.optimizer
    rule = claim(o)
    sds = [e.sd for e in effects[1:] if e.sd is not None and e.n >= 3]
    pilot_sd = statistics.median(sds) if sds else None
    at_pilot = None
    if pilot_sd is not None and pilot_sd > 0 and plan.looks:
        # counted in source passages where the plan's are (its looks are in questions)
        looks, sd = plan.clustering.scaled("validation", plan.looks, pilot_sd) if plan.clustering else (plan.looks, pilot_sd)
        at_pilot = design_power(looks, alpha=rule.alpha, sd=sd, scale=(SCORE_MIN, SCORE_MAX),
                                futility=o.futility, power=POWER).detectable
    seconds = {r.role: r.seconds_per_call for r in plan.roles}
    calibrated, calibration = calibration_lines(cfg, judge_seconds=seconds.get("judge", 0.0),
                                                task_seconds=seconds.get("task", 0.0))
    return JudgeLimits(calibrated=calibrated, calibration=calibration, pilot_sd=pilot_sd, plan_sd=plan.difference_sd,
                       plan_sd_basis=plan.sd_basis, detectable=plan.detectable, detectable_at_pilot_sd=at_pilot,
                       heldout_detectable=plan.heldout_detectable)


__all__ = ["JudgeLimits", "calibration_lines", "judge_limits"]
