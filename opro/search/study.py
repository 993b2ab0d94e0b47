"""The search's Optuna study, typed: the one module that names a study attribute's key
(:mod:`opro.search.trials` names the trials').

Every candidate is an Optuna trial (its instruction, step and proposal index as attributes, its mean
judge score as the value); the study's own attributes hold what workers share and what a rerun
resumes from (proposals, samples, usage, leases, validation scores, the fingerprint, the result and
what each recorder keeps to resume, under its own keys). Everything else reads and writes them through :class:`SearchStudy` and
:class:`~opro.search.trials.CandidateTrial`, so the schema lives in these two modules and nowhere else.

Study attributes::

    fingerprint               the settings the scores were made under (a resume must match)
    workers                   N of ``--worker I/N``
    holder:w<I>               worker I's lease (host, pid, heartbeat, token, N)
    usage:w<I>                worker I's LLM usage by role (budgets and totals cover the whole study)
    proposals:<step>          the step's accepted candidate instructions (worker 0 proposes)
    params:<step>             each proposal's values of the open search dimensions (Optuna's sampler)
    rejected:<step>           the step's rejected samples, with reasons
    sampling:<step>           worker 0's dealing of the step's optimizer samples to the live workers
    sample:<step>:<tag>:<i>   a sample's text (or its error) asked by the worker it was dealt to
    stopped:<step>            worker 0 stopped the search before this step (reason, token)
    validation:<sha>:<sha>    a prompt's per-question scores on a batch of validation questions
    validation_cost:<sha>:<sha>  the same answers' costs (:mod:`opro.program.cost`; None where a call failed)
    validation_design         the validation decision's design (alpha, looks, finalists, questions;
                              :meth:`opro.search.design.ValidationDesign.to_json`)
    validation_looks          every look of that decision (statistic, boundary, p-value, decision;
                              :meth:`opro.stats.sequential.Look.as_dict`)
    validation_history        earlier decisions of the study on other validation questions (design, looks;
                              :meth:`opro.search.design.EarlierDecision.to_json`)
    validation_decisions      every validation decision's ledger record (questions, design, fingerprint, verdict)
    summary                   the lead's final summary (``opro compare best`` from the stores)
    split_record              the questions the optimization saw (the held-out guard)
    (any other key)           a recorder's own state (:meth:`SearchStudy.recorder_state`): the search
                              never reads it; each recorder lists its keys (opro.tracking.recorder)

The trials' attributes are :mod:`opro.search.trials`'; the store is opened by
:mod:`opro.search.storage`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import optuna

from opro.errors import ConfigError
from opro.hashing import sha
from opro.llm.client import UsageByRole
from opro.locking import lease_alive
from opro.program.configurations import Configuration, settings_text
from opro.program.cost import CallUsage, CostSummary
from opro.program.dimensions import Value
from opro.search.design import EarlierDecision, ValidationDesign
from opro.search.ledger import MAX_SEEN_SHARE, Decision, conflict, latest
from opro.search.metaprompt import normalize_instruction
from opro.search.results import CandidateRecord, CandidateStatus
from opro.search.trials import CandidateTrial, NewTrial, TrialKey, claim_template, create_trial
from opro.stats.sequential import Look

#: Statuses a new process evaluates again: the endpoint failed, the budget ran out or the judge's
#: replies could not be read (``incomplete``), not the candidate.
RETRY_STATUSES: frozenset[str] = frozenset({"failed", "budget", "incomplete"})


class FingerprintMismatch(ConfigError):
    """The study was scored under other settings: resuming it would mix incomparable scores."""


def questions_key(queries: Sequence[str]) -> str:
    return sha("\x1f".join(queries))


#: Fingerprint entries that older studies recorded and no fingerprint holds any more (where a model
#: was served, not which model): ignored when such a study resumes.
RETIRED_ENTRIES = (".base_url",)


class _Key:
    """The study attributes' names (the module docstring lists them): one spelling for reading and
    writing each, so a reader never misses what a writer stored under a typo."""

    FINGERPRINT: Final = "fingerprint"
    WORKERS: Final = "workers"
    VALIDATION_DESIGN: Final = "validation_design"
    VALIDATION_LOOKS: Final = "validation_looks"
    VALIDATION_HISTORY: Final = "validation_history"
    VALIDATION_DECISIONS: Final = "validation_decisions"
    SUMMARY: Final = "summary"
    SPLIT_RECORD: Final = "split_record"
    #: Prefixes of the keys with a worker index (``holder:w0``) or a step (``rejected:3``) after them.
    LEASE: Final = "holder:w"
    USAGE: Final = "usage:w"
    REJECTED: Final = "rejected:"
    #: Every name above and every prefix of the keys below: what no recorder may store under.
    OWN: Final = frozenset({FINGERPRINT, WORKERS, VALIDATION_DESIGN, VALIDATION_LOOKS, VALIDATION_HISTORY,
                            VALIDATION_DECISIONS, SUMMARY, SPLIT_RECORD})
    OWN_PREFIXES: Final = (LEASE, USAGE, REJECTED, "proposals:", "params:", "sampling:", "sample:", "stopped:",
                           "validation:", "validation_cost:")

    @staticmethod
    def lease(worker: int) -> str:
        return f"{_Key.LEASE}{worker}"

    @staticmethod
    def usage(worker: int) -> str:
        return f"{_Key.USAGE}{worker}"

    @staticmethod
    def proposals(step: int) -> str:
        return f"proposals:{step}"

    @staticmethod
    def params(step: int) -> str:
        return f"params:{step}"

    @staticmethod
    def rejected(step: int) -> str:
        return f"{_Key.REJECTED}{step}"

    @staticmethod
    def sampling(step: int) -> str:
        return f"sampling:{step}"

    @staticmethod
    def sample(step: int, tag: str, index: int) -> str:
        return f"sample:{step}:{tag}:{index}"

    @staticmethod
    def stopped(step: int) -> str:
        return f"stopped:{step}"

    @staticmethod
    def validation(name: str, queries: Sequence[str]) -> str:
        """A prompt's scores on a batch of validation questions: keyed by both, so a question set is
        never mistaken for another."""
        return f"validation:{_prompt_key(name)}:{questions_key(queries)}"

    @staticmethod
    def validation_cost(name: str, queries: Sequence[str]) -> str:
        return f"validation_cost:{_prompt_key(name)}:{questions_key(queries)}"


def _prompt_key(name: str) -> str:
    """A validated prompt's key: its candidate name's instruction normalized (what it has always been
    for an instruction alone), then its settings as named, so that no wording can stand for them."""
    try:
        configuration = Configuration.parse(name)
    except ConfigError:  # braces at the end of an instruction that name no setting: part of the wording
        configuration = Configuration(name)
    if not configuration.settings:
        return sha(normalize_instruction(name))
    return sha(normalize_instruction(configuration.instruction) + "\x1f" + settings_text(configuration.settings))


def _recorder_key(key: str) -> str:
    """``key`` when it is a recorder's to use: never one of the search's own attributes."""
    if key in _Key.OWN or key.startswith(_Key.OWN_PREFIXES):
        raise ValueError(f"{key!r} is a study attribute of the search, not a recorder's")
    return key


class ValidationReuse(ConfigError):
    """The validation questions already decided a verdict under another design or other settings."""

    def __init__(self, earlier: Decision, now: Decision, *, where: str | None = None, partial: bool = False) -> None:
        self.earlier, self.now = earlier, now
        shared, share = now.seen_share(earlier)
        shown = "; ".join(now.changes(earlier, partial=partial)) or "other finalists"
        verdict = earlier.verdict or "begun, not finished"
        #: What was seen, where, and what differs: the refusal's first sentence, and the label of a
        #: decision re-decided under ``[optimizer].seen_validation = "label"``.
        self.seen = (
            f"{shared} of these {len(now.questions)} validation questions"
            + (" (extension included)" if now.design.get("extension") else "")
            + f" ({share:.0%}) already decided a verdict "
            f"in {where or earlier.where or 'an earlier run'} ({verdict}"
            + (f"; {earlier.at}" if earlier.at else "")
            + f") under another design or other settings ({shown})"
        )
        super().__init__(
            f"{self.seen}. Testing again on questions whose verdict was "
            "seen would let a rerun keep the settings that happen to claim a gain. Restore that design and those "
            "settings to resume its decision, or validate on questions no decision has seen: more questions in the "
            f"dataset, or a new [data.split].seed only where at most {MAX_SEEN_SHARE:.0%} of its validation "
            "questions were seen (a reshuffled pool usually shares far more); `opro compare` on the held-out split "
            "measures any prompt without deciding here; [optimizer].seen_validation = \"label\" runs it as an "
            "exploration that returns the initial instruction and claims no gain"
        )


@dataclass(frozen=True)
class StudyView:
    """The study's attributes as read at one moment: what the workers poll, typed."""

    attrs: Mapping[str, Any]

    def proposals(self, step: int) -> list[str] | None:
        stored = self.attrs.get(_Key.proposals(step))
        return None if stored is None else list(stored)

    def params(self, step: int) -> list[dict[str, Value]]:
        """Each proposal's values of the open search dimensions (none stored: only wording)."""
        return [dict(p) for p in self.attrs.get(_Key.params(step)) or ()]

    def sampling(self, step: int) -> dict[str, Any] | None:
        value = self.attrs.get(_Key.sampling(step))
        return value if isinstance(value, dict) else None

    def sample(self, step: int, tag: str, index: int) -> dict[str, Any]:
        return dict(self.attrs.get(_Key.sample(step, tag, index)) or {})

    def has_sample(self, step: int, tag: str, index: int) -> bool:
        return _Key.sample(step, tag, index) in self.attrs

    def stopped(self, step: int) -> dict[str, Any]:
        return dict(self.attrs.get(_Key.stopped(step)) or {})

    def lease(self, worker: int) -> dict[str, Any]:
        return dict(self.attrs.get(_Key.lease(worker)) or {})

    def live_workers(self, *, stale_s: float = 300.0) -> dict[int, dict[str, Any]]:
        """The live leases, by worker index."""
        out: dict[int, dict[str, Any]] = {}
        for key, held in self.attrs.items():
            if key.startswith(_Key.LEASE) and isinstance(held, dict) and lease_alive(held, stale_s=stale_s):
                out[int(key.removeprefix(_Key.LEASE))] = held
        return out

    def usage_of_others(self, worker: int) -> list[UsageByRole]:
        mine = _Key.usage(worker)
        return [dict(v) for k, v in self.attrs.items() if k.startswith(_Key.USAGE) and k != mine]


class LeaseSlot:
    """Where one worker's lease is kept in the study (for :class:`opro.locking.StudyLease`)."""

    def __init__(self, study: optuna.Study, worker: int) -> None:
        self._study = study
        self._key = _Key.lease(worker)

    @property
    def name(self) -> str:
        return self._key

    def read(self) -> dict[str, Any]:
        return dict(self._study.user_attrs.get(self._key) or {})

    def write(self, value: Mapping[str, Any]) -> None:
        self._study.set_user_attr(self._key, dict(value))


class SearchStudy:
    """An Optuna study holding one search: its candidates as trials and its shared state as attributes."""

    def __init__(self, study: optuna.Study, storage: optuna.storages.BaseStorage | str | None = None) -> None:
        self.optuna = study
        #: Where the study lives (its other studies are checked by :meth:`begin_validation`).
        self.storage = storage

    @classmethod
    def open(cls, storage: optuna.storages.BaseStorage, *, name: str,
             pruner: optuna.pruners.BasePruner | None = None) -> SearchStudy:
        """Create the study ``name`` in ``storage``, or load it (a rerun resumes it)."""
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        from sqlalchemy.exc import IntegrityError, OperationalError

        for attempt in range(5):
            try:
                return cls(optuna.create_study(storage=storage, study_name=name, direction="maximize",
                                               pruner=pruner, load_if_exists=True), storage)
            except (OperationalError, IntegrityError):
                # Workers starting together race to create the study; the loser retries.
                if attempt == 4:
                    raise
                time.sleep(0.5 * (attempt + 1))
        raise AssertionError("unreachable")

    @classmethod
    def load(cls, storage: optuna.storages.BaseStorage | str, *, name: str) -> SearchStudy | None:
        """The study ``name`` if it exists, else None."""
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            return cls(optuna.load_study(study_name=name, storage=storage), storage)
        except KeyError:
            return None

    @property
    def name(self) -> str:
        return self.optuna.study_name

    def view(self) -> StudyView:
        return StudyView(self.optuna.user_attrs)

    def trials(self, *, states: Sequence[optuna.trial.TrialState] | None = None) -> list[CandidateTrial]:
        return [CandidateTrial.of(t) for t in self.optuna.get_trials(deepcopy=False, states=states)]

    # -- settings the scores depend on --------------------------------------------------------
    def check_fingerprint(self, fingerprint: Mapping[str, str]) -> None:
        """Record ``fingerprint`` in a new study; refuse one whose scores were made under other settings."""
        if not fingerprint:
            return
        stored = self.optuna.user_attrs.get(_Key.FINGERPRINT)
        if stored is None:
            self.optuna.set_user_attr(_Key.FINGERPRINT, dict(fingerprint))
            return
        keys = sorted(set(stored) | set(fingerprint))
        # An entry a fingerprint no longer holds (a server's base_url) is not a change: older studies resume.
        changed = [k for k in keys if stored.get(k) != fingerprint.get(k) and (k in fingerprint or not k.endswith(
            RETIRED_ENTRIES))]
        if changed:
            shown = "; ".join(f"{k}: {stored.get(k)!r} -> {fingerprint.get(k)!r}" for k in changed[:8])
            raise FingerprintMismatch(
                f"study {self.name!r} was scored under other settings ({len(changed)} changed: {shown}"
                f"{'; ...' if len(changed) > 8 else ''}); its scores would not be comparable. Rerun with --fresh to "
                "archive that study and start a new one, restore the settings, or set [tracking].study_name"
            )

    def set_workers(self, n: int) -> None:
        self.optuna.set_user_attr(_Key.WORKERS, n)

    def lease_slot(self, worker: int) -> LeaseSlot:
        return LeaseSlot(self.optuna, worker)

    # -- usage ----------------------------------------------------------------------------------
    def usage(self, worker: int) -> UsageByRole:
        return dict(self.optuna.user_attrs.get(_Key.usage(worker)) or {})

    def save_usage(self, worker: int, usage: UsageByRole) -> None:
        self.optuna.set_user_attr(_Key.usage(worker), dict(usage))

    # -- proposals ------------------------------------------------------------------------------
    def save_proposals(self, step: int, accepted: Sequence[str], rejected: Sequence[Mapping[str, str]],
                       params: Sequence[Mapping[str, Value]] = ()) -> None:
        if params:  # before the proposals: a worker that reads the proposals finds their values
            self.save_params(step, params)
        self.optuna.set_user_attr(_Key.proposals(step), list(accepted))
        self.optuna.set_user_attr(_Key.rejected(step), [dict(r) for r in rejected])

    def save_params(self, step: int, params: Sequence[Mapping[str, Value]]) -> None:
        self.optuna.set_user_attr(_Key.params(step), [dict(p) for p in params])

    def rejections(self) -> tuple[dict[str, str], ...]:
        out: list[dict[str, str]] = []
        for key, value in sorted(self.optuna.user_attrs.items()):
            if key.startswith(_Key.REJECTED):
                out.extend({"step": key.removeprefix(_Key.REJECTED), **r} for r in value)
        return tuple(out)

    def deal_samples(self, step: int, *, tag: str, prompt: str, dealt: Mapping[int, Mapping[str, Any]]) -> None:
        self.optuna.set_user_attr(_Key.sampling(step), {
            "tag": tag, "prompt": prompt, "dealt": {str(i): dict(d) for i, d in dealt.items()},
        })

    def save_sample(self, step: int, tag: str, index: int, value: Mapping[str, str]) -> None:
        self.optuna.set_user_attr(_Key.sample(step, tag, index), dict(value))

    def stop(self, step: int, *, reason: str, token: str) -> None:
        self.optuna.set_user_attr(_Key.stopped(step), {"reason": reason, "token": token})

    # -- candidates -----------------------------------------------------------------------------
    def records(self) -> list[CandidateRecord]:
        """Every finished candidate (the latest attempt of each), in (step, proposal index) order."""
        out = []
        for t in self.trials():
            if not t.is_candidate or t.state == optuna.trial.TrialState.RUNNING:
                continue  # running, or a part of a split candidate (its candidate's trial has the result)
            if t.state == optuna.trial.TrialState.FAIL and t.status not in ("failed", "incomplete"):
                continue  # an interrupted attempt; it is re-run
            status: CandidateStatus = t.status or "complete"  # type: ignore[assignment]
            out.append(CandidateRecord(
                step=t.step, instruction=str(t.instruction), score=t.score, n_scored=t.n_scored,
                n_invalid=t.n_invalid, n_errors=t.n_errors, status=status, trial_number=t.number,
                scores=t.scores, index=t.index, params=dict(t.params), cost=t.cost, name=str(t.name),
            ))
        # A rerun re-evaluates failed and budget-stopped candidates: the latest attempt stands.
        latest: dict[tuple[int, str], CandidateRecord] = {}
        for r in sorted(out, key=lambda r: r.trial_number):
            latest[(r.step, normalize_instruction(r.name))] = r
        # By (step, proposal index): the same order whichever worker evaluated what, and after restarts.
        return sorted(latest.values(), key=lambda r: (r.step, r.index, r.trial_number))

    def fail_running(self, worker: int) -> None:
        """Trials ``worker`` left RUNNING when it was interrupted: failed, to be re-run."""
        for t in self.trials(states=(optuna.trial.TrialState.RUNNING,)):
            if t.worker == worker:
                self.optuna.tell(t.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)

    def new_claim(self, *, instruction: str, step: int, index: int, worker: int, token: str,
                  part: str | None, params: Mapping[str, Value] | None = None,
                  distributions: Mapping[str, optuna.distributions.BaseDistribution] | None = None,
                  name: str | None = None) -> NewTrial:
        """Create a claim's RUNNING trial with its attributes in one transaction (:func:`create_trial`)."""
        template = claim_template(instruction=instruction, step=step, index=index, worker=worker, token=token,
                                  part=part, params=params, distributions=distributions, name=name)
        return create_trial(self.optuna, template)

    def running(self, created: NewTrial) -> optuna.trial.Trial:
        """The trial ``created`` as the search reports to and finishes it (a claim it won)."""
        return optuna.trial.Trial(self.optuna, created.trial_id)

    def fail(self, number: int) -> None:
        self.optuna.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)

    @staticmethod
    def mark_split(trial: optuna.trial.Trial, part_size: int) -> None:
        trial.set_user_attr(TrialKey.PARTS, part_size)

    @staticmethod
    def split_size(trial: optuna.trial.Trial) -> int:
        """Questions per part of a claimed candidate split among the workers (0: not split)."""
        return int(trial.user_attrs.get(TrialKey.PARTS) or 0)

    @staticmethod
    def report(trial: optuna.trial.Trial, mean: float, minibatch: int, scores: Sequence[float | None] | None,
               costs: Sequence[float | None] | None = None) -> None:
        """A running mean after ``minibatch``; with ``scores`` (and ``costs``), the per-question scores
        (and costs) the racing pruner reads."""
        if scores is not None:
            trial.set_user_attr(TrialKey.SCORES, list(scores))
        if costs is not None:
            trial.set_user_attr(TrialKey.COSTS, list(costs))
        trial.report(mean, minibatch)

    def finish(self, trial: optuna.trial.Trial, *, status: CandidateStatus, score: float | None, n_scored: int,
               n_invalid: int, n_errors: int, scores: Sequence[float | None], cost: CostSummary | None = None,
               costs: Sequence[float | None] | None = None) -> None:
        """A candidate's result: COMPLETE with its mean, PRUNED, or FAIL (failed / incomplete); with
        ``costs``, its cost per question (what the cost objective's race pairs on)."""
        k = TrialKey
        for key, v in {k.SCORE: score, k.N_SCORED: n_scored, k.N_INVALID: n_invalid, k.N_ERRORS: n_errors,
                       k.STATUS: status, k.SCORES: list(scores),
                       **({} if cost is None else {k.COST: cost.as_dict()}),
                       **({} if costs is None else {k.COSTS: list(costs)})}.items():
            trial.set_user_attr(key, v)
        if status == "complete":
            self.optuna.tell(trial, score)
        elif status in ("failed", "incomplete"):
            self.optuna.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            self.optuna.tell(trial, state=optuna.trial.TrialState.PRUNED)

    def finish_part(self, trial: optuna.trial.Trial, *, part_scores: Sequence[Any], failed: bool,
                    part_usage: Sequence[CallUsage | None] = ()) -> None:
        """A part's outcomes, for the candidate's owner to add up. A part is never a result of its own
        (FAIL); "failed" stands only while its worker runs: a rerun asks the part's questions again."""
        trial.set_user_attr(TrialKey.PART_SCORES, list(part_scores))
        trial.set_user_attr(TrialKey.PART_USAGE, [None if u is None else u.as_list() for u in part_usage])
        trial.set_user_attr(TrialKey.STATUS, "failed" if failed else "complete")
        self.optuna.tell(trial, state=optuna.trial.TrialState.FAIL)

    # -- validation and the result --------------------------------------------------------------
    def validation_scores(self, instruction: str, queries: Sequence[str]) -> list[float | None] | None:
        """A prompt's scores on these validation questions (keyed by both: a question set is never
        mistaken for another), or None when not scored."""
        stored = self.optuna.user_attrs.get(_Key.validation(instruction, queries))
        return None if stored is None else list(stored)

    def save_validation_scores(self, instruction: str, queries: Sequence[str], scores: Sequence[float | None]) -> None:
        self.optuna.set_user_attr(_Key.validation(instruction, queries), list(scores))

    def validation_costs(self, instruction: str, queries: Sequence[str]) -> list[float | None] | None:
        """The costs of the answers whose scores :meth:`validation_scores` gives (None: not kept)."""
        stored = self.optuna.user_attrs.get(_Key.validation_cost(instruction, queries))
        return None if stored is None else list(stored)

    def save_validation_costs(self, instruction: str, queries: Sequence[str], costs: Sequence[float | None]) -> None:
        self.optuna.set_user_attr(_Key.validation_cost(instruction, queries), list(costs))

    def validation_design(self) -> ValidationDesign | None:
        stored = self.optuna.user_attrs.get(_Key.VALIDATION_DESIGN)
        return ValidationDesign.from_json(stored) if isinstance(stored, Mapping) else None

    def validation_looks(self) -> list[Look]:
        return [Look.from_dict(x) for x in self.optuna.user_attrs.get(_Key.VALIDATION_LOOKS, [])]

    def validation_history(self) -> list[EarlierDecision]:
        """Earlier decisions of this study, made on other validation questions (the same questions
        cannot decide twice): kept, never overwritten."""
        return [EarlierDecision.from_json(x) for x in self.optuna.user_attrs.get(_Key.VALIDATION_HISTORY, [])]

    def validation_decisions(self) -> list[Decision]:
        """Every validation decision this study made (its ledger records: questions, design,
        fingerprint, verdict), oldest first."""
        return [Decision.from_json(x) for x in self.optuna.user_attrs.get(_Key.VALIDATION_DECISIONS, [])]

    def fingerprint(self) -> dict[str, str]:
        """The settings the study's scores were made under (empty when none were recorded)."""
        return dict(self.optuna.user_attrs.get(_Key.FINGERPRINT) or {})

    def _studies(self) -> list[tuple[str, Mapping[str, Any]]]:
        """(name, attributes) of this study and every other of its storage (an archived ``--fresh`` one included)."""
        studies: list[tuple[str, Mapping[str, Any]]] = [(self.name, self.optuna.user_attrs)]
        if self.storage is not None:
            studies += [(summary.study_name, summary.user_attrs)
                        for summary in optuna.get_all_study_summaries(self.storage, include_best_trial=False)
                        if summary.study_name != self.name]
        return studies

    def decisions_in_storage(self) -> list[tuple[str, Decision]]:
        """Every validation decision recorded in this storage, with where (``study 'NAME'``)."""
        return [(f"study {name!r}", Decision.from_json(x))
                for name, attrs in self._studies() for x in attrs.get(_Key.VALIDATION_DECISIONS, [])]

    def _seen(self, decision: Decision, design: ValidationDesign) -> tuple[Decision, str] | None:
        """An earlier decision of this study or any other of its storage that decided on too many of
        ``decision``'s questions under another key, and where (None for a re-decided one: it claims nothing)."""
        if decision.re_decided:
            return None
        for name, attrs in self._studies():
            recorded = [Decision.from_json(x) for x in attrs.get(_Key.VALIDATION_DECISIONS, [])]
            earlier = conflict(decision, recorded)
            if earlier is not None:
                return earlier, f"study {name!r}"
            stored = attrs.get(_Key.VALIDATION_DESIGN)
            other = ValidationDesign.from_json(stored) if not recorded and isinstance(stored, Mapping) else None
            if other is not None and other.questions == design.questions and other.key != design.key:
                # A decision recorded before decisions kept their questions: only the whole list compares.
                shown = other.to_json()
                legacy = Decision(scope=decision.scope, key=str(other.key), questions=decision.questions,
                                  design={k: shown[k] for k in decision.design if k in shown})
                return legacy, f"study {name!r}"
        return None

    def refuse_seen_validation(self, decision: Decision, design: ValidationDesign) -> None:
        """Raise :class:`ValidationReuse` when an earlier decision in this storage saw the verdict of
        too many of ``decision``'s questions under another design or fingerprint."""
        seen = self._seen(decision, design)
        if seen is not None:
            raise ValidationReuse(seen[0], decision, where=seen[1])

    def begin_validation(self, design: ValidationDesign, decision: Decision) -> None:
        """Record the design of the validation decision about to be made (and its ledger record),
        refusing a second decision on the same validation questions (more than
        :data:`opro.search.ledger.MAX_SEEN_SHARE` of them) under another design or fingerprint, in this study
        or any other of its storage: a rerun that changed alpha, the finalists, the looks,
        min_coverage or the judge would otherwise test again on questions whose verdict it has seen."""
        self.refuse_seen_validation(decision, design)
        before = self.validation_design()
        if before is not None and before.key != design.key:
            # A decision on other questions (a new validation split): the earlier one stays on record.
            earlier = EarlierDecision(design=before, looks=tuple(self.validation_looks()))
            self.optuna.set_user_attr(_Key.VALIDATION_HISTORY, [x.to_json() for x in (*self.validation_history(), earlier)])
            self.optuna.set_user_attr(_Key.VALIDATION_LOOKS, [])
        self.optuna.set_user_attr(_Key.VALIDATION_DESIGN, design.to_json())
        if not any(d.key == decision.key for d in self.validation_decisions()):
            self._save_decisions([*self.validation_decisions(), decision])

    def settle_validation(self, decision: Decision) -> None:
        """Record ``decision``'s verdict (it replaces the record of the same key)."""
        self._save_decisions([*self.validation_decisions(), decision])

    def _save_decisions(self, decisions: Sequence[Decision]) -> None:
        self.optuna.set_user_attr(_Key.VALIDATION_DECISIONS, [d.to_json() for d in latest(decisions)])

    def save_validation_look(self, look: Look) -> None:
        # Looks are made in order: a look made again (a rerun that re-asked questions whose judge
        # replies were unreadable) replaces the later ones the earlier attempt made.
        looks = [x for x in self.validation_looks() if x.look < look.look]
        self.optuna.set_user_attr(_Key.VALIDATION_LOOKS,
                                  [x.as_dict() for x in sorted([*looks, look], key=lambda x: x.look)])

    def summary(self) -> dict[str, Any] | None:
        stored = self.optuna.user_attrs.get(_Key.SUMMARY)
        return dict(stored) if isinstance(stored, Mapping) else None

    def save_summary(self, summary: Mapping[str, Any]) -> None:
        import json

        self.optuna.set_user_attr(_Key.SUMMARY, json.loads(json.dumps(dict(summary), default=str)))

    def save_split_record(self, record: Mapping[str, Any]) -> None:
        self.optuna.set_user_attr(_Key.SPLIT_RECORD, dict(record))

    # -- what a recorder keeps to resume ----------------------------------------------------------
    def recorder_state(self, key: str) -> Any:
        """What a recorder stored under ``key`` (None: nothing yet). Its keys are its own: the search
        never reads them, and they survive a resume and are shared by every worker of the study."""
        return self.optuna.user_attrs.get(_recorder_key(key))

    def set_recorder_state(self, key: str, value: Any) -> None:
        """Store ``value`` (JSON: numbers, strings, lists, dicts) under the recorder's ``key``."""
        self.optuna.set_user_attr(_recorder_key(key), value)


__all__ = [
    "RETRY_STATUSES",
    "FingerprintMismatch",
    "LeaseSlot",
    "SearchStudy",
    "StudyView",
    "ValidationReuse",
    "questions_key",
    "sha",
]

