"""Where is the headroom? ``opro probe``: before a search, each dimension alone, paired against the
initial configuration on a small pilot, and what limits the task, the judge and the proposer.

A search can only find a gain along a dimension that moves the judge's score, on a task that is not
already at the ceiling, with a judge that can see the difference and an optimizer LLM that writes
usable instructions. The probe measures each of them, in a fraction of a search's calls; this module
runs it (:func:`probe`, :func:`run_probe`) and records it, each concern in its own module:

- the pilot questions (:mod:`opro.probe.pilot`: the optimization split first, never validation,
  held-out or exemplar questions; by default within a fifth of the plan's search calls);
- the contrasts (:mod:`opro.probe.contrasts`): no instruction, one markedly different instruction from
  the optimizer LLM, one format instruction ("Answer in one sentence.", appended), the extremes of
  every open ``[search.space]`` dimension and the search's first moves, configured as the search
  configures them, so that its step 0 finds their answers in the call cache (:mod:`opro.probe.reuse`);
- their effects (:mod:`opro.probe.effects`), verdicts (:mod:`opro.probe.verdicts`), savings under the
  cost objective (:mod:`opro.probe.savings`) and one recommendation (:mod:`opro.probe.recommendation`);
- the task's, the judge's and the proposer's limits (:mod:`opro.probe.task_limits`,
  :mod:`opro.probe.judge_limits`, :mod:`opro.probe.proposer`);
- the result and what is stored of it (:mod:`opro.probe.report`, :mod:`opro.probe.store`).

Every call goes through the experiment's call cache, so a rerun asks nothing.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opro.errors import DataError
from opro.experiment.settings import claim, proposer_settings
from opro.probe.contrasts import Contrast, search_contrasts, step0_calls
from opro.probe.effects import Effect, measure_effects
from opro.probe.judge_limits import judge_limits
from opro.probe.pilot import MIN_PILOT, Pilot, pilot_pool, pilot_size, search_calls
from opro.probe.proposer import ProposalCheck, ProposerLimits, ask_contrast, check_proposal, proposer_limits
from opro.probe.recommendation import recommend
from opro.probe.report import ProbeResult
from opro.probe.savings import with_costs
from opro.probe.store import probe_signature, stored_probe, write_probe
from opro.probe.task_limits import FORMAT_INSTRUCTION, task_limits
from opro.probe.verdicts import INERT_WITHIN, verdict_of, with_verdicts
from opro.search.records import CommandRecord, Recorded, Recorder, finite_metrics, record_all

if TYPE_CHECKING:
    from opro.experiment import Experiment
    from opro.llm.client import CallLog
    from opro.probe.plan import Plan


def _delta(after: Mapping[str, Mapping[str, Any]], before: Mapping[str, Mapping[str, Any]], key: str) -> dict[str, int]:
    return {role: int(u.get(key, 0)) - int((before.get(role) or {}).get(key, 0)) for role, u in after.items()}


@dataclass(frozen=True)
class _Measured:
    """What the probe asked: its pilot, its contrasts and their effects (the initial configuration's
    first), and the proposer's limits."""

    n: int
    note: str
    pilot: tuple[Any, ...]
    contrasts: tuple[Contrast, ...]
    effects: tuple[Effect, ...]
    notes: tuple[str, ...]
    proposer: ProposerLimits


def _measure(exp: Experiment, *, plan: Plan, pool: Sequence[Any], questions: int | None,
             progress: bool | None) -> _Measured:
    """The contrasts (the wording's, the format instruction, the search's: :func:`search_contrasts`)
    answered and judged on the pilot, and the proposer's three samples."""
    from opro.search.proposers.opro import build as build_opro

    cfg = exp.config
    o = cfg.optimizer
    rule = claim(o)
    initial_text = cfg.rag.initial_instructions[0]
    initial = exp.template(initial_text)
    contrasts = [Contrast("no instruction", initial.with_instruction(""), "wording", "")]
    space_contrasts = search_contrasts(initial, exp.search_space)
    n, note = pilot_size(plan, questions=questions, contrasts=3 + len(space_contrasts), available=len(pool),
                          alpha=rule.alpha)
    pilot = tuple(pool[:n])
    asked_q = [e.query for e in pilot]
    shown_q = [e.query for e in exp.dataset.examples_in("exemplar")]
    template_text = exp.template("<INS>").template_text
    proposer = build_opro(llm=exp.client("optimizer"), settings=proposer_settings(o), template_text=template_text, seed=cfg.experiment.seed)

    def check(reply: str) -> ProposalCheck:
        return check_proposal(reply, initial=initial_text, questions=[*shown_q, *asked_q], template_text=template_text,
                              max_chars=o.max_instruction_chars, answer_format=o.answer_format)

    notes: list[str] = []
    other, tried = ask_contrast(proposer.ask, initial=initial_text, check=check, answer_format=o.answer_format)
    if other is not None:
        contrasts.append(Contrast("contrast", initial.with_instruction(other), "wording", other))
    else:
        notes.append("the optimizer LLM gave no usable contrasting instruction in 3 tries ("
                     + "; ".join(t.reason for t in tried) + "): no contrast row")
    formatted = f"{initial_text.rstrip()} {FORMAT_INSTRUCTION}".strip()
    contrasts.append(Contrast("one sentence", initial.with_instruction(formatted), "format", FORMAT_INSTRUCTION))
    contrasts += space_contrasts
    from opro.judges.factory import build_paired_judge

    # The paired differences as the validation stage reads them: side by side where [judge].paired says so,
    # on the complete clusters of questions that share a source passage.
    paired = build_paired_judge(section=cfg.judge, client=exp.client("judge"), seed=cfg.experiment.seed)
    effects = measure_effects(program=exp.program, judge=exp.judge, initial=initial, contrasts=contrasts,
                              questions=pilot, cost=cfg.cost_model(), paired=paired, pool=pool,
                              progress=exp.progress if progress is None else progress)
    limits = proposer_limits(exp, proposer=proposer, base=effects[0], check=check, initial_text=initial_text)
    return _Measured(n, note, pilot, tuple(contrasts), effects, tuple(notes), limits)


def probe(experiment: Experiment, *, questions: int | None = None, progress: bool | None = None,
          calls: CallLog | None = None) -> ProbeResult:
    """Run the probe on an experiment (every call through its call cache): see the module docstring.
    ``questions``: pilot questions (default: within a fifth of the plan's search calls); ``calls``
    hears the key of every call it asks (:func:`opro.probe.reuse.write_probe_calls` keeps them, so
    ``opro optimize`` counts the calls the probe saved it)."""
    from opro.llm.client import CallLog
    from opro.probe.plan import make_plan

    exp, cfg = experiment, experiment.config
    o = cfg.optimizer
    rule = claim(o)
    # Its verdicts never read an earlier probe (only a run's noise on this task).
    plan = make_plan(cfg, documents=lambda: exp.documents, noise_digest=exp.noise_digest())
    pool, n_optimization = pilot_pool(exp)
    _ = exp.search_space  # the demonstration pool (bootstrapped: answered and judged) before counting
    before = exp.usage.as_dict()
    started = time.perf_counter()  # the probe's own time: not the dataset's generation, nor the plan
    with exp.usage.listen(CallLog() if calls is None else calls):
        m = _measure(exp, plan=plan, pool=pool, questions=questions, progress=progress)
    base, n = m.effects[0], m.n
    if not any(e.n for e in m.effects[1:]):
        raise DataError(_no_pairs(m.effects, questions=n))
    judge = judge_limits(cfg, plan=plan, effects=m.effects)
    # The search's resolution at the noise measured here, where the pilot measured it (the plan's
    # figure rests on an assumed sd until a run, a calibration or this probe measures one).
    detectable = judge.detectable_at_pilot_sd or plan.detectable
    # The inert band: +-0.2, or under the cost objective +-margin, the difference the search tolerates.
    band = rule.margin if rule.objective.non_inferiority else INERT_WITHIN
    judged = with_verdicts(m.effects[1:], band=band, detectable=detectable)
    if rule.objective.non_inferiority:  # each verdict with its saving and its non-inferiority test
        judged = with_costs(judged, initial=base, margin=rule.margin)
    # The noise at which to size a pilot that decides: the one measured here where enough questions
    # measured it, else the plan's (measured by a run or a calibration, or assumed: it says which).
    noise = ((judge.pilot_sd, "the pilot's") if judge.pilot_sd is not None and judge.pilot_sd > 0 and n >= MIN_PILOT
             else (judge.plan_sd, f"the plan's: {judge.plan_sd_basis}"))
    rec = recommend(judged, initial=base, detectable=detectable, objective=rule.objective,
                    probed_space=any(c.dimension not in ("wording", "format") for c in m.contrasts), questions=n,
                    noise=noise, available=len(pool), band=band, margin=rule.margin, measure=cfg.cost_model().measure)
    after = exp.usage.as_dict()
    made = {r: c for r, c in _delta(after, before, "calls").items() if c}
    hits = _delta(after, before, "cache_hits")
    requests = {r: made.get(r, 0) + hits.get(r, 0) for r in after if made.get(r, 0) + hits.get(r, 0)}
    in_search = min(n, n_optimization)
    return ProbeResult(
        source=str(cfg.source), signature=probe_signature(exp), task_model=cfg.models.task.model,
        judge_model=cfg.models.judge.model, optimizer_model=cfg.models.optimizer.model,
        pilot=Pilot(n=n, optimization=in_search, unused=max(0, n - n_optimization), available=len(pool),
                    search_calls=search_calls(plan), probe_calls=sum(requests.values()), note=m.note,
                    step0_calls=step0_calls(m.contrasts, optimization=in_search)),
        initial=dataclasses.replace(base, verdict=verdict_of(base)), effects=judged,
        task=task_limits(exp, pilot=m.pilot, base=base, effects=m.effects), judge=judge, proposer=m.proposer,
        recommendation=rec, calls=requests, made=sum(made.values()),
        wall_s=time.perf_counter() - started, top_k=cfg.rag.top_k, notes=m.notes,
        created=datetime.now(UTC).isoformat(timespec="seconds"), questions=tuple(e.query for e in m.pilot),
        noise_digest=exp.noise_digest() or "",
    )


def _no_pairs(effects: Sequence[Effect], *, questions: int) -> str:
    """Why a probe that scored no pair stores no verdict: the judge's replies (how many were
    unreadable, one reason) or the failed calls, and what to do."""
    answers = sum(len(e.scores) for e in effects)
    unreadable, failed = sum(e.unreadable for e in effects), sum(e.failed for e in effects)
    reason = next((e.unreadable_reason for e in effects if e.unreadable_reason), "")
    if not questions:
        why = "there are no pilot questions (the optimization split and the unused questions are empty)"
    else:
        why = f"the judge's replies were unreadable on {unreadable} of {answers} answers" + (
            f" (for example: {reason!r})" if reason else "") + (f", and {failed} calls failed" if failed else "")
    return (f"the probe scored no pair on its {questions} pilot questions: {why}; no verdict is stored. Fix the judge "
            "([models.judge], [judge].template and score_from; `opro judge calibrate` shows what it replies) and run "
            "`opro probe` again")


def probe_or_stored(experiment: Experiment, *, questions: int | None = None,
                    progress: bool | None = None) -> tuple[ProbeResult, bool]:
    """The stored probe when it matches (True), else a new one, written to the output folder (False)."""
    found, _ = stored_probe(experiment, questions=questions)
    if found is not None:
        return found, True
    from opro.llm.client import CallLog

    calls = CallLog()
    made = probe(experiment, questions=questions, progress=progress, calls=calls)
    write_probe(made, output_dir=experiment.config.output_dir, calls=calls)
    return made, False


@dataclass(frozen=True)
class ProbeRun:
    """What :func:`run_probe` did: the result, the files it wrote and where it was recorded."""

    result: ProbeResult
    paths: Mapping[str, Path]
    recorded: tuple[Recorded, ...]


def run_probe(experiment: Experiment, *, recorders: Sequence[Recorder] = (), questions: int | None = None,
              progress: bool | None = None) -> ProbeRun:
    """The probe (:func:`probe`), written to the output folder (:func:`write_probe`) and recorded through
    ``recorders`` (``opro.kind = probe``): what ``opro probe`` does."""
    from opro.llm.client import CallLog

    calls = CallLog()
    result = probe(experiment, questions=questions, progress=progress, calls=calls)
    paths = write_probe(result, output_dir=experiment.config.output_dir, calls=calls)
    return ProbeRun(result, paths, record_all(recorders, probe_record(result, paths)))


def _metric_name(label: str) -> str:
    return re.sub(r"[^0-9A-Za-z_.-]+", "_", label).strip("_")


def probe_record(result: ProbeResult, paths: Mapping[str, Path]) -> CommandRecord:
    """The probe as one command record (``opro.kind = probe``): its figures and its two files."""
    metrics: dict[str, float | None] = {
        "pilot_questions": result.pilot.n, "probe_calls": result.pilot.probe_calls, "initial_mean": result.initial.mean,
        "ceiling_share": result.task.ceiling_share, "floor_share": result.task.floor_share,
        "pilot_sd": result.judge.pilot_sd, "detectable": result.judge.detectable,
        "proposals_unusable_share": result.proposer.unusable_share, "step0_calls": result.pilot.step0_calls,
        **{f"recall_at_{k}": v for k, v in result.task.recall.items()},
    }
    for e in result.effects:
        name = _metric_name(e.label)
        metrics.update({f"effect.{name}": e.difference, f"effect.{name}.low": e.low, f"effect.{name}.high": e.high,
                        f"effect.{name}.p": e.p})
        if e.saving is not None:  # its cost per answer against the initial configuration's, paired
            metrics.update({f"effect.{name}.cost_change": e.saving.difference, f"effect.{name}.cost_change.low":
                            e.saving.low, f"effect.{name}.cost_change.high": e.saving.high})
    tags: dict[str, str] = {f"opro.probe.{_metric_name(e.label)}": e.verdict.kind
                            for e in result.effects if e.verdict is not None}
    tags["opro.probe.open"] = ",".join(result.recommendation.open) or "none"
    return CommandRecord(kind="probe", name="probe", params={
        "config": result.source, "signature": result.signature, "models.task": result.task_model,
        "models.judge": result.judge_model, "models.optimizer": result.optimizer_model,
        "pilot.questions": result.pilot.n}, metrics=finite_metrics(metrics), tags=tags,
        files={path: "probe" for path in paths.values()})


__all__ = ["ProbeRun", "probe", "probe_or_stored", "probe_record", "run_probe"]
