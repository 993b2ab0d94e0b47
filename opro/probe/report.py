"""The probe's result (:class:`ProbeResult`): every configuration in one 80-column grid, the verdicts,
the limits and the recommendation, as terminal text, markdown and the JSON ``probe.json`` keeps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opro.errors import DataError
from opro.probe.contrasts import TOGETHER
from opro.probe.effects import Effect, Verdict, num
from opro.probe.judge_limits import JudgeLimits
from opro.probe.pilot import Pilot
from opro.probe.proposer import ProposalCheck, ProposerLimits
from opro.probe.recommendation import Recommendation
from opro.probe.savings import saving_from
from opro.probe.task_limits import TaskLimits


def short_label(label: str) -> str:
    """A label as the 80-column grid shows it (``answer_max_tokens 48`` as ``max_tokens 48``)."""
    return label.replace("answer_max_tokens", "max_tokens")


@dataclass(frozen=True)
class ProbeResult:
    source: str
    #: What makes two probes the same (:func:`probe_signature`): a stored probe is read back only when it matches.
    signature: str
    task_model: str
    judge_model: str
    optimizer_model: str
    pilot: Pilot
    initial: Effect
    effects: tuple[Effect, ...]
    task: TaskLimits
    judge: JudgeLimits
    proposer: ProposerLimits
    recommendation: Recommendation
    #: Requests by role (made + cache hits), and how many were made (not from the cache).
    calls: Mapping[str, int]
    made: int
    wall_s: float
    top_k: int
    #: Why a contrast is missing (the optimizer gave no usable contrasting instruction), if one is.
    notes: tuple[str, ...] = ()
    created: str = ""
    questions: tuple[str, ...] = field(default_factory=tuple)
    #: What its paired noise belongs to (:meth:`opro.experiment.Experiment.noise_digest`; empty in a probe
    #: stored before it was kept: then no plan takes its noise).
    noise_digest: str = ""

    # -- rendering --
    def table(self) -> list[str]:
        """Every configuration in one grid that fits 80 columns (instructions are listed below it)."""
        rows = [self.initial, *self.effects]
        width = max(14, *(len(short_label(e.label)) for e in rows))
        head = (f"{'contrast':<{width}} {'mean':>4}  {'vs initial [95% CI]':<20} {'W/T/L':>8} {'p':>5} {'words':>5} "
                f"{'cost':>5} verdict")
        out = [head, "-" * len(head)]
        base_cost = self.initial.cost
        for e in rows:
            cost = "" if e is self.initial or e.cost is None or not base_cost else f"{e.cost / base_cost - 1:+.0%}"
            kind = "" if e.verdict is None or e.verdict.kind == "baseline" else e.verdict.kind
            p = "" if e.p is None else "<.001" if e.p < 0.001 else f"{e.p:.3f}"
            out.append(f"{short_label(e.label):<{width}} {num(e.mean):>4}  {(e.interval or '(baseline)'):<20} "
                       f"{e.win_tie_loss or '':>8} {p:>5} {num(e.answer_words, '.0f'):>5} {cost:>5} {kind}".rstrip())
        return out

    def verdict_lines(self) -> list[str]:
        """The verdict per contrast and the recommendation, for `opro plan` and `opro optimize`."""
        out = [f"probe ({self.pilot.n} pilot questions, {self.created[:10]}):"]
        out += [f"  {e.label}: {e.verdict.text}" for e in self.effects if e.verdict is not None]
        out += [f"  {line}" for line in self.recommendation.lines]
        if self.proposer.flagged:
            out.append(f"  {self.proposer.line()}")
        return out

    def sections(self) -> list[tuple[str, list[str]]]:
        """The report as (title, lines), the effects' grid first; long text outside the grid."""
        unit = {"usd": "USD", "seconds": "task seconds"}.get(self.initial.cost_unit, "weighted task tokens")
        wording = [f"{e.label}: {e.instruction or '(none)'}" for e in self.effects if e.dimension in ("wording", "format")]
        wording += [f"{e.label}: {e.value} (the search's step-0 combination of its first moves)"
                    for e in self.effects if e.dimension == TOGETHER]
        if any("answer_max_tokens" in e.label for e in self.effects):
            wording.append("max_tokens in the grid: [search.space].answer_max_tokens")
        return [
            ("effects", [self.pilot.line(), f"initial instruction: {self.initial.instruction or '(none)'}", *wording,
                         *(f"note: {n}" for n in self.notes),
                         f"words: mean words per answer; cost: per answer ({unit}), against the initial configuration"]),
            ("verdicts", [f"{e.label}: {e.verdict.text}" for e in self.effects if e.verdict is not None]),
            ("limits", [*self.task.lines(top_k=self.top_k), *self.judge.lines(), self.proposer.line(),
                        *(f"{'ok' if p.usable else 'unusable'}: {p.instruction[:120]!r}" + ("" if p.usable else f" ({p.reason})")
                          for p in self.proposer.proposals)]),
            ("recommendation", list(self.recommendation.lines)),
        ]

    def lines(self) -> list[str]:
        """The report as text for a terminal: the grid, then each section."""
        out = [f"probe of {self.source}: task {self.task_model}, judge {self.judge_model}, optimizer "
               f"{self.optimizer_model}", "", *self.table()]
        for title, body in self.sections():
            out += ["", f"{title}:", *(f"  {line}" for line in body)]
        return out

    def markdown(self) -> str:
        out = [f"# opro probe: {self.source}", "",
               f"task {self.task_model}, judge {self.judge_model}, optimizer {self.optimizer_model}; {self.created}",
               "", "```text", *self.table(), "```"]
        for title, body in self.sections():
            out += ["", f"## {title}", "", *(f"- {line}" for line in body)]
        return "\n".join(out) + "\n"

    # -- storage --
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "probe.json") -> ProbeResult:
        def effect(d: Mapping[str, Any]) -> Effect:
            v = d.get("verdict")
            return Effect(**{**d, "scores": tuple(d["scores"]), "settings": dict(d["settings"]),
                             "differences": tuple(d.get("differences", ())), "clusters": tuple(d.get("clusters", ())),
                             "verdict": None if v is None else Verdict(**v), "saving": saving_from(d.get("saving"))})

        try:
            task = dict(data["task"])
            task["recall"] = {int(k): float(v) for k, v in task["recall"].items()}
            proposer = dict(data["proposer"])
            proposer["proposals"] = tuple(ProposalCheck(**p) for p in proposer["proposals"])
            judge = dict(data["judge"])
            judge["calibration"] = tuple(judge["calibration"])
            r = data["recommendation"]
            rec = Recommendation(open=tuple(r["open"]), closed=tuple(r["closed"]), undecided=tuple(r["undecided"]),
                                 quality_plausible=r["quality_plausible"], cost_objective=bool(r["cost_objective"]),
                                 lines=tuple(r["lines"]))
            return cls(**{
                **data, "pilot": Pilot(**data["pilot"]), "initial": effect(data["initial"]),
                "effects": tuple(effect(e) for e in data["effects"]), "task": TaskLimits(**task),
                "judge": JudgeLimits(**judge), "proposer": ProposerLimits(**proposer),
                "recommendation": rec, "calls": dict(data["calls"]),
                "notes": tuple(data.get("notes", ())), "questions": tuple(data.get("questions", ())),
            })
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DataError(f"{where} is not an opro probe ({exc}); run `opro probe` again") from exc


__all__ = ["ProbeResult", "short_label"]
